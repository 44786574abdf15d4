#!/usr/bin/env bash
# What an application that depends on the client crate alone compiles, and
# how long that takes: a scratch project outside the workspace with the
# Cargo.toml lines docs/client.md gives and crates/client/examples/lock.rs as
# its main.rs, built from nothing (its own target directory) in debug and
# release. docs/architecture.md records the output.
#
#   scripts/client-footprint.sh            tree, crate count, both builds
#   scripts/client-footprint.sh --tree     tree and crate count only
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/client-footprint.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

mkdir -p "$WORK/app/src"
cp "$ROOT/crates/client/examples/lock.rs" "$WORK/app/src/main.rs"
cat > "$WORK/app/Cargo.toml" <<TOML
[package]
name = "app"
version = "0.1.0"
edition = "2024"

[dependencies]
ringlock-client = { path = "$ROOT/crates/client" }
tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
TOML
cd "$WORK/app"
# Resolve against the versions the workspace already locked.
cp "$ROOT/Cargo.lock" Cargo.lock

echo "== cargo tree -e normal,build (what builds for the host)"
cargo tree -e normal,build
crates=$(cargo tree -e normal,build --prefix none --format '{p}' | sed 's/ (.*//; s/ (\*)//' | sort -u)
echo "== $(echo "$crates" | wc -l) crates, the application included: $(echo "$crates" | awk '{print $1}' | tr '\n' ' ')"
for target in x86_64-apple-darwin x86_64-pc-windows-msvc; do
    n=$(cargo tree -e normal,build --target "$target" --prefix none --format '{p}' | sed 's/ (.*//' | sort -u | wc -l)
    echo "== for $target: $n crates (cargo tree --target $target)"
done
[ "${1:-}" = "--tree" ] && exit 0

echo "== load before the builds: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
for profile in dev release; do
    flag=(); [ "$profile" = release ] && flag=(--release)
    start=$(date +%s.%N)
    CARGO_TARGET_DIR="$WORK/target-$profile" cargo build --quiet "${flag[@]}"
    end=$(date +%s.%N)
    printf '== clean %s build: %.1f s (%s cores)\n' "$profile" "$(echo "$end - $start" | bc)" "$(nproc)"
done
