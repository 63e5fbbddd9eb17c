#!/usr/bin/env bash
# Builds Jaeger v2 (the trace store of the collector e2e tests; Tempo cannot be built here) from the Go
# module proxy and prints the binary's path on stdout (progress goes to stderr).
#
# Jaeger is a program, not a dependency of gym_obs: it is fetched into a scratch module
# (`go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@<release>`; minimal version selection makes the
# dependency set the same on every machine) and built into a cache folder keyed by this script's hash:
#   ${GYM_OBS_CACHE:-~/.cache/gym-obs}/jaeger-<release>-<16 hex>/jaeger
# A warm machine pays nothing; Go's module and build caches stay in their default places.
set -euo pipefail

JAEGER_RELEASE="v1.76.0"  # the Jaeger module release; its binary is Jaeger v2 (OTLP in, /api/traces out)

export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null 2>&1 || { echo "build-jaeger: go is not installed (need Go >= 1.24)" >&2; exit 1; }

key="$(sha256sum "$0" | cut -c1-16)"
cache="${GYM_OBS_CACHE:-$HOME/.cache/gym-obs}/jaeger-$JAEGER_RELEASE-$key"
binary="$cache/jaeger"
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi

mkdir -p "$(dirname "$cache")"
work="$(mktemp -d "${cache}.partial.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "build-jaeger: building jaeger $JAEGER_RELEASE into $cache (a cold build takes minutes)" >&2
start=$(date +%s)
(
    cd "$work"
    go mod init gym-obs/jaeger-tool >/dev/null 2>&1
    go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_RELEASE" >&2
    mkdir -p out
    go build -ldflags="-s -w" -o out/jaeger github.com/jaegertracing/jaeger/cmd/jaeger >&2
)
rm -rf "$cache" && mv "$work/out" "$cache"
echo "build-jaeger: built in $(( $(date +%s) - start )) s, $(du -h "$binary" | cut -f1)" >&2
echo "$binary"
