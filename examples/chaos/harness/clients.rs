//! Clients and status pollers, run on threads inside the client namespace.
//!
//! A client keeps one connection per node and talks the real protocol
//! (requests encoded with `ringlock_proto::Request`, answers parsed with
//! `ringlock_proto::parse_answer`), one request at a time, like the
//! official client in what matters here:
//!
//! - it sends to the node that last granted it (or that an `M` named),
//!   follows `M addr` at once, retries `M -` after 50 ms growing to 400 ms
//!   on the next node, and moves to the next node when a connection fails
//!   or an answer does not come within the wait plus 1 s (the connection is
//!   then closed, so no late answer can be taken for another request);
//! - one acquire in five starts on a random node, as a freshly started
//!   client would: that is what lets clients meet a second active in a
//!   split brain, as real clients do;
//! - a release (or renewal) is retried every 200 ms for 5 s.
//!
//! Every grant is recorded with the harness's monotonic clock: when the
//! acquire was sent (the last time, after any `M`), when the grant was
//! read, the lease, renewals and the release with its answer.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringlock_proto::{Answer, Request, Role, parse_answer};

use super::Rng;
use super::net;

/// Microseconds since `t0`.
pub fn us(t0: Instant) -> u64 {
    t0.elapsed().as_micros() as u64
}

#[derive(Debug, Clone)]
pub struct ClientCfg {
    pub id: usize,
    pub seed: u64,
    pub nodes: usize,
    pub keys: usize,
    pub lease_min_ms: u64,
    pub lease_max_ms: u64,
    pub wait_ms: u64,
    /// A probe: a fresh key for every acquire (never contended), a 50 ms
    /// wait, released at once, 10 ms apart. Its grants time failovers
    /// without waiting for a contended key to come free.
    pub probe: bool,
}

/// Key indexes from here on are a probe's (one grant each).
pub const PROBE_KEYS: usize = 1_000_000;

/// A release or renewal and how it went.
#[derive(Debug, Clone, Default)]
pub struct OpRec {
    /// First send, last send, answer (µs); `None`: no answer within 5 s.
    pub t_first: u64,
    pub t_sent: u64,
    pub t_recv: Option<u64>,
    /// The node that answered.
    pub node: Option<usize>,
    /// `R key 1` / `N key 1`: true; `0`: false.
    pub ok: Option<bool>,
    /// For a renewal: the new lease.
    pub lease_ms: u64,
}

#[derive(Debug, Clone)]
pub struct GrantRec {
    pub client: usize,
    pub key: usize,
    pub token: u64,
    pub node: usize,
    /// The acquire's last send, and the grant's arrival (µs).
    pub t_sent: u64,
    pub t_recv: u64,
    pub lease_ms: u64,
    pub renew: Option<OpRec>,
    pub release: Option<OpRec>,
}

impl GrantRec {
    /// The earliest moment the server may end the lease (from the last
    /// confirmed lease): the lease runs from the grant, which came after
    /// the send. A careful holder stops at this point at the latest.
    pub fn lease_end(&self) -> u64 {
        let first = self.t_sent + self.lease_ms * 1000;
        match &self.renew {
            Some(r) if r.ok == Some(true) => r.t_sent + r.lease_ms * 1000,
            _ => first,
        }
    }

    /// The interval in which the client counted itself the holder:
    /// from reading the grant to the earliest of the lease's end, the
    /// release's first send and a renewal answered `N key 0`.
    pub fn held(&self) -> (u64, u64) {
        let mut end = self.lease_end();
        if let Some(r) = &self.renew
            && r.ok == Some(false)
        {
            end = end.min(r.t_recv.unwrap_or(end));
        }
        if let Some(r) = &self.release {
            end = end.min(r.t_first);
        }
        (self.t_recv, end.max(self.t_recv))
    }
}

#[derive(Debug, Clone, Default)]
pub struct ClientStats {
    pub acquires: u64,
    pub granted: u64,
    pub timed_out: u64,
    pub moved: u64,
    pub moved_none: u64,
    pub conn_failures: u64,
    pub gave_up: u64,
    pub errors: Vec<String>,
}

struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// One connection per node, opened on demand.
struct Conns {
    addrs: Vec<SocketAddr>,
    links: Vec<Option<Link>>,
    /// No redial before this (after a failed dial).
    retry_at: Vec<Instant>,
}

impl Conns {
    fn new(nodes: usize) -> Conns {
        Conns {
            addrs: (0..nodes)
                .map(|i| net::node_addr(i).parse().expect("node address"))
                .collect(),
            links: (0..nodes).map(|_| None).collect(),
            retry_at: vec![Instant::now(); nodes],
        }
    }

    fn link(&mut self, i: usize, dial: Duration) -> Result<&mut Link, String> {
        if self.links[i].is_none() {
            if Instant::now() < self.retry_at[i] {
                return Err("redial later".into());
            }
            let stream = TcpStream::connect_timeout(&self.addrs[i], dial).map_err(|e| {
                self.retry_at[i] = Instant::now() + Duration::from_millis(200);
                format!("connect node {i}: {e}")
            })?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
            self.links[i] = Some(Link {
                reader,
                writer: stream,
            });
        }
        Ok(self.links[i].as_mut().expect("just made"))
    }

    /// Sends one request line to node `i` and reads one answer line within
    /// `timeout`. Any failure closes the connection.
    fn call(&mut self, i: usize, line: &[u8], timeout: Duration) -> Result<Vec<u8>, String> {
        let result = (|| {
            let link = self.link(i, Duration::from_millis(300))?;
            link.writer
                .set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            link.writer.write_all(line).map_err(|e| e.to_string())?;
            let mut answer = Vec::new();
            match link.reader.read_until(b'\n', &mut answer) {
                Ok(0) => Err("closed".to_string()),
                Ok(_) if answer.ends_with(b"\n") => {
                    answer.pop();
                    Ok(answer)
                }
                Ok(_) => Err("partial line".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })();
        if result.is_err() {
            self.links[i] = None;
        }
        result
    }
}

pub struct Client {
    cfg: ClientCfg,
    t0: Instant,
    stop: Arc<AtomicBool>,
    rng: Rng,
    conns: Conns,
    /// The node requests go to first.
    pref: Option<usize>,
    rr: usize,
    pub grants: Vec<GrantRec>,
    pub stats: ClientStats,
}

/// Runs one client in namespace `ns` until `stop`; returns its records.
pub fn run_client(
    ns: String,
    cfg: ClientCfg,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> (Vec<GrantRec>, ClientStats) {
    if let Err(e) = net::enter(&ns) {
        let stats = ClientStats {
            errors: vec![e],
            ..Default::default()
        };
        return (Vec::new(), stats);
    }
    let mut c = Client {
        rng: Rng::new(cfg.seed ^ (cfg.id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        conns: Conns::new(cfg.nodes),
        pref: None,
        rr: cfg.id % cfg.nodes,
        cfg,
        t0,
        stop,
        grants: Vec::new(),
        stats: ClientStats::default(),
    };
    let mut probes = 0;
    while !c.stopping() {
        if c.cfg.probe {
            probes += 1;
            if let Some(mut g) = c.acquire(PROBE_KEYS + probes) {
                g.release = Some(c.finish(&g, false, 0));
                c.grants.push(g);
            }
            c.sleep(Duration::from_millis(10));
            continue;
        }
        let key = c.rng.below(c.cfg.keys as u64) as usize;
        if let Some(g) = c.acquire(key) {
            c.hold(g);
        }
        let pause = c.rng.below(50);
        c.sleep(Duration::from_millis(pause));
    }
    (c.grants, c.stats)
}

pub fn key_name(key: usize) -> String {
    if key >= PROBE_KEYS {
        format!("chaos/probe/{}", key - PROBE_KEYS)
    } else {
        format!("chaos/k{key}")
    }
}

fn node_of(addr: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(addr).ok()?;
    let (ip, port) = s.rsplit_once(':')?;
    let last: usize = ip
        .strip_prefix(&format!("{}.", net::SUBNET))?
        .parse()
        .ok()?;
    (port == net::PORT.to_string() && last >= 10).then(|| last - 10)
}

impl Client {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        us(self.t0)
    }

    /// Sleeps `d`, in small steps so that a stop is seen.
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stopping() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(10)));
        }
    }

    fn next_node(&mut self, after: usize) -> usize {
        self.rr = (after + 1) % self.cfg.nodes;
        self.rr
    }

    #[expect(clippy::too_many_lines)]
    fn acquire(&mut self, key: usize) -> Option<GrantRec> {
        self.stats.acquires += 1;
        let name = key_name(key);
        let span = self.cfg.lease_max_ms - self.cfg.lease_min_ms;
        let lease_ms = self.cfg.lease_min_ms + self.rng.below(span + 1);
        let started = Instant::now();
        let wait = Duration::from_millis(if self.cfg.probe { 50 } else { self.cfg.wait_ms });
        let give_up = started + wait + Duration::from_secs(4);
        let n = self.cfg.nodes;
        let mut target = if self.rng.below(5) == 0 {
            self.rng.below(n as u64) as usize
        } else {
            self.pref.unwrap_or(self.rr)
        };
        let mut backoff = Duration::from_millis(50);
        let mut hops = 0u32;
        let mut failures = 0usize;
        loop {
            if self.stopping() || Instant::now() >= give_up {
                self.stats.gave_up += 1;
                return None;
            }
            let left = wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                self.stats.timed_out += 1;
                return None;
            }
            let wait_ms = (left.as_millis() as u64).max(1);
            let mut line = Vec::new();
            Request::Acquire {
                key: name.as_bytes(),
                lease_ms,
                wait_ms,
            }
            .encode(&mut line);
            let t_sent = self.now();
            let answer = self
                .conns
                .call(target, &line, left + Duration::from_secs(1));
            let t_recv = self.now();
            let answer = match answer {
                Ok(a) => a,
                Err(_) => {
                    // On to the next node at once; a pause only after a
                    // whole round of failures.
                    self.stats.conn_failures += 1;
                    self.pref = None;
                    target = self.next_node(target);
                    failures += 1;
                    if failures.is_multiple_of(n) {
                        self.sleep(Duration::from_millis(50));
                    }
                    continue;
                }
            };
            match parse_answer(&answer) {
                Ok(Answer::Granted { key: k, token }) if k == name.as_bytes() => {
                    self.stats.granted += 1;
                    self.pref = Some(target);
                    let g = GrantRec {
                        client: self.cfg.id,
                        key,
                        token,
                        node: target,
                        t_sent,
                        t_recv,
                        lease_ms,
                        renew: None,
                        release: None,
                    };
                    return Some(g);
                }
                Ok(Answer::TimedOut { key: k }) if k == name.as_bytes() => {
                    self.stats.timed_out += 1;
                    return None;
                }
                Ok(Answer::Moved { key: k, addr }) if k == name.as_bytes() => {
                    match addr.and_then(node_of) {
                        Some(j) if j != target && hops < 4 => {
                            self.stats.moved += 1;
                            hops += 1;
                            self.pref = Some(j);
                            target = j;
                        }
                        _ => {
                            self.stats.moved_none += 1;
                            hops = 0;
                            self.pref = None;
                            self.sleep(backoff);
                            backoff = (backoff * 2).min(Duration::from_millis(400));
                            target = self.next_node(target);
                        }
                    }
                }
                _ => {
                    let shown = String::from_utf8_lossy(&answer).into_owned();
                    self.stats
                        .errors
                        .push(format!("node {target} answered {shown:?} to an acquire"));
                    self.conns.links[target] = None;
                    target = self.next_node(target);
                }
            }
        }
    }

    /// Holds the grant a while: releases it (3 in 5), renews it once and
    /// then releases it (1 in 5), or lets it run out (1 in 5).
    fn hold(&mut self, mut g: GrantRec) {
        let plan = self.rng.below(5);
        let lease = g.lease_ms;
        if plan == 4 {
            // Let it run out; stop counting at the lease's end.
            let end = g.lease_end() + 20_000;
            let now = self.now();
            self.sleep(Duration::from_micros(end.saturating_sub(now)));
            self.grants.push(g);
            return;
        }
        if plan == 3 {
            self.sleep(Duration::from_millis(lease / 2));
            let span = self.cfg.lease_max_ms - self.cfg.lease_min_ms;
            let lease2 = self.cfg.lease_min_ms + self.rng.below(span + 1);
            let mut r = self.finish(&g, true, lease2);
            r.lease_ms = lease2;
            let ok = r.ok;
            g.renew = Some(r);
            if ok == Some(true) {
                let hold = 20 + self.rng.below(lease2 * 8 / 10);
                self.sleep(Duration::from_millis(hold));
            }
        } else {
            let hold = 20 + self.rng.below(lease * 8 / 10);
            self.sleep(Duration::from_millis(hold));
        }
        let r = self.finish(&g, false, 0);
        g.release = Some(r);
        self.grants.push(g);
    }

    /// Sends `R` (or `N` with `lease_ms`) for `g`, following `M`, retrying
    /// every 200 ms for 5 s.
    fn finish(&mut self, g: &GrantRec, renew: bool, lease_ms: u64) -> OpRec {
        let name = key_name(g.key);
        let mut line = Vec::new();
        if renew {
            Request::Renew {
                key: name.as_bytes(),
                token: g.token,
                lease_ms,
            }
            .encode(&mut line);
        } else {
            Request::Release {
                key: name.as_bytes(),
                token: g.token,
            }
            .encode(&mut line);
        }
        let mut rec = OpRec {
            t_first: self.now(),
            ..Default::default()
        };
        let started = Instant::now();
        let mut target = self.pref.unwrap_or(g.node);
        let mut hops = 0u32;
        while started.elapsed() < Duration::from_secs(5) {
            rec.t_sent = self.now();
            let answer = match self.conns.call(target, &line, Duration::from_millis(1500)) {
                Ok(a) => a,
                Err(_) => {
                    self.stats.conn_failures += 1;
                    target = self.next_node(target);
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            let t_recv = self.now();
            let ok = match parse_answer(&answer) {
                Ok(Answer::Released { key, ok }) if !renew && key == name.as_bytes() => ok,
                Ok(Answer::Renewed { key, ok }) if renew && key == name.as_bytes() => ok,
                Ok(Answer::Moved { key, addr }) if key == name.as_bytes() => {
                    match addr.and_then(node_of) {
                        Some(j) if j != target && hops < 4 => {
                            hops += 1;
                            self.pref = Some(j);
                            target = j;
                        }
                        _ => {
                            hops = 0;
                            std::thread::sleep(Duration::from_millis(200));
                            target = self.next_node(target);
                        }
                    }
                    continue;
                }
                _ => {
                    let shown = String::from_utf8_lossy(&answer).into_owned();
                    self.stats
                        .errors
                        .push(format!("node {target} answered {shown:?} to {line:?}"));
                    self.conns.links[target] = None;
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            rec.t_recv = Some(t_recv);
            rec.node = Some(target);
            rec.ok = Some(ok);
            return rec;
        }
        rec
    }
}

/// One answer to `S` (or none).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub node: usize,
    /// When the answer came, or when the poll failed (µs).
    pub t: u64,
    /// `(active, the node it names, highest token)`; `None`: no answer.
    pub status: Option<(bool, Option<usize>, u64)>,
}

/// Polls `S` on node `i` every `period` until `stop`, from namespace `ns`.
pub fn run_poller(
    ns: String,
    i: usize,
    period: Duration,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    if net::enter(&ns).is_err() {
        return Vec::new();
    }
    let addr: SocketAddr = net::node_addr(i).parse().expect("node address");
    let mut link: Option<Link> = None;
    let mut samples = Vec::new();
    let timeout = Duration::from_millis(150);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let status = (|| -> Option<(bool, Option<usize>, u64)> {
            if link.is_none() {
                let s = TcpStream::connect_timeout(&addr, timeout).ok()?;
                s.set_nodelay(true).ok()?;
                s.set_read_timeout(Some(timeout)).ok()?;
                link = Some(Link {
                    reader: BufReader::new(s.try_clone().ok()?),
                    writer: s,
                });
            }
            let l = link.as_mut()?;
            l.writer.write_all(b"S\n").ok()?;
            let mut answer = Vec::new();
            l.reader.read_until(b'\n', &mut answer).ok()?;
            if answer.pop() != Some(b'\n') {
                return None;
            }
            match parse_answer(&answer).ok()? {
                Answer::Status { role, addr, token } => {
                    Some((role == Role::Active, addr.and_then(node_of), token))
                }
                _ => None,
            }
        })();
        if status.is_none() {
            link = None;
        }
        samples.push(Sample {
            node: i,
            t: us(t0),
            status,
        });
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    samples
}
