#!/usr/bin/env bash
# Installs Go 1.23 (Debian's golang-1.23-go, from bookworm-backports) for
# the Go client's tests (tests/go_client.rs). The backports suite is enabled
# by an apt source derived from this machine's own Debian source entry
# (/etc/apt/sources.list.d/debian.sources): the same URIs and signing key,
# suite bookworm-backports. Nothing is done when a Go 1.23 or later is
# already installed. Needs root and apt-get; says so and exits 0 otherwise
# (the Go tests then skip, with a line saying why).
set -euo pipefail

go_ok() {
    local go=$1 v
    v=$("$go" env GOVERSION 2>/dev/null) || return 1
    v=${v#go}
    local major=${v%%.*} rest=${v#*.}
    local minor=${rest%%[.a-z]*}
    [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 23 ]; }
}

for go in "$(command -v go || true)" /usr/lib/go-1.23/bin/go; do
    if [ -n "$go" ] && [ -x "$go" ] && go_ok "$go"; then
        echo "Go already installed: $go ($("$go" env GOVERSION))"
        exit 0
    fi
done

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "cannot install Go: needs root and apt-get (the Go client's tests will skip)"
    exit 0
fi

src=/etc/apt/sources.list.d/debian.sources
out=/etc/apt/sources.list.d/ringlock-bookworm-backports.sources
if [ ! -e "$out" ]; then
    if [ ! -r "$src" ]; then
        echo "cannot install Go: no $src to derive a bookworm-backports source from"
        exit 0
    fi
    # The first stanza whose Suites include plain "bookworm": its URIs and
    # Signed-By, with the suite bookworm-backports.
    stanza=$(awk -v RS= '$0 ~ /(^|\n)Suites:([^\n]* )?bookworm( |\n|$)/ { print; exit }' "$src")
    uris=$(printf '%s\n' "$stanza" | sed -n 's/^URIs:[[:space:]]*//p' | head -n1)
    key=$(printf '%s\n' "$stanza" | sed -n 's/^Signed-By:[[:space:]]*//p' | head -n1)
    if [ -z "$uris" ]; then
        echo "cannot install Go: no bookworm stanza with URIs in $src"
        exit 0
    fi
    {
        echo "Types: deb"
        echo "URIs: $uris"
        echo "Suites: bookworm-backports"
        echo "Components: main"
        [ -n "$key" ] && echo "Signed-By: $key"
    } >"$out"
    echo "wrote $out (from $src)"
fi

export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq >/dev/null && apt-get install -y -qq golang-1.23-go >/dev/null; then
    echo "installed $(/usr/lib/go-1.23/bin/go version) at /usr/lib/go-1.23/bin/go"
else
    echo "could not install golang-1.23-go with apt-get (the Go client's tests will skip)"
fi
