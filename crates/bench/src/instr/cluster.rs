//! The cluster's hot paths for callgrind: an active replicating every
//! grant and release to two followers, and a follower applying that
//! stream.
//!
//! Three real nodes are linked in memory (the dialer's output bytes are
//! fed to the acceptor's session and back, as the loops would carry them)
//! and run until the first is active and both others follow it and hold
//! its snapshot. Then the measured cycles run on the active exactly as in
//! the `cycle` case (same reads through `Session::feed`), plus the turn's
//! `Node::take_dirty`, which writes the replication to the followers'
//! links. The difference from `cycle` is what replication costs the active
//! in instructions; syscalls (one send per follower per turn) come on top
//! and are not counted here.

use std::hint::black_box;

use ringlock::cluster::auth::Secret;
use ringlock::cluster::{ClusterConfig, PeerId, Role};
use ringlock::engine::{ConnId, Now};
use ringlock::io::Session;
use ringlock::node::{Node, NodeConfig};

use super::{KEYS, UNIX_NS, cycle_reads as reads};

const NODES: usize = 3;
/// The client's connection on the active.
const CLIENT: ConnId = ConnId::new(0);
/// Peer connections get ids from here up, on every node.
const FIRST_PEER_CONN: u32 = 100;
const HEARTBEAT_MS: u64 = 50;
/// The active (node 0 of 3) issues tokens of residue 0 modulo 3: with the
/// mesh's clock standing still, each is the last plus 3.
const TOKEN_STEP: u64 = NODES as u64;

fn now(ms: u64) -> Now {
    Now {
        ms,
        us: ms * 1000,
        unix_ns: UNIX_NS + ms * 1_000_000,
    }
}

/// One TCP connection between two nodes: `(node, conn)` at each end.
struct Link {
    ends: [(usize, ConnId); 2],
}

/// Three nodes and the links between them, carried in memory.
struct Mesh {
    nodes: Vec<Node>,
    /// Per node, per connection id: that connection's session.
    sessions: Vec<Vec<Session>>,
    links: Vec<Link>,
    next_conn: Vec<u32>,
    ms: u64,
}

impl Mesh {
    fn new() -> Mesh {
        let peers: Vec<String> = (0..NODES)
            .map(|i| format!("127.0.0.{}:7171", i + 1))
            .collect();
        let nodes = (0..NODES)
            .map(|me| {
                let cluster = ClusterConfig {
                    peers: peers.clone(),
                    me: PeerId(me),
                    heartbeat_ms: HEARTBEAT_MS,
                    peer_timeout_ms: 500,
                    failback_delay_ms: 0,
                    incarnation: 0x9e37_79b9_7f4a_7c15 ^ me as u64,
                    secret: Secret::from_bytes(b"the callgrind cluster's secret, 32+ bytes"),
                    read_batch_us: 0,
                };
                let config = NodeConfig {
                    advertise: peers[me].clone(),
                    cluster: Some(cluster),
                    max_locks: ringlock::engine::DEFAULT_MAX_LOCKS,
                };
                Node::new(now(1), config)
            })
            .collect();
        let sessions = (0..NODES)
            .map(|_| (0..FIRST_PEER_CONN + 16).map(|_| Session::new()).collect())
            .collect();
        Mesh {
            nodes,
            sessions,
            links: Vec::new(),
            next_conn: vec![FIRST_PEER_CONN; NODES],
            ms: 1,
        }
    }

    fn alloc(&mut self, x: usize) -> ConnId {
        let conn = self.next_conn[x];
        assert!(
            conn < FIRST_PEER_CONN + 16,
            "more peer connections than the mesh has sessions"
        );
        self.next_conn[x] += 1;
        ConnId::new(conn)
    }

    /// The other end of `(x, conn)`.
    fn peer_of(&self, x: usize, conn: ConnId) -> Option<(usize, ConnId)> {
        self.links.iter().find_map(|l| match l.ends {
            [a, b] if a == (x, conn) => Some(b),
            [a, b] if b == (x, conn) => Some(a),
            _ => None,
        })
    }

    /// One loop turn of every node at the mesh's time: dials, timers, and
    /// every byte written carried to the other end until nothing moves.
    fn turn(&mut self) {
        let t = now(self.ms);
        let mut dials = Vec::new();
        for x in 0..NODES {
            self.nodes[x].take_dials(t, &mut dials);
            for (id, _addr) in dials.drain(..) {
                let peer = id.0;
                let (dialer, acceptor) = (self.alloc(x), self.alloc(peer));
                self.nodes[peer].open(acceptor);
                self.links.push(Link {
                    ends: [(x, dialer), (peer, acceptor)],
                });
                self.nodes[x].outbound_open(t, dialer, id);
            }
            self.nodes[x].tick(t);
        }
        let mut dirty = Vec::new();
        loop {
            let mut moved = false;
            for x in 0..NODES {
                self.nodes[x].take_dirty(t, &mut dirty);
                for conn in dirty.drain(..) {
                    let bytes = std::mem::take(self.nodes[x].output_mut(conn));
                    if bytes.is_empty() {
                        continue;
                    }
                    let (y, to) = self
                        .peer_of(x, conn)
                        .expect("output on a linked connection");
                    let _ = self.sessions[y][to.index()].feed(&mut self.nodes[y], t, to, &bytes);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        let mut doomed = Vec::new();
        for node in &mut self.nodes {
            node.take_doomed(t, &mut doomed);
            assert!(doomed.is_empty(), "a peer link broke in the mesh");
        }
    }

    /// Runs turns a heartbeat apart until node 0 is active and both others
    /// follow it with its snapshot.
    fn settle(&mut self) {
        for _ in 0..200 {
            self.turn();
            let settled = self.nodes[0].role() == Role::Active
                && (1..NODES).all(|x| {
                    self.nodes[x].role()
                        == Role::Standby {
                            following: Some(PeerId(0)),
                        }
                        && self.nodes[x].snapshot().ready
                });
            if settled {
                return;
            }
            self.ms += HEARTBEAT_MS;
        }
        panic!("the mesh did not settle on node 0 active with two synced followers");
    }

    /// The token the active will grant next.
    fn next_token(&mut self) -> u64 {
        let t = now(self.ms);
        self.nodes[0].open(CLIENT);
        self.nodes[0].set_remote(CLIENT, super::CLIENT_ADDR);
        let _ = self.sessions[0][CLIENT.index()].feed(
            &mut self.nodes[0],
            t,
            CLIENT,
            b"A instr-probe 30 0\n",
        );
        let out = std::mem::take(self.nodes[0].output_mut(CLIENT));
        let line = String::from_utf8(out).expect("an answer line");
        let token: u64 = line
            .trim_end()
            .strip_prefix("A instr-probe ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("the active did not grant the probe: {line:?}"));
        let release = format!("R instr-probe {token}\n");
        let _ = self.sessions[0][CLIENT.index()].feed(
            &mut self.nodes[0],
            t,
            CLIENT,
            release.as_bytes(),
        );
        self.nodes[0].output_mut(CLIENT).clear();
        self.turn();
        token + TOKEN_STEP
    }
}

/// A settled mesh whose active has run `warm` cycles; returns it and the
/// next token.
fn warmed(warm: u64) -> (Mesh, u64) {
    let mut mesh = Mesh::new();
    mesh.settle();
    let token = mesh.next_token();
    let mut peer_out = Vec::new();
    for read in reads(0, warm, token, TOKEN_STEP) {
        active_turn(&mut mesh, &read, &mut peer_out);
    }
    mesh.turn();
    (mesh, token + warm * TOKEN_STEP)
}

/// One turn of the active: a client read, then the turn's output collected
/// (replication written to the followers' links). The peer bytes are kept
/// in `peer_out` (per follower link, in order) when it is not `None`.
fn active_turn(mesh: &mut Mesh, read: &[u8], peer_out: &mut Vec<(ConnId, Vec<u8>)>) {
    let t = now(mesh.ms);
    let node = &mut mesh.nodes[0];
    let _ = mesh.sessions[0][CLIENT.index()].feed(node, t, CLIENT, black_box(read));
    let mut dirty = Vec::new();
    node.take_dirty(t, &mut dirty);
    for conn in dirty {
        let out = node.output_mut(conn);
        black_box(out.len());
        if conn != CLIENT {
            peer_out.push((conn, out.clone()));
        }
        out.clear();
    }
}

/// Per cycle: the active's work with two followers.
pub(super) fn replicate(n: u64) -> u64 {
    let (mut mesh, token) = warmed(4 * KEYS);
    let reads = reads(0, n, token, TOKEN_STEP);
    ringlock_instr_replicate(&mut mesh, &reads);
    assert_eq!(mesh.nodes[0].engine().lock_count(), 0);
    n
}

#[unsafe(no_mangle)]
#[inline(never)]
fn ringlock_instr_replicate(mesh: &mut Mesh, reads: &[Vec<u8>]) {
    let t = now(mesh.ms);
    let mut dirty = Vec::new();
    for read in reads {
        let node = &mut mesh.nodes[0];
        let _ = mesh.sessions[0][CLIENT.index()].feed(node, t, CLIENT, black_box(read));
        node.take_dirty(t, &mut dirty);
        for &conn in &dirty {
            let out = node.output_mut(conn);
            black_box(out.len());
            out.clear();
        }
        dirty.clear();
    }
}

/// Per cycle: a follower applying the active's replication of it.
pub(super) fn apply(n: u64) -> u64 {
    let (mut mesh, token) = warmed(4 * KEYS);
    let mut peer_out = Vec::new();
    for read in reads(0, n, token, TOKEN_STEP) {
        active_turn(&mut mesh, &read, &mut peer_out);
    }
    // What node 1 receives, on the link node 0 dialed to it.
    let (x, conn) = (
        0,
        peer_out
            .first()
            .map(|p| p.0)
            .expect("replication was written"),
    );
    let (y, to) = mesh.peer_of(x, conn).expect("a linked connection");
    let to_follower: Vec<Vec<u8>> = peer_out
        .into_iter()
        .filter(|(c, _)| mesh.peer_of(0, *c) == Some((y, to)))
        .map(|(_, bytes)| bytes)
        .collect();
    assert!(!to_follower.is_empty(), "nothing replicated to node {y}");
    let follower = &mut mesh.nodes[y];
    let session = &mut mesh.sessions[y][to.index()];
    ringlock_instr_apply(follower, session, to, now(mesh.ms), &to_follower);
    let node = &mesh.nodes[y];
    assert_eq!(
        node.engine().lock_count(),
        0,
        "the follower applied every release"
    );
    assert_eq!(
        node.snapshot().highest_token,
        token + (n - 1) * TOKEN_STEP,
        "the follower applied every grant"
    );
    n
}

#[unsafe(no_mangle)]
#[inline(never)]
fn ringlock_instr_apply(
    node: &mut Node,
    session: &mut Session,
    conn: ConnId,
    t: Now,
    stream: &[Vec<u8>],
) {
    for bytes in stream {
        let _ = session.feed(node, t, conn, black_box(bytes));
    }
}
