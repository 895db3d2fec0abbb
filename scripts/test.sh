#!/usr/bin/env bash
# Installs everything, then runs the whole test suite (what CI runs), or with --fast only the
# in-process tier (tests marked `fast`: unit, engine and in-process service tests; under two
# minutes on 2 cores, about 40 s when they are idle), or with --quality only the runs too long
# for the suite, most to a quality floor (marked `quality`: the RetinaNet default recipe, 40
# epochs, ResNet on image folders, the Fashion-MNIST and Keras examples on two workers, the
# README's job on Ray against a local cluster, the doctor on the ResNet examples; and runs whose
# parts the suite covers more cheaply: an elastic job on Ray losing a node, the whole storage
# path of a job on S3, the Keras job file on JAX; about 6 minutes on 2 idle cores). Other
# arguments go to pytest.
#
# Both run in two pytest workers (RINGTRAIN_TEST_WORKERS, 0 for one process). The whole suite
# keeps 2 cores busy most of the time (the CPU of the processes its tests start, each importing
# torch), so a third worker made it slower; the fast tier's is the CPU of one process running
# one test at a time, which left the second core idle. Each test file stays on one worker, so a
# module's server or sshd is started once.
#
# The fast tier loads neither the schemathesis nor the hypothesis plugin: its tests use neither
# (the API fuzz tests are in the full suite), and loading them cost ~2 s of CPU in every pytest
# process. A fast test that needs one goes in the full suite, or this line changes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=(-q -p no:cacheprovider)
if [ "${1:-}" = "--fast" ]; then
  shift
  args+=(-m fast -p no:schemathesis -p no:hypothesispytest)
elif [ "${1:-}" = "--quality" ]; then
  shift
  args+=(-m quality)
else
  args+=(-m "not quality")
fi
if [ "${RINGTRAIN_TEST_WORKERS:-2}" != 0 ]; then
  # In collection order (tests/conftest.py starts the longest modules first), not xdist's
  # default of the modules with the most tests first, which left minutes-long modules of a few
  # tests to the end, on one worker.
  args+=(-n "${RINGTRAIN_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
fi
exec .venv/bin/python -m pytest "${args[@]}" "$@"
