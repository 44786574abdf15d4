//! Operating a node: the metrics listener (`/metrics` parses as Prometheus
//! text and its counters follow a scripted session, `/ready` follows the
//! role through a failover, hostile HTTP input), and the log (timestamps,
//! role changes, JSON lines).

#[macro_use]
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{Cluster, Server, StderrLog, poll_until};

const WITHIN: Duration = Duration::from_secs(10);

/// The metrics address a node logged (`metrics on http://ADDR/metrics`).
fn metrics_addr(log: &StderrLog) -> SocketAddr {
    log.metrics_addr()
}

/// One HTTP request, its status and body. Every wait has a deadline.
fn http(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(request).expect("write request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read answer");
    let text = String::from_utf8(raw).expect("utf-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|l| l.trim().parse().ok())
        .expect("Content-Length");
    assert_eq!(body.len(), length, "body length");
    (status, body.to_string())
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
    )
}

/// `/metrics`, checked line by line against the exposition format (a
/// `# HELP` and a `# TYPE` before each family's samples, samples of that
/// family only, numeric values, `# EOF` last), then parsed by
/// `prometheus-parse`. Returns each sample (name with its labels as
/// written) and value.
#[expect(clippy::too_many_lines)]
fn scrape(addr: SocketAddr) -> HashMap<String, f64> {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    let mut samples = HashMap::new();
    let mut family: Option<(String, String)> = None;
    let mut help_for = None;
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "no # EOF at the end");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            help_for = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert_eq!(help_for.as_deref(), Some(name), "TYPE without HELP: {line}");
            assert!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "type {kind}"
            );
            family = Some((name.to_string(), kind.to_string()));
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line:?}");
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name {name:?}"
        );
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
        }
        let (fam, kind) = family.as_ref().expect("a sample before any TYPE");
        let suffixes: &[&str] = match kind.as_str() {
            "counter" => &["_total"],
            "gauge" => &[""],
            _ => &["_sum", "_count", "_bucket"],
        };
        assert!(
            suffixes.iter().any(|s| name == format!("{fam}{s}")),
            "{name} is not of the family {fam} ({kind})"
        );
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    // And a parser of the format agrees on every counter and gauge (it
    // folds a histogram's series into one sample).
    let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("prometheus-parse takes it");
    let mut theirs: Vec<(String, u64)> = Vec::new();
    let mut histograms = 0;
    for sample in &parsed.samples {
        match sample.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => {
                theirs.push((sample.metric.clone(), v.to_bits()))
            }
            // OpenMetrics names a counter's family without `_total` (its
            // samples have it); the classic parser then calls them untyped.
            prometheus_parse::Value::Untyped(v) if sample.metric.ends_with("_total") => {
                theirs.push((sample.metric.clone(), v.to_bits()))
            }
            prometheus_parse::Value::Histogram(_) => histograms += 1,
            // It takes a histogram's `_sum` and `_count` apart from its
            // buckets when they come first (as OpenMetrics allows).
            prometheus_parse::Value::Untyped(_)
                if sample.metric.ends_with("_sum") || sample.metric.ends_with("_count") => {}
            ref other => panic!("{}: {other:?}", sample.metric),
        }
    }
    let mut ours: Vec<(String, u64)> = samples
        .iter()
        .filter(|(series, _)| {
            let name = series.split('{').next().unwrap();
            !name.ends_with("_bucket") && !name.ends_with("_sum") && !name.ends_with("_count")
        })
        .map(|(series, v)| (series.split('{').next().unwrap().to_string(), v.to_bits()))
        .collect();
    theirs.sort();
    ours.sort();
    assert_eq!(theirs, ours, "prometheus-parse reads other values");
    // The node's three, and an active's lag histogram of each follower.
    let followers = samples
        .keys()
        .filter(|series| series.starts_with("ringlock_replication_lag_seconds_count{"))
        .count();
    assert_eq!(histograms, 3 + followers, "the histograms");
    samples
}

fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no {series} in {samples:#?}"))
}

fn requests(samples: &HashMap<String, f64>, kind: &str, outcome: &str) -> f64 {
    value(
        samples,
        &format!("ringlock_requests_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}"),
    )
}

fn metrics_follow_a_scripted_session(io: &str) {
    let (server, log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        io,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let m = metrics_addr(&log);
    // Before anything: a fresh node counts nothing.
    let s = poll_until(
        "a first publish",
        WITHIN,
        || scrape(m),
        |s| s.get("ringlock_active") == Some(&1.0),
    )
    .1;
    assert_eq!(requests(&s, "acquire", "granted_at_once"), 0.0);
    assert_eq!(value(&s, "ringlock_ready"), 1.0);

    let mut a = server.connect();
    let mut b = server.connect();
    let t1 = common::Conn::token_of(&a.call("A ops/k 30 0"));
    assert_eq!(b.call("A ops/k 30 0.1"), "T ops/k"); // waits 100 ms, times out
    b.line("A ops/k 30 0"); // waits
    assert_eq!(a.call("R ops/k 1"), "R ops/k 0"); // stale token
    std::thread::sleep(Duration::from_millis(20)); // a hold time above 0 ms... at least 20
    assert_eq!(a.call(&format!("R ops/k {t1}")), "R ops/k 1");
    let t2 = common::Conn::token_of(&b.recv()); // granted after waiting
    assert_eq!(b.call(&format!("N ops/k {t2} 30")), "N ops/k 1");
    assert_eq!(b.call("N ops/k 1 30"), "N ops/k 0");
    let t3 = common::Conn::token_of(&a.call("A ops/short 0.05 0")); // expires in 50 ms
    let mut bad = server.connect();
    bad.line("X what");
    assert!(bad.recv().starts_with("E unknown op"));

    let s = poll_until(
        "the session's counters",
        WITHIN,
        || scrape(m),
        |s| {
            s.get("ringlock_lease_expiries_total") == Some(&1.0)
                && s.get("ringlock_protocol_errors_total") == Some(&1.0)
        },
    )
    .1;
    assert_eq!(requests(&s, "acquire", "granted_at_once"), 2.0);
    assert_eq!(requests(&s, "acquire", "granted_after_wait"), 1.0);
    assert_eq!(requests(&s, "acquire", "timed_out"), 1.0);
    assert_eq!(requests(&s, "release", "released"), 1.0);
    assert_eq!(requests(&s, "release", "stale_token"), 1.0);
    assert_eq!(requests(&s, "renew", "renewed"), 1.0);
    assert_eq!(requests(&s, "renew", "stale_token"), 1.0);
    assert_eq!(requests(&s, "any", "redirected"), 0.0);
    assert_eq!(value(&s, "ringlock_lock_handoffs_total"), 1.0);
    assert_eq!(value(&s, "ringlock_connections_opened_total"), 3.0);
    // ops/k held by b; ops/short expired and gone.
    assert_eq!(value(&s, "ringlock_locks"), 1.0);
    assert_eq!(value(&s, "ringlock_waiters"), 0.0);
    assert_eq!(value(&s, "ringlock_highest_token"), t3 as f64);
    // Three grants (two at once: 0 ms).
    assert_eq!(value(&s, "ringlock_wait_seconds_count"), 3.0);
    assert_eq!(value(&s, "ringlock_wait_seconds_bucket{le=\"0.0\"}"), 2.0);
    // One hold ended by a release (an expiry is not a hold time): at least
    // the 100 ms wait that timed out and the 20 ms sleep.
    assert_eq!(value(&s, "ringlock_hold_seconds_count"), 1.0);
    assert_eq!(value(&s, "ringlock_hold_seconds_bucket{le=\"0.0\"}"), 0.0);
    assert!(value(&s, "ringlock_hold_seconds_sum") >= 0.12, "{s:?}");
    assert!(value(&s, "ringlock_loop_turn_seconds_count") > 0.0);
    // The protocol error closed its connection.
    let s = poll_until(
        "the broken connection closed",
        WITHIN,
        || scrape(m),
        |s| s.get("ringlock_connections_open") == Some(&2.0),
    )
    .1;
    assert_eq!(value(&s, "ringlock_connections_refused_total"), 0.0);
    kinds_follow_a_scripted_session(&server, m);
    drop(server);
}

/// `ringlock_acquires_total{lock_kind,outcome}` of one kind.
fn acquires(samples: &HashMap<String, f64>, kind: &str) -> [f64; 5] {
    [
        "granted_at_once",
        "granted_after_wait",
        "timed_out",
        "refused",
        "withdrawn",
    ]
    .map(|o| {
        value(
            samples,
            &format!("ringlock_acquires_total{{lock_kind=\"{kind}\",outcome=\"{o}\"}}"),
        )
    })
}

/// The metrics by kind, after [`metrics_follow_a_scripted_session`]'s
/// exclusive session (2 at once, 1 after a wait, 1 timed out): shared
/// acquires and permits granted at once and after a wait, timing out,
/// refused for the key's kind, withdrawn; the grants held.
fn kinds_follow_a_scripted_session(server: &Server, m: SocketAddr) {
    let token = |answer: String, op: &str| -> u64 {
        let f: Vec<&str> = answer.split(' ').collect();
        assert_eq!((f.len(), f[0]), (3, op), "{answer}");
        f[2].parse().unwrap()
    };
    let conn = || server.connect();
    let (mut r1, mut r2, mut w, mut r3, mut r4) = (conn(), conn(), conn(), conn(), conn());
    let g1 = token(r1.call("G ops/r 30 0"), "G");
    let g2 = token(r2.call("G ops/r 30 0"), "G");
    w.line("A ops/r 30 0"); // waits for both readers
    assert!(w.call("S").starts_with("S active"));
    assert_eq!(r3.call("G ops/r 30 0.05"), "G ops/r 0"); // behind the writer
    r4.line("G ops/r 30 0"); // behind the writer, waits
    assert!(r4.call("S").starts_with("S active"));
    let (mut s1, mut s2, mut x) = (conn(), conn(), conn());
    token(s1.call("C ops/s 1 30 0"), "C");
    assert_eq!(s2.call("C ops/s 1 30 0.05"), "C ops/s 0");
    assert_eq!(s2.call("C ops/s 2 30 0"), "C ops/s semaphore 1");
    assert_eq!(s2.call("G ops/s 30 0"), "G ops/s semaphore 1");
    let s = poll_until(
        "two shared grants and a permit held",
        WITHIN,
        || scrape(m),
        // One published snapshot with both: the permit was granted after
        // the readers, so a snapshot taken between them has one and not
        // the other.
        |s| {
            s.get("ringlock_grants_held{lock_kind=\"shared\"}") == Some(&2.0)
                && s.get("ringlock_grants_held{lock_kind=\"semaphore\"}") == Some(&1.0)
        },
    )
    .1;
    assert_eq!(
        value(&s, "ringlock_grants_held{lock_kind=\"semaphore\"}"),
        1.0
    );
    x.line("C ops/s 1 30 0"); // waits, then its connection closes
    assert!(x.call("S").starts_with("S active"));
    drop(x);
    let mut e = conn();
    e.line("A ops/s 30 0");
    assert!(e.recv().starts_with("E key \"ops/s\" is a semaphore"));
    assert_eq!(r1.call(&format!("R ops/r {g1}")), "R ops/r 1");
    assert_eq!(r2.call(&format!("R ops/r {g2}")), "R ops/r 1");
    let a = common::Conn::token_of(&w.recv()); // the writer, after its wait
    assert_eq!(w.call(&format!("R ops/r {a}")), "R ops/r 1");
    token(r4.recv(), "G"); // the reader behind it
    let s = poll_until(
        "the kinds' counters",
        WITHIN,
        || scrape(m),
        |s| {
            s.get("ringlock_acquires_total{lock_kind=\"semaphore\",outcome=\"withdrawn\"}")
                == Some(&1.0)
                && s.get("ringlock_grants_held{lock_kind=\"shared\"}") == Some(&1.0)
                // The reader's grant behind the writer, the last event: a
                // snapshot between the readers' releases has one reader.
                && s.get("ringlock_requests_total{kind=\"acquire\",outcome=\"granted_after_wait\"}")
                    == Some(&3.0)
        },
    )
    .1;
    // granted at once, after a wait, timed out, refused, withdrawn
    assert_eq!(acquires(&s, "exclusive"), [2.0, 2.0, 1.0, 1.0, 0.0]);
    assert_eq!(acquires(&s, "shared"), [2.0, 1.0, 1.0, 1.0, 0.0]);
    assert_eq!(acquires(&s, "semaphore"), [1.0, 0.0, 1.0, 1.0, 1.0]);
    // Every kind in the acquire outcomes of `ringlock_requests_total`.
    assert_eq!(requests(&s, "acquire", "granted_at_once"), 5.0);
    assert_eq!(requests(&s, "acquire", "granted_after_wait"), 3.0);
    assert_eq!(requests(&s, "acquire", "timed_out"), 3.0);
    assert_eq!(requests(&s, "acquire", "withdrawn"), 1.0);
    assert_eq!(
        value(&s, "ringlock_grants_held{lock_kind=\"semaphore\"}"),
        1.0
    );
}

/// Hostile input to the metrics listener: a head that never ends, a head
/// that is too long, another method, an unknown path. Each is answered
/// and closed, and the listener serves others meanwhile.
fn the_metrics_listener_bounds_what_it_reads() {
    let (_server, log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        "epoll",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let m = metrics_addr(&log);
    // A client that sends half a head and waits: it holds one connection,
    // not the listener.
    let mut slow = TcpStream::connect(m).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    let (status, body) = get(m, "/health");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    // A head past the bound: 431, closed.
    let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    long.extend(std::iter::repeat_n(b'a', 20_000));
    let (status, _) = http(m, &long);
    assert_eq!(status, 431);
    assert_eq!(http(m, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(get(m, "/nothing").0, 404);
    assert_eq!(http(m, b"\xff\xfe\r\n\r\n").0, 400);
    // The slow one is answered 408 within the listener's 5 s deadline.
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut raw = Vec::new();
    slow.read_to_end(&mut raw).unwrap();
    assert!(
        String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 408"),
        "{raw:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(6));
    // Still serving.
    assert_eq!(get(m, "/ready").0, 200);
}

/// `/ready`: 503 for a standby that follows nobody, 200 once it is active,
/// 200 as a standby holding the active's snapshot after handing the role
/// back, and 200 again as the active after that active dies. The log of
/// the node says each role change, with its reason and an RFC 3339 time.
#[expect(clippy::too_many_lines)]
fn ready_follows_the_role_through_a_failover() {
    let mut c = Cluster::configure(2, "epoll", &["--metrics-listen", "127.0.0.1:0"]);
    // A long start-up grace: node 1, alone, waits 2 s before it takes over.
    c.peer_timeout_ms = 2000;
    let log1 = c.start_node_logged(1);
    let m1 = metrics_addr(&log1);
    let (status, body) = get(m1, "/ready");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready"), "{body}");
    poll_until(
        "node 1 ready as the active",
        WITHIN,
        || get(m1, "/ready"),
        |r| r.0 == 200,
    );
    assert_eq!(get(m1, "/ready").1, "ready: active\n");

    // Node 0 (higher priority) joins: it takes the role back once it holds
    // node 1's snapshot, and node 1 follows it with a full snapshot.
    let log0 = c.start_node_logged(0);
    let m0 = metrics_addr(&log0);
    c.wait_settled(0, WITHIN);
    poll_until(
        "node 1 ready as a synced standby",
        WITHIN,
        || get(m1, "/ready"),
        |r| r == &(200, "ready: standby, synced\n".to_string()),
    );
    // What the listener serves is at most 100 ms old.
    poll_until(
        "node 0 ready as the active",
        WITHIN,
        || get(m0, "/ready"),
        |r| r == &(200, "ready: active\n".to_string()),
    );
    let s1 = poll_until(
        "node 1's gauges",
        WITHIN,
        || scrape(m1),
        |s| s.get("ringlock_active") == Some(&0.0) && s.get("ringlock_peers_up") == Some(&1.0),
    )
    .1;
    assert_eq!(value(&s1, "ringlock_role_handoffs_total"), 1.0);
    assert_eq!(value(&s1, "ringlock_became_active_total"), 1.0);
    let s0 = scrape(m0);
    assert!(value(&s0, "ringlock_snapshots_sent_total") >= 1.0);
    // Only a healed split brain puts permits over a limit.
    assert_eq!(value(&s1, "ringlock_permits_over_limit_total"), 0.0);
    let follower = format!(
        "ringlock_replication_queued_bytes{{follower=\"{}\"}}",
        c.addr(1)
    );
    assert!(s0.contains_key(&follower), "{s0:#?}");
    // Grants replicate: the active counts what it sent node 1 and measures
    // its lag with probes behind the deltas (one at most every 10 ms).
    let mut client = common::Conn::new(c.addr(0).parse().unwrap());
    for _ in 0..20 {
        let token = common::Conn::token_of(&client.call("A ops/lag 30 0"));
        assert_eq!(client.call(&format!("R ops/lag {token}")), "R ops/lag 1");
    }
    let of = |name: &str| format!("{name}{{follower=\"{}\"}}", c.addr(1));
    let s0 = poll_until(
        "node 0's lag of node 1 measured",
        WITHIN,
        || scrape(m0),
        |s| {
            s.get(&of("ringlock_replication_lag_seconds_count"))
                .is_some_and(|&n| n >= 1.0)
        },
    )
    .1;
    assert!(value(&s0, &of("ringlock_replication_events_total")) >= 40.0);
    let writes = value(&s0, &of("ringlock_replication_writes_total"));
    assert!(writes >= 1.0, "{writes}");
    let bytes = value(&s0, &of("ringlock_replication_bytes_total"));
    assert!(bytes >= 40.0 * "P X ops/lag 1\n".len() as f64, "{bytes}");
    // On loopback, far below the peer timeout: no probe given up.
    let lag = value(&s0, &of("ringlock_replication_lag_seconds_sum"))
        / value(&s0, &of("ringlock_replication_lag_seconds_count"));
    assert!(lag < 0.5, "mean lag {lag} s");
    assert_eq!(
        value(&s0, &of("ringlock_replication_probes_lost_total")),
        0.0
    );

    // Node 0 dies: node 1 becomes active again.
    c.kill9(0);
    c.wait_settled(1, WITHIN);
    poll_until(
        "node 1 ready as the active again",
        WITHIN,
        || scrape(m1),
        |s| s.get("ringlock_active") == Some(&1.0),
    );
    assert_eq!(get(m1, "/ready"), (200, "ready: active\n".to_string()));
    let s1 = scrape(m1);
    assert_eq!(value(&s1, "ringlock_became_active_total"), 2.0);
    assert_eq!(value(&s1, "ringlock_stepped_down_total"), 1.0);
    assert_eq!(value(&s1, "ringlock_peers_up"), 0.0);

    // The log: every role change of node 1, with its reason, each line
    // starting with an RFC 3339 UTC time and a level by meaning: the
    // cluster's first election and the planned hand-back are INFO, the
    // failover after node 0 died is WARN.
    let text = log1.text();
    let changes: Vec<&str> = text.lines().filter(|l| l.contains("role: ")).collect();
    assert_eq!(changes.len(), 4, "{text}");
    for line in &changes {
        assert_rfc3339_start(line);
    }
    assert!(
        changes[0].contains("INFO ringlock::cluster: role: standby -> active (no node is active"),
        "{}",
        changes[0]
    );
    assert!(
        changes[1].contains(&format!(
            "INFO ringlock::cluster: role: active -> standby, following {} (hand-off to {})",
            c.addr(0),
            c.addr(0)
        )),
        "{}",
        changes[1]
    );
    let taken = log0.lines_with("role: standby -> active");
    assert_eq!(taken.len(), 1, "{}", log0.text());
    assert!(
        taken[0].contains(&format!(
            "INFO ringlock::cluster: role: standby -> active ({} handed the active role over)",
            c.addr(1)
        )),
        "{}",
        taken[0]
    );
    assert!(
        changes[2].contains(&format!(
            "role: standby, now following - ({} is down)",
            c.addr(0)
        )),
        "{}",
        changes[2]
    );
    assert!(
        changes[3].contains("WARN ringlock::cluster: role: standby -> active (no node is active"),
        "{}",
        changes[3]
    );
    assert!(
        text.contains(&format!("peer {} is down", c.addr(0))),
        "{text}"
    );
    assert!(text.contains(&format!(
        "holds a full snapshot of the active {}",
        c.addr(0)
    )));
}

/// `2026-12-01T01:40:50.463934Z  INFO ...`: a time in UTC with
/// microseconds, then the level.
fn assert_rfc3339_start(line: &str) {
    let (time, rest) = line.split_once(' ').unwrap_or_else(|| panic!("{line}"));
    let b = time.as_bytes();
    let shape = time.len() == 27
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[26] == b'Z'
        && time
            .char_indices()
            .all(|(i, c)| [4, 7, 10, 13, 16, 19, 26].contains(&i) || c.is_ascii_digit());
    assert!(shape, "not an RFC 3339 UTC time: {time:?} in {line:?}");
    let level = rest.trim_start().split(' ').next().unwrap();
    assert!(
        ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
        "{line}"
    );
}

/// `--log-format json`: every line is one JSON object with a timestamp, a
/// level, a target and the message; `RUST_LOG` filters.
fn json_logs_and_rust_log() {
    let (mut server, log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        "epoll",
        "--log-format",
        "json",
    ]);
    server.signal(libc::SIGTERM);
    server.wait_timeout(WITHIN).expect("stopped");
    log.wait_for("stopped (longest loop turn", WITHIN);
    let text = log.text();
    let mut messages = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let ts = v["timestamp"].as_str().expect("timestamp");
        assert_rfc3339_start(&format!("{ts} {}", v["level"].as_str().unwrap()));
        assert!(v["target"].as_str().unwrap().starts_with("ringlock::"));
        messages.push(v["fields"]["message"].as_str().unwrap().to_string());
    }
    assert!(
        messages[0].starts_with("listening on 127.0.0.1:"),
        "{messages:?}"
    );
    assert!(messages.iter().any(|m| m.starts_with("shutting down")));

    // RUST_LOG=warn: a clean start and stop say nothing.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["serve", "--listen", "127.0.0.1:0", "--io", "epoll"])
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// Runs `ringlock ARGS...` with a deadline; its status and stdout.
fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ringlock");
    let deadline = Instant::now() + WITHIN;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "ringlock {args:?} did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ringlock locks` lists holders (token, address, owner label, time held)
/// and queue lengths, filtered by prefix, across pages; `L` and `W`
/// answers are bounded and paged on the wire.
fn locks_lists_holders_and_queues(io: &str) {
    let server = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io]);
    let addr = server.addr.to_string();
    let mut a = server.connect();
    assert_eq!(a.call("O ops/owner-a"), "O ops/owner-a");
    let a_addr = a.stream().local_addr().unwrap().to_string();
    let ta = common::Conn::token_of(&a.call("A jobs/a 60 0"));
    let tb = common::Conn::token_of(&a.call("A jobs/b 60 0"));
    common::Conn::token_of(&a.call("A other 60 0"));
    // Two waiters on jobs/a, one on jobs/b, from another connection.
    let mut w = server.connect();
    w.line("A jobs/a 60 0");
    w.line("A jobs/a 60 0");
    w.line("A jobs/b 60 0");
    // 30 more keys, to page through.
    for i in 0..30 {
        common::Conn::token_of(&a.call(&format!("A many/{i:02} 60 0")));
    }
    // The waiters are queued once a later request on their connection is
    // answered (requests of one connection are handled in order).
    assert!(w.call("S").starts_with("S active"));

    let (code, out, err) = cli(&["locks", "--server", &addr, "--prefix", "jobs/"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let row = |key: &str| -> Vec<String> {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} in {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let ra = row("jobs/a");
    assert_eq!(ra[1], ta.to_string());
    assert_eq!(ra[4], "2", "{out}");
    let lease: f64 = ra[2].parse().unwrap();
    assert!(lease > 50.0 && lease <= 60.0, "{out}");
    // KEY TOKEN LEASE-LEFT s WAITING KIND HOLDERS HELD-FOR s HOLDER OWNER
    assert_eq!((ra[5].as_str(), ra[6].as_str()), ("exclusive", "1"));
    let held: f64 = ra[7].parse().unwrap();
    assert!((0.0..10.0).contains(&held), "{out}");
    assert_eq!(
        (ra[9].as_str(), ra[10].as_str()),
        (a_addr.as_str(), "ops/owner-a"),
        "{out}"
    );
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "KEY", "TOKEN", "LEASE", "LEFT", "WAITING", "KIND", "HOLDERS", "HELD", "FOR", "HOLDER",
            "OWNER"
        ]
    );
    let rb = row("jobs/b");
    assert_eq!(
        (rb[1].as_str(), rb[4].as_str()),
        (tb.to_string().as_str(), "1")
    );
    assert_eq!(lines[3], format!("2 locks on {addr}"));

    // Every key, three at a time: 33 locks, each once.
    let (code, out, _) = cli(&["locks", "--server", &addr, "--page", "3"]);
    assert_eq!(code, Some(0));
    let keys: std::collections::HashSet<&str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|k| !k.chars().next().unwrap().is_ascii_digit())
        .collect();
    assert_eq!(keys.len(), 33, "{out}");
    assert!(out.ends_with(&format!("33 locks on {addr}\n")), "{out}");
    // --max cuts it.
    let (_, out, _) = cli(&["locks", "--server", &addr, "--max", "5"]);
    assert!(
        out.ends_with(&format!("5 locks on {addr} (more not shown: --max)\n")),
        "{out}"
    );

    listing_on_the_wire(&server, &a_addr, &w, ta);
}

/// `ringlock locks` and `V` show each key's kind: an exclusive lock with
/// a waiter, a read lock of 3 readers with a writer waiting, a semaphore
/// of 4 with 2 permits held, and a full semaphore of 2 with 1 waiter; each
/// with its newest grant's token. `L` and `W` keep their forms.
fn locks_shows_each_kind(io: &str) {
    let server = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io]);
    let addr = server.addr.to_string();
    let mut conns = Vec::new();
    // A grant of `A`, `G` or `C`: `<op> <key> <token>`.
    let mut grant = |line: &str| {
        let mut c = server.connect();
        let answer = c.call(line);
        let f: Vec<&str> = answer.split(' ').collect();
        assert_eq!(
            (f.len(), f[0], f[1]),
            (3, &line[..1], line.split(' ').nth(1).unwrap())
        );
        conns.push(c);
        f[2].parse::<u64>().unwrap()
    };
    let x = grant("A kinds/x 60 0");
    let r: Vec<u64> = (0..3).map(|_| grant("G kinds/r 60 0")).collect();
    let s: Vec<u64> = (0..2).map(|_| grant("C kinds/s 4 60 0")).collect();
    let f: Vec<u64> = (0..2).map(|_| grant("C kinds/f 2 60 0")).collect();
    // Waiters, each on a connection of its own: queued once a later
    // request on it is answered.
    for line in ["A kinds/x 60 0", "A kinds/r 60 0", "C kinds/f 2 60 0"] {
        let mut c = server.connect();
        c.line(line);
        assert!(c.call("S").starts_with("S active"));
        conns.push(c);
    }
    let (code, out, err) = cli(&["locks", "--server", &addr, "--prefix", "kinds/"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let rows: HashMap<&str, Vec<&str>> = out
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.first()?, f))
        })
        .collect();
    // KEY TOKEN LEASE-LEFT s WAITING KIND HOLDERS ...
    let row = |key: &str| {
        let f = rows.get(key).unwrap_or_else(|| panic!("no {key} in {out}"));
        (f[1].parse::<u64>().unwrap(), f[4], f[5], f[6])
    };
    assert_eq!(row("kinds/x"), (x, "1", "exclusive", "1"), "{out}");
    assert_eq!(row("kinds/r"), (r[2], "1", "shared", "3"), "{out}");
    assert_eq!(row("kinds/s"), (s[1], "0", "semaphore", "2/4"), "{out}");
    assert_eq!(row("kinds/f"), (f[1], "1", "semaphore", "2/2"), "{out}");
    assert!(out.ends_with(&format!("4 locks on {addr}\n")), "{out}");
    assert!(!out.contains("not shown"), "{out}");

    // On the wire: ten fields after `K`, then `V 0`.
    let mut c = server.connect();
    c.line("V 0 10 kinds/");
    let mut lines: Vec<String> = (0..4).map(|_| c.recv()).collect();
    assert_eq!(c.recv(), "V 0");
    lines.sort();
    let tail = |l: &str| l.split(' ').skip(8).collect::<Vec<_>>().join(" ");
    let tails: Vec<String> = lines.iter().map(|l| tail(l)).collect();
    assert_eq!(
        tails,
        [
            "semaphore 2 2",
            "shared 0 3",
            "semaphore 4 2",
            "exclusive 0 1"
        ],
        "{lines:?}"
    );
    // `L` and `W` keep their forms beside it.
    c.line("L 0 10 kinds/r");
    let l = c.recv();
    let lf: Vec<&str> = l.split(' ').collect();
    assert_eq!(
        (lf.len(), lf[2], lf[4]),
        (5, &*r[2].to_string(), "1"),
        "{l}"
    );
    assert_eq!(c.recv(), "L 0");
    c.line("W 0 10 kinds/r");
    let w = c.recv();
    assert_eq!(w.split(' ').count(), 8, "{w}");
    assert!(lines[1].starts_with(&w.split(' ').take(3).collect::<Vec<_>>().join(" ")));
    assert_eq!(c.recv(), "W 0");
}

/// A server older than `V` (a stand-in that answers `S`, refuses `V` as
/// such a server does and answers `W`): `ringlock locks` lists with `W`
/// and says the kinds are not shown.
fn locks_says_when_kinds_are_not_shown() {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (served, stopped) = (addr.clone(), stop.clone());
    let old = std::thread::spawn(move || {
        let mut asked = Vec::new();
        let deadline = Instant::now() + WITHIN;
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
            let Ok((mut s, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(WITHIN)).unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let op = line.split(' ').next().unwrap_or("").trim().to_string();
            let answer = match op.as_str() {
                "S" => format!("S active {served} 7\n"),
                "W" => "K old/a 7 1500 0 300 127.0.0.1:5 -\nW 0\n".to_string(),
                _ => format!("E unknown op \"{op}\" in line 1\n"),
            };
            s.write_all(answer.as_bytes()).unwrap();
            asked.push(op);
        }
        asked
    });
    let (code, out, err) = cli(&["locks", "--server", &addr]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let asked = old.join().unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(asked, ["S", "V", "W"]);
    let lines: Vec<&str> = out.lines().collect();
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    // KEY TOKEN LEASE-LEFT s WAITING KIND HOLDERS HELD-FOR s HOLDER OWNER
    assert_eq!((row[0], row[1], row[5], row[6]), ("old/a", "7", "?", "?"));
    assert_eq!(row[9], "127.0.0.1:5");
    assert_eq!(
        lines[2..],
        [
            format!("kinds not shown: {addr} is older than the V request"),
            format!("1 locks on {addr}"),
        ]
    );
}

/// The listing on the wire: `L` and `W` pages, `Q` for one key.
fn listing_on_the_wire(server: &Server, a_addr: &str, w: &common::Conn, ta: u64) {
    // On the wire: a page of at most `limit` K lines, then `L cursor`.
    let mut c = server.connect();
    c.line("L 0 2 many/");
    let first = (c.recv(), c.recv());
    assert!(first.0.starts_with("K many/") && first.1.starts_with("K many/"));
    let end = c.recv();
    let cursor: u64 = end.strip_prefix("L ").unwrap().parse().unwrap();
    assert!(cursor > 0, "{end}");
    // `W` the same, each line with its holder, then `W cursor`.
    c.line("W 0 2 jobs/");
    let mut keys = Vec::new();
    for _ in 0..2 {
        let line = c.recv();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 8, "{line}");
        assert_eq!((f[0], f[6], f[7]), ("K", a_addr, "ops/owner-a"));
        keys.push(f[1].to_string());
    }
    keys.sort();
    assert_eq!(keys, ["jobs/a", "jobs/b"]);
    assert_eq!(c.recv(), "W 0");
    // `Q`: the holder, then the waiters oldest first, then the count.
    c.line("Q jobs/a");
    assert!(c.recv().starts_with(&format!("K jobs/a {ta} ")));
    let w_addr = w.stream().local_addr().unwrap().to_string();
    for _ in 0..2 {
        let line = c.recv();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!((f[0], f[2], f[3]), ("J", w_addr.as_str(), "-"), "{line}");
    }
    assert_eq!(c.recv(), "Q jobs/a 2");
    // A bad limit breaks the connection like any bad line.
    assert_eq!(
        c.call("L 0 1001"),
        "E bad limit \"1001\" (1 to 1000) in line 4"
    );
}

/// Errors in a node's last seconds are summed up before it stops (the
/// periodic summary would have come only 10 s later): one line, each count
/// once, in words.
fn errors_just_before_a_shutdown_are_summed_up() {
    let (mut server, log) = Server::start_logged(&["--listen", "127.0.0.1:0", "--io", "epoll"]);
    let mut bad = server.connect();
    let answer = bad.call("HELLO");
    assert!(answer.starts_with("E "), "{answer}");
    server.signal(libc::SIGTERM);
    let exit = server
        .wait_timeout(Duration::from_secs(10))
        .expect("stopped within 10 s of SIGTERM");
    assert_eq!(exit.code(), Some(0));
    log.wait_for("stopped (longest loop turn", WITHIN);
    let text = log.text();
    let summary = log.lines_with("broke the protocol");
    assert_eq!(summary.len(), 1, "{text}");
    let line = &summary[0];
    let words = line.split(" WARN ringlock::node: in the last ").nth(1);
    assert!(
        words
            .is_some_and(|w| w.ends_with(": 1 connection broke the protocol (answered E, closed)")),
        "{line}"
    );
    assert!(!summary[0].contains("="), "numbers once: {}", summary[0]);
    let at = |needle: &str| text.find(needle).unwrap();
    assert!(at("broke the protocol") < at("stopped (longest loop turn"));
}

/// `--listen` without a port says what it wants.
fn listen_without_a_port_asks_for_host_and_port() {
    for addr in ["0.0.0.0", "[::1]", "localhost", "127.0.0.1:"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args(["serve", "--listen", addr])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{addr}: {err}");
        assert!(
            err.contains(&format!(
                "bad --listen address {addr:?}: give HOST:PORT, e.g. 127.0.0.1:7171"
            )),
            "{addr}: {err}"
        );
    }
}

/// deploy/compose.yaml's three node commands (after `serve`), their
/// `--listen` and `--metrics-listen` addresses, checked against each other
/// and against deploy/prometheus/prometheus.yml's targets.
fn compose_nodes() -> (Vec<Vec<String>>, Vec<String>, Vec<String>) {
    let root = env!("CARGO_MANIFEST_DIR");
    let compose = std::fs::read_to_string(format!("{root}/deploy/compose.yaml")).unwrap();
    let commands: Vec<Vec<String>> = compose
        .lines()
        .filter_map(|l| l.trim().strip_prefix("command: [\"serve\""))
        .map(|rest| serde_json::from_str(&format!("[\"serve\"{rest}")).expect("a JSON array"))
        .collect();
    assert_eq!(commands.len(), 3, "three nodes in {compose}");
    let prometheus =
        std::fs::read_to_string(format!("{root}/deploy/prometheus/prometheus.yml")).unwrap();
    let targets: Vec<String> = prometheus
        .lines()
        .find_map(|l| l.trim().strip_prefix("- targets: "))
        .map(|t| serde_json::from_str(t).expect("a JSON list of targets"))
        .expect("a targets line");
    // Host networking: what each node listens on and advertises is an
    // address of the host, which Prometheus scrapes and clients dial.
    assert!(
        compose.lines().any(|l| l == "  network_mode: host"),
        "the nodes on the host's network"
    );
    let settings: Vec<&str> = compose.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        !settings
            .iter()
            .any(|l| l.contains("ports:") || l.contains("0.0.0.0")),
        "nothing published, nothing on every interface"
    );
    let flag = |command: &[String], name: &str| -> String {
        let at = command.iter().position(|a| a == name).expect(name) + 1;
        command[at].clone()
    };
    let metrics_of: Vec<String> = commands
        .iter()
        .map(|c| flag(c, "--metrics-listen"))
        .collect();
    assert_eq!(targets, metrics_of);
    let listens: Vec<String> = commands.iter().map(|c| flag(c, "--listen")).collect();
    for command in &commands {
        assert_eq!(flag(command, "--peers"), listens.join(","));
        assert!(!command.contains(&"--advertise".to_string()));
    }

    (commands, listens, metrics_of)
}

/// deploy/compose.yaml's layout, run as processes on loopback (where there
/// is no Docker daemon): each node's `command` line from the file, with
/// its host addresses mapped to free loopback ports and the secret to the
/// tests' one; a standby's `M` names the active by an address a client on
/// the host dials; then what Prometheus would see scraping the targets of
/// deploy/prometheus/prometheus.yml: exactly one active node, every node
/// ready and up, and the counters of a client's work on the active.
fn the_compose_layout_runs_as_processes() {
    let (commands, listens, metrics_of) = compose_nodes();
    // The compose addresses -> free loopback ports here.
    let addrs = common::free_addrs(common::loopback_ip(), 3);
    let map = |arg: &str| -> String {
        let mut arg = arg.to_string();
        for (i, a) in addrs.iter().enumerate() {
            arg = arg.replace(&listens[i], &a.to_string());
            arg = arg.replace(&metrics_of[i], "127.0.0.1:0");
        }
        arg.replace("/run/secrets/cluster_secret", common::secret_file())
    };
    let mut nodes = Vec::new();
    for command in &commands {
        let mut args: Vec<String> = command[1..].iter().map(|a| map(a)).collect();
        args.extend(["--io".to_string(), "epoll".to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (server, log) = Server::start_logged(&args);
        let metrics = metrics_addr(&log);
        nodes.push((server, metrics));
    }
    let scrape_all =
        || -> Vec<HashMap<String, f64>> { nodes.iter().map(|(_, m)| scrape(*m)).collect() };
    let settled = |all: &Vec<HashMap<String, f64>>| {
        let active: Vec<bool> = all
            .iter()
            .map(|s| s.get("ringlock_active") == Some(&1.0))
            .collect();
        active == [true, false, false]
            && all.iter().all(|s| {
                s.get("ringlock_ready") == Some(&1.0) && s.get("ringlock_peers_up") == Some(&2.0)
            })
    };
    poll_until(
        "the compose cluster settled on node1",
        WITHIN,
        scrape_all,
        settled,
    );
    // A client that dials a standby is told the active's address, and that
    // address answers it.
    let told = nodes[2].0.connect().call("A compose/told 30 0");
    assert_eq!(told, format!("M compose/told {}", addrs[0]));
    let mut client = common::Conn::new(addrs[0]);
    for i in 0..10 {
        let t = common::Conn::token_of(&client.call(&format!("A compose/{i} 30 0")));
        assert_eq!(
            client.call(&format!("R compose/{i} {t}")),
            format!("R compose/{i} 1")
        );
    }
    let all = poll_until("the work counted on node1", WITHIN, scrape_all, |all| {
        all[0].get("ringlock_requests_total{kind=\"release\",outcome=\"released\"}") == Some(&10.0)
    })
    .1;
    assert_eq!(requests(&all[0], "acquire", "granted_at_once"), 10.0);
    for s in &all[1..] {
        assert_eq!(requests(s, "acquire", "granted_at_once"), 0.0);
    }
}

/// deploy/ringlock.service as shipped runs a single node on loopback with
/// no other file: no credential to load, the default RINGLOCK_ARGS start a
/// node that listens on 127.0.0.1 (run here, with free ports);
/// `systemctl reload` sends SIGHUP. Both the unit alone and the unit with its drop-in pass
/// `systemd-analyze verify` (the binary path pointed at this build's). Needs
/// systemd-analyze ([`systemd_analyze`]).
fn the_systemd_unit_verifies() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
    let unit = read("deploy/ringlock.service");
    for line in [
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "LimitNOFILE=65536",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
        "EnvironmentFile=-/etc/ringlock/ringlock.env",
        "ExecStart=/usr/local/bin/ringlock serve $RINGLOCK_ARGS",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line:?} in the unit");
    }
    assert!(
        !unit.lines().any(|l| l.starts_with("LoadCredential")),
        "a single node must start without the cluster secret"
    );
    let default_args = unit
        .lines()
        .find_map(|l| l.strip_prefix("Environment=\"RINGLOCK_ARGS="))
        .and_then(|a| a.strip_suffix('"'))
        .expect("the unit's default RINGLOCK_ARGS");
    assert_eq!(
        default_args,
        "--listen 127.0.0.1:7171 --metrics-listen 127.0.0.1:9171"
    );
    let args: Vec<&str> = default_args
        .split(' ')
        .map(|a| {
            if a.starts_with("127.0.0.1:") {
                "127.0.0.1:0"
            } else {
                a
            }
        })
        .collect();
    let (server, _log) = Server::start_logged(&args);
    assert!(server.addr.ip().is_loopback(), "{}", server.addr);
    drop(server);

    let drop_in = read("deploy/ringlock.service.d/cluster.conf");
    let dir = std::env::temp_dir().join(format!("ringlock-unit-{}", std::process::id()));
    let verify = |with_drop_in: bool| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ringlock.service.d")).unwrap();
        let path = dir.join("ringlock.service");
        std::fs::write(
            &path,
            unit.replace("/usr/local/bin/ringlock", env!("CARGO_BIN_EXE_ringlock")),
        )
        .unwrap();
        if with_drop_in {
            std::fs::write(dir.join("ringlock.service.d/cluster.conf"), &drop_in).unwrap();
        }
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success() && err.trim().is_empty(),
            "with the drop-in: {with_drop_in}: {err}"
        );
    };
    verify(false);
    verify(true);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cluster's pieces of the systemd deployment fit together: the
/// drop-in loads the secret under the name that the cluster line of
/// deploy/ringlock.env reads it by, no address in them is every interface,
/// and every RINGLOCK_ARGS line there (the commented cluster one too) is a
/// command line `ringlock serve` accepts.
fn the_unit_drop_in_and_env_file_agree() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
    let unit = read("deploy/ringlock.service");
    let drop_in = read("deploy/ringlock.service.d/cluster.conf");
    let credential = "LoadCredential=cluster.secret:/etc/ringlock/cluster.secret";
    assert!(drop_in.lines().any(|l| l == credential), "{drop_in}");
    let env = read("deploy/ringlock.env");
    let cluster_line = env
        .lines()
        .find(|l| l.contains("RINGLOCK_ARGS=") && l.contains("--peers"))
        .expect("a cluster line in ringlock.env");
    assert!(
        cluster_line
            .contains("--cluster-secret-file /run/credentials/ringlock.service/cluster.secret"),
        "{cluster_line}"
    );
    assert!(!env.contains("0.0.0.0") && !unit.contains("0.0.0.0:"));
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        _args: ringlock::server::ServeArgs,
    }
    let lines: Vec<&str> = env
        .lines()
        .filter_map(|l| l.trim_start_matches('#').strip_prefix("RINGLOCK_ARGS="))
        .collect();
    assert_eq!(lines.len(), 2, "a single node and a cluster node");
    for args in lines {
        let argv = std::iter::once("serve").chain(args.split(' '));
        if let Err(e) = <Serve as clap::Parser>::try_parse_from(argv) {
            panic!("ringlock.env: {args}: {e}");
        }
    }
}

/// What can be checked of deploy/Dockerfile without a Docker daemon: it
/// installs the binary where the systemd unit and docs/operations.md
/// expect it, runs as the uid that compose.yaml and the docs tell the
/// operator to give the cluster secret to, and its build context
/// (deploy/Dockerfile.dockerignore) leaves out target/ and the secret.
fn the_dockerfile_agrees_with_the_unit_compose_and_docs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
    let docker = read("deploy/Dockerfile");
    let lines: Vec<&str> = docker.lines().filter(|l| !l.starts_with('#')).collect();
    let has = |l: &str| lines.contains(&l);
    let bin = "/usr/local/bin/ringlock";
    for line in [
        "    cargo build --release --locked --bin ringlock \\",
        "RUN --mount=type=cache,id=ringlock-cargo-registry,target=/usr/local/cargo/registry \\",
        "    --mount=type=cache,id=ringlock-target,target=/src/target \\",
        "COPY --from=build /out/ringlock /usr/local/bin/ringlock",
        "FROM gcr.io/distroless/cc-debian12:nonroot",
        "USER 65532:65532",
        "STOPSIGNAL SIGTERM",
        "EXPOSE 7171 9171",
        "ENTRYPOINT [\"/usr/local/bin/ringlock\"]",
        "CMD [\"serve\", \"--listen\", \"0.0.0.0:7171\", \"--metrics-listen\", \"0.0.0.0:9171\"]",
    ] {
        assert!(has(line), "no {line:?} in deploy/Dockerfile");
    }
    assert!(std::path::Path::new(&format!("{root}/Cargo.lock")).exists());
    assert!(
        read("deploy/ringlock.service")
            .lines()
            .any(|l| l.starts_with(&format!("ExecStart={bin} serve"))),
        "the unit runs another binary"
    );
    let ops = read("docs/operations.md");
    assert!(ops.contains(&format!("`{bin}`")), "docs: {bin}");
    let chown = "chown 65532:65532 deploy/cluster.secret";
    assert!(
        read("deploy/compose.yaml").contains(chown),
        "compose: {chown}"
    );
    assert!(ops.contains(chown), "docs: {chown}");
    let ignore = read("deploy/Dockerfile.dockerignore");
    let ignored: Vec<&str> = ignore.lines().filter(|l| !l.starts_with('#')).collect();
    for path in ["target", ".git", "deploy/cluster.secret"] {
        assert!(ignored.contains(&path), "{path} in the build context");
    }
}

/// The prerequisite of [`the_systemd_unit_verifies`].
fn systemd_analyze() -> Result<(), String> {
    match std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err("systemd-analyze is not installed (Debian: apt-get install systemd)".into()),
    }
}

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [
            both(),
            tests![
                locks_says_when_kinds_are_not_shown,
                the_metrics_listener_bounds_what_it_reads,
                ready_follows_the_role_through_a_failover,
                json_logs_and_rust_log,
                errors_just_before_a_shutdown_are_summed_up,
                listen_without_a_port_asks_for_host_and_port,
                the_compose_layout_runs_as_processes,
                the_systemd_unit_verifies if systemd_analyze,
                the_unit_drop_in_and_env_file_agree,
                the_dockerfile_agrees_with_the_unit_compose_and_docs,
            ],
        ],
    )
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        metrics_follow_a_scripted_session:
            metrics_follow_a_scripted_session_uring, metrics_follow_a_scripted_session_epoll;
        locks_lists_holders_and_queues:
            locks_lists_holders_and_queues_uring, locks_lists_holders_and_queues_epoll;
        locks_shows_each_kind:
            locks_shows_each_kind_uring, locks_shows_each_kind_epoll;
    }
}
