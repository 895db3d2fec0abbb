#!/usr/bin/env bash
# Installs everything, then runs the whole test suite (what CI runs), or with --fast only the
# in-process tier (tests marked `fast`: unit, engine and in-process service tests; under two
# minutes on 2 cores). Other arguments go to pytest.
#
# The whole suite runs in two pytest workers (RINGTRAIN_TEST_WORKERS, 0 for one process): most of
# its time is spent waiting (servers starting, ranks meeting, timeouts running out), which a
# second worker fills. Each test file stays on one worker, so a module's server or sshd is
# started once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=(-q -p no:cacheprovider)
if [ "${1:-}" = "--fast" ]; then
  shift
  args+=(-m fast)
elif [ "${RINGTRAIN_TEST_WORKERS:-2}" != 0 ]; then
  args+=(-n "${RINGTRAIN_TEST_WORKERS:-2}" --dist loadfile)
fi
exec .venv/bin/python -m pytest "${args[@]}" "$@"
