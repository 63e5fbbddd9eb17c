#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian 12 machine (as root), then runs
# ruff, mypy (strict, src/) and the whole pytest suite. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
dpkg -s libpython3.11 >/dev/null 2>&1 || need_apt+=(libpython3.11)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e ".[test]"
python3 -m ruff check src tests benchmarks
python3 -m mypy
python3 -m pytest -q -p no:cacheprovider "$@"
