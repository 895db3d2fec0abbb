#!/usr/bin/env bash
# Static checks, as CI runs them before the tests: ruff (lint and import order) on the code,
# tests, benchmarks and examples, and mypy on the package (settings in pyproject.toml). The
# set-up installs the pinned ruff and mypy (the `lint` extra, part of `test`) with the project's
# own dependencies, which mypy needs to check the calls into them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check ringtrain tests benchmarks examples
.venv/bin/mypy ringtrain
