#!/usr/bin/env bash
# ringlock beside Redis and the loopback floor (docs/performance.md).
#
#   scripts/bench.sh                full run, a few minutes; results in bench-results/
#   scripts/bench.sh --quick        smoke run (under a minute); results in target/bench-quick/
#   scripts/bench.sh --only growth  the growth scenario alone (<date>-<commit>-growth.*)
#   scripts/bench.sh --only kinds   the shared-lock and semaphore scenarios alone
#                                   (<date>-<commit>-kinds.*)
#   scripts/bench.sh --only cluster the replication rows alone: the clusters and
#                                   the single nodes they are compared with, at
#                                   50 connections and pipelined, closed loop and
#                                   paced (<date>-<commit>-cluster.*)
#
# Options: --rounds N, --warmup S, --duration S, --locks N,
#          --growth-locks N (4000000: the growth scenario's fill),
#          --spin-us N (100: the spinning servers' and, in the
#          spinning-client scenario, the load generator's busy-poll),
#          --server-core C, --client-core C, --out DIR,
#          --max-other CORES (0.25), --retries N (0): a run during which the
#          rest of the machine used more than CORES is reported as disturbed,
#          and repeated up to N times,
#          --paced-rates R50,RPIPE (20000,100000): the cycles/s of the
#          paced scenarios below
#
# Builds release; installs redis-server (and a font for the plots) from
# Debian packages if missing; starts ringlock --io uring, ringlock --io
# epoll, redis-server (no persistence) and the echo floor on free loopback
# ports, every server pinned to one core and the load generator to another
# (taskset, the same for every target); runs the matrix with the targets
# alternated inside each round; writes <date>-<commit>.json, .md and
# -throughput.png / -latency.png. Everything it started is stopped on exit.
#
# TLS rows: ringlock-uring-tls and ringlock-epoll-tls (and redis-tls where
# the installed redis-server was built with TLS) run the 1-connection
# ping-pong, 50-connection and pipelined scenarios beside the plain servers,
# with certificates made for the run (openssl, ECDSA P-256, TLS 1.3); the
# report's "The cost of TLS" table gives each one's ratio to the same server
# in plain text.
#
# Cluster rows: "<label>-cluster" is <label> as an active with two standbys
# (ringlock: --peers, a cluster secret made for the run, and for
# ringlock-uring-tls-cluster TLS peer links; Redis: a primary and two
# `redis-server --replicaof` replicas), the active (primary) on the server
# core, the standbys (replicas) on the load generator's core. They run the
# 50-connection and pipelined scenarios beside the single nodes, once the
# cluster has its active and both standbys hold its snapshot (the nodes'
# /metrics), or the replicas are online (INFO replication); the generator
# reads every standby's CPU, and the active's replication lag per follower
# from its /metrics before and after each run. The report's "Replication"
# tables give each one's ratio to the single node. The paced scenarios
# (conns-50-paced, pipelined-paced) run the same two shapes at a fixed
# rate (`ringlock-bench --rate`, --paced-rates), below what every cluster
# sustains here, for the lock servers and the clusters: in the closed loop
# a cluster whose standbys share the generator's core gets fewer requests
# per turn than the single node, and its CPU per cycle counts that too; at
# one rate both get the same load.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

COMMAND="scripts/bench.sh $*"
QUICK=0
ONLY=
GROWTH_LOCKS=4000000
ROUNDS=3
WARMUP=0.5
DURATION=2
LOCKS=1000000
SPIN_US=100
MAX_OTHER=0.25
RETRIES=0
SERVER_CORE=0
CLIENT_CORE=1
OUT_DIR=
PACED_RATES=20000,100000
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --rounds) ROUNDS=$2; shift ;;
        --warmup) WARMUP=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --locks) LOCKS=$2; shift ;;
        --growth-locks) GROWTH_LOCKS=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --spin-us) SPIN_US=$2; shift ;;
        --max-other) MAX_OTHER=$2; shift ;;
        --retries) RETRIES=$2; shift ;;
        --paced-rates) PACED_RATES=$2; shift ;;
        --server-core) SERVER_CORE=$2; shift ;;
        --client-core) CLIENT_CORE=$2; shift ;;
        --out) OUT_DIR=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$QUICK" = 1 ]; then
    ROUNDS=1 WARMUP=0.2 DURATION=0.5 LOCKS=100000 GROWTH_LOCKS=200000
    OUT_DIR=${OUT_DIR:-target/bench-quick}
fi
case "$ONLY" in
    ''|growth|kinds|cluster) ;;
    *) echo "bench.sh: --only takes growth, kinds or cluster" >&2; exit 2 ;;
esac
OUT_DIR=${OUT_DIR:-bench-results}

say() { printf 'bench.sh: %s\n' "$*" >&2; }

# ---------------------------------------------------------------- setup
apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq >&2
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}
# The runs with Redis rows: the full one and the cluster rows.
WITH_REDIS=0
case "$ONLY" in ''|cluster) WITH_REDIS=1 ;; esac
if [ "$WITH_REDIS" = 1 ] && ! command -v redis-server >/dev/null; then
    say "installing redis-server"
    apt_install redis-server
fi
if [ "$WITH_REDIS" = 1 ] && ! command -v redis-cli >/dev/null; then
    apt_install redis-tools
fi
if ! command -v taskset >/dev/null; then
    apt_install util-linux
fi
if [ "$WITH_REDIS" = 1 ] && ! command -v openssl >/dev/null; then
    apt_install openssl
fi
if [ -z "$ONLY" ] && [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
    say "installing fonts-dejavu-core (text in the plots)"
    apt_install fonts-dejavu-core
fi
if [ "$(nproc)" -lt 2 ]; then
    say "warning: one core only: server and load generator share it"
    SERVER_CORE=0 CLIENT_CORE=0
fi

# The commit the binaries are built from ("-dirty": with uncommitted changes).
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    COMMIT=$COMMIT-dirty
fi
say "building release ($COMMIT)"
cargo build --release --quiet --bin ringlock --bin ringlock-bench
# Private copies: a rebuild of target/ during the run cannot swap them, and
# their names (no "ringlock" anywhere in the command line) keep them out of
# reach of a `pkill ringlock` or `killall ringlock` run by someone else's
# tests on a shared machine.
WORK=$(mktemp -d /tmp/rlb.XXXXXX)
mkdir -p "$WORK/bin"
cp "${CARGO_TARGET_DIR:-target}/release/ringlock" "$WORK/bin/rl-server"
cp "${CARGO_TARGET_DIR:-target}/release/ringlock-bench" "$WORK/bin/rl-gen"
RINGLOCK=$WORK/bin/rl-server
GEN=$WORK/bin/rl-gen

PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Servers by label: address, pid, what the generator should speak, and how
# to start it again.
declare -A ADDR PID KIND RESTART_CMD GEN_EXTRA FOLLOWERS
RESTARTS=0

# waits for "listening on ADDR" in a log; prints ADDR
wait_listening() {
    local log=$1 pid=$2
    for _ in $(seq 100); do
        if grep -q "listening on" "$log" 2>/dev/null; then
            sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$log" | head -1
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    say "server did not start:"; cat "$log" >&2
    return 1
}

start_ringlock() { # LABEL IO [server args...]
    local label=$1 io=$2
    shift 2
    taskset -c "$SERVER_CORE" "$RINGLOCK" serve --listen 127.0.0.1:0 --io "$io" "$@" \
        2>"$WORK/$label.log" &
    local pid=$!
    PIDS+=("$pid")
    ADDR[$label]=$(wait_listening "$WORK/$label.log" "$pid")
    grep -q "(io: $io" "$WORK/$label.log" || { say "$label: not running $io"; cat "$WORK/$label.log" >&2; exit 1; }
    PID[$label]=$pid KIND[$label]=ringlock RESTART_CMD[$label]="start_ringlock $label $io $*"
    case " $* " in
        *" --tls-cert "*) GEN_EXTRA[$label]="--tls-ca $WORK/tls/ca.pem" ;;
    esac
}

start_echo() { # LABEL [echo-server args...]
    local label=$1
    shift
    taskset -c "$SERVER_CORE" "$GEN" echo-server --listen 127.0.0.1:0 "$@" 2>"$WORK/$label.log" &
    local pid=$!
    PIDS+=("$pid")
    ADDR[$label]=$(wait_listening "$WORK/$label.log" "$pid")
    PID[$label]=$pid KIND[$label]=echo RESTART_CMD[$label]="start_echo $label $*"
}

# Certificates for the TLS rows: a CA and a server certificate for
# localhost / 127.0.0.1, made for this run.
make_certs() {
    local d=$WORK/tls
    mkdir -p "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/ca.key" \
        -out "$d/ca.pem" -days 2 -subj "/CN=bench CA" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/server.key" \
        -out "$d/server.csr" -subj "/CN=localhost" 2>/dev/null
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 2 -out "$d/server.pem" \
        -extfile <(printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth') \
        2>/dev/null
    # The cluster's nodes: each one's certificate serves clients and peers
    # and dials peers.
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/peer.key" \
        -out "$d/peer.csr" -subj "/CN=localhost" 2>/dev/null
    openssl x509 -req -in "$d/peer.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 2 -out "$d/peer.pem" \
        -extfile <(printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth') \
        2>/dev/null
}

start_redis_tls() { # LABEL: returns non-zero if this redis-server has no TLS
    local label=$1 port d=$WORK/tls
    port=$("$GEN" free-port)
    taskset -c "$SERVER_CORE" redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 --save '' \
        --appendonly no --protected-mode no --tls-cert-file "$d/server.pem" \
        --tls-key-file "$d/server.key" --tls-ca-cert-file "$d/ca.pem" --tls-auth-clients no \
        --logfile "$WORK/$label.log" &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 1
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    ADDR[$label]=127.0.0.1:$port PID[$label]=$pid KIND[$label]=redis
    GEN_EXTRA[$label]="--tls-ca $d/ca.pem"
    RESTART_CMD[$label]="start_redis_tls $label"
}

start_redis() { # LABEL
    local label=$1 port
    port=$("$GEN" free-port)
    taskset -c "$SERVER_CORE" redis-server --port "$port" --bind 127.0.0.1 --save '' \
        --appendonly no --protected-mode no --logfile "$WORK/$label.log" &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    ADDR[$label]=127.0.0.1:$port PID[$label]=$pid KIND[$label]=redis RESTART_CMD[$label]="start_redis $label"
}

# ---- cluster rows ------------------------------------------------------
# The /metrics text of a node (its --metrics-listen ADDR), or nothing
# within 2 s.
metrics_get() { # ADDR
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1" &&
        printf "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n" >&3 &&
        cat <&3' "${1%:*}" "${1##*:}" 2>/dev/null || true
}

# Waits (10 s at most) until the node of ACTIVE_METRICS is active with both
# peers up and one follower per standby, and every standby is a standby
# holding the active's snapshot (ringlock_ready).
wait_cluster() { # LABEL ACTIVE_METRICS STANDBY_METRICS...
    local label=$1 active=$2 m ok
    shift 2
    for _ in $(seq 100); do
        ok=1
        m=$(metrics_get "$active")
        grep -qx 'ringlock_active 1' <<<"$m" || ok=0
        grep -qx 'ringlock_peers_up 2' <<<"$m" || ok=0
        [ "$(grep -c '^ringlock_replication_queued_bytes{' <<<"$m")" = 2 ] || ok=0
        for standby in "$@"; do
            m=$(metrics_get "$standby")
            grep -qx 'ringlock_active 0' <<<"$m" || ok=0
            grep -qx 'ringlock_ready 1' <<<"$m" || ok=0
        done
        [ "$ok" = 1 ] && return 0
        sleep 0.1
    done
    say "$label: no active with two synced standbys within 10 s; logs:"
    tail -5 "$WORK/$label"-*.log >&2
    return 1
}

# An active (the first in --peers: the highest priority) on the server
# core and two standbys on the load generator's core. "tls": peer links
# and the client port speak TLS (certificates of make_certs).
start_cluster() { # LABEL IO [tls]
    local label=$1 io=$2 tls=${3:-} i core ports=() metrics=() pids=() extra=()
    for i in 0 1 2; do
        ports+=("127.0.0.1:$("$GEN" free-port)")
        metrics+=("127.0.0.1:$("$GEN" free-port)")
    done
    [ -e "$WORK/cluster.secret" ] || "$RINGLOCK" keygen "$WORK/cluster.secret" 2>/dev/null
    if [ "$tls" = tls ]; then
        extra=(--tls-cert "$WORK/tls/peer.pem" --tls-key "$WORK/tls/peer.key" --tls-peer-ca "$WORK/tls/ca.pem")
    fi
    for i in 0 1 2; do
        core=$CLIENT_CORE
        [ "$i" = 0 ] && core=$SERVER_CORE
        taskset -c "$core" "$RINGLOCK" serve --listen "${ports[$i]}" --io "$io" \
            --peers "$(IFS=,; echo "${ports[*]}")" --cluster-secret-file "$WORK/cluster.secret" \
            --metrics-listen "${metrics[$i]}" "${extra[@]}" 2>"$WORK/$label-$i.log" &
        pids+=("$!")
        PIDS+=("$!")
    done
    for i in 0 1 2; do
        wait_listening "$WORK/$label-$i.log" "${pids[$i]}" >/dev/null
    done
    wait_cluster "$label" "${metrics[0]}" "${metrics[1]}" "${metrics[2]}"
    ADDR[$label]=${ports[0]} PID[$label]=${pids[0]} KIND[$label]=ringlock
    FOLLOWERS[$label]="${pids[1]} ${pids[2]}"
    RESTART_CMD[$label]="start_cluster $label $io $tls"
    GEN_EXTRA[$label]="--follower-pid ${pids[1]} --follower-pid ${pids[2]} --metrics-addr ${metrics[0]}"
    if [ "$tls" = tls ]; then
        GEN_EXTRA[$label]+=" --tls-ca $WORK/tls/ca.pem"
    fi
}

# Waits (10 s at most) until the primary at PORT has two replicas online
# at its own replication offset.
wait_redis_replicas() { # LABEL PORT
    local label=$1 port=$2 info offset
    for _ in $(seq 100); do
        info=$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" info replication 2>/dev/null | tr -d '\r')
        offset=$(sed -n 's/^master_repl_offset://p' <<<"$info")
        if grep -qx 'connected_slaves:2' <<<"$info" &&
            [ "$(grep -c "^slave[0-9]*:.*state=online,offset=$offset," <<<"$info")" = 2 ]; then
            return 0
        fi
        sleep 0.1
    done
    say "$label: replicas not in sync within 10 s:"
    printf '%s\n' "$info" >&2
    return 1
}

# A primary on the server core and two replicas (`--replicaof`) on the
# load generator's core; no persistence, diskless sync at once.
start_redis_cluster() { # LABEL
    local label=$1 port rport i pids=() ports=()
    for i in 0 1 2; do
        ports+=("$("$GEN" free-port)")
    done
    for i in 0 1 2; do
        local core=$CLIENT_CORE replica=()
        if [ "$i" = 0 ]; then
            core=$SERVER_CORE
        else
            replica=(--replicaof 127.0.0.1 "${ports[0]}")
        fi
        taskset -c "$core" redis-server --port "${ports[$i]}" --bind 127.0.0.1 --save '' \
            --appendonly no --protected-mode no --dir "$WORK" --dbfilename "$label-$i.rdb" \
            --repl-diskless-sync yes --repl-diskless-sync-delay 0 "${replica[@]}" \
            --logfile "$WORK/$label-$i.log" &
        pids+=("$!")
        PIDS+=("$!")
    done
    for i in 0 1 2; do
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/${ports[$i]}") 2>/dev/null && break
            sleep 0.1
        done
    done
    wait_redis_replicas "$label" "${ports[0]}"
    ADDR[$label]=127.0.0.1:${ports[0]} PID[$label]=${pids[0]} KIND[$label]=redis
    FOLLOWERS[$label]="${pids[1]} ${pids[2]}"
    RESTART_CMD[$label]="start_redis_cluster $label"
    GEN_EXTRA[$label]="--follower-pid ${pids[1]} --follower-pid ${pids[2]}"
}

# A server that died is reported (with the end of its log) and started
# again, so that one crash or stray kill does not void the rest of the run.
# A cluster is started again whole when any of its nodes is gone.
ensure_alive() { # LABEL
    local label=$1 pid gone=
    for pid in ${PID[$label]} ${FOLLOWERS[$label]:-}; do
        kill -0 "$pid" 2>/dev/null || gone=$pid
    done
    [ -z "$gone" ] && return 0
    local status=0
    wait "$gone" 2>/dev/null || status=$?
    say "WARNING: $label (pid $gone) is gone (exit status $status); its log ends:"
    tail -5 "$WORK/$label"*.log >&2 || true
    RESTARTS=$((RESTARTS + 1))
    stop "$label"
    ${RESTART_CMD[$label]}
    say "restarted $label: ${ADDR[$label]} (pid ${PID[$label]})"
}

stop() { # LABEL (a cluster: every node)
    local pid
    for pid in ${PID[$1]} ${FOLLOWERS[$1]:-}; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in ${PID[$1]} ${FOLLOWERS[$1]:-}; do
        wait "$pid" 2>/dev/null || true
    done
}

RUNS=$WORK/runs.jsonl
: >"$RUNS"
FAILED=0
DISTURBED=0
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)

# One generator run. When the rest of the machine used more than --max-other
# cores meanwhile (someone else's build on a shared machine), it is reported
# as disturbed and repeated up to --retries times. The last try is kept
# either way, and its "other_cpu" says how disturbed it was.
run_one() { # ROUND SCENARIO LABEL ARGS...
    local round=$1 scenario=$2 label=$3
    shift 3
    local try other
    for try in $(seq 0 "$RETRIES"); do
        run_try "$round" "$scenario" "$label" "$@" || return 0
        other=$(printf '%s' "$LAST_OUT" | sed -n 's/.*"other_cpu":\([0-9.e-]*\).*/\1/p')
        if [ -z "$other" ] || awk -v o="$other" -v m="$MAX_OTHER" 'BEGIN { exit !(o <= m) }'; then
            break
        fi
        DISTURBED=$((DISTURBED + 1))
        if [ "$try" -lt "$RETRIES" ]; then
            say "  round $round $scenario $label: disturbed (rest of machine $(printf '%.2f' "$other") cores), again"
            sleep 2
        else
            say "  round $round $scenario $label: disturbed (rest of machine $(printf '%.2f' "$other") cores), kept"
        fi
    done
    printf '%s\n' "$LAST_OUT" >>"$RUNS"
}

run_try() { # ROUND SCENARIO LABEL ARGS... -> LAST_OUT; non-zero if the run failed
    local round=$1 scenario=$2 label=$3
    shift 3
    ensure_alive "$label"
    local out rc=0
    LAST_OUT=
    out=$(taskset -c "$CLIENT_CORE" "$GEN" --target "${KIND[$label]}" --addr "${ADDR[$label]}" \
        --server-pid "${PID[$label]}" --scenario "$scenario" --label "$label" --round "$round" \
        --warmup "$WARMUP" --duration "$DURATION" --json --quiet ${GEN_EXTRA[$label]:-} "$@" \
        2>"$WORK/gen.err") || rc=$?
    if [ "$rc" != 0 ]; then
        FAILED=$((FAILED + 1))
        say "  FAILED ($rc): $label $scenario: $(tail -1 "$WORK/gen.err")"
        [ -n "$out" ] && printf '%s\n' "$out" >>"$RUNS"
        return 1
    fi
    LAST_OUT=$out
    local figure
    if [ "$scenario" = memory ]; then
        figure="$(printf '%s' "$out" | sed -n 's/.*"rss_after_kib":\([0-9]*\).*/\1/p') KiB RSS"
    else
        figure="$(printf '%s' "$out" | sed -n 's/.*"cycles_per_s":\([0-9]*\).*/\1/p') cycles/s"
    fi
    say "  round $round $scenario $label: $figure"
}

if [ "$WITH_REDIS" = 1 ]; then
# ---------------------------------------------------------------- targets
# --only cluster: the clusters and the single nodes they are compared with
# (the TLS cluster's is ringlock-uring-tls), nothing else.
start_ringlock ringlock-uring uring
start_ringlock ringlock-epoll epoll
start_redis redis
LOCK_LABELS=(ringlock-uring ringlock-epoll redis)
ALL_LABELS=(ringlock-uring ringlock-epoll redis)
PINGPONG_EXTRA=()
if [ -z "$ONLY" ]; then
    start_echo echo
    start_echo echo-spin --spin-us "$SPIN_US"
    ALL_LABELS+=(echo)
    PINGPONG_EXTRA+=(echo-spin)
fi
# ---- TLS variants: "<label>-tls", compared with <label> by the report --
make_certs
start_ringlock ringlock-uring-tls uring --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key"
TLS_LABELS=(ringlock-uring-tls)
if [ -z "$ONLY" ]; then
    start_ringlock ringlock-epoll-tls epoll --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key"
    TLS_LABELS+=(ringlock-epoll-tls)
    if start_redis_tls redis-tls; then
        TLS_LABELS+=(redis-tls)
    else
        say "redis-server has no TLS here: no redis-tls row"
    fi
fi
# ---- cluster variants: "<label>-cluster", compared with <label> ---------
start_cluster ringlock-uring-cluster uring
start_cluster ringlock-epoll-cluster epoll
start_cluster ringlock-uring-tls-cluster uring tls
start_redis_cluster redis-cluster
CLUSTER_LABELS=(ringlock-uring-cluster ringlock-epoll-cluster ringlock-uring-tls-cluster redis-cluster)
# ---- spin variants (`ringlock serve --spin-us N`) ----------------------
# Started as soon as the server has the option. Their label must be
# "<label>-spin": the report compares it with <label> for the spin target.
# They run in the ping-pong scenario only (add them to ALL_LABELS to run
# everywhere).
if [ -n "$ONLY" ]; then
    :
elif "$RINGLOCK" serve --help 2>&1 | grep -q -- '--spin-us'; then
    start_ringlock ringlock-uring-spin uring --spin-us "$SPIN_US"
    start_ringlock ringlock-epoll-spin epoll --spin-us "$SPIN_US"
    PINGPONG_EXTRA+=(ringlock-uring-spin ringlock-epoll-spin)
else
    say "ringlock serve has no --spin-us yet: spin variants skipped"
fi
# ------------------------------------------------------------------------
for label in "${!ADDR[@]}"; do
    say "$label: ${ADDR[$label]} (pid ${PID[$label]}, core $SERVER_CORE${FOLLOWERS[$label]:+; followers ${FOLLOWERS[$label]}, core $CLIENT_CORE})"
done

# ---------------------------------------------------------------- matrix
# name | generator arguments | which labels
if [ "$ONLY" = cluster ]; then
SCENARIOS=(
    "conns-50|--conns 50|all+tls+cluster"
    "pipelined|--conns 4 --pipeline 32|all+tls+cluster"
    "conns-50-paced|--conns 50 --rate ${PACED_RATES%%,*}|paced"
    "pipelined-paced|--conns 4 --pipeline 32 --rate ${PACED_RATES#*,}|paced"
)
else
SCENARIOS=(
    "conns-1|--conns 1|all+pingpong+tls"
    "spinning-client|--conns 1 --spin-us $SPIN_US|all+pingpong"
    "conns-4|--conns 4|all"
    "conns-16|--conns 16|all"
    "conns-50|--conns 50|all+tls+cluster"
    "pipelined|--conns 4 --pipeline 32|all+tls+cluster"
    "conns-50-paced|--conns 50 --rate ${PACED_RATES%%,*}|paced"
    "pipelined-paced|--conns 4 --pipeline 32 --rate ${PACED_RATES#*,}|paced"
    "contended|--conns 64 --mode contended --keys 1|locks"
)
fi

for round in $(seq "$ROUNDS"); do
    for entry in "${SCENARIOS[@]}"; do
        IFS='|' read -r scenario args which <<<"$entry"
        case $which in
            locks) labels=("${LOCK_LABELS[@]}") ;;
            all) labels=("${ALL_LABELS[@]}") ;;
            all+pingpong) labels=("${ALL_LABELS[@]}" "${PINGPONG_EXTRA[@]}") ;;
            all+tls) labels=("${ALL_LABELS[@]}" "${TLS_LABELS[@]}") ;;
            all+tls+cluster) labels=("${ALL_LABELS[@]}" "${TLS_LABELS[@]}" "${CLUSTER_LABELS[@]}") ;;
            all+pingpong+tls) labels=("${ALL_LABELS[@]}" "${PINGPONG_EXTRA[@]}" "${TLS_LABELS[@]}") ;;
            paced) labels=("${LOCK_LABELS[@]}" ringlock-uring-tls "${CLUSTER_LABELS[@]}") ;;
        esac
        # Alternate: each round starts the rotation one target later.
        n=${#labels[@]}
        for i in $(seq 0 $((n - 1))); do
            label=${labels[$(((i + round - 1) % n))]}
            # shellcheck disable=SC2086
            run_one "$round" "$scenario" "$label" $args
        done
    done
done

# The clusters are done: their heartbeats stay out of what follows.
for label in "${CLUSTER_LABELS[@]}"; do
    stop "$label"
done

# Memory: each lock server fresh, 1M locks held (16-byte keys), RSS read.
# Not repeated when disturbed: a second fill would need a fresh server again.
if [ -z "$ONLY" ]; then
say "memory: $LOCKS locks per server"
retries=$RETRIES
RETRIES=0
for label in "${LOCK_LABELS[@]}"; do
    stop "$label"
    case $label in
        ringlock-uring) start_ringlock "$label" uring ;;
        ringlock-epoll) start_ringlock "$label" epoll ;;
        redis) start_redis "$label" ;;
    esac
    run_one 1 memory "$label" --mode memory --locks "$LOCKS" --key-len 16 --conns 4 \
        --pipeline 512 --lease 3600 --duration 120
    stop "$label"
done
RETRIES=$retries
fi # memory
fi # the full run or --only cluster

# ---------------------------------------------------------------- kinds
# Shared locks and semaphores beside exclusive locks, ringlock only (both
# backends, fresh servers): shared acquires (G) of one key by 50
# connections, a semaphore of 8 permits (C) contended by 64; beside them
# exclusive acquires (A) of one key by the same counts, and of a key per
# connection. Every acquire is released with R. Runs in a full run and
# with --only kinds.
if [ -z "$ONLY" ] || [ "$ONLY" = kinds ]; then
    KIND_SCENARIOS=(
        "shared-50|--conns 50 --mode contended --keys 1 --acquire shared"
        "exclusive-one-key-50|--conns 50 --mode contended --keys 1"
        "exclusive-own-keys-50|--conns 50"
        "semaphore-8-64|--conns 64 --mode contended --keys 1 --acquire semaphore --permits 8"
        "exclusive-one-key-64|--conns 64 --mode contended --keys 1"
        "exclusive-own-keys-64|--conns 64"
    )
    KIND_LABELS=(ringlock-uring ringlock-epoll)
    say "kinds: shared locks and semaphores beside exclusive locks"
    for label in "${KIND_LABELS[@]}"; do
        [ -n "${PID[$label]:-}" ] && stop "$label"
        start_ringlock "$label" "${label#ringlock-}"
    done
    for round in $(seq "$ROUNDS"); do
        for entry in "${KIND_SCENARIOS[@]}"; do
            IFS='|' read -r scenario args <<<"$entry"
            n=${#KIND_LABELS[@]}
            for i in $(seq 0 $((n - 1))); do
                label=${KIND_LABELS[$(((i + round - 1) % n))]}
                # shellcheck disable=SC2086
                run_one "$round" "$scenario" "$label" $args
            done
        done
    done
    for label in "${KIND_LABELS[@]}"; do
        stop "$label"
    done
fi # kinds

# Growth: a fresh ringlock per run, with --max-locks room for the fill,
# filled to $GROWTH_LOCKS locks (16-byte keys, 1 h lease) by 4 connections
# x 256 acquires in flight while a probe connection runs acquire/release
# cycles; then the generator stops the server and reads its longest loop
# turn from the stop line. --rounds rounds, the backends alternated.
if [ -z "$ONLY" ] || [ "$ONLY" = growth ]; then
say "growth: $GROWTH_LOCKS locks per server"
for round in $(seq "$ROUNDS"); do
    ios=(uring epoll)
    [ $((round % 2)) = 0 ] && ios=(epoll uring)
    for io in "${ios[@]}"; do
        label=ringlock-$io
        log=$WORK/growth-$io.log
        taskset -c "$SERVER_CORE" "$RINGLOCK" serve --listen 127.0.0.1:0 --io "$io" \
            --max-locks $((GROWTH_LOCKS + 1000)) 2>"$log" &
        pid=$!
        PIDS+=("$pid")
        addr=$(wait_listening "$log" "$pid")
        rc=0
        out=$(taskset -c "$CLIENT_CORE" "$GEN" --mode grow --addr "$addr" --locks "$GROWTH_LOCKS" \
            --key-len 16 --conns 4 --pipeline 256 --lease 3600 --duration 300 --server-pid "$pid" \
            --stop-server-log "$log" --scenario growth --label "$label" --round "$round" --json \
            --quiet 2>"$WORK/gen.err") || rc=$?
        wait "$pid" 2>/dev/null || true
        if [ "$rc" != 0 ]; then
            FAILED=$((FAILED + 1))
            say "  FAILED ($rc): $label growth: $(tail -1 "$WORK/gen.err")"
            tail -3 "$log" >&2
        fi
        if [ -n "$out" ]; then
            printf '%s\n' "$out" >>"$RUNS"
            say "  round $round growth $label: $(grep 'stopped (longest loop turn' "$log" || echo 'no stop line')"
        fi
    done
done
fi # growth
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- results
DAY=$(date -u +%Y-%m-%d)
json_str() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
cat >"$WORK/meta.json" <<EOF
{
  "date": "$(date -u '+%Y-%m-%d %H:%M UTC')",
  "commit": "$(json_str "$COMMIT")",
  "kernel": "$(uname -r)",
  "cpu": "$(json_str "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)")",
  "nproc": "$(nproc)",
  "load_before": "$LOAD_BEFORE",
  "load_after": "$LOAD_AFTER",
  "redis_version": "$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p')",
  "rounds": "$ROUNDS",
  "warmup": "$WARMUP",
  "duration": "$DURATION",
  "spin_us": "$SPIN_US",
  "server_core": "$SERVER_CORE",
  "client_core": "$CLIENT_CORE",
  "seconds": "$(($(date +%s) - START))",
  "server_restarts": "$RESTARTS",
  "disturbed_runs": "$DISTURBED",
  "max_other": "$MAX_OTHER",
  "failed_runs": "$FAILED",
  "command": "$(json_str "$COMMAND")"
}
EOF
mkdir -p "$OUT_DIR"
# Never overwrite an earlier result.
NAME=$DAY-$COMMIT${ONLY:+-$ONLY}
PREFIX=$OUT_DIR/$NAME
n=2
while [ -e "$PREFIX.json" ]; do
    PREFIX=$OUT_DIR/$NAME-$n
    n=$((n + 1))
done
if [ -n "$ONLY" ]; then
    "$GEN" report --no-plots --runs "$RUNS" --meta "$WORK/meta.json" --out "$PREFIX"
    say "wrote $PREFIX.json, $PREFIX.md ($(($(date +%s) - START)) s)"
else
    "$GEN" report --runs "$RUNS" --meta "$WORK/meta.json" --out "$PREFIX"
    say "wrote $PREFIX.json, $PREFIX.md, $PREFIX-throughput.png, $PREFIX-latency.png ($(($(date +%s) - START)) s)"
fi
if [ "$FAILED" != 0 ]; then
    say "$FAILED run(s) failed"
    exit 1
fi
