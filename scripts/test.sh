#!/usr/bin/env bash
# Installs everything, then runs the whole test suite (what CI runs), or with --fast only the
# in-process tier (tests marked `fast`: unit, engine and in-process service tests; under two
# minutes on 2 cores). Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m fast)
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${tier[@]}" "$@"
