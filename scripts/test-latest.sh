#!/usr/bin/env bash
# The test suite against releases the lock does not pin, on purpose, so an upstream release that breaks
# gym_obs is found here rather than by a new user. Installs into a throw-away venv (never the locked
# environment) and runs the same checks as scripts/test.sh.
#   scripts/test-latest.sh            newest releases allowed by pyproject.toml's ranges
#   scripts/test-latest.sh --lowest   the lowest release of every direct dependency (proves the lower bounds)
# Debian packages are assumed installed (run scripts/test.sh once first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
resolution=highest
if [ "${1:-}" = "--lowest" ]; then resolution=lowest-direct; shift; fi

venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check "uv==0.13.9"
# The checkers themselves stay at their locked releases: a lower bound is a promise about gym_obs's
# runtime dependencies, and an old ruff or mypy would only judge the code by other rules.
grep -E '^(ruff|mypy|pytest|pytest-asyncio|pytest-timeout|hypothesis)==' requirements/test.lock \
    | sed 's/ .*//' > "$venv/tools.txt"
"$py" -m uv pip compile pyproject.toml --extra test --extra dashboards --extra profiling \
    --resolution "$resolution" --constraint "$venv/tools.txt" --python "$py" --no-header --quiet \
    -o "$venv/resolved.txt"
"$py" -m uv pip install --python "$py" --quiet -r "$venv/resolved.txt"
"$py" -m uv pip install --python "$py" --quiet --no-deps -e .
echo "test-latest ($resolution):" $(grep -E '^(opentelemetry-sdk|fastapi|aiohttp|uvicorn|pydantic)==' "$venv/resolved.txt")
# Under --lowest, mypy is skipped: old releases ship other type stubs, and the types are checked against
# the locked set; what the lower bounds promise is that the suite passes.
checks="ruff mypy pytest"; [ "$resolution" = highest ] || checks="ruff pytest"
PYTHON="$py" CHECKS="$checks" bash scripts/_checks.sh "$@"
