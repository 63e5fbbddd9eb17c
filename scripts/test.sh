#!/usr/bin/env bash
# The README's test command. On a fresh Debian 12 machine (as root) it installs everything the suite needs:
# the Debian packages, the Python packages from the hash-pinned lock (so every machine tests exactly what CI
# tested), gym-obs itself; then runs ruff, mypy (strict, src/) and the whole pytest suite.
# Extra arguments go to pytest. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)          # the HTML report's browser test
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || need_apt+=(fonts-dejavu-core)  # text in its screenshot
dpkg -s libpython3.11 >/dev/null 2>&1 || need_apt+=(libpython3.11)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
fi

pip=(python3 -m pip install -q --disable-pip-version-check)
"${pip[@]}" --require-hashes -r requirements/test.lock
"${pip[@]}" --no-deps --no-build-isolation -e .

# The e2e tests run the real OpenTelemetry Collector (the gym distribution, built from
# collector/builder-config.yaml) and Jaeger v2 as the trace store; both are built once with Go into
# ~/.cache/gym-obs/ and reused while their inputs are unchanged (a cold build takes minutes).
bash scripts/build-collector.sh >/dev/null
bash scripts/build-jaeger.sh >/dev/null

bash scripts/_checks.sh "$@"
