#!/usr/bin/env bash
# Failover timings of a three-node ringlock cluster, with the real binary
# (docs/cluster.md).
#
#   scripts/failover.sh             5 runs of each measurement, both backends
#   scripts/failover.sh --runs 20 --io epoll
#
# Options: --runs N (5), --io "uring epoll", --heartbeat-ms MS (50),
#          --peer-timeout-ms MS (500), --out DIR (bench-results)
#
# Builds release (ringlock and examples/failover_probe.rs), starts three
# nodes on free 127.0.0.1 ports with the same --peers list, and for each
# backend and run measures (examples/failover_probe.rs has the details):
#   crash    kill -9 of the active -> first grant by node 1, seen by a probe
#            hammering `A key 1 0.05` on node 1 (target: under 1 s)
#   handoff  SIGTERM of the active -> gap between the old active's last
#            grant and node 1's first grant, with one probe loop on each
#            (target: under 50 ms); the old active must exit 0
#   client   kill -9 of the active -> first grant through the official
#            client (ringlock-client) given all three addresses
# After each measurement node 0 is started again on its port and the script
# waits until it has the role back (failback), so every run starts alike.
# Writes DIR/failover-<date>-<commit>.json (every run, min/median/max, the
# target checks, the machine) and .md; exits 1 if a target is missed.
# Everything it started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5
BACKENDS="uring epoll"
HEARTBEAT_MS=50
PEER_TIMEOUT_MS=500
OUT_DIR=bench-results
COMMAND="scripts/failover.sh${*:+ $*}"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS=$2; shift ;;
        --io) BACKENDS=$2; shift ;;
        --heartbeat-ms) HEARTBEAT_MS=$2; shift ;;
        --peer-timeout-ms) PEER_TIMEOUT_MS=$2; shift ;;
        --out) OUT_DIR=$2; shift ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "failover.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

say() { printf 'failover.sh: %s\n' "$*" >&2; }

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    COMMIT=$COMMIT-dirty
fi
say "building release ($COMMIT)"
cargo build --release --quiet --bin ringlock --example failover_probe

WORK=$(mktemp -d "${TMPDIR:-/tmp}/failover.XXXXXX")
# Private copies: a rebuild of target/ during the run cannot swap them, and
# their names keep them out of reach of a `pkill ringlock` run by someone
# else's tests on a shared machine.
cp target/release/ringlock "$WORK/fo-node"
cp target/release/examples/failover_probe "$WORK/fo-probe"
NODE=$WORK/fo-node
PROBE=$WORK/fo-probe
RAW=$WORK/runs.jsonl
: >"$RAW"

declare -a PID=()
cleanup() {
    for p in "${PID[@]}"; do
        [ -n "$p" ] && kill -CONT "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Three free loopback ports (bound together so that they differ).
read -r -a PORTS <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"
ADDR=("127.0.0.1:${PORTS[0]}" "127.0.0.1:${PORTS[1]}" "127.0.0.1:${PORTS[2]}")
PEERS=$(IFS=,; echo "${ADDR[*]}")
IO=

"$NODE" keygen "$WORK/secret" 2>/dev/null

start_node() {
    local i=$1
    "$NODE" serve --listen "${ADDR[$i]}" --peers "$PEERS" --io "$IO" \
        --cluster-secret-file "$WORK/secret" \
        --heartbeat-ms "$HEARTBEAT_MS" --peer-timeout-ms "$PEER_TIMEOUT_MS" \
        2>>"$WORK/node$i-$IO.log" &
    PID[$i]=$!
}

stop_all() {
    for i in 0 1 2; do
        if [ -n "${PID[$i]:-}" ]; then
            kill -KILL "${PID[$i]}" 2>/dev/null || true
            wait "${PID[$i]}" 2>/dev/null || true
            PID[$i]=
        fi
    done
}

settle_on_0() {
    if ! "$PROBE" settle --addrs "$PEERS" --active 0 --within-ms 10000 >/dev/null; then
        say "the cluster did not settle on node 0; logs:"
        tail -n 20 "$WORK"/node*-"$IO".log >&2
        exit 1
    fi
}

# One measurement: the probe's JSON line, with the backend and the run.
record() {
    local run=$1 extra=$2 json=$3
    printf '{"io":"%s","run":%d%s,"result":%s}\n' "$IO" "$run" "$extra" "$json" >>"$RAW"
    say "$IO run $run: $json"
}

# Node 0 is gone (killed, or exiting after SIGTERM): wait for the process,
# start it again, wait for the failback. Sets EXIT to node 0's exit status.
EXIT=
restart_0() {
    EXIT=0
    wait "${PID[0]}" 2>/dev/null || EXIT=$?
    PID[0]=
    start_node 0
    settle_on_0
}

START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for IO in $BACKENDS; do
    say "--io $IO: starting three nodes on $PEERS"
    for i in 0 1 2; do start_node "$i"; done
    settle_on_0
    for run in $(seq 1 "$RUNS"); do
        json=$("$PROBE" crash --pid "${PID[0]}" --successor "${ADDR[1]}")
        restart_0
        record "$run" "" "$json"

        json=$("$PROBE" handoff --pid "${PID[0]}" --old "${ADDR[0]}" --successor "${ADDR[1]}")
        restart_0
        record "$run" ",\"exit\":$EXIT" "$json"

        json=$("$PROBE" client --pid "${PID[0]}" --addrs "$PEERS")
        restart_0
        record "$run" "" "$json"
    done
    stop_all
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- results
mkdir -p "$OUT_DIR"
PREFIX="$OUT_DIR/failover-$(date -u +%Y-%m-%d)-$COMMIT"
status=0
python3 - "$RAW" "$PREFIX" <<EOF || status=$?
import json, statistics, sys
raw, prefix = sys.argv[1], sys.argv[2]
runs = [json.loads(l) for l in open(raw)]
meta = {
    "date": "$(date -u '+%Y-%m-%d %H:%M UTC')",
    "commit": "$COMMIT",
    "command": "$COMMAND",
    "kernel": "$(uname -r)",
    "cpus": $(nproc),
    "cpu": "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//; s/"//g')",
    "load_before": "$LOAD_BEFORE",
    "load_after": "$LOAD_AFTER",
    "seconds": $(($(date +%s) - START)),
    "runs_per_measurement": $RUNS,
    "heartbeat_ms": $HEARTBEAT_MS,
    "peer_timeout_ms": $PEER_TIMEOUT_MS,
}
# (mode, field, what, target in ms or None)
figures = [
    ("crash", "first_grant_ms", "kill -9 -> first grant by node 1", 1000.0),
    ("handoff", "gap_ms", "SIGTERM hand-off: gap in service", 50.0),
    ("handoff", "signal_to_first_new_ms", "SIGTERM -> first grant by node 1", None),
    ("client", "first_grant_ms", "kill -9 -> first grant through the client", None),
]
summary, checks = [], []
for io in dict.fromkeys(r["io"] for r in runs):
    for mode, field, what, target in figures:
        xs = [r["result"][field] for r in runs if r["io"] == io and r["result"]["mode"] == mode]
        if not xs:
            continue
        row = {"io": io, "figure": what, "mode": mode, "field": field, "n": len(xs),
               "min_ms": min(xs), "median_ms": statistics.median(xs), "max_ms": max(xs)}
        summary.append(row)
        if target is not None:
            checks.append({"io": io, "figure": what, "target_ms": target,
                           "max_ms": max(xs), "met": max(xs) < target})
exits = [r.get("exit") for r in runs if r["result"]["mode"] == "handoff"]
checks.append({"figure": "old active exits 0 after SIGTERM", "exits": exits,
               "met": all(e == 0 for e in exits)})
out = {"meta": meta, "summary": summary, "checks": checks, "runs": runs}
with open(prefix + ".json", "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
md = [f"# Failover, {meta['date']}, commit {meta['commit']}", "",
      f"\`{meta['command']}\`: three nodes on loopback, heartbeats every "
      f"{meta['heartbeat_ms']} ms, peer timeout {meta['peer_timeout_ms']} ms, "
      f"{meta['runs_per_measurement']} runs of each figure; {meta['cpus']} CPUs "
      f"({meta['cpu']}), kernel {meta['kernel']}, load {meta['load_before']} before, "
      f"{meta['load_after']} after.", "",
      "| io | figure | n | min ms | median ms | max ms |",
      "|----|--------|---|--------|-----------|--------|"]
for r in summary:
    md.append(f"| {r['io']} | {r['figure']} | {r['n']} | {r['min_ms']:.2f} | "
              f"{r['median_ms']:.2f} | {r['max_ms']:.2f} |")
md += ["", "| target | io | worst run | met |", "|--------|----|-----------|-----|"]
for c in checks:
    if "target_ms" in c:
        md.append(f"| {c['figure']} < {c['target_ms']:.0f} ms | {c['io']} | "
                  f"{c['max_ms']:.2f} ms | {'yes' if c['met'] else '**no**'} |")
    else:
        codes = sorted(set(c["exits"]), key=str)
        md.append(f"| {c['figure']} | all | {len(c['exits'])} runs, exit codes {codes} | "
                  f"{'yes' if c['met'] else '**no**'} |")
with open(prefix + ".md", "w") as f:
    f.write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if all(c["met"] for c in checks) else 1)
EOF
say "wrote $PREFIX.json and $PREFIX.md ($(($(date +%s) - START)) s)"
exit $status
