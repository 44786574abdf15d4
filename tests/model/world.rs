//! The world the model checker explores: real [`Node`]s, each driven as the
//! I/O loops drive it (through a [`Lifecycle`] per connection), over a
//! network whose every delivery, dial, timer firing and fault is a [`Step`]
//! the explorer chooses. Nothing here is random: the same steps from the
//! start give the same world, which is how a state is rebuilt (a trace is
//! replayed; a node cannot be cloned).
//!
//! Time moves only by [`Step::Advance`], to the earliest deadline of any
//! node (or the end of a hang, or the next instant of the grid on which
//! requests and faults come), and only once nothing else can happen at
//! this instant: every delivery that can get through has been made and
//! every due timer has fired (a network delay shorter than any timer, in
//! any order across links, in order within one). Blocked links
//! (partitions) hold their bytes until they heal. Simplified: a dial
//! resolves at once (connected, or failed if the way is blocked or the
//! peer is down), a lingering connection closes only when its peer does,
//! and socket buffers are unbounded.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

use ringlock::cluster::auth::Secret;
use ringlock::cluster::{ClusterConfig, PeerId, Role};
use ringlock::engine::{ConnId, Now};
use ringlock::io::lifecycle::Phase;
use ringlock::io::{Lifecycle, Step as LifeStep};
use ringlock::node::{Node, NodeConfig};
use ringlock_proto::{Answer, parse_answer};

use super::check::Checker;

pub const HEARTBEAT_MS: u64 = 20;
pub const PEER_TIMEOUT_MS: u64 = 50;
/// How long a hang (SIGSTOP) lasts: past a peer timeout, so that the peers
/// count the node dead and it must notice its own stall.
pub const HANG_MS: u64 = PEER_TIMEOUT_MS + HEARTBEAT_MS;
/// Every acquire asks for this lease and waits at most this long.
pub const LEASE_MS: u64 = 400;
pub const WAIT_MS: u64 = 150;
/// Model time starts here (ms).
pub const T0: u64 = 1_000;
const EPOCH_NS: u64 = 1_700_000_000_000_000_000;

pub fn addr(i: usize) -> String {
    format!("n{i}:1")
}

/// The address a client's connections come from: what a node names as the
/// holder of its grants, in its table and its replicas' tables.
pub fn client_addr(c: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, c as u8 + 1], 7000))
}

/// What the explorer may do, and how much of it along one path.
#[derive(Debug, Clone)]
pub struct Scope {
    pub nodes: usize,
    pub clients: usize,
    pub keys: usize,
    /// Time does not advance past `T0 + horizon_ms`.
    pub horizon_ms: u64,
    /// Faults along one path (heals are free).
    pub faults: u32,
    pub crash: bool,
    pub restart: bool,
    pub leave: bool,
    pub hang: bool,
    pub one_way: bool,
    pub split: bool,
    /// Client requests along one path.
    pub ops: u32,
    /// Clients release, renew and withdraw too (otherwise they only
    /// acquire).
    pub release: bool,
    /// Requests and faults (but crashes) only from this time on: the
    /// cluster forms first, in every order.
    pub quiet_until_ms: u64,
    /// Requests, faults, restarts and heals only at instants a multiple of
    /// this after the start (what tells paths apart is their order against deliveries,
    /// timers and each other, rather than how many heartbeats lie between).
    pub grid_ms: u64,
    /// The cluster forms in one order (the first possible step each time)
    /// until `quiet_until_ms`; exploring starts there. Otherwise it forms
    /// in every order.
    pub formed: bool,
    /// Within an instant, the nodes take their steps one node after the
    /// other (lowest first), each in every order of its own: what one node
    /// does at an instant commutes with what another does, except for
    /// which of two segments sent to a third arrives first, which this
    /// leaves unexplored.
    pub by_node: bool,
    /// With `formed`: steps taken on the way, each at the first quiet
    /// moment at or after its time (ms after the start). They use up the
    /// budget of faults and requests like any other.
    pub script: Vec<(u64, Step)>,
    /// Check that no new grant overlaps a believed one once a split healed
    /// (the merge of grants at a heal).
    pub heal_merge: bool,
    /// A fair continuation ([`crate::model::fair_suffix`]) from every
    /// `fair_every`th state found (0: none).
    pub fair_every: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Party {
    Node(usize),
    Client(usize),
}

impl fmt::Display for Party {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Party::Node(x) => write!(f, "n{x}"),
            Party::Client(c) => write!(f, "c{c}"),
        }
    }
}

/// One step of a trace. Indices of connections are in creation order along
/// the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Node `x` runs a loop turn: a timer of it is due.
    Tick(u8),
    /// The next segment from end `e` of connection `conn` arrives.
    Deliver(u16, u8),
    /// Node `x`'s dial to `peer` resolves (connects unless cut off).
    Dial(u8, u8),
    /// Time moves to the earliest deadline.
    Advance,
    Crash(u8),
    Restart(u8),
    /// SIGTERM: `Node::leave`, then every connection closed after its last
    /// output.
    Leave(u8),
    /// SIGSTOP for [`HANG_MS`], then SIGCONT.
    Hang(u8),
    /// Bytes from `a` to `b` stop getting through.
    Cut(u8, u8),
    /// Both ways between `a` and `b`.
    Split(u8, u8),
    /// Both ways between `a` and `b` get through again.
    Heal(u8, u8),
    /// Client `c` asks node `x` for key `k`.
    Acquire(u8, u8, u8),
    /// Client `c` releases key `k` where it got it.
    Release(u8, u8),
    /// Client `c` renews key `k` where it got it.
    Renew(u8, u8),
    /// Client `c` closes its connection to node `x` (withdrawing a wait).
    Close(u8, u8),
    /// The start of a fair continuation: every block heals, and from now
    /// on there are no faults and no requests, and no horizon.
    Fair,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Step::Tick(x) => write!(f, "tick:{x}"),
            Step::Deliver(c, e) => write!(f, "deliver:{c}:{e}"),
            Step::Dial(x, p) => write!(f, "dial:{x}:{p}"),
            Step::Advance => write!(f, "advance"),
            Step::Crash(x) => write!(f, "crash:{x}"),
            Step::Restart(x) => write!(f, "restart:{x}"),
            Step::Leave(x) => write!(f, "leave:{x}"),
            Step::Hang(x) => write!(f, "hang:{x}"),
            Step::Cut(a, b) => write!(f, "cut:{a}:{b}"),
            Step::Split(a, b) => write!(f, "split:{a}:{b}"),
            Step::Heal(a, b) => write!(f, "heal:{a}:{b}"),
            Step::Acquire(c, x, k) => write!(f, "acquire:{c}:{x}:{k}"),
            Step::Release(c, k) => write!(f, "release:{c}:{k}"),
            Step::Renew(c, k) => write!(f, "renew:{c}:{k}"),
            Step::Close(c, x) => write!(f, "close:{c}:{x}"),
            Step::Fair => write!(f, "fair"),
        }
    }
}

impl std::str::FromStr for Step {
    type Err = String;
    fn from_str(s: &str) -> Result<Step, String> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or_default();
        let n: Vec<u16> = parts
            .map(|p| p.parse().map_err(|_| format!("bad step {s:?}")))
            .collect::<Result<_, _>>()?;
        let b = |i: usize| n.get(i).map(|&v| v as u8).unwrap_or(0);
        let want = match name {
            "advance" | "fair" => 0,
            "tick" | "crash" | "restart" | "leave" | "hang" => 1,
            "acquire" => 3,
            _ => 2,
        };
        if n.len() != want {
            return Err(format!("bad step {s:?}"));
        }
        Ok(match name {
            "tick" => Step::Tick(b(0)),
            "deliver" => Step::Deliver(n[0], b(1)),
            "dial" => Step::Dial(b(0), b(1)),
            "advance" => Step::Advance,
            "fair" => Step::Fair,
            "crash" => Step::Crash(b(0)),
            "restart" => Step::Restart(b(0)),
            "leave" => Step::Leave(b(0)),
            "hang" => Step::Hang(b(0)),
            "cut" => Step::Cut(b(0), b(1)),
            "split" => Step::Split(b(0), b(1)),
            "heal" => Step::Heal(b(0), b(1)),
            "acquire" => Step::Acquire(b(0), b(1), b(2)),
            "release" => Step::Release(b(0), b(1)),
            "renew" => Step::Renew(b(0), b(1)),
            "close" => Step::Close(b(0), b(1)),
            _ => return Err(format!("unknown step {s:?}")),
        })
    }
}

#[derive(Debug, Clone, Hash)]
enum Seg {
    Data(Vec<u8>),
    Fin,
}

/// One TCP connection: end 0 dialed, end 1 accepted. `pipes[e]` carries
/// bytes from end `e`, in order.
struct Conn {
    ends: [Party; 2],
    cids: [Option<ConnId>; 2],
    open: [bool; 2],
    pipes: [VecDeque<Seg>; 2],
}

struct Running {
    node: Node,
    lives: BTreeMap<ConnId, Lifecycle>,
    conns: BTreeMap<ConnId, usize>,
    next_cid: u32,
}

struct Slot {
    run: Option<Running>,
    generation: u64,
    hung_until: Option<u64>,
}

/// A request a client waits for the answer of.
#[derive(Debug, Clone, Hash)]
pub struct Waiting {
    pub node: usize,
    pub conn: usize,
    pub op: u8,
    pub key: usize,
    pub token: u64,
    pub sent_ms: u64,
}

#[derive(Debug, Clone, Default, Hash)]
pub struct Client {
    /// Its open connection to each node.
    pub conns: BTreeMap<usize, usize>,
    pub waiting: Option<Waiting>,
    /// Keys it believes it holds: (token, node it got it from).
    pub holds: BTreeMap<usize, (u64, usize)>,
}

pub struct World {
    pub scope: Scope,
    pub now: u64,
    slots: Vec<Slot>,
    conns: Vec<Conn>,
    /// Dials in flight: (node, generation, peer).
    dials: Vec<(usize, u64, usize)>,
    /// Blocked directions between nodes.
    pub blocked: BTreeSet<(usize, usize)>,
    pub faults_left: u32,
    pub ops_left: u32,
    pub clients: Vec<Client>,
    /// Connections a client closed while it waited: (client, key).
    withdrawing: BTreeMap<usize, (usize, usize)>,
    pub checker: Checker,
    /// In a fair continuation ([`Step::Fair`]).
    pub fair: bool,
    /// What each step did, kept when a trace is shown.
    pub narrate: bool,
    pub story: Vec<String>,
}

pub fn key_name(k: usize) -> String {
    format!("k{k}")
}

impl World {
    pub fn new(scope: Scope) -> World {
        let mut w = World {
            now: T0,
            slots: (0..scope.nodes)
                .map(|_| Slot {
                    run: None,
                    generation: 0,
                    hung_until: None,
                })
                .collect(),
            conns: Vec::new(),
            dials: Vec::new(),
            blocked: BTreeSet::new(),
            faults_left: scope.faults,
            ops_left: scope.ops,
            clients: vec![Client::default(); scope.clients],
            withdrawing: BTreeMap::new(),
            checker: Checker::new(&scope),
            fair: false,
            narrate: false,
            story: Vec::new(),
            scope,
        };
        for x in 0..w.scope.nodes {
            w.start(x);
        }
        w
    }

    /// The steps by which the cluster forms in one order (the first
    /// possible step each time) until `quiet_until_ms`.
    pub fn formation(scope: &Scope) -> Vec<Step> {
        let mut w = World::new(scope.clone());
        let mut steps = Vec::new();
        let mut script = scope.script.iter().peekable();
        while w.now < T0 + w.scope.quiet_until_ms || !w.quiescent() {
            let step = match script.peek() {
                Some(&&(at, step)) if w.quiescent() && w.now >= T0 + at => {
                    script.next();
                    step
                }
                _ => w.enabled()[0],
            };
            w.apply(step).expect("the cluster forms");
            steps.push(step);
        }
        steps
    }

    pub fn say(&mut self, line: String) {
        if self.narrate {
            self.story.push(line);
        }
    }

    /// Every node's clock, a nanosecond apart on the wall clock (two
    /// clocks do not read the same nanosecond; tokens from two actives
    /// would otherwise tie).
    fn clock(&self, x: usize) -> Now {
        Now {
            ms: self.now,
            us: self.now * 1000,
            unix_ns: EPOCH_NS + self.now * 1_000_000 + x as u64,
        }
    }

    fn start(&mut self, x: usize) {
        let generation = self.slots[x].generation + 1;
        let node = Node::new(
            self.clock(x),
            NodeConfig {
                advertise: addr(x),
                cluster: Some(ClusterConfig {
                    peers: (0..self.scope.nodes).map(addr).collect(),
                    me: PeerId(x),
                    heartbeat_ms: HEARTBEAT_MS,
                    peer_timeout_ms: PEER_TIMEOUT_MS,
                    failback_delay_ms: 0,
                    incarnation: (x as u64 + 1) * 1_000 + generation * 2 + 1,
                    secret: Secret::from_bytes(b"the model-checked cluster's secret, 32+ bytes"),
                    read_batch_us: 0,
                }),
                max_locks: 64,
            },
        );
        let slot = &mut self.slots[x];
        slot.generation = generation;
        slot.hung_until = None;
        slot.run = Some(Running {
            node,
            lives: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_cid: 0,
        });
    }

    pub fn up(&self, x: usize) -> bool {
        self.slots[x].run.is_some()
    }

    pub fn runs(&self, x: usize) -> bool {
        self.up(x) && self.slots[x].hung_until.is_none()
    }

    pub fn node(&self, x: usize) -> Option<&Node> {
        self.slots[x].run.as_ref().map(|r| &r.node)
    }

    pub fn role(&self, x: usize) -> Option<Role> {
        self.node(x).map(Node::role)
    }

    /// Running nodes that are active.
    pub fn actives(&self) -> Vec<usize> {
        (0..self.scope.nodes)
            .filter(|&x| self.runs(x) && self.role(x) == Some(Role::Active))
            .collect()
    }

    pub fn reachable(&self, a: usize, b: usize) -> bool {
        !self.blocked.contains(&(a, b)) && !self.blocked.contains(&(b, a))
    }

    fn can_pass(&self, from: Party, to: Party) -> bool {
        match (from, to) {
            (Party::Node(a), Party::Node(b)) => !self.blocked.contains(&(a, b)),
            _ => true,
        }
    }

    fn party_runs(&self, p: Party) -> bool {
        match p {
            Party::Node(x) => self.runs(x),
            Party::Client(_) => true,
        }
    }

    /// A node's timer is due (or output waits uncollected).
    fn due(&self, x: usize) -> bool {
        self.runs(x)
            && self
                .node(x)
                .and_then(Node::next_deadline)
                .is_some_and(|d| d <= self.now)
    }

    fn deliverable(&self, ci: usize, e: usize) -> bool {
        let c = &self.conns[ci];
        !c.pipes[e].is_empty()
            && c.open[1 - e]
            && self.party_runs(c.ends[1 - e])
            && self.can_pass(c.ends[e], c.ends[1 - e])
    }

    /// Nothing can happen at this instant without time moving or a fault.
    pub fn quiescent(&self) -> bool {
        let deliveries = (0..self.conns.len()).any(|c| (0..2).any(|e| self.deliverable(c, e)));
        let dials = self.dials.iter().any(|&(x, _, _)| self.runs(x));
        let ticks = (0..self.scope.nodes).any(|x| self.due(x));
        !deliveries && !dials && !ticks
    }

    /// When time would move to, if it may.
    pub fn next_time(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        for x in 0..self.scope.nodes {
            let t = match self.slots[x].hung_until {
                Some(until) => Some(until),
                None => self.node(x).and_then(Node::next_deadline),
            };
            if let Some(t) = t.filter(|&t| t > self.now) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if self.fair {
            // Only the nodes' own timers, with no horizon.
            return next;
        }
        let healing = !self.blocked.is_empty()
            || (self.scope.restart && self.slots.iter().any(|s| s.run.is_none()));
        if self.faults_left > 0 || self.ops_left > 0 || healing {
            // The next instant requests and faults may come at.
            let g = self.scope.grid_ms;
            let from = (self.now - T0).max(self.scope.quiet_until_ms.saturating_sub(1));
            let t = T0 + (from / g + 1) * g;
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        next.filter(|&t| t <= T0 + self.scope.horizon_ms)
    }

    /// The steps possible now, in a fixed order.
    pub fn enabled(&self) -> Vec<Step> {
        let mut out = Vec::new();
        let n = self.scope.nodes;
        for x in 0..n {
            if self.due(x) {
                out.push(Step::Tick(x as u8));
            }
        }
        for c in 0..self.conns.len() {
            for e in 0..2 {
                if self.deliverable(c, e) {
                    out.push(Step::Deliver(c as u16, e as u8));
                }
            }
        }
        let mut dials: Vec<(usize, usize)> = self
            .dials
            .iter()
            .filter(|&&(x, _, _)| self.runs(x))
            .map(|&(x, _, p)| (x, p))
            .collect();
        dials.sort_unstable();
        dials.dedup();
        out.extend(dials.into_iter().map(|(x, p)| Step::Dial(x as u8, p as u8)));
        let s = &self.scope;
        let quiet = !self.fair
            && (self.now < T0 + s.quiet_until_ms || !(self.now - T0).is_multiple_of(s.grid_ms));
        if s.by_node
            && let Some(first) = out.iter().map(|&st| self.actor(st)).min()
        {
            out.retain(|&st| self.actor(st) == first);
        }
        if self.faults_left > 0 && s.crash && !quiet {
            out.extend((0..n).filter(|&x| self.up(x)).map(|x| Step::Crash(x as u8)));
        }
        if !self.quiescent() {
            return out;
        }
        if self.next_time().is_some() {
            out.push(Step::Advance);
        }
        if quiet {
            return out;
        }
        for x in 0..n {
            if !self.up(x) && s.restart {
                out.push(Step::Restart(x as u8));
            }
        }
        for a in 0..n {
            for b in 0..n {
                if a < b && (self.blocked.contains(&(a, b)) || self.blocked.contains(&(b, a))) {
                    out.push(Step::Heal(a as u8, b as u8));
                }
            }
        }
        if self.faults_left > 0 {
            self.fault_steps(&mut out);
        }
        if self.ops_left > 0 {
            self.client_steps(&mut out);
        }
        out
    }

    /// The node a tick, a delivery or a dial is a step of.
    fn actor(&self, step: Step) -> usize {
        match step {
            Step::Tick(x) | Step::Dial(x, _) => x as usize,
            Step::Deliver(c, e) => match self.conns[c as usize].ends[1 - e as usize] {
                Party::Node(x) => x,
                Party::Client(c) => self.scope.nodes + c,
            },
            _ => usize::MAX,
        }
    }

    fn fault_steps(&self, out: &mut Vec<Step>) {
        let s = &self.scope;
        let n = s.nodes;
        for x in 0..n {
            if self.runs(x) && s.leave {
                out.push(Step::Leave(x as u8));
            }
            if self.runs(x) && s.hang {
                out.push(Step::Hang(x as u8));
            }
        }
        for a in 0..n {
            for b in 0..n {
                if a == b || !self.reachable(a, b) {
                    continue;
                }
                if s.one_way {
                    out.push(Step::Cut(a as u8, b as u8));
                }
                if s.split && a < b {
                    out.push(Step::Split(a as u8, b as u8));
                }
            }
        }
    }

    fn client_steps(&self, out: &mut Vec<Step>) {
        for (c, client) in self.clients.iter().enumerate() {
            if let Some(w) = &client.waiting {
                // Only a withdrawal while it waits.
                if w.op == b'A' && self.scope.release {
                    out.push(Step::Close(c as u8, w.node as u8));
                }
                continue;
            }
            for k in 0..self.scope.keys {
                match client.holds.get(&k) {
                    Some(&(_, x)) if self.up(x) && self.scope.release => {
                        out.push(Step::Release(c as u8, k as u8));
                        out.push(Step::Renew(c as u8, k as u8));
                    }
                    Some(_) => {}
                    None => {
                        for x in 0..self.scope.nodes {
                            if self.up(x) {
                                out.push(Step::Acquire(c as u8, x as u8, k as u8));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Applies `step` (which must be enabled), then checks every property.
    pub fn apply(&mut self, step: Step) -> Result<(), String> {
        self.apply_only(step)?;
        self.check_invariants()?;
        self.check_state()
    }

    /// Applies `step` again on the way to a state already checked: the
    /// checker follows, the nodes' invariant walkers are not run.
    pub fn reapply(&mut self, step: Step) -> Result<(), String> {
        self.apply_only(step)?;
        self.check_state()
    }

    fn apply_only(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::Tick(x) => self.turn(x as usize),
            Step::Deliver(c, e) => self.deliver(c as usize, e as usize),
            Step::Dial(x, p) => self.dial(x as usize, p as usize),
            Step::Advance => self.advance(),
            Step::Crash(x) => self.crash(x as usize),
            Step::Restart(x) => {
                // The end of a crash or a leave: no fault of its own.
                self.start(x as usize);
                self.flush(x as usize)
            }
            Step::Leave(x) => self.leave(x as usize),
            Step::Hang(x) => {
                self.faults_left -= 1;
                self.slots[x as usize].hung_until = Some(self.now + HANG_MS);
                Ok(())
            }
            Step::Cut(a, b) => {
                self.faults_left -= 1;
                self.blocked.insert((a as usize, b as usize));
                Ok(())
            }
            Step::Split(a, b) => {
                self.faults_left -= 1;
                self.blocked.insert((a as usize, b as usize));
                self.blocked.insert((b as usize, a as usize));
                Ok(())
            }
            Step::Heal(a, b) => {
                self.blocked.remove(&(a as usize, b as usize));
                self.blocked.remove(&(b as usize, a as usize));
                Ok(())
            }
            Step::Acquire(c, x, k) => self.client_send(c as usize, x as usize, b'A', k as usize, 0),
            Step::Release(c, k) => self.client_release(c as usize, k as usize, b'R'),
            Step::Renew(c, k) => self.client_release(c as usize, k as usize, b'N'),
            Step::Close(c, x) => self.client_close(c as usize, x as usize),
            Step::Fair => {
                self.blocked.clear();
                self.faults_left = 0;
                self.ops_left = 0;
                self.fair = true;
                self.checker.fair(self.now);
                Ok(())
            }
        }
    }

    /// Every waiting request answered, no node hung, one active and every
    /// other running node following it: where a fair continuation ends.
    /// `Err`: what is not so yet.
    pub fn converged(&self) -> Result<(), String> {
        for (c, client) in self.clients.iter().enumerate() {
            if let Some(w) = &client.waiting {
                return Err(format!(
                    "c{c}'s request to n{} of {} ms has no answer",
                    w.node, w.sent_ms
                ));
            }
        }
        if let Some(x) = (0..self.scope.nodes).find(|&x| self.up(x) && !self.runs(x)) {
            return Err(format!("n{x} is hung"));
        }
        let actives = self.actives();
        let [a] = actives[..] else {
            return Err(format!("the actives are {actives:?}"));
        };
        for x in (0..self.scope.nodes).filter(|&x| x != a) {
            if let Some(role) = self.role(x)
                && role
                    != (Role::Standby {
                        following: Some(PeerId(a)),
                    })
            {
                return Err(format!("n{x} is {role:?}, not following the active n{a}"));
            }
        }
        Ok(())
    }

    /// The settings of a script for the simulator (tests/sim/replay.rs).
    pub fn sim_header(&self) -> String {
        format!(
            "nodes {}, clients {}, heartbeat {HEARTBEAT_MS}, timeout {PEER_TIMEOUT_MS}, \
             together {}, lease {LEASE_MS}, wait {WAIT_MS}",
            self.scope.nodes,
            self.scope.clients,
            super::check::TOGETHER_MS
        )
    }

    /// `step` (about to be taken here) in the simulator's script language.
    pub fn sim_step(&self, step: Step) -> String {
        match step {
            Step::Tick(x) => format!("tick n{x}"),
            Step::Deliver(c, e) => {
                let ends = self.conns[c as usize].ends;
                format!(
                    "deliver {}->{} #{c}",
                    ends[e as usize],
                    ends[1 - e as usize]
                )
            }
            Step::Dial(x, p) => format!("dial n{x}->n{p}"),
            Step::Advance => format!("advance {}", self.next_time().unwrap_or(self.now)),
            Step::Crash(x) => format!("crash n{x}"),
            Step::Restart(x) => format!("restart n{x}"),
            Step::Leave(x) => format!("leave n{x}"),
            Step::Hang(x) => format!("hang n{x} {HANG_MS}"),
            Step::Cut(a, b) => format!("cut n{a}->n{b}"),
            Step::Split(a, b) => format!("split n{a} n{b}"),
            Step::Heal(a, b) => format!("heal n{a} n{b}"),
            Step::Acquire(c, x, k) => format!("c{c} acquire k{k} at n{x}"),
            Step::Release(c, k) => format!("c{c} release k{k}"),
            Step::Renew(c, k) => format!("c{c} renew k{k}"),
            Step::Close(c, x) => format!("c{c} close n{x}"),
            Step::Fair => "fair".into(),
        }
    }

    /// Each node: up, running, role, table (key, token), highest token;
    /// each client: what it holds. What the simulator's replay of the
    /// same steps must show too.
    pub fn observed(&self) -> Vec<String> {
        let mut out = Vec::new();
        for x in 0..self.scope.nodes {
            out.push(match self.node(x) {
                None => format!("n{x} down"),
                Some(node) => {
                    let mut table: Vec<(String, u64)> = node
                        .engine()
                        .grants()
                        .map(|(k, t, _)| (String::from_utf8_lossy(k).into_owned(), t))
                        .collect();
                    table.sort();
                    format!(
                        "n{x} runs {} {:?} {table:?} highest {}",
                        self.runs(x),
                        node.role(),
                        node.engine().highest_token()
                    )
                }
            });
        }
        for (c, client) in self.clients.iter().enumerate() {
            let holds: BTreeMap<String, u64> = client
                .holds
                .iter()
                .map(|(&k, &(t, _))| (key_name(k), t))
                .collect();
            out.push(format!("c{c} holds {holds:?}"));
        }
        out
    }

    fn check_invariants(&self) -> Result<(), String> {
        for x in 0..self.scope.nodes {
            let now = self.clock(x);
            if let Some(node) = self.node(x) {
                catch(|| node.check_invariants(now))
                    .map_err(|p| format!("n{x}'s invariants: {p}"))?;
            }
        }
        Ok(())
    }

    fn check_state(&mut self) -> Result<(), String> {
        let mut checker = std::mem::take(&mut self.checker);
        let r = checker.on_state(self);
        self.checker = checker;
        r
    }

    /// Runs `f` on node `x`, checking what the call did to its role.
    fn op<R>(
        &mut self,
        x: usize,
        what: &str,
        f: impl FnOnce(&mut Running, Now) -> R,
    ) -> Result<R, String> {
        let now = self.clock(x);
        let run = self.slots[x].run.as_mut().expect("node is up");
        let before = run.node.role();
        let grants: Vec<(Vec<u8>, u64, u64)> = run
            .node
            .engine()
            .grants()
            .map(|(k, t, e)| (k.to_vec(), t, e))
            .collect();
        let r = catch(|| f(run, now)).map_err(|p| format!("n{x} panicked in {what}: {p}"))?;
        let after = run.node.role();
        if after != before {
            if before != Role::Active && after == Role::Active {
                for (k, tok, exp) in &grants {
                    if *exp > now.ms && run.node.engine().holder(k).map(|h| h.0) != Some(*tok) {
                        return Err(format!(
                            "n{x} became active ({what}) without the grant {} {tok} it had applied",
                            String::from_utf8_lossy(k)
                        ));
                    }
                }
            }
            self.say(format!("    n{x}: {before:?} -> {after:?} ({what})"));
        }
        Ok(r)
    }

    /// A loop turn: tick, then output, doomed links and dials.
    fn turn(&mut self, x: usize) -> Result<(), String> {
        self.op(x, "tick", |run, now| run.node.tick(now))?;
        self.flush(x)
    }

    fn alloc(&mut self, x: usize, ci: usize) -> ConnId {
        let run = self.slots[x].run.as_mut().unwrap();
        let cid = ConnId::new(run.next_cid);
        run.next_cid += 1;
        run.conns.insert(cid, ci);
        run.lives.insert(cid, Lifecycle::new());
        cid
    }

    fn end_of(&self, ci: usize, x: usize) -> usize {
        usize::from(self.conns[ci].ends[0] != Party::Node(x))
    }

    /// Sends what node `x` has for its connections, closes the ones it
    /// gave up on after their last output, starts its dials.
    fn flush(&mut self, x: usize) -> Result<(), String> {
        let mut dirty = Vec::new();
        self.op(x, "flush", |run, now| run.node.take_dirty(now, &mut dirty))?;
        let mut doomed = Vec::new();
        self.op(x, "doomed", |run, now| {
            run.node.take_doomed(now, &mut doomed)
        })?;
        for &cid in &doomed {
            self.op(x, "close", |run, now| {
                if let Some(life) = run.lives.get_mut(&cid) {
                    life.finish(&mut run.node, now, cid);
                }
            })?;
        }
        let run = self.slots[x].run.as_ref().unwrap();
        let mut todo: BTreeSet<ConnId> = dirty.into_iter().chain(doomed).collect();
        todo.extend(
            run.lives
                .iter()
                .filter(|(_, l)| l.phase() == Phase::Closing)
                .map(|(&c, _)| c),
        );
        for cid in todo {
            self.settle(x, cid)?;
        }
        let mut dials = Vec::new();
        self.op(x, "dials", |run, now| run.node.take_dials(now, &mut dials))?;
        let generation = self.slots[x].generation;
        for (peer, _) in dials {
            self.dials.push((x, generation, peer.0));
        }
        Ok(())
    }

    /// Node `x` sends what connection `cid` has pending and does what its
    /// lifecycle asks (shut, close).
    fn settle(&mut self, x: usize, cid: ConnId) -> Result<(), String> {
        let Some(&ci) = self.slots[x].run.as_ref().unwrap().conns.get(&cid) else {
            return Ok(());
        };
        let e = self.end_of(ci, x);
        let bytes = self.op(x, "send", |run, now| {
            let life = run
                .lives
                .get_mut(&cid)
                .expect("a connection has a lifecycle");
            let out = life.pending(&mut run.node, cid).to_vec();
            if !out.is_empty() {
                life.sent(&mut run.node, now, cid, out.len());
            }
            (out, life.advance(now.ms))
        })?;
        let (out, step) = bytes;
        let other_open = self.conns[ci].open[1 - e];
        if !out.is_empty() && other_open {
            self.conns[ci].pipes[e].push_back(Seg::Data(out));
        }
        match step {
            LifeStep::Stay => {}
            LifeStep::Shut { linger_until } => {
                if other_open {
                    self.conns[ci].pipes[e].push_back(Seg::Fin);
                }
                if linger_until.is_none() {
                    self.end_closed(x, ci, e);
                }
            }
            LifeStep::Close => self.end_closed(x, ci, e),
        }
        Ok(())
    }

    fn end_closed(&mut self, x: usize, ci: usize, e: usize) {
        let conn = &mut self.conns[ci];
        let cid = conn.cids[e].take().expect("open at the node");
        conn.open[e] = false;
        conn.pipes[1 - e].clear();
        let run = self.slots[x].run.as_mut().unwrap();
        run.conns.remove(&cid);
        run.lives.remove(&cid);
    }

    fn deliver(&mut self, ci: usize, e: usize) -> Result<(), String> {
        let seg = self.conns[ci].pipes[e].pop_front().expect("deliverable");
        let to = self.conns[ci].ends[1 - e];
        let from = self.conns[ci].ends[e];
        if self.narrate {
            let what = match &seg {
                Seg::Data(b) => String::from_utf8_lossy(b).trim_end().replace('\n', " | "),
                Seg::Fin => "end of stream".into(),
            };
            self.say(format!("    {from} -> {to} (#{ci}): {what}"));
        }
        match to {
            Party::Client(c) => {
                self.client_input(c, ci, seg);
                Ok(())
            }
            Party::Node(x) => {
                let cid = self.conns[ci].cids[1 - e].expect("open");
                match seg {
                    Seg::Data(bytes) => self.op(x, "input", |run, now| {
                        let life = run.lives.get_mut(&cid).expect("lifecycle");
                        life.received(&mut run.node, now, cid, &bytes);
                    })?,
                    Seg::Fin => {
                        if let Some((c, k)) = self.withdrawing.remove(&ci) {
                            let highest = (0..self.scope.nodes)
                                .filter_map(|n| self.node(n))
                                .map(|n| n.engine().highest_token())
                                .max()
                                .unwrap_or(0);
                            self.checker.withdrew(c, k, highest);
                        }
                        self.op(x, "end of stream", |run, now| {
                            let life = run.lives.get_mut(&cid).expect("lifecycle");
                            life.peer_closed(&mut run.node, now, cid);
                        })?
                    }
                }
                self.settle(x, cid)?;
                self.flush(x)
            }
        }
    }

    fn dial(&mut self, x: usize, peer: usize) -> Result<(), String> {
        let generation = self.slots[x].generation;
        let i = self
            .dials
            .iter()
            .position(|&(n, g, p)| n == x && g == generation && p == peer)
            .expect("a dial in flight");
        self.dials.remove(i);
        if !self.up(peer) || !self.reachable(x, peer) {
            self.say(format!("    n{x}'s dial to n{peer} fails"));
            self.op(x, "dial failed", |run, now| {
                run.node.dial_failed(now, PeerId(peer))
            })?;
            return self.flush(x);
        }
        let ci = self.conns.len();
        self.conns.push(Conn {
            ends: [Party::Node(x), Party::Node(peer)],
            cids: [None, None],
            open: [true, true],
            pipes: [VecDeque::new(), VecDeque::new()],
        });
        let cid = self.alloc(x, ci);
        self.conns[ci].cids[0] = Some(cid);
        let acc = self.alloc(peer, ci);
        self.conns[ci].cids[1] = Some(acc);
        self.say(format!("    n{x} dialed n{peer}: link #{ci}"));
        self.op(peer, "accept", |run, _| run.node.open(acc))?;
        self.op(x, "dialed", |run, now| {
            run.node.outbound_open(now, cid, PeerId(peer))
        })?;
        self.flush(x)
    }

    fn advance(&mut self) -> Result<(), String> {
        let t = self.next_time().expect("time can move");
        self.now = t;
        for x in 0..self.scope.nodes {
            if self.slots[x].hung_until.is_some_and(|u| u <= t) {
                self.slots[x].hung_until = None;
                self.say(format!("    n{x} resumes"));
                // Its loop wakes and ticks before it reads anything.
                self.turn(x)?;
            }
        }
        Ok(())
    }

    /// The kernel closes a dead process's sockets: the bytes it wrote
    /// still arrive, then the end of stream; what was on its way to it is
    /// lost.
    fn crash(&mut self, x: usize) -> Result<(), String> {
        self.faults_left -= 1;
        self.crashed(x);
        self.kill(x);
        Ok(())
    }

    /// The grants of `x` that no other running node holds are gone with it.
    fn crashed(&mut self, x: usize) {
        let survivors: BTreeSet<(Vec<u8>, u64)> = (0..self.scope.nodes)
            .filter(|&y| y != x && self.runs(y))
            .filter_map(|y| self.node(y))
            .flat_map(|n| {
                n.engine()
                    .grants()
                    .map(|(k, t, _)| (k.to_vec(), t))
                    .collect::<Vec<_>>()
            })
            .collect();
        self.checker.crashed(&survivors);
    }

    fn kill(&mut self, x: usize) {
        let run = self.slots[x].run.take().expect("up");
        self.slots[x].hung_until = None;
        for (_, ci) in run.conns {
            let e = self.end_of(ci, x);
            let conn = &mut self.conns[ci];
            conn.open[e] = false;
            conn.cids[e] = None;
            conn.pipes[1 - e].clear();
            if conn.open[1 - e] {
                conn.pipes[e].push_back(Seg::Fin);
            }
        }
        self.dials.retain(|&(n, _, _)| n != x);
    }

    fn leave(&mut self, x: usize) -> Result<(), String> {
        self.faults_left -= 1;
        let was = self.role(x);
        let to = self.op(x, "leave", |run, now| run.node.leave(now))?;
        self.say(format!("    n{x} leaves, successor {to:?}"));
        if to.is_none() && was == Some(Role::Active) {
            // Nobody to hand over to: like a crash.
            self.crashed(x);
        }
        self.flush(x)?;
        let cids: Vec<ConnId> = self.slots[x]
            .run
            .as_ref()
            .unwrap()
            .conns
            .keys()
            .copied()
            .collect();
        for cid in cids {
            self.op(x, "close", |run, now| {
                if let Some(life) = run.lives.get_mut(&cid) {
                    life.finish(&mut run.node, now, cid);
                }
            })?;
            self.settle(x, cid)?;
        }
        self.kill(x);
        Ok(())
    }

    fn connect_client(&mut self, c: usize, x: usize) -> Result<usize, String> {
        if let Some(&ci) = self.clients[c].conns.get(&x) {
            return Ok(ci);
        }
        let ci = self.conns.len();
        self.conns.push(Conn {
            ends: [Party::Client(c), Party::Node(x)],
            cids: [None, None],
            open: [true, true],
            pipes: [VecDeque::new(), VecDeque::new()],
        });
        let cid = self.alloc(x, ci);
        self.conns[ci].cids[1] = Some(cid);
        self.op(x, "accept", |run, _| {
            run.node.open(cid);
            run.node.set_remote(cid, client_addr(c));
        })?;
        self.clients[c].conns.insert(x, ci);
        Ok(ci)
    }

    fn client_send(
        &mut self,
        c: usize,
        x: usize,
        op: u8,
        k: usize,
        token: u64,
    ) -> Result<(), String> {
        self.ops_left -= 1;
        let ci = self.connect_client(c, x)?;
        let key = key_name(k);
        let line = match op {
            b'A' => format!(
                "A {key} {}.{:03} {}.{:03}\n",
                LEASE_MS / 1000,
                LEASE_MS % 1000,
                WAIT_MS / 1000,
                WAIT_MS % 1000
            ),
            b'R' => format!("R {key} {token}\n"),
            _ => format!(
                "N {key} {token} {}.{:03}\n",
                LEASE_MS / 1000,
                LEASE_MS % 1000
            ),
        };
        self.conns[ci].pipes[0].push_back(Seg::Data(line.into_bytes()));
        self.clients[c].waiting = Some(Waiting {
            node: x,
            conn: ci,
            op,
            key: k,
            token,
            sent_ms: self.now,
        });
        if op == b'A' {
            self.checker.acquiring(c, k);
        }
        Ok(())
    }

    fn client_release(&mut self, c: usize, k: usize, op: u8) -> Result<(), String> {
        let (token, x) = self.clients[c].holds[&k];
        if op == b'R' {
            self.clients[c].holds.remove(&k);
            self.checker.released(c, k, token);
        }
        self.client_send(c, x, op, k, token)
    }

    fn client_close(&mut self, c: usize, x: usize) -> Result<(), String> {
        self.ops_left -= 1;
        let ci = self.clients[c].conns.remove(&x).expect("connected");
        if let Some(w) = self.clients[c].waiting.take() {
            // Withdrawn once the node reads the end of stream.
            self.withdrawing.insert(ci, (c, w.key));
        }
        let conn = &mut self.conns[ci];
        conn.open[0] = false;
        conn.pipes[1].clear();
        if conn.open[1] {
            conn.pipes[0].push_back(Seg::Fin);
        }
        Ok(())
    }

    fn client_input(&mut self, c: usize, ci: usize, seg: Seg) {
        let bytes = match seg {
            Seg::Fin => {
                // The node closed: the client closes too.
                let conn = &mut self.conns[ci];
                conn.open[0] = false;
                conn.pipes[1].clear();
                if conn.open[1] {
                    conn.pipes[0].push_back(Seg::Fin);
                }
                self.clients[c].conns.retain(|_, &mut v| v != ci);
                if self.clients[c]
                    .waiting
                    .as_ref()
                    .is_some_and(|w| w.conn == ci)
                {
                    self.clients[c].waiting = None;
                }
                return;
            }
            Seg::Data(b) => b,
        };
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let answer = match parse_answer(line) {
                Ok(a) => a,
                Err(_) => {
                    self.checker.fail(format!(
                        "c{c} read a bad answer {:?}",
                        String::from_utf8_lossy(line)
                    ));
                    continue;
                }
            };
            let w = self.clients[c].waiting.take();
            let Some(w) = w.filter(|w| w.conn == ci) else {
                self.checker.fail(format!(
                    "c{c} read an answer to nothing it asked: {}",
                    String::from_utf8_lossy(line)
                ));
                continue;
            };
            let node = match &self.conns[ci].ends[1] {
                Party::Node(x) => *x,
                Party::Client(_) => unreachable!("clients talk to nodes"),
            };
            self.client_answer(c, node, &w, &answer);
        }
    }

    fn client_answer(&mut self, c: usize, node: usize, w: &Waiting, answer: &Answer<'_>) {
        let now = self.now;
        match *answer {
            Answer::Granted { token, .. } => {
                self.clients[c].holds.insert(w.key, (token, node));
                let mut checker = std::mem::take(&mut self.checker);
                checker.granted(self, c, w.key, token, node);
                self.checker = checker;
            }
            Answer::Released { ok, .. } => self.checker.release_answer(c, w.key, w.token, ok, now),
            Answer::Renewed { ok, .. } => {
                if ok {
                    self.checker.renewed(c, w.key, w.token, now);
                } else {
                    self.clients[c].holds.remove(&w.key);
                    self.checker.release_answer(c, w.key, w.token, false, now);
                    self.checker.released(c, w.key, w.token);
                }
            }
            Answer::TimedOut { .. } | Answer::Moved { .. } => {}
            Answer::Error { reason } => self.checker.fail(format!(
                "n{node} broke c{c}'s connection: {}",
                String::from_utf8_lossy(reason)
            )),
            _ => self
                .checker
                .fail(format!("c{c}: unexpected answer {answer:?}")),
        }
    }

    /// A fingerprint of everything observable: two states with the same
    /// one are explored once. Connection and connection-id numbering (the
    /// order links were made in) is left out.
    pub fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.now.hash(&mut h);
        (self.faults_left, self.ops_left).hash(&mut h);
        self.blocked.hash(&mut h);
        for (x, slot) in self.slots.iter().enumerate() {
            slot.hung_until.hash(&mut h);
            let Some(run) = &slot.run else {
                0u8.hash(&mut h);
                continue;
            };
            let node = &run.node;
            format!("{:?}", node.role()).hash(&mut h);
            let mut grants: Vec<(Vec<u8>, u64, u64)> = node
                .engine()
                .grants()
                .map(|(k, t, e)| (k.to_vec(), t, e))
                .collect();
            grants.sort();
            grants.hash(&mut h);
            for (k, _, _) in &grants {
                node.engine()
                    .holder_of(k)
                    .map(|o| o.addr.map(<[u8]>::to_vec))
                    .hash(&mut h);
            }
            node.engine().highest_token().hash(&mut h);
            node.engine().waiter_count().hash(&mut h);
            node.next_deadline().hash(&mut h);
            let snap = node.snapshot();
            (
                snap.ready,
                snap.leaving,
                snap.peers_up,
                snap.followers.len(),
            )
                .hash(&mut h);
            let mut lives: Vec<(Party, String)> = run
                .lives
                .iter()
                .map(|(cid, l)| {
                    let ci = run.conns[cid];
                    let e = self.end_of(ci, x);
                    (self.conns[ci].ends[1 - e], format!("{:?}", l.phase()))
                })
                .collect();
            lives.sort();
            lives.hash(&mut h);
        }
        let mut conns: Vec<u64> = self
            .conns
            .iter()
            .filter(|c| c.open.iter().any(|&o| o) || c.pipes.iter().any(|p| !p.is_empty()))
            .map(|c| {
                let mut ch = DefaultHasher::new();
                (c.ends, c.open, &c.pipes).hash(&mut ch);
                ch.finish()
            })
            .collect();
        conns.sort_unstable();
        conns.hash(&mut h);
        let mut dials: Vec<(usize, usize)> = self.dials.iter().map(|&(x, _, p)| (x, p)).collect();
        dials.sort_unstable();
        dials.hash(&mut h);
        for client in &self.clients {
            client.conns.keys().collect::<Vec<_>>().hash(&mut h);
            client
                .waiting
                .as_ref()
                .map(|w| (w.node, w.op, w.key, w.token, w.sent_ms))
                .hash(&mut h);
            client.holds.hash(&mut h);
        }
        self.withdrawing.values().collect::<Vec<_>>().hash(&mut h);
        self.checker.hash(&mut h);
        h.finish()
    }

    /// One line per node: role, table, highest token.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for x in 0..self.scope.nodes {
            let line = match self.node(x) {
                None => format!("n{x} down"),
                Some(node) => {
                    let hung = if self.runs(x) { "" } else { " (hung)" };
                    let grants: Vec<String> = node
                        .engine()
                        .grants()
                        .map(|(k, t, _)| format!("{}={t}", String::from_utf8_lossy(k)))
                        .collect();
                    format!("n{x} {:?}{hung} table [{}]", node.role(), grants.join(" "))
                }
            };
            out.push_str(&line);
            out.push_str("; ");
        }
        if !self.blocked.is_empty() {
            out.push_str(&format!("blocked {:?}", self.blocked));
        }
        out
    }
}

/// Runs `f`, turning a panic into its message.
pub fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    super::QUIET.with(|q| q.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    super::QUIET.with(|q| q.set(false));
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}
