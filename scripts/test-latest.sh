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
"$py" -m uv pip compile pyproject.toml requirements/build.in --extra test --extra dashboards --extra profiling \
    --resolution "$resolution" --python "$py" --no-header --quiet -o "$venv/resolved.txt"
"$py" -m uv pip install --python "$py" --quiet -r "$venv/resolved.txt"
"$py" -m uv pip install --python "$py" --quiet --no-deps -e .
echo "test-latest ($resolution):" $(grep -E '^(opentelemetry-sdk|fastapi|aiohttp|uvicorn|pydantic)==' "$venv/resolved.txt")
PYTHON="$py" bash scripts/_checks.sh "$@"
