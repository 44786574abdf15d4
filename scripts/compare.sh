#!/usr/bin/env bash
# Compares two bench.sh results, figure by figure (docs/performance.md).
#
#   scripts/compare.sh bench-results/OLD.json bench-results/NEW.json [--floor 0.03]
#
# Prints new/old for the main figures of every scenario and server that both
# runs have (cycles/s, cycle p50/p99, hand-off p50/p99, server CPU per cycle,
# RSS) and flags a change in the worse direction as a REGRESSION when it is
# larger than the runs' own noise: the larger of the two runs' relative
# ranges over their rounds for that figure, and at least the floor (3%; 9%
# when a run has a single round, as --quick runs do). Exits 1 if anything
# regressed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
cargo build --release --quiet --bin ringlock-bench
exec "${CARGO_TARGET_DIR:-target}/release/ringlock-bench" compare "$@"
