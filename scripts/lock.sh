#!/usr/bin/env bash
# Regenerates requirements/test.lock: every package the test command installs, pinned with hashes.
# Run after changing a dependency range in pyproject.toml, then commit the lock with that change.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install -q --disable-pip-version-check "uv==0.13.9"
python3 -m uv pip compile pyproject.toml requirements/build.in \
    --extra test --extra dashboards --extra profiling \
    --universal --python-version 3.11 --generate-hashes --no-header --quiet \
    -o requirements/test.lock "$@"
echo "requirements/test.lock: $(grep -c '==' requirements/test.lock) pinned packages"
