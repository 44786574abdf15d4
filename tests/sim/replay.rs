//! Replaying a trace of the model checker (tests/model/) in the simulator.
//!
//! The model checker prints every counterexample as a script in the small
//! language below, and [`Sim::replay`] runs it here: the same steps on the
//! simulator's own network, connections, clients and checks, with nothing
//! random (no delays, no resets, the model's clocks, timers and
//! incarnations). Time moves only by `advance`, and only the named segment
//! moves by `deliver`: the simulator's own scheduling is not used.
//!
//! A script is a list of items separated by commas or new lines (an item
//! that starts with `//` is a comment). First the settings the model ran
//! with, then the steps:
//!
//! ```text
//! nodes 2, clients 2, heartbeat 20, timeout 50, together 320, lease 400, wait 150,
//! tick n0            node n0 runs a loop turn (its timer is due)
//! dial n0->n1        n0's dial to n1 resolves (connects, or fails if cut off)
//! deliver n0->n1 #2  the next segment n0 sent on connection #2 arrives
//!                    (connections are numbered in the order they are made)
//! advance 1160       time moves to 1160 ms
//! crash n1, restart n1, leave n1 (SIGTERM), hang n1 70 (SIGSTOP for 70 ms)
//! cut n0->n1         bytes from n0 to n1 stop getting through
//! split n0 n1, heal n0 n1
//! c0 acquire k0 at n1, c0 release k0, c0 renew k0, c0 close n1
//! fair               every block heals; from here on no new faults
//! ```
//!
//! After every step the simulator's checks run (tests/cluster_sim.rs lists
//! them), and the model's rule for actives: two running actives only if the
//! way between them was blocked less than `together` ms ago.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use super::{Dial, DialPhase, Party, Req, Seg, Sim, SimConfig};

/// The model's timers and the sizes of its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub peer_timeout_ms: u64,
    /// Two actives that hear each other for this long are a violation.
    pub together_ms: u64,
    pub lease_ms: u64,
    pub wait_ms: u64,
}

/// What a replay keeps besides the simulator's own record.
#[derive(Debug)]
pub struct State {
    pub timing: Timing,
    /// Per pair of nodes: when the way between them was last unblocked
    /// (`u64::MAX`: blocked now; none: never blocked).
    together: BTreeMap<(usize, usize), u64>,
}

/// The incarnation the model gives node `x`'s `generation`th start.
pub fn incarnation(x: usize, generation: u64) -> u64 {
    (x as u64 + 1) * 1_000 + generation * 2 + 1
}

/// Where client `c`'s connections come from (as in the model).
pub fn client_addr(c: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, c as u8 + 1], 7000))
}

/// One step of a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Tick(usize),
    Dial(usize, usize),
    Deliver {
        from: Party,
        to: Party,
        link: usize,
    },
    Advance(u64),
    Crash(usize),
    Restart(usize),
    Leave(usize),
    Hang(usize, u64),
    Cut(usize, usize),
    Split(usize, usize),
    Heal(usize, usize),
    Acquire {
        client: usize,
        key: usize,
        node: usize,
    },
    Release {
        client: usize,
        key: usize,
    },
    Renew {
        client: usize,
        key: usize,
    },
    Close {
        client: usize,
        node: usize,
    },
    Fair,
}

fn party(p: Party) -> String {
    match p {
        Party::Node(x) => format!("n{x}"),
        Party::Client(c) => format!("c{c}"),
        Party::Stranger(s) => format!("s{s}"),
    }
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Act::Tick(x) => write!(f, "tick n{x}"),
            Act::Dial(x, p) => write!(f, "dial n{x}->n{p}"),
            Act::Deliver { from, to, link } => {
                write!(f, "deliver {}->{} #{link}", party(from), party(to))
            }
            Act::Advance(t) => write!(f, "advance {t}"),
            Act::Crash(x) => write!(f, "crash n{x}"),
            Act::Restart(x) => write!(f, "restart n{x}"),
            Act::Leave(x) => write!(f, "leave n{x}"),
            Act::Hang(x, ms) => write!(f, "hang n{x} {ms}"),
            Act::Cut(a, b) => write!(f, "cut n{a}->n{b}"),
            Act::Split(a, b) => write!(f, "split n{a} n{b}"),
            Act::Heal(a, b) => write!(f, "heal n{a} n{b}"),
            Act::Acquire { client, key, node } => write!(f, "c{client} acquire k{key} at n{node}"),
            Act::Release { client, key } => write!(f, "c{client} release k{key}"),
            Act::Renew { client, key } => write!(f, "c{client} renew k{key}"),
            Act::Close { client, node } => write!(f, "c{client} close n{node}"),
            Act::Fair => write!(f, "fair"),
        }
    }
}

/// A whole script: the settings and the steps.
#[derive(Debug, Clone)]
pub struct Script {
    pub nodes: usize,
    pub clients: usize,
    pub timing: Timing,
    pub acts: Vec<Act>,
}

fn parse_party(s: &str) -> Result<Party, String> {
    let num = |t: &str| t.parse::<usize>().map_err(|_| format!("bad party {s:?}"));
    match s.split_at_checked(1) {
        Some(("n", x)) => Ok(Party::Node(num(x)?)),
        Some(("c", c)) => Ok(Party::Client(num(c)?)),
        _ => Err(format!("bad party {s:?}")),
    }
}

fn node(s: &str) -> Result<usize, String> {
    match parse_party(s)? {
        Party::Node(x) => Ok(x),
        Party::Client(_) | Party::Stranger(_) => Err(format!("{s:?} is not a node")),
    }
}

fn number(s: &str) -> Result<u64, String> {
    s.trim_start_matches('#')
        .trim_start_matches('k')
        .parse()
        .map_err(|_| format!("bad number {s:?}"))
}

fn pair(s: &str) -> Result<(Party, Party), String> {
    let (a, b) = s
        .split_once("->")
        .ok_or_else(|| format!("want a->b, not {s:?}"))?;
    Ok((parse_party(a)?, parse_party(b)?))
}

fn nodes_of(s: &str) -> Result<(usize, usize), String> {
    match pair(s)? {
        (Party::Node(a), Party::Node(b)) => Ok((a, b)),
        _ => Err(format!("want two nodes, not {s:?}")),
    }
}

/// One step in the script's language.
pub fn parse_act(item: &str) -> Result<Act, String> {
    let w: Vec<&str> = item.split_whitespace().collect();
    Ok(match w.as_slice() {
        ["tick", x] => Act::Tick(node(x)?),
        ["dial", p] => {
            let (a, b) = nodes_of(p)?;
            Act::Dial(a, b)
        }
        ["deliver", p, link] => {
            let (from, to) = pair(p)?;
            let link = number(link)? as usize;
            Act::Deliver { from, to, link }
        }
        ["advance", t] => Act::Advance(number(t)?),
        ["crash", x] => Act::Crash(node(x)?),
        ["restart", x] => Act::Restart(node(x)?),
        ["leave", x] => Act::Leave(node(x)?),
        ["hang", x, ms] => Act::Hang(node(x)?, number(ms)?),
        ["cut", p] => {
            let (a, b) = nodes_of(p)?;
            Act::Cut(a, b)
        }
        ["split", a, b] => Act::Split(node(a)?, node(b)?),
        ["heal", a, b] => Act::Heal(node(a)?, node(b)?),
        [c, "acquire", k, "at", x] => Act::Acquire {
            client: client(c)?,
            key: number(k)? as usize,
            node: node(x)?,
        },
        [c, "release", k] => Act::Release {
            client: client(c)?,
            key: number(k)? as usize,
        },
        [c, "renew", k] => Act::Renew {
            client: client(c)?,
            key: number(k)? as usize,
        },
        [c, "close", x] => Act::Close {
            client: client(c)?,
            node: node(x)?,
        },
        ["fair"] => Act::Fair,
        _ => return Err(format!("unknown step {item:?}")),
    })
}

fn client(s: &str) -> Result<usize, String> {
    match parse_party(s)? {
        Party::Client(c) => Ok(c),
        Party::Node(_) | Party::Stranger(_) => Err(format!("{s:?} is not a client")),
    }
}

/// Parses a script (settings first, then steps).
pub fn parse(text: &str) -> Result<Script, String> {
    let mut set: BTreeMap<&str, u64> = BTreeMap::new();
    let mut acts = Vec::new();
    let items = text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|i| !i.is_empty() && !i.starts_with("//"));
    for item in items {
        let w: Vec<&str> = item.split_whitespace().collect();
        match w.as_slice() {
            [
                name @ ("nodes" | "clients" | "heartbeat" | "timeout" | "together" | "lease"
                | "wait"),
                v,
            ] => {
                set.insert(name, number(v)?);
            }
            _ => acts.push(parse_act(item)?),
        }
    }
    let get = |k: &str| {
        set.get(k)
            .copied()
            .ok_or_else(|| format!("no {k:?} setting"))
    };
    Ok(Script {
        nodes: get("nodes")? as usize,
        clients: get("clients")? as usize,
        timing: Timing {
            heartbeat_ms: get("heartbeat")?,
            peer_timeout_ms: get("timeout")?,
            together_ms: get("together")?,
            lease_ms: get("lease")?,
            wait_ms: get("wait")?,
        },
        acts,
    })
}

impl Script {
    /// The settings line a script starts with.
    pub fn header(nodes: usize, clients: usize, t: &Timing) -> String {
        format!(
            "nodes {nodes}, clients {clients}, heartbeat {}, timeout {}, together {}, lease {}, wait {}",
            t.heartbeat_ms, t.peer_timeout_ms, t.together_ms, t.lease_ms, t.wait_ms
        )
    }
}

impl Sim {
    /// A simulator that replays `script`'s steps ([`Sim::replay_act`]):
    /// its nodes start again with the model's clocks (a nanosecond apart),
    /// timers and incarnations.
    pub fn replaying(script: &Script) -> Sim {
        let mut sim = Sim::new(0, SimConfig::scripted(script.nodes, script.clients));
        sim.replaying = Some(Box::new(State {
            timing: script.timing.clone(),
            together: BTreeMap::new(),
        }));
        for x in 0..script.nodes {
            let slot = &mut sim.nodes[x];
            slot.inc = None;
            slot.generation = 0;
            slot.drift_ns = x as i64;
            sim.start_node(x);
        }
        sim
    }

    /// Replays every step; `Err`: the step at which it stopped and why
    /// (a violation, or a step not possible here).
    pub fn replay(&mut self, acts: &[Act]) -> Result<(), (usize, String)> {
        for (i, act) in acts.iter().enumerate() {
            self.replay_act(*act).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// One step, then every check.
    pub fn replay_act(&mut self, act: Act) -> Result<(), String> {
        self.log(format!("REPLAY {act}"));
        self.stats.steps += 1;
        self.replay_only(act)
            .map_err(|e| format!("{act} is not possible in the simulator: {e}"))?;
        self.check_step();
        self.check_together();
        match &self.failure {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        }
    }

    fn replay_only(&mut self, act: Act) -> Result<(), String> {
        let want_runs = |sim: &Sim, x: usize| {
            if x < sim.cfg.nodes && sim.runs(x) {
                Ok(())
            } else {
                Err(format!("n{x} does not run"))
            }
        };
        match act {
            Act::Tick(x) => {
                want_runs(self, x)?;
                self.op(x, "tick", |node, now| node.tick(now));
                self.replay_flush(x);
            }
            Act::Dial(x, p) => {
                want_runs(self, x)?;
                self.replay_dial(x, p)?;
            }
            Act::Deliver { from, to, link } => self.replay_deliver(from, to, link)?,
            Act::Advance(t) => self.replay_advance(t)?,
            Act::Crash(x) => {
                if !self.up(x) {
                    return Err(format!("n{x} is down"));
                }
                self.crash(x);
            }
            Act::Restart(x) => {
                if self.up(x) {
                    return Err(format!("n{x} is up"));
                }
                self.restart(x);
                self.replay_flush(x);
            }
            Act::Leave(x) => {
                want_runs(self, x)?;
                // As the model's leave: the process is gone after it (no
                // turns until the driver says it is finished).
                self.leave(x);
                self.exit(x);
            }
            Act::Hang(x, ms) => {
                want_runs(self, x)?;
                self.hang(x, ms);
            }
            Act::Cut(a, b) => self.one_way(a, b),
            Act::Split(a, b) => {
                self.one_way(a, b);
                self.one_way(b, a);
            }
            Act::Heal(a, b) => {
                self.heal_one_way(a, b);
                self.heal_one_way(b, a);
                if self
                    .partition
                    .as_ref()
                    .is_some_and(|p| p.one_way.is_empty())
                {
                    self.heal();
                }
            }
            Act::Fair => self.heal(),
            Act::Acquire { client, key, node } => self.replay_acquire(client, key, node)?,
            Act::Release { client, key } | Act::Renew { client, key } => {
                self.replay_release(client, key, matches!(act, Act::Release { .. }))?;
            }
            Act::Close { client, node } => {
                let sc = self.clients[client].conns[node]
                    .ok_or_else(|| format!("c{client} has no connection to n{node}"))?;
                self.client_close(client, sc);
            }
        }
        Ok(())
    }

    /// After a call into node `x`: its output goes out, the links it gave
    /// up on close, its dials start (resolved by `dial` steps).
    fn replay_flush(&mut self, x: usize) {
        if !self.up(x) {
            return;
        }
        self.flush_node(x);
        let mut dials = Vec::new();
        let now = self.node_now(x);
        let inc = self.nodes[x].inc.as_mut().unwrap();
        inc.driver.take_dials(&mut inc.node, now, &mut dials);
        let generation = inc.generation;
        for (peer, _) in dials {
            self.dials.push(Dial {
                node: x,
                generation,
                peer: peer.0,
                due: self.now,
                started: self.now,
                phase: DialPhase::Attempt,
                lost: false,
            });
        }
    }

    fn replay_dial(&mut self, x: usize, p: usize) -> Result<(), String> {
        let generation = self.nodes[x].generation;
        let i = self
            .dials
            .iter()
            .position(|d| d.node == x && d.peer == p && d.generation == generation)
            .ok_or("no such dial in flight")?;
        let mut d = self.dials.remove(i);
        // As the model's dials: at once, connected if the peer is up and
        // the way open, else failed.
        d.phase = if self.up(p) && self.path_open(x, p) {
            DialPhase::Connecting
        } else {
            DialPhase::TimedOut
        };
        let before = self.conns.len();
        self.resolve_dial(d);
        if self.conns.len() > before {
            // The peer accepts at once (the model's dials take no time).
            self.replay_accept(p);
        }
        self.replay_flush(x);
        Ok(())
    }

    /// Node `x` accepts every connection waiting for it.
    fn replay_accept(&mut self, x: usize) {
        let accepts = std::mem::take(&mut self.nodes[x].inc.as_mut().unwrap().accepts);
        for (_, sc) in accepts {
            self.accept_conn(x, sc);
        }
    }

    fn replay_deliver(&mut self, from: Party, to: Party, sc: usize) -> Result<(), String> {
        let conn = self
            .conns
            .get(sc)
            .and_then(Option::as_ref)
            .ok_or("no such connection")?;
        let e = (0..2)
            .find(|&e| conn.parties[e] == from && conn.parties[1 - e] == to)
            .ok_or_else(|| format!("it is between {:?}", conn.parties))?;
        if !conn.open[1 - e] {
            return Err("its receiving end is closed".into());
        }
        let conn = self.conns[sc].as_mut().unwrap();
        let (at, seg) = conn.pipes[e].segs.pop_front().ok_or("nothing in flight")?;
        self.made_room(sc, e);
        match to {
            Party::Client(c) => match seg {
                Seg::Data(bytes, sent) => {
                    let mut data = self.clients[c].partial.remove(&sc).unwrap_or_default();
                    data.extend_from_slice(&bytes);
                    let whole = super::memchr_last(&data).map_or(0, |i| i + 1);
                    let tail = data.split_off(whole);
                    if !tail.is_empty() {
                        self.clients[c].partial.insert(sc, tail);
                    }
                    self.client_input(c, sc, &data, sent);
                }
                Seg::Fin | Seg::Rst => self.client_close(c, sc),
            },
            Party::Stranger(_) => return Err("a model has no strangers".into()),
            Party::Node(x) => {
                if !self.runs(x)
                    || self.conns[sc].as_ref().unwrap().gens[1 - e] != self.nodes[x].generation
                {
                    return Err(format!("n{x} does not run or the end is not its"));
                }
                let xe = 1 - e;
                let cid = self.conns[sc].as_ref().unwrap().cids[xe].ok_or("not accepted")?;
                match seg {
                    Seg::Data(bytes, sent) => self.node_input(x, sc, xe, cid, bytes, at, sent),
                    Seg::Fin => {
                        self.with_life(x, cid, "end of stream", |life, node, now| {
                            life.peer_closed(node, now, cid)
                        });
                        self.settle(x, sc, xe, cid);
                    }
                    Seg::Rst => self.node_fail(x, sc, xe, "reset by the other side"),
                }
                self.replay_flush(x);
            }
        }
        Ok(())
    }

    fn replay_advance(&mut self, t: u64) -> Result<(), String> {
        if t <= self.now {
            return Err(format!("time is already {}", self.now));
        }
        self.now = t;
        for x in 0..self.cfg.nodes {
            if self.nodes[x].hung_until.is_some_and(|u| u <= t) {
                self.resume(x);
                // Its loop wakes and ticks before it reads anything.
                self.op(x, "tick", |node, now| node.tick(now));
                self.replay_flush(x);
            }
        }
        Ok(())
    }

    fn replay_acquire(&mut self, c: usize, k: usize, x: usize) -> Result<(), String> {
        if !self.up(x) {
            return Err(format!("n{x} is down"));
        }
        if self.clients[c].conns[x].is_none() {
            let sc = self.new_conn([Party::Client(c), Party::Node(x)], false);
            let cid = self.alloc_cid(x, sc);
            self.conns[sc].as_mut().unwrap().cids[1] = Some(cid);
            self.op(x, "accept", |node, _| {
                node.open(cid);
                node.set_remote(cid, client_addr(c));
            });
            self.clients[c].conns[x] = Some(sc);
        }
        let t = self.replaying.as_ref().unwrap().timing.clone();
        let req = Req {
            limit: 0,
            op: b'A',
            key: format!("k{k}").into_bytes(),
            token: 0,
            lease_ms: t.lease_ms,
            wait_ms: t.wait_ms,
            redirects: 0,
            retry_until: 0,
            sent_ms: 0,
        };
        self.client_send(c, x, req);
        Ok(())
    }

    /// `R` (or `N`) of what client `c` holds of key `k`, to the node it got
    /// it from.
    fn replay_release(&mut self, c: usize, k: usize, release: bool) -> Result<(), String> {
        let key = format!("k{k}").into_bytes();
        let held = self.clients[c]
            .held
            .get(&key)
            .cloned()
            .ok_or_else(|| format!("c{c} holds no k{k}"))?;
        self.set_target(c, held.node);
        if release {
            self.client_release(c, &key);
            return Ok(());
        }
        let req = Req {
            limit: 0,
            op: b'N',
            key,
            token: held.token,
            lease_ms: self.replaying.as_ref().unwrap().timing.lease_ms,
            wait_ms: 0,
            redirects: 0,
            retry_until: 0,
            sent_ms: 0,
        };
        self.client_send(c, held.node, req);
        Ok(())
    }

    /// The model's rule: two running actives only if the network cut them
    /// apart less than `together` ms ago.
    fn check_together(&mut self) {
        let Some(state) = self.replaying.as_ref() else {
            return;
        };
        let window = state.timing.together_ms;
        let n = self.cfg.nodes;
        let actives: Vec<usize> = self
            .actives()
            .into_iter()
            .filter(|&x| self.runs(x))
            .collect();
        let mut found = None;
        let mut together = self.replaying.as_ref().unwrap().together.clone();
        for a in 0..n {
            for b in a + 1..n {
                let reachable = !self.blocked(Party::Node(a), Party::Node(b))
                    && !self.blocked(Party::Node(b), Party::Node(a));
                if !reachable {
                    together.insert((a, b), u64::MAX);
                    continue;
                }
                let since = together.entry((a, b)).or_insert(0);
                if *since == u64::MAX {
                    *since = self.now;
                }
                let since = *since;
                if found.is_none()
                    && actives.contains(&a)
                    && actives.contains(&b)
                    && self.now >= since + window
                {
                    let why = if since == 0 {
                        "nothing ever blocked the way between them".to_string()
                    } else {
                        format!("the way between them was unblocked at {since} ms")
                    };
                    found = Some(format!("n{a} and n{b} are both active, and {why}"));
                }
            }
        }
        self.replaying.as_mut().unwrap().together = together;
        if let Some(f) = found {
            self.fail(f);
        }
    }

    /// What the replay shows after a step: each node's role and table.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for x in 0..self.cfg.nodes {
            match self.role(x) {
                None => out.push_str(&format!("n{x} down; ")),
                Some(role) => {
                    let hung = if self.runs(x) { "" } else { " (hung)" };
                    let table: Vec<String> = self
                        .table(x)
                        .into_iter()
                        .map(|(k, t)| format!("{k}={t}"))
                        .collect();
                    out.push_str(&format!(
                        "n{x} {role:?}{hung} table [{}]; ",
                        table.join(" ")
                    ));
                }
            }
        }
        out
    }

    /// The failure, if any, and the event log (what [`Sim::report`] shows
    /// for a seed).
    pub fn replay_log(&self) -> String {
        let mut out = format!(
            "failure: {:?}\nlast {} events:\n",
            self.failure,
            self.log.len()
        );
        for l in &self.log {
            out.push_str("  ");
            out.push_str(l);
            out.push('\n');
        }
        out
    }

    /// What the model's `World::observed` shows of the same state: each
    /// node's role and table, each client's holds.
    pub fn observed(&self) -> Vec<String> {
        let mut out = Vec::new();
        for x in 0..self.cfg.nodes {
            out.push(match self.role(x) {
                None => format!("n{x} down"),
                Some(role) => format!(
                    "n{x} runs {} {role:?} {:?} highest {}",
                    self.runs(x),
                    self.table(x),
                    self.highest_token(x)
                ),
            });
        }
        for c in 0..self.clients.len() {
            let holds: BTreeMap<String, u64> = self.clients[c]
                .held
                .iter()
                .map(|(k, h)| (super::show(k), h.token))
                .collect();
            out.push(format!("c{c} holds {holds:?}"));
        }
        out
    }
}
