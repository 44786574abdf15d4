//! Unit tests of the cluster state machine, driven directly (no loop, no
//! sockets): the helpers every topic shares, one module per topic.

use super::*;
use crate::engine::Refusal;
use crate::outbox::cid;
use auth::{Identity, Nonce, Secret, Side, Transcript};

mod handshake;
mod replication;
mod role;
mod versions;

const TIMEOUT_MS: u64 = 500;

fn at(ms: u64) -> Now {
    Now {
        ms,
        us: ms * 1000,
        unix_ns: 1_700_000_000_000_000_000 + ms * 1_000_000,
    }
}

const SECRET: &[u8] = b"a secret of at least thirty-two bytes";

fn peers() -> Vec<String> {
    (0..3).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect()
}

/// Node `me` of three, with an engine and the outbox both write into.
fn node(me: usize) -> (Cluster, Engine, Outbox) {
    node_with(me, peers(), SECRET)
}

fn node_with(me: usize, peers: Vec<String>, secret: &[u8]) -> (Cluster, Engine, Outbox) {
    node_configured(me, peers, secret, 0)
}

/// Node `me` whose standby reads its active's link in batches of
/// `read_batch_us`.
fn node_batching(me: usize, read_batch_us: u64) -> (Cluster, Engine, Outbox) {
    node_configured(me, peers(), SECRET, read_batch_us)
}

fn node_configured(
    me: usize,
    peers: Vec<String>,
    secret: &[u8],
    read_batch_us: u64,
) -> (Cluster, Engine, Outbox) {
    let mut engine = Engine::new(at(0), &peers[me]);
    let mut out = Outbox::new();
    let cfg = ClusterConfig {
        peers,
        me: PeerId(me),
        heartbeat_ms: 50,
        peer_timeout_ms: TIMEOUT_MS,
        failback_delay_ms: 0,
        incarnation: 1,
        secret: Secret::from_bytes(secret),
        read_batch_us,
    };
    let cluster = Cluster::new(cfg, at(0), &mut engine, &mut out);
    (cluster, engine, out)
}

/// Takes the output of `conn` as text lines.
fn lines_of(o: &mut Outbox, conn: ConnId) -> Vec<String> {
    let out = std::mem::take(o.output_mut(conn));
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A peer as seen from outside: its own configuration and secret, enough
/// to speak the handshake to a node under test.
struct Remote {
    peers: Vec<String>,
    index: usize,
    incarnation: u64,
    secret: Secret,
    /// The peer protocol version its `HELLO` says.
    version: u64,
}

impl Remote {
    fn new(index: usize) -> Remote {
        Remote {
            peers: peers(),
            index,
            incarnation: 1,
            secret: Secret::from_bytes(SECRET),
            version: wire::VERSION,
        }
    }

    fn identity(&self, nonce: Nonce) -> Identity<'_> {
        Identity {
            fingerprint: auth::fingerprint(wire::FINGERPRINT_VERSION, &self.peers),
            index: self.index as u64,
            addr: self.peers[self.index].as_bytes(),
            nonce,
        }
    }

    /// Dials the node as `conn`: HELLO, reads the CHALLENGE, answers AUTH.
    /// Returns the result of the AUTH.
    fn dial(
        &self,
        c: &mut Cluster,
        e: &mut Engine,
        o: &mut Outbox,
        now: Now,
        conn: ConnId,
    ) -> Result<(), PeerError> {
        e.open(conn, o);
        let nonce = [9u8; auth::NONCE_LEN];
        let me = self.identity(nonce);
        let hello = PeerMsg::Hello {
            version: self.version,
            fingerprint: me.fingerprint,
            from: PeerId(self.index),
            addr: me.addr,
            incarnation: self.incarnation,
            nonce,
        };
        c.on_message(now, conn, hello, e, o)?;
        let out = lines_of(o, conn);
        assert_eq!(out.len(), 1, "only the CHALLENGE: {out:?}");
        let PeerMsg::Challenge {
            fingerprint,
            index,
            addr,
            nonce: their_nonce,
            mac,
        } = wire::parse(out[0].as_bytes()).unwrap()
        else {
            panic!("not a CHALLENGE: {}", out[0]);
        };
        let transcript = Transcript {
            dialer: me,
            dialer_incarnation: self.incarnation,
            acceptor: Identity {
                fingerprint,
                index: index.0 as u64,
                addr,
                nonce: their_nonce,
            },
        };
        // (The node's MAC is checked by the node's own dialer code: see
        // `our_link_sends_nothing_before_the_peer_proves_itself`.)
        let _ = mac;
        let mac = self.secret.sign(Side::Dialer, &transcript);
        c.on_message(now, conn, PeerMsg::Auth { mac }, e, o)
    }

    /// Answers the node's HELLO on its outbound link `conn` with a valid
    /// CHALLENGE; returns the node's answer lines.
    fn accept(
        &self,
        c: &mut Cluster,
        e: &mut Engine,
        o: &mut Outbox,
        now: Now,
        conn: ConnId,
    ) -> Result<Vec<String>, PeerError> {
        let out = lines_of(o, conn);
        let PeerMsg::Hello {
            fingerprint,
            from,
            addr,
            incarnation,
            nonce,
            ..
        } = wire::parse(out[0].as_bytes()).unwrap()
        else {
            panic!("not a HELLO: {}", out[0]);
        };
        let their_nonce = [7u8; auth::NONCE_LEN];
        let transcript = Transcript {
            dialer: Identity {
                fingerprint,
                index: from.0 as u64,
                addr,
                nonce,
            },
            dialer_incarnation: incarnation,
            acceptor: self.identity(their_nonce),
        };
        let mac = self.secret.sign(Side::Acceptor, &transcript);
        let me = self.identity(their_nonce);
        let challenge = PeerMsg::Challenge {
            fingerprint: me.fingerprint,
            index: PeerId(self.index),
            addr: me.addr,
            nonce: their_nonce,
            mac,
        };
        c.on_message(now, conn, challenge, e, o)?;
        Ok(lines_of(o, conn))
    }
}

/// `peer`'s HELLO on connection `conn` (a link it dialed), answered by
/// `c`'s CHALLENGE: the HELLO and the AUTH MAC that completes it, from
/// the challenge `c` sent.
fn hello_and_auth<'a>(
    peer: &'a Remote,
    c: &mut Cluster,
    e: &mut Engine,
    o: &mut Outbox,
    now: Now,
    conn: ConnId,
) -> (PeerMsg<'a>, auth::MacBytes) {
    let nonce = [9u8; auth::NONCE_LEN];
    let me = peer.identity(nonce);
    let hello = PeerMsg::Hello {
        version: wire::VERSION,
        fingerprint: me.fingerprint,
        from: PeerId(peer.index),
        addr: me.addr,
        incarnation: 1,
        nonce,
    };
    c.on_message(now, conn, hello, e, o).unwrap();
    let challenge = lines_of(o, conn).remove(0);
    let Ok(PeerMsg::Challenge {
        fingerprint,
        index,
        addr,
        nonce: n,
        ..
    }) = wire::parse(challenge.as_bytes())
    else {
        panic!("{challenge}")
    };
    let transcript = Transcript {
        dialer: me,
        dialer_incarnation: 1,
        acceptor: Identity {
            fingerprint,
            index: index.0 as u64,
            addr,
            nonce: n,
        },
    };
    let mac = peer.secret.sign(Side::Dialer, &transcript);
    (hello, mac)
}

/// A `HELLO` claiming to be node 0 of the node's own list, with the given
/// incarnation and a nonce of `nonce_byte`s: what a stranger can send.
fn hello_as_node0(c: &Cluster, incarnation: u64, nonce_byte: u8) -> PeerMsg<'static> {
    PeerMsg::Hello {
        version: wire::VERSION,
        fingerprint: c.fingerprint(),
        from: PeerId(0),
        addr: b"127.0.0.1:7000",
        incarnation,
        nonce: [nonce_byte; auth::NONCE_LEN],
    }
}

/// The node's dial to `peer` succeeded as connection `conn`: opened, and
/// its HELLO written (as [`crate::node::Node::outbound_open`] does).
fn dial_out(c: &mut Cluster, e: &mut Engine, o: &mut Outbox, now: Now, conn: ConnId, peer: usize) {
    e.open(conn, o);
    c.outbound_open(now, conn, PeerId(peer), o);
}

/// Peer `from` links to the node (inbound conn `conn`) and proves who it is.
fn link_in(c: &mut Cluster, e: &mut Engine, o: &mut Outbox, now: Now, conn: ConnId, from: usize) {
    Remote::new(from).dial(c, e, o, now, conn).unwrap();
}

fn heartbeat(
    c: &mut Cluster,
    e: &mut Engine,
    o: &mut Outbox,
    now: Now,
    conn: ConnId,
    active: bool,
    following: Option<usize>,
) {
    let msg = PeerMsg::Heartbeat {
        active,
        following: following.map(PeerId),
        highest: 0,
        synced: following.is_some(),
    };
    c.on_message(now, conn, msg, e, o).unwrap();
}

#[allow(clippy::too_many_arguments)]
fn heartbeat_synced(
    c: &mut Cluster,
    e: &mut Engine,
    o: &mut Outbox,
    now: Now,
    conn: ConnId,
    active: bool,
    following: Option<usize>,
    synced: bool,
) {
    let msg = PeerMsg::Heartbeat {
        active,
        following: following.map(PeerId),
        highest: 0,
        synced,
    };
    c.on_message(now, conn, msg, e, o).unwrap();
}

/// Node 0, active after its start-up grace, with outbound links to 1 and 2
/// and inbound links from both.
fn active_node0() -> (Cluster, Engine, Outbox) {
    let (mut c, mut e, mut o) = node_linked(0, 0);
    // Ticks as the loop does (a long gap would read as a stall of this
    // process and restart the start-up grace), peers heard throughout.
    for ms in (2..=TIMEOUT_MS + 50).step_by(50) {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, None);
        c.tick(at(ms), &mut e, &mut o);
    }
    assert_eq!(c.role(), Role::Active);
    (c, e, o)
}

/// Node `me` of three (reading its active's link in batches of
/// `read_batch_us`), linked both ways to the other two, in priority
/// order: its links to them are 20 and 21, theirs to it 10 and 11. It
/// follows nobody yet.
fn node_linked(me: usize, read_batch_us: u64) -> (Cluster, Engine, Outbox) {
    let (mut c, mut e, mut o) = node_batching(me, read_batch_us);
    let others = (0..3).filter(|&p| p != me);
    for ((out, inbound), peer) in [(20, 10), (21, 11)].into_iter().zip(others) {
        dial_out(&mut c, &mut e, &mut o, at(0), cid(out), peer);
        Remote::new(peer)
            .accept(&mut c, &mut e, &mut o, at(0), cid(out))
            .unwrap();
        link_in(&mut c, &mut e, &mut o, at(1), cid(inbound), peer);
    }
    (c, e, o)
}

/// Node `me`, started with no peer in reach: active alone after its
/// start-up wait, with an empty table and no claim to the cluster's state.
fn fresh_active(me: usize) -> (Cluster, Engine, Outbox) {
    let (mut c, mut e, mut o) = node(me);
    for ms in (0..=TIMEOUT_MS + 50).step_by(50) {
        c.tick(at(ms), &mut e, &mut o);
    }
    assert_eq!(c.role(), Role::Active);
    assert!(!c.synced, "took the role with no state anywhere in reach");
    (c, e, o)
}

/// Sends a client request line on `conn` to the engine.
fn client(e: &mut Engine, o: &mut Outbox, now: Now, conn: ConnId, line: &str) {
    let wire = format!("{line}\n");
    let (request, _) = crate::proto::parse_request(wire.as_bytes())
        .unwrap()
        .unwrap();
    e.handle(now, conn, request, o).unwrap();
}

/// [`lines_of`] without the lag probes (which go behind a turn's deltas).
fn replication_lines(o: &mut Outbox, conn: ConnId) -> Vec<String> {
    let mut lines = lines_of(o, conn);
    lines.retain(|l| !l.starts_with("P PROBE "));
    lines
}

/// Like [`client`], returning what the engine returned.
fn try_client(
    e: &mut Engine,
    o: &mut Outbox,
    now: Now,
    conn: ConnId,
    line: &str,
) -> Result<(), Refusal> {
    let wire = format!("{line}\n");
    let (request, _) = crate::proto::parse_request(wire.as_bytes())
        .unwrap()
        .unwrap();
    e.handle(now, conn, request, o)
}

/// `us` microseconds past `ms`.
fn at_us(ms: u64, us: u64) -> Now {
    Now {
        us: ms * 1000 + us,
        ..at(ms)
    }
}

fn lag_of(c: &Cluster, follower: &str) -> crate::stats::FollowerStats {
    c.followers()
        .find(|(addr, _, _)| *addr == follower)
        .map(|(_, _, stats)| *stats)
        .unwrap()
}
