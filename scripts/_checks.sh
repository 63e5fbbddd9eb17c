#!/usr/bin/env bash
# What the test command and scripts/test-latest.sh both run once packages are installed: ruff, mypy
# (strict, src/) and the whole pytest suite. PYTHON picks the interpreter, CHECKS which of the three run
# (default all); extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
checks=" ${CHECKS:-ruff mypy pytest} "
if [[ "$checks" == *" ruff "* ]]; then "$py" -m ruff check src tests benchmarks; fi
if [[ "$checks" == *" mypy "* ]]; then "$py" -m mypy; fi
if [[ "$checks" == *" pytest "* ]]; then "$py" -m pytest -q -p no:cacheprovider "$@"; fi
