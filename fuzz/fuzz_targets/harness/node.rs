//! The node harness, shared by the fuzz target (fuzz/fuzz_targets/node.rs)
//! and its stable twin (tests/fuzz_node.rs).
//!
//! One [`Node`], member `me` of a three-node cluster whose secret the
//! harness knows, is driven the way the I/O loops drive it, by steps decoded
//! from the input bytes: connections opened (asking [`Node::admit`]) and
//! closed; client bytes, arbitrary or well-formed requests, fed through a
//! [`Session`]; peer lines, arbitrary or well-formed: a valid handshake
//! (HELLO, then AUTH with the MAC computed from the node's CHALLENGE), or one
//! with a wrong MAC, index, fingerprint or address, then heartbeats, SNAP,
//! G, X, SYNCED, MERGE, MERGED, PROBE, PROBED and HANDOFF with fuzzed fields; ticks, time moving by fuzzed
//! amounts and jumps, the wall clock stepping (each tick after the links
//! doomed since the last one are closed, as a loop turn ends with
//! `take_doomed`); the node's dials
//! (`take_dials`), failed or opened, its HELLO answered with a valid or a
//! wrong CHALLENGE; output taken (`take_dirty`, whole or in part) and links
//! the node gave up on closed (`take_doomed`, then `io::take_final_output`,
//! as the loops do); a peer restarting; the node leaving.
//!
//! After every step: [`Node::check_invariants`], and
//!
//! - the highest token never goes down and never exceeds `MAX_TOKEN`; a
//!   token granted in a step is above every token known before it;
//! - a connection broken (`Flow::Broken`) or doomed is closed: its output
//!   ended with an `E` line (except when it was itself refused with an `E`
//!   line on a peer link), and afterwards the node keeps no link, no output
//!   and no writes for it;
//! - output is bounded and well-formed: whole lines of at most `MAX_LINE`
//!   bytes (`H` lines: their quoted problem; `E` lines: see [`Lenience`]);
//!   on a link the node dialed only valid peer lines (its AUTH only for a
//!   CHALLENGE with a right MAC, and with a right MAC itself), answers and
//!   `E` lines, heartbeats only below the heartbeat backlog; on a connection
//!   it accepted only answers (at most one per line received, plus `E`
//!   lines) and a CHALLENGE whose MAC is right for the HELLO it got;
//! - a genuine handshake is taken and a wrong one never, both ways;
//! - a grant replicated by the followed active is applied; a node that
//!   turns active keeps the grants it had;
//! - after two quiet loop turns at one time the node's next deadline is in
//!   the future (its loop would not spin).
//!
//! Written for both editions the two crates use (2021 and 2024).

use ringlock::cluster::auth::{self, Fingerprint, Identity, Nonce, Secret, Side};
use ringlock::cluster::wire::{self, MAX_PEERS, MAX_REMAINING_MS, PeerMsg};
use ringlock::cluster::{ClusterConfig, PeerId, Role};
use ringlock::driver::{ACCEPT_RETRY_MS, Driver};

use ringlock::engine::token::MAX_TOKEN;
use ringlock::engine::{ConnId, Now};
use ringlock::io::{self, Flow, LINGER_MS, OUTPUT_PAUSE_BYTES, Session};
use ringlock::node::{Admission, MAX_PROBLEM_BYTES, Node, NodeConfig};
use ringlock::proto::{Answer, MAX_DURATION_MS, MAX_LINE, Request, parse_answer};

use super::peer_line::{check_bounds, esc};

pub const HEARTBEAT_MS: u64 = 50;
pub const PEER_TIMEOUT_MS: u64 = 500;
/// The cluster's secret: the harness speaks for the other two nodes.
pub const SECRET: &[u8] = b"the fuzz harness's cluster secret, 32+ bytes";
const WRONG_SECRET: &[u8] = b"a stranger's secret, also of 32+ bytes....";
/// Mirrors the cluster's private `HEARTBEAT_BACKLOG_BYTES`: a link with this
/// much unsent gets no more heartbeats.
const HEARTBEAT_BACKLOG_BYTES: usize = 64 * 1024;
const T0_MS: u64 = 1_000;
const EPOCH_NS: u64 = 1_700_000_000_000_000_000;
/// Connections open at once, at most (beyond it an open is skipped).
const MAX_OPEN: usize = 24;
/// Tokens granted, kept for releases and renewals.
const KEEP_TOKENS: usize = 16;
/// Time stops here (35 years on): the wall clock stays far below year 2262,
/// where tokens would pass `MAX_TOKEN` by the clock alone.
const MAX_NOW_MS: u64 = 1 << 40;
/// How long a TLS handshake may take (the loops' handshake deadline).
const HANDSHAKE_MS: u64 = 1_000;

/// What the harness tolerates of the product's known findings (see
/// fuzz/README.md, "Findings"), so that fuzzing goes on past them.
#[derive(Debug, Clone, Copy)]
pub struct Lenience {
    /// Tokens the harness's peers send stay this far below `MAX_TOKEN`: a
    /// node that heard a token within this margin of it issues tokens past
    /// it (`TokenClock::next` has no ceiling below `u64::MAX`).
    pub token_margin: u64,
    /// The longest `E` line: `MAX_LINE` (the other side's limit) since the
    /// reasons of peer links are quoted and cut.
    pub e_line_max: usize,
    /// `Node::check_invariants` after `Node::leave` too (it holds since a
    /// node leaving alone steps its cluster down with its engine).
    pub invariants_after_leave: bool,
}

/// Today's known findings tolerated: what the fuzz target and `cargo test`
/// run with.
pub const KNOWN: Lenience = Lenience {
    token_margin: 0,
    e_line_max: MAX_LINE,
    invariants_after_leave: true,
};

/// Nothing tolerated: the product as documented.
pub const STRICT: Lenience = Lenience {
    token_margin: 0,
    e_line_max: MAX_LINE,
    invariants_after_leave: true,
};

pub fn peers() -> Vec<String> {
    (0..3).map(|i| format!("10.0.0.{}:7171", i + 1)).collect()
}

/// Keys shared by client requests and replicated grants.
fn key_menu(i: u8) -> Vec<u8> {
    match i % 8 {
        0 | 1 => b"k0".to_vec(),
        2 => b"k1".to_vec(),
        3 => b"k2".to_vec(),
        4 => b"lock/\x80\xff".to_vec(),
        5 => vec![b'k'; 250],
        6 => b"k3".to_vec(),
        _ => b"z".to_vec(),
    }
}

/// The fuzz bytes, read as numbers; zeros once they run out.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    pub fn flag(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = end.max(self.pos);
        &self.data[start..end]
    }
}

/// How far a run got: the stable twin checks that its inputs reach every
/// part of the node.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub became_active: u64,
    pub followed: u64,
    pub handoffs_taken: u64,
    pub authed_in: u64,
    pub authed_out: u64,
    pub granted: u64,
    pub replicated: u64,
    pub broken: u64,
    pub doomed: u64,
    pub paused: u64,
    pub peer_only: u64,
    pub conflicts: u64,
    pub left: u64,
    /// Leaves that handed the active role over to a successor.
    pub handed_over: u64,
    pub accept_failed: u64,
    pub accept_retried: u64,
    pub handshakes_expired: u64,
    pub setup_failed: u64,
    pub shutdown_turns: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.became_active += o.became_active;
        self.followed += o.followed;
        self.handoffs_taken += o.handoffs_taken;
        self.authed_in += o.authed_in;
        self.authed_out += o.authed_out;
        self.granted += o.granted;
        self.replicated += o.replicated;
        self.broken += o.broken;
        self.doomed += o.doomed;
        self.paused += o.paused;
        self.peer_only += o.peer_only;
        self.conflicts += o.conflicts;
        self.left += o.left;
        self.handed_over += o.handed_over;
        self.accept_failed += o.accept_failed;
        self.accept_retried += o.accept_retried;
        self.handshakes_expired += o.handshakes_expired;
        self.setup_failed += o.setup_failed;
        self.shutdown_turns += o.shutdown_turns;
    }
}

/// The HELLO the harness sent on a connection, as some peer.
#[derive(Debug, Clone)]
struct SentHello {
    fingerprint: Fingerprint,
    index: u64,
    addr: Vec<u8>,
    incarnation: u64,
    nonce: Nonce,
    /// The peer's own identity: nothing in it differs from the node's
    /// configuration.
    genuine: bool,
}

/// How a node or the harness introduced itself in a HELLO or CHALLENGE.
#[derive(Debug, Clone)]
struct Ident {
    fingerprint: Fingerprint,
    index: u64,
    addr: Vec<u8>,
    nonce: Nonce,
}

impl Ident {
    fn identity(&self) -> Identity<'_> {
        Identity {
            fingerprint: self.fingerprint,
            index: self.index,
            addr: &self.addr,
            nonce: self.nonce,
        }
    }
}

struct Conn {
    id: ConnId,
    session: Session,
    /// The peer the node dialed on it; None: a connection it accepted.
    outbound: Option<usize>,
    /// Accepted: the HELLO the harness sent, and the node's CHALLENGE.
    hello: Option<SentHello>,
    challenge: Option<Ident>,
    /// Dialed: the node's HELLO (its incarnation too), and the harness's
    /// CHALLENGE.
    node_hello: Option<(Ident, u64)>,
    sent_challenge: Option<Ident>,
    challenge_mac_right: bool,
    /// Bytes of the node's output for it already checked.
    scanned: usize,
    lines_in: u64,
    lines_out: u64,
    /// An `E` line was written to it.
    e_out: bool,
    /// An `E ` line was fed to it (a refusal on a peer link breaks it
    /// without an `E` line in answer).
    e_in: bool,
    at_line_start: bool,
    e_pending: bool,
}

impl Conn {
    fn new(id: ConnId, outbound: Option<usize>) -> Conn {
        Conn {
            id,
            session: Session::new(),
            outbound,
            hello: None,
            challenge: None,
            node_hello: None,
            sent_challenge: None,
            challenge_mac_right: false,
            scanned: 0,
            lines_in: 0,
            lines_out: 0,
            e_out: false,
            e_in: false,
            at_line_start: true,
            e_pending: false,
        }
    }

    fn note_input(&mut self, data: &[u8]) {
        for &b in data {
            if self.e_pending && b == b' ' {
                self.e_in = true;
            }
            self.e_pending = self.at_line_start && b == b'E';
            self.at_line_start = b == b'\n';
            if b == b'\n' {
                self.lines_in += 1;
            }
        }
    }
}

pub struct Harness {
    node: Node,
    /// The loops' per-turn policy, driven as they drive it.
    driver: Driver,
    /// Connections accepted with TLS whose client never speaks: (id, the
    /// handshake deadline). The driver must close each by its deadline.
    stalled: Vec<(ConnId, u64)>,
    /// Connections waiting in the listen backlog (not accepted yet).
    backlog: usize,
    /// After an accept failed: when the driver must let the loop retry.
    accept_retry_at: Option<u64>,
    me: usize,
    peers: Vec<String>,
    secret: Secret,
    wrong_secret: Secret,
    fingerprint: Fingerprint,
    now_ms: u64,
    skew_ns: i64,
    max_conns: usize,
    conns: Vec<Conn>,
    /// Ids free to reuse, and ids closed since the last `take_doomed` (a
    /// doomed entry may still name them: the loops consume those in the
    /// turn they close a connection, before its id can be reused).
    free: Vec<ConnId>,
    quarantine: Vec<ConnId>,
    next_id: u32,
    /// Ids opened at least once (index: id).
    ever_opened: Vec<bool>,
    /// Dials the node asked for, not resolved yet.
    dials: Vec<usize>,
    /// Incarnations of the peers the harness speaks for.
    incarnations: [u64; 3],
    nonces: u64,
    /// The highest token after the last step.
    highest: u64,
    tokens: Vec<(Vec<u8>, u64)>,
    /// A grant (key, token) the harness replicated as the followed active.
    last_replicated: Option<(Vec<u8>, u64)>,
    left: bool,
    /// `Node::tick` ran since the last `take_doomed`.
    ticked: bool,
    /// The last line of the last connection broken, for messages.
    last_break: Vec<u8>,
    lenience: Lenience,
    pub stats: Stats,
}

/// Runs one input, the known findings tolerated; returns how far it got.
pub fn run(data: &[u8]) -> Stats {
    run_with(data, KNOWN)
}

/// Runs one input, tolerating what `lenience` says.
pub fn run_with(data: &[u8], lenience: Lenience) -> Stats {
    let mut input = Input::new(data);
    let mut h = Harness::new(&mut input, lenience);
    while !input.is_empty() && !h.left {
        h.step(&mut input);
    }
    h.stats
}

impl Harness {
    pub fn new(input: &mut Input<'_>, lenience: Lenience) -> Harness {
        let me = usize::from(input.u8() % 3);
        let max_conns = 2 + usize::from(input.u8() % 8);
        let incarnation = input.u64();
        let peers = peers();
        let secret = Secret::from_bytes(SECRET);
        let now = Now {
            ms: T0_MS,
            us: T0_MS * 1000,
            unix_ns: EPOCH_NS + T0_MS * 1_000_000,
        };
        let node = Node::new(
            now,
            NodeConfig {
                advertise: peers[me].clone(),
                // Small, so that inputs reach a full table.
                max_locks: 64,
                cluster: Some(ClusterConfig {
                    peers: peers.clone(),
                    me: PeerId(me),
                    heartbeat_ms: HEARTBEAT_MS,
                    peer_timeout_ms: PEER_TIMEOUT_MS,
                    failback_delay_ms: 0,
                    incarnation,
                    secret: secret.clone(),
                    read_batch_us: ringlock::cluster::DEFAULT_READ_BATCH_US,
                }),
            },
        );
        let mut h = Harness {
            node,
            driver: Driver::new(max_conns, Some(HANDSHAKE_MS)),
            stalled: Vec::new(),
            backlog: 0,
            accept_retry_at: None,
            me,
            fingerprint: auth::fingerprint(wire::FINGERPRINT_VERSION, &peers),
            peers,
            secret,
            wrong_secret: Secret::from_bytes(WRONG_SECRET),
            now_ms: T0_MS,
            skew_ns: 0,
            max_conns,
            conns: Vec::new(),
            free: Vec::new(),
            quarantine: Vec::new(),
            next_id: 0,
            ever_opened: Vec::new(),
            dials: Vec::new(),
            incarnations: [11, 22, 33],
            nonces: 0,
            highest: 0,
            tokens: Vec::new(),
            last_replicated: None,
            left: false,
            ticked: false,
            last_break: Vec::new(),
            lenience,
            stats: Stats::default(),
        };
        h.check(0, None);
        h
    }

    /// Moves the clocks on, up to [`MAX_NOW_MS`].
    fn advance(&mut self, ms: u64) {
        self.now_ms = self.now_ms.saturating_add(ms).min(MAX_NOW_MS);
    }

    fn now(&self) -> Now {
        let wall = (EPOCH_NS + self.now_ms * 1_000_000) as i64 + self.skew_ns;
        Now {
            ms: self.now_ms,
            us: self.now_ms * 1000,
            unix_ns: wall.max(0) as u64,
        }
    }

    // ------------------------------------------------------------ steps

    pub fn step(&mut self, input: &mut Input<'_>) {
        self.stats.steps += 1;
        let before_highest = self.highest;
        let role_before = self.node.role();
        // A standby's grants, to check that it keeps them if it turns active.
        let grants_before: Option<Vec<(Vec<u8>, u64, u64)>> =
            (role_before != Role::Active).then(|| {
                self.node
                    .engine()
                    .grants()
                    .map(|(k, t, e)| (k.to_vec(), t, e))
                    .collect()
            });
        let op = input.u8();
        let mut handoff_from = None;
        match op % 32 {
            0 | 1 => self.open(),
            2 => self.close(input),
            3 | 4 => self.feed_arbitrary(input, false),
            5..=7 => self.feed_requests(input),
            8 => self.feed_arbitrary(input, true),
            9 => {
                self.hello(input);
            }
            10 => self.auth(input),
            11 | 12 => {
                if let Some(ci) = self.hello(input) {
                    self.check(before_highest, None);
                    self.auth_on(ci, input);
                }
            }
            13..=20 => {
                let kind = match op % 32 {
                    13 | 14 => PeerKind::Heartbeat,
                    15 => PeerKind::Snapshot,
                    16 | 17 => PeerKind::Grant,
                    18 => PeerKind::Release,
                    19 => match input.u8() % 6 {
                        0 | 1 => PeerKind::Synced,
                        2 => PeerKind::Merge,
                        3 => PeerKind::Merged,
                        4 => PeerKind::Probe,
                        _ => PeerKind::Probed,
                    },
                    _ => PeerKind::Handoff,
                };
                handoff_from = self.peer_message(input, kind);
            }
            21..=23 => self.tick(input),
            24 => self.take_dials(),
            25 => self.resolve_dial(input),
            26 => self.challenge(input),
            27 | 28 => self.drain(input),
            29 => self.take_doomed(),
            30 => self.quiet_turns(input),
            _ => self.misc(input),
        }
        self.check(before_highest, grants_before);
        let role = self.node.role();
        if role != role_before {
            match role {
                Role::Active => {
                    self.stats.became_active += 1;
                    if handoff_from.is_some()
                        && role_before
                            == (Role::Standby {
                                following: handoff_from.map(PeerId),
                            })
                    {
                        self.stats.handoffs_taken += 1;
                    }
                }
                Role::Standby { following: Some(_) } => self.stats.followed += 1,
                Role::Standby { following: None } => {}
            }
        }
        if self.node.problem(self.now()).is_some() {
            self.stats.conflicts += 1;
        }
    }

    fn alloc_id(&mut self) -> ConnId {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.next_id += 1;
                ConnId::new(self.next_id - 1)
            }
        };
        let i = id.index();
        if self.ever_opened.len() <= i {
            self.ever_opened.resize(i + 1, false);
        }
        self.ever_opened[i] = true;
        id
    }

    fn open(&mut self) {
        if self.conns.len() >= MAX_OPEN {
            return;
        }
        if self.accept_retry_at.is_some() {
            // The listener is not read until the retry: it waits there.
            self.backlog += 1;
            return;
        }
        self.accept();
    }

    /// Accepts one connection as the loops do: through `Driver::admit`.
    fn accept(&mut self) {
        let now = self.now();
        let open = self.open_conns();
        match self.driver.admit(&mut self.node, open) {
            Admission::Client => {
                let id = self.alloc_id();
                self.node.open(id);
                self.driver.opened(now.ms, id, false);
                self.conns.push(Conn::new(id, None));
            }
            Admission::PeerOnly => {
                let id = self.alloc_id();
                self.node.open_peer_only(now, id);
                self.driver.opened(now.ms, id, false);
                self.conns.push(Conn::new(id, None));
                self.stats.peer_only += 1;
            }
            Admission::Refuse => {}
        }
    }

    /// Connections that hold a slot (the stalled handshakes too).
    fn open_conns(&self) -> usize {
        self.conns.len() + self.stalled.len()
    }

    /// The kernel fails an accept (out of descriptors) while a connection
    /// waits in the backlog.
    fn accept_fails(&mut self) {
        let now = self.now();
        let emfile = std::io::Error::from_raw_os_error(24);
        self.driver.accept_failed(&mut self.node, now, &emfile);
        self.stats.accept_failed += 1;
        self.backlog += 1;
        if !self.driver.is_shutting_down() {
            self.accept_retry_at = Some(now.ms + ACCEPT_RETRY_MS);
        }
    }

    /// A TLS client connects and never finishes its handshake (or a socket
    /// cannot be set up: dropped before it takes a slot).
    fn accept_stalled(&mut self, setup_fails: bool) {
        if self.open_conns() >= MAX_OPEN || self.accept_retry_at.is_some() {
            return;
        }
        let now = self.now();
        let open = self.open_conns();
        if self.driver.admit(&mut self.node, open) == Admission::Refuse {
            return;
        }
        if setup_fails {
            self.driver
                .setup_failed(&mut self.node, now, "TCP_NODELAY", &"EINVAL");
            self.stats.setup_failed += 1;
            return;
        }
        let id = self.alloc_id();
        self.node.open(id);
        self.driver.opened(now.ms, id, true);
        self.stalled.push((id, now.ms + HANDSHAKE_MS));
    }

    /// The driver's deadlines, as a loop turn acts on them: the accept
    /// retry, then the handshakes due. Checks them from the outside.
    fn driver_deadlines(&mut self) {
        let now = self.now();
        if self.driver.accept_retry_due(now.ms) {
            let at = self.accept_retry_at.take();
            assert!(
                at.is_some_and(|at| now.ms >= at),
                "accept retried at {} before it was due ({at:?})",
                now.ms
            );
            self.stats.accept_retried += 1;
            let waiting = std::mem::take(&mut self.backlog);
            for _ in 0..waiting {
                if self.conns.len() < MAX_OPEN {
                    self.accept();
                }
            }
        } else if let Some(at) = self.accept_retry_at {
            assert!(
                now.ms < at || self.driver.is_shutting_down(),
                "accept retry due at {at}, none by {} with {} waiting",
                now.ms,
                self.backlog
            );
        }
        while let Some(id) = self.driver.due_handshake(now.ms) {
            if let Some(i) = self.stalled.iter().position(|&(s, _)| s == id) {
                self.stalled.swap_remove(i);
                self.stats.handshakes_expired += 1;
                self.node.close(now, id);
                self.quarantine.push(id);
            }
        }
        if let Some(&(id, until)) = self.stalled.iter().find(|&&(_, until)| until <= now.ms) {
            panic!("handshake of {id} due at {until}, still open at {}", now.ms);
        }
    }

    /// Picks an open connection; `prefer` ones first when the choice says so.
    fn pick(&self, input: &mut Input<'_>, prefer: impl Fn(&Conn) -> bool) -> Option<usize> {
        if self.conns.is_empty() {
            return None;
        }
        let b = input.u8();
        if b & 0x80 == 0 {
            let preferred: Vec<usize> = (0..self.conns.len())
                .filter(|&i| prefer(&self.conns[i]))
                .collect();
            if !preferred.is_empty() {
                return Some(preferred[usize::from(b) % preferred.len()]);
            }
        }
        Some(usize::from(b) % self.conns.len())
    }

    fn close(&mut self, input: &mut Input<'_>) {
        let Some(ci) = self.pick(input, |_| false) else {
            return;
        };
        if input.flag() {
            // The other side closed: what was decided is taken, then closed.
            self.close_final(ci);
        } else {
            // The connection died (a write failed): closed at once.
            let now = self.now();
            self.scan(ci);
            let conn = self.conns.swap_remove(ci);
            self.node.close(now, conn.id);
            self.quarantine.push(conn.id);
        }
    }

    /// Takes the last output and closes, as the loops do; returns the output.
    fn close_final(&mut self, ci: usize) -> Vec<u8> {
        let now = self.now();
        self.scan(ci);
        let conn = self.conns.swap_remove(ci);
        let out = io::take_final_output(&mut self.node, now, conn.id);
        self.quarantine.push(conn.id);
        out
    }

    /// Feeds `data` to a connection as one read or two, as the loop would.
    fn feed(&mut self, ci: usize, data: &[u8], split: u8) -> Fed {
        let cut = if split == 0 || data.len() < 2 {
            data.len()
        } else {
            1 + usize::from(split) % (data.len() - 1)
        };
        let id = self.conns[ci].id;
        let mut all = true;
        let mut at = Some(ci);
        for piece in [&data[..cut], &data[cut..]] {
            let Some(ci) = at else { return Fed::Closed };
            if piece.is_empty() {
                continue;
            }
            let paused = self.node.output_mut(id).len() > OUTPUT_PAUSE_BYTES;
            all &= !paused;
            at = self.feed_one(ci, piece);
        }
        match at {
            Some(ci) if all && !self.conns[ci].session.has_stash() => Fed::Processed,
            Some(_) => Fed::Skipped,
            None => Fed::Closed,
        }
    }

    /// One read. Returns the connection's index if it is still open.
    fn feed_one(&mut self, ci: usize, data: &[u8]) -> Option<usize> {
        let now = self.now();
        let id = self.conns[ci].id;
        // The loop does not read a connection whose answers pile up, and
        // processes what a pause kept back before reading more.
        if self.node.output_mut(id).len() > OUTPUT_PAUSE_BYTES {
            return Some(ci);
        }
        let mut flow = Flow::Open;
        if self.conns[ci].session.has_stash() {
            flow = self.conns[ci].session.resume(&mut self.node, now, id);
        }
        if flow == Flow::Open {
            self.conns[ci].note_input(data);
            flow = self.conns[ci].session.feed(&mut self.node, now, id, data);
        }
        self.after_flow(ci, flow)
    }

    fn after_flow(&mut self, ci: usize, flow: Flow) -> Option<usize> {
        match flow {
            Flow::Open => Some(ci),
            Flow::Paused => {
                self.stats.paused += 1;
                assert!(self.conns[ci].session.has_stash());
                Some(ci)
            }
            Flow::Broken => {
                self.stats.broken += 1;
                let e_in = self.conns[ci].e_in;
                let id = self.conns[ci].id;
                let out = self.close_final(ci);
                let last = last_line(&out);
                assert!(
                    last.starts_with(b"E ") || e_in,
                    "connection {id} broken without an E line: its output ends {:?}",
                    esc(last)
                );
                self.last_break = last.to_vec();
                None
            }
        }
    }

    fn feed_arbitrary(&mut self, input: &mut Input<'_>, peer: bool) {
        let Some(ci) = self.pick(input, |c| c.hello.is_some()) else {
            return;
        };
        let len = input.u8();
        let split = input.u8();
        let mut data = Vec::new();
        if peer {
            data.extend_from_slice(if len & 0x80 != 0 { b"E " } else { b"P " });
        }
        if len >= 250 {
            // Past the 512-byte line limit.
            let b = input.u8();
            data.resize(data.len() + 300 + usize::from(len - 250) * 80, b);
        } else {
            data.extend_from_slice(input.bytes(usize::from(len % 64)));
        }
        if peer {
            data.push(b'\n');
        }
        self.feed(ci, &data, split);
    }

    fn token(&mut self, input: &mut Input<'_>) -> u64 {
        let b = input.u8();
        match b % 11 {
            0 => 0,
            1 => u64::from(input.u8()),
            2 => self.highest.saturating_add(u64::from(input.u16())),
            3 => self.highest.saturating_sub(u64::from(input.u16())),
            4 => EPOCH_NS + self.now_ms * 1_000_000 + u64::from(input.u32()),
            // Near the top of the token space (see `Lenience::token_margin`).
            5 => MAX_TOKEN - self.lenience.token_margin - u64::from(input.u16()),
            6 => input.u64() % (MAX_TOKEN - self.lenience.token_margin + 1),
            // Past the bound: the node must refuse the line.
            7 => match input.u8() % 3 {
                0 => MAX_TOKEN + 1,
                1 => u64::MAX,
                _ => MAX_TOKEN + 1 + u64::from(input.u32()),
            },
            _ => match self.tokens.len() {
                0 => self.highest,
                n => self.tokens[usize::from(input.u8()) % n].1,
            },
        }
    }

    fn duration(&mut self, input: &mut Input<'_>, min: u64) -> u64 {
        let b = input.u8();
        let ms = match b % 6 {
            0 => u64::from(b / 6),
            1 => u64::from(input.u16()),
            2 => 1_000 * u64::from(input.u8() % 60),
            3 => MAX_DURATION_MS,
            4 => u64::from(input.u32()) % (MAX_DURATION_MS + 1),
            _ => 100 + u64::from(input.u8()),
        };
        ms.max(min)
    }

    fn feed_requests(&mut self, input: &mut Input<'_>) {
        let Some(ci) = self.pick(input, |c| c.outbound.is_none() && c.hello.is_none()) else {
            return;
        };
        let n = 1 + input.u8() % 3;
        let split = input.u8();
        let mut data = Vec::new();
        for _ in 0..n {
            let kind = input.u8();
            let key = key_menu(input.u8());
            let known: Vec<u64> = self
                .tokens
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|&(_, t)| t)
                .collect();
            let token = match (known.len(), kind & 0x80 != 0) {
                (0, _) | (_, true) => self.token(input).max(1),
                (n, false) => known[usize::from(input.u8()) % n],
            };
            let prefix = &key[..usize::from(input.u8()) % (key.len() + 1)];
            let req = match kind % 7 {
                // Some acquires are shared ones or permits (bits of `kind`
                // that pick nothing else): a node with peers refuses them.
                0 | 1 if kind & 0x60 == 0x60 => Request::Shared {
                    key: &key,
                    lease_ms: self.duration(input, 1),
                    wait_ms: self.duration(input, 0),
                },
                0 | 1 if kind & 0x60 == 0x40 => Request::Permit {
                    key: &key,
                    limit: 1 + u32::from(kind & 0x03),
                    lease_ms: self.duration(input, 1),
                    wait_ms: self.duration(input, 0),
                },
                0 | 1 => Request::Acquire {
                    key: &key,
                    lease_ms: self.duration(input, 1),
                    wait_ms: self.duration(input, 0),
                },
                2 => Request::Release { key: &key, token },
                3 => Request::Renew {
                    key: &key,
                    token,
                    lease_ms: self.duration(input, 1),
                },
                4 => Request::Status,
                5 => Request::Health,
                _ => {
                    let cursor = match input.u8() % 3 {
                        0 => 0,
                        1 => u64::from(input.u16()),
                        _ => input.u64(),
                    };
                    let limit = 1 + u32::from(input.u16()) % 1000;
                    // `L`, and `V` (which lists the kinds) now and then.
                    if kind & 0x60 == 0x60 {
                        Request::Kinds {
                            cursor,
                            limit,
                            prefix,
                        }
                    } else {
                        Request::List {
                            cursor,
                            limit,
                            prefix,
                        }
                    }
                }
            };
            req.encode(&mut data);
        }
        if n == 3 && split == 0xff {
            // A burst: enough answers to pass the pause.
            let one = data.clone();
            for _ in 0..input.u16() % 4096 {
                data.extend_from_slice(&one);
            }
        }
        self.feed(ci, &data, split);
    }

    fn next_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        let mut nonce = [0u8; auth::NONCE_LEN];
        nonce[..8].copy_from_slice(&self.nonces.to_be_bytes());
        nonce[8..].copy_from_slice(&0x6e6f_6e63_6566_757au64.to_be_bytes());
        nonce
    }

    /// Claims to be a peer on an accepted connection: `HELLO` (right or
    /// wrong). Returns the connection's index if it is still open.
    fn hello(&mut self, input: &mut Input<'_>) -> Option<usize> {
        let ci = self.pick(input, |c| c.outbound.is_none() && c.hello.is_none())?;
        let who = input.u8();
        let how = input.u8();
        let split = input.u8();
        let index = match who % 16 {
            0..=13 => ((self.me + 1 + usize::from(who % 2)) % 3) as u64,
            14 => self.me as u64,
            _ => u64::from(input.u8()) % MAX_PEERS as u64,
        };
        let peer = (index as usize).min(2);
        let mut genuine = index < 3 && index as usize != self.me;
        let mut hello = SentHello {
            fingerprint: self.fingerprint,
            index,
            addr: match self.peers.get(index as usize) {
                Some(a) => a.as_bytes().to_vec(),
                None => b"10.9.9.9:7171".to_vec(),
            },
            incarnation: self.incarnations[peer],
            nonce: self.next_nonce(),
            genuine: false,
        };
        match how % 32 {
            28 => {
                hello.fingerprint.0 ^= 1 << (input.u8() % 64);
                genuine = false;
            }
            29 => {
                hello.addr = self.peers[(peer + 1) % 3].as_bytes().to_vec();
                genuine = false;
            }
            30 => {
                // Some other valid address: long, not UTF-8.
                let len = 1 + usize::from(input.u8()) % 250;
                hello.addr = (0..len).map(|i| 0x80 + (i % 0x7f) as u8).collect();
                genuine = false;
            }
            // A restart, as far as the node can tell.
            31 => hello.incarnation = input.u64(),
            _ => {}
        }
        hello.genuine = genuine;
        let mut line = Vec::new();
        wire::encode(
            &mut line,
            &PeerMsg::Hello {
                version: wire::VERSION,
                fingerprint: hello.fingerprint,
                from: PeerId(index as usize),
                addr: &hello.addr,
                incarnation: hello.incarnation,
                nonce: hello.nonce,
            },
        );
        let id = self.conns[ci].id;
        self.conns[ci].hello = Some(hello);
        self.conns[ci].challenge = None;
        self.feed(ci, &line, split);
        // Still open (it may have moved: closes swap-remove).
        self.conns.iter().position(|c| c.id == id)
    }

    fn auth(&mut self, input: &mut Input<'_>) {
        if let Some(ci) = self.pick(input, |c| c.challenge.is_some()) {
            self.auth_on(ci, input);
        }
    }

    /// Proves (or fails to prove) the HELLO sent on `ci` with `AUTH`.
    fn auth_on(&mut self, ci: usize, input: &mut Input<'_>) {
        let how = input.u8();
        let split = input.u8();
        let conn = &self.conns[ci];
        let right_mac = how % 16 < 13 && conn.challenge.is_some();
        let genuine = right_mac && conn.hello.as_ref().is_some_and(|h| h.genuine);
        let mac = match (&conn.hello, &conn.challenge) {
            (Some(hello), Some(challenge)) => {
                let dialer = Ident {
                    fingerprint: hello.fingerprint,
                    index: hello.index,
                    addr: hello.addr.clone(),
                    nonce: hello.nonce,
                };
                let transcript = auth::Transcript {
                    dialer: dialer.identity(),
                    dialer_incarnation: hello.incarnation,
                    acceptor: challenge.identity(),
                };
                let mut mac = match how % 16 {
                    13 => self.wrong_secret.sign(Side::Dialer, &transcript),
                    // Reflected: the acceptor's MAC sent as the dialer's.
                    14 => self.secret.sign(Side::Acceptor, &transcript),
                    _ => self.secret.sign(Side::Dialer, &transcript),
                };
                if how % 16 == 15 {
                    mac[usize::from(input.u8()) % auth::MAC_LEN] ^= 1;
                }
                mac
            }
            _ => [input.u8(); auth::MAC_LEN],
        };
        let mut line = Vec::new();
        wire::encode(&mut line, &PeerMsg::Auth { mac });
        let id = self.conns[ci].id;
        let was = self.authenticated(id);
        // In its handshake: the node sent a CHALLENGE and waits for AUTH.
        // (Not glued to bytes sent before.)
        let pending = !was
            && self.node.is_peer_link(id)
            && self.conns[ci].outbound.is_none()
            && self.conns[ci].at_line_start;
        let fed = self.feed(ci, &line, split);
        let now_authed = fed != Fed::Closed && self.authenticated(id);
        if !was && now_authed {
            self.stats.authed_in += 1;
            assert!(
                genuine && pending,
                "connection {id} authenticated by a wrong AUTH"
            );
        }
        if fed == Fed::Processed {
            assert!(now_authed, "AUTH on {id} neither taken nor refused");
        }
        if genuine && pending && fed != Fed::Skipped {
            assert!(
                now_authed,
                "a genuine AUTH on {id} refused: {:?}",
                esc(&self.last_break)
            );
        }
    }

    fn authenticated(&self, id: ConnId) -> bool {
        self.node
            .cluster()
            .is_some_and(|c| c.is_authenticated_in(id))
    }

    /// A peer message on a connection (an authenticated link, mostly).
    /// Returns the peer a HANDOFF came from.
    #[expect(clippy::too_many_lines)]
    fn peer_message(&mut self, input: &mut Input<'_>, kind: PeerKind) -> Option<usize> {
        let node = &self.node;
        let ci = self.pick(input, |c| {
            node.cluster()
                .is_some_and(|cl| cl.is_authenticated_in(c.id))
        })?;
        let split = input.u8();
        let key = key_menu(input.u8());
        let msg = match kind {
            PeerKind::Heartbeat => {
                let b = input.u8();
                let following = match b % 8 {
                    0..=2 => Some(usize::from(b % 8)),
                    3 | 4 => None,
                    5 => Some(self.me),
                    6 => Some(usize::from(input.u8()) % MAX_PEERS),
                    _ => None,
                };
                PeerMsg::Heartbeat {
                    active: b & 0x80 != 0,
                    following: following.map(PeerId),
                    highest: self.token(input),
                    synced: b & 0x40 != 0,
                }
            }
            PeerKind::Snapshot => PeerMsg::Snapshot {
                highest: self.token(input),
            },
            PeerKind::Grant => {
                let token = self.token(input);
                let b = input.u8();
                let remaining_ms = match b % 5 {
                    0 => 0,
                    1 => u64::from(b),
                    2 => u64::from(input.u16()),
                    3 => MAX_REMAINING_MS,
                    _ => u64::from(input.u32()) % (MAX_REMAINING_MS + 1),
                };
                PeerMsg::Grant {
                    key: &key,
                    token,
                    remaining_ms,
                    holder: if input.flag() {
                        ringlock::proto::Holder {
                            addr: Some(b"127.0.0.1:9"),
                            owner: Some(b"fuzz/1"),
                            identity: Some(b"fuzz-client"),
                        }
                    } else {
                        ringlock::proto::Holder::default()
                    },
                }
            }
            PeerKind::Release => {
                let token = match &self.last_replicated {
                    Some((k, t)) if input.flag() && *k == key => *t,
                    _ => self.token(input),
                };
                PeerMsg::Release { key: &key, token }
            }
            PeerKind::Synced => PeerMsg::Synced,
            PeerKind::Merge => PeerMsg::Merge {
                highest: self.token(input),
            },
            PeerKind::Merged => PeerMsg::Merged,
            PeerKind::Probe => PeerMsg::Probe { seq: input.u64() },
            PeerKind::Probed => PeerMsg::Probed { seq: input.u64() },
            PeerKind::Handoff => PeerMsg::Handoff {
                highest: self.token(input),
            },
        };
        let mut line = Vec::new();
        wire::encode(&mut line, &msg);
        let id = self.conns[ci].id;
        let from = self.node.cluster().and_then(|_| {
            self.conns[ci]
                .hello
                .as_ref()
                .map(|h| h.index as usize)
                .filter(|_| self.authenticated(id))
        });
        // A superseded link's lines are ignored (a newer link from the
        // same peer speaks for it).
        let superseded = self.node.cluster().is_some_and(|c| c.is_superseded(id));
        let following_sender = !superseded
            && from.is_some()
            && self.node.role()
                == (Role::Standby {
                    following: from.map(PeerId),
                });
        let fed = self.feed(ci, &line, split);
        let applied = match msg {
            PeerMsg::Grant { token, .. } if following_sender && fed == Fed::Processed => {
                Some(token)
            }
            _ => None,
        };
        if let Some(token) = applied {
            // From the followed active: the standby holds it now (until a
            // tick ends it, even with 0 ms left), or, inside a `MERGE`, the
            // key is held and the grant merged beside its grant.
            let engine = self.node.engine();
            let holds = engine.holder(&key).map(|h| h.0);
            assert!(
                holds == Some(token) || (holds.is_some() && engine.believed_count() > 0),
                "replicated grant of {:?} not applied: holds {holds:?}, token {token}, members {:?}, role {:?}, line {:?}, limit {:?}",
                esc(&key),
                engine.members_of(&key),
                self.node.role(),
                esc(&line),
                engine.semaphore_limit(&key),
            );
            self.stats.replicated += 1;
            self.last_replicated = Some((key.clone(), token));
        }
        match msg {
            PeerMsg::Handoff { .. } => from,
            _ => None,
        }
    }

    fn tick(&mut self, input: &mut Input<'_>) {
        let b = input.u8();
        let ms = match b {
            0..=99 => u64::from(b),
            100..=179 => u64::from(b - 100) * 10,
            180..=249 => u64::from(b - 180) * HEARTBEAT_MS,
            250 => 10_000,
            251 => 60_000,
            252 => 3_600_000,
            253 => MAX_DURATION_MS + 1,
            _ => u64::from(input.u32()),
        };
        self.advance(ms);
        self.tick_node();
    }

    /// `Node::tick`, as a loop turn begins. A loop ends every turn with
    /// `take_doomed`, so the links doomed since the last tick are closed
    /// first if the steps did not close them.
    fn tick_node(&mut self) {
        if self.ticked {
            self.take_doomed();
        }
        let now = self.now();
        self.node.tick(now);
        self.ticked = true;
    }

    fn take_dials(&mut self) {
        let now = self.now();
        let mut dials = Vec::new();
        self.driver.take_dials(&mut self.node, now, &mut dials);
        for (id, addr) in dials {
            let peer = id.0;
            assert!(peer != self.me && peer < 3, "dials node {peer}");
            assert_eq!(addr, self.peers[peer]);
            assert!(!self.dials.contains(&peer), "dials {peer} twice");
            self.dials.push(peer);
        }
    }

    fn resolve_dial(&mut self, input: &mut Input<'_>) {
        if self.dials.is_empty() {
            return;
        }
        let b = input.u8();
        let peer = self.dials.swap_remove(usize::from(b) % self.dials.len());
        let now = self.now();
        if b & 0x80 != 0 || self.conns.len() >= MAX_OPEN {
            self.node.dial_failed(now, PeerId(peer));
        } else {
            let id = self.alloc_id();
            self.conns.push(Conn::new(id, Some(peer)));
            self.node.outbound_open(now, id, PeerId(peer));
        }
    }

    /// Answers the node's HELLO on a link it dialed, as the peer it dialed
    /// (or as someone else, or with a wrong MAC).
    #[expect(clippy::too_many_lines)]
    fn challenge(&mut self, input: &mut Input<'_>) {
        let Some(ci) = self.pick(input, |c| {
            c.node_hello.is_some() && c.sent_challenge.is_none()
        }) else {
            return;
        };
        let how = input.u8();
        let split = input.u8();
        let Some(dialed) = self.conns[ci].outbound else {
            return;
        };
        let index = match how % 16 {
            10 => u64::from(input.u8() % 3),
            11 => u64::from(input.u8()) % MAX_PEERS as u64,
            _ => dialed as u64,
        };
        let mut me = Ident {
            fingerprint: self.fingerprint,
            index,
            addr: match self.peers.get(index as usize) {
                Some(a) => a.as_bytes().to_vec(),
                None => b"10.9.9.9:7171".to_vec(),
            },
            nonce: self.next_nonce(),
        };
        if how % 16 == 12 {
            me.fingerprint = Fingerprint(input.u64());
        }
        let right_mac = !matches!(how % 16, 13..=15);
        let genuine = right_mac && index as usize == dialed && me.fingerprint == self.fingerprint;
        let Some((node_hello, incarnation)) = self.conns[ci].node_hello.clone() else {
            // No HELLO seen: a CHALLENGE out of the blue.
            let line = format!(
                "P CHALLENGE {:016x} 1 a:1 {} {}\n",
                7,
                "ab".repeat(16),
                "cd".repeat(32)
            );
            self.feed(ci, line.as_bytes(), split);
            return;
        };
        let transcript = auth::Transcript {
            dialer: node_hello.identity(),
            dialer_incarnation: incarnation,
            acceptor: me.identity(),
        };
        let mut mac = match how % 16 {
            13 => self.wrong_secret.sign(Side::Acceptor, &transcript),
            14 => self.secret.sign(Side::Dialer, &transcript),
            _ => self.secret.sign(Side::Acceptor, &transcript),
        };
        if how % 16 == 15 {
            mac[usize::from(input.u8()) % auth::MAC_LEN] ^= 1;
        }
        let mut line = Vec::new();
        wire::encode(
            &mut line,
            &PeerMsg::Challenge {
                fingerprint: me.fingerprint,
                index: PeerId(index as usize),
                addr: &me.addr,
                nonce: me.nonce,
                mac,
            },
        );
        let id = self.conns[ci].id;
        // The first answer to its HELLO (a second one breaks the link), not
        // glued to bytes sent before.
        let first = self.conns[ci].sent_challenge.is_none()
            && self.conns[ci].at_line_start
            && self.node.cluster().is_some_and(|c| c.is_peer_link(id));
        self.conns[ci].sent_challenge = Some(me);
        self.conns[ci].challenge_mac_right = right_mac;
        let fed = self.feed(ci, &line, split);
        if fed == Fed::Processed {
            assert!(genuine, "a wrong CHALLENGE taken on {id}");
        }
        if genuine && first && fed != Fed::Skipped {
            assert_eq!(
                fed,
                Fed::Processed,
                "a genuine CHALLENGE refused on {id}: {:?}",
                esc(&self.last_break)
            );
        }
    }

    /// `take_dirty`, then the output of each dirty connection taken, whole
    /// or in part (a short write), or left (the peer does not read).
    fn drain(&mut self, input: &mut Input<'_>) {
        let how = input.u8();
        for ci in self.take_dirty() {
            // New output of this very call (replication) is checked first.
            self.scan(ci);
            let out = self.node.output_mut(self.conns[ci].id);
            let take = match how % 4 {
                0 | 1 => out.len(),
                2 => out.len() / 2,
                _ => 0,
            };
            out.drain(..take);
            self.conns[ci].scanned -= take;
        }
    }

    /// `take_dirty`: the indexes of the connections with output, each
    /// open, each once.
    fn take_dirty(&mut self) -> Vec<usize> {
        let now = self.now();
        let mut dirty = Vec::new();
        self.node.take_dirty(now, &mut dirty);
        let mut seen = dirty.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), dirty.len(), "a connection twice in {dirty:?}");
        dirty
            .iter()
            .map(|&id| match self.conns.iter().position(|c| c.id == id) {
                Some(ci) => ci,
                None => panic!("take_dirty gave connection {id}, which is not open"),
            })
            .collect()
    }

    fn take_doomed(&mut self) {
        let now = self.now();
        let mut doomed = Vec::new();
        self.node.take_doomed(now, &mut doomed);
        for id in doomed {
            assert!(
                self.ever_opened.get(id.index()).copied().unwrap_or(false),
                "doomed connection {id} was never opened"
            );
            // Closed already (broken, or closed by its peer): nothing to do.
            let Some(ci) = self.conns.iter().position(|c| c.id == id) else {
                continue;
            };
            self.scan(ci);
            assert!(
                self.conns[ci].e_out,
                "connection {id} doomed without an E line"
            );
            self.stats.doomed += 1;
            self.close_final(ci);
        }
        self.free.append(&mut self.quarantine);
        self.ticked = false;
    }

    /// One loop turn: tick, send, close the doomed, dial.
    fn turn(&mut self) {
        self.tick_node();
        for ci in self.take_dirty() {
            self.scan(ci);
            self.node.output_mut(self.conns[ci].id).clear();
            self.conns[ci].scanned = 0;
        }
        self.take_doomed();
        self.driver_deadlines();
        self.take_dials();
        let now = self.now();
        self.driver.end_turn(&mut self.node, now);
    }

    /// Two loop turns at one time with no input: then the node's next
    /// deadline is in the future, or its loop would spin.
    fn quiet_turns(&mut self, input: &mut Input<'_>) {
        self.advance(u64::from(input.u8() % 64));
        self.turn();
        self.check(self.highest, None);
        self.turn();
        self.check(self.highest, None);
        let now = self.now();
        if let Some(deadline) = self.node.next_deadline() {
            assert!(
                deadline > now.ms,
                "next deadline {deadline} not after now {} after two quiet turns: the loop spins",
                now.ms
            );
        }
    }

    fn misc(&mut self, input: &mut Input<'_>) {
        let b = input.u8();
        match b % 8 {
            0 => {
                // A peer restarts: a new incarnation in its next HELLOs.
                self.incarnations[usize::from(b / 8) % 3] += 1;
            }
            1 => {
                // The wall clock steps (either way, up to ~33 s).
                self.skew_ns = i64::from(input.u16() as i16) * 1_000_000;
            }
            2 => {
                self.max_conns = 2 + usize::from(input.u8() % 8);
                self.driver.set_max_conns(self.max_conns);
            }
            3 if b >= 0xc0 && input.u8() < 16 => self.leave(),
            3 => match (b / 8) % 4 {
                0 => self.accept_fails(),
                1 => self.accept_stalled(false),
                2 => self.accept_stalled(true),
                _ => {}
            },
            4 => {
                // Time passes with the loop turning, nothing read or sent:
                // heartbeats pile up on the links until their backlog.
                let turns = match b {
                    0xf0..=0xff => 2048 + usize::from(input.u16() % 2048),
                    _ => 1 + usize::from(input.u8() % 64),
                };
                for _ in 0..turns {
                    self.advance(HEARTBEAT_MS);
                    self.tick_node();
                }
            }
            _ => {
                // Connections whose answers were taken go on with the input
                // a pause kept back.
                let now = self.now();
                let mut ci = 0;
                while ci < self.conns.len() {
                    let id = self.conns[ci].id;
                    let ready = self.conns[ci].session.has_stash()
                        && self.node.output_mut(id).len() <= OUTPUT_PAUSE_BYTES;
                    let mut next = ci + 1;
                    if ready {
                        let flow = self.conns[ci].session.resume(&mut self.node, now, id);
                        if self.after_flow(ci, flow).is_none() {
                            next = ci; // swap-removed: the next one is here now
                        }
                    }
                    ci = next;
                }
            }
        }
    }

    /// SIGTERM through the driver: the node leaves, the last output is
    /// sent, every connection is closed but the stalled handshakes, and the
    /// loop turns until the driver says it is finished: at the latest at
    /// the shutdown's deadline.
    fn leave(&mut self) {
        let now = self.now();
        let before = self.node.role();
        let leaving = self.driver.shut_down(&mut self.node, now);
        let Some(leaving) = leaving else {
            panic!("the first SIGTERM began no shutdown");
        };
        // Only an active hands its role over, and only to one of its peers.
        if let Some(addr) = &leaving.successor {
            assert_eq!(before, Role::Active, "a standby handed off to {addr}");
            assert!(self.peers.contains(addr) && *addr != self.peers[self.me]);
            self.stats.handed_over += 1;
        }
        assert_eq!(
            self.driver.shut_down(&mut self.node, now),
            None,
            "only the first"
        );
        assert!(!self.node.engine().is_active(), "serves after leaving");
        self.left = true;
        self.stats.left += 1;
        self.check(self.highest, None);
        for ci in self.take_dirty() {
            self.scan(ci);
        }
        while !self.conns.is_empty() {
            self.close_final(self.conns.len() - 1);
        }
        self.check(self.highest, None);
        // Accepted now: refused.
        let before = self.open_conns();
        self.accept();
        assert_eq!(self.open_conns(), before, "accepted while shutting down");
        let mut turns = 0;
        while !self.driver.finished(self.now_ms, self.open_conns()) {
            assert!(
                self.now_ms <= now.ms + LINGER_MS,
                "not finished {LINGER_MS} ms after SIGTERM: {} open",
                self.open_conns()
            );
            self.advance(HEARTBEAT_MS);
            self.turn();
            turns += 1;
        }
        self.stats.shutdown_turns += turns;
    }

    // ------------------------------------------------------------ checks

    /// Everything that must hold after a step.
    fn check(&mut self, before_highest: u64, grants_before: Option<Vec<(Vec<u8>, u64, u64)>>) {
        let now = self.now();
        if self.left && !self.lenience.invariants_after_leave {
            // See `Lenience::invariants_after_leave`.
            self.node.engine().check_invariants();
        } else {
            self.node.check_invariants(now);
        }
        let highest = self.node.engine().highest_token();
        assert!(
            highest >= self.highest,
            "the highest token went down: {} -> {highest}",
            self.highest
        );
        assert!(highest <= MAX_TOKEN, "highest token {highest} > MAX_TOKEN");
        self.highest = highest;
        for ci in 0..self.conns.len() {
            self.scan_with(ci, before_highest);
        }
        // Closed connections are gone from the node.
        for id in (0..self.ever_opened.len()).map(ConnId::from_index) {
            if !self.ever_opened[id.index()] || self.conns.iter().any(|c| c.id == id) {
                continue;
            }
            assert!(!self.node.is_peer_link(id), "closed {id} is a peer link");
            assert!(!self.authenticated(id), "closed {id} is authenticated");
            assert!(
                self.node.output_mut(id).is_empty(),
                "output written to closed connection {id}: {:?}",
                esc(self.node.output_mut(id))
            );
        }
        // A node that turns active keeps the grants it had.
        let turned_active = grants_before.filter(|_| self.node.role() == Role::Active);
        for (key, token, expires_ms) in turned_active.into_iter().flatten() {
            if expires_ms > now.ms {
                assert_eq!(
                    self.node.engine().holder(&key).map(|h| h.0),
                    Some(token),
                    "turned active without its grant of {:?}",
                    esc(&key)
                );
            }
        }
    }

    fn scan(&mut self, ci: usize) {
        let highest = self.highest;
        self.scan_with(ci, highest);
    }

    /// Checks the output written to connection `ci` since the last scan.
    fn scan_with(&mut self, ci: usize, before_highest: u64) {
        let highest_now = self.node.engine().highest_token();
        let id = self.conns[ci].id;
        let out = std::mem::take(self.node.output_mut(id));
        let start = self.conns[ci].scanned;
        assert!(start <= out.len(), "output of {id} shrank by itself");
        assert!(
            out.len() == start || out.ends_with(b"\n"),
            "output of {id} ends inside a line: {:?}",
            esc(&out[start..])
        );
        let mut offset = start;
        for line in out[start..].split_inclusive(|&b| b == b'\n') {
            self.check_line(ci, line, offset, before_highest, highest_now);
            offset += line.len();
        }
        // At most one answer (or CHALLENGE) per line received, plus the E
        // lines (a break, a handshake timeout, a peer-only refusal).
        let conn = &self.conns[ci];
        assert!(
            conn.lines_out <= conn.lines_in + 3,
            "{} lines to {id} for {} received; its output: {:?}",
            conn.lines_out,
            conn.lines_in,
            esc(&out[out.len().saturating_sub(2000)..])
        );
        self.conns[ci].scanned = out.len();
        *self.node.output_mut(id) = out;
    }

    fn check_line(
        &mut self,
        ci: usize,
        line: &[u8],
        offset: usize,
        before_highest: u64,
        highest_now: u64,
    ) {
        let id = self.conns[ci].id;
        let limit = if line.starts_with(b"E ") {
            self.lenience.e_line_max
        } else if line.starts_with(b"H ") {
            // The problem quoted: `MAX_PROBLEM_BYTES` bytes, each up to 4
            // (`\xNN`), and `...` (docs/protocol.md: `H` lines run long).
            4 * MAX_PROBLEM_BYTES + 6
        } else {
            MAX_LINE
        };
        assert!(
            line.len() <= limit,
            "a line of {} bytes to {id}: {:?}",
            line.len(),
            esc(line)
        );
        let body = &line[..line.len() - 1];
        assert!(!body.is_empty(), "an empty line to {id}");
        if wire::is_peer_line(body) {
            let msg = match wire::parse(body) {
                Ok(msg) => msg,
                Err(e) => panic!("the node sent {:?} to {id}: {e}", esc(body)),
            };
            check_bounds(&msg, body);
            if self.conns[ci].outbound.is_some() {
                self.check_dialer_line(ci, msg, offset, highest_now);
                return;
            }
            self.check_acceptor_line(ci, msg);
        } else if body.starts_with(b"E ") {
            self.conns[ci].e_out = true;
        } else {
            // An answer (on a link the node dialed too: the peer may send
            // client requests there as anywhere).
            let answer = match parse_answer(body) {
                Ok(a) => a,
                Err(e) => panic!("the node answered {:?} to {id}: {e:?}", esc(body)),
            };
            match answer {
                Answer::Granted { key, token } => {
                    assert!(
                        token > before_highest && token <= highest_now,
                        "granted {token}, not above {before_highest} (highest now {highest_now})"
                    );
                    self.stats.granted += 1;
                    if self.tokens.len() == KEEP_TOKENS {
                        self.tokens.remove(0);
                    }
                    self.tokens.push((key.to_vec(), token));
                }
                Answer::Status { token, .. } => assert!(token <= highest_now),
                // A shared grant or permit (0: its wait ran out), replicated
                // like a grant.
                Answer::KindGranted { token, .. } => assert!(
                    token == 0 || (token > before_highest && token <= highest_now),
                    "granted {token}, not above {before_highest} (highest now {highest_now})"
                ),
                Answer::KindRefused { .. } => {}
                Answer::Lock { token, waiters, .. } => {
                    assert!(
                        token <= highest_now,
                        "L lists token {token} above {highest_now}"
                    );
                    assert!(waiters <= ringlock::engine::LIST_WAITERS_CAP);
                    // Part of one `L` answer: its `L <cursor>` line is the
                    // one answer counted.
                    return;
                }
                _ => {}
            }
        }
        self.conns[ci].lines_out += 1;
    }

    /// A peer line on a link the node dialed.
    fn check_dialer_line(&mut self, ci: usize, msg: PeerMsg<'_>, offset: usize, highest_now: u64) {
        let conn = &mut self.conns[ci];
        let id = conn.id;
        match msg {
            PeerMsg::Hello {
                fingerprint,
                from,
                addr,
                incarnation,
                nonce,
                ..
            } => {
                assert!(conn.node_hello.is_none(), "a second HELLO on {id}");
                assert_eq!((fingerprint, from.0), (self.fingerprint, self.me));
                assert_eq!(addr, self.peers[self.me].as_bytes());
                let ident = Ident {
                    fingerprint,
                    index: from.0 as u64,
                    addr: addr.to_vec(),
                    nonce,
                };
                conn.node_hello = Some((ident, incarnation));
            }
            PeerMsg::Auth { mac } => {
                let (Some((hello, incarnation)), Some(challenge)) =
                    (&conn.node_hello, &conn.sent_challenge)
                else {
                    panic!("AUTH on {id} before HELLO and CHALLENGE");
                };
                let transcript = auth::Transcript {
                    dialer: hello.identity(),
                    dialer_incarnation: *incarnation,
                    acceptor: challenge.identity(),
                };
                assert!(
                    self.secret.verify(Side::Dialer, &transcript, &mac),
                    "the node's AUTH MAC on {id} is wrong"
                );
                assert!(
                    conn.challenge_mac_right,
                    "the node sent AUTH on {id} for a CHALLENGE with a wrong MAC"
                );
                self.stats.authed_out += 1;
            }
            PeerMsg::Challenge { .. } => panic!("CHALLENGE on a link the node dialed"),
            PeerMsg::Heartbeat { highest, .. } => {
                assert!(
                    offset < HEARTBEAT_BACKLOG_BYTES,
                    "heartbeat queued on {id} behind {offset} unsent bytes"
                );
                assert!(highest <= highest_now);
            }
            PeerMsg::Snapshot { highest } | PeerMsg::Handoff { highest } => {
                assert!(highest <= highest_now);
            }
            PeerMsg::Grant { token, .. }
            | PeerMsg::Release { token, .. }
            | PeerMsg::Member { token, .. } => {
                assert!(token <= highest_now);
            }
            PeerMsg::Limit { limit } => {
                assert!((1..=ringlock::proto::MAX_PERMITS).contains(&limit));
            }
            PeerMsg::Synced | PeerMsg::Merged | PeerMsg::Probe { .. } | PeerMsg::Probed { .. } => {}
            PeerMsg::Merge { highest } => assert!(highest <= highest_now),
        }
    }

    /// A peer line on a connection the node accepted: only a CHALLENGE, for
    /// the HELLO received, with the right MAC.
    fn check_acceptor_line(&mut self, ci: usize, msg: PeerMsg<'_>) {
        let conn = &mut self.conns[ci];
        let id = conn.id;
        let PeerMsg::Challenge {
            fingerprint,
            index,
            addr,
            nonce,
            mac,
        } = msg
        else {
            panic!("the node sent {msg:?} on a link it accepted");
        };
        assert_eq!((fingerprint, index.0), (self.fingerprint, self.me));
        assert_eq!(addr, self.peers[self.me].as_bytes());
        let Some(hello) = &conn.hello else {
            panic!("CHALLENGE to {id} without a HELLO");
        };
        let challenge = Ident {
            fingerprint,
            index: index.0 as u64,
            addr: addr.to_vec(),
            nonce,
        };
        let dialer = Ident {
            fingerprint: hello.fingerprint,
            index: hello.index,
            addr: hello.addr.clone(),
            nonce: hello.nonce,
        };
        let transcript = auth::Transcript {
            dialer: dialer.identity(),
            dialer_incarnation: hello.incarnation,
            acceptor: challenge.identity(),
        };
        assert!(
            self.secret.verify(Side::Acceptor, &transcript, &mac),
            "the node's CHALLENGE MAC on {id} is wrong"
        );
        conn.challenge = Some(challenge);
    }
}

/// What became of bytes fed to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fed {
    /// Read and processed; the connection is open.
    Processed,
    /// Not all read yet (a pause), or kept back.
    Skipped,
    /// It broke the connection, which is closed.
    Closed,
}

#[derive(Debug, Clone, Copy)]
enum PeerKind {
    Heartbeat,
    Snapshot,
    Grant,
    Release,
    Synced,
    Merge,
    Merged,
    Probe,
    Probed,
    Handoff,
}

fn last_line(out: &[u8]) -> &[u8] {
    let body = out.strip_suffix(b"\n").unwrap_or(out);
    match body.iter().rposition(|&b| b == b'\n') {
        Some(i) => &body[i + 1..],
        None => body,
    }
}
