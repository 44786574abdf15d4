//! `--metrics-listen ADDR`: Prometheus metrics at `/metrics`, `/health`
//! and `/ready`, served by a small HTTP/1.1 server on threads of its own.
//!
//! The loop never waits for it: it publishes a [`Snapshot`] of its
//! counters and gauges ([`crate::stats`]) into a mutex at most every
//! [`crate::stats::PUBLISH_EVERY_MS`] (one lock, taken for a copy, by the
//! loop at most ten times a second), and the HTTP side reads the latest
//! one. A scrape sees numbers at most that old.
//!
//! The server bounds everything a client sends: one request per
//! connection, a request head of at most [`MAX_HEAD`] bytes read within
//! [`IO_TIMEOUT`], at most [`MAX_CONNS`] connections reading their head at
//! once: a new one makes the oldest of those give way (it is shut and
//! closed), so that connections that send nothing (a slowloris) cannot keep
//! a probe of `/health` out; a real request sends its head at once. At
//! most four times [`MAX_CONNS`] threads serve at once (more are answered
//! 503 and closed). Hostile input gets a 4xx and a close.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::engine::stats::HOLD_SHIFT;
pub use crate::stats::Snapshot;
use crate::stats::{Follower, FollowerStats, LOG2_BUCKETS, Log2Histogram};

/// The longest request head (request line and headers) read.
pub const MAX_HEAD: usize = 8 * 1024;
/// Connections reading their request head at once; a new one makes the
/// oldest of them give way.
pub const MAX_CONNS: usize = 16;
/// Threads serving connections at once: those reading their head
/// ([`MAX_CONNS`]), those answering, and those that gave way and are ending.
pub const MAX_THREADS: usize = 4 * MAX_CONNS;
/// Deadline for reading a request and for writing its answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the loop puts its [`Snapshot`] and the HTTP side reads it.
pub type Shared = Arc<Mutex<Snapshot>>;

/// The loop hands the node's latest snapshot over: stamped with the time
/// of the hand-over (the node itself reads no clock), it replaces the one
/// the HTTP side serves.
pub fn publish(shared: &Shared, mut snapshot: Snapshot) {
    snapshot.published_at = Some(Instant::now());
    match shared.lock() {
        Ok(mut s) => *s = snapshot,
        Err(poisoned) => *poisoned.into_inner() = snapshot,
    }
}

/// Starts the metrics listener on `listener`; it serves until the process
/// exits.
pub fn spawn(listener: TcpListener, shared: Shared) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || accept_loop(listener, shared))?;
    Ok(())
}

/// Connections reading their request head, oldest first: `(id, a handle
/// to shut it down)`.
type Reading = Arc<Mutex<Vec<(u64, TcpStream)>>>;

fn accept_loop(listener: TcpListener, shared: Shared) {
    let busy = Arc::new(AtomicUsize::new(0));
    let reading: Reading = Arc::default();
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else {
            // Out of descriptors, say: do not spin on it.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
        {
            let mut reading = reading.lock().unwrap_or_else(|p| p.into_inner());
            if reading.len() >= MAX_CONNS {
                // The oldest still has not sent its head: it gives way. Its
                // read ends at once, and so does its thread.
                let (_, oldest) = reading.remove(0);
                let _ = oldest.shutdown(std::net::Shutdown::Both);
            }
        }
        // Connections that gave way end at once, but their threads need a
        // moment to: wait for them a little before answering 503.
        for _ in 0..100 {
            if busy.load(Ordering::Acquire) < MAX_THREADS {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if busy.fetch_add(1, Ordering::AcqRel) >= MAX_THREADS {
            busy.fetch_sub(1, Ordering::AcqRel);
            let _ = respond(&mut stream, 503, "text/plain", b"busy\n");
            continue;
        }
        let id = next_id;
        next_id += 1;
        if let Ok(handle) = stream.try_clone() {
            reading
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((id, handle));
        }
        let shared = shared.clone();
        let guard = Busy(busy.clone());
        let reading = reading.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let _guard = guard;
                serve(stream, &shared, || {
                    let mut reading = reading.lock().unwrap_or_else(|p| p.into_inner());
                    reading.retain(|&(i, _)| i != id);
                });
            });
        if spawned.is_err() {
            // The guard went with the closure and was dropped: the count
            // is right.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Counts a connection being served; uncounted when dropped.
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves one request on `stream`, then closes it. `head_read` is called
/// once the head is read (or reading it failed).
fn serve(mut stream: TcpStream, shared: &Shared, head_read: impl FnOnce()) {
    let head = read_head(&mut stream);
    head_read();
    let head = match head {
        Ok(head) => head,
        Err(status) => {
            let _ = respond(&mut stream, status, "text/plain", b"bad request\n");
            return;
        }
    };
    let (status, kind, body) = route(&head, shared);
    let _ = respond(&mut stream, status, kind, body.as_bytes());
}

/// Reads up to the end of the request head (`\r\n\r\n`), within
/// [`IO_TIMEOUT`] in all and [`MAX_HEAD`] bytes. `Err` is the status to
/// answer.
fn read_head(stream: &mut TcpStream) -> Result<String, u16> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(408);
        }
        let n = match stream.read(&mut buf) {
            Ok(0) => return Err(400),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(408),
        };
        head.extend_from_slice(buf.get(..n).unwrap_or_default());
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if head.len() > MAX_HEAD {
            return Err(431);
        }
    }
    String::from_utf8(head).map_err(|_| 400)
}

/// The answer to a request head: status, content type, body.
fn route(head: &str, shared: &Shared) -> (u16, &'static str, String) {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return (405, "text/plain", "only GET\n".into());
    }
    let path = target.split('?').next().unwrap_or("");
    let snapshot = match shared.lock() {
        Ok(s) => s.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    match path {
        "/metrics" => (
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            encode(&snapshot),
        ),
        "/health" => (200, "text/plain", "ok\n".into()),
        "/ready" => {
            let stalled = snapshot
                .stale_after
                .zip(snapshot.published_at)
                .map(|(limit, at)| (limit, at.elapsed()))
                .filter(|&(limit, age)| age > limit)
                .map(|(_, age)| age);
            if let Some(age) = stalled {
                return (
                    503,
                    "text/plain",
                    format!(
                        "not ready: the event loop has not turned for {} ms (its peers count \
                         it as dead)\n",
                        age.as_millis()
                    ),
                );
            }
            if snapshot.ready {
                let what = if snapshot.active {
                    "active"
                } else {
                    "standby, synced"
                };
                (200, "text/plain", format!("ready: {what}\n"))
            } else {
                let why = if !snapshot.published {
                    "starting"
                } else if snapshot.leaving {
                    "shutting down"
                } else {
                    "standby without a full snapshot of an active"
                };
                (503, "text/plain", format!("not ready: {why}\n"))
            }
        }
        _ => (
            404,
            "text/plain",
            "not found: try /metrics, /health, /ready\n".into(),
        ),
    }
}

fn respond(stream: &mut TcpStream, status: u16, kind: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut head = String::new();
    let _ = write!(
        head,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// A histogram from a [`Log2Histogram`], scaled to seconds.
#[derive(Debug)]
struct Hist {
    sum: f64,
    count: u64,
    /// Per bucket (not cumulative): upper bound in seconds, count.
    buckets: Vec<(f64, u64)>,
}

impl Hist {
    /// `per_second`: units in a second (1000 for ms).
    fn new(h: &Log2Histogram, per_second: f64, top: usize) -> Hist {
        let mut buckets = Vec::with_capacity(top + 1);
        let mut rest = 0;
        for (i, &n) in h.buckets.iter().enumerate() {
            match Log2Histogram::upper_bound(i).filter(|_| i < top) {
                Some(bound) => buckets.push((bound as f64 / per_second, n)),
                None => rest += n,
            }
        }
        buckets.push((f64::INFINITY, rest));
        debug_assert!(top <= LOG2_BUCKETS);
        Hist {
            sum: h.sum as f64 / per_second,
            count: h.count(),
            buckets,
        }
    }
}

impl EncodeMetric for Hist {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.sum,
            self.count,
            &self.buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One histogram per follower, labelled with its address.
#[derive(Debug)]
struct PerFollower(Vec<(String, Hist)>);

impl EncodeMetric for PerFollower {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (addr, hist) in &self.0 {
            let labels = vec![("follower", addr.as_str())];
            hist.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// An active's figures of each follower's replication.
fn register_followers(r: &mut Registry, followers: &[Follower]) {
    let queued = Family::<Vec<(&'static str, String)>, Gauge>::default();
    type Of = fn(&FollowerStats) -> u64;
    let counters: [(&str, &str, Of); 4] = [
        (
            "ringlock_replication_events",
            "Replication events (grants, renewals, releases, expiries) sent to each follower as deltas",
            |f| f.events,
        ),
        (
            "ringlock_replication_bytes",
            "Bytes of those deltas (snapshots not included)",
            |f| f.bytes,
        ),
        (
            "ringlock_replication_writes",
            "Writes of deltas to each follower's link, at most one per loop turn and each handed to the kernel with one send",
            |f| f.writes,
        ),
        (
            "ringlock_replication_probes_lost",
            "Replication lag probes that the follower did not answer within the peer timeout",
            |f| f.probes_lost,
        ),
    ];
    for f in followers {
        queued
            .get_or_create(&vec![("follower", f.addr.clone())])
            .set(f.queued_bytes as i64);
    }
    r.register(
        "ringlock_replication_queued_bytes",
        "Replication bytes queued for each follower, not yet handed to the kernel",
        queued,
    );
    for (name, help, value) in counters {
        let family = Family::<Vec<(&'static str, String)>, Counter>::default();
        for f in followers {
            family
                .get_or_create(&vec![("follower", f.addr.clone())])
                .inc_by(value(&f.stats));
        }
        r.register(name, help, family);
    }
    let lag = followers
        .iter()
        .map(|f| (f.addr.clone(), Hist::new(&f.stats.lag_us, 1e6, 24)))
        .collect();
    r.register(
        "ringlock_replication_lag_seconds",
        "Replication lag of each follower: from the active's turn that sent a probe behind its deltas until the turn that read the follower's answer, sent once it had applied them (the way back included); whole microseconds",
        PerFollower(lag),
    );
}

/// The snapshot as OpenMetrics text (which Prometheus scrapes).
pub fn encode(s: &Snapshot) -> String {
    let mut r = Registry::default();
    let e = &s.engine;
    register_requests(&mut r, s);
    register_kinds(&mut r, s);
    r.register(
        "ringlock_protocol_errors",
        "Lines that broke the protocol (E, then the connection closes)",
        ConstCounter::new(s.node.protocol_errors),
    );
    r.register(
        "ringlock_lease_expiries",
        "Leases that ran out",
        ConstCounter::new(e.lease_expiries),
    );
    r.register(
        "ringlock_lock_handoffs",
        "Locks passed to the head waiter on a release or an expiry",
        ConstCounter::new(e.granted_after_wait()),
    );
    r.register(
        "ringlock_connections_opened",
        "Connections taken (clients and peer links)",
        ConstCounter::new(s.node.conns_opened),
    );
    r.register(
        "ringlock_connections_refused",
        "Connections closed at once: beyond --max-conns and the peers' reserve",
        ConstCounter::new(s.node.conns_refused),
    );
    r.register(
        "ringlock_connections_open",
        "Connections open (clients and peer links)",
        ConstGauge::new(s.node.conns_opened.saturating_sub(s.node.conns_closed) as i64),
    );
    r.register(
        "ringlock_locks",
        "Live locks: keys held, waited for, or owing a held-back T",
        ConstGauge::new(s.locks as i64),
    );
    r.register(
        "ringlock_waiters",
        "Acquires waiting in queues",
        ConstGauge::new(s.waiters as i64),
    );
    r.register(
        "ringlock_highest_token",
        "The highest fencing token issued or seen",
        ConstGauge::new(i64::try_from(s.highest_token).unwrap_or(i64::MAX)),
    );
    r.register(
        "ringlock_active",
        "1 while this node is the active one (serves clients)",
        ConstGauge::new(i64::from(s.active)),
    );
    r.register(
        "ringlock_ready",
        "1 while active, or a standby holding a full snapshot of the active (what /ready says)",
        ConstGauge::new(i64::from(s.ready)),
    );
    register_histograms(&mut r, s);
    if s.clustered {
        register_cluster(&mut r, s);
    }
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
        out.clear();
        out.push_str("# EOF\n");
    }
    out
}

/// `ringlock_requests`: requests by kind and outcome.
fn register_requests(r: &mut Registry, s: &Snapshot) {
    let e = &s.engine;
    // A family of counters from values: the counters' own type counts up
    // only, so each value is set once on a fresh one.
    let counters = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
    let at_once = e.granted_now + e.shared.granted_at_once + e.permits.granted_at_once;
    for (kind, outcome, v) in [
        ("acquire", "granted_at_once", at_once),
        ("acquire", "granted_after_wait", e.granted_after_wait()),
        ("acquire", "timed_out", e.timed_out),
        ("acquire", "withdrawn", e.withdrawn),
        ("any", "redirected", e.redirected),
        ("any", "refused", s.node.requests_refused),
        ("release", "released", e.released()),
        ("release", "stale_token", e.release_stale),
        ("release", "not_holder", e.release_not_holder),
        ("renew", "renewed", e.renewed),
        ("renew", "stale_token", e.renew_stale),
        ("renew", "not_holder", e.renew_not_holder),
        ("status", "answered", e.status),
    ] {
        counters
            .get_or_create(&vec![("kind", kind), ("outcome", outcome)])
            .inc_by(v);
    }
    r.register(
        "ringlock_requests",
        "Requests by kind and outcome (acquire outcomes are the answers; redirected: M from a standby; refused: E for a request that parsed)",
        counters,
    );
}

/// The wait, hold and loop turn histograms.
fn register_histograms(r: &mut Registry, s: &Snapshot) {
    let e = &s.engine;
    r.register(
        "ringlock_wait_seconds",
        "Time from acquire to grant (0 for a grant at once); whole milliseconds",
        Hist::new(&e.wait_all(), 1e3, 26),
    );
    r.register(
        "ringlock_hold_seconds",
        "Time from grant to release with the grant's token (measured from the token, the wall clock's ns at the grant; leases that ran out are not counted); units of 1.048576 ms",
        Hist::new(&e.hold, 1e9 / f64::from(1u32 << HOLD_SHIFT), 28),
    );
    r.register(
        "ringlock_loop_turn_seconds",
        "Event loop turns, from waking up to waiting again; whole microseconds",
        Hist::new(&s.node.turn_us, 1e6, 24),
    );
}

/// The metrics of a node with peers.
fn register_cluster(r: &mut Registry, s: &Snapshot) {
    r.register(
        "ringlock_peers_up",
        "Peers heard from within the peer timeout",
        ConstGauge::new(s.peers_up as i64),
    );
    r.register(
        "ringlock_snapshots_sent",
        "Snapshots of the table sent to followers",
        ConstCounter::new(s.cluster.snapshots_sent),
    );
    r.register(
        "ringlock_role_handoffs",
        "Times this node handed the active role to a peer",
        ConstCounter::new(s.cluster.handoffs),
    );
    r.register(
        "ringlock_became_active",
        "Times this node became the active one",
        ConstCounter::new(s.cluster.became_active),
    );
    r.register(
        "ringlock_stepped_down",
        "Times this node stopped being the active one",
        ConstCounter::new(s.cluster.stepped_down),
    );
    r.register(
        "ringlock_replication_batched_reads",
        "Reads of the active's replication made in batches by this standby (--replication-batch-us), each taking what arrived since the last",
        ConstCounter::new(s.node.batched_reads),
    );
    r.register(
        "ringlock_permits_over_limit",
        "Semaphore permits applied from the active beyond the semaphore's limit (after a healed split brain); no new permit is granted until back under",
        ConstCounter::new(s.engine.permits_over_limit),
    );
    register_followers(r, &s.followers);
}

/// The metrics by kind of acquire: exclusive (`A`), shared (`G`) and
/// semaphore (`C`).
fn register_kinds(r: &mut Registry, s: &Snapshot) {
    let e = &s.engine;
    let acquires = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
    for (kind, k) in [
        ("exclusive", e.exclusive()),
        ("shared", e.shared),
        ("semaphore", e.permits),
    ] {
        for (outcome, v) in [
            ("granted_at_once", k.granted_at_once),
            ("granted_after_wait", k.granted_after_wait),
            ("timed_out", k.timed_out),
            ("refused", k.refused),
            ("withdrawn", k.withdrawn),
        ] {
            acquires
                .get_or_create(&vec![("lock_kind", kind), ("outcome", outcome)])
                .inc_by(v);
        }
    }
    r.register(
        "ringlock_acquires",
        "Acquires by the kind they ask for (exclusive: A, shared: G, semaphore: C) and outcome (refused: for the key's kind, a semaphore asked as a lock or with another limit, or a lock asked as a semaphore)",
        acquires,
    );
    let held = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    for (kind, v) in [("shared", s.shared_held), ("semaphore", s.permits_held)] {
        held.get_or_create(&vec![("lock_kind", kind)])
            .set(i64::try_from(v).unwrap_or(i64::MAX));
    }
    r.register(
        "ringlock_grants_held",
        "Shared grants (shared) and permits of semaphores (semaphore) held",
        held,
    );
}

/// Binds the metrics listener.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_answer(snapshot: Snapshot) -> (u16, String) {
        let shared: Shared = Arc::new(Mutex::new(snapshot));
        let (status, _, body) = route("GET /ready HTTP/1.1\r\n\r\n", &shared);
        (status, body)
    }

    /// A node of a cluster whose loop stopped turning (blocked on a full
    /// log pipe, say) is no longer ready, whatever it last published: its
    /// peers have counted it dead and taken over.
    #[test]
    fn ready_goes_false_when_a_clustered_loop_stops_publishing() {
        let fresh = Snapshot {
            published: true,
            clustered: true,
            active: true,
            ready: true,
            published_at: Some(Instant::now()),
            stale_after: Some(Duration::from_secs(1)),
            ..Snapshot::default()
        };
        assert_eq!(ready_answer(fresh.clone()).0, 200);
        let old = Instant::now().checked_sub(Duration::from_secs(5)).unwrap();
        let stale = Snapshot {
            published_at: Some(old),
            ..fresh.clone()
        };
        let (status, body) = ready_answer(stale);
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("has not turned"), "{body}");
        // A node without peers publishes only when something moves: an
        // idle one is not stale.
        let idle = Snapshot {
            clustered: false,
            published_at: Some(old),
            stale_after: None,
            ..fresh
        };
        assert_eq!(ready_answer(idle).0, 200);
    }
}
