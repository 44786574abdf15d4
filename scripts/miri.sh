#!/usr/bin/env bash
# Miri over the code of the io_uring backend that needs no kernel: the
# provided buffer ring's memory (allocation, handing buffers out and back,
# publishing the tail, reading received bytes, the drop) and the operation
# tags (docs/architecture.md, "io_uring").
#
#   scripts/miri.sh            the buffer ring and tag tests
#   scripts/miri.sh FILTER     other unit tests of the server crate
#
# Needs the nightly toolchain with its miri component
# (rustup +nightly component add miri). Miri checks what the tests do for
# undefined behaviour: out-of-bounds or misaligned accesses, use after free,
# leaks, and aliasing (Stacked Borrows) of the raw pointers into the ring.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup +nightly component list --installed 2>/dev/null | grep -q '^miri'; then
    echo "miri.sh: the nightly toolchain has no miri; rustup +nightly component add miri" >&2
    exit 1
fi
# A target directory of its own: Miri's builds never mix with the normal ones.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri-build"
filters=("${@:-io::uring::}")
for f in "${filters[@]}"; do
    cargo +nightly miri test -p ringlock --lib -- "$f"
done
