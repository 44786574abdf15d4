#!/usr/bin/env bash
# Runs a command where io_uring is refused, as in a container under
# Docker's default seccomp profile (README.md, "Where io_uring is blocked"):
#
#   scripts/no-uring.sh cargo test --all-targets
#   scripts/no-uring.sh cargo run -- serve --io auto
#
# Builds the no-uring tool (crates/bench/src/bin/no-uring.rs) first: it
# installs a seccomp filter failing io_uring_setup, io_uring_enter and
# io_uring_register with EPERM, inherited by everything the command starts,
# and then runs the command.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/no-uring.sh COMMAND [ARGS...]" >&2; exit 2; }
cargo build --quiet -p ringlock-bench --bin no-uring
exec "${CARGO_TARGET_DIR:-target}/debug/no-uring" "$@"
