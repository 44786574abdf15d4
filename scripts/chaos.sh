#!/usr/bin/env bash
# Partition and chaos runs of a three-node ringlock cluster in network
# namespaces, with the real binary. Needs root, `ip` and `tc`.
#
#   scripts/chaos.sh --seed 7 --duration 300            seeded chaos run
#   scripts/chaos.sh --seed 7 --duration 60 --io epoll --out /tmp/c7
#   scripts/chaos.sh --measure [--reps 3] [--lengths 1,2,4,7,14] [--io uring]
#
# Options: --seed N (1), --duration S (120), --io uring|epoll (uring),
#          --out DIR (target/chaos/<mode>-seed<N>-<time>; one subdirectory
#          per backend when --io lists two, as in --io "uring epoll"),
#          --measure, --reps N (3), --lengths LIST (1,2,4,7,14), --gap S (5),
#          --bench-out DIR (bench-results),
#          --serve-args "ARGS" (appended to every node's `ringlock serve`,
#          e.g. --serve-args "--replication-batch-us 0")
#
# Builds release (ringlock and examples/chaos), copies both into a private
# work directory, and runs `chaos run` (or `chaos measure`) inside an
# isolated lab: one namespace per node, one for the clients, one holding
# the bridge that joins them (10.77.0.0/24 exists only in there). The
# harness (examples/chaos/harness/) applies the faults, records every grant
# and status answer, checks them and prints the report; see
# examples/chaos/harness/check.rs for the checks and their windows. Node
# logs, the schedule, the raw records and the report stay in --out.
#
# --measure: the active (node 0), then a standby (node 2), is isolated from
# its peers for each length, --reps times; the report, with this command,
# the machine and its load, is also written to
# <bench-out>/partition-<date>-<commit>.md.
#
# Exits 1 if a check fails, 2 if the run could not be made. Everything it
# made (namespaces, processes in them, the work directory) is removed on
# exit, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

SEED=1
DURATION=120
IO=uring
OUT=
MEASURE=0
REPS=3
LENGTHS=1,2,4,7,14
GAP=5
SERVE_ARGS=
BENCH_OUT=bench-results
COMMAND="scripts/chaos.sh"
for arg in "$@"; do
    case "$arg" in
        *[!A-Za-z0-9_./,=:-]*) COMMAND+=" \"$arg\"" ;;
        *) COMMAND+=" $arg" ;;
    esac
done
while [ $# -gt 0 ]; do
    case "$1" in
        --seed) SEED=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --io) IO=$2; shift ;;
        --out) OUT=$2; shift ;;
        --measure) MEASURE=1 ;;
        --reps) REPS=$2; shift ;;
        --lengths) LENGTHS=$2; shift ;;
        --gap) GAP=$2; shift ;;
        --bench-out) BENCH_OUT=$2; shift ;;
        --serve-args) SERVE_ARGS=$2; shift ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        *) echo "chaos.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for io in $IO; do
    case "$io" in uring|epoll) ;; *) echo "chaos.sh: --io takes uring and/or epoll" >&2; exit 2 ;; esac
done

say() { printf 'chaos.sh: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "needs root (network namespaces)"
    exit 2
fi
for tool in ip tc; do
    command -v "$tool" >/dev/null || { say "needs $tool"; exit 2; }
done

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    COMMIT=$COMMIT-dirty
fi
say "building release ($COMMIT)"
cargo build --release --quiet --bin ringlock --example chaos

WORK=$(mktemp -d "${TMPDIR:-/tmp}/chaos.XXXXXX")
# Namespace names: this prefix, then -br, -n0.., -cl.
PREFIX=rlc$$
HARNESS_PID=
cleanup() {
    local ns pid
    if [ -n "$HARNESS_PID" ]; then
        kill -TERM "$HARNESS_PID" 2>/dev/null || true
        wait "$HARNESS_PID" 2>/dev/null || true
    fi
    # The harness removes its lab itself; this is for a harness that was
    # killed. Only namespaces named with this run's prefix, and only the
    # processes inside them (ours: nodes started by the harness).
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -CONT "$pid" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Private copies: a rebuild of target/ during the run cannot swap them.
cp target/release/ringlock "$WORK/rl-node"
cp target/release/examples/chaos "$WORK/rl-chaos"

MODE=run
[ "$MEASURE" = 1 ] && MODE=measure
if [ -z "$OUT" ]; then
    OUT=target/chaos/$MODE-seed$SEED-$(date -u +%Y%m%dT%H%M%S)
fi
UPTIME_BEFORE=$(uptime)
status=0
for io in $IO; do
    dir=$OUT
    [ "$(echo $IO | wc -w)" -gt 1 ] && dir=$OUT/$io
    mkdir -p "$dir"
    say "--io $io: lab $PREFIX-*, output in $dir"
    ARGS=(--bin "$WORK/rl-node" --prefix "$PREFIX" --io "$io" --out "$dir" --seed "$SEED")
    [ -n "$SERVE_ARGS" ] && ARGS+=(--serve-args "$SERVE_ARGS")
    if [ "$MODE" = run ]; then
        ARGS+=(--duration "$DURATION")
    else
        ARGS+=(--reps "$REPS" --lengths "$LENGTHS" --gap "$GAP")
    fi
    one=0
    "$WORK/rl-chaos" "$MODE" "${ARGS[@]}" &
    HARNESS_PID=$!
    wait "$HARNESS_PID" || one=$?
    HARNESS_PID=
    say "--io $io: harness exit status $one; report in $dir/report.md"
    [ "$one" -gt "$status" ] && status=$one
done
UPTIME_AFTER=$(uptime)

if [ "$MODE" = measure ]; then
    mkdir -p "$BENCH_OUT"
    FILE="$BENCH_OUT/partition-$(date -u +%Y-%m-%d)-$COMMIT.md"
    LOAD=$(echo "$UPTIME_BEFORE $UPTIME_AFTER" | grep -o 'load average: [0-9.]*' | awk '{ if ($3 > m) m = $3 } END { print m + 0 }')
    {
        echo "# Partitions and split brain, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT"
        echo
        echo "Command: \`$COMMAND\` (harness: \`examples/chaos\`; lab: one network namespace per"
        echo "node and one for the clients, on a private bridge; loss is made on the bridge, silently)."
        echo
        echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
        echo "kernel $(uname -r)."
        echo
        echo "- \`uptime\` before: \`$(echo $UPTIME_BEFORE)\`"
        echo "- \`uptime\` after: \`$(echo $UPTIME_AFTER)\`"
        if awk -v l="$LOAD" 'BEGIN { exit !(l > 1) }'; then
            echo
            echo "The machine is shared with other engineers' builds and tests, and its load"
            echo "was above 1 around this run: timings may be stretched by CPU contention."
        fi
        echo
        echo "Each fault isolates one node from its peers (its clients still reach it), then"
        echo "heals at once: the active (node 0), then a standby (node 2), for each length"
        echo "($LENGTHS s), $REPS times over, $GAP s of quiet after each, with 8 clients"
        echo "contending on 4 keys and a probe client. \"split after heal\": from the heal"
        echo "until no two nodes say \`active\` any more; \"one active\": until exactly one"
        echo "node is active and every node names it, for good (\`S\` polled every 20 ms on"
        echo "every node from the client namespace, judged on a 10 ms grid)."
        for io in $IO; do
            dir=$OUT
            [ "$(echo $IO | wc -w)" -gt 1 ] && dir=$OUT/$io
            echo
            echo "## --io $io"
            echo
            if [ -s "$dir/report.md" ]; then
                cat "$dir/report.md"
            else
                echo "(no report: the run failed; see $dir)"
            fi
        done
    } >"$FILE"
    say "wrote $FILE"
fi
exit $status
