#!/usr/bin/env bash
# Instruction-count gate for the engine's hot paths.
#
#   scripts/instructions.sh check    count, compare with the committed baseline,
#                                    fail if a case grew by more than 3%
#   scripts/instructions.sh update   count and rewrite the baseline
#   scripts/instructions.sh show     count only
#
# Each case (crates/bench/src/instr.rs) runs one hot path a fixed
# number of times inside one function; callgrind counts the instructions
# executed in that function alone (--toggle-collect), so set-up, warm-up and
# process start-up are not counted. Counts are per operation. They are
# deterministic up to a few instructions (the lock table's hash is randomly
# seeded), but depend on the toolchain and on the CPU features that runtime
# dispatch picks (memchr's AVX2 path, for one): a new rustc, valgrind or
# machine kind is a reason to `update`, in a change of its own.
#
# Environment: INSTR_TOLERANCE (percent, default 3), INSTR_ITERS (default 20000).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-check}
TOLERANCE=${INSTR_TOLERANCE:-3}
ITERS=${INSTR_ITERS:-20000}
BASELINE=bench-results/instructions.json
CASES=(cycle engine-cycle handoff parse expire replicate apply shared-cycle permit-cycle)

case "$MODE" in
    check|update|show) ;;
    *) echo "usage: $0 check|update|show" >&2; exit 2 ;;
esac

if ! command -v valgrind >/dev/null; then
    echo "instructions.sh: installing valgrind" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >&2
fi

# The profiling profile: release's code (same optimisation, same codegen
# units) with full debug info, so callgrind_annotate can show source lines
# of a count; the release profile ships without debug info (Cargo.toml).
cargo build --profile profiling --quiet --bin ringlock-bench
WORK=$(mktemp -d /tmp/ringlock-instr.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cp "${CARGO_TARGET_DIR:-target}/profiling/ringlock-bench" "$WORK/"

RUSTC=$(rustc --version)
VALGRIND=$(valgrind --version)
declare -A COUNT
for case in "${CASES[@]}"; do
    fn=ringlock_instr_${case//-/_}
    if ! valgrind --tool=callgrind --toggle-collect="$fn" \
        --callgrind-out-file="$WORK/$case.out" \
        "$WORK/ringlock-bench" instr "$case" --iters "$ITERS" \
        >"$WORK/$case.ops" 2>"$WORK/$case.log"; then
        echo "instructions.sh: $case failed under valgrind:" >&2
        tail -20 "$WORK/$case.log" >&2
        exit 1
    fi
    total=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$WORK/$case.out" | head -1)
    ops=$(head -1 "$WORK/$case.ops")
    if [ -z "$total" ] || [ "$total" = 0 ] || [ -z "$ops" ]; then
        echo "instructions.sh: no count for $case (is $fn in the binary?)" >&2
        exit 1
    fi
    COUNT[$case]=$(awk -v t="$total" -v n="$ops" 'BEGIN { printf "%.1f", t / n }')
done

baseline_of() { # CASE -> per-op count in the baseline, or nothing
    sed -n "s/^ *\"$1\": *\([0-9.]*\).*/\1/p" "$BASELINE" 2>/dev/null | head -1
}

if [ "$MODE" = update ]; then
    {
        echo "{"
        echo "  \"what\": \"instructions per operation of each case, callgrind Ir (scripts/instructions.sh)\","
        echo "  \"rustc\": \"$RUSTC\","
        echo "  \"valgrind\": \"$VALGRIND\","
        echo "  \"iters\": $ITERS,"
        echo "  \"cases\": {"
        n=${#CASES[@]}
        i=0
        for case in "${CASES[@]}"; do
            i=$((i + 1))
            sep=,
            [ "$i" = "$n" ] && sep=
            echo "    \"$case\": ${COUNT[$case]}$sep"
        done
        echo "  }"
        echo "}"
    } >"$BASELINE"
    echo "instructions.sh: wrote $BASELINE"
fi

FAILED=0
printf '%-14s %12s %12s %8s\n' case baseline now change
for case in "${CASES[@]}"; do
    now=${COUNT[$case]}
    base=$(baseline_of "$case")
    if [ -z "$base" ]; then
        printf '%-14s %12s %12s %8s\n' "$case" - "$now" new
        continue
    fi
    read -r change verdict < <(awk -v b="$base" -v n="$now" -v tol="$TOLERANCE" 'BEGIN {
        c = (n - b) / b * 100
        v = c > tol ? "GREW" : (c < -tol ? "shrank" : "ok")
        printf "%+.2f%% %s\n", c, v
    }')
    printf '%-14s %12s %12s %8s  %s\n' "$case" "$base" "$now" "$change" "$verdict"
    if [ "$verdict" = GREW ]; then
        FAILED=1
    fi
done

if [ "$MODE" = check ]; then
    if [ ! -f "$BASELINE" ]; then
        echo "instructions.sh: no baseline ($BASELINE): run '$0 update'" >&2
        exit 1
    fi
    base_rustc=$(sed -n 's/^ *"rustc": *"\(.*\)",$/\1/p' "$BASELINE")
    if [ "$base_rustc" != "$RUSTC" ]; then
        echo "instructions.sh: note: baseline made with $base_rustc, this is $RUSTC" >&2
    fi
    if [ "$FAILED" = 1 ]; then
        echo "instructions.sh: a hot path grew by more than $TOLERANCE% over $BASELINE." >&2
        echo "If that is intended, run 'scripts/instructions.sh update' and commit the baseline with the change." >&2
        exit 1
    fi
    echo "instructions.sh: every case within $TOLERANCE% of the baseline"
fi
