//! A deterministic simulation of a ringlock cluster (TigerBeetle's VOPR
//! idea): several [`Node`]s, each driven exactly as the I/O loops drive it
//! (tick, each connection's bytes, end of stream and sends through the same
//! [`Lifecycle`] the loops use, take the dirty output), with the loops'
//! per-turn policy, the same [`Driver`] they own: its timeout is the
//! node's deadline, accepted sockets go through its admission, a failed
//! accept waits for its retry, lingering connections and handshakes are
//! closed at its deadlines, dials are the ones it takes, SIGTERM is its
//! shutdown, and a turn ends with its invariant walkers. All that over a
//! fake network and a fake clock, with clients that speak the wire
//! protocol. Socket buffers are finite (`Sim::set_socket_buffer`), so a
//! client that stops reading makes the node pause that connection as a
//! loop would, and a connection the node ends lingers until the peer
//! closes or the deadline. One seeded PRNG decides everything (delays,
//! faults, client requests, the order nodes run in), so a seed replays the
//! same run.
//!
//! The network: every TCP connection is a pair of in-order byte pipes with
//! per-segment delays; dials go as the loops' dialer makes them (a
//! connection attempt every 50 ms within a dial of 500 ms: an attempt made
//! into a partition is lost, one made across an open path connects after a
//! round trip; see `Dial`). Faults: connection breaks (FIN or RST, each side
//! closing at its own time), partitions (symmetric, with clients on either
//! side, or one-way between two nodes: stuck bytes queue up and the
//! connection breaks after a retransmission timeout, as TCP would, and what
//! its sender had not got through is gone with it), crashes
//! (the kernel closes the dead process's sockets: FIN after the bytes in
//! flight, or RST), hangs (SIGSTOP: the kernel still accepts and buffers,
//! the process runs nothing, then resumes with its old state and a clock
//! that jumped), restarts (a new process: new incarnation, empty state),
//! graceful leaves (SIGTERM through [`Driver::shut_down`]: the node leaves,
//! its listener closes, every connection is finished with its last output,
//! and the process exits once [`Driver::finished`]), strangers (a socket
//! that connects and never speaks: its connection starts a TLS handshake,
//! a real rustls server connection that is never fed a byte, and the
//! driver closes it at the handshake deadline) and failed accepts (the
//! kernel's EMFILE: what arrives waits in the backlog until
//! [`Driver::accept_retry_due`]).
//!
//! Batched reads: in two random runs in three
//! ([`SimConfig::read_batch_us`]) a standby reads its active's busy link in
//! batches, as the loops do: the link is not read until its lifecycle's
//! next read ([`NextRead::At`], at the first millisecond not before it),
//! then everything that has arrived is read at once; a batch read that
//! finds nothing ends the batching. Bytes that arrived wait in the
//! standby's socket meanwhile, and a reset keeps them, as Linux does.
//!
//! TLS: in one random run in three ([`SimConfig::tls`]) the nodes speak
//! TLS, as with `--tls-cert` and a peer CA: each accepted connection
//! (client or peer: a node cannot tell before the handshake) is a rustls
//! server connection inside its [`Lifecycle`], as the loops make it (the
//! handshake deadline, the peer CA's check for peer lines); each dialed
//! peer link is a rustls client connection presenting the node
//! certificate and checking the peer's against the host of its address
//! (the loops' `LoopTls::dialed`); each client wraps its byte stream in a
//! rustls client connection that trusts the nodes' certificate. The
//! handshakes, lines decrypted into the session, output encrypted as it
//! leaves the engine, `close_notify` both ways and every fault above go
//! through it; records are cut across reads and sends (and across
//! deliveries when a socket fills), and a client that stalls its handshake
//! is closed at the deadline. The requests, answers, peer lines and their
//! checks are those of plain text, on the plaintext: a client's as it
//! reads it, a peer line's as its sender's lifecycle encrypted it, read
//! once the receiver has its records ([`TlsTrace`]). A seed still replays
//! exactly (see [`sim_tls`]).
//!
//! The checks (listed in tests/cluster_sim.rs) run after every call into a
//! node (`Sim::op`: roles, grants kept on promotion, tokens, `E` lines),
//! on every answer a client reads (`Sim::check_overlap`: mutual exclusion)
//! and after every step (`Sim::check_step`: how many actives, answers in
//! time, busy loops, the engines' invariants).

// Shared by several test binaries, each using a part of it: `pub` is this
// module's interface, and what one binary leaves unused is not dead.
#![allow(dead_code, unreachable_pub)]

pub mod replay;
pub mod rng;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

use ringlock::cluster::auth::Secret;
use ringlock::cluster::{ClusterConfig, PeerId, Role, wire};
use ringlock::driver::Driver;
use ringlock::engine::{ConnId, Now};
use ringlock::io::lifecycle::{Phase, TlsFailure};
use ringlock::io::{Lifecycle, Step};
use ringlock::node::{Admission, Node, NodeConfig};
use ringlock::read_batch::NextRead;
use ringlock_proto::{Answer, Kind, parse_answer};
pub use rng::Rng;

pub const HEARTBEAT_MS: u64 = 50;
pub const PEER_TIMEOUT_MS: u64 = 500;
/// Every node's `--tls-handshake-timeout-ms`: a connection that starts
/// with a TLS handshake must be done with it by then.
pub const HANDSHAKE_MS: u64 = 1_000;
/// One-way delay of a segment: uniform in `0..=MAX_DELAY_MS`.
pub const MAX_DELAY_MS: u64 = 20;
/// Wall clocks are off by at most this much either way. Two nodes differ by
/// at most twice that (400 ms), less than the failover time by timeout
/// (500 ms), so the fencing-token rule covers every failover (see
/// docs/protocol.md, "Fencing tokens") and the token checks can be strict.
pub const MAX_DRIFT_MS: u64 = 200;
/// How long after a fault ends the cluster may still be sorting itself out:
/// one failure timeout plus margin for heartbeats, redials and delays.
pub const SETTLE_MS: u64 = PEER_TIMEOUT_MS + 300;
/// Sim time starts here (ms).
const T0: u64 = 1_000;
const EPOCH_NS: u64 = 1_700_000_000_000_000_000;
const DIAL_TIMEOUT_MS: u64 = ringlock::io::DIAL_TIMEOUT_MS;
const DIAL_AGAIN_MS: u64 = ringlock::io::DIAL_AGAIN_MS;

pub fn addr(i: usize) -> String {
    format!("n{i}:1")
}

fn node_of_addr(a: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(a).ok()?;
    s.strip_prefix('n')?.strip_suffix(":1")?.parse().ok()
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ---------------------------------------------------------------------------
// Configuration

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub nodes: usize,
    pub clients: usize,
    pub keys: usize,
    /// Clients act on their own (random requests).
    pub auto_clients: bool,
    /// Random faults until `chaos_ms` after the start; then everything is
    /// healed and the run goes on for `settle_ms` before the final checks.
    pub faults: bool,
    pub chaos_ms: u64,
    pub settle_ms: u64,
    /// Per-node wall clock offsets, drawn in `±drift_ms`.
    pub drift_ms: u64,
    /// Relative weights of the fault kinds, see [`Fault`].
    pub weights: [u64; FAULT_KINDS],
    pub max_steps: u64,
    /// Every node's `failback_delay_ms`.
    pub failback_delay_ms: u64,
    /// Every node's `read_batch_us`: a standby reads its active's busy link
    /// in batches, at most this far apart (the simulated node reads it at
    /// the first millisecond not before the batch's time).
    pub read_batch_us: u64,
    /// The nodes speak TLS (as with `--tls-cert` and a peer CA): each
    /// accepted connection gets a rustls server connection, each dialed
    /// peer link a rustls client connection with the node certificate,
    /// each client wraps its byte stream in a rustls client connection.
    /// Strangers are as without.
    pub tls: bool,
}

pub const FAULT_KINDS: usize = 11;

/// The kinds of fault the random scenario picks from, in `weights` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Steady,
    CrashActive,
    CrashAny,
    Leave,
    HangActive,
    Partition,
    OneWay,
    Flap,
    Outage,
    /// A socket connects to a node and never speaks.
    Stranger,
    /// A node's next accepts fail (out of descriptors), with a connection
    /// waiting in its backlog.
    AcceptFails,
}

const FAULTS: [Fault; FAULT_KINDS] = [
    Fault::Steady,
    Fault::CrashActive,
    Fault::CrashAny,
    Fault::Leave,
    Fault::HangActive,
    Fault::Partition,
    Fault::OneWay,
    Fault::Flap,
    Fault::Outage,
    Fault::Stranger,
    Fault::AcceptFails,
];

impl SimConfig {
    /// A quiet cluster for scripted scenarios.
    pub fn scripted(nodes: usize, clients: usize) -> SimConfig {
        SimConfig {
            nodes,
            clients,
            keys: 3,
            auto_clients: false,
            faults: false,
            chaos_ms: 0,
            settle_ms: 0,
            drift_ms: 0,
            weights: [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            max_steps: 5_000_000,
            failback_delay_ms: 0,
            read_batch_us: 0,
            tls: false,
        }
    }

    /// A random configuration drawn from the seed's PRNG.
    pub fn random(rng: &mut Rng) -> SimConfig {
        let nodes = [3, 3, 3, 3, 3, 2, 4][rng.below(7) as usize];
        SimConfig {
            nodes,
            clients: rng.range(2, 4) as usize,
            keys: rng.range(1, 4) as usize,
            auto_clients: true,
            faults: true,
            chaos_ms: rng.range(4_000, 9_000),
            settle_ms: 3_000,
            drift_ms: if rng.chance(70) { MAX_DRIFT_MS } else { 0 },
            //        steady crashA crash leave hang part oneway flap outage
            //        stranger acceptfails
            weights: [20, 14, 6, 12, 12, 12, 6, 12, 2, 8, 8],
            max_steps: 2_000_000,
            failback_delay_ms: [0, 0, 300, 2_000][rng.below(4) as usize],
            // One run in three (drawn last but one: the rest of the
            // configuration is what it was without).
            tls: rng.chance(33),
            // Off, the default, and the longest.
            read_batch_us: [0, ringlock::cluster::DEFAULT_READ_BATCH_US, 2_000]
                [rng.below(3) as usize],
        }
    }
}

// ---------------------------------------------------------------------------
// The network

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Party {
    Node(usize),
    Client(usize),
    /// A socket that connects to a node and never speaks (see
    /// [`Sim::stranger_connects`]).
    Stranger(usize),
}

#[derive(Debug)]
enum Seg {
    /// Bytes, and the sim time they were written at.
    Data(Vec<u8>, u64),
    /// Orderly close, after the bytes before it.
    Fin,
    /// Reset: the bytes before it were dropped.
    Rst,
}

#[derive(Debug, Default)]
struct Pipe {
    segs: VecDeque<(u64, Seg)>,
    last_at: u64,
    /// Since when its head segment is due but cannot get through.
    stuck_since: Option<u64>,
    /// After being stuck: nothing gets through before the sender's next
    /// retransmission, which TCP's back-off spaces ever wider (see
    /// [`next_retransmission`]).
    resume_at: Option<u64>,
}

/// TCP's first retransmission timeout on a quiet loopback or LAN path.
const RTO_MIN_MS: u64 = 200;

/// The first retransmission at or after `now` of a segment first lost at
/// `since`: retransmissions come at `since` + 200, 600, 1400, 3000, ... ms
/// (the timeout doubles each time).
fn next_retransmission(since: u64, now: u64) -> u64 {
    let mut rto = RTO_MIN_MS;
    let mut at = since + rto;
    while at < now {
        rto *= 2;
        at += rto;
    }
    at
}

/// One TCP connection. End 0 dialed (a node's peer link or a client), end
/// 1 is the node that accepted it. `pipes[e]` carries bytes from end `e`.
#[derive(Debug)]
struct SimConn {
    parties: [Party; 2],
    /// For node ends: the incarnation generation that owns it.
    gens: [u64; 2],
    /// For node ends: the node's connection id, once open there.
    cids: [Option<ConnId>; 2],
    open: [bool; 2],
    /// A network-made close of end `e` due at this time (processed at the
    /// node's next turn).
    close_at: [Option<u64>; 2],
    pipes: [Pipe; 2],
    peer_link: bool,
    /// How long stuck bytes are retransmitted before the sender gives up.
    rto_ms: u64,
    /// Broken by the network: nothing written from now on gets through.
    dead: bool,
    /// Dialed by a stranger: the node's end starts with a TLS handshake
    /// that never completes.
    silent: bool,
    /// When the node at end 1 took the connection out of its backlog: a
    /// request sent before waits for that.
    accepted_ms: Option<u64>,
    /// A TLS peer link's plaintext, by the end `e` that sent it
    /// (`tls_trace[e]` goes with `pipes[e]`).
    tls_trace: [TlsTrace; 2],
}

/// What the checks that read peer lines need of one direction of a TLS peer
/// link: its plaintext as the sender's lifecycle encrypted it, and where in
/// the ciphertext it ends, so they read each line once the receiver has
/// the records that carry it (and has decrypted it into its session).
#[derive(Debug, Default)]
struct TlsTrace {
    /// Ciphertext the sender handed to its socket.
    sent: u64,
    /// Where the records its lifecycle has made so far end.
    made: u64,
    /// Plaintext rustls took whose records are not made yet: a dialed
    /// link's, written before its handshake ended.
    waiting: Vec<u8>,
    /// Plaintext, by the end of the ciphertext that carries it, that the
    /// sender has not handed all to its socket yet (check 9 reads it then).
    unhanded: VecDeque<(u64, Vec<u8>)>,
    /// The same, not yet all read by the receiver (the other checks read
    /// it then).
    marks: VecDeque<(u64, Vec<u8>)>,
    /// Ciphertext the receiver's lifecycle took in.
    read: u64,
    /// The start of a line the receiver has without its end yet.
    partial: Vec<u8>,
}

impl TlsTrace {
    /// The sender's lifecycle made the records up to `made`; `taken` is the
    /// plaintext it took this time (`fresh`: the records before were all
    /// sent, so it encrypted). Once its handshake is over, rustls writes
    /// all it took into the records it makes.
    fn sending(&mut self, fresh: bool, made: u64, taken: &[u8], handshaking: bool) {
        self.waiting.extend_from_slice(taken);
        self.made = made;
        if fresh && !handshaking && !self.waiting.is_empty() {
            let plain = std::mem::take(&mut self.waiting);
            self.unhanded.push_back((made, plain.clone()));
            self.marks.push_back((made, plain));
        }
    }

    /// The sender handed `n` more bytes to its socket: the plaintext whose
    /// records it now has all handed.
    fn handed(&mut self, n: usize) -> Vec<u8> {
        self.sent += n as u64;
        let mut plain = Vec::new();
        while let Some((_, p)) = self.unhanded.pop_front_if(|(end, _)| *end <= self.sent) {
            plain.extend_from_slice(&p);
        }
        plain
    }

    /// The complete lines the receiver will have decrypted once it takes
    /// in `n` more bytes ([`TlsTrace::received`], without taking them).
    fn peek(&self, n: usize) -> Vec<Vec<u8>> {
        let read = self.read + n as u64;
        let mut partial = self.partial.clone();
        let mut lines = Vec::new();
        for (_, plain) in self.marks.iter().take_while(|(end, _)| *end <= read) {
            lines.extend(complete_lines(&mut partial, plain));
        }
        lines
    }

    /// The receiver took in `n` more bytes: the complete lines it now has
    /// decrypted.
    fn received(&mut self, n: usize) -> Vec<Vec<u8>> {
        self.read += n as u64;
        let mut lines = Vec::new();
        while let Some((_, plain)) = self.marks.pop_front_if(|(end, _)| *end <= self.read) {
            lines.extend(complete_lines(&mut self.partial, &plain));
        }
        lines
    }
}

// ---------------------------------------------------------------------------
// Nodes

struct Inc {
    node: Node,
    generation: u64,
    incarnation: u64,
    ms_offset: u64,
    started: u64,
    conns: BTreeMap<ConnId, usize>,
    lives: BTreeMap<ConnId, Lifecycle>,
    /// Connections whose lifecycle does not want input now (refreshed after
    /// each of the node's turns; the turn itself asks the lifecycle).
    not_reading: BTreeSet<ConnId>,
    /// Links read in batches whose next read is after the turn
    /// ([`Sim::batch_reads_later`]).
    batched_later: BTreeSet<ConnId>,
    /// Connections with answers the socket buffer had no room for yet.
    unsent: BTreeSet<ConnId>,
    scan_pos: BTreeMap<ConnId, usize>,
    next_cid: u32,
    free_cids: BTreeSet<ConnId>,
    accepts: Vec<(u64, usize)>,
    /// Highest token in any peer line this process has read.
    seen_max: u64,
    role: Role,
    wake_at: Option<u64>,
    last_turn: u64,
    /// Its deadline was in the past after its last turn: a real loop would
    /// spin (poll with timeout 0) until it changes.
    spinning_since: Option<u64>,
    /// The loops' per-turn policy: admission, the accept retry, the linger
    /// and handshake deadlines, dials, shutdown.
    driver: Driver,
    /// An accept failed: the loop does not read its listener until the
    /// driver's retry is due; what arrives waits in the backlog.
    accept_paused: bool,
    /// The kernel fails this many of the next accepts (out of descriptors:
    /// EMFILE).
    fail_accepts: u32,
    /// What this incarnation handed to each peer link's socket, by sim
    /// connection (check 9).
    links_out: BTreeMap<usize, LinkOut>,
    /// Per client connection (by sim connection): the start of a line this
    /// incarnation handed to its socket without the line's end yet.
    client_partial: BTreeMap<usize, Vec<u8>>,
}

impl Inc {
    /// After [`Lifecycle::pending`] on `cid`: with TLS, the plaintext it
    /// took to encrypt out of `plain` (the last answers and the outbox
    /// before the call), and the scan of the output goes on where it was,
    /// in what is left. Without TLS (`plain` is `None`), what the outbox had
    /// is now the lifecycle's: the scan starts from the start of the
    /// outbox's buffer again.
    fn taken_by_pending(
        &mut self,
        cid: ConnId,
        plain: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Option<Vec<u8>> {
        let in_outbox = self.node.output_mut(cid).len();
        let Some((last, outbox)) = plain else {
            if let Some(pos) = self.scan_pos.get_mut(&cid) {
                *pos = (*pos).min(in_outbox);
            }
            return None;
        };
        let last_left = self.lives[&cid].last_answers().len();
        let mut taken = last[..last.len() - last_left].to_vec();
        taken.extend_from_slice(&outbox[..outbox.len() - in_outbox]);
        let gone = if last.is_empty() {
            outbox.len() - in_outbox
        } else {
            last.len() - last_left
        };
        if let Some(pos) = self.scan_pos.get_mut(&cid) {
            *pos = pos.saturating_sub(gone);
        }
        Some(taken)
    }
}

/// What a node handed to one peer link's socket since its last snapshot on
/// it, as check 9 reads it: the replication a follower would have if the
/// node stopped now.
#[derive(Default)]
struct LinkOut {
    /// The start of a line handed without its end yet.
    partial: Vec<u8>,
    /// The highest token of the last `P SNAP`: a grant up to it that the
    /// snapshot does not carry had ended before it.
    snapshot_highest: u64,
    /// A `P SYNCED` followed that `P SNAP`: the whole snapshot was handed.
    synced: bool,
    /// Tokens of the grants, shared grants and permits (`P G`, `P S`,
    /// `P C`) handed since that `P SNAP`, the snapshot's included.
    tokens: BTreeSet<u64>,
}

/// Appends `bytes` to the line start in `partial` and returns the complete
/// lines (without their `\n`); the start of an incomplete last one stays.
fn complete_lines(partial: &mut Vec<u8>, bytes: &[u8]) -> Vec<Vec<u8>> {
    partial.extend_from_slice(bytes);
    let Some(end) = partial.iter().rposition(|&b| b == b'\n') else {
        return Vec::new();
    };
    let rest = partial.split_off(end + 1);
    let done = std::mem::replace(partial, rest);
    done[..end]
        .split(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

struct NodeSlot {
    inc: Option<Inc>,
    generation: u64,
    drift_ns: i64,
    hung_until: Option<u64>,
    hung_since: u64,
    /// Highest token any incarnation of this node issued.
    last_token: u64,
}

/// A dial under way, as the loops' dialer makes it (`ringlock::io`,
/// `dial_overlapping`): a connection attempt at its start and another every
/// [`DIAL_AGAIN_MS`] while none has connected, for at most
/// [`DIAL_TIMEOUT_MS`]. An attempt made while the path is blocked is lost
/// (TCP would retry its SYN only after a second, past the dial's end); one
/// made while the peer is reachable connects after a round trip; one the
/// peer's kernel refuses (the process is gone) fails the dial unless an
/// earlier, lost attempt is still under way.
#[derive(Debug, Clone, Copy)]
struct Dial {
    node: usize,
    generation: u64,
    peer: usize,
    /// When `phase` next decides.
    due: u64,
    started: u64,
    phase: DialPhase,
    /// An earlier attempt was lost: it is still under way, for the dialer.
    lost: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DialPhase {
    /// The next attempt goes out at `due`.
    Attempt,
    /// An attempt's answer (its SYN-ACK) comes at `due`.
    Connecting,
    /// An attempt's refusal (a reset) comes at `due`.
    Refused,
    /// No attempt connected: the dial fails at `due`.
    TimedOut,
}

// ---------------------------------------------------------------------------
// Clients

#[derive(Debug, Clone)]
struct Req {
    /// `A`, `G`, `C` (a permit of a semaphore of `limit`), `R` or `N`.
    op: u8,
    key: Vec<u8>,
    limit: u32,
    token: u64,
    lease_ms: u64,
    wait_ms: u64,
    redirects: u32,
    /// Releases are retried on connection loss for 5 s, like the official
    /// clients.
    retry_until: u64,
    /// When it was last sent.
    sent_ms: u64,
}

impl Req {
    fn line(&self) -> Vec<u8> {
        let mut l = Vec::new();
        let secs = |ms: u64| format!("{}.{:03}", ms / 1000, ms % 1000);
        match self.op {
            b'A' => l.extend_from_slice(
                format!(
                    "A {} {} {}",
                    show(&self.key),
                    secs(self.lease_ms),
                    secs(self.wait_ms)
                )
                .as_bytes(),
            ),
            b'G' => l.extend_from_slice(
                format!(
                    "G {} {} {}",
                    show(&self.key),
                    secs(self.lease_ms),
                    secs(self.wait_ms)
                )
                .as_bytes(),
            ),
            b'C' => l.extend_from_slice(
                format!(
                    "C {} {} {} {}",
                    show(&self.key),
                    self.limit,
                    secs(self.lease_ms),
                    secs(self.wait_ms)
                )
                .as_bytes(),
            ),
            b'R' => l.extend_from_slice(format!("R {} {}", show(&self.key), self.token).as_bytes()),
            b'N' => l.extend_from_slice(
                format!(
                    "N {} {} {}",
                    show(&self.key),
                    self.token,
                    secs(self.lease_ms)
                )
                .as_bytes(),
            ),
            _ => unreachable!(),
        }
        l.push(b'\n');
        l
    }
}

#[derive(Debug, Clone)]
struct Held {
    token: u64,
    node: usize,
    belief: usize,
    /// When the client means to let go.
    hold_until: u64,
}

/// What a client believes: it holds `key` with `token` from `start` (the
/// answer arrived) to `end` (lease end by the server's grant time, or when
/// it sent the release).
#[derive(Debug, Clone)]
struct Belief {
    key: Vec<u8>,
    client: usize,
    token: u64,
    node: usize,
    granted_ms: u64,
    start: u64,
    end: u64,
    /// Its lease end as the client counts it (renewals move it; a release
    /// does not): a release or renewal refused before it is a lost grant.
    lease_end: u64,
    /// Granted after the cluster agreed on one active again (see
    /// [`Sim::agreed_since`]): no partition excuses an overlap with it.
    after_agreement: bool,
    /// `None`: an exclusive grant; `Some(0)` a shared one; `Some(n)` a
    /// permit of a semaphore of `n`.
    member: Option<u32>,
}

struct Client {
    conns: Vec<Option<usize>>,
    reconnect_at: Vec<Option<u64>>,
    outstanding: BTreeMap<usize, VecDeque<(Req, usize)>>,
    target: usize,
    next_action: u64,
    held: BTreeMap<Vec<u8>, Held>,
    busy: BTreeSet<Vec<u8>>,
    retries: Vec<(u64, Option<usize>, Req)>,
    /// Every answer line received, with the node it came from (scripted
    /// tests read these).
    answers: Vec<(usize, String)>,
    /// It reads its sockets (a scripted test may stop it).
    reading: bool,
    /// It sends raw lines: an `E`, or an answer to no request it made, is
    /// what the test wants, not a failure.
    expects_error: bool,
    /// Per connection, the start of a line whose end has not arrived.
    partial: BTreeMap<usize, Vec<u8>>,
    /// Releases sent: (key, token) to the belief they end.
    releasing: BTreeMap<(Vec<u8>, u64), usize>,
    /// Releases sent again after their connection broke: the first copy
    /// may have reached the node, so `R key 0` to a later one loses nothing.
    resent_releases: BTreeSet<(Vec<u8>, u64)>,
    /// With TLS: per connection, the client's rustls connection. It holds
    /// the received records not yet whole (a record split across
    /// deliveries) and the requests written before its handshake ended.
    tls: BTreeMap<usize, rustls::ClientConnection>,
}

// ---------------------------------------------------------------------------
// Faults and the record of what happened

#[derive(Debug, Clone)]
struct Window {
    kind: &'static str,
    start: u64,
    /// `u64::MAX` while the fault lasts; then its end plus [`SETTLE_MS`].
    end: u64,
    /// For a crash: the grants (key, token) every other running node had
    /// in its table then, each with the earliest end of its lease among
    /// them (simulated ms). A crash excuses the loss of a grant that some
    /// running node lacked, or held with a shorter lease than its holder
    /// was given (a renewal on its way when the crash came): the node that
    /// takes over keeps what reached it ([`Sim::crash_window`]).
    survivors: Option<BTreeMap<(Vec<u8>, u64), u64>>,
}

#[derive(Debug, Clone, Default)]
struct Partition {
    /// Symmetric: the side of each node and client.
    node_side: Vec<u8>,
    client_side: Vec<u8>,
    /// One-way blocks between nodes: (from, to).
    one_way: Vec<(usize, usize)>,
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub steps: u64,
    pub node_turns: u64,
    pub grants: u64,
    pub client_grants: u64,
    pub failovers: u64,
    pub handoffs: u64,
    pub demotions: u64,
    pub faults: BTreeMap<&'static str, u64>,
    pub me_excused: u64,
    /// Grants lost where a fault excuses it (check 7).
    pub lost_excused: u64,
    /// Longest a node's loop would have spun (deadline in the past), ms.
    pub spin_ms_max: u64,
    pub sim_ms: u64,
    /// TLS handshakes not done by their deadline ([`Driver::due_handshake`]).
    pub handshakes_expired: u64,
    /// Accepts the kernel failed, and retries once the driver said so.
    pub accepts_failed: u64,
    pub accepts_retried: u64,
    /// Sockets [`Driver::admit`] refused, and took only for a peer.
    pub refused: u64,
    pub peer_only: u64,
    /// Client connections taken into the peers' reserve whose client read
    /// the documented `E too many connections: ...` line.
    pub clients_refused: u64,
    /// Lingering connections the driver closed at their deadline.
    pub lingered: u64,
    /// SIGTERMs through [`Driver::shut_down`], and the loops that then
    /// ended once [`Driver::finished`].
    pub shutdowns: u64,
    pub finished: u64,
    /// TLS client connections whose handshake the client finished, and
    /// those on which it read the node's `close_notify`.
    pub tls_handshakes: u64,
    pub tls_close_notifies: u64,
    /// Peer links whose TLS handshake the node that dialed finished, and
    /// the peer lines nodes read decrypted on TLS links (and checked).
    pub peer_tls_handshakes: u64,
    pub peer_tls_lines: u64,
    /// Reads of a link read in batches ([`NextRead::At`]) that found bytes,
    /// and those that found none and ended the batching.
    pub batched_reads: u64,
    pub batches_ended: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.node_turns += o.node_turns;
        self.grants += o.grants;
        self.client_grants += o.client_grants;
        self.failovers += o.failovers;
        self.handoffs += o.handoffs;
        self.demotions += o.demotions;
        for (k, v) in &o.faults {
            *self.faults.entry(k).or_default() += v;
        }
        self.me_excused += o.me_excused;
        self.lost_excused += o.lost_excused;
        self.spin_ms_max = self.spin_ms_max.max(o.spin_ms_max);
        self.sim_ms += o.sim_ms;
        self.handshakes_expired += o.handshakes_expired;
        self.accepts_failed += o.accepts_failed;
        self.accepts_retried += o.accepts_retried;
        self.refused += o.refused;
        self.clients_refused += o.clients_refused;
        self.peer_only += o.peer_only;
        self.lingered += o.lingered;
        self.shutdowns += o.shutdowns;
        self.finished += o.finished;
        self.tls_handshakes += o.tls_handshakes;
        self.tls_close_notifies += o.tls_close_notifies;
        self.peer_tls_handshakes += o.peer_tls_handshakes;
        self.peer_tls_lines += o.peer_tls_lines;
        self.batched_reads += o.batched_reads;
        self.batches_ended += o.batches_ended;
    }
}

pub struct Sim {
    /// The replicated releases (key, token) in the peer lines of the TLS
    /// read being fed to a node: check 3 does not count them as lost.
    released_in_op: BTreeSet<(Vec<u8>, u64)>,
    pub seed: u64,
    pub cfg: SimConfig,
    rng: Rng,
    pub now: u64,
    end: u64,
    nodes: Vec<NodeSlot>,
    conns: Vec<Option<SimConn>>,
    dials: Vec<Dial>,
    clients: Vec<Client>,
    partition: Option<Partition>,
    windows: Vec<Window>,
    /// Last time the network or the set of nodes changed (a fault began or
    /// ended); "healed" counts from here.
    last_disturbance: u64,
    /// Last time exactly one node was active.
    last_one_active: u64,
    /// Whether exactly one node was active after the last step.
    one_active_at_last_step: bool,
    /// Since when the network has been whole (no partition, no hang) with
    /// exactly one active, unbroken: the cluster has agreed on one active.
    agreed_since: Option<u64>,
    beliefs: Vec<Belief>,
    /// Every grant by issue time: (ms, token, node).
    issued: VecDeque<(u64, u64, usize)>,
    /// Max token of those popped off `issued` (older than the drift bound).
    issued_old_max: u64,
    /// Check 2: which node issued each token.
    issued_by: BTreeMap<u64, usize>,
    issued_max: u64,
    /// Scheduled scenario events.
    next_fault: u64,
    restarts: Vec<(u64, usize)>,
    heal_at: Option<u64>,
    /// A one-way block that heals before the rest: `(when, from, to)`.
    staggered: Option<(u64, usize, usize)>,
    flaps: Vec<u64>,
    /// After a graceful leave: (successor, deadline to be active).
    leave_check: Option<(usize, u64, usize)>,
    probes: Vec<Option<u64>>,
    probe_sent: bool,
    replicas_matched: bool,
    log: VecDeque<String>,
    log_all: bool,
    /// Log every line a node reads too (RINGLOCK_SIM_LOG=wire).
    log_wire: bool,
    failure: Option<String>,
    pub stats: Stats,
    /// How long a node's loop may spin (its deadline left in the past)
    /// before that fails the run. Any spin burns a core; short ones at a
    /// node's start (until it hears the active) are tolerated by default.
    pub spin_limit_ms: u64,
    dirty: Vec<ConnId>,
    dial_buf: Vec<(PeerId, String)>,
    /// How many bytes a socket holds that its reader has not read yet (in
    /// flight or in its receive buffer): a sender with that many outstanding
    /// sends no more until the reader reads.
    socket_buf: usize,
    /// `--max-conns` of every node started from now on.
    max_conns: usize,
    /// How many strangers have connected.
    strangers: usize,
    /// Replaying a model checker's trace (see [`replay`]): no random
    /// delays, resets or clocks, the model's timers and incarnations.
    replaying: Option<Box<replay::State>>,
}

/// The default [`Sim::max_conns`]: more than any run opens.
const MAX_CONNS: usize = 1 << 16;

/// Whether `line` is one of the two `E` lines a connection taken beyond
/// `--max-conns` (into the peers' reserve) may get: a client request on it,
/// or no peer handshake within the peer timeout (docs/protocol.md).
fn is_refusal(line: &[u8]) -> bool {
    const REQUEST: &[u8] =
        b"E too many connections: this one was taken beyond --max-conns for a peer in line ";
    const TIMEOUT: &[u8] =
        b"E too many connections: a connection beyond --max-conns must be a peer";
    line == TIMEOUT
        || line
            .strip_prefix(REQUEST)
            .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
}

/// The default [`Sim::socket_buf`]: far more than the random runs ever
/// have outstanding on one connection.
const SOCKET_BUF_BYTES: usize = 256 * 1024;

/// What a scripted test can see of one client connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnView {
    /// The node's end is open (serving, closing or lingering).
    pub node_open: bool,
    pub node_phase: Option<Phase>,
    /// Bytes sent to the node that it has not read.
    pub unread_by_node: usize,
    /// Bytes sent to the client that it has not read.
    pub unread_by_client: usize,
}

const LOG_KEEP: usize = 400;

/// Slack for check 7: a release or renewal sent this close to its lease's
/// end may arrive after it (two deliveries: the request may wait behind a
/// retransmission).
const LOST_MARGIN_MS: u64 = 2 * MAX_DELAY_MS;

impl Sim {
    #[expect(clippy::too_many_lines)]
    pub fn new(seed: u64, cfg: SimConfig) -> Sim {
        let mut rng = Rng::new(seed);
        let n = cfg.nodes;
        let mut nodes = Vec::new();
        for _ in 0..n {
            let drift_ms = cfg.drift_ms as i64;
            let drift_ns = if drift_ms == 0 {
                0
            } else {
                (rng.range(0, 2 * drift_ms as u64 * 1_000_000) as i64) - drift_ms * 1_000_000
            };
            nodes.push(NodeSlot {
                inc: None,
                generation: 0,
                drift_ns,
                hung_until: None,
                hung_since: 0,
                last_token: 0,
            });
        }
        let end = T0 + cfg.chaos_ms + cfg.settle_ms;
        let log_all = std::env::var_os("RINGLOCK_SIM_LOG").is_some();
        let mut sim = Sim {
            released_in_op: BTreeSet::new(),
            seed,
            rng,
            now: T0,
            end,
            nodes,
            conns: Vec::new(),
            dials: Vec::new(),
            clients: Vec::new(),
            partition: None,
            windows: Vec::new(),
            last_disturbance: T0,
            last_one_active: T0,
            one_active_at_last_step: false,
            beliefs: Vec::new(),
            agreed_since: None,
            issued: VecDeque::new(),
            issued_old_max: 0,
            issued_by: BTreeMap::new(),
            issued_max: 0,
            next_fault: u64::MAX,
            restarts: Vec::new(),
            heal_at: None,
            staggered: None,
            flaps: Vec::new(),
            leave_check: None,
            probes: vec![None; cfg.clients],
            probe_sent: false,
            replicas_matched: false,
            log: VecDeque::new(),
            log_all,
            log_wire: std::env::var("RINGLOCK_SIM_LOG").is_ok_and(|v| v == "wire"),
            failure: None,
            stats: Stats::default(),
            spin_limit_ms: 2 * HEARTBEAT_MS,
            dirty: Vec::new(),
            dial_buf: Vec::new(),
            socket_buf: SOCKET_BUF_BYTES,
            max_conns: MAX_CONNS,
            strangers: 0,
            replaying: None,
            cfg,
        };
        let drifts: Vec<String> = sim
            .nodes
            .iter()
            .map(|s| format!("{:+}ms", s.drift_ns / 1_000_000))
            .collect();
        let line = format!("seed {seed}: {:?}, drifts {drifts:?}", sim.cfg);
        sim.log(line);
        for i in 0..sim.cfg.nodes {
            sim.start_node(i);
        }
        for _ in 0..sim.cfg.clients {
            let target = sim.rng.below(sim.cfg.nodes as u64) as usize;
            sim.clients.push(Client {
                conns: vec![None; sim.cfg.nodes],
                reconnect_at: vec![Some(T0); sim.cfg.nodes],
                outstanding: BTreeMap::new(),
                target,
                next_action: T0 + 200 + sim.rng.range(0, 300),
                held: BTreeMap::new(),
                busy: BTreeSet::new(),
                retries: Vec::new(),
                answers: Vec::new(),
                reading: true,
                expects_error: false,
                partial: BTreeMap::new(),
                releasing: BTreeMap::new(),
                resent_releases: BTreeSet::new(),
                tls: BTreeMap::new(),
            });
        }
        if sim.cfg.faults {
            sim.next_fault = T0 + 1_000 + sim.rng.range(0, 1_000);
        }
        sim
    }

    // ----- logging and failing -----

    fn log(&mut self, line: String) {
        let line = format!("{:>6} {line}", self.now);
        if self.log_all {
            eprintln!("{line}");
        }
        if self.log.len() == LOG_KEEP {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    fn fail(&mut self, what: String) {
        if self.failure.is_none() {
            self.log(format!("VIOLATION: {what}"));
            self.failure = Some(what);
        }
    }

    /// The failure, with the seed and the tail of the event log.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cluster simulation failed: seed {} at t={} ms: {}",
            self.seed,
            self.now,
            self.failure.as_deref().unwrap_or("?")
        );
        let _ = writeln!(
            out,
            "replay: RINGLOCK_SIM_SEED={} cargo test --test cluster_sim random_seeds -- --nocapture \
             (RINGLOCK_SIM_LOG=1 for the whole log)",
            self.seed
        );
        let _ = writeln!(out, "last {} events:", self.log.len());
        for l in &self.log {
            let _ = writeln!(out, "  {l}");
        }
        out
    }

    pub fn failed(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    // ----- time -----

    fn node_now(&self, x: usize) -> Now {
        let slot = &self.nodes[x];
        let inc = slot.inc.as_ref().expect("node is up");
        Now {
            ms: self.now + inc.ms_offset,
            us: (self.now + inc.ms_offset) * 1000,
            unix_ns: (EPOCH_NS as i64 + (self.now as i64) * 1_000_000 + slot.drift_ns) as u64,
        }
    }

    fn delay(&mut self) -> u64 {
        if self.replaying.is_some() {
            return 0;
        }
        // Mostly short, sometimes up to the maximum.
        if self.rng.chance(80) {
            self.rng.range(0, 5)
        } else {
            self.rng.range(0, MAX_DELAY_MS)
        }
    }

    // ----- node life -----

    fn start_node(&mut self, x: usize) {
        assert!(self.nodes[x].inc.is_none());
        let generation = self.nodes[x].generation + 1;
        let (incarnation, ms_offset, heartbeat_ms, peer_timeout_ms) = match &self.replaying {
            Some(r) => (
                replay::incarnation(x, generation),
                0,
                r.timing.heartbeat_ms,
                r.timing.peer_timeout_ms,
            ),
            None => (
                self.rng.next_u64() | 1,
                self.rng.range(0, 10_000_000),
                HEARTBEAT_MS,
                PEER_TIMEOUT_MS,
            ),
        };
        self.nodes[x].generation = generation;
        let peers: Vec<String> = (0..self.cfg.nodes).map(addr).collect();
        let now_ms = self.now + ms_offset;
        let slot = &self.nodes[x];
        let now = Now {
            ms: now_ms,
            us: now_ms * 1000,
            unix_ns: (EPOCH_NS as i64 + (self.now as i64) * 1_000_000 + slot.drift_ns) as u64,
        };
        let node = Node::new(
            now,
            NodeConfig {
                advertise: addr(x),
                cluster: Some(ClusterConfig {
                    peers,
                    me: PeerId(x),
                    heartbeat_ms,
                    peer_timeout_ms,
                    failback_delay_ms: self.cfg.failback_delay_ms,
                    incarnation,
                    secret: Secret::from_bytes(b"the simulated cluster's secret, 32+ bytes"),
                    read_batch_us: self.cfg.read_batch_us,
                }),
                max_locks: ringlock::engine::DEFAULT_MAX_LOCKS,
            },
        );
        let role = node.role();
        self.nodes[x].inc = Some(Inc {
            node,
            generation,
            incarnation,
            ms_offset,
            started: self.now,
            conns: BTreeMap::new(),
            lives: BTreeMap::new(),
            not_reading: BTreeSet::new(),
            batched_later: BTreeSet::new(),
            unsent: BTreeSet::new(),
            scan_pos: BTreeMap::new(),
            next_cid: 0,
            free_cids: BTreeSet::new(),
            accepts: Vec::new(),
            seen_max: 0,
            role,
            wake_at: Some(self.now),
            last_turn: 0,
            spinning_since: None,
            driver: Driver::new(self.max_conns, Some(HANDSHAKE_MS)),
            accept_paused: false,
            fail_accepts: 0,
            links_out: BTreeMap::new(),
            client_partial: BTreeMap::new(),
        });
        self.nodes[x].hung_until = None;
        self.log(format!(
            "n{x} starts (generation {generation}, incarnation {incarnation})"
        ));
    }

    /// Node `x`'s process runs (shutting down, too).
    pub fn up(&self, x: usize) -> bool {
        self.nodes[x].inc.is_some()
    }

    fn runs(&self, x: usize) -> bool {
        self.up(x) && self.nodes[x].hung_until.is_none()
    }

    /// A connection id of node `x` for `sc`, with a plain lifecycle.
    fn alloc_cid(&mut self, x: usize, sc: usize) -> ConnId {
        self.alloc_cid_with(x, sc, Lifecycle::new())
    }

    /// A connection id of node `x` for `sc`, which takes a slot as the
    /// loops' connections do: [`Driver::opened`] (a TLS lifecycle starts
    /// its handshake deadline there).
    fn alloc_cid_with(&mut self, x: usize, sc: usize, life: Lifecycle) -> ConnId {
        let now_ms = self.node_now(x).ms;
        let inc = self.nodes[x].inc.as_mut().unwrap();
        // (A replay numbers connections as the model does: no reuse.)
        let reuse = self.replaying.is_none();
        let cid = match inc.free_cids.pop_first().filter(|_| reuse) {
            Some(c) => c,
            None => {
                inc.next_cid += 1;
                ConnId::new(inc.next_cid - 1)
            }
        };
        inc.driver.opened(now_ms, cid, life.is_tls());
        inc.conns.insert(cid, sc);
        inc.lives.insert(cid, life);
        inc.scan_pos.insert(cid, 0);
        cid
    }

    fn free_cid(&mut self, x: usize, cid: ConnId) {
        let inc = self.nodes[x].inc.as_mut().unwrap();
        inc.conns.remove(&cid);
        inc.lives.remove(&cid);
        inc.not_reading.remove(&cid);
        inc.unsent.remove(&cid);
        inc.scan_pos.remove(&cid);
        inc.free_cids.insert(cid);
    }

    /// Runs one call into node `x` and then checks what it did: role
    /// changes (and that a promoted standby kept its grants), grants issued
    /// (tokens), `E` lines.
    fn op<R>(&mut self, x: usize, what: &str, f: impl FnOnce(&mut Node, Now) -> R) -> R {
        self.op_inc(x, what, |inc, now| f(&mut inc.node, now))
    }

    /// [`Sim::op`] with the whole incarnation (the node and its
    /// connections' lifecycles).
    fn op_inc<R>(&mut self, x: usize, what: &str, f: impl FnOnce(&mut Inc, Now) -> R) -> R {
        let now = self.node_now(x);
        let inc = self.nodes[x].inc.as_mut().unwrap();
        let before = inc.role;
        debug_assert_eq!(before, inc.node.role());
        let grants: Option<Vec<(Vec<u8>, u64, u64)>> = (before != Role::Active).then(|| {
            let engine = inc.node.engine();
            engine
                .grants()
                .chain(engine.member_grants())
                .map(|(k, t, e)| (k.to_vec(), t, e))
                .collect()
        });
        let r = f(inc, now);
        self.after_op(x, what, before, grants, now);
        r
    }

    fn after_op(
        &mut self,
        x: usize,
        what: &str,
        before: Role,
        grants_before: Option<Vec<(Vec<u8>, u64, u64)>>,
        now: Now,
    ) {
        let inc = self.nodes[x].inc.as_mut().unwrap();
        let role = inc.node.role();
        if role != before {
            inc.role = role;
            let mut lost = Vec::new();
            if role == Role::Active {
                let engine = inc.node.engine();
                for (k, tok, exp) in grants_before.iter().flatten() {
                    // The key's grant, or one of its shared grants or
                    // permits.
                    let kept = engine.holder(k).map(|h| h.0) == Some(*tok)
                        || engine.members_of(k).iter().any(|m| m.0 == *tok);
                    let released = self.released_in_op.contains(&(k.clone(), *tok));
                    if *exp > now.ms && !kept && !released {
                        lost.push(format!("{} {tok}", show(k)));
                    }
                }
            }
            self.log(format!("n{x} {before:?} -> {role:?} ({what})"));
            match (before, role) {
                (_, Role::Active) => self.stats.failovers += 1,
                (Role::Active, _) => self.stats.demotions += 1,
                _ => {}
            }
            if !lost.is_empty() {
                self.fail(format!(
                    "check 3: n{x} became active ({what}) without grants it had applied: {lost:?}"
                ));
            }
        }
        self.scan_outputs(x);
    }

    /// Looks at the bytes node `x` wrote since the last scan: grants to
    /// clients and `E` lines. They are in the node's outbox or, once the
    /// connection began closing (maybe in the very call that wrote them, as
    /// a protocol break does), in its lifecycle's last answers.
    fn scan_outputs(&mut self, x: usize) {
        let mut found: Vec<(bool, Vec<u8>)> = Vec::new();
        {
            let inc = self.nodes[x].inc.as_mut().unwrap();
            let cids: Vec<(ConnId, usize)> = inc.conns.iter().map(|(&c, &s)| (c, s)).collect();
            for (cid, sc) in cids {
                let pos = inc.scan_pos.get(&cid).copied().unwrap_or(0);
                let out: &[u8] = match inc.lives.get(&cid).map(Lifecycle::last_answers) {
                    Some(last) if !last.is_empty() => last,
                    _ => inc.node.output_mut(cid),
                };
                if out.len() <= pos {
                    continue;
                }
                let Some(last_nl) = memchr_last(&out[pos..]) else {
                    continue;
                };
                let peer = self.conns[sc].as_ref().is_some_and(|c| c.peer_link);
                let expected = match self.conns[sc].as_ref().map(|c| c.parties[0]) {
                    Some(Party::Client(c)) => self.clients[c].expects_error,
                    // Not a client of ours: what it is told is not checked.
                    Some(Party::Stranger(_)) => true,
                    _ => false,
                };
                for line in out[pos..pos + last_nl].split(|&b| b == b'\n') {
                    if line.starts_with(b"A ") || (line.starts_with(b"E ") && !expected) {
                        found.push((peer, line.to_vec()));
                    }
                }
                inc.scan_pos.insert(cid, pos + last_nl + 1);
            }
        }
        // Grants made by one call on several connections: the order between
        // connections is not observable, the order of tokens is.
        found.sort_by_key(|(_, line)| {
            let tok = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
            (line.starts_with(b"A "), tok.len(), tok.to_vec())
        });
        for (peer, line) in found {
            // A link the node gave up on (a handshake that a fault cut, a
            // peer silent for a whole timeout, a rival active that does not
            // hear it, its own links after it stalled for long enough to
            // be counted dead) ends with an E line saying so: not a
            // protocol error.
            let given_up = [
                &b"peer handshake not finished"[..],
                b"did not answer this node's HELLO",
                b"silent for",
                b"does not hear this link",
                b"may have closed this link",
                b"its older link is closed",
                // Taken into the peers' reserve past a low `--max-conns`,
                // and not authenticated in time (a fault cut it).
                b"a connection beyond --max-conns must be a peer",
            ]
            .iter()
            .any(|why| line.windows(why.len()).any(|w| w == *why));
            // A client connection taken beyond a low `--max-conns` is
            // refused with an E line (checked where the client reads it).
            let refusal = !peer && self.max_conns < MAX_CONNS && is_refusal(&line);
            if line.starts_with(b"E ") && !(peer && given_up) && !refusal {
                let kind = if peer {
                    "peer link"
                } else {
                    "client connection"
                };
                self.fail(format!("check 5: n{x} broke a {kind}: {}", show(&line)));
            } else if !peer && line.starts_with(b"A ") {
                let mut f = line.split(|&b| b == b' ');
                f.next();
                let key = f.next().unwrap_or_default().to_vec();
                let token: u64 = std::str::from_utf8(f.next().unwrap_or_default())
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                self.record_grant(x, &key, token);
            }
        }
    }

    /// Check 2: the tokens.
    fn record_grant(&mut self, x: usize, key: &[u8], token: u64) {
        self.stats.grants += 1;
        let t = self.now;
        let slot = &self.nodes[x];
        let inc = slot.inc.as_ref().unwrap();
        let (last, seen) = (slot.last_token, inc.seen_max);
        self.log(format!("n{x} grants {} {token}", show(key)));
        if token <= last {
            self.fail(format!(
                "check 2: n{x} issued token {token} after its own {last}"
            ));
        }
        if token <= seen {
            self.fail(format!(
                "check 2: n{x} issued token {token}, not above the {seen} it had read from peers"
            ));
        }
        // The wall-clock half of the rule: anything issued more than twice
        // the drift bound ago is below.
        let horizon = t.saturating_sub(2 * self.cfg.drift_ms + 1);
        while self.issued.front().is_some_and(|&(ms, _, _)| ms < horizon) {
            let (_, tok, _) = self.issued.pop_front().unwrap();
            self.issued_old_max = self.issued_old_max.max(tok);
        }
        if token <= self.issued_old_max {
            let old = self.issued_old_max;
            self.fail(format!(
                "check 2: n{x} issued token {token}, below {old} issued more than {} ms ago",
                2 * self.cfg.drift_ms
            ));
        }
        // Healed and settled: above everything ever issued.
        if self.healed_for() > SETTLE_MS && token <= self.issued_max {
            let max = self.issued_max;
            self.fail(format!(
                "check 2: n{x} issued token {token} in a settled cluster, below {max} issued before"
            ));
        }
        // One token names one grant of one node: two actives of a split
        // brain never issue the same one, or the merge at the heal could
        // not tell their grants apart.
        if let Some(&other) = self.issued_by.get(&token).filter(|&&y| y != x) {
            self.fail(format!(
                "check 2: n{x} issued token {token}, which n{other} issued too"
            ));
        }
        self.issued_by.insert(token, x);
        self.issued.push_back((t, token, x));
        self.issued_max = self.issued_max.max(token);
        self.nodes[x].last_token = self.nodes[x].last_token.max(token);
    }

    // ----- connections -----

    fn new_conn(&mut self, parties: [Party; 2], peer_link: bool) -> usize {
        let gen_of = |p: Party, nodes: &[NodeSlot]| match p {
            Party::Node(x) => nodes[x].generation,
            Party::Client(_) | Party::Stranger(_) => 0,
        };
        let gens = [
            gen_of(parties[0], &self.nodes),
            gen_of(parties[1], &self.nodes),
        ];
        let rto_ms = self.rng.range(300, 2_000);
        self.conns.push(Some(SimConn {
            parties,
            gens,
            cids: [None, None],
            open: [true, true],
            close_at: [None, None],
            pipes: [Pipe::default(), Pipe::default()],
            peer_link,
            rto_ms,
            dead: false,
            silent: matches!(parties[0], Party::Stranger(_)),
            accepted_ms: None,
            tls_trace: Default::default(),
        }));
        self.conns.len() - 1
    }

    /// Queues a segment from end `e` of `sc`. Bytes for an end that is
    /// closed bounce: the sender gets a reset a round trip later.
    fn send(&mut self, sc: usize, e: usize, seg: Seg) {
        let at = self.now + self.delay();
        let conn = self.conns[sc].as_ref().unwrap();
        let through = !self.blocked(conn.parties[e], conn.parties[1 - e]);
        if (conn.dead || !conn.open[1 - e]) && through {
            let back = at + self.delay();
            let conn = self.conns[sc].as_mut().unwrap();
            if conn.open[e] && conn.close_at[e].is_none_or(|c| c > back) {
                conn.close_at[e] = Some(back);
            }
            return;
        }
        if conn.dead {
            return; // lost in the partition; the sender times out
        }
        let conn = self.conns[sc].as_mut().unwrap();
        let pipe = &mut conn.pipes[e];
        let at = at.max(pipe.last_at);
        pipe.last_at = at;
        if let Seg::Rst = seg {
            // A reset overtakes and drops whatever was still in flight;
            // what has arrived is in the receiver's socket, which reads it
            // before it learns of the reset (as Linux does).
            let now = self.now;
            pipe.segs.retain(|&(at, _)| at <= now);
        }
        pipe.segs.push_back((at, seg));
    }

    /// Whether node `x`'s bytes to node `s` on a peer link are stuck or
    /// wait for TCP's next retransmission (a partition between them healed
    /// since, but this link has not sent again yet).
    fn backing_off(&self, x: usize, s: usize) -> bool {
        self.conns.iter().flatten().any(|conn| {
            conn.peer_link
                && (0..2).any(|e| {
                    conn.parties[e] == Party::Node(x)
                        && conn.parties[1 - e] == Party::Node(s)
                        && conn.gens[e] == self.nodes[x].generation
                        && conn.open[e]
                        && (conn.pipes[e].stuck_since.is_some()
                            || conn.pipes[e].resume_at.is_some_and(|at| at > self.now))
                })
        })
    }

    fn blocked(&self, from: Party, to: Party) -> bool {
        let Some(p) = &self.partition else {
            return false;
        };
        let side = |q: Party| match q {
            Party::Node(x) => p.node_side.get(x).copied().unwrap_or(0),
            Party::Client(c) => p.client_side.get(c).copied().unwrap_or(0),
            Party::Stranger(_) => 0,
        };
        if side(from) != side(to) {
            return true;
        }
        match (from, to) {
            (Party::Node(a), Party::Node(b)) => p.one_way.contains(&(a, b)),
            _ => false,
        }
    }

    /// Can end `1 - e` of `sc` take in a segment now?
    fn can_receive(&self, conn: &SimConn, e: usize) -> bool {
        let r = 1 - e;
        if !conn.open[r] {
            return false; // its pipe was emptied when it closed
        }
        if self.blocked(conn.parties[e], conn.parties[r]) {
            return false;
        }
        if conn.pipes[e].resume_at.is_some_and(|at| at > self.now) {
            return false; // waiting for the sender's next retransmission
        }
        match conn.parties[r] {
            Party::Client(c) => self.clients[c].reading,
            Party::Stranger(_) => true,
            Party::Node(y) => {
                conn.cids[r].is_some_and(|cid| {
                    self.nodes[y].inc.as_ref().is_some_and(|i| {
                        i.generation == conn.gens[r] && !i.not_reading.contains(&cid)
                    })
                }) && self.nodes[y].hung_until.is_none()
            }
        }
    }

    /// The end of `sc` that belongs to node `x` (current incarnation).
    fn end_of(&self, sc: usize, x: usize) -> usize {
        let conn = self.conns[sc].as_ref().unwrap();
        if conn.parties[1] == Party::Node(x) && conn.gens[1] == self.nodes[x].generation {
            1
        } else {
            0
        }
    }

    fn drop_if_done(&mut self, sc: usize) {
        if self.conns[sc]
            .as_ref()
            .is_some_and(|c| !c.open[0] && !c.open[1])
        {
            self.conns[sc] = None;
        }
    }

    /// Runs `f` on the lifecycle of node `x`'s connection `cid` as one
    /// call into the node (checked like any, see [`Sim::op`]).
    fn with_life<R>(
        &mut self,
        x: usize,
        cid: ConnId,
        what: &str,
        f: impl FnOnce(&mut Lifecycle, &mut Node, Now) -> R,
    ) -> Option<R> {
        if !self.nodes[x].inc.as_ref()?.lives.contains_key(&cid) {
            return None;
        }
        Some(self.op_inc(x, what, |inc, now| {
            let life = inc.lives.get_mut(&cid).expect("checked above");
            f(life, &mut inc.node, now)
        }))
    }

    /// Bytes queued from end `e` of `sc` that the other end has not read.
    fn queued(&self, sc: usize, e: usize) -> usize {
        self.conns[sc].as_ref().map_or(0, |c| {
            c.pipes[e]
                .segs
                .iter()
                .map(|(_, seg)| match seg {
                    Seg::Data(b, _) => b.len(),
                    Seg::Fin | Seg::Rst => 0,
                })
                .sum()
        })
    }

    /// Sends what node `x`'s lifecycle of `cid` (end `e` of `sc`) has
    /// pending, as far as a socket buffer of `buf` bytes has room; bytes
    /// for a closed other end are lost.
    fn send_out(&mut self, x: usize, sc: usize, e: usize, cid: ConnId, buf: usize) {
        // Records are cut across sends to clients and on peer links (not
        // to strangers: a run without TLS draws as before).
        let cut_records = self.conns[sc]
            .as_ref()
            .is_some_and(|c| c.peer_link || matches!(c.parties[1 - e], Party::Client(_)));
        loop {
            let other_open = self.conns[sc].as_ref().is_some_and(|c| c.open[1 - e]);
            let room = if other_open {
                buf.saturating_sub(self.queued(sc, e))
            } else {
                usize::MAX
            };
            let fresh = self.tls_records_all_sent(sc, e);
            let inc = self.nodes[x].inc.as_mut().unwrap();
            let Some(life) = inc.lives.get_mut(&cid) else {
                return;
            };
            // With TLS, the plaintext `pending` may encrypt: the last
            // answers' and the outbox's (it takes them from the front).
            let plain = life.is_tls().then(|| {
                (
                    life.last_answers().to_vec(),
                    inc.node.output_mut(cid).to_vec(),
                )
            });
            let out = life.pending(&mut inc.node, cid);
            // Sometimes, with TLS, the socket takes only a part (a record
            // cut across two deliveries); the rest goes next round.
            let room = match plain {
                Some(_) if cut_records && out.len() > 1 && self.rng.chance(10) => {
                    room.min(self.rng.range(1, out.len() as u64 - 1) as usize)
                }
                _ => room,
            };
            let n = out.len().min(room);
            let bytes = out[..n].to_vec();
            let out_len = out.len();
            let encrypted = inc.taken_by_pending(cid, plain);
            if out_len > n {
                inc.unsent.insert(cid);
            } else {
                inc.unsent.remove(&cid);
            }
            // Check 9 reads the answers: with TLS, those just encrypted
            // (a TLS peer link's, once the socket has their records).
            if let Some(taken) = &encrypted {
                let handshaking = inc.lives[&cid].is_handshaking();
                if !self.trace_tls_link(sc, e, fresh, out_len, taken, handshaking) {
                    self.check_grants_replicated(x, sc, taken);
                }
            }
            if n == 0 {
                return;
            }
            if encrypted.is_none() {
                self.check_grants_replicated(x, sc, &bytes);
            }
            if other_open {
                self.send(sc, e, Seg::Data(bytes, self.now));
            }
            self.with_life(x, cid, "sent", |life, node, now| {
                life.sent(node, now, cid, n)
            });
            let handed = self.conns[sc]
                .as_mut()
                .map(|c| c.tls_trace[e].handed(n))
                .unwrap_or_default();
            if !handed.is_empty() {
                self.check_grants_replicated(x, sc, &handed);
            }
            // As the loops do: output written after the turn's collection
            // (a resumed stash) may answer grants whose replication is not
            // sent yet; the rest waits for the next flush, links first.
            let inc = self.nodes[x].inc.as_mut().unwrap();
            if inc.node.outbox().has_uncollected() {
                inc.unsent.insert(cid);
                return;
            }
        }
    }

    /// Whether end `e` of `sc` handed all the TLS records its lifecycle
    /// made to the socket: its next `pending` encrypts.
    fn tls_records_all_sent(&self, sc: usize, e: usize) -> bool {
        self.conns[sc]
            .as_ref()
            .is_some_and(|c| c.tls_trace[e].sent == c.tls_trace[e].made)
    }

    /// End `e` of peer link `sc` has `pending` TLS records, the plaintext
    /// `taken` encrypted (or kept by rustls until the handshake is over):
    /// traced for the checks that read peer lines (check 9 at the sender
    /// once the socket has the records, the others at the receiver). False
    /// if `sc` is not a peer link.
    fn trace_tls_link(
        &mut self,
        sc: usize,
        e: usize,
        fresh: bool,
        pending: usize,
        taken: &[u8],
        handshaking: bool,
    ) -> bool {
        let Some(conn) = self.conns[sc].as_mut().filter(|c| c.peer_link) else {
            return false;
        };
        let trace = &mut conn.tls_trace[e];
        let made = trace.sent + pending as u64;
        trace.sending(fresh, made, taken, handshaking);
        true
    }

    /// Check 9: the active hands a grant's answer (`A`, `G` or `C` with a
    /// token) to a client's socket only once the grant is in what it handed
    /// to the socket of each synced follower's link, so a node stopped
    /// between two sends (the kernel delivers what it was given) leaves no
    /// answered grant unknown to its followers. Reads the bytes themselves:
    /// what `x` hands to a peer link is recorded here, what it hands to a
    /// client is checked against that record.
    fn check_grants_replicated(&mut self, x: usize, sc: usize, bytes: &[u8]) {
        let Some(conn) = self.conns[sc].as_ref() else {
            return;
        };
        let peer_link = conn.peer_link;
        let to_client = conn.parties.iter().any(|p| matches!(p, Party::Client(_)));
        let active = self.role(x) == Some(Role::Active);
        let inc = self.nodes[x].inc.as_mut().unwrap();
        if peer_link {
            let link = inc.links_out.entry(sc).or_default();
            for line in complete_lines(&mut link.partial, bytes) {
                match wire::parse(&line) {
                    Ok(wire::PeerMsg::Snapshot { highest }) => {
                        link.snapshot_highest = highest;
                        link.synced = false;
                        link.tokens.clear();
                    }
                    Ok(wire::PeerMsg::Synced) => link.synced = true,
                    Ok(
                        wire::PeerMsg::Grant { token, .. } | wire::PeerMsg::Member { token, .. },
                    ) => {
                        link.tokens.insert(token);
                    }
                    _ => {}
                }
            }
            return;
        }
        if !to_client {
            return;
        }
        let partial = inc.client_partial.entry(sc).or_default();
        let granted: Vec<u64> = complete_lines(partial, bytes)
            .iter()
            .filter_map(|line| match parse_answer(line) {
                Ok(Answer::Granted { token, .. } | Answer::KindGranted { token, .. }) => {
                    (token != 0).then_some(token)
                }
                _ => None,
            })
            .collect();
        if granted.is_empty() || !active {
            return;
        }
        let Some(cluster) = inc.node.cluster() else {
            return;
        };
        let mut missing = Vec::new();
        for (addr, cid, _) in cluster.followers() {
            let Some(link_sc) = inc.conns.get(&cid) else {
                continue;
            };
            // A follower whose snapshot is not all handed yet is not
            // synced: it cannot take over with it.
            let Some(link) = inc.links_out.get(link_sc).filter(|l| l.synced) else {
                continue;
            };
            for &token in &granted {
                if !link.tokens.contains(&token) && token > link.snapshot_highest {
                    missing.push(format!("{token} not on #{link_sc} to {addr}"));
                }
            }
        }
        if !missing.is_empty() {
            self.fail(format!(
                "check 9: n{x} answers grants on #{sc} before it handed their replication to its followers: {missing:?}"
            ));
        }
    }

    /// Node `x` sends what its connection `cid` (end `e` of `sc`) has
    /// pending and does what the lifecycle asks: shut its side (a FIN to the
    /// other end), linger, close.
    fn settle(&mut self, x: usize, sc: usize, e: usize, cid: ConnId) {
        self.settle_within(x, sc, e, cid, self.socket_buf);
    }

    /// [`Sim::settle`] with a socket buffer of `buf` bytes.
    fn settle_within(&mut self, x: usize, sc: usize, e: usize, cid: ConnId, buf: usize) {
        self.send_out(x, sc, e, cid, buf);
        let now_ms = self.node_now(x).ms;
        let Some(step) = self.nodes[x]
            .inc
            .as_mut()
            .unwrap()
            .lives
            .get_mut(&cid)
            .map(|life| life.advance(now_ms))
        else {
            return;
        };
        let other_open = self.conns[sc].as_ref().is_some_and(|c| c.open[1 - e]);
        match step {
            Step::Stay => {}
            Step::Shut { linger_until } => {
                if other_open {
                    self.send(sc, e, Seg::Fin);
                }
                match linger_until {
                    // The driver closes it at its deadline (or the
                    // lifecycle once the other side closes).
                    Some(until) => {
                        let inc = self.nodes[x].inc.as_mut().unwrap();
                        inc.driver.linger(until, cid);
                    }
                    None => self.node_end_closed(x, sc, e, "closed after its last answers"),
                }
            }
            Step::Close => self.node_end_closed(x, sc, e, "closed"),
        }
    }

    /// Node `x`'s end `e` of `sc` is closed: its connection id is free, its
    /// unread input gone.
    fn node_end_closed(&mut self, x: usize, sc: usize, e: usize, why: &str) {
        let cid = self.conns[sc].as_ref().unwrap().cids[e].expect("open at the node");
        self.free_cid(x, cid);
        let conn = self.conns[sc].as_mut().unwrap();
        conn.open[e] = false;
        conn.close_at[e] = None;
        conn.pipes[1 - e].segs.clear();
        let peer_link = conn.peer_link;
        let other = conn.parties[1 - e];
        if peer_link {
            self.log(format!("n{x} closes link #{sc} with {other:?} ({why})"));
        }
        if let Party::Stranger(id) = other {
            // It reads the end of stream and closes too.
            self.log(format!("n{x} closes #{sc} of stranger {id} ({why})"));
            self.stranger_close(sc);
            return;
        }
        self.drop_if_done(sc);
    }

    /// Node `x`'s end `e` of `sc` fails (reset, broken by the network).
    fn node_fail(&mut self, x: usize, sc: usize, e: usize, why: &str) {
        let cid = self.conns[sc].as_ref().unwrap().cids[e].expect("open at the node");
        self.with_life(x, cid, "close", |life, node, now| {
            life.failed(node, now, cid)
        });
        self.node_end_closed(x, sc, e, why);
    }

    /// Recomputes which of node `x`'s connections it would not read now:
    /// paused ones, and links read in batches whose next read is later
    /// ([`Sim::batch_reads_later`]).
    fn refresh_reading(&mut self, x: usize) {
        let Some(inc) = self.nodes[x].inc.as_mut() else {
            return;
        };
        inc.not_reading.clear();
        for (&cid, life) in &inc.lives {
            if inc.batched_later.contains(&cid) || !life.wants_read(inc.node.outbox(), cid) {
                inc.not_reading.insert(cid);
            }
        }
    }

    /// Notes which of node `x`'s links read in batches have their next read
    /// after now. Taken before a turn reads and kept through it: a batch's
    /// read takes everything the socket holds, as the loops' reads do, not
    /// only its first segment.
    fn batch_reads_later(&mut self, x: usize) {
        let Some(inc) = self.nodes[x].inc.as_mut() else {
            return;
        };
        let now_us = (self.now + inc.ms_offset) * 1000;
        inc.batched_later.clear();
        for (&cid, life) in &inc.lives {
            if matches!(life.next_read(), NextRead::At(at) if at > now_us) {
                inc.batched_later.insert(cid);
            }
        }
    }

    /// Node `x` read every connection due this turn: a link read in batches
    /// whose read was due and found nothing (its time has not moved on) is
    /// quiet, and waits on its socket again.
    fn batch_reads_found_nothing(&mut self, x: usize) {
        let now_us = self.node_now(x).us;
        let inc = self.nodes[x].inc.as_mut().unwrap();
        for life in inc.lives.values_mut() {
            if matches!(life.next_read(), NextRead::At(at) if at <= now_us) {
                life.read_nothing();
                self.stats.batches_ended += 1;
            }
        }
    }

    /// The first millisecond (sim time) at which node `x` reads a link it
    /// reads in batches, if it has one.
    fn batch_read_deadline(inc: &Inc) -> Option<u64> {
        inc.lives
            .values()
            .filter_map(|life| match life.next_read() {
                NextRead::At(at) => Some(at.div_ceil(1000).saturating_sub(inc.ms_offset)),
                NextRead::Waiting => None,
            })
            .min()
    }

    /// The reader of end `1 - e` of `sc` took a segment: a node that was
    /// waiting for room in that socket may send again.
    fn made_room(&mut self, sc: usize, e: usize) {
        let Some(conn) = self.conns[sc].as_ref() else {
            return;
        };
        let (Party::Node(y), Some(cid)) = (conn.parties[e], conn.cids[e]) else {
            return;
        };
        let generation = conn.gens[e];
        let now = self.now;
        if let Some(inc) = self.nodes[y].inc.as_mut()
            && inc.generation == generation
            && inc.unsent.contains(&cid)
        {
            inc.wake_at = Some(inc.wake_at.map_or(now, |w| w.min(now)));
        }
    }

    // ----- faults -----

    fn disturb(&mut self) {
        self.last_disturbance = self.now;
    }

    fn open_window(&mut self, kind: &'static str) -> usize {
        *self.stats.faults.entry(kind).or_default() += 1;
        self.windows.push(Window {
            kind,
            start: self.now,
            end: u64::MAX,
            survivors: None,
        });
        self.disturb();
        self.windows.len() - 1
    }

    fn close_window(&mut self, w: usize) {
        self.windows[w].end = self.now + SETTLE_MS;
        self.disturb();
    }

    /// Crashes node `x`: the kernel closes its sockets. A peer reading from
    /// it gets the bytes in flight and then a FIN; a connection with unread
    /// input at `x` is reset (the bytes in flight from `x` are lost).
    pub fn crash(&mut self, x: usize) {
        let Some(inc) = self.nodes[x].inc.take() else {
            return;
        };
        let was_active = inc.role == Role::Active;
        self.log(format!("CRASH n{x} (was {:?})", inc.role));
        self.crash_window(x, if was_active { "crash-active" } else { "crash" });
        self.nodes[x].hung_until = None;
        let generation = inc.generation;
        drop(inc);
        self.kernel_closes(x, generation);
    }

    /// The process of node `x` (its `generation`) crashed: the kernel
    /// closes its sockets. A peer reading from it gets the bytes in flight
    /// and then a FIN; a connection with unread input at `x` is reset (and
    /// now and then one without).
    fn kernel_closes(&mut self, x: usize, generation: u64) {
        self.dials.retain(|d| d.node != x);
        for sc in 0..self.conns.len() {
            let Some(conn) = self.conns[sc].as_ref() else {
                continue;
            };
            let Some(e) =
                (0..2).find(|&e| conn.parties[e] == Party::Node(x) && conn.gens[e] == generation)
            else {
                continue;
            };
            if !conn.open[e] {
                continue;
            }
            let unread = !conn.pipes[1 - e].segs.is_empty();
            // (A replay closes as the model does: a FIN after the bytes.)
            let rst = self.replaying.is_none() && (unread || self.rng.chance(20));
            let conn = self.conns[sc].as_mut().unwrap();
            conn.open[e] = false;
            conn.close_at[e] = None;
            conn.pipes[1 - e].segs.clear();
            if conn.open[1 - e] {
                self.send(sc, e, if rst { Seg::Rst } else { Seg::Fin });
            }
            self.drop_if_done(sc);
        }
    }

    /// A window in which node `x`'s grants that no other running node has
    /// may be lost: those that not every other running node has. The next
    /// node to take the role keeps what reached it; what was still in
    /// flight to it (the network's delay, a reset that overtook it) is lost
    /// even if it reached another standby, which takes the new active's
    /// snapshot (docs/cluster.md, "What happens when"). A node that loses
    /// what it had is check 3's business.
    fn crash_window(&mut self, x: usize, kind: &'static str) {
        let w = self.open_window(kind);
        self.close_window(w);
        let mut held = (0..self.cfg.nodes)
            .filter(|&y| y != x && self.runs(y))
            .map(|y| {
                // Its monotonic ms to simulated ms.
                let offset = self.node_now(y).ms - self.now;
                let engine = self.nodes[y].inc.as_ref().unwrap().node.engine();
                engine
                    .grants()
                    .chain(engine.member_grants())
                    .map(|(k, t, expires_ms)| ((k.to_vec(), t), expires_ms.saturating_sub(offset)))
                    .collect::<BTreeMap<_, _>>()
            });
        let first = held.next().unwrap_or_default();
        let survivors = held.fold(first, |all, one| {
            all.into_iter()
                .filter_map(|(grant, end)| Some((grant.clone(), end.min(*one.get(&grant)?))))
                .collect()
        });
        self.windows[w].survivors = Some(survivors);
    }

    pub fn restart(&mut self, x: usize) {
        if self.up(x) {
            if self.listens(x) {
                return;
            }
            // Still shutting down: its supervisor kills it.
            self.exit(x);
        }
        self.disturb();
        self.log(format!("RESTART n{x}"));
        self.start_node(x);
    }

    /// SIGSTOP for `ms`, then SIGCONT.
    pub fn hang(&mut self, x: usize, ms: u64) {
        if !self.runs(x) {
            return;
        }
        let inc = self.nodes[x].inc.as_mut().unwrap();
        let role = inc.role;
        // A stopped process runs nothing, so it does not spin either: the
        // busy-loop check starts afresh with its first turn after SIGCONT.
        inc.spinning_since = None;
        self.log(format!("HANG n{x} ({role:?}) for {ms} ms"));
        self.open_window("hang");
        self.nodes[x].hung_until = Some(self.now + ms);
        self.nodes[x].hung_since = self.now;
    }

    fn resume(&mut self, x: usize) {
        self.nodes[x].hung_until = None;
        if let Some(inc) = self.nodes[x].inc.as_mut() {
            inc.wake_at = Some(self.now);
        }
        self.log(format!("RESUME n{x}"));
        if let Some(w) = self
            .windows
            .iter()
            .rposition(|w| w.kind == "hang" && w.end == u64::MAX)
        {
            self.close_window(w);
        }
    }

    /// SIGTERM on node `x`, as the loops take it ([`Driver::shut_down`]):
    /// it leaves (hand-off), closes its listener (the connections not
    /// accepted yet are reset), finishes every connection with its last
    /// output, and turns until [`Driver::finished`]; then the process
    /// exits. Returns the successor.
    pub fn leave(&mut self, x: usize) -> Option<usize> {
        if !self.runs(x) || !self.listens(x) {
            return None;
        }
        self.stats.handoffs += 1;
        self.stats.shutdowns += 1;
        let was = self.nodes[x].inc.as_ref().unwrap().role;
        let leaving = self.op_inc(x, "leave", |inc, now| {
            inc.driver.shut_down(&mut inc.node, now)
        });
        let Some(leaving) = leaving else {
            self.fail(format!("n{x}: the first SIGTERM began no shutdown"));
            return None;
        };
        let to = leaving.successor;
        if let Some(a) = &to
            && was != Role::Active
        {
            self.fail(format!("n{x} was {was:?} and named a successor {a}"));
        }
        let succ = to.as_deref().and_then(|a| node_of_addr(a.as_bytes()));
        self.log(format!("LEAVE n{x} (was {was:?}): successor {to:?}"));
        self.disturb();
        let cut_off = succ
            .is_none_or(|s| self.blocked(Party::Node(x), Party::Node(s)) || self.backing_off(x, s));
        if cut_off && was == Role::Active {
            // Nobody to hand over to, or a successor the hand-off cannot
            // reach (cut off for less than the peer timeout, so the node
            // still counted on it; or just healed, with the link's bytes
            // waiting for TCP's next retransmission, which may come after
            // the successor has given the leaver up): like a crash, the
            // grants no other running node has go with it (docs/cluster.md,
            // "SIGTERM or SIGINT on the active").
            self.crash_window(x, "leave-alone");
        }
        // The listener is closed at once: connections not accepted yet
        // are reset; the dialer's results are dropped.
        let inc = self.nodes[x].inc.as_mut().unwrap();
        let backlog = std::mem::take(&mut inc.accepts);
        inc.accept_paused = false;
        inc.wake_at = Some(self.now);
        self.dials.retain(|d| d.node != x);
        for (_, sc) in backlog {
            if let Some(conn) = self.conns[sc].as_mut() {
                conn.open[1] = false;
                conn.pipes[0].segs.clear();
                if conn.open[0] {
                    self.send(sc, 1, Seg::Rst);
                }
                self.drop_if_done(sc);
            }
        }
        let conns: Vec<(ConnId, usize)> = self.nodes[x]
            .inc
            .as_ref()
            .unwrap()
            .conns
            .iter()
            .map(|(&c, &s)| (c, s))
            .collect();
        for (cid, sc) in conns {
            let e = self.end_of(sc, x);
            self.with_life(x, cid, "close", |life, node, now| {
                life.finish(node, now, cid)
            });
            self.settle(x, sc, e, cid);
        }
        if let (Some(s), Role::Active) = (succ, was) {
            self.leave_check = Some((s, self.now + 2 * MAX_DELAY_MS + 5, x));
        }
        succ
    }

    /// After a SIGTERM, once [`Driver::finished`]: the process exits, and
    /// the kernel closes what is still open (a FIN after the bytes in
    /// flight, a reset if input was left unread).
    pub fn exit(&mut self, x: usize) {
        let Some(inc) = self.nodes[x].inc.take() else {
            return;
        };
        let open = inc.conns.len();
        self.log(format!("n{x} exits ({open} connections still open)"));
        self.nodes[x].hung_until = None;
        self.dials.retain(|d| d.node != x);
        for (cid, &sc) in &inc.conns {
            let Some(conn) = self.conns[sc].as_mut() else {
                continue;
            };
            let e =
                usize::from(conn.parties[1] == Party::Node(x) && conn.gens[1] == inc.generation);
            // A lingering connection has sent its FIN already.
            let shut = inc.lives[cid].linger_until().is_some();
            let unread = !conn.pipes[1 - e].segs.is_empty();
            conn.open[e] = false;
            conn.close_at[e] = None;
            conn.pipes[1 - e].segs.clear();
            if conn.open[1 - e] {
                if unread && self.replaying.is_none() {
                    self.send(sc, e, Seg::Rst);
                } else if !shut {
                    self.send(sc, e, Seg::Fin);
                }
            }
            self.drop_if_done(sc);
        }
    }

    /// Symmetric partition: `side[i]` for each node; clients are put on a
    /// side at random.
    pub fn partition(&mut self, node_side: Vec<u8>) {
        let client_side = (0..self.cfg.clients)
            .map(|_| self.rng.below(2) as u8)
            .collect();
        self.log(format!(
            "PARTITION nodes {node_side:?} clients {client_side:?}"
        ));
        self.open_window("partition");
        self.partition = Some(Partition {
            node_side,
            client_side,
            one_way: Vec::new(),
        });
    }

    /// Symmetric partition with the clients' sides given too (scripted
    /// scenarios): `client_side[c]` for each client.
    pub fn partition_with_clients(&mut self, node_side: Vec<u8>, client_side: Vec<u8>) {
        self.log(format!(
            "PARTITION nodes {node_side:?} clients {client_side:?}"
        ));
        self.open_window("partition");
        self.partition = Some(Partition {
            node_side,
            client_side,
            one_way: Vec::new(),
        });
    }

    /// Bytes from `from` to `to` stop getting through.
    pub fn one_way(&mut self, from: usize, to: usize) {
        self.log(format!("ONE-WAY block n{from} -> n{to}"));
        self.open_window("partition");
        let p = self.partition.get_or_insert_with(Partition::default);
        p.one_way.push((from, to));
    }

    /// How long a partition lasts: mostly short, sometimes long enough for
    /// TCP's back-off to grow past a second.
    fn partition_ms(&mut self) -> u64 {
        if self.rng.chance(25) {
            self.rng.range(3_000, 15_000)
        } else {
            self.rng.range(200, 3_000)
        }
    }

    /// Bytes from `from` to `to` get through again; other blocks stay.
    pub fn heal_one_way(&mut self, from: usize, to: usize) {
        if let Some(p) = self.partition.as_mut() {
            p.one_way.retain(|&pair| pair != (from, to));
            self.log(format!("HEAL one way n{from} -> n{to}"));
        }
    }

    pub fn heal(&mut self) {
        if self.partition.take().is_some() {
            self.log("HEAL partition".into());
            for w in 0..self.windows.len() {
                if self.windows[w].kind == "partition" && self.windows[w].end == u64::MAX {
                    self.close_window(w);
                }
            }
        }
    }

    /// Breaks one connection: each side learns at its own time.
    pub fn break_conn(&mut self, sc: usize) {
        let Some(conn) = self.conns[sc].as_ref() else {
            return;
        };
        let parties = conn.parties;
        let rst = self.rng.chance(50);
        self.log(format!(
            "BREAK link #{sc} {:?} -> {:?} ({})",
            parties[0],
            parties[1],
            if rst { "rst" } else { "fin" }
        ));
        *self.stats.faults.entry("flap").or_default() += 1;
        self.disturb();
        self.conns[sc].as_mut().unwrap().dead = true;
        // Both links of a pair of nodes down at once looks like a crash to
        // the nodes: a failover then is a network fault's, not a bug's.
        if let [Party::Node(a), Party::Node(b)] = parties {
            let reverse_up = self.conns.iter().flatten().any(|c| {
                c.peer_link
                    && c.parties == [Party::Node(b), Party::Node(a)]
                    && c.open == [true, true]
                    && c.close_at == [None, None]
            });
            if !reverse_up {
                let w = self.open_window("flap-both");
                self.close_window(w);
            }
        }
        for e in 0..2 {
            let delay = self.rng.range(0, 30);
            let conn = self.conns[sc].as_mut().unwrap();
            if conn.open[e] {
                // End e hears of the break from the network.
                conn.close_at[e] = Some(self.now + delay);
                if rst {
                    conn.pipes[1 - e].segs.clear();
                }
            }
        }
    }

    fn peer_links(&self) -> Vec<usize> {
        (0..self.conns.len())
            .filter(|&sc| {
                self.conns[sc]
                    .as_ref()
                    .is_some_and(|c| c.peer_link && c.open[0] && c.open[1])
            })
            .collect()
    }

    pub fn actives(&self) -> Vec<usize> {
        (0..self.cfg.nodes)
            .filter(|&x| {
                self.nodes[x]
                    .inc
                    .as_ref()
                    .is_some_and(|i| i.role == Role::Active)
            })
            .collect()
    }

    pub fn role(&self, x: usize) -> Option<Role> {
        self.nodes[x].inc.as_ref().map(|i| i.role)
    }

    /// The grants in node `x`'s table: (key, token).
    pub fn table(&self, x: usize) -> Vec<(String, u64)> {
        let Some(inc) = self.nodes[x].inc.as_ref() else {
            return Vec::new();
        };
        let engine = inc.node.engine();
        let mut v: Vec<(String, u64)> = engine
            .grants()
            .chain(engine.member_grants())
            .map(|(k, t, _)| (show(k), t))
            .collect();
        v.sort();
        v
    }

    pub fn highest_token(&self, x: usize) -> u64 {
        self.nodes[x]
            .inc
            .as_ref()
            .map_or(0, |i| i.node.engine().highest_token())
    }

    /// The highest token any node issued so far.
    pub fn issued_max(&self) -> u64 {
        self.issued_max
    }

    fn healed(&self) -> bool {
        self.partition.is_none() && self.nodes.iter().all(|n| n.hung_until.is_none())
    }

    /// How long the network has been whole (no partition, no hang) and no
    /// node has come or gone.
    fn healed_for(&self) -> u64 {
        if self.healed() {
            self.now - self.last_disturbance
        } else {
            0
        }
    }

    // ----- the random scenario -----

    #[expect(clippy::too_many_lines)]
    fn random_fault(&mut self) {
        let kind = FAULTS[self.rng.weighted(&self.cfg.weights)];
        let up: Vec<usize> = (0..self.cfg.nodes).filter(|&x| self.runs(x)).collect();
        let actives: Vec<usize> = self
            .actives()
            .into_iter()
            .filter(|&x| self.runs(x))
            .collect();
        let active = actives.first().copied();
        match kind {
            Fault::Steady => {}
            Fault::CrashActive | Fault::CrashAny => {
                let victim = if kind == Fault::CrashActive {
                    active
                } else {
                    (!up.is_empty()).then(|| self.rng.pick(&up))
                };
                if let Some(v) = victim.filter(|_| up.len() > 1) {
                    self.crash(v);
                    let back = self.now + self.rng.range(100, 3_000);
                    self.restarts.push((back, v));
                }
            }
            Fault::Leave => {
                if let Some(v) = active.filter(|_| up.len() > 1) {
                    self.leave(v);
                    let back = self.now + self.rng.range(200, 3_000);
                    self.restarts.push((back, v));
                }
            }
            Fault::HangActive => {
                if let Some(v) = active.filter(|_| up.len() > 1) {
                    let ms = if self.rng.chance(75) {
                        self.rng.range(PEER_TIMEOUT_MS + 100, 2_500)
                    } else {
                        self.rng.range(50, PEER_TIMEOUT_MS - 100)
                    };
                    self.hang(v, ms);
                }
            }
            Fault::Partition if self.partition.is_none() => {
                let n = self.cfg.nodes;
                let mut side: Vec<u8> = (0..n).map(|_| self.rng.below(2) as u8).collect();
                if side.iter().all(|&s| s == side[0]) {
                    side[self.rng.below(n as u64) as usize] ^= 1;
                }
                self.partition(side);
                self.heal_at = Some(self.now + self.partition_ms());
            }
            Fault::OneWay if self.partition.is_none() => {
                let n = self.cfg.nodes as u64;
                let from = self.rng.below(n) as usize;
                let to = (from + 1 + self.rng.below(n - 1) as usize) % n as usize;
                self.one_way(from, to);
                let lasts = self.partition_ms();
                if self.rng.chance(40) {
                    self.one_way(to, from);
                    // A staggered heal: one direction comes back first.
                    if self.rng.chance(50) {
                        let first = self.now + self.rng.range(100, lasts.max(101));
                        self.staggered = Some((first, to, from));
                    }
                }
                self.heal_at = Some(self.now + lasts);
            }
            Fault::Partition | Fault::OneWay => {}
            Fault::Flap => {
                let count = self.rng.range(1, 4);
                for i in 0..count {
                    self.flaps.push(self.now + i * self.rng.range(0, 150));
                }
            }
            Fault::Stranger if !up.is_empty() => {
                let x = self.rng.pick(&up);
                self.stranger_connects(x);
            }
            Fault::AcceptFails if !up.is_empty() => {
                let x = self.rng.pick(&up);
                let count = self.rng.range(1, 3) as u32;
                self.fail_accepts(x, count);
                self.stranger_connects(x);
            }
            Fault::Stranger | Fault::AcceptFails => {}
            Fault::Outage => {
                self.log("OUTAGE: every node crashes".into());
                self.open_window("outage");
                let w = self.windows.len() - 1;
                for x in 0..self.cfg.nodes {
                    if self.up(x) {
                        self.crash(x);
                        let back = self.now + self.rng.range(100, 1_500);
                        self.restarts.push((back, x));
                    }
                }
                self.windows[w].end = self.now + 1_500 + SETTLE_MS;
            }
        }
        self.next_fault = self.now + self.rng.range(200, 2_000);
    }

    fn flap_one(&mut self) {
        let links = self.peer_links();
        let clients: Vec<usize> = (0..self.conns.len())
            .filter(|&sc| {
                self.conns[sc]
                    .as_ref()
                    .is_some_and(|c| !c.peer_link && c.open[0] && c.open[1])
            })
            .collect();
        let pool = if !links.is_empty() && (clients.is_empty() || self.rng.chance(75)) {
            links
        } else {
            clients
        };
        if !pool.is_empty() {
            let sc = self.rng.pick(&pool);
            self.break_conn(sc);
        }
    }

    /// The end of the chaos: everything heals, every node comes back.
    fn heal_all(&mut self) {
        self.log("HEAL ALL".into());
        self.heal();
        self.heal_at = None;
        self.flaps.clear();
        for x in 0..self.cfg.nodes {
            if self.nodes[x].hung_until.is_some() {
                self.resume(x);
            }
        }
        self.restarts.clear();
        for x in 0..self.cfg.nodes {
            if !self.listens(x) {
                self.restart(x);
            }
        }
    }

    // ----- the main loop -----

    fn node_deadline(&self, x: usize) -> Option<u64> {
        let slot = &self.nodes[x];
        let inc = slot.inc.as_ref()?;
        if slot.hung_until.is_some() {
            return None;
        }
        let mut next = Self::loop_deadline(inc, self.now);
        if inc.spinning_since.is_some() {
            // Do not spin the simulation: one turn per millisecond.
            next = next.map(|d| d.max(inc.last_turn + 1));
        }
        let wake = inc.wake_at;
        let accept = inc
            .accepts
            .iter()
            .map(|&(at, _)| at)
            .min()
            .filter(|_| !inc.accept_paused);
        let batch = Self::batch_read_deadline(inc);
        [next, wake, accept, batch].into_iter().flatten().min()
    }

    /// The deadline a loop would sleep until, in sim time (`now`): as long
    /// as [`Driver::timeout_ms`] says (the node's next timer, a lingering
    /// connection's or a handshake's deadline, the accept retry, the end of
    /// a shutdown).
    fn loop_deadline(inc: &Inc, now: u64) -> Option<u64> {
        inc.driver
            .timeout_ms(&inc.node, now + inc.ms_offset)
            .map(|wait| now + wait)
    }

    fn next_event(&self) -> u64 {
        self.next_event_why(&mut Vec::new())
    }

    /// The next time something happens; `why` gets what happens then.
    fn next_event_why(&self, why: &mut Vec<String>) -> u64 {
        let mut next = self.end;
        let mut what = String::new();
        let mut consider = |t: u64, w: &dyn Fn() -> String| {
            if t < next {
                next = t;
                what = w();
            }
        };
        for x in 0..self.cfg.nodes {
            if let Some(d) = self.node_deadline(x) {
                consider(d, &|| format!("n{x} deadline"));
            }
            if let Some(h) = self.nodes[x].hung_until {
                consider(h, &|| format!("n{x} resumes"));
            }
        }
        for d in self.dials.iter().filter(|d| self.runs(d.node)) {
            consider(d.due, &|| format!("dial {d:?}"));
        }
        for conn in self.conns.iter().flatten() {
            for e in 0..2 {
                // (A node end not accepted yet closes when it would be.)
                let runs = match conn.parties[e] {
                    Party::Node(x) => self.runs(x) && conn.cids[e].is_some(),
                    Party::Client(_) | Party::Stranger(_) => true,
                };
                if let Some(at) = conn.close_at[e].filter(|_| runs) {
                    consider(at, &|| format!("close {conn:?} end {e}"));
                }
                let pipe = &conn.pipes[e];
                if let Some(&(at, _)) = pipe.segs.front() {
                    if self.can_receive(conn, e) {
                        consider(at, &|| {
                            format!("deliver {:?} -> {:?}", conn.parties[e], conn.parties[1 - e])
                        });
                    } else if let Some(resume) = pipe.resume_at.filter(|&r| r > self.now) {
                        consider(resume, &|| format!("retransmission {conn:?}"));
                    } else if self.blocked(conn.parties[e], conn.parties[1 - e])
                        && conn.open[e]
                        && conn.open[1 - e]
                        && conn.close_at[e].is_none()
                    {
                        // Stuck in a partition: the sender gives up later.
                        match pipe.stuck_since {
                            Some(since) => {
                                consider(since + conn.rto_ms, &|| format!("rto {conn:?}"))
                            }
                            None => consider(at, &|| format!("stuck {conn:?}")),
                        }
                    }
                }
            }
        }
        for c in &self.clients {
            if self.cfg.auto_clients {
                consider(c.next_action, &|| "client action".into());
            }
            for &(at, _, _) in &c.retries {
                consider(at, &|| "client retry".into());
            }
            for at in c.reconnect_at.iter().flatten() {
                consider(*at, &|| "client reconnect".into());
            }
        }
        consider(self.next_fault, &|| "fault".into());
        for &(at, _) in &self.restarts {
            consider(at, &|| "restart".into());
        }
        if let Some(h) = self.heal_at {
            consider(h, &|| "heal".into());
        }
        if let Some((at, ..)) = self.staggered {
            consider(at, &|| "staggered heal".into());
        }
        for &f in &self.flaps {
            consider(f, &|| "flap".into());
        }
        if let Some((_, d, _)) = self.leave_check {
            consider(d, &|| "leave check".into());
        }
        why.push(what);
        next.max(self.now)
    }

    /// Runs until sim time `until` (or a failure). Returns false on failure.
    pub fn run_until(&mut self, until: u64) -> bool {
        let saved_end = self.end;
        self.end = until.min(saved_end.max(until));
        while self.failure.is_none() {
            let t = self.next_event();
            if t >= until {
                self.now = until;
                break;
            }
            self.step(t);
        }
        self.end = saved_end;
        self.failure.is_none()
    }

    pub fn run_for(&mut self, ms: u64) -> bool {
        self.run_until(self.now + ms)
    }

    /// The whole random run: chaos, heal, settle, final checks.
    pub fn run(&mut self) -> Result<Stats, String> {
        let chaos_end = T0 + self.cfg.chaos_ms;
        let end = self.end;
        if self.run_until(chaos_end) {
            self.next_fault = u64::MAX;
            self.heal_all();
            if self.run_until(end - 1_000) {
                self.send_probes();
                if self.run_until(end) {
                    self.final_checks();
                }
            }
        }
        self.stats.sim_ms = self.now - T0;
        match &self.failure {
            None => Ok(self.stats.clone()),
            Some(_) => Err(self.report()),
        }
    }

    fn step(&mut self, t: u64) {
        self.now = t;
        self.stats.steps += 1;
        if self.stats.steps > self.cfg.max_steps {
            let mut why = Vec::new();
            self.next_event_why(&mut why);
            self.fail(format!(
                "runaway: more than {} steps; next: {why:?}",
                self.cfg.max_steps
            ));
            return;
        }
        self.scenario_events();
        self.network_events();
        let mut order: Vec<usize> = (0..self.cfg.nodes).collect();
        for i in (1..order.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        for x in order {
            if self.node_deadline(x).is_some_and(|d| d <= t) || self.has_input(x) {
                self.node_turn(x);
            }
        }
        self.client_events();
        self.check_step();
    }

    fn scenario_events(&mut self) {
        let t = self.now;
        for x in 0..self.cfg.nodes {
            if self.nodes[x].hung_until.is_some_and(|h| h <= t) {
                self.resume(x);
            }
        }
        let due: Vec<usize> = self
            .restarts
            .iter()
            .filter(|&&(at, _)| at <= t)
            .map(|&(_, x)| x)
            .collect();
        self.restarts.retain(|&(at, _)| at > t);
        for x in due {
            self.restart(x);
        }
        if let Some((_, from, to)) = self.staggered.filter(|&(at, ..)| at <= t) {
            self.staggered = None;
            self.heal_one_way(from, to);
        }
        if self.heal_at.is_some_and(|h| h <= t) {
            self.heal_at = None;
            self.staggered = None;
            self.heal();
        }
        let flaps = self.flaps.iter().filter(|&&f| f <= t).count();
        self.flaps.retain(|&f| f > t);
        for _ in 0..flaps {
            self.flap_one();
        }
        if self.next_fault <= t {
            self.random_fault();
        }
    }

    /// Stuck bytes: a sender that cannot get its bytes through gives up
    /// after its retransmission timeout, and the connection breaks.
    fn network_events(&mut self) {
        let t = self.now;
        for sc in 0..self.conns.len() {
            if self.conns[sc].is_none() {
                continue;
            }
            for e in 0..2 {
                let conn = self.conns[sc].as_ref().unwrap();
                let due = conn.pipes[e].segs.front().is_some_and(|&(at, _)| at <= t);
                let stuck =
                    due && conn.open[1 - e] && self.blocked(conn.parties[e], conn.parties[1 - e]);
                let conn = self.conns[sc].as_mut().unwrap();
                if !stuck {
                    let peer_link = conn.peer_link;
                    let pipe = &mut conn.pipes[e];
                    if let Some(since) = pipe.stuck_since.take()
                        && peer_link
                    {
                        // The path is back; the bytes come with the
                        // sender's next retransmission. (Only on peer
                        // links: clients' own liveness is not simulated,
                        // so their bytes flow again at once.)
                        pipe.resume_at = Some(next_retransmission(since, t));
                    }
                    if pipe.resume_at.is_some_and(|at| at <= t) {
                        pipe.resume_at = None;
                    }
                    continue;
                }
                let since = *conn.pipes[e].stuck_since.get_or_insert(t);
                if t >= since + conn.rto_ms && conn.open[e] && conn.close_at[e].is_none() {
                    // The sender times out now; the receiver learns when
                    // its own bytes bounce, later. What the sender had not
                    // got through goes with its connection: TCP does not
                    // send it again, so it never arrives (a request sent
                    // into the partition is not read at the heal).
                    conn.close_at[e] = Some(t);
                    conn.dead = true;
                    conn.pipes[e].segs.clear();
                    let later = t + self.rng.range(0, 1_500);
                    let conn = self.conns[sc].as_mut().unwrap();
                    if conn.close_at[1 - e].is_none() && conn.open[1 - e] {
                        conn.close_at[1 - e] = Some(later);
                    }
                    let parties = conn.parties;
                    self.log(format!(
                        "link #{sc} {:?} -> {:?} times out",
                        parties[0], parties[1]
                    ));
                }
            }
        }
        // Network-made closes of client ends happen here; node ends at the
        // node's turn.
        for sc in 0..self.conns.len() {
            let Some(conn) = self.conns[sc].as_ref() else {
                continue;
            };
            if let (Party::Client(c), Some(at)) = (conn.parties[0], conn.close_at[0])
                && at <= t
            {
                self.client_close(c, sc);
            }
        }
        self.stranger_events();
    }

    fn has_input(&self, x: usize) -> bool {
        let Some(inc) = self.nodes[x].inc.as_ref() else {
            return false;
        };
        if self.nodes[x].hung_until.is_some() {
            return false;
        }
        let t = self.now;
        if self
            .dials
            .iter()
            .any(|d| d.node == x && d.generation == inc.generation && d.due <= t)
        {
            return true;
        }
        inc.conns.values().any(|&sc| {
            let conn = self.conns[sc].as_ref().unwrap();
            let e = self.end_of(sc, x);
            conn.close_at[e].is_some_and(|at| at <= t)
                || conn.pipes[1 - e]
                    .segs
                    .front()
                    .is_some_and(|&(at, _)| at <= t && self.can_receive(conn, 1 - e))
        })
    }

    #[expect(clippy::too_many_lines)]
    fn node_turn(&mut self, x: usize) {
        let t = self.now;
        self.stats.node_turns += 1;
        let inc = self.nodes[x].inc.as_mut().unwrap();
        inc.wake_at = None;
        inc.last_turn = t;
        self.op(x, "tick", |node, now| node.tick(now));
        // Closes the network made.
        let conns: Vec<usize> = self.nodes[x]
            .inc
            .as_ref()
            .unwrap()
            .conns
            .values()
            .copied()
            .collect();
        for sc in conns {
            let e = self.end_of(sc, x);
            if self.conns[sc]
                .as_ref()
                .is_some_and(|c| c.open[e] && c.close_at[e].is_some_and(|at| at <= t))
            {
                self.node_fail(x, sc, e, "broken by the network");
            }
        }
        // Connections broken before they were accepted.
        let pending: Vec<usize> = self.nodes[x]
            .inc
            .as_ref()
            .unwrap()
            .accepts
            .iter()
            .map(|&(_, sc)| sc)
            .collect();
        for sc in pending {
            let conn = self.conns[sc].as_mut().unwrap();
            if conn.close_at[1].is_some_and(|at| at <= t) {
                conn.open[1] = false;
                conn.close_at[1] = None;
                conn.pipes[0].segs.clear();
                self.nodes[x]
                    .inc
                    .as_mut()
                    .unwrap()
                    .accepts
                    .retain(|&(_, s)| s != sc);
                self.drop_if_done(sc);
            }
        }
        self.accept_backlog(x);
        // Dial results.
        let generation = self.nodes[x].generation;
        let (due, rest): (Vec<Dial>, Vec<Dial>) = self
            .dials
            .drain(..)
            .partition(|d| d.node == x && d.due <= t);
        self.dials = rest;
        for d in due.into_iter().filter(|d| d.generation == generation) {
            self.resolve_dial(d);
        }
        // Input, in arrival order.
        self.batch_reads_later(x);
        while self.failure.is_none() {
            self.refresh_reading(x);
            let mut best: Option<(u64, ConnId, usize, usize)> = None;
            for (&cid, &sc) in &self.nodes[x].inc.as_ref().unwrap().conns {
                let conn = self.conns[sc].as_ref().unwrap();
                let e = self.end_of(sc, x);
                if let Some(&(at, _)) = conn.pipes[1 - e].segs.front()
                    && at <= t
                    && self.can_receive(conn, 1 - e)
                    && best.is_none_or(|b| (at, cid) < (b.0, b.1))
                {
                    best = Some((at, cid, sc, e));
                }
            }
            let Some((at, cid, sc, e)) = best else { break };
            let batched = self.nodes[x]
                .inc
                .as_ref()
                .and_then(|i| i.lives.get(&cid))
                .is_some_and(|l| matches!(l.next_read(), NextRead::At(_)));
            self.stats.batched_reads += u64::from(batched);
            let (_, seg) = self.conns[sc].as_mut().unwrap().pipes[1 - e]
                .segs
                .pop_front()
                .unwrap();
            self.made_room(sc, 1 - e);
            match seg {
                Seg::Data(bytes, sent) => self.node_input(x, sc, e, cid, bytes, at, sent),
                Seg::Fin => {
                    self.with_life(x, cid, "end of stream", |life, node, now| {
                        life.peer_closed(node, now, cid)
                    });
                    self.settle(x, sc, e, cid);
                }
                Seg::Rst => self.node_fail(x, sc, e, "reset by the other side"),
            }
        }
        if self.failure.is_some() {
            return;
        }
        self.batch_reads_found_nothing(x);
        self.flush_node(x);
        self.driver_deadlines(x);
        self.batch_reads_later(x);
        self.refresh_reading(x);
        // Dials.
        let mut dials = std::mem::take(&mut self.dial_buf);
        let now = self.node_now(x);
        let inc = self.nodes[x].inc.as_mut().unwrap();
        inc.driver.take_dials(&mut inc.node, now, &mut dials);
        for (peer, a) in dials.drain(..) {
            let peer = peer.0;
            assert_eq!(a, addr(peer));
            let dial = Dial {
                node: x,
                generation,
                peer,
                due: t,
                started: t,
                phase: DialPhase::Attempt,
                lost: false,
            };
            let dial = self.dial_attempt(dial);
            self.dials.push(dial);
        }
        self.dial_buf = dials;
        let inc = self.nodes[x].inc.as_mut().unwrap();
        inc.driver.end_turn(&mut inc.node, now);
        if inc.driver.finished(now.ms, inc.conns.len()) {
            self.stats.finished += 1;
            self.exit(x);
            return;
        }
        // A loop whose deadline is already past spins.
        let past = Self::loop_deadline(inc, t).is_some_and(|d| d <= t);
        let role = inc.role;
        match (past, inc.spinning_since) {
            (true, None) => {
                inc.spinning_since = Some(t);
                self.log(format!(
                    "n{x} ({role:?}): deadline in the past, its loop spins"
                ));
            }
            (false, Some(since)) => {
                inc.spinning_since = None;
                self.stats.spin_ms_max = self.stats.spin_ms_max.max(t - since);
                self.log(format!(
                    "n{x} ({role:?}): stops spinning after {} ms",
                    t - since
                ));
            }
            _ => {}
        }
    }

    /// Node `x` reads its listener: the connections that arrived, in
    /// order, unless an accept fails (then the rest wait in the backlog
    /// until [`Driver::accept_retry_due`]).
    fn accept_backlog(&mut self, x: usize) {
        let t = self.now;
        let now = self.node_now(x);
        let inc = self.nodes[x].inc.as_mut().unwrap();
        if inc.driver.accept_retry_due(now.ms) {
            inc.accept_paused = false;
            self.stats.accepts_retried += 1;
            self.log(format!("n{x}: accepts again"));
        }
        loop {
            let inc = self.nodes[x].inc.as_mut().unwrap();
            if inc.accept_paused {
                return;
            }
            let Some(i) = inc.accepts.iter().position(|&(at, _)| at <= t) else {
                return;
            };
            if inc.fail_accepts > 0 {
                inc.fail_accepts -= 1;
                inc.accept_paused = true;
                let emfile = std::io::Error::from_raw_os_error(libc_emfile());
                inc.driver.accept_failed(&mut inc.node, now, &emfile);
                self.stats.accepts_failed += 1;
                let waiting = inc.accepts.len();
                self.log(format!(
                    "n{x}: accept failed (EMFILE), {waiting} waiting in the backlog"
                ));
                return;
            }
            let (_, sc) = inc.accepts.remove(i);
            if self.conns[sc].as_ref().is_some_and(|c| c.open[1]) {
                self.accept_conn(x, sc);
            }
        }
    }

    /// Node `x` accepts `sc` as the loops do: [`Driver::admit`] says what
    /// it is; a stranger's connection starts with a TLS handshake.
    fn accept_conn(&mut self, x: usize, sc: usize) {
        let open = self.nodes[x].inc.as_ref().unwrap().conns.len();
        let admission = self.op_inc(x, "admit", |inc, _| inc.driver.admit(&mut inc.node, open));
        if admission == Admission::Refuse {
            // Closed at once, as the loops close a refused socket: it never
            // takes a slot. The kernel resets it if it had sent something.
            self.stats.refused += 1;
            let conn = self.conns[sc].as_mut().unwrap();
            let unread = !conn.pipes[0].segs.is_empty();
            conn.open[1] = false;
            conn.close_at[1] = None;
            conn.pipes[0].segs.clear();
            let parties = conn.parties;
            if conn.open[0] {
                self.send(sc, 1, if unread { Seg::Rst } else { Seg::Fin });
            }
            self.log(format!(
                "n{x} refuses #{sc} from {:?} (--max-conns)",
                parties[0]
            ));
            self.drop_if_done(sc);
            return;
        }
        let conn = self.conns[sc].as_ref().unwrap();
        let silent = conn.silent;
        let life = if silent {
            let until = self.node_now(x).ms + HANDSHAKE_MS;
            let conn = rustls::ServerConnection::new(stranger_tls()).expect("a TLS server");
            Lifecycle::with_tls(rustls::Connection::Server(conn), until, None, None)
        } else if self.cfg.tls {
            // As the loops' `LoopTls::accepted`, for a client or a peer
            // (the node cannot tell before the handshake): the handshake
            // deadline, the peer CA's check for peer lines, no ACL.
            let until = self.node_now(x).ms + HANDSHAKE_MS;
            let tls = sim_tls();
            let conn = rustls::ServerConnection::new(tls.server.clone()).expect("a TLS server");
            let peer_check = Some(tls.peer_check.clone());
            Lifecycle::with_tls(rustls::Connection::Server(conn), until, peer_check, None)
        } else {
            Lifecycle::new()
        };
        let cid = self.alloc_cid_with(x, sc, life);
        let now = self.now;
        let conn = self.conns[sc].as_mut().unwrap();
        conn.cids[1] = Some(cid);
        conn.accepted_ms = Some(now);
        match admission {
            Admission::PeerOnly => {
                self.stats.peer_only += 1;
                self.op(x, "accept", |node, now| node.open_peer_only(now, cid));
            }
            Admission::Client | Admission::Refuse => {
                self.op(x, "accept", |node, _| node.open(cid));
            }
        }
    }

    /// A socket connects to node `x` and never speaks: its TLS handshake
    /// never completes, and the node closes it at the deadline
    /// ([`Driver::due_handshake`]). Returns the connection.
    pub fn stranger_connects(&mut self, x: usize) -> Option<usize> {
        if !self.listens(x) {
            return None;
        }
        let id = self.strangers;
        self.strangers += 1;
        let sc = self.new_conn([Party::Stranger(id), Party::Node(x)], false);
        let at = self.now + self.delay();
        self.nodes[x].inc.as_mut().unwrap().accepts.push((at, sc));
        self.log(format!("stranger {id} connects to n{x} (#{sc})"));
        Some(sc)
    }

    /// The kernel fails node `x`'s next `count` accepts with EMFILE.
    pub fn fail_accepts(&mut self, x: usize, count: u32) {
        if let Some(inc) = self.nodes[x].inc.as_mut() {
            inc.fail_accepts += count;
            self.log(format!("n{x}: the next {count} accepts fail (EMFILE)"));
        }
    }

    /// Node `x` runs and has its listener (not shutting down).
    fn listens(&self, x: usize) -> bool {
        self.nodes[x]
            .inc
            .as_ref()
            .is_some_and(|i| !i.driver.is_shutting_down())
    }

    /// Strangers read nothing: what arrives is dropped; a close closes
    /// their end.
    fn stranger_events(&mut self) {
        let t = self.now;
        for sc in 0..self.conns.len() {
            let Some(conn) = self.conns[sc].as_mut() else {
                continue;
            };
            if !conn.silent || !conn.open[0] {
                continue;
            }
            let mut closed = conn.close_at[0].is_some_and(|at| at <= t);
            while let Some(&(at, _)) = conn.pipes[1].segs.front()
                && at <= t
            {
                if let Some((_, Seg::Fin | Seg::Rst)) = conn.pipes[1].segs.pop_front() {
                    closed = true;
                }
            }
            if closed {
                self.stranger_close(sc);
            }
        }
    }

    fn stranger_close(&mut self, sc: usize) {
        let Some(conn) = self.conns[sc].as_mut() else {
            return;
        };
        conn.open[0] = false;
        conn.close_at[0] = None;
        conn.pipes[1].segs.clear();
        if conn.open[1] {
            self.send(sc, 0, Seg::Fin);
        }
        self.drop_if_done(sc);
    }

    /// The driver's deadlines, as the loops act on them after a turn's
    /// output: the lingering connections due are closed (a stale entry, its
    /// connection gone or its id reused, is harmless: the lifecycle acts on
    /// its own deadline), and so are the handshakes not done by theirs.
    fn driver_deadlines(&mut self, x: usize) {
        let now_ms = self.node_now(x).ms;
        loop {
            let inc = self.nodes[x].inc.as_mut().unwrap();
            let Some(cid) = inc.driver.due_lingering(now_ms) else {
                break;
            };
            let Some(&sc) = inc.conns.get(&cid) else {
                continue;
            };
            let lingered = inc.lives[&cid]
                .linger_until()
                .is_some_and(|until| until <= now_ms);
            let e = self.end_of(sc, x);
            self.settle(x, sc, e, cid);
            if lingered && self.conns[sc].as_ref().is_none_or(|c| !c.open[e]) {
                self.stats.lingered += 1;
            }
        }
        loop {
            let inc = self.nodes[x].inc.as_mut().unwrap();
            let Some(cid) = inc.driver.due_handshake(now_ms) else {
                break;
            };
            let Some(&sc) = inc.conns.get(&cid) else {
                continue;
            };
            let expired = self.with_life(x, cid, "handshake deadline", |life, node, now| {
                life.handshake_expired(node, now, cid)
            });
            if expired == Some(true) {
                self.stats.handshakes_expired += 1;
                let e = self.end_of(sc, x);
                // The loop closes the socket: a client or a peer reads the
                // end of the stream (a stranger closes on its own, see
                // `node_end_closed`).
                let conn = self.conns[sc].as_ref().unwrap();
                let other = conn.parties[1 - e];
                if matches!(other, Party::Client(_) | Party::Node(_)) && conn.open[1 - e] {
                    self.send(sc, e, Seg::Fin);
                }
                self.settle(x, sc, e, cid);
            }
        }
    }

    /// Both ways open between node `x` and `peer`: a SYN and its answer
    /// get through (whether anything listens is another matter).
    fn path_open(&self, x: usize, peer: usize) -> bool {
        !self.blocked(Party::Node(x), Party::Node(peer))
            && !self.blocked(Party::Node(peer), Party::Node(x))
    }

    /// Dial `d`'s attempt at `d.due`: what comes of it, and when.
    fn dial_attempt(&mut self, mut d: Dial) -> Dial {
        debug_assert_eq!(d.phase, DialPhase::Attempt);
        if self.path_open(d.node, d.peer) {
            d.phase = if self.listens(d.peer) {
                DialPhase::Connecting
            } else {
                DialPhase::Refused
            };
            d.due += 2 * self.delay();
        } else {
            d.lost = true;
            self.next_dial_attempt(&mut d);
        }
        d
    }

    /// The attempt after `d`'s last, or its end.
    fn next_dial_attempt(&self, d: &mut Dial) {
        let end = d.started + DIAL_TIMEOUT_MS;
        let next = d.started + ((d.due - d.started) / DIAL_AGAIN_MS + 1) * DIAL_AGAIN_MS;
        (d.phase, d.due) = if next < end {
            (DialPhase::Attempt, next)
        } else {
            (DialPhase::TimedOut, end.max(d.due))
        };
    }

    fn resolve_dial(&mut self, mut d: Dial) {
        let x = d.node;
        let connects = match d.phase {
            DialPhase::Attempt => {
                let d = self.dial_attempt(d);
                self.dials.push(d);
                return;
            }
            // The answer got back: the peer still listens, the path is
            // still open.
            DialPhase::Connecting => self.listens(d.peer) && self.path_open(x, d.peer),
            DialPhase::Refused | DialPhase::TimedOut => false,
        };
        if !connects {
            let fails = match d.phase {
                DialPhase::Refused => !d.lost,
                DialPhase::TimedOut => true,
                _ => false,
            };
            if !fails {
                // This attempt came to nothing; the dial goes on.
                d.lost |= d.phase == DialPhase::Connecting;
                self.next_dial_attempt(&mut d);
                self.dials.push(d);
                return;
            }
            self.op(x, "dial failed", |node, now| {
                node.dial_failed(now, PeerId(d.peer))
            });
            return;
        }
        let sc = self.new_conn([Party::Node(x), Party::Node(d.peer)], true);
        let cid = if self.cfg.tls {
            let life = dialed_tls(d.peer, self.node_now(x).ms);
            let cid = self.alloc_cid_with(x, sc, life);
            // As the loops: a TLS link starts with our handshake.
            self.nodes[x].inc.as_mut().unwrap().unsent.insert(cid);
            cid
        } else {
            self.alloc_cid(x, sc)
        };
        self.conns[sc].as_mut().unwrap().cids[0] = Some(cid);
        self.op(x, "dialed", |node, now| {
            node.outbound_open(now, cid, PeerId(d.peer))
        });
        let at = self.now + self.delay();
        self.nodes[d.peer]
            .inc
            .as_mut()
            .unwrap()
            .accepts
            .push((at, sc));
        self.log(format!("n{x} dialed n{} (link #{sc})", d.peer));
    }

    /// Feeds one segment (sent at `sent`, due at `at`) to node `x`, a line
    /// at a time (sometimes a line in two pieces), checking after each. If
    /// the connection pauses, the rest stays in the socket.
    #[allow(clippy::too_many_arguments)]
    fn node_input(
        &mut self,
        x: usize,
        sc: usize,
        e: usize,
        cid: ConnId,
        bytes: Vec<u8>,
        at: u64,
        sent: u64,
    ) {
        let open = |sim: &Sim| {
            sim.nodes[x]
                .inc
                .as_ref()
                .and_then(|i| i.lives.get(&cid))
                .is_some_and(|l| l.phase() == Phase::Open)
        };
        if !open(self) {
            // Closing or lingering: read and discarded.
            self.with_life(x, cid, "discard", |life, node, now| {
                life.received(node, now, cid, &bytes)
            });
            return;
        }
        if self.nodes[x]
            .inc
            .as_ref()
            .and_then(|i| i.lives.get(&cid))
            .is_some_and(Lifecycle::is_tls)
        {
            self.node_input_tls(x, sc, e, cid, &bytes);
            return;
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() && self.failure.is_none() {
            let len = memchr_first(rest).map_or(rest.len(), |i| i + 1);
            let (line, tail) = rest.split_at(len);
            rest = tail;
            let mut pieces: Vec<&[u8]> = vec![line];
            if line.len() > 2 && self.rng.chance(10) {
                let cut = self.rng.range(1, line.len() as u64 - 1) as usize;
                pieces = vec![&line[..cut], &line[cut..]];
            }
            let peer_msg = line
                .strip_suffix(b"\n")
                .filter(|l| wire::is_peer_line(l))
                .and_then(|l| wire::parse(l).ok());
            if self.log_wire {
                let from = self.conns[sc].as_ref().unwrap().parties[1 - e];
                self.log(format!("n{x} <- {from:?} #{sc}: {}", show(line).trim_end()));
            }
            // The role before the line: a standby honours HANDOFF only from
            // the node it follows (whose state it has).
            let role_before = self.role(x);
            let mut paused = false;
            for (i, piece) in pieces.iter().enumerate() {
                let fed = self.with_life(x, cid, "peer line", |life, node, now| {
                    life.received(node, now, cid, piece);
                    !life.holds_input()
                });
                match fed {
                    None => return,
                    Some(true) => {}
                    Some(false) => {
                        // Paused, the piece kept back by the session: as if
                        // the read had ended here, the rest stays unread in
                        // the socket.
                        let mut unread: Vec<u8> = pieces[i + 1..].concat();
                        unread.extend_from_slice(rest);
                        if !unread.is_empty() {
                            self.conns[sc].as_mut().unwrap().pipes[1 - e]
                                .segs
                                .push_front((at, Seg::Data(unread, sent)));
                        }
                        paused = true;
                        break;
                    }
                }
                if !open(self) {
                    break;
                }
            }
            if paused {
                return;
            }
            if let Some(msg) = &peer_msg {
                self.read_peer_line(x, sc, e, msg, role_before);
            }
            if !open(self) {
                // Broken: its answers and the E line go out, then it lingers.
                self.settle(x, sc, e, cid);
                return;
            }
        }
    }

    /// The checks on a peer line node `x` read on `sc` (its end `e`): the
    /// tokens it has seen (check 2), and that a standby that followed the
    /// sender is active after its `HANDOFF`. `role_before`: its role before
    /// it read the line.
    fn read_peer_line(
        &mut self,
        x: usize,
        sc: usize,
        e: usize,
        msg: &wire::PeerMsg<'_>,
        role_before: Option<Role>,
    ) {
        let tok = match *msg {
            wire::PeerMsg::Heartbeat { highest, .. }
            | wire::PeerMsg::Snapshot { highest }
            | wire::PeerMsg::Handoff { highest } => highest,
            wire::PeerMsg::Grant { token, .. } | wire::PeerMsg::Release { token, .. } => token,
            _ => 0,
        };
        let inc = self.nodes[x].inc.as_mut().unwrap();
        inc.seen_max = inc.seen_max.max(tok);
        let handoff_from_standby = matches!(msg, wire::PeerMsg::Handoff { .. })
            && matches!(role_before, Some(Role::Standby { .. }));
        if !handoff_from_standby {
            return;
        }
        let from = self.conns[sc].as_ref().unwrap().parties[1 - e];
        let role = inc.role;
        self.log(format!("n{x} read HANDOFF from {from:?}: now {role:?}"));
        // It takes the role if it followed the sender: it has the sender's
        // state. From any other node the hand-off is refused (taking the
        // role without that state could grant a lock the sender granted).
        let followed_sender = matches!(
            role_before,
            Some(Role::Standby { following: Some(PeerId(f)) }) if Party::Node(f) == from
        );
        // Having taken it, it steps down at once if it knows of another
        // active node of higher priority (after a split brain, whose news
        // may be stale while a fault settles).
        let other_active = match role {
            Role::Standby {
                following: Some(PeerId(f)),
            } => {
                Party::Node(f) != from
                    && (self.role(f) == Some(Role::Active)
                        || self.windows.iter().any(|w| w.end >= self.now))
            }
            _ => false,
        };
        if followed_sender && role != Role::Active && !other_active {
            self.fail(format!(
                "hand-off: n{x} read HANDOFF from {from:?} as a standby and is {role:?} right after"
            ));
        }
        // Refused (it follows another node now, say the other side of a
        // heal it heard in the same read): the leaver exits all the same,
        // and the next active is picked as after a crash (docs/cluster.md,
        // "Hand-off"), so the grants only the leaver had may be lost.
        // (A hand-back's sender stays, and owes its grants as a merge.)
        if let (false, Party::Node(sender)) = (role == Role::Active, from)
            && !self.listens(sender)
        {
            self.crash_window(sender, "handoff-refused");
        }
    }

    /// [`Sim::node_input`] for a TLS connection: the records as they came,
    /// sometimes in two reads cut anywhere (a record split across reads).
    /// Only lengths decide, never the ciphertext (which differs from run to
    /// run). rustls takes all of it: what a pause keeps back waits
    /// decrypted in the session. As the loops do, the connection is then
    /// flushed with the turn's output (after the links): what rustls
    /// answers (its handshake) and what the requests got. On a peer link,
    /// the peer lines each read decrypted (traced at the sender, see
    /// [`TlsTrace`]) are checked as [`Sim::node_input`] checks plain ones,
    /// all with the role from before the read.
    fn node_input_tls(&mut self, x: usize, sc: usize, e: usize, cid: ConnId, bytes: &[u8]) {
        if self.log_wire {
            let from = self.conns[sc].as_ref().unwrap().parties[1 - e];
            self.log(format!(
                "n{x} <- {from:?} #{sc}: {} bytes of TLS",
                bytes.len()
            ));
        }
        let cut = if bytes.len() > 1 && self.rng.chance(20) {
            self.rng.range(1, bytes.len() as u64 - 1) as usize
        } else {
            bytes.len()
        };
        for piece in [&bytes[..cut], &bytes[cut..]] {
            if piece.is_empty() {
                continue;
            }
            let role_before = self.role(x);
            // One read may carry several peer lines, and a grant's release
            // may come in it before the line that makes the node active (a
            // hand-off): check 3 does not count that grant as lost.
            self.released_in_op = self.conns[sc].as_ref().unwrap().tls_trace[1 - e]
                .peek(piece.len())
                .iter()
                .filter_map(|l| match wire::parse(l) {
                    Ok(wire::PeerMsg::Release { key, token }) => Some((key.to_vec(), token)),
                    _ => None,
                })
                .collect();
            let read = self.with_life(x, cid, "TLS input", |life, node, now| {
                let handshaking = life.is_handshaking();
                life.received(node, now, cid, piece);
                let done = handshaking && !life.is_handshaking();
                let failed = life.tls_failure();
                (
                    life.phase() == Phase::Open,
                    life.holds_input(),
                    done,
                    failed,
                )
            });
            self.released_in_op.clear();
            let Some((open, held, done, failed)) = read else {
                return;
            };
            let parties = self.conns[sc].as_ref().unwrap().parties;
            let peer_link = parties.iter().all(|p| matches!(p, Party::Node(_)));
            // The network neither damages nor reorders bytes, and both ends
            // are ours: a peer link's TLS never fails (check 5, as an E line
            // on a plain link). A dialer that gave up on the link before its
            // handshake ended (its peer hung past the peer timeout) closed
            // it with close_notify: not broken.
            if let Some(why) = failed.filter(|&f| peer_link && f != TlsFailure::ClosedInHandshake) {
                self.fail(format!(
                    "check 5: n{x} broke a peer link: its TLS failed ({why:?}) on input from {:?} (#{sc})",
                    parties[1 - e]
                ));
            }
            self.read_tls_link(x, sc, e, piece.len(), held || !open, done, role_before);
            if !open {
                break;
            }
        }
        let inc = self.nodes[x].inc.as_mut().unwrap();
        if inc.lives.contains_key(&cid) {
            inc.unsent.insert(cid);
        }
    }

    /// Node `x`'s end `e` of `sc` took in `n` bytes of TLS: on a peer link,
    /// checks the peer lines it decrypted (none if its session keeps input
    /// back or the read closed the link, `held`, as a paused plain line is
    /// not checked, nor what follows a line that breaks the link) and
    /// counts its
    /// handshake, `done` now, at the end that dialed.
    #[allow(clippy::too_many_arguments)]
    fn read_tls_link(
        &mut self,
        x: usize,
        sc: usize,
        e: usize,
        n: usize,
        held: bool,
        done: bool,
        role_before: Option<Role>,
    ) {
        let Some(conn) = self.conns[sc].as_mut().filter(|c| c.peer_link) else {
            return;
        };
        let lines = conn.tls_trace[1 - e].received(n);
        if done && e == 0 {
            self.stats.peer_tls_handshakes += 1;
            let to = self.conns[sc].as_ref().unwrap().parties[1];
            self.log(format!("n{x}: TLS handshake on link #{sc} to {to:?} done"));
        }
        if held {
            return;
        }
        for line in lines {
            if self.log_wire {
                self.log(format!("n{x} <- #{sc} (TLS): {}", show(&line)));
            }
            let msg = Some(&line[..])
                .filter(|l| wire::is_peer_line(l))
                .and_then(|l| wire::parse(l).ok());
            if let Some(msg) = &msg {
                self.stats.peer_tls_lines += 1;
                self.read_peer_line(x, sc, e, msg, role_before);
            }
        }
    }

    fn flush_node(&mut self, x: usize) {
        let mut dirty = std::mem::take(&mut self.dirty);
        self.op(x, "flush", |node, now| node.take_dirty(now, &mut dirty));
        self.check_links_first(x, &dirty);
        // Links the node gave up on (a handshake that did not finish in
        // time): closed as the loops close them, after their last output.
        let mut doomed = Vec::new();
        self.op(x, "doomed", |node, now| node.take_doomed(now, &mut doomed));
        for &cid in &doomed {
            self.with_life(x, cid, "close", |life, node, now| {
                life.finish(node, now, cid)
            });
        }
        // Then everything with something to send: new answers, last answers,
        // answers the socket had no room for.
        let inc = self.nodes[x].inc.as_ref().unwrap();
        let mut todo: Vec<ConnId> = doomed;
        todo.extend_from_slice(&dirty);
        todo.extend(inc.unsent.iter().copied());
        todo.extend(
            inc.lives
                .iter()
                .filter(|(_, l)| l.phase() == Phase::Closing)
                .map(|(&cid, _)| cid),
        );
        let mut seen = BTreeSet::new();
        for cid in todo {
            if !seen.insert(cid) {
                continue;
            }
            let inc = self.nodes[x].inc.as_mut().unwrap();
            if inc.node.outbox().has_uncollected() {
                // Work of this flush (a resumed stash, a close that granted
                // a waiter) wrote output not collected yet: the rest waits
                // for the next flush, which sends the links first.
                if inc.conns.contains_key(&cid) {
                    inc.unsent.insert(cid);
                }
                continue;
            }
            let Some(&sc) = inc.conns.get(&cid) else {
                continue;
            };
            let e = self.end_of(sc, x);
            self.settle(x, sc, e, cid);
        }
        self.dirty = dirty;
    }

    /// Check 8: a node hands its peer links' output to the network before
    /// any client's, so a node stopped between two sends has sent its
    /// followers the replication of every answer a client got.
    fn check_links_first(&mut self, x: usize, dirty: &[ConnId]) {
        let inc = self.nodes[x].inc.as_ref().unwrap();
        let is_link = |cid: &ConnId| {
            inc.conns.get(cid).is_some_and(|&sc| {
                self.conns[sc]
                    .as_ref()
                    .is_some_and(|c| c.parties.iter().all(|p| matches!(p, Party::Node(_))))
            })
        };
        let first_client = dirty.iter().position(|c| !is_link(c));
        let late_link = first_client.and_then(|i| dirty[i..].iter().find(|c| is_link(c)));
        if let Some(link) = late_link {
            let who: Vec<String> = dirty
                .iter()
                .map(|cid| match inc.conns.get(cid) {
                    Some(&sc) => format!("{cid}: #{sc}"),
                    None => format!("{cid}: ?"),
                })
                .collect();
            self.fail(format!(
                "check 8: n{x} sends peer link {link} after a client's answers: {who:?}"
            ));
        }
    }

    // ----- clients -----

    fn client_events(&mut self) {
        let t = self.now;
        for c in 0..self.clients.len() {
            // Reconnects.
            for n in 0..self.cfg.nodes {
                if self.clients[c].reconnect_at[n].is_some_and(|at| at <= t) {
                    self.clients[c].reconnect_at[n] = None;
                    if self.listens(n) && !self.blocked(Party::Client(c), Party::Node(n)) {
                        let sc = self.new_conn([Party::Client(c), Party::Node(n)], false);
                        let at = t + self.delay();
                        self.nodes[n].inc.as_mut().unwrap().accepts.push((at, sc));
                        self.clients[c].conns[n] = Some(sc);
                        self.client_tls_start(c, sc, n);
                    } else {
                        let again = t + self.rng.range(100, 500);
                        self.clients[c].reconnect_at[n] = Some(again);
                    }
                }
            }
            // Answers.
            let conns: Vec<usize> = self.clients[c].conns.iter().flatten().copied().collect();
            for sc in conns {
                while let Some(conn) = self.conns[sc].as_ref() {
                    let Some(&(at, _)) = conn.pipes[1].segs.front() else {
                        break;
                    };
                    if at > t || !self.can_receive(conn, 1) {
                        break;
                    }
                    let (_, seg) = self.conns[sc].as_mut().unwrap().pipes[1]
                        .segs
                        .pop_front()
                        .unwrap();
                    self.made_room(sc, 1);
                    match seg {
                        Seg::Data(bytes, sent) => {
                            let bytes = if self.clients[c].tls.contains_key(&sc) {
                                match self.client_tls_read(c, sc, &bytes) {
                                    Some(plain) => plain,
                                    None => break,
                                }
                            } else {
                                bytes
                            };
                            // Whole lines only: a send may end mid-line.
                            let mut data = self.clients[c].partial.remove(&sc).unwrap_or_default();
                            data.extend_from_slice(&bytes);
                            let whole = memchr_last(&data).map_or(0, |i| i + 1);
                            let tail = data.split_off(whole);
                            if !tail.is_empty() {
                                self.clients[c].partial.insert(sc, tail);
                            }
                            self.client_input(c, sc, &data, sent)
                        }
                        Seg::Fin | Seg::Rst => {
                            self.client_close(c, sc);
                            break;
                        }
                    }
                }
            }
            // Retries.
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.clients[c].retries)
                .into_iter()
                .partition(|&(at, _, _)| at <= t);
            self.clients[c].retries = later;
            for (_, node, req) in due {
                let node = node.unwrap_or_else(|| self.rng.below(self.cfg.nodes as u64) as usize);
                self.client_send(c, node, req);
            }
            // Beliefs run out with their lease.
            let expired: Vec<Vec<u8>> = self.clients[c]
                .held
                .iter()
                .filter(|(_, h)| self.beliefs[h.belief].end <= t)
                .map(|(k, _)| k.clone())
                .collect();
            for k in expired {
                self.clients[c].held.remove(&k);
            }
            if self.cfg.auto_clients && self.clients[c].next_action <= t {
                self.client_action(c);
                self.clients[c].next_action = t + self.rng.range(10, 250);
            }
        }
    }

    fn client_action(&mut self, c: usize) {
        let t = self.now;
        if self.probe_sent {
            return;
        }
        let due: Vec<Vec<u8>> = self.clients[c]
            .held
            .iter()
            .filter(|(k, h)| h.hold_until <= t && !self.clients[c].busy.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        if let Some(key) = due.first().cloned() {
            let held = self.clients[c].held[&key].clone();
            let target = self.clients[c].target;
            if self.rng.chance(25) {
                // A renewal that only extends: N sets the lease to now +
                // lease, so a shorter one would cut the client's belief.
                let left = self.beliefs[held.belief].end.saturating_sub(t);
                let lease_ms = left + self.rng.range(100, 2_000);
                let req = Req {
                    limit: 0,
                    op: b'N',
                    key: key.clone(),
                    token: held.token,
                    lease_ms,
                    wait_ms: 0,
                    redirects: 0,
                    retry_until: 0,
                    sent_ms: 0,
                };
                self.clients[c].held.get_mut(&key).unwrap().hold_until =
                    t + self.rng.range(50, 800);
                self.client_send(c, target, req);
            } else {
                self.client_release(c, &key);
            }
            return;
        }
        let key = format!("k{}", self.rng.below(self.cfg.keys as u64)).into_bytes();
        if self.clients[c].held.contains_key(&key) || self.clients[c].busy.contains(&key) {
            return;
        }
        let wait_ms = if self.rng.chance(30) {
            0
        } else {
            self.rng.range(50, 1_500)
        };
        let req = Req {
            limit: 0,
            op: b'A',
            key,
            token: 0,
            lease_ms: self.rng.range(200, 3_000),
            wait_ms,
            redirects: 0,
            retry_until: 0,
            sent_ms: 0,
        };
        let target = self.clients[c].target;
        self.client_send(c, target, req);
    }

    fn client_release(&mut self, c: usize, key: &[u8]) {
        let Some(held) = self.clients[c].held.remove(key) else {
            return;
        };
        // The client stops relying on the lock when it sends the release.
        let b = &mut self.beliefs[held.belief];
        b.end = b.end.min(self.now);
        self.clients[c]
            .releasing
            .insert((key.to_vec(), held.token), held.belief);
        let req = Req {
            limit: 0,
            op: b'R',
            key: key.to_vec(),
            token: held.token,
            lease_ms: 0,
            wait_ms: 0,
            redirects: 0,
            retry_until: self.now + 5_000,
            sent_ms: 0,
        };
        let target = self.clients[c].target;
        self.client_send(c, target, req);
    }

    fn client_send(&mut self, c: usize, node: usize, mut req: Req) {
        req.sent_ms = self.now;
        self.clients[c].busy.insert(req.key.clone());
        let sc = match self.clients[c].conns[node] {
            Some(sc) => Some(sc),
            None => {
                // Any other connection; the answer will redirect.
                let open: Vec<usize> = self.clients[c].conns.iter().flatten().copied().collect();
                (!open.is_empty()).then(|| self.rng.pick(&open))
            }
        };
        let Some(sc) = sc else {
            let at = self.now + self.rng.range(50, 300);
            self.clients[c].retries.push((at, None, req));
            return;
        };
        let n = match self.conns[sc].as_ref().unwrap().parties[1] {
            Party::Node(n) => n,
            Party::Client(_) | Party::Stranger(_) => unreachable!(),
        };
        let line = req.line();
        self.log(format!(
            "client {c} -> n{n}: {}",
            show(&line[..line.len() - 1])
        ));
        self.client_write(c, sc, &line);
        self.clients[c]
            .outstanding
            .entry(sc)
            .or_default()
            .push_back((req, n));
    }

    fn client_close(&mut self, c: usize, sc: usize) {
        let Some(conn) = self.conns[sc].as_mut() else {
            return;
        };
        if !conn.open[0] {
            return;
        }
        conn.open[0] = false;
        conn.close_at[0] = None;
        conn.pipes[1].segs.clear();
        self.clients[c].partial.remove(&sc);
        let conn = self.conns[sc].as_mut().unwrap();
        let node_end_open = conn.open[1];
        let n = match conn.parties[1] {
            Party::Node(n) => n,
            Party::Client(_) | Party::Stranger(_) => unreachable!(),
        };
        if node_end_open {
            // With TLS, its `close_notify` first, as the clients' TLS
            // streams end.
            if let Some(tls) = self.clients[c].tls.get_mut(&sc) {
                tls.send_close_notify();
                self.client_tls_flush(c, sc);
            }
            self.send(sc, 0, Seg::Fin);
        }
        self.clients[c].tls.remove(&sc);
        self.drop_if_done(sc);
        let client = &mut self.clients[c];
        if client.conns[n] == Some(sc) {
            client.conns[n] = None;
            client.reconnect_at[n] = Some(self.now + 100 + (self.now % 400));
        }
        let lost = client.outstanding.remove(&sc).unwrap_or_default();
        for (mut req, _) in lost {
            self.clients[c].busy.remove(&req.key);
            if req.op == b'A' && req.redirects < 30 {
                // Like the official clients: sent again on another
                // connection.
                req.redirects += 1;
                let at = self.now + 50;
                let target = self.clients[c].target;
                self.clients[c].busy.insert(req.key.clone());
                self.clients[c].retries.push((at, Some(target), req));
                continue;
            }
            if req.op == b'R' && self.now < req.retry_until {
                self.clients[c]
                    .resent_releases
                    .insert((req.key.clone(), req.token));
                let at = self.now + 200;
                let target = self.clients[c].target;
                self.clients[c].busy.insert(req.key.clone());
                self.clients[c].retries.push((at, Some(target), req));
            }
        }
    }

    // ----- TLS clients -----

    /// Client `c` connected `sc` to node `n`: with TLS its handshake
    /// starts, the `ClientHello` right behind the connection.
    fn client_tls_start(&mut self, c: usize, sc: usize, n: usize) {
        if !self.cfg.tls {
            return;
        }
        let name = rustls::pki_types::ServerName::try_from(format!("n{n}")).expect("a host name");
        let tls = rustls::ClientConnection::new(sim_tls().client.clone(), name)
            .expect("a TLS client connection");
        self.clients[c].tls.insert(sc, tls);
        self.client_tls_flush(c, sc);
    }

    /// Sends the records client `c`'s TLS connection on `sc` has ready.
    fn client_tls_flush(&mut self, c: usize, sc: usize) {
        let Some(tls) = self.clients[c].tls.get_mut(&sc) else {
            return;
        };
        let mut out = Vec::new();
        while tls.wants_write() {
            // Into a `Vec`: it cannot fail.
            if tls.write_tls(&mut out).is_err() {
                break;
            }
        }
        if !out.is_empty() {
            self.send(sc, 0, Seg::Data(out, self.now));
        }
    }

    /// Client `c` writes `bytes` on `sc`: as they are, or through its TLS
    /// connection (which keeps them until its handshake is done).
    fn client_write(&mut self, c: usize, sc: usize, bytes: &[u8]) {
        let Some(tls) = self.clients[c].tls.get_mut(&sc) else {
            self.send(sc, 0, Seg::Data(bytes.to_vec(), self.now));
            return;
        };
        let taken = std::io::Write::write(&mut tls.writer(), bytes).unwrap_or(0);
        assert_eq!(taken, bytes.len(), "rustls took a whole request");
        self.client_tls_flush(c, sc);
    }

    /// Client `c` read `bytes` on its TLS connection `sc`: returns the
    /// plaintext they complete. A record may be cut between two deliveries
    /// (a partial send) and between two reads (sometimes made here): its
    /// start waits in the rustls connection. When the handshake ends, the
    /// requests written during it go out, and count as sent from then.
    /// `None` if TLS failed (the run fails).
    fn client_tls_read(&mut self, c: usize, sc: usize, bytes: &[u8]) -> Option<Vec<u8>> {
        let cut = if bytes.len() > 1 && self.rng.chance(20) {
            self.rng.range(1, bytes.len() as u64 - 1) as usize
        } else {
            bytes.len()
        };
        let tls = self.clients[c].tls.get_mut(&sc)?;
        let handshaking = tls.is_handshaking();
        let closed = tls
            .process_new_packets()
            .is_ok_and(|io| io.peer_has_closed());
        let mut plain = Vec::new();
        let mut failure = None;
        let mut close_notify = false;
        'pieces: for mut piece in [&bytes[..cut], &bytes[cut..]] {
            while !piece.is_empty() {
                let state = match tls.read_tls(&mut piece) {
                    Ok(_) => tls.process_new_packets().map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match state {
                    Ok(io) => close_notify |= io.peer_has_closed(),
                    Err(why) => {
                        failure = Some(why);
                        break 'pieces;
                    }
                }
                let mut buf = [0u8; 4096];
                // `Ok(0)`: its `close_notify` came; `WouldBlock`: no more
                // plaintext for now.
                while let Ok(n) = std::io::Read::read(&mut tls.reader(), &mut buf)
                    && n > 0
                {
                    plain.extend_from_slice(&buf[..n]);
                }
            }
        }
        let done = handshaking && !tls.is_handshaking();
        let n = self.conns[sc]
            .as_ref()
            .map_or(0, |conn| match conn.parties[1] {
                Party::Node(n) => n,
                Party::Client(_) | Party::Stranger(_) => unreachable!(),
            });
        if let Some(why) = failure {
            self.fail(format!("client {c}: TLS with n{n} failed on #{sc}: {why}"));
            return None;
        }
        if done {
            self.stats.tls_handshakes += 1;
            self.log(format!("client {c}: TLS handshake with n{n} done (#{sc})"));
            let now = self.now;
            for (req, _) in self.clients[c].outstanding.entry(sc).or_default() {
                req.sent_ms = now;
            }
        }
        if close_notify && !closed {
            self.stats.tls_close_notifies += 1;
        }
        self.client_tls_flush(c, sc);
        Some(plain)
    }

    #[expect(clippy::too_many_lines)]
    fn client_input(&mut self, c: usize, sc: usize, bytes: &[u8], sent: u64) {
        let n = match self.conns[sc].as_ref().unwrap().parties[1] {
            Party::Node(n) => n,
            Party::Client(_) | Party::Stranger(_) => unreachable!(),
        };
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            self.clients[c].answers.push((n, show(line)));
            self.log(format!("client {c} <- n{n}: {}", show(line)));
            let answer = match parse_answer(line) {
                Ok(a) => a,
                Err(e) => {
                    self.fail(format!("client {c} got a malformed answer from n{n}: {e}"));
                    return;
                }
            };
            let (key, ops): (&[u8], &[u8]) = match answer {
                Answer::Granted { key, .. } | Answer::TimedOut { key } => (key, b"A"),
                Answer::Moved { key, .. } => (key, b"AGCRN"),
                Answer::Released { key, .. } => (key, b"R"),
                Answer::Renewed { key, .. } => (key, b"N"),
                Answer::Status { .. } => (b"", b"S"),
                Answer::Health { .. } => (b"", b"H"),
                Answer::Error { .. } if self.clients[c].expects_error => continue,
                // The simulated clients never send `L`, `O`, `W`, `V` or `Q`.
                Answer::Lock { .. } | Answer::ListEnd { .. } => (b"", b"L"),
                Answer::Owner { .. } => (b"", b"O"),
                Answer::LockWho { .. } | Answer::WhoEnd { .. } => (b"", b"W"),
                Answer::LockKinds { .. } | Answer::KindsEnd { .. } => (b"", b"V"),
                Answer::Waiter { .. } | Answer::QueueEnd { .. } => (b"", b"Q"),
                Answer::KindGranted { kind, key, .. } => match kind {
                    Kind::Shared => (key, b"G"),
                    Kind::Permit => (key, b"C"),
                },
                Answer::KindRefused { key, .. } => (key, b"GC"),
                Answer::Error { .. } if self.max_conns < MAX_CONNS && is_refusal(line) => {
                    // The documented refusal of a connection beyond
                    // `--max-conns`: the node closes it next, and its
                    // requests are sent again as after any broken one.
                    self.stats.clients_refused += 1;
                    continue;
                }
                Answer::Error { reason } => {
                    self.fail(format!(
                        "check 5: client {c} got E from n{n}: {}",
                        show(reason)
                    ));
                    return;
                }
            };
            let queue = self.clients[c].outstanding.entry(sc).or_default();
            let Some(i) = queue
                .iter()
                .position(|(r, _)| r.key == key && ops.contains(&r.op))
            else {
                if self.clients[c].expects_error {
                    continue;
                }
                self.fail(format!(
                    "client {c}: answer \"{}\" from n{n} matches no request",
                    show(line)
                ));
                return;
            };
            let (req, _) = queue.remove(i).unwrap();
            self.clients[c].busy.remove(&req.key);
            match answer {
                Answer::Granted { key, token } => self.client_granted(c, n, key, token, sent, &req),
                // A shared grant or permit is a grant (`0`: its wait ran
                // out).
                Answer::KindGranted { key, token, .. } if token > 0 => {
                    self.client_granted(c, n, key, token, sent, &req);
                }
                Answer::TimedOut { .. } => {}
                Answer::Moved { addr, .. } => {
                    let mut req = req;
                    req.redirects += 1;
                    let to = addr.and_then(node_of_addr);
                    if let Some(to) = to {
                        self.clients[c].target = to;
                    }
                    if req.redirects > 30 {
                        continue; // give up on this one
                    }
                    let delay = if to.is_some() && req.redirects < 5 {
                        0
                    } else {
                        self.rng.range(20, 200)
                    };
                    self.clients[c].busy.insert(req.key.clone());
                    self.clients[c].retries.push((self.now + delay, to, req));
                }
                Answer::Released { ok, .. } => {
                    let id = (req.key.clone(), req.token);
                    let belief = self.clients[c].releasing.remove(&id);
                    let resent = self.clients[c].resent_releases.remove(&id);
                    if let Some(b) = belief.filter(|_| !ok && !resent) {
                        self.check_lost(b, &req, n);
                    }
                }
                Answer::Renewed { ok, .. } => {
                    let held = self.clients[c].held.get(&req.key).cloned();
                    match held {
                        Some(h) if h.token == req.token && ok => {
                            let b = h.belief;
                            let end = sent + req.lease_ms;
                            if end > self.beliefs[b].end {
                                self.beliefs[b].end = end;
                                self.beliefs[b].lease_end = end;
                                self.check_overlap(b);
                            }
                        }
                        Some(h) if h.token == req.token => {
                            // The server does not know the grant any more.
                            self.check_lost(h.belief, &req, n);
                            self.clients[c].held.remove(&req.key);
                            let b = &mut self.beliefs[h.belief];
                            b.end = b.end.min(self.now);
                            self.log(format!(
                                "client {c}: renew of {} {} refused by n{n}",
                                show(&req.key),
                                req.token
                            ));
                        }
                        _ => {}
                    }
                }
                Answer::Status { .. }
                | Answer::Health { .. }
                | Answer::Error { .. }
                | Answer::Lock { .. }
                | Answer::ListEnd { .. }
                | Answer::Owner { .. }
                | Answer::LockWho { .. }
                | Answer::WhoEnd { .. }
                | Answer::LockKinds { .. }
                | Answer::KindsEnd { .. }
                | Answer::Waiter { .. }
                | Answer::QueueEnd { .. }
                | Answer::KindGranted { .. }
                | Answer::KindRefused { .. } => {}
            }
            if self.failure.is_some() {
                return;
            }
        }
    }

    fn client_granted(&mut self, c: usize, n: usize, key: &[u8], token: u64, sent: u64, req: &Req) {
        self.stats.client_grants += 1;
        if let Some(p) = self.probes.get_mut(c)
            && key == format!("probe{c}").as_bytes()
        {
            *p = Some(token);
        }
        let b = Belief {
            key: key.to_vec(),
            client: c,
            token,
            node: n,
            granted_ms: sent,
            start: self.now,
            end: sent + req.lease_ms,
            lease_end: sent + req.lease_ms,
            // Strictly after: a grant sent in the millisecond the cluster
            // agreed may have been made in that millisecond before it (the
            // active answered a request, then read the merge of the node
            // that gave way).
            after_agreement: self.agreed_since.is_some_and(|a| a < sent),
            member: match req.op {
                b'G' => Some(0),
                b'C' => Some(req.limit),
                _ => None,
            },
        };
        self.beliefs.push(b);
        let idx = self.beliefs.len() - 1;
        let hold_until = self.now + self.rng.range(0, req.lease_ms + 300);
        self.clients[c].held.insert(
            key.to_vec(),
            Held {
                token,
                node: n,
                belief: idx,
                hold_until,
            },
        );
        self.check_overlap(idx);
    }

    /// How many other permits of belief `b`'s key were believed when `b`
    /// began.
    fn permits_beside(&self, b: usize) -> usize {
        let new = &self.beliefs[b];
        self.beliefs
            .iter()
            .enumerate()
            .filter(|&(i, o)| {
                i != b
                    && o.key == new.key
                    && o.member.is_some_and(|l| l > 0)
                    && o.start <= new.start
                    && o.end > new.start
            })
            .count()
    }

    /// Check 4 knows a member is a grant: shared grants may overlap each
    /// other, permits each other while at most their limit are believed at
    /// once (`crowd` others beside the new one).
    fn members_together(new: &Belief, other: &Belief, crowd: usize) -> bool {
        match (new.member, other.member) {
            (Some(0), Some(0)) => true,
            (Some(n), Some(m)) if n > 0 && m > 0 => (crowd as u64) < u64::from(n),
            _ => false,
        }
    }

    /// Check 4: no two clients believe they hold one key at once, outside
    /// a failover or partition window.
    fn check_overlap(&mut self, b: usize) {
        let new = self.beliefs[b].clone();
        let now = self.now;
        let crowd = self.permits_beside(b);
        for (i, other) in self.beliefs.iter().enumerate() {
            if i == b || other.key != new.key || other.end <= new.start.max(other.start) {
                continue;
            }
            if other.start >= new.end || Sim::members_together(&new, other, crowd) {
                continue;
            }
            let from = new.granted_ms.min(other.granted_ms);
            let older = if new.granted_ms < other.granted_ms {
                &new
            } else {
                other
            };
            let lost = (older.key.clone(), older.token);
            // A grant made after the cluster agreed on one active again
            // overlaps nothing a partition left behind: the node that gave
            // way merged its grants into the one that stayed (check 6).
            let (older_ms, newer_ms) = (from, new.granted_ms.max(other.granted_ms));
            // (Unless a crash, leave or hang came between: a failover to a
            // node that had not caught up yet is check 4's business.)
            let failover_between = self
                .windows
                .iter()
                .any(|w| w.kind != "partition" && w.start >= older_ms && w.start <= newer_ms);
            let newer_agreed = !failover_between
                && if new.granted_ms < other.granted_ms {
                    other.after_agreement
                } else {
                    new.after_agreement
                };
            let excuse = self
                .windows
                .iter()
                .find(|w| {
                    w.start <= now
                        && w.end >= from
                        && w.survivors.as_ref().is_none_or(|s| {
                            // Lost, or its renewal was: the survivors'
                            // lease ends before the one its holder got.
                            s.get(&lost).is_none_or(|&end| end < older.end)
                        })
                        && !(newer_agreed && w.kind == "partition")
                })
                .map(|w| w.kind);
            let what = format!(
                "client {} holds {} {} (from n{} at {}, until {}) while client {} got {} {} from n{} at {}",
                other.client,
                show(&other.key),
                other.token,
                other.node,
                other.granted_ms,
                other.end,
                new.client,
                show(&new.key),
                new.token,
                new.node,
                new.granted_ms
            );
            match excuse {
                Some(kind) => {
                    self.stats.me_excused += 1;
                    let line = format!("mutual exclusion broken in a {kind} window: {what}");
                    self.log(line);
                }
                None if newer_agreed => {
                    self.fail(format!(
                        "check 6: a grant after one active was agreed overlaps an older one: {what}"
                    ));
                }
                None => {
                    self.fail(format!("check 4: mutual exclusion: {what}"));
                }
            }
            return;
        }
    }

    /// Check 7: no grant lost without a crash. A release or renewal
    /// refused (`R key 0`, `N key 0`) while the client's lease had not run
    /// out is a lost grant, excused only by a crash (a leave without a
    /// successor, an outage) or a hang in its lifetime, a partition that had
    /// not been healed into one agreed active when the request was sent, or
    /// one that caught the request in flight. A heal loses nothing.
    fn check_lost(&mut self, b: usize, req: &Req, n: usize) {
        let belief = self.beliefs[b].clone();
        if belief.lease_end <= req.sent_ms + LOST_MARGIN_MS {
            return;
        }
        let agreed_at_send = self.agreed_since.is_some_and(|a| a <= req.sent_ms);
        let excuse = self
            .windows
            .iter()
            .find(|w| match w.kind {
                // A partition excuses what was asked before the cluster
                // agreed on one active again, not after; and a request it
                // caught in flight (begun within a delivery of the send),
                // which it held up past the lease's end.
                "partition" => {
                    (w.start <= req.sent_ms && !agreed_at_send)
                        || (req.sent_ms..=req.sent_ms + MAX_DELAY_MS).contains(&w.start)
                }
                // A crash, a leave without a successor, a hang: "without
                // a crash" is the property (that a crash loses only what no
                // other node had is check 4's).
                _ => w.start <= self.now && w.end >= belief.granted_ms,
            })
            .map(|w| w.kind);
        let line = req.line();
        let what = format!(
            "client {} lost {} {} (from n{} at {}, lease to {}): \"{}\" sent at {} refused by n{n}",
            belief.client,
            show(&belief.key),
            belief.token,
            belief.node,
            belief.granted_ms,
            belief.lease_end,
            show(&line[..line.len() - 1]),
            req.sent_ms
        );
        match excuse {
            Some(kind) => {
                self.stats.lost_excused += 1;
                self.log(format!("grant lost in a {kind} window: {what}"));
            }
            None => self.fail(format!("check 7: grant lost without a crash: {what}")),
        }
    }

    // ----- checks -----

    #[expect(clippy::too_many_lines)]
    fn check_step(&mut self) {
        if self.failure.is_some() {
            return;
        }
        let t = self.now;
        for x in 0..self.cfg.nodes {
            if self.nodes[x].inc.is_some() {
                let now = self.node_now(x);
                let inc = self.nodes[x].inc.as_ref().unwrap();
                inc.node.check_invariants(now);
                debug_assert_eq!(inc.role, inc.node.role());
            }
        }
        let actives = self.actives();
        // Roles change only in steps: one active seen after the last step
        // was active until this one (a quiet stretch has no steps).
        if actives.len() == 1 || self.one_active_at_last_step {
            self.last_one_active = t;
        }
        self.one_active_at_last_step = actives.len() == 1;
        // Agreed: one active, no node hears another claim the role, and
        // every node that gave way holds the merged table of the one that
        // stayed.
        let rival_heard = self.nodes.iter().any(|n| {
            n.inc
                .as_ref()
                .and_then(|i| i.node.cluster())
                .is_some_and(|c| c.settling())
        });
        if actives.len() == 1 && self.healed() && !rival_heard {
            self.agreed_since.get_or_insert(t);
        } else {
            self.agreed_since = None;
        }
        // A node whose next deadline stays in the past after its turn makes
        // its I/O loop spin (poll with a zero timeout).
        for x in 0..self.cfg.nodes {
            let since = self.nodes[x].inc.as_ref().and_then(|i| i.spinning_since);
            if let Some(since) = since.filter(|&s| t > s + self.spin_limit_ms) {
                let role = self.role(x);
                self.fail(format!(
                    "busy loop: n{x} ({role:?}) has had a deadline in the past since {since}"
                ));
            }
        }
        let healed = self.healed_for();
        // Check 1: at most one active once healed for longer than the
        // failure timeout (plus margin).
        if healed > SETTLE_MS && actives.len() > 1 {
            self.fail(format!(
                "check 1: {} actives {actives:?} after {healed} ms healed",
                actives.len()
            ));
        }
        // ... and not none for long: a hand-off leaves a gap of one delivery.
        let any_up = (0..self.cfg.nodes).any(|x| self.up(x));
        if healed > SETTLE_MS + PEER_TIMEOUT_MS
            && any_up
            && t - self.last_one_active > 2 * MAX_DELAY_MS + 10
            && t - self.last_disturbance > SETTLE_MS + PEER_TIMEOUT_MS + 2 * MAX_DELAY_MS + 10
        {
            let roles: Vec<Option<Role>> = (0..self.cfg.nodes).map(|x| self.role(x)).collect();
            self.fail(format!(
                "check 1: no active since {} ({} ms) in a healed cluster: {roles:?}",
                self.last_one_active,
                t - self.last_one_active
            ));
        }
        // In the last 500 ms of a run (healed for long), the replicas must
        // match the active's table at least once (bytes may be in flight at
        // any one moment).
        if self.probe_sent && t + 500 >= self.end && !self.replicas_matched {
            self.replicas_matched = self.replica_diff().is_none();
        }
        // Every request is answered in time: releases, renewals and acquires
        // with a wait, unless a fault came in between or the node that
        // took it has crashed or is leaving. Time counts from when
        // the node could read it: a connection that waited in the node's
        // backlog (failed accepts) is read once taken.
        let mut unanswered = None;
        if self.healed() {
            for (c, client) in self.clients.iter().enumerate() {
                for (&sc, reqs) in &client.outstanding {
                    let Some(conn) = self.conns.get(sc).and_then(|c| c.as_ref()) else {
                        continue;
                    };
                    let Some(accepted) = conn.accepted_ms else {
                        continue; // still in the backlog
                    };
                    for (req, n) in reqs {
                        if req.op == b'A' && req.wait_ms == 0 {
                            continue;
                        }
                        // Sent to a node that has crashed or is shutting
                        // down, before its close reached the client (the
                        // client learns of it from the close, not from an
                        // answer).
                        let gone = !conn.open[1]
                            || !self.listens(*n)
                            || conn.gens[1] != self.nodes[*n].generation;
                        if gone {
                            continue;
                        }
                        let due = req.sent_ms.max(accepted) + req.wait_ms + 2 * MAX_DELAY_MS + 10;
                        if t > due && self.last_disturbance < req.sent_ms {
                            let line = req.line();
                            let what = format!(
                                "client {c}: no answer from n{n} to \"{}\" sent at {}",
                                show(&line[..line.len() - 1]),
                                req.sent_ms
                            );
                            unanswered.get_or_insert(what);
                        }
                    }
                }
            }
        }
        if let Some(what) = unanswered {
            self.fail(what);
        }
        // A graceful leave: an active within one round trip, normally the
        // successor (a higher-priority node that saw the leaver go may take
        // the role first, with the same state).
        if let Some((s, deadline, from)) = self.leave_check
            && t >= deadline
        {
            self.leave_check = None;
            let fault_since = self.windows.iter().any(|w| w.end >= deadline - 50);
            let actives: Vec<usize> = actives.iter().copied().filter(|&x| self.runs(x)).collect();
            if self.runs(s) && actives.is_empty() && !fault_since {
                let role = self.role(s);
                self.fail(format!(
                    "graceful leave of n{from}: no active {} ms later (successor n{s} is {role:?})",
                    2 * MAX_DELAY_MS + 5
                ));
            }
        }
    }

    fn send_probes(&mut self) {
        self.probe_sent = true;
        for c in 0..self.clients.len() {
            let req = Req {
                limit: 0,
                op: b'A',
                key: format!("probe{c}").into_bytes(),
                token: 0,
                lease_ms: 60_000,
                wait_ms: 0,
                redirects: 0,
                retry_until: 0,
                sent_ms: 0,
            };
            let target = self.clients[c].target;
            self.client_send(c, target, req);
        }
    }

    /// After the final settle: one active (the first node), every other node
    /// follows it with the same grants, every probe granted.
    fn final_checks(&mut self) {
        if self.failure.is_some() {
            return;
        }
        let actives = self.actives();
        if actives != [0] {
            let roles: Vec<Option<Role>> = (0..self.cfg.nodes).map(|x| self.role(x)).collect();
            self.fail(format!(
                "final: actives {actives:?}, want [0] (failback): roles {roles:?}"
            ));
            return;
        }
        for x in 1..self.cfg.nodes {
            let role = self.role(x);
            if role
                != Some(Role::Standby {
                    following: Some(PeerId(0)),
                })
            {
                self.fail(format!(
                    "final: n{x} is {role:?}, want a standby following n0"
                ));
                return;
            }
        }
        if !self.replicas_matched {
            let diff = self.replica_diff().unwrap_or_default();
            self.fail(format!(
                "final: the replicas never matched the active's table in the last 500 ms: {diff}"
            ));
            return;
        }
        for c in 0..self.clients.len() {
            if self.probes[c].is_none() {
                let answers: Vec<&(usize, String)> =
                    self.clients[c].answers.iter().rev().take(5).collect();
                self.fail(format!(
                    "final: client {c}'s probe acquire was not granted within 1 s (last answers {answers:?})"
                ));
                return;
            }
        }
    }

    /// How every standby's table differs from the single active's, if it
    /// does. Grants a hair from expiry are left out (a standby's copy
    /// expires a delivery later than the active's).
    pub fn replica_diff(&self) -> Option<String> {
        let actives = self.actives();
        let [a] = actives[..] else {
            return Some(format!("actives {actives:?}"));
        };
        let grants = |x: usize| {
            let now = self.node_now(x);
            let engine = self.nodes[x].inc.as_ref().unwrap().node.engine();
            let all: BTreeSet<(Vec<u8>, u64)> = engine
                .grants()
                .chain(engine.member_grants())
                .map(|(k, t, _)| (k.to_vec(), t))
                .collect();
            let firm: BTreeSet<(Vec<u8>, u64)> = engine
                .grants()
                .chain(engine.member_grants())
                .filter(|&(_, _, e)| e > now.ms + 200)
                .map(|(k, t, _)| (k.to_vec(), t))
                .collect();
            (all, firm)
        };
        let (want_all, want_firm) = grants(a);
        let mut diff = String::new();
        for x in (0..self.cfg.nodes).filter(|&x| x != a && self.runs(x)) {
            let (have_all, have_firm) = grants(x);
            let missing: Vec<String> = want_firm
                .difference(&have_all)
                .map(|(k, t)| format!("{} {t}", show(k)))
                .collect();
            let extra: Vec<String> = have_firm
                .difference(&want_all)
                .map(|(k, t)| format!("{} {t}", show(k)))
                .collect();
            if !missing.is_empty() || !extra.is_empty() {
                let _ = write!(
                    diff,
                    "n{x} vs active n{a}: missing {missing:?}, extra {extra:?}; "
                );
            }
        }
        (!diff.is_empty()).then_some(diff)
    }

    // ----- scripted use -----

    /// Sends `A key lease 0` from client `c` to the node it believes active
    /// and runs until it is granted (following `M`). Returns the token.
    pub fn acquire(&mut self, c: usize, key: &str, lease_ms: u64) -> Result<u64, String> {
        self.acquire_kind(c, key, None, lease_ms)
    }

    /// [`Sim::acquire`] with `G` (`limit` `Some(0)`) or `C` (a permit of a
    /// semaphore of `limit`), or `A` (`None`).
    pub fn acquire_kind(
        &mut self,
        c: usize,
        key: &str,
        limit: Option<u32>,
        lease_ms: u64,
    ) -> Result<u64, String> {
        let req = Req {
            limit: limit.unwrap_or(0),
            op: match limit {
                None => b'A',
                Some(0) => b'G',
                Some(_) => b'C',
            },
            key: key.as_bytes().to_vec(),
            token: 0,
            lease_ms,
            wait_ms: 0,
            redirects: 0,
            retry_until: 0,
            sent_ms: 0,
        };
        let target = self.clients[c].target;
        self.client_send(c, target, req);
        let deadline = self.now + 3_000;
        while self.now < deadline && self.failure.is_none() {
            if let Some(h) = self.clients[c].held.get(key.as_bytes())
                && !self.clients[c].busy.contains(key.as_bytes())
            {
                return Ok(h.token);
            }
            if !self.clients[c].busy.contains(key.as_bytes()) {
                return Err(format!("client {c}: acquire {key} not granted"));
            }
            self.run_for(1);
        }
        Err(self
            .failure
            .clone()
            .unwrap_or_else(|| format!("client {c}: acquire {key} timed out")))
    }

    /// Pins node `x`'s wall clock offset (before it issues tokens).
    pub fn set_drift_ms(&mut self, x: usize, ms: i64) {
        assert!(ms.unsigned_abs() <= MAX_DRIFT_MS);
        self.nodes[x].drift_ns = ms * 1_000_000;
        self.cfg.drift_ms = self.cfg.drift_ms.max(ms.unsigned_abs());
    }

    /// The node client `c` sends to first.
    pub fn set_target(&mut self, c: usize, node: usize) {
        self.clients[c].target = node;
    }

    /// Every answer client `c` received: (node, line).
    pub fn answers(&self, c: usize) -> &[(usize, String)] {
        &self.clients[c].answers
    }

    /// Sends `A key lease wait` from client `c` to `node` without waiting
    /// for the answer (it follows `M` like any request).
    pub fn send_acquire(&mut self, c: usize, node: usize, key: &str, lease_ms: u64, wait_ms: u64) {
        self.send_acquire_kind(c, node, key, None, lease_ms, wait_ms);
    }

    /// [`Sim::send_acquire`] of a kind, as [`Sim::acquire_kind`].
    pub fn send_acquire_kind(
        &mut self,
        c: usize,
        node: usize,
        key: &str,
        limit: Option<u32>,
        lease_ms: u64,
        wait_ms: u64,
    ) {
        let req = Req {
            limit: limit.unwrap_or(0),
            op: match limit {
                None => b'A',
                Some(0) => b'G',
                Some(_) => b'C',
            },
            key: key.as_bytes().to_vec(),
            token: 0,
            lease_ms,
            wait_ms,
            redirects: 0,
            retry_until: 0,
            sent_ms: 0,
        };
        self.client_send(c, node, req);
    }

    /// How many bytes a socket holds unread before its sender has to wait
    /// (set before the connections that should have it are made).
    pub fn set_socket_buffer(&mut self, bytes: usize) {
        self.socket_buf = bytes;
    }

    /// Sets `--max-conns` of every node, those running included.
    pub fn set_max_conns(&mut self, max_conns: usize) {
        self.max_conns = max_conns;
        for slot in &mut self.nodes {
            if let Some(inc) = &mut slot.inc {
                inc.driver.set_max_conns(max_conns);
            }
        }
    }

    /// Client `c` stops or resumes reading its sockets.
    pub fn set_reading(&mut self, c: usize, reading: bool) {
        self.log(format!("client {c} reading: {reading}"));
        // Its answers are late on purpose: not a fault of the cluster's.
        self.disturb();
        self.clients[c].reading = reading;
    }

    /// Client `c` expects `E` answers (it will send broken lines).
    pub fn expect_errors(&mut self, c: usize) {
        self.clients[c].expects_error = true;
    }

    /// Sends `R key 1` from client `c` to `node` for each key, in one
    /// segment (releases of nothing, answered `R key 0` by the active node).
    pub fn send_releases(&mut self, c: usize, node: usize, keys: &[String]) {
        let sc = self.clients[c].conns[node].expect("connected");
        let mut bytes = Vec::new();
        for key in keys {
            let req = Req {
                limit: 0,
                op: b'R',
                key: key.as_bytes().to_vec(),
                token: 1,
                lease_ms: 0,
                wait_ms: 0,
                redirects: 100,
                retry_until: 0,
                sent_ms: self.now,
            };
            bytes.extend_from_slice(&req.line());
            self.clients[c].busy.insert(req.key.clone());
            self.clients[c]
                .outstanding
                .entry(sc)
                .or_default()
                .push_back((req, node));
        }
        self.client_write(c, sc, &bytes);
    }

    /// [`Sim::send_releases`] with an acquire of `key` (no wait) at the end
    /// of the same segment: a node that pauses the client in the middle of
    /// the segment keeps the acquire in its stash.
    pub fn send_releases_then_acquire(
        &mut self,
        c: usize,
        node: usize,
        keys: &[String],
        key: &str,
        lease_ms: u64,
    ) {
        let sc = self.clients[c].conns[node].expect("connected");
        let mut bytes = Vec::new();
        let releases = keys.iter().map(|k| (b'R', k.as_str(), 1, 0, 100));
        for (op, k, token, lease_ms, redirects) in releases.chain([(b'A', key, 0, lease_ms, 0)]) {
            let req = Req {
                limit: 0,
                op,
                key: k.as_bytes().to_vec(),
                token,
                lease_ms,
                wait_ms: 0,
                redirects,
                retry_until: 0,
                sent_ms: self.now,
            };
            bytes.extend_from_slice(&req.line());
            self.clients[c].busy.insert(req.key.clone());
            self.clients[c]
                .outstanding
                .entry(sc)
                .or_default()
                .push_back((req, node));
        }
        self.client_write(c, sc, &bytes);
    }

    /// Sends raw bytes from client `c` to `node`, expecting no answer.
    pub fn send_raw(&mut self, c: usize, node: usize, bytes: &[u8]) {
        let sc = self.clients[c].conns[node].expect("connected");
        self.client_write(c, sc, bytes);
    }

    /// Client `c` shuts down its sending side of its connection to `node`
    /// (it goes on reading).
    pub fn half_close(&mut self, c: usize, node: usize) {
        let sc = self.clients[c].conns[node].expect("connected");
        self.log(format!("client {c} shuts its side of #{sc}"));
        if let Some(tls) = self.clients[c].tls.get_mut(&sc) {
            tls.send_close_notify();
            self.client_tls_flush(c, sc);
        }
        self.send(sc, 0, Seg::Fin);
    }

    /// The connection client `c` has to `node`, if any.
    pub fn client_conn(&self, c: usize, node: usize) -> Option<usize> {
        self.clients[c].conns[node]
    }

    /// What a test can see of connection `sc` (a client's); `None` once
    /// both ends are closed.
    pub fn conn_view(&self, sc: usize) -> Option<ConnView> {
        let conn = self.conns[sc].as_ref()?;
        let Party::Node(x) = conn.parties[1] else {
            return None;
        };
        let node_phase = conn.cids[1].filter(|_| conn.open[1]).and_then(|cid| {
            self.nodes[x]
                .inc
                .as_ref()
                .and_then(|i| i.lives.get(&cid))
                .map(Lifecycle::phase)
        });
        Some(ConnView {
            node_open: conn.open[1],
            node_phase,
            unread_by_node: self.queued(sc, 0),
            unread_by_client: self.queued(sc, 1),
        })
    }

    /// Breaks the peer link node `from` dialed to node `to`.
    pub fn break_link(&mut self, from: usize, to: usize) {
        let sc = self.peer_links().into_iter().find(|&sc| {
            self.conns[sc].as_ref().unwrap().parties == [Party::Node(from), Party::Node(to)]
        });
        self.break_conn(sc.expect("no such link"));
    }

    /// Sends `R key token` from client `c` to node `node` and returns the
    /// answer line.
    pub fn release_at(&mut self, c: usize, node: usize, key: &str, token: u64) -> String {
        let before = self.clients[c].answers.len();
        if let Some(h) = self.clients[c].held.remove(key.as_bytes()) {
            let b = &mut self.beliefs[h.belief];
            b.end = b.end.min(self.now);
        }
        let req = Req {
            limit: 0,
            op: b'R',
            key: key.as_bytes().to_vec(),
            token,
            lease_ms: 0,
            wait_ms: 0,
            redirects: 100, // no redirects: we want this node's answer
            retry_until: 0,
            sent_ms: 0,
        };
        // This node's answer needs a connection to it: a client redials a
        // node that went away within 500 ms.
        for _ in 0..1_000 {
            if self.clients[c].conns[node].is_some() {
                break;
            }
            self.run_for(1);
        }
        self.client_send(c, node, req);
        for _ in 0..1_000 {
            if self.clients[c].answers.len() > before {
                return self.clients[c].answers[before].1.clone();
            }
            self.run_for(1);
        }
        "no answer".into()
    }
}

fn memchr_first(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

fn memchr_last(b: &[u8]) -> Option<usize> {
    b.iter().rposition(|&c| c == b'\n')
}

/// EMFILE: the process is out of file descriptors.
const fn libc_emfile() -> i32 {
    24
}

/// The TLS server configuration of the strangers' connections (made once:
/// no handshake ever reads a byte, so the certificate is never used).
fn stranger_tls() -> std::sync::Arc<rustls::ServerConfig> {
    static CONFIG: std::sync::OnceLock<std::sync::Arc<rustls::ServerConfig>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let rcgen::CertifiedKey { cert, key_pair } =
                rcgen::generate_simple_self_signed(vec!["n0".to_string()]).expect("a certificate");
            let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key)
                .expect("a server configuration");
            std::sync::Arc::new(config)
        })
        .clone()
}

/// The lifecycle of a peer link to node `peer` dialed at `now_ms` in a TLS
/// run, as the loops' `LoopTls::dialed` makes it: a rustls client
/// connection presenting the node certificate, checking the peer's against
/// the host of its address, and the handshake deadline.
fn dialed_tls(peer: usize, now_ms: u64) -> Lifecycle {
    let name = ringlock::tls::peer_server_name(&addr(peer)).expect("a host name");
    let conn = rustls::ClientConnection::new(sim_tls().peer_client.clone(), name)
        .expect("a TLS client connection");
    Lifecycle::with_tls(
        rustls::Connection::Client(conn),
        now_ms + HANDSHAKE_MS,
        None,
        None,
    )
}

/// The TLS of the nodes' connections when a run has it
/// ([`SimConfig::tls`]): the server configuration the loops build with
/// `--tls-cert` on a node with peers (clients without certificates, the
/// peer CA checked for peer lines), and the clients' configuration, which
/// trusts that certificate.
struct SimTls {
    server: std::sync::Arc<rustls::ServerConfig>,
    peer_check: std::sync::Arc<dyn rustls::server::danger::ClientCertVerifier>,
    client: std::sync::Arc<rustls::ClientConfig>,
    /// The dialed peer links' configuration: as the loops' `peer_client`,
    /// it presents the node certificate and trusts the peer CA (here that
    /// certificate itself).
    peer_client: std::sync::Arc<rustls::ClientConfig>,
}

/// The fixed key of the simulated nodes' certificate: Ed25519 (its
/// signatures are deterministic) in PKCS#8, from a fixed seed.
fn sim_tls_key() -> Vec<u8> {
    const PKCS8_ED25519_PREFIX: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let mut der = PKCS8_ED25519_PREFIX.to_vec();
    der.extend((0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(11)));
    der
}

/// Made once, and the same in every run: a fixed key, a self-signed
/// certificate with fixed fields (so with the same bytes each time) naming
/// every node's host. rustls draws the handshakes' randomness itself (the
/// ring provider's key shares), so ciphertexts differ between runs of a
/// seed, but with TLS 1.3, X25519 and an Ed25519 certificate every
/// record's length is fixed: the simulation depends on lengths only (see
/// [`Sim::node_input_tls`]), so a seed still replays exactly.
fn sim_tls() -> &'static SimTls {
    static CONFIG: std::sync::OnceLock<SimTls> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| {
        let key_der = sim_tls_key();
        let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(key_der.clone());
        let key_pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ED25519)
            .expect("the fixed Ed25519 key");
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("certificate names");
        params.serial_number = Some(rcgen::SerialNumber::from(vec![1u8]));
        let cert = params.self_signed(&key_pair).expect("a certificate");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).expect("a trust anchor");
        let roots = std::sync::Arc::new(roots);
        let verifier = |unauthenticated: bool| {
            let b = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.clone(),
                provider.clone(),
            );
            let b = if unauthenticated {
                b.allow_unauthenticated()
            } else {
                b
            };
            b.build().expect("a client verifier")
        };
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_der.into());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_client_cert_verifier(verifier(true))
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("a server configuration");
        let peer_check = verifier(false);
        let builder = || {
            rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots.clone())
        };
        let mut client = builder().with_no_client_auth();
        client.resumption = rustls::client::Resumption::disabled();
        let node_key = rustls::pki_types::PrivateKeyDer::Pkcs8(sim_tls_key().into());
        let mut peer_client = builder()
            .with_client_auth_cert(vec![cert.der().clone()], node_key)
            .expect("the node certificate");
        peer_client.resumption = rustls::client::Resumption::disabled();
        SimTls {
            server: std::sync::Arc::new(server),
            peer_check,
            client: std::sync::Arc::new(client),
            peer_client: std::sync::Arc::new(peer_client),
        }
    })
}
