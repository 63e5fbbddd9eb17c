#!/usr/bin/env bash
# Builds the gym collector distribution (otelcol-gym) from collector/builder-config.yaml with the official
# OpenTelemetry Collector Builder, and prints the binary's path on stdout (progress goes to stderr).
#
# The binary lives in a cache folder keyed by the manifest's hash, so a warm machine pays nothing:
#   ${GYM_OBS_CACHE:-~/.cache/gym-obs}/otelcol-gym-<sha256 of manifest + this script, 16 hex>/otelcol-gym
# The Go module and build caches stay in Go's default places (GOMODCACHE, GOCACHE), so a rebuild after a
# manifest change reuses every module that did not change. Needs Go (>= 1.24) and the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/go/bin:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
command -v go >/dev/null 2>&1 || { echo "build-collector: go is not installed (need Go >= 1.24)" >&2; exit 1; }

manifest="collector/builder-config.yaml"
# The builder release is the manifest's core release (dist.version): ocb and the components must agree.
release="v$(sed -n 's/^  version: *\([0-9.]*\).*/\1/p' "$manifest" | head -n1)"
[ "$release" != "v" ] || { echo "build-collector: no dist.version in $manifest" >&2; exit 1; }

key="$(cat "$manifest" "$0" | sha256sum | cut -c1-16)"
cache="${GYM_OBS_CACHE:-$HOME/.cache/gym-obs}/otelcol-gym-$key"
binary="$cache/otelcol-gym"
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi

gobin="$(go env GOPATH)/bin"
builder="$gobin/builder-$release"
if [ ! -x "$builder" ]; then
    echo "build-collector: installing the OpenTelemetry Collector Builder $release" >&2
    GOBIN="$(mktemp -d)" && export GOBIN
    go install "go.opentelemetry.io/collector/cmd/builder@$release" >&2
    mkdir -p "$gobin" && mv "$GOBIN/builder" "$builder" && rmdir "$GOBIN"
    unset GOBIN
fi

mkdir -p "$(dirname "$cache")"
work="$(mktemp -d "${cache}.partial.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp "$manifest" "$work/builder-config.yaml"
echo "build-collector: building otelcol-gym $release into $cache (a cold build takes minutes)" >&2
start=$(date +%s)
# output_path in the manifest is relative: the sources are generated under $work and built there.
(cd "$work" && "$builder" --config=builder-config.yaml --ldflags="-s -w" >&2)
mkdir -p "$work/out"
mv "$work/otelcol-gym/otelcol-gym" "$work/out/otelcol-gym"
"$work/out/otelcol-gym" --version >&2
rm -rf "$cache" && mv "$work/out" "$cache"
echo "build-collector: built in $(( $(date +%s) - start )) s, $(du -h "$binary" | cut -f1)" >&2
echo "$binary"
