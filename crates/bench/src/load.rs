//! The closed-loop load generator.
//!
//! Each connection carries `--pipeline` *slots*; a slot runs one cycle at a
//! time (acquire, then release with the token it got, then the next acquire)
//! and starts its next request as soon as the answer to the previous one is
//! read: a closed loop, so latencies are those of requests actually in
//! flight.
//!
//! One thread (by default) runs all connections on one non-blocking
//! edge-triggered epoll loop (mio): per turn it reads every readable socket,
//! handles every whole answer, and writes each connection's new requests
//! with one `write`. A thread per connection would add a context switch per
//! answer on the generator's core, which at 50 connections costs more than
//! the server's own work and would be charged to every target alike. Send
//! times are taken just before the `write`, receive times just after the
//! `epoll_wait` that reported the answer.
//!
//! Targets:
//! - `ringlock`: `A <key> <lease> 0`, then `R <key> <token>`. Answers are
//!   matched by op and key, as docs/protocol.md says.
//! - `redis`: `SET <key> <token> NX PX <lease ms>`, then `EVALSHA` of the
//!   compare-and-delete script (loaded with `SCRIPT LOAD` at start). Redis
//!   has no queue: a `SET NX` that finds the key held gets nil, and the slot
//!   sends the same `SET NX` again at once (one request in flight per slot,
//!   so retries are paced by round trips, not by a timer). The acquire
//!   latency runs from the first attempt to the successful one.
//! - `echo`: the same two lines (byte for byte the size of ringlock's
//!   requests) bounced by `ringlock-bench echo-server`: two round trips per
//!   cycle, and nothing else. The loopback floor.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::pace::Pacer;
use crate::proc;
use crate::replication::{self, Scrape};
use crate::stats::{CpuUse, Fairness, Hists, Memory, RunResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Target {
    Ringlock,
    Redis,
    Echo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Disjoint keys per connection: nobody waits.
    Uncontended,
    /// All connections share `--keys` keys: waiters queue (ringlock) or
    /// retry (redis), and hand-off latency is measured.
    Contended,
    /// Hold `--locks` locks (pipelined acquires, long lease, no release) and
    /// report the server's RSS (needs `--server-pid`).
    Memory,
    /// Like memory, while one more connection runs acquire/release cycles
    /// on its own key: the latency a client sees while the table grows
    /// (see grow.rs; `--stop-server-log` for the server's longest turn).
    Grow,
}

/// What each acquire asks for (ringlock only): an exclusive lock (`A`), a
/// shared one (`G`), or a permit of a semaphore (`C`, `--permits`). Each
/// is released with `R` and its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Acquire {
    Exclusive,
    Shared,
    Semaphore,
}

/// Load generator options (the default command).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    /// What to load.
    #[arg(long, value_enum, default_value_t = Target::Ringlock)]
    pub target: Target,
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:7171")]
    pub addr: String,
    /// Connections (clients).
    #[arg(long, default_value_t = 1)]
    pub conns: u32,
    /// Cycles in flight per connection (memory mode: acquires in flight).
    #[arg(long, default_value_t = 1)]
    pub pipeline: u32,
    /// Uncontended: keys per connection (default and minimum: --pipeline),
    /// used in turn. Contended: keys shared by all connections (default 1).
    #[arg(long)]
    pub keys: Option<u32>,
    #[arg(long, value_enum, default_value_t = Mode::Uncontended)]
    pub mode: Mode,
    /// What each acquire asks for (uncontended and contended modes).
    #[arg(long, value_enum, default_value_t = Acquire::Exclusive)]
    pub acquire: Acquire,
    /// `--acquire semaphore`: the semaphore's limit (1 to 65536).
    #[arg(long, default_value_t = 8)]
    pub permits: u32,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Seconds measured (memory mode: the time limit).
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Lease of each acquire, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub lease: f64,
    /// Generator threads; connections are split among them.
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Busy-poll this many microseconds (zero-timeout polls) before each
    /// sleeping wait: a client that trades a core for latency. With it,
    /// ping-pong shows what a server's own wake-up costs, since the
    /// client's is gone.
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
    /// Cycles per second in all, started at that pace (each slot every
    /// slots/rate seconds; see pace.rs) instead of as fast as answers come
    /// back: for comparing two servers at the same load. Uncontended and
    /// contended modes.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: Option<u64>,
    /// The server's pid: its CPU time per cycle (and RSS in memory mode) is
    /// read from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Cluster rows: a follower's pid (a standby, a replica; repeat the
    /// option for each): its CPU per cycle is read from /proc like the
    /// server's.
    #[arg(long = "follower-pid", value_name = "PID")]
    pub follower_pids: Vec<u32>,
    /// Cluster rows: the active's `--metrics-listen` address. Its
    /// replication lag histogram and counters per follower are read just
    /// before the measured window and after it, and their difference
    /// reported.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Print the result as one line of JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Memory and grow modes: locks to hold.
    #[arg(long, default_value_t = 1_000_000)]
    pub locks: u64,
    /// Memory and grow modes: key length in bytes.
    #[arg(long, default_value_t = 16)]
    pub key_len: usize,
    /// Grow mode: when the fill is done, send the server (`--server-pid`)
    /// SIGTERM and read its longest loop turn from this file, its stderr.
    #[arg(long)]
    pub stop_server_log: Option<std::path::PathBuf>,
    /// Copied into the result, for reports.
    #[arg(long, default_value = "")]
    pub label: String,
    #[arg(long, default_value = "")]
    pub scenario: String,
    #[arg(long, default_value_t = 0)]
    pub round: u32,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Speak TLS, trusting the server certificates this CA (PEM) signed;
    /// each connection's handshake is done before the clock starts.
    #[arg(long, value_name = "PATH")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// TLS: the name the server's certificate must carry.
    #[arg(long, default_value = "localhost")]
    pub tls_server_name: String,
}

/// How long the end of a run may take to release what is held.
const DRAIN_NS: u64 = 3_000_000_000;
/// Receive buffer per connection.
const RBUF: usize = 64 * 1024;

/// What every worker reads (set before they start) and reports into.
struct Shared {
    base: Instant,
    warm_end: u64,
    end: u64,
    /// Cycles (or memory-mode grants) completed, for the progress line.
    progress: AtomicU64,
    /// Per shared key (contended): when its last release was sent, ns since
    /// `base` (0: none pending).
    last_release: Vec<AtomicU64>,
    failed: AtomicBool,
    fatal: Mutex<Option<String>>,
}

impl Shared {
    #[inline]
    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn fail(&self, msg: String) {
        let mut fatal = self.fatal.lock().unwrap();
        if fatal.is_none() {
            *fatal = Some(msg);
        }
        self.failed.store(true, Ordering::Relaxed);
    }
}

/// The fixed parts of every request line.
struct Wire {
    target: Target,
    /// Every key starts with it: unique per run, so that a grant left over by
    /// an earlier run cannot block this one.
    prefix: Vec<u8>,
    /// Digits of every key (memory mode: zero-padded to the key length).
    pad: usize,
    lease_ms: u64,
    sha: Vec<u8>,
    acquire: Acquire,
    permits: u32,
}

impl Wire {
    fn key(&self, out: &mut Vec<u8>, idx: u64) {
        out.extend_from_slice(&self.prefix);
        let mut digits = Vec::with_capacity(20);
        ringlock_proto::write_u64(&mut digits, idx);
        out.extend(std::iter::repeat_n(
            b'0',
            self.pad.saturating_sub(digits.len()),
        ));
        out.extend_from_slice(&digits);
    }

    fn key_len(&self, idx: u64) -> usize {
        let mut n = 1;
        let mut v = idx;
        while v >= 10 {
            v /= 10;
            n += 1;
        }
        self.prefix.len() + n.max(self.pad)
    }

    /// The key's index, if `key` is one of ours.
    fn parse_key(&self, key: &[u8]) -> Option<u64> {
        let digits = key.strip_prefix(&self.prefix[..])?;
        parse_u64(digits)
    }

    fn acquire(&self, out: &mut Vec<u8>, idx: u64, token: u64) {
        match self.target {
            Target::Ringlock | Target::Echo => {
                out.push(self.acquire_op());
                out.push(b' ');
                self.key(out, idx);
                out.push(b' ');
                if self.acquire == Acquire::Semaphore {
                    ringlock_proto::write_u64(out, u64::from(self.permits));
                    out.push(b' ');
                }
                ringlock_proto::write_seconds(out, self.lease_ms);
                out.extend_from_slice(b" 0\n");
            }
            Target::Redis => {
                out.extend_from_slice(b"*6\r\n$3\r\nSET\r\n");
                bulk_len(out, self.key_len(idx));
                self.key(out, idx);
                out.extend_from_slice(b"\r\n");
                let mut tok = Vec::with_capacity(20);
                ringlock_proto::write_u64(&mut tok, token);
                bulk(out, &tok);
                out.extend_from_slice(b"$2\r\nNX\r\n$2\r\nPX\r\n");
                let mut ms = Vec::with_capacity(20);
                ringlock_proto::write_u64(&mut ms, self.lease_ms);
                bulk(out, &ms);
            }
        }
    }

    /// The op of the acquires, and of their grants.
    fn acquire_op(&self) -> u8 {
        match self.acquire {
            Acquire::Exclusive => b'A',
            Acquire::Shared => b'G',
            Acquire::Semaphore => b'C',
        }
    }

    fn release(&self, out: &mut Vec<u8>, idx: u64, token: u64) {
        match self.target {
            Target::Ringlock | Target::Echo => {
                out.extend_from_slice(b"R ");
                self.key(out, idx);
                out.push(b' ');
                ringlock_proto::write_u64(out, token);
                out.push(b'\n');
            }
            Target::Redis => {
                out.extend_from_slice(b"*5\r\n$7\r\nEVALSHA\r\n");
                bulk(out, &self.sha);
                out.extend_from_slice(b"$1\r\n1\r\n");
                bulk_len(out, self.key_len(idx));
                self.key(out, idx);
                out.extend_from_slice(b"\r\n");
                let mut tok = Vec::with_capacity(20);
                ringlock_proto::write_u64(&mut tok, token);
                bulk(out, &tok);
            }
        }
    }
}

fn bulk_len(out: &mut Vec<u8>, len: usize) {
    out.push(b'$');
    ringlock_proto::write_u64(out, len as u64);
    out.extend_from_slice(b"\r\n");
}

fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    bulk_len(out, bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(v)
}

/// The Redis compare-and-delete release: deletes the key only if it still
/// holds this client's token.
pub(crate) const REDIS_RELEASE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then \
     return redis.call(\"del\",KEYS[1]) else return 0 end";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Idle,
    Acquiring,
    Releasing,
}

struct Slot {
    conn: u32,
    st: St,
    /// The key of the current cycle.
    key: u64,
    /// Cycles this slot started (uncontended key rotation).
    turn: u64,
    token: u64,
    /// Order of the request in flight on its connection (matching).
    seq: u64,
    /// When the request in flight was sent (last attempt).
    sent: u64,
    /// When the current acquire was first sent: cycle and acquire start.
    first: u64,
    /// The request in flight has not been stamped with its send time yet.
    unsent: bool,
    /// `SET NX` attempts of the current acquire (Redis).
    attempts: u64,
    grants: u64,
}

struct Conn {
    stream: TcpStream,
    /// TLS (`--tls-ca`): requests are encrypted on their way out, answers
    /// decrypted into `rbuf`.
    tls: Option<rustls::ClientConnection>,
    /// Receive buffer: `rbuf[..rlen]` holds unprocessed bytes.
    rbuf: Box<[u8]>,
    rlen: usize,
    out: Vec<u8>,
    out_pos: usize,
    /// Slots whose request is in `out` but not yet stamped.
    unstamped: Vec<u32>,
    /// Redis, echo and memory mode: slots in the order their requests were
    /// sent (those answers come in order).
    fifo: VecDeque<u32>,
    /// ringlock, contended: the slots of each key, to match answers by key.
    by_key: HashMap<u64, Vec<u32>>,
    seq: u64,
    /// Uncontended: the first key of this connection's range.
    key_base: u64,
    /// Memory mode: the next key to acquire, and the end of the range.
    mem_next: u64,
    mem_end: u64,
}

/// Derived from the arguments, the same for every worker.
struct Plan {
    target: Target,
    mode: Mode,
    pipeline: u32,
    /// Uncontended: keys per connection; contended: keys in all.
    keys: u64,
    record_round_trip_acquire: bool,
    /// `--spin-us`.
    spin: Duration,
    /// `--rate`, and every thread's slots: cycles start paced
    /// ([`crate::pace`]).
    rate: Option<(u64, u64)>,
}

struct Worker<'a> {
    shared: &'a Shared,
    plan: &'a Plan,
    wire: &'a Wire,
    poll: Poll,
    conns: Vec<Conn>,
    slots: Vec<Slot>,
    hists: Hists,
    cycles: u64,
    grants: u64,
    attempts: u64,
    errors: u64,
    progress: u64,
    draining: bool,
    token_seq: u64,
    dirty: Vec<u32>,
    memory_done_at: Option<u64>,
    memory_granted: u64,
    /// `--rate`: when each slot starts its next cycle.
    pacer: Option<Pacer>,
}

/// What a worker hands back.
struct WorkerResult {
    hists: Hists,
    cycles: u64,
    grants: u64,
    attempts: u64,
    errors: u64,
    slot_grants: Vec<u64>,
    drained: bool,
    memory_done_at: Option<u64>,
    memory_granted: u64,
}

impl<'a> Worker<'a> {
    fn run(mut self) -> WorkerResult {
        let mut events = Events::with_capacity(1024);
        match self.plan.rate {
            Some((rate, all_slots)) => {
                let slots = self.slots.len() as u32;
                self.pacer = Some(Pacer::new(rate, slots, all_slots, self.shared.now()));
            }
            None => {
                for i in 0..self.slots.len() as u32 {
                    self.start_acquire(i);
                }
            }
        }
        self.flush_all();
        loop {
            let now = self.shared.now();
            if self.shared.failed.load(Ordering::Relaxed) {
                break;
            }
            self.start_due(now);
            if self.plan.mode != Mode::Memory && !self.draining && now >= self.shared.end {
                self.draining = true;
            }
            if self.idle() {
                break;
            }
            let limit = if self.draining || self.plan.mode == Mode::Memory {
                self.shared.end + DRAIN_NS
            } else {
                self.shared.end
            };
            if now >= limit {
                break;
            }
            let next_start = self.pacer.as_ref().and_then(Pacer::next_start);
            let until = next_start.map_or(limit, |at| at.clamp(now, limit));
            let timeout = Duration::from_nanos((until - now).min(100_000_000));
            if let Err(e) = ringlock::io::epoll::wait(
                &mut self.poll,
                &mut events,
                Some(timeout),
                self.plan.spin,
            ) && e.kind() != io::ErrorKind::Interrupted
            {
                self.shared.fail(format!("epoll: {e}"));
                break;
            }
            let t = self.shared.now();
            for event in events.iter() {
                let c = event.token().0 as u32;
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    self.read(c, t);
                }
                if event.is_writable()
                    && self.conns[c as usize].out_pos < self.conns[c as usize].out.len()
                {
                    self.dirty.push(c);
                }
            }
            self.flush_all();
            self.shared
                .progress
                .fetch_add(self.progress, Ordering::Relaxed);
            self.progress = 0;
        }
        let drained = self.idle();
        WorkerResult {
            slot_grants: self.slots.iter().map(|s| s.grants).collect(),
            hists: self.hists,
            cycles: self.cycles,
            grants: self.grants,
            attempts: self.attempts,
            errors: self.errors,
            drained,
            memory_done_at: self.memory_done_at,
            memory_granted: self.memory_granted,
        }
    }

    /// `--rate`: starts the cycles due by `now` (none once draining) and
    /// sends them.
    fn start_due(&mut self, now: u64) {
        let mut started = false;
        while let Some(s) = self.pacer.as_mut().and_then(|p| p.pop_due(now)) {
            if !self.draining {
                self.start_acquire(s);
                started = true;
            }
        }
        if started {
            self.flush_all();
        }
    }

    fn idle(&self) -> bool {
        (self.draining || self.plan.mode == Mode::Memory)
            && self.slots.iter().all(|s| s.st == St::Idle)
    }

    #[inline]
    fn in_window(&self, t: u64) -> bool {
        t >= self.shared.warm_end && t < self.shared.end
    }

    /// Reads what `c` has and handles every whole answer.
    fn read(&mut self, c: u32, t: u64) {
        loop {
            let conn = &mut self.conns[c as usize];
            let room = conn.rbuf.len() - conn.rlen;
            if room == 0 {
                self.shared.fail("an answer longer than 64 KiB".into());
                return;
            }
            let n = match conn_read(&mut conn.stream, &mut conn.tls, &mut conn.rbuf[conn.rlen..]) {
                Ok(0) => {
                    if !self.draining || !self.idle() {
                        self.shared
                            .fail(format!("connection {c} closed by the server"));
                    }
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.shared.fail(format!("connection {c}: {e}"));
                    return;
                }
            };
            conn.rlen += n;
            self.answers(c, t);
            // A short read emptied the socket: the next byte brings a new
            // edge, so the read that would say WouldBlock is saved.
            if n < room {
                return;
            }
        }
    }

    fn answers(&mut self, c: u32, t: u64) {
        let mut rbuf = std::mem::take(&mut self.conns[c as usize].rbuf);
        let rlen = self.conns[c as usize].rlen;
        let mut pos = 0;
        while let Some(nl) = memchr::memchr(b'\n', &rbuf[pos..rlen]) {
            let line = &rbuf[pos..pos + nl];
            pos += nl + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Err(msg) = self.answer(c, line, t) {
                self.shared.fail(msg);
                break;
            }
        }
        rbuf.copy_within(pos..rlen, 0);
        let conn = &mut self.conns[c as usize];
        conn.rlen = rlen - pos;
        conn.rbuf = rbuf;
    }

    /// One answer line (without its end).
    fn answer(&mut self, c: u32, line: &[u8], t: u64) -> Result<(), String> {
        let shown = || String::from_utf8_lossy(line).into_owned();
        match self.plan.target {
            Target::Ringlock if self.plan.mode != Mode::Memory => {
                let mut fields = line.split(|&b| b == b' ');
                let op = fields.next().unwrap_or_default();
                let key = fields.next().unwrap_or_default();
                let arg = fields.next().unwrap_or_default();
                let idx = self
                    .wire
                    .parse_key(key)
                    .ok_or_else(|| format!("unexpected answer {:?}", shown()))?;
                match op {
                    // A grant of the kind asked for (a `G` or `C` refused
                    // for the key's kind has no token here: an error).
                    [op] if *op == self.wire.acquire_op() => {
                        let token = parse_u64(arg)
                            .filter(|&t| t > 0)
                            .ok_or_else(|| format!("bad token in {:?}", shown()))?;
                        let s = self
                            .find(c, idx, St::Acquiring)
                            .ok_or_else(|| format!("unasked grant {:?}", shown()))?;
                        self.granted(s, token, t);
                    }
                    b"R" => {
                        let s = self
                            .find(c, idx, St::Releasing)
                            .ok_or_else(|| format!("unasked release answer {:?}", shown()))?;
                        self.released(s, arg == b"1", t);
                    }
                    _ => return Err(format!("unexpected answer {:?}", shown())),
                }
            }
            Target::Ringlock => {
                // Memory mode: nothing waits, so answers come in order.
                let s = self.conns[c as usize]
                    .fifo
                    .pop_front()
                    .ok_or("answer to nothing")?;
                if !line.starts_with(b"A ") {
                    return Err(format!("unexpected answer {:?}", shown()));
                }
                self.granted(s, 0, t);
            }
            Target::Redis => {
                let Some(&first) = line.first() else {
                    return Ok(()); // the empty line after a bulk's data
                };
                if first == b'$' && line != b"$-1" {
                    return Err(format!("unexpected bulk reply {:?}", shown()));
                }
                let s = self.conns[c as usize]
                    .fifo
                    .pop_front()
                    .ok_or("answer to nothing")?;
                let st = self.slots[s as usize].st;
                match (st, line) {
                    (St::Acquiring, b"+OK") => {
                        let token = self.slots[s as usize].token;
                        self.granted(s, token, t);
                    }
                    (St::Acquiring, b"$-1") => self.retry(s, t),
                    (St::Releasing, b":1") => self.released(s, true, t),
                    (St::Releasing, b":0") => self.released(s, false, t),
                    _ => return Err(format!("unexpected reply {:?}", shown())),
                }
            }
            Target::Echo => {
                let s = self.conns[c as usize]
                    .fifo
                    .pop_front()
                    .ok_or("echo of nothing")?;
                match self.slots[s as usize].st {
                    St::Acquiring => {
                        let token = self.slots[s as usize].token;
                        self.granted(s, token, t);
                    }
                    St::Releasing => self.released(s, true, t),
                    St::Idle => return Err("echo for an idle slot".into()),
                }
            }
        }
        Ok(())
    }

    /// The slot of connection `c` waiting in state `st` for an answer about
    /// key `idx`: the oldest, as the server answers same-key requests in
    /// order.
    fn find(&self, c: u32, idx: u64, st: St) -> Option<u32> {
        let p = u64::from(self.plan.pipeline);
        match self.plan.mode {
            Mode::Uncontended => {
                let conn = &self.conns[c as usize];
                let local = idx.checked_sub(conn.key_base)?;
                let s = c * self.plan.pipeline + (local % p) as u32;
                let slot = self.slots.get(s as usize)?;
                (slot.st == st && slot.key == idx).then_some(s)
            }
            _ => self.conns[c as usize]
                .by_key
                .get(&idx)?
                .iter()
                .copied()
                .filter(|&s| self.slots[s as usize].st == st)
                .min_by_key(|&s| self.slots[s as usize].seq),
        }
    }

    fn granted(&mut self, s: u32, token: u64, t: u64) {
        let in_window = self.in_window(t);
        // Shared grants are not handed off: nobody waits for one.
        let contended = self.plan.mode == Mode::Contended && self.wire.acquire != Acquire::Shared;
        if self.plan.mode == Mode::Memory {
            self.memory_granted += 1;
            self.progress += 1;
            self.slots[s as usize].st = St::Idle;
            self.start_acquire(s);
            if self.slots.iter().all(|s| s.st == St::Idle) && self.memory_done_at.is_none() {
                self.memory_done_at = Some(t);
            }
            return;
        }
        let slot = &mut self.slots[s as usize];
        debug_assert_eq!(slot.st, St::Acquiring);
        if in_window {
            self.grants += 1;
            self.attempts += slot.attempts;
            slot.grants += 1;
            self.hists.acquire.record(t - slot.first);
            if self.plan.record_round_trip_acquire {
                self.hists.round_trip.record(t - slot.sent);
            }
        }
        if contended {
            let cell = &self.shared.last_release[slot.key as usize];
            let released = cell.load(Ordering::Relaxed);
            // A hand-off: the lock was released while this client waited.
            if released != 0
                && slot.first < released
                && cell
                    .compare_exchange(released, 0, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                && in_window
            {
                self.hists.handoff.record(t.saturating_sub(released));
            }
        }
        slot.token = token;
        slot.st = St::Releasing;
        let (conn, key) = (slot.conn, slot.key);
        self.send(s, conn, |wire, out| wire.release(out, key, token));
    }

    fn released(&mut self, s: u32, ok: bool, t: u64) {
        let in_window = self.in_window(t);
        let slot = &mut self.slots[s as usize];
        if !ok {
            self.errors += 1;
        }
        if in_window {
            self.cycles += 1;
            self.hists.release.record(t - slot.sent);
            self.hists.round_trip.record(t - slot.sent);
            self.hists.cycle.record(t - slot.first);
        }
        self.progress += 1;
        slot.st = St::Idle;
        if self.draining {
            return;
        }
        match &mut self.pacer {
            Some(pacer) => pacer.finished(s, t),
            None => self.start_acquire(s),
        }
    }

    /// Redis: `SET NX` found the key held. Ask again at once (while the run
    /// lasts).
    fn retry(&mut self, s: u32, _t: u64) {
        let slot = &mut self.slots[s as usize];
        if self.draining {
            slot.st = St::Idle;
            return;
        }
        slot.attempts += 1;
        let (conn, key, token) = (slot.conn, slot.key, slot.token);
        self.send(s, conn, |wire, out| wire.acquire(out, key, token));
    }

    fn start_acquire(&mut self, s: u32) {
        let plan = self.plan;
        let slot = &mut self.slots[s as usize];
        let conn = &mut self.conns[slot.conn as usize];
        slot.key = match plan.mode {
            Mode::Uncontended => {
                let p = u64::from(plan.pipeline);
                let local = u64::from(s % plan.pipeline);
                conn.key_base + (local + p * slot.turn) % plan.keys
            }
            Mode::Contended => slot.key,
            // Grow mode runs in grow.rs, not here.
            Mode::Memory | Mode::Grow => {
                if conn.mem_next >= conn.mem_end {
                    return; // this connection's share is held: stay idle
                }
                conn.mem_next += 1;
                conn.mem_next - 1
            }
        };
        slot.turn += 1;
        self.token_seq += 1;
        slot.token = self.token_seq;
        slot.st = St::Acquiring;
        slot.first = u64::MAX; // stamped at send
        slot.attempts = 1;
        let (c, key, token) = (slot.conn, slot.key, slot.token);
        self.send(s, c, |wire, out| wire.acquire(out, key, token));
    }

    /// Queues a request of slot `s` on connection `c`; it goes out at the
    /// end of the turn.
    fn send(&mut self, s: u32, c: u32, encode: impl FnOnce(&Wire, &mut Vec<u8>)) {
        let conn = &mut self.conns[c as usize];
        if conn.out.is_empty() {
            self.dirty.push(c);
        }
        encode(self.wire, &mut conn.out);
        conn.unstamped.push(s);
        conn.seq += 1;
        let slot = &mut self.slots[s as usize];
        slot.seq = conn.seq;
        slot.unsent = true;
        if self.plan.target != Target::Ringlock || self.plan.mode == Mode::Memory {
            conn.fifo.push_back(s);
        }
    }

    fn flush_all(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &c in &dirty {
            self.flush(c);
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Writes what `c` has queued; stamps the send time of the requests
    /// written for the first time.
    fn flush(&mut self, c: u32) {
        let t = self.shared.now();
        let contended = self.plan.mode == Mode::Contended;
        let conn = &mut self.conns[c as usize];
        for &s in &conn.unstamped {
            let slot = &mut self.slots[s as usize];
            if slot.unsent {
                slot.unsent = false;
                slot.sent = t;
                if slot.first == u64::MAX {
                    slot.first = t;
                }
                if contended && slot.st == St::Releasing {
                    self.shared.last_release[slot.key as usize].store(t, Ordering::Relaxed);
                }
            }
        }
        conn.unstamped.clear();
        while conn.out_pos < conn.out.len() {
            match conn_write(&mut conn.stream, &mut conn.tls, &conn.out[conn.out_pos..]) {
                Ok(0) => {
                    self.shared
                        .fail(format!("connection {c}: write returned 0"));
                    return;
                }
                Ok(n) => conn.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.shared.fail(format!("connection {c}: {e}"));
                    return;
                }
            }
        }
        conn.out.clear();
        conn.out_pos = 0;
    }
}

pub(crate) fn resolve_addr(addr: &str) -> crate::Result<SocketAddr> {
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| format!("{addr} resolves to nothing").into())
}

fn connect(addr: SocketAddr) -> crate::Result<StdTcpStream> {
    let stream = StdTcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The TLS configuration of `--tls-ca`.
fn tls_config(ca: &std::path::Path) -> crate::Result<std::sync::Arc<rustls::ClientConfig>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))? {
        roots.add(cert.map_err(|e| format!("{}: {e}", ca.display()))?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// Connects and, with TLS, completes the handshake (blocking, with a
/// deadline) before the clock starts.
fn connect_maybe_tls(
    addr: SocketAddr,
    tls: Option<&(std::sync::Arc<rustls::ClientConfig>, String)>,
) -> crate::Result<(StdTcpStream, Option<rustls::ClientConnection>)> {
    let mut stream = connect(addr)?;
    let Some((config, name)) = tls else {
        return Ok((stream, None));
    };
    let name = rustls::pki_types::ServerName::try_from(name.clone())?;
    let mut conn = rustls::ClientConnection::new(config.clone(), name)?;
    // Unbounded: the generator's own requests, which it bounds.
    conn.set_buffer_limit(None);
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut stream)
            .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    }
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok((stream, Some(conn)))
}

/// Writes out the TLS records rustls holds, until the socket takes no more.
fn push_records(stream: &mut TcpStream, tls: &mut rustls::ClientConnection) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A read of the connection's (decrypted) input: like `read` on a
/// non-blocking socket.
fn conn_read(
    stream: &mut TcpStream,
    tls: &mut Option<rustls::ClientConnection>,
    buf: &mut [u8],
) -> io::Result<usize> {
    let Some(tls) = tls else {
        return stream.read(buf);
    };
    loop {
        match tls.reader().read(buf) {
            Ok(n) => return Ok(n), // 0: the server's close_notify
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        // Records still held (the socket was full) go out first.
        push_records(stream, tls)?;
        match tls.read_tls(stream) {
            Ok(0) => return Ok(0),
            Ok(_) => {
                tls.process_new_packets().map_err(io::Error::other)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A write of requests: with TLS they are encrypted (rustls takes them
/// all) and the records written until the socket takes no more; what it
/// does not take goes out with the next read or write.
fn conn_write(
    stream: &mut TcpStream,
    tls: &mut Option<rustls::ClientConnection>,
    buf: &[u8],
) -> io::Result<usize> {
    let Some(tls) = tls else {
        return stream.write(buf);
    };
    let n = tls.writer().write(buf)?;
    push_records(stream, tls)?;
    Ok(n)
}

/// `SCRIPT LOAD` of the release script; returns its sha1.
fn redis_load_script(
    addr: SocketAddr,
    tls: Option<&(std::sync::Arc<rustls::ClientConfig>, String)>,
) -> crate::Result<Vec<u8>> {
    let (stream, conn) = connect_maybe_tls(addr, tls)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::new();
    req.extend_from_slice(b"*3\r\n");
    bulk(&mut req, b"SCRIPT");
    bulk(&mut req, b"LOAD");
    bulk(&mut req, REDIS_RELEASE.as_bytes());
    let mut stream: Box<dyn ReadWrite> = match conn {
        Some(conn) => Box::new(rustls::StreamOwned::new(conn, stream)),
        None => Box::new(stream),
    };
    stream.write_all(&req)?;
    stream.flush()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("$40") {
        return Err(format!("SCRIPT LOAD answered {line:?}").into());
    }
    line.clear();
    reader.read_line(&mut line)?;
    Ok(line.trim_end().as_bytes().to_vec())
}

/// A key prefix unique to this run.
pub(crate) fn run_prefix() -> Vec<u8> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ u64::from(std::process::id()).rotate_left(32);
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut prefix = Vec::new();
    for _ in 0..4 {
        prefix.push(ALPHABET[(x % 36) as usize]);
        x /= 36;
    }
    prefix.push(b'_');
    prefix
}

pub(crate) fn main(args: RunArgs) -> crate::Result<ExitCode> {
    if args.mode == Mode::Grow {
        return crate::grow::main(&args);
    }
    let result = run(&args)?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        result.print();
    }
    Ok(if result.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

#[expect(clippy::too_many_lines)]
pub(crate) fn run(args: &RunArgs) -> crate::Result<RunResult> {
    if args.mode == Mode::Grow {
        return crate::grow::run(args);
    }
    if args.conns == 0 || args.pipeline == 0 || args.threads == 0 {
        return Err("--conns, --pipeline and --threads must be at least 1".into());
    }
    if !(args.lease > 0.0 && args.lease <= 86_400.0) {
        return Err("--lease must be in (0, 86400]".into());
    }
    if args.mode != Mode::Uncontended && args.target == Target::Echo {
        return Err("the echo floor has no locks: --mode uncontended only".into());
    }
    if args.acquire != Acquire::Exclusive
        && (args.target != Target::Ringlock || args.mode == Mode::Memory)
    {
        return Err("--acquire shared|semaphore: ringlock, uncontended or contended".into());
    }
    if args.rate.is_some() && !matches!(args.mode, Mode::Uncontended | Mode::Contended) {
        return Err("--rate: uncontended or contended mode".into());
    }
    if !(1..=ringlock_proto::MAX_PERMITS).contains(&args.permits) {
        return Err("--permits must be in 1..=65536".into());
    }
    let addr = resolve_addr(&args.addr)?;
    let threads = args.threads.min(args.conns);
    let p = args.pipeline;
    let keys = match args.mode {
        Mode::Uncontended => {
            u64::from(args.keys.unwrap_or(p).max(p)).div_ceil(u64::from(p)) * u64::from(p)
        }
        Mode::Contended => u64::from(args.keys.unwrap_or(1).max(1)),
        Mode::Memory | Mode::Grow => args.locks,
    };
    let tls = match &args.tls_ca {
        Some(ca) => Some((tls_config(ca)?, args.tls_server_name.clone())),
        None => None,
    };
    let prefix = run_prefix();
    let wire = Wire {
        target: args.target,
        pad: if args.mode == Mode::Memory {
            args.key_len.saturating_sub(prefix.len()).max(1)
        } else {
            0
        },
        prefix,
        lease_ms: (args.lease * 1000.0).round() as u64,
        acquire: args.acquire,
        permits: args.permits,
        sha: if args.target == Target::Redis && args.mode != Mode::Memory {
            redis_load_script(addr, tls.as_ref())?
        } else {
            Vec::new()
        },
    };
    if args.mode == Mode::Memory && wire.key_len(args.locks) != args.key_len {
        return Err(format!(
            "{} locks do not fit in {}-byte keys",
            args.locks, args.key_len
        )
        .into());
    }
    let plan = Plan {
        target: args.target,
        mode: args.mode,
        pipeline: p,
        keys,
        record_round_trip_acquire: args.mode == Mode::Uncontended,
        spin: Duration::from_micros(args.spin_us),
        rate: args
            .rate
            .map(|r| (r, u64::from(args.conns) * u64::from(args.pipeline))),
    };

    // Connect everything before the clock starts.
    let mut per_thread: Vec<Vec<(u32, StdTcpStream, Option<rustls::ClientConnection>)>> =
        (0..threads).map(|_| Vec::new()).collect();
    for c in 0..args.conns {
        let (stream, tls) = connect_maybe_tls(addr, tls.as_ref())?;
        per_thread[(c % threads) as usize].push((c, stream, tls));
    }
    let rss_before = match (args.mode, args.server_pid) {
        (Mode::Memory, Some(pid)) => proc::rss_kib(pid).map(|r| r.0),
        _ => None,
    };

    let warmup_ns = if args.mode == Mode::Memory {
        0
    } else {
        (args.warmup * 1e9) as u64
    };
    let shared = Shared {
        base: Instant::now(),
        warm_end: warmup_ns.max(1),
        end: warmup_ns + (args.duration * 1e9) as u64,
        progress: AtomicU64::new(0),
        last_release: if args.mode == Mode::Contended {
            (0..keys).map(|_| AtomicU64::new(0)).collect()
        } else {
            Vec::new()
        },
        failed: AtomicBool::new(false),
        fatal: Mutex::new(None),
    };

    let mut cpu_marks: Vec<Mark> = Vec::new();
    let mut scrape_before = None;
    let results: Vec<WorkerResult> =
        std::thread::scope(|scope| -> crate::Result<Vec<WorkerResult>> {
            let mut handles = Vec::new();
            for (t, streams) in per_thread.into_iter().enumerate() {
                let worker = build_worker(&shared, &plan, &wire, args, t as u64, streams)?;
                handles.push(scope.spawn(move || worker.run()));
            }
            cpu_marks = watch(&shared, args, &handles, &mut scrape_before);
            Ok(handles
                .into_iter()
                .map(|h| h.join().expect("worker panicked"))
                .collect())
        })?;
    if let Some(msg) = shared.fatal.lock().unwrap().take() {
        return Err(msg.into());
    }
    let replication = match &args.metrics_addr {
        Some(addr) => {
            let before = scrape_before.unwrap_or_else(|| replication::scrape(addr))?;
            let wait = (shared.end + SCRAPE_LAG_NS).saturating_sub(shared.now());
            std::thread::sleep(Duration::from_nanos(wait));
            replication::delta(&before, &replication::scrape(addr)?)
        }
        None => Vec::new(),
    };

    let mut hists = Hists::new();
    let (mut cycles, mut grants, mut attempts, mut errors) = (0, 0, 0, 0);
    let mut slot_grants = Vec::new();
    let mut drained = true;
    let mut memory_done: Option<u64> = None;
    let mut memory_granted = 0;
    for r in &results {
        hists.add(&r.hists);
        cycles += r.cycles;
        grants += r.grants;
        attempts += r.attempts;
        errors += r.errors;
        slot_grants.extend_from_slice(&r.slot_grants);
        drained &= r.drained;
        memory_granted += r.memory_granted;
        memory_done = match (memory_done, r.memory_done_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    // CPU over the measured window, from the marks the watcher took.
    let (window_s, server_cpu, client_cpu, other_cpu, follower_cpu) = match cpu_marks.as_slice() {
        [start, end, ..] => {
            // Cycles are counted by the time their answer was read, inside
            // [warm_end, end): that is the window. The CPU marks were taken
            // by this thread within a fraction of a millisecond of it.
            let marked = (end.0 - start.0) as f64 / 1e9;
            let window = if args.mode == Mode::Memory {
                marked
            } else {
                (shared.end - shared.warm_end) as f64 / 1e9
            };
            let per = |a: Option<f64>, b: Option<f64>| -> Option<CpuUse> {
                let cpu_s = b? - a?;
                Some(CpuUse {
                    cpu_s,
                    util: cpu_s / marked,
                    us_per_cycle: if cycles > 0 {
                        cpu_s * 1e6 / cycles as f64
                    } else {
                        0.0
                    },
                })
            };
            let server = per(start.1, end.1);
            let client = per(start.2, end.2).unwrap_or_default();
            let mut followers = Vec::new();
            for (i, pid) in args.follower_pids.iter().enumerate() {
                let at = |m: &Mark| m.4.get(i).copied().flatten();
                followers.push(
                    per(at(start), at(end))
                        .ok_or_else(|| format!("follower {pid}: no CPU time in /proc (gone?)"))?,
                );
            }
            let followers_s: f64 = followers.iter().map(|f| f.cpu_s).sum();
            // Everything else the machine did meanwhile: other processes,
            // and interrupt time charged to none of ours.
            let other = start.3.zip(end.3).map(|(a, b)| {
                let rest =
                    (b - a) - client.cpu_s - server.as_ref().map_or(0.0, |s| s.cpu_s) - followers_s;
                (rest / marked).max(0.0)
            });
            (window, server, client, other, followers)
        }
        _ => (args.duration, None, CpuUse::default(), None, Vec::new()),
    };
    let memory = if args.mode == Mode::Memory {
        let (rss_after, hwm) = args.server_pid.and_then(proc::rss_kib).unwrap_or((0, 0));
        let seconds = memory_done.map_or(args.duration, |t| t as f64 / 1e9);
        let before = rss_before.unwrap_or(0);
        Some(Memory {
            locks: args.locks,
            key_len: args.key_len,
            granted: memory_granted,
            seconds,
            acquires_per_s: memory_granted as f64 / seconds,
            rss_before_kib: before,
            rss_after_kib: rss_after,
            hwm_kib: hwm,
            bytes_per_lock: if memory_granted > 0 {
                (rss_after.saturating_sub(before) * 1024) as f64 / memory_granted as f64
            } else {
                0.0
            },
        })
    } else {
        None
    };
    if args.mode == Mode::Memory && memory_granted < args.locks {
        errors += 1;
    }
    let fairness = (args.mode == Mode::Contended).then(|| Fairness {
        clients: slot_grants.len() as u64,
        min_grants: slot_grants.iter().copied().min().unwrap_or(0),
        max_grants: slot_grants.iter().copied().max().unwrap_or(0),
    });
    // Failed SET NX attempts are round trips too (Redis contended).
    let failed_attempts = attempts.saturating_sub(grants);
    let round_trips = 2 * cycles + failed_attempts;
    Ok(RunResult {
        scenario: args.scenario.clone(),
        label: if args.label.is_empty() {
            format!("{:?}", args.target).to_lowercase()
        } else {
            args.label.clone()
        },
        round: args.round,
        target: format!("{:?}", args.target).to_lowercase(),
        mode: format!("{:?}", args.mode).to_lowercase(),
        addr: addr.to_string(),
        conns: args.conns,
        pipeline: p,
        keys: keys as u32,
        threads,
        spin_us: args.spin_us,
        lease_s: args.lease,
        warmup_s: args.warmup,
        duration_s: args.duration,
        window_s,
        cycles,
        cycles_per_s: cycles as f64 / window_s,
        round_trips_per_s: if args.mode == Mode::Memory {
            0.0
        } else {
            round_trips as f64 / window_s
        },
        latency_us: hists.summary(),
        errors,
        attempts_per_grant: if grants > 0 {
            attempts as f64 / grants as f64
        } else {
            1.0
        },
        fairness,
        server_pid: args.server_pid,
        server_cpu,
        follower_cpu,
        replication,
        client_cpu,
        other_cpu,
        drained,
        memory,
        growth: None,
    })
}

fn build_worker<'a>(
    shared: &'a Shared,
    plan: &'a Plan,
    wire: &'a Wire,
    args: &RunArgs,
    thread: u64,
    streams: Vec<(u32, StdTcpStream, Option<rustls::ClientConnection>)>,
) -> crate::Result<Worker<'a>> {
    let poll = Poll::new()?;
    let mut conns = Vec::new();
    let mut slots = Vec::new();
    let p = args.pipeline;
    for (local, (global, stream, tls)) in streams.into_iter().enumerate() {
        stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(stream);
        poll.registry().register(
            &mut stream,
            Token(local),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let global = u64::from(global);
        let (mem_next, mem_end) = if plan.mode == Mode::Memory {
            let n = u64::from(args.conns);
            (args.locks * global / n, args.locks * (global + 1) / n)
        } else {
            (0, 0)
        };
        let mut by_key: HashMap<u64, Vec<u32>> = HashMap::new();
        for s in 0..p {
            let idx = local as u32 * p + s;
            let key = match plan.mode {
                Mode::Contended => (global * u64::from(p) + u64::from(s)) % plan.keys,
                _ => 0,
            };
            if plan.mode == Mode::Contended {
                by_key.entry(key).or_default().push(idx);
            }
            slots.push(Slot {
                conn: local as u32,
                st: St::Idle,
                key,
                turn: 0,
                token: 0,
                seq: 0,
                sent: 0,
                first: 0,
                unsent: false,
                attempts: 0,
                grants: 0,
            });
        }
        conns.push(Conn {
            stream,
            tls,
            rbuf: vec![0u8; RBUF].into_boxed_slice(),
            rlen: 0,
            out: Vec::with_capacity(4096),
            out_pos: 0,
            unstamped: Vec::new(),
            fifo: VecDeque::new(),
            by_key,
            seq: 0,
            key_base: global * plan.keys,
            mem_next,
            mem_end,
        });
    }
    // Tokens for Redis: unique per run and per thread.
    let token_seq = (u64::from(std::process::id()) << 40) ^ (thread << 36);
    Ok(Worker {
        shared,
        plan,
        wire,
        poll,
        conns,
        slots,
        hists: Hists::new(),
        cycles: 0,
        grants: 0,
        attempts: 0,
        errors: 0,
        progress: 0,
        draining: false,
        token_seq,
        dirty: Vec::new(),
        memory_done_at: None,
        memory_granted: 0,
        pacer: None,
    })
}

/// The main thread while workers run: takes the CPU marks at the start and
/// end of the measured window and prints the progress line.
/// (time, server CPU s, generator CPU s, whole machine busy CPU s, each
/// follower's CPU s).
type Mark = (u64, Option<f64>, Option<f64>, Option<f64>, Vec<Option<f64>>);

/// How long before the window the active's metrics are read: the scrape's
/// round trip is then over before the window's first CPU mark.
const SCRAPE_LEAD_NS: u64 = 50_000_000;
/// The active publishes its metrics at most every 100 ms: the scrape after
/// the window waits this long past its end, so that every probe of the
/// window is in it.
const SCRAPE_LAG_NS: u64 = 150_000_000;

fn watch(
    shared: &Shared,
    args: &RunArgs,
    handles: &[std::thread::ScopedJoinHandle<'_, WorkerResult>],
    before: &mut Option<crate::Result<Scrape>>,
) -> Vec<Mark> {
    let mut marks = Vec::new();
    let cpu = |t: u64| {
        (
            t,
            args.server_pid.and_then(|p| proc::cpu_seconds(Some(p))),
            proc::cpu_seconds(None),
            proc::machine_busy_seconds(),
            args.follower_pids
                .iter()
                .map(|&p| proc::cpu_seconds(Some(p)))
                .collect(),
        )
    };
    let memory = args.mode == Mode::Memory;
    let mut last = (0, 0);
    let mut next_print = 1_000_000_000;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let scrape_at = shared.warm_end.saturating_sub(SCRAPE_LEAD_NS);
    loop {
        let now = shared.now();
        if let Some(addr) = &args.metrics_addr
            && before.is_none()
            && now >= scrape_at
        {
            *before = Some(replication::scrape(addr));
        }
        if marks.is_empty() && (now >= shared.warm_end || memory) {
            marks.push(cpu(now));
        }
        if marks.len() == 1 && !memory && now >= shared.end {
            marks.push(cpu(now));
        }
        if handles.iter().all(|h| h.is_finished()) {
            break;
        }
        if now >= next_print && !args.quiet {
            print_progress(shared, args, now, &mut last, tty);
            next_print += 1_000_000_000;
        }
        let mut wake = next_print;
        if marks.is_empty() {
            wake = wake.min(shared.warm_end);
        } else if marks.len() == 1 && !memory {
            wake = wake.min(shared.end);
        }
        std::thread::sleep(Duration::from_nanos(
            wake.saturating_sub(now).clamp(100_000, 20_000_000),
        ));
    }
    // A run cut short (memory mode done, or a failure) ends its window now.
    while marks.len() < 2 {
        marks.push(cpu(shared.now()));
    }
    if tty && !args.quiet {
        eprintln!();
    }
    marks
}

/// The progress line, once a second: the rate since the last one
/// (`last`: progress and time then).
fn print_progress(shared: &Shared, args: &RunArgs, now: u64, last: &mut (u64, u64), tty: bool) {
    let memory = args.mode == Mode::Memory;
    let progress = shared.progress.load(Ordering::Relaxed);
    let rate = (progress - last.0) as f64 / ((now - last.1) as f64 / 1e9);
    let phase = if memory {
        format!("granted {progress}/{}", args.locks)
    } else if now < shared.warm_end {
        "warm-up".to_string()
    } else if now < shared.end {
        "measuring".to_string()
    } else {
        "draining".to_string()
    };
    let line = format!(
        "ringlock-bench: {:>5.1} s {} {:.0} {}/s",
        now as f64 / 1e9,
        phase,
        rate,
        if memory { "acquires" } else { "cycles" }
    );
    if tty {
        eprint!("\r{line}   ");
    } else {
        eprintln!("{line}");
    }
    *last = (progress, now);
}
