#!/usr/bin/env bash
# The Go client's conformance adapter, for clients/conformance's runner:
#   conformance-adapter.sh --check   exit 0 if a Go 1.23+ toolchain is there (else say why)
#   conformance-adapter.sh --build   build target/go/ringlock-conformance-adapter
# Go is taken from PATH, else /usr/lib/go-1.23/bin/go (scripts/install-go.sh);
# the build cache lives under target/go, and no module proxy is used.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
go=$(command -v go || true)
[ -n "$go" ] || go=/usr/lib/go-1.23/bin/go
if [ ! -x "$go" ]; then
    echo "no Go toolchain (go on PATH or /usr/lib/go-1.23/bin/go; scripts/install-go.sh installs one)"
    exit 1
fi
export GOCACHE="$root/target/go/cache" GOPATH="$root/target/go/path" GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local
case "${1:-}" in
--check)
    v=$("$go" env GOVERSION)
    case "$v" in
    go1.2[3-9]* | go1.[3-9][0-9]* | go[2-9]*) exit 0 ;;
    esac
    echo "$go is $v; the Go client needs Go 1.23 or later"
    exit 1
    ;;
--build)
    cd "$here"
    exec "$go" build -o "$root/target/go/ringlock-conformance-adapter" ./cmd/ringlock-conformance-adapter
    ;;
*)
    echo "usage: $0 --check | --build" >&2
    exit 2
    ;;
esac
