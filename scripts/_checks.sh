#!/usr/bin/env bash
# What the test command and scripts/test-latest.sh both run once packages are installed: ruff, mypy
# (strict, src/) and the whole pytest suite. PYTHON picks the interpreter; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
"$py" -m ruff check src tests benchmarks
"$py" -m mypy
"$py" -m pytest -q -p no:cacheprovider "$@"
