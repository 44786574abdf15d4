#!/usr/bin/env bash
# Failover timings of a three-node ringlock cluster, with the real binary
# (docs/cluster.md).
#
#   scripts/failover.sh             5 runs of each measurement, 2 of each
#                                   client event, both backends
#   scripts/failover.sh --runs 20 --io epoll
#
# Options: --runs N (5), --event-runs N (2), --io "uring epoll",
#          --heartbeat-ms MS (50), --peer-timeout-ms MS (500),
#          --out DIR (bench-results)
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
# waits until it has the role back (failback, after the server's default
# --failback-delay-ms of 5 s), so every run starts alike.
# Then the client events, each with the probe's `watch` running throughout
# (three locks with lease 2 s renewed by the official client, and a
# long-lived client's acquire/release cycles): kill -9 of the active and a
# restart 1 s and 2.6 s later, SIGSTOP of the active for 2.5 s and 4 s,
# SIGTERM and a restart; then the hand-back to node 0 and 2.5 s more (past
# a lease). Per event: "client stall" (the worst cycle; target: under
# 1.5 s), "locks lost at lease 2 s" (target: none), and any held key
# granted to another client (target: none).
# Writes DIR/failover-<date>-<commit>.json (every run, min/median/max, the
# target checks, the machine) and .md; exits 1 if a target is missed.
# Everything it started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=5
EVENT_RUNS=2
BACKENDS="uring epoll"
HEARTBEAT_MS=50
PEER_TIMEOUT_MS=500
OUT_DIR=bench-results
COMMAND="scripts/failover.sh${*:+ $*}"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS=$2; shift ;;
        --event-runs) EVENT_RUNS=$2; shift ;;
        --io) BACKENDS=$2; shift ;;
        --heartbeat-ms) HEARTBEAT_MS=$2; shift ;;
        --peer-timeout-ms) PEER_TIMEOUT_MS=$2; shift ;;
        --out) OUT_DIR=$2; shift ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
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
WATCHER=
cleanup() {
    [ -n "$WATCHER" ] && kill -KILL "$WATCHER" 2>/dev/null
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
    # The start-up wait, a snapshot and the 5 s failback delay.
    if ! "$PROBE" settle --addrs "$PEERS" --active 0 --within-ms 20000 >/dev/null; then
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

# Node 0 killed (kill -9), started again SECONDS later.
kill_restart_0() {
    kill -KILL "${PID[0]}"
    wait "${PID[0]}" 2>/dev/null || true
    PID[0]=
    sleep "$1"
    start_node 0
}

# One client event (see the top): the watch probe runs through it, the
# hand-back to node 0 and 2.5 s after.
client_event() {
    local run=$1 event=$2
    rm -f "$WORK/ready" "$WORK/stop"
    "$PROBE" watch --addrs "$PEERS" --ready "$WORK/ready" --stop "$WORK/stop" >"$WORK/watch.json" &
    WATCHER=$!
    for _ in $(seq 1 300); do
        [ -e "$WORK/ready" ] && break
        sleep 0.1
    done
    if [ ! -e "$WORK/ready" ]; then
        say "the watch probe did not hold its locks within 30 s"
        exit 1
    fi
    sleep 1
    case $event in
        kill-restart-1s) kill_restart_0 1 ;;
        kill-restart-2.6s) kill_restart_0 2.6 ;;
        stop-2.5s | stop-4s)
            kill -STOP "${PID[0]}"
            sleep "${event#stop-}" # 2.5s, 4s
            kill -CONT "${PID[0]}"
            ;;
        term-restart)
            kill -TERM "${PID[0]}"
            EXIT=0
            wait "${PID[0]}" 2>/dev/null || EXIT=$?
            PID[0]=
            start_node 0
            ;;
    esac
    settle_on_0
    sleep 2.5
    : >"$WORK/stop"
    if ! wait "$WATCHER"; then
        say "the watch probe failed ($event)"
        exit 1
    fi
    WATCHER=
    record "$run" ",\"event\":\"$event\"" "$(cat "$WORK/watch.json")"
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
    for run in $(seq 1 "$EVENT_RUNS"); do
        for event in kill-restart-1s kill-restart-2.6s stop-2.5s stop-4s term-restart; do
            client_event "$run" "$event"
        done
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
# The client events: per event, the client stall (worst cycle) and the
# locks lost at lease 2 s, with their targets.
events = []
for io in dict.fromkeys(r["io"] for r in runs):
    for ev in dict.fromkeys(r["event"] for r in runs if "event" in r):
        rs = [r["result"] for r in runs if r["io"] == io and r.get("event") == ev]
        if not rs:
            continue
        stalls = [x["worst_cycle_ms"] for x in rs]
        row = {"io": io, "event": ev, "n": len(rs),
               "stall_median_ms": statistics.median(stalls), "stall_max_ms": max(stalls),
               "holders": sum(x["holders"] for x in rs),
               "holders_lost": sum(x["holders_lost"] for x in rs),
               "double_grants": sum(len(x["double_grants"]) for x in rs),
               "cycles": sum(x["cycles"] for x in rs),
               "cycle_errors": sum(len(x["cycle_errors"]) for x in rs)}
        events.append(row)
        checks.append({"io": io, "figure": f"{ev}: client stall", "target_ms": 1500.0,
                       "max_ms": max(stalls), "met": max(stalls) < 1500.0})
        checks.append({"io": io, "figure": f"{ev}: locks lost at lease 2 s, held keys granted again, failed cycles",
                       "count": row["holders_lost"] + row["double_grants"] + row["cycle_errors"],
                       "met": row["holders_lost"] == 0 and row["double_grants"] == 0 and row["cycle_errors"] == 0})
exits = [r.get("exit") for r in runs if r["result"]["mode"] == "handoff"]
checks.append({"figure": "old active exits 0 after SIGTERM", "exits": exits,
               "met": all(e == 0 for e in exits)})
out = {"meta": meta, "summary": summary, "events": events, "checks": checks, "runs": runs}
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
if events:
    md += ["", "Client events (three locks with lease 2 s renewed by the official client, "
           "and a long-lived client's acquire/release cycles, through the event, the hand-back "
           "and 2.5 s after):", "",
           "| io | event | runs | client stall median ms | client stall max ms | locks lost at lease 2 s | held keys granted again | cycles (failed) |",
           "|----|-------|------|------------------------|---------------------|-------------------------|-------------------------|-----------------|"]
    for e in events:
        md.append(f"| {e['io']} | {e['event']} | {e['n']} | {e['stall_median_ms']:.0f} | "
                  f"{e['stall_max_ms']:.0f} | {e['holders_lost']} of {e['holders']} | "
                  f"{e['double_grants']} | {e['cycles']} ({e['cycle_errors']}) |")
md += ["", "| target | io | worst run | met |", "|--------|----|-----------|-----|"]
for c in checks:
    if "count" in c:
        md.append(f"| {c['figure']}: none | {c['io']} | {c['count']} | "
                  f"{'yes' if c['met'] else '**no**'} |")
    elif "target_ms" in c:
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
