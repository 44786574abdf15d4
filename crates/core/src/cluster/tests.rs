//! The hand-off rules of the state machine, driven directly: who may be
//! chosen as successor, and from whom `HANDOFF` is taken.

use super::*;
use crate::engine::Refusal;
use auth::{Identity, Nonce, Secret, Side, Transcript};

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

/// Node `me` of three, with an engine.
fn node(me: usize) -> (Cluster, Engine) {
    node_with(me, peers(), SECRET)
}

fn node_with(me: usize, peers: Vec<String>, secret: &[u8]) -> (Cluster, Engine) {
    node_coalescing(me, peers, secret, 0)
}

fn node_coalescing(
    me: usize,
    peers: Vec<String>,
    secret: &[u8],
    coalesce_us: u64,
) -> (Cluster, Engine) {
    let mut engine = Engine::new(at(0), &peers[me]);
    let cfg = ClusterConfig {
        peers,
        me,
        heartbeat_ms: 50,
        peer_timeout_ms: TIMEOUT_MS,
        failback_delay_ms: 0,
        incarnation: 1,
        secret: Secret::from_bytes(secret),
        coalesce_us,
    };
    let cluster = Cluster::new(cfg, at(0), &mut engine);
    (cluster, engine)
}

/// Takes the output of `conn` as text lines.
fn lines_of(e: &mut Engine, conn: ConnId) -> Vec<String> {
    let out = std::mem::take(e.output_mut(conn));
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
        now: Now,
        conn: ConnId,
    ) -> Result<(), PeerError> {
        e.open(conn);
        let nonce = [9u8; auth::NONCE_LEN];
        let me = self.identity(nonce);
        let hello = PeerMsg::Hello {
            version: self.version,
            fingerprint: me.fingerprint,
            from: self.index,
            addr: me.addr,
            incarnation: self.incarnation,
            nonce,
        };
        c.on_message(now, conn, hello, e)?;
        let out = lines_of(e, conn);
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
                index: index as u64,
                addr,
                nonce: their_nonce,
            },
        };
        // (The node's MAC is checked by the node's own dialer code: see
        // `our_link_sends_nothing_before_the_peer_proves_itself`.)
        let _ = mac;
        let mac = self.secret.sign(Side::Dialer, &transcript);
        c.on_message(now, conn, PeerMsg::Auth { mac }, e)
    }

    /// Answers the node's HELLO on its outbound link `conn` with a valid
    /// CHALLENGE; returns the node's answer lines.
    fn accept(
        &self,
        c: &mut Cluster,
        e: &mut Engine,
        now: Now,
        conn: ConnId,
    ) -> Result<Vec<String>, PeerError> {
        let out = lines_of(e, conn);
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
                index: from as u64,
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
            index: self.index,
            addr: me.addr,
            nonce: their_nonce,
            mac,
        };
        c.on_message(now, conn, challenge, e)?;
        Ok(lines_of(e, conn))
    }
}

/// `peer`'s HELLO on connection `conn` (a link it dialed), answered by
/// `c`'s CHALLENGE: the HELLO and the AUTH MAC that completes it, from
/// the challenge `c` sent.
fn hello_and_auth<'a>(
    peer: &'a Remote,
    c: &mut Cluster,
    e: &mut Engine,
    now: Now,
    conn: ConnId,
) -> (PeerMsg<'a>, auth::MacBytes) {
    let nonce = [9u8; auth::NONCE_LEN];
    let me = peer.identity(nonce);
    let hello = PeerMsg::Hello {
        version: wire::VERSION,
        fingerprint: me.fingerprint,
        from: peer.index,
        addr: me.addr,
        incarnation: 1,
        nonce,
    };
    c.on_message(now, conn, hello, e).unwrap();
    let challenge = lines_of(e, conn).remove(0);
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
            index: index as u64,
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
        from: 0,
        addr: b"127.0.0.1:7000",
        incarnation,
        nonce: [nonce_byte; auth::NONCE_LEN],
    }
}

/// Peer `from` links to the node (inbound conn `conn`) and proves who it is.
fn link_in(c: &mut Cluster, e: &mut Engine, now: Now, conn: ConnId, from: usize) {
    Remote::new(from).dial(c, e, now, conn).unwrap();
}

fn heartbeat(
    c: &mut Cluster,
    e: &mut Engine,
    now: Now,
    conn: ConnId,
    active: bool,
    following: Option<usize>,
) {
    let msg = PeerMsg::Heartbeat {
        active,
        following,
        highest: 0,
        synced: following.is_some(),
    };
    c.on_message(now, conn, msg, e).unwrap();
}

#[test]
fn handoff_is_taken_only_from_the_followed_node() {
    // Node 2 follows nobody yet (start-up grace), so it has no state of
    // node 1's: a HANDOFF from node 1 is refused.
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 11, 1);
    heartbeat(&mut c, &mut e, at(2), 11, false, None);
    assert_eq!(c.role(), Role::Standby { following: None });
    let handoff = PeerMsg::Handoff { highest: 5 };
    c.on_message(at(3), 11, handoff, &mut e).unwrap();
    assert_eq!(c.role(), Role::Standby { following: None });
    // Its token is observed all the same: tokens never go back.
    assert!(e.highest_token() >= 5);

    // Following node 1, it has node 1's state: the role is taken at once.
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 11, 1);
    heartbeat(&mut c, &mut e, at(2), 11, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    let handoff = PeerMsg::Handoff { highest: 6 };
    c.on_message(at(3), 11, handoff, &mut e).unwrap();
    assert_eq!(c.role(), Role::Active);
}

#[test]
fn a_standby_applies_shared_grants_and_permits_and_refuses_a_permit_without_its_limit() {
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 11, 1);
    heartbeat(&mut c, &mut e, at(2), 11, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    let member = |key: &'static [u8], token, permit| PeerMsg::Member {
        key,
        token,
        remaining_ms: 1_000,
        holder: crate::proto::Holder::default(),
        permit,
    };
    c.on_message(at(3), 11, member(b"r", 5, false), &mut e)
        .unwrap();
    c.on_message(at(3), 11, PeerMsg::Limit { limit: 2 }, &mut e)
        .unwrap();
    c.on_message(at(3), 11, member(b"s", 6, true), &mut e)
        .unwrap();
    assert_eq!(e.members_of(b"r").len(), 1);
    assert_eq!(e.semaphore_limit(b"s"), Some(2));
    assert!(e.highest_token() >= 6);
    e.check_invariants();
    // A permit without a limit, and a shared grant while a limit waits
    // for its permit, break the link.
    let err = c
        .on_message(at(4), 11, member(b"s", 7, true), &mut e)
        .unwrap_err();
    assert!(err.to_string().contains("without its L line"), "{err}");
    c.on_message(at(4), 11, PeerMsg::Limit { limit: 2 }, &mut e)
        .unwrap();
    let err = c
        .on_message(at(4), 11, member(b"r", 8, false), &mut e)
        .unwrap_err();
    assert!(err.to_string().contains("after an L line"), "{err}");
    assert_eq!(e.member_count(), 2, "nothing applied from a broken pair");
}

/// Node 0, active after its start-up grace, with outbound links to 1 and 2
/// and inbound links from both.
fn active_node0() -> (Cluster, Engine) {
    active_node0_coalescing(0)
}

fn active_node0_coalescing(coalesce_us: u64) -> (Cluster, Engine) {
    let (mut c, mut e) = node_coalescing(0, peers(), SECRET, coalesce_us);
    for (conn, peer) in [(20, 1), (21, 2)] {
        e.open(conn);
        c.outbound_open(at(0), conn, peer, &mut e);
        Remote::new(peer)
            .accept(&mut c, &mut e, at(0), conn)
            .unwrap();
    }
    link_in(&mut c, &mut e, at(1), 10, 1);
    link_in(&mut c, &mut e, at(1), 11, 2);
    // Ticks as the loop does (a long gap would read as a stall of this
    // process and restart the start-up grace), peers heard throughout.
    for ms in (2..=TIMEOUT_MS + 50).step_by(50) {
        heartbeat(&mut c, &mut e, at(ms), 10, false, None);
        heartbeat(&mut c, &mut e, at(ms), 11, false, None);
        c.tick(at(ms), &mut e);
    }
    assert_eq!(c.role(), Role::Active);
    (c, e)
}

#[test]
fn a_leaving_active_hands_off_only_to_a_follower() {
    // Nobody follows it yet: no hand-off (a non-follower would take the
    // role without its grants).
    let (mut c, mut e) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    heartbeat(&mut c, &mut e, now, 10, false, None);
    heartbeat(&mut c, &mut e, now, 11, false, None);
    assert_eq!(c.leave(now, &mut e), None);

    // Node 2 follows it, node 1 does not: node 2 it is, though 1 has the
    // higher priority.
    let (mut c, mut e) = active_node0();
    heartbeat(&mut c, &mut e, now, 10, false, None);
    heartbeat(&mut c, &mut e, now, 11, false, Some(0));
    assert_eq!(c.leave(now, &mut e), Some(2));
}

#[test]
fn nothing_is_believed_before_auth() {
    let (mut c, mut e) = node(2);
    e.open(5);
    let hello = hello_as_node0(&c, 9, 1);
    c.on_message(at(1), 5, hello, &mut e).unwrap();
    // The challenge is all that goes out: no token, no role.
    let out = lines_of(&mut e, 5);
    assert_eq!(out.len(), 1);
    assert!(out[0].starts_with("P CHALLENGE "), "{out:?}");
    // A heartbeat claiming the role, or a huge token, before AUTH: refused.
    let hb = PeerMsg::Heartbeat {
        active: true,
        following: None,
        highest: 1 << 62,
        synced: true,
    };
    let err = c.on_message(at(2), 5, hb, &mut e).unwrap_err().to_string();
    assert!(err.contains("before AUTH"), "{err}");
    assert_eq!(e.highest_token(), 0);
    assert!(c.peers[0].heard_ms.is_none());
    // Without HELLO at all.
    e.open(6);
    let err = c.on_message(at(2), 6, hb, &mut e).unwrap_err().to_string();
    assert!(err.contains("before HELLO"), "{err}");
    c.check_invariants(at(2), &e);
}

#[test]
fn a_wrong_secret_or_a_replayed_auth_is_refused() {
    let (mut c, mut e) = node(2);
    let mut stranger = Remote::new(0);
    stranger.secret = Secret::from_bytes(b"another secret of thirty-two bytes!!");
    let err = stranger
        .dial(&mut c, &mut e, at(1), 5)
        .unwrap_err()
        .to_string();
    assert!(err.contains("authentication failed"), "{err}");
    assert!(c.peers[0].heard_ms.is_none() && c.links_in.is_empty());
    assert!(
        c.problem(at(1)).is_none(),
        "a stranger is no configuration conflict"
    );

    // A genuine AUTH, recorded, replayed on a new connection: the node's
    // nonce is new, so the MAC does not fit.
    let (mut c, mut e) = node(2);
    e.open(5);
    let peer = Remote::new(0);
    let (hello, mac) = hello_and_auth(&peer, &mut c, &mut e, at(1), 5);
    c.on_message(at(1), 5, PeerMsg::Auth { mac }, &mut e)
        .unwrap();
    e.open(6);
    c.on_message(at(2), 6, hello, &mut e).unwrap();
    let err = c
        .on_message(at(2), 6, PeerMsg::Auth { mac }, &mut e)
        .unwrap_err()
        .to_string();
    assert!(err.contains("authentication failed"), "{err}");
    assert_eq!(c.peers[0].links_in, 1, "only the genuine link counts");
    c.check_invariants(at(2), &e);
}

#[test]
fn a_second_hello_never_resets_a_live_peer() {
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 5, 0);
    heartbeat(&mut c, &mut e, at(2), 5, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    let hello = hello_as_node0(&c, 12345, 3);
    // On the authenticated link itself.
    assert!(c.on_message(at(3), 5, hello, &mut e).is_err());
    // On a new connection, from a stranger who cannot finish the handshake.
    e.open(6);
    c.on_message(at(3), 6, hello, &mut e).unwrap();
    assert!(c.peers[0].claims_active, "still the active");
    assert_eq!(c.peers[0].incarnation, 1);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    c.check_invariants(at(3), &e);
}

#[test]
fn unfinished_handshakes_are_closed_after_the_peer_timeout() {
    let (mut c, mut e) = node(2);
    e.open(5);
    let hello = hello_as_node0(&c, 9, 1);
    c.on_message(at(1), 5, hello, &mut e).unwrap();
    // Our own dial to node 1 gets no CHALLENGE.
    e.open(6);
    c.outbound_open(at(1), 6, 1, &mut e);
    assert!(c.next_deadline() <= 1 + TIMEOUT_MS);
    let mut doomed = Vec::new();
    // Ticks as the loop does, at least once per heartbeat (a longer gap
    // reads as a stall of this process, which gives handshakes more time).
    for ms in (50..TIMEOUT_MS).step_by(50) {
        c.tick(at(ms), &mut e);
    }
    c.tick(at(TIMEOUT_MS), &mut e);
    c.take_doomed(&mut doomed);
    assert!(doomed.is_empty(), "not yet: {doomed:?}");
    c.tick(at(TIMEOUT_MS + 1), &mut e);
    c.take_doomed(&mut doomed);
    let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    assert_eq!(conns, [5, 6]);
    // Each ends with an E line saying why.
    assert!(
        lines_of(&mut e, 5)
            .last()
            .unwrap()
            .starts_with("E peer handshake")
    );
    assert!(
        lines_of(&mut e, 6)
            .last()
            .unwrap()
            .contains("did not answer")
    );
    // And the node kept no state for them once the loop closes them.
    c.on_close(at(TIMEOUT_MS + 1), 5, &mut e);
    c.on_close(at(TIMEOUT_MS + 1), 6, &mut e);
    assert!(c.pending.is_empty() && c.peers[1].out.is_none());
    c.check_invariants(at(TIMEOUT_MS + 1), &e);
}

#[test]
fn pending_handshakes_are_bounded() {
    let (mut c, mut e) = node(2);
    let hello = hello_as_node0(&c, 9, 1);
    for conn in 0..MAX_PENDING_HANDSHAKES as ConnId {
        e.open(conn);
        c.on_message(at(1), conn, hello, &mut e).unwrap();
    }
    // One more: the oldest gives way (a stranger holding every slot cannot
    // keep a real peer out), and is closed with the reason.
    let conn = MAX_PENDING_HANDSHAKES as ConnId;
    e.open(conn);
    c.on_message(at(2), conn, hello, &mut e).unwrap();
    assert_eq!(c.pending.len(), MAX_PENDING_HANDSHAKES);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert_eq!(doomed.len(), 1);
    assert_eq!(doomed[0].0, 0, "the oldest");
    assert!(doomed[0].1.contains("gives way"), "{}", doomed[0].1);
    assert!(c.pending.contains_key(&conn));
    c.check_invariants(at(2), &e);
}

#[test]
fn a_node_that_meets_only_wrong_macs_does_not_serve() {
    // Node 2 of three, alone: its dials are answered by live processes
    // with another secret. It never takes the role.
    let (mut c, mut e) = node(2);
    let odd = Secret::from_bytes(b"the others' secret, not this node's!!");
    let mut next_conn = 20;
    let mut dials = Vec::new();
    // Each dial (retried as the loop does) meets a wrong MAC.
    for ms in (1..=3 * TIMEOUT_MS).step_by(50) {
        c.tick(at(ms), &mut e);
        dials.clear();
        c.take_dials(at(ms), &mut dials);
        for &(peer, _) in &dials {
            let conn = next_conn;
            next_conn += 1;
            e.open(conn);
            c.outbound_open(at(ms), conn, peer, &mut e);
            let mut answer = Remote::new(peer);
            answer.secret = odd.clone();
            assert!(answer.accept(&mut c, &mut e, at(ms), conn).is_err());
            c.on_close(at(ms), conn, &mut e);
            e.close(conn);
        }
        c.check_invariants(at(ms), &e);
        assert_eq!(c.role(), Role::Standby { following: None }, "at {ms} ms");
    }
    let now = at(3 * TIMEOUT_MS);
    assert!(c.problem(now).is_some_and(|p| p.contains("wrong MAC")));

    // Once the failures stop (the odd processes went away: dials fail), it
    // may serve alone, as after any crash.
    let end = 3 * TIMEOUT_MS + 2 * TIMEOUT_MS + 50;
    for ms in (3 * TIMEOUT_MS + 1..=end).step_by(50) {
        c.tick(at(ms), &mut e);
        dials.clear();
        c.take_dials(at(ms), &mut dials);
        for &(peer, _) in &dials {
            c.dial_failed(peer, at(ms));
        }
    }
    assert!(c.problem(at(end)).is_none(), "the failure is old now");
    assert_eq!(c.role(), Role::Active);

    // A node that has met a real peer since its start is not held back by
    // one odd peer: its own secret is right.
    let (mut c, mut e) = active_node0();
    e.open(40);
    c.on_close(at(600), 21, &mut e);
    c.outbound_open(at(600), 40, 2, &mut e);
    let mut bad = Remote::new(2);
    bad.secret = Secret::from_bytes(b"a third secret, for the odd node only");
    assert!(bad.accept(&mut c, &mut e, at(601), 40).is_err());
    assert_eq!(c.role(), Role::Active);
}

#[test]
fn our_link_sends_nothing_before_the_peer_proves_itself() {
    let (mut c, mut e) = node(0);
    e.open(20);
    c.outbound_open(at(0), 20, 1, &mut e);
    // Heartbeat time: only the HELLO is queued on the unproven link.
    c.tick(at(60), &mut e);
    let out = String::from_utf8(e.output_mut(20).clone()).unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with(&format!("P HELLO {} ", wire::VERSION)));
    // A CHALLENGE made with another secret: refused, no AUTH sent.
    let mut impostor = Remote::new(1);
    impostor.secret = Secret::from_bytes(b"not the cluster's secret, 32 bytes.");
    let err = impostor
        .accept(&mut c, &mut e, at(61), 20)
        .unwrap_err()
        .to_string();
    assert!(err.contains("authentication failed"), "{err}");
    assert!(e.output_mut(20).is_empty(), "no AUTH for an impostor");
    assert!(!c.peers[1].out_authed);

    // The genuine peer: AUTH, then our heartbeat at once.
    let (mut c, mut e) = node(0);
    e.open(20);
    c.outbound_open(at(0), 20, 1, &mut e);
    let answer = Remote::new(1).accept(&mut c, &mut e, at(1), 20).unwrap();
    assert!(answer[0].starts_with("P AUTH "), "{answer:?}");
    assert!(answer[1].starts_with("P HB "), "{answer:?}");
    c.check_invariants(at(1), &e);
}

#[test]
fn a_peer_with_another_list_is_refused_and_only_one_configuration_serves() {
    // Node 1 of a list in another order: [b, a, c] against our [a, b, c].
    let mut theirs = peers();
    theirs.swap(0, 1);
    let mut other = Remote::new(0);
    other.peers = theirs.clone();
    let ours = peers();
    let mine = auth::fingerprint(wire::FINGERPRINT_VERSION, &ours);
    let their_fp = auth::fingerprint(wire::FINGERPRINT_VERSION, &theirs);

    // Node 0 of ours ([a, ...]), active; node "b" of theirs dials it.
    let (mut c, mut e) = active_node0();
    let err = other
        .dial(&mut c, &mut e, at(600), 30)
        .unwrap_err()
        .to_string();
    assert!(err.contains("same list, in the same order"), "{err}");
    assert!(c.problem(at(600)).is_some());
    // Exactly one of the two configurations may serve.
    assert_eq!(c.role() == Role::Active, mine < their_fp);
    c.check_invariants(at(600), &e);
    // The conflict ends when it is no longer heard of.
    for ms in (650..=600 + 3 * TIMEOUT_MS).step_by(50) {
        heartbeat(&mut c, &mut e, at(ms), 10, false, None);
        heartbeat(&mut c, &mut e, at(ms), 11, false, None);
        c.tick(at(ms), &mut e);
    }
    assert!(c.problem(at(600 + 3 * TIMEOUT_MS)).is_none());
    assert_eq!(c.role(), Role::Active);

    // The dialer side: our link to a node that answers with another list.
    let (mut c, mut e) = node(0);
    e.open(20);
    c.outbound_open(at(0), 20, 1, &mut e);
    let mut b = Remote::new(1);
    b.peers = theirs;
    b.index = 0; // "b" is node 0 in its list
    let err = b.accept(&mut c, &mut e, at(1), 20).unwrap_err().to_string();
    assert!(err.contains("is node 0 of its --peers"), "{err}");
    // It got our AUTH, so it learns of the conflict as surely as we did.
    assert!(e.output_mut(20).starts_with(b"P AUTH "));
    assert!(!c.peers[1].out_authed);
    assert!(c.problem(at(1)).is_some());
}

#[test]
fn a_follower_that_does_not_read_is_dropped_and_resynced() {
    let (mut c, mut e) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    heartbeat(&mut c, &mut e, now, 10, false, Some(0));
    heartbeat(&mut c, &mut e, now, 11, false, None);
    c.flush_replication(now, &mut e);
    assert!(c.peers[1].snapshot_sent);
    // Deltas pile up unread on the link to node 1 (the loop never takes
    // its output): past the bound the link is given up.
    let line = format!("P G {} 5 1000\n", "k".repeat(200));
    let mut doomed = Vec::new();
    let mut written = 0;
    while doomed.is_empty() {
        assert!(written <= REPLICATION_BACKLOG_BYTES + 1024 * 1024);
        e.outbox_mut().write_link(20, line.as_bytes());
        written += line.len();
        c.flush_replication(now, &mut e);
        c.take_doomed(&mut doomed);
    }
    assert_eq!(doomed[0].0, 20);
    assert!(doomed[0].1.contains("resyncs"), "{}", doomed[0].1);
    assert!(!c.peers[1].snapshot_sent && !c.peers[1].out_authed);
    c.check_invariants(now, &e);
}

#[test]
fn a_relayed_challenge_gets_no_auth_and_is_no_conflict() {
    // Node 1 is down and a stranger holds its address. Node 0 dials it; the
    // stranger relays node 0's HELLO to node 2, which answers with a valid
    // CHALLENGE (it holds the secret) naming itself.
    let (mut c, mut e) = active_node0();
    c.on_close(at(600), 20, &mut e);
    e.close(20);
    e.open(40);
    c.outbound_open(at(600), 40, 1, &mut e);
    let relay = Remote::new(2);
    let err = relay
        .accept(&mut c, &mut e, at(601), 40)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not the node this node dialed"), "{err}");
    // No AUTH that the stranger could carry on to node 2 as node 0's, and
    // no conflict that would stop node 0 serving.
    assert!(e.output_mut(40).is_empty());
    assert!(c.problem(at(601)).is_none());
    assert_eq!(c.role(), Role::Active);
    c.check_invariants(at(601), &e);
}

#[test]
fn a_silent_peer_s_links_are_closed_and_dialed_afresh() {
    let (mut c, mut e) = active_node0();
    let t0 = TIMEOUT_MS + 50;
    // Node 2 keeps talking; node 1 falls silent (a partition).
    let mut doomed = Vec::new();
    for ms in (t0..=t0 + TIMEOUT_MS + 50).step_by(50) {
        heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
        c.tick(at(ms), &mut e);
        c.take_doomed(&mut doomed);
    }
    let mut conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    conns.sort_unstable();
    assert_eq!(conns, [10, 20], "node 1's links, both ways: {doomed:?}");
    assert!(doomed.iter().all(|d| d.1.contains("silent for")));
    // The loop closes them; a fresh dial follows.
    let now = at(t0 + TIMEOUT_MS + 60);
    for conn in [10, 20] {
        c.on_close(now, conn, &mut e);
        e.close(conn);
    }
    let mut dials = Vec::new();
    c.take_dials(at(now.ms + DIAL_RETRY_MS), &mut dials);
    assert_eq!(dials.iter().map(|d| d.0).collect::<Vec<_>>(), [1]);
    c.check_invariants(now, &e);
}

#[test]
fn a_link_the_peer_gave_up_is_no_crash() {
    // Node 2 follows node 0, which paused: node 0 gave up node 2's links
    // as silent, with E lines. When node 2 reads them and its links close,
    // node 0 is alive (it just said so), so node 2 must not promote itself.
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 10, 0);
    e.open(20);
    c.outbound_open(at(1), 20, 0, &mut e);
    Remote::new(0).accept(&mut c, &mut e, at(1), 20).unwrap();
    heartbeat(&mut c, &mut e, at(2), 10, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    for ms in (50..=TIMEOUT_MS).step_by(50) {
        heartbeat(&mut c, &mut e, at(ms), 10, true, None);
        c.tick(at(ms), &mut e);
    }
    let now = at(TIMEOUT_MS + 10);
    for conn in [10, 20] {
        let err = c
            .on_refusal(now, conn, b"E 127.0.0.1:7002 silent for 500 ms")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gave the link up"), "{err}");
        c.on_close(now, conn, &mut e);
        e.close(conn);
    }
    assert!(c.peers[0].heard_ms.is_some(), "alive: it just spoke");
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    c.check_invariants(now, &e);
}

/// Sends a client request line on `conn` to the engine.
fn client(e: &mut Engine, now: Now, conn: ConnId, line: &str) {
    let wire = format!("{line}\n");
    let (request, _) = crate::proto::parse_request(wire.as_bytes())
        .unwrap()
        .unwrap();
    e.handle(now, conn, request).unwrap();
}

/// [`lines_of`] without the lag probes (which go behind a turn's deltas).
fn replication_lines(e: &mut Engine, conn: ConnId) -> Vec<String> {
    let mut lines = lines_of(e, conn);
    lines.retain(|l| !l.starts_with("P PROBE "));
    lines
}

/// Like [`client`], returning what the engine returned.
fn try_client(e: &mut Engine, now: Now, conn: ConnId, line: &str) -> Result<(), Refusal> {
    let wire = format!("{line}\n");
    let (request, _) = crate::proto::parse_request(wire.as_bytes())
        .unwrap()
        .unwrap();
    e.handle(now, conn, request)
}

#[test]
fn followers_get_shared_grants_and_permits_in_snapshots_and_deltas() {
    let (mut c, mut e) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    e.open(0);
    e.set_remote(0, "10.0.0.5:4242".parse().unwrap());
    client(&mut e, now, 0, "G s 10 0");
    let t0 = e.members_of(b"s")[0].0;
    heartbeat(&mut c, &mut e, now, 10, false, Some(0));
    e.output_mut(20).clear();
    c.flush_replication(now, &mut e);
    assert_eq!(
        replication_lines(&mut e, 20),
        [
            format!("P SNAP {t0}"),
            format!("P S s {t0} 10001 10.0.0.5:4242 - -"),
            "P SYNCED".into()
        ]
    );
    client(&mut e, now, 0, "C p 2 5 0");
    let t1 = e.members_of(b"p")[0].0;
    client(&mut e, now, 0, &format!("N p {t1} 2"));
    client(&mut e, now, 0, &format!("R s {t0}"));
    c.flush_replication(now, &mut e);
    let h = "10.0.0.5:4242 - -";
    assert_eq!(
        replication_lines(&mut e, 20),
        [
            "P L 2".to_string(),
            format!("P C p {t1} 5001 {h}"),
            "P L 2".into(),
            format!("P C p {t1} 2001 {h}"),
            format!("P X s {t0}"),
        ]
    );
    // An expiry is a release too.
    e.tick(at(now.ms + 2_100));
    c.flush_replication(at(now.ms + 2_100), &mut e);
    assert_eq!(replication_lines(&mut e, 20), [format!("P X p {t1}")]);
    c.check_invariants(at(now.ms + 2_100), &e);
}

#[test]
fn followers_get_a_snapshot_then_the_turns_changes_as_peer_lines() {
    let (mut c, mut e) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    e.open(0);
    e.set_remote(0, "10.0.0.5:4242".parse().unwrap());
    client(&mut e, now, 0, "O host-a/job-42");
    client(&mut e, now, 0, "A before 10 0");
    heartbeat(&mut c, &mut e, now, 10, false, Some(0));
    heartbeat(&mut c, &mut e, now, 11, false, Some(0));
    for conn in [20, 21] {
        e.output_mut(conn).clear();
    }
    c.flush_replication(now, &mut e);
    let t0 = e.holder(b"before").unwrap().0;
    for conn in [20, 21] {
        assert_eq!(
            lines_of(&mut e, conn),
            [
                format!("P SNAP {t0}"),
                format!("P G before {t0} 10001 10.0.0.5:4242 host-a/job-42"),
                "P SYNCED".into()
            ]
        );
    }
    // One turn's changes, in order, in the same bytes on both links.
    client(&mut e, now, 0, "A k 5 0");
    let t1 = e.holder(b"k").unwrap().0;
    client(&mut e, now, 0, &format!("N k {t1} 2"));
    client(&mut e, now, 0, &format!("R k {t1}"));
    client(&mut e, now, 0, &format!("R before {t0}"));
    c.flush_replication(now, &mut e);
    let h = "10.0.0.5:4242 host-a/job-42";
    let expected =
        format!("P G k {t1} 5001 {h}\nP G k {t1} 2001 {h}\nP X k {t1}\nP X before {t0}\n");
    // Behind the deltas, each follower's first lag probe.
    for (conn, probe) in [(20, 1), (21, 2)] {
        let out = String::from_utf8(std::mem::take(e.output_mut(conn))).unwrap();
        assert_eq!(out, format!("{expected}P PROBE {probe}\n"));
    }
    // An expiry is a release too; a turn without changes writes nothing.
    client(&mut e, now, 0, "A short 0.1 0");
    let t2 = e.holder(b"short").unwrap().0;
    c.flush_replication(now, &mut e);
    e.tick(at(now.ms + 200));
    c.flush_replication(now, &mut e);
    c.flush_replication(now, &mut e);
    for conn in [20, 21] {
        assert_eq!(
            lines_of(&mut e, conn),
            [format!("P G short {t2} 101 {h}"), format!("P X short {t2}")]
        );
        assert!(lines_of(&mut e, conn).is_empty());
    }
    c.check_invariants(now, &e);
}

#[test]
fn ready_means_active_or_following_with_the_whole_snapshot() {
    // Node 2 follows nobody (start-up grace): not ready.
    let (mut c, mut e) = node(2);
    assert!(!c.is_ready());
    link_in(&mut c, &mut e, at(1), 11, 1);
    heartbeat(&mut c, &mut e, at(2), 11, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    // Following node 1, but its snapshot is not in yet: not ready.
    assert!(!c.is_ready());
    c.on_message(at(3), 11, PeerMsg::Snapshot { highest: 7 }, &mut e)
        .unwrap();
    assert!(!c.is_ready());
    c.on_message(at(4), 11, PeerMsg::Synced, &mut e).unwrap();
    assert!(c.is_ready());
    // Node 1 hands over: active, ready.
    c.on_message(at(5), 11, PeerMsg::Handoff { highest: 8 }, &mut e)
        .unwrap();
    assert_eq!(c.role(), Role::Active);
    assert!(c.is_ready());
    assert_eq!(c.stats().became_active, 1);
    // Leaving: not ready any more.
    c.leave(at(6), &mut e);
    assert!(!c.is_ready());
}

fn heartbeat_synced(
    c: &mut Cluster,
    e: &mut Engine,
    now: Now,
    conn: ConnId,
    active: bool,
    following: Option<usize>,
    synced: bool,
) {
    let msg = PeerMsg::Heartbeat {
        active,
        following,
        highest: 0,
        synced,
    };
    c.on_message(now, conn, msg, e).unwrap();
}

/// Node `me`, started with no peer in reach: active alone after its
/// start-up wait, with an empty table and no claim to the cluster's state.
fn fresh_active(me: usize) -> (Cluster, Engine) {
    let (mut c, mut e) = node(me);
    for ms in (0..=TIMEOUT_MS + 50).step_by(50) {
        c.tick(at(ms), &mut e);
    }
    assert_eq!(c.role(), Role::Active);
    assert!(!c.synced, "took the role with no state anywhere in reach");
    (c, e)
}

#[test]
fn a_fresh_active_steps_down_to_an_active_that_holds_the_state() {
    let now = at(TIMEOUT_MS + 60);
    // Node 0 restarted cut off and took the role alone; node 1 served the
    // cluster meanwhile. Node 0 has the priority, node 1 the state: node 1
    // wins.
    let (mut c, mut e) = fresh_active(0);
    link_in(&mut c, &mut e, now, 10, 1);
    heartbeat_synced(&mut c, &mut e, now, 10, true, None, true);
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    assert!(!e.is_active());
    c.check_invariants(now, &e);

    // Two actives alike (neither holds the state): the priority decides.
    let (mut c, mut e) = fresh_active(0);
    link_in(&mut c, &mut e, now, 10, 1);
    heartbeat_synced(&mut c, &mut e, now, 10, true, None, false);
    assert_eq!(c.role(), Role::Active);

    // Node 2 hears both: it follows the one that holds the state, as the
    // two actives themselves decide.
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 10, 0);
    link_in(&mut c, &mut e, at(1), 11, 1);
    heartbeat_synced(&mut c, &mut e, at(2), 10, true, None, false);
    heartbeat_synced(&mut c, &mut e, at(2), 11, true, None, true);
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    // Should node 0 come to hold the state too, the priority decides.
    heartbeat_synced(&mut c, &mut e, at(3), 10, true, None, true);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
}

#[test]
fn an_active_holding_the_state_stays_when_a_fresh_higher_node_appears() {
    // Node 1 follows node 0 and takes its snapshot; node 0 goes silent and
    // node 1 takes over, holding the state.
    let (mut c, mut e) = node(1);
    link_in(&mut c, &mut e, at(1), 10, 0);
    heartbeat(&mut c, &mut e, at(1), 10, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    c.on_message(at(2), 10, PeerMsg::Snapshot { highest: 7 }, &mut e)
        .unwrap();
    c.on_message(at(2), 10, PeerMsg::Synced, &mut e).unwrap();
    assert!(c.synced);
    let mut ms = 2;
    while c.role() != Role::Active {
        ms += 50;
        assert!(ms < 3 * TIMEOUT_MS, "node 1 never took over");
        c.tick(at(ms), &mut e);
    }
    assert!(c.synced, "it took the role holding the state");
    c.on_close(at(ms), 10, &mut e);
    // Node 0 restarted (a new incarnation), alone and active with nothing:
    // node 1 keeps the role.
    let mut restarted = Remote::new(0);
    restarted.incarnation = 2;
    restarted.dial(&mut c, &mut e, at(ms), 12).unwrap();
    heartbeat_synced(&mut c, &mut e, at(ms), 12, true, None, false);
    assert_eq!(c.role(), Role::Active);
    c.check_invariants(at(ms), &e);
    // Its heartbeats say it holds the state.
    e.open(20);
    c.outbound_open(at(ms), 20, 0, &mut e);
    let lines = restarted.accept(&mut c, &mut e, at(ms), 20).unwrap();
    let hb = lines.iter().find(|l| l.starts_with("P HB ")).unwrap();
    assert!(hb.starts_with("P HB A - ") && hb.ends_with(" 1"), "{hb}");
}

#[test]
fn a_fresh_active_holds_the_state_once_a_follower_synced_to_it() {
    let (mut c, mut e) = active_node0();
    assert!(!c.synced);
    let now = at(TIMEOUT_MS + 60);
    heartbeat_synced(&mut c, &mut e, now, 10, false, Some(0), false);
    // Not before it has our snapshot.
    assert!(!c.synced);
    c.flush_replication(now, &mut e);
    assert!(lines_of(&mut e, 20).iter().any(|l| l == "P SYNCED"));
    heartbeat_synced(&mut c, &mut e, now, 10, false, Some(0), true);
    assert!(
        c.synced,
        "a follower holds our table: it is the cluster's state"
    );
    assert_eq!(c.role(), Role::Active);
    c.check_invariants(now, &e);
}

#[test]
fn a_standby_that_hears_no_active_names_the_one_its_peers_follow() {
    // Node 2 hears node 1, which follows node 0; node 0's packets to node 2
    // are lost. Node 2 does not take over (node 1, alive, holds the state)
    // and names node 0 to clients rather than `-`.
    let (mut c, mut e) = node(2);
    e.open(0);
    link_in(&mut c, &mut e, at(1), 11, 1);
    let mut ms = 1;
    while ms < 3 * TIMEOUT_MS {
        heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
        c.tick(at(ms), &mut e);
        ms += 50;
    }
    assert_eq!(c.role(), Role::Standby { following: None });
    client(&mut e, at(ms), 0, "A k 10 0");
    assert_eq!(lines_of(&mut e, 0), ["M k 127.0.0.1:7000"]);
    // Once its peers follow nobody either, it names nobody.
    heartbeat(&mut c, &mut e, at(ms), 11, false, None);
    client(&mut e, at(ms), 0, "A k 10 0");
    assert_eq!(lines_of(&mut e, 0), ["M k -"]);
    // Hearing the active itself, it follows it.
    link_in(&mut c, &mut e, at(ms), 10, 0);
    heartbeat(&mut c, &mut e, at(ms), 10, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    client(&mut e, at(ms), 0, "A k 10 0");
    assert_eq!(lines_of(&mut e, 0), ["M k 127.0.0.1:7000"]);
    c.check_invariants(at(ms), &e);
}

#[test]
fn a_standby_does_not_take_over_while_a_live_peer_follows_the_active() {
    // Node 1 holds node 0's state; node 0's packets to it stop. Node 2
    // still hears node 0 and follows it: node 1 waits.
    let (mut c, mut e) = node(1);
    link_in(&mut c, &mut e, at(1), 10, 0);
    link_in(&mut c, &mut e, at(1), 12, 2);
    heartbeat(&mut c, &mut e, at(1), 10, true, None);
    c.on_message(at(1), 10, PeerMsg::Snapshot { highest: 7 }, &mut e)
        .unwrap();
    c.on_message(at(1), 10, PeerMsg::Synced, &mut e).unwrap();
    let mut ms = 1;
    while ms < 4 * TIMEOUT_MS {
        heartbeat(&mut c, &mut e, at(ms), 12, false, Some(0));
        c.tick(at(ms), &mut e);
        ms += 50;
    }
    assert!(c.peers[0].heard_ms.is_none(), "node 0 is silent here");
    assert_eq!(c.role(), Role::Standby { following: None });
    c.check_invariants(at(ms), &e);
    // Node 2 finds node 0 gone too: node 1 takes over, with the state.
    heartbeat(&mut c, &mut e, at(ms), 12, false, None);
    assert_eq!(c.role(), Role::Active);
    assert!(c.synced);
}

#[test]
fn a_peer_still_following_a_node_we_hear_as_a_standby_does_not_hold_us_back() {
    // Node 0 follows node 1 and holds its state. Node 1 steps down (it
    // follows nobody now) while node 2 still follows it, as a standby
    // keeps following a live higher-priority node. That is no active
    // elsewhere: node 0 hears node 1 itself, so node 0 takes the role.
    let (mut c, mut e) = node(0);
    link_in(&mut c, &mut e, at(1), 11, 1);
    link_in(&mut c, &mut e, at(1), 12, 2);
    heartbeat(&mut c, &mut e, at(1), 11, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    c.on_message(at(1), 11, PeerMsg::Snapshot { highest: 7 }, &mut e)
        .unwrap();
    c.on_message(at(1), 11, PeerMsg::Synced, &mut e).unwrap();
    let mut ms = 1;
    while ms < 2 * TIMEOUT_MS {
        heartbeat(&mut c, &mut e, at(ms), 11, true, None);
        heartbeat(&mut c, &mut e, at(ms), 12, false, Some(1));
        c.tick(at(ms), &mut e);
        ms += 50;
    }
    heartbeat(&mut c, &mut e, at(ms), 11, false, None);
    assert_eq!(
        c.role(),
        Role::Active,
        "not held back by node 2's stale view"
    );
    c.check_invariants(at(ms), &e);
}

#[test]
fn a_stall_of_this_process_does_not_fail_handshakes_in_progress() {
    // A peer's HELLO is answered; then this process does not run for
    // longer than the handshake timeout (SIGSTOP, a VM stall). The peer's
    // AUTH waits unread meanwhile: it must be taken, as heartbeats are
    // after a stall, not refused as a line out of place.
    let (mut c, mut e) = node(2);
    c.tick(at(1), &mut e);
    e.open(5);
    let peer = Remote::new(0);
    let (_, mac) = hello_and_auth(&peer, &mut c, &mut e, at(1), 5);
    // The process resumes 3 timeouts later: its first turn ticks, then
    // reads what waited.
    let resumed = at(1 + 3 * TIMEOUT_MS);
    c.tick(resumed, &mut e);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert!(doomed.is_empty(), "{doomed:?}");
    c.on_message(resumed, 5, PeerMsg::Auth { mac }, &mut e)
        .unwrap();
    assert!(c.is_authenticated_in(5));
    c.check_invariants(resumed, &e);
}

#[test]
fn a_rival_active_that_does_not_hear_us_gets_our_link_redialed() {
    // Node 1 claims the role; node 0, active, outranks it. Were our link to
    // node 1 working, node 1 would step down within a delivery. It keeps
    // claiming: its end of our link is gone (closed during a partition,
    // the close still in TCP's back-off), so ours is closed and dialed anew.
    let (mut c, mut e) = active_node0();
    let start = TIMEOUT_MS + 60;
    let mut doomed = Vec::new();
    let mut ms = start;
    while ms < start + TIMEOUT_MS / 2 {
        heartbeat_synced(&mut c, &mut e, at(ms), 10, true, None, false);
        heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
        c.tick(at(ms), &mut e);
        c.take_doomed(&mut doomed);
        assert!(doomed.is_empty(), "too soon, at {ms}: {doomed:?}");
        ms += 50;
    }
    heartbeat_synced(&mut c, &mut e, at(ms), 10, true, None, false);
    heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
    c.tick(at(ms), &mut e);
    c.take_doomed(&mut doomed);
    let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    assert_eq!(conns, [20], "our link to node 1, only");
    assert!(
        doomed[0].1.contains("does not hear this link"),
        "{doomed:?}"
    );
    assert_eq!(c.role(), Role::Active);
    c.on_close(at(ms), 20, &mut e);
    assert!(c.alive(1), "we still hear it");
    let mut dials = Vec::new();
    c.take_dials(at(ms + DIAL_RETRY_MS), &mut dials);
    assert_eq!(dials.len(), 1);
    assert_eq!(dials[0].0, 1);
    c.check_invariants(at(ms), &e);
}

#[test]
fn an_older_link_of_a_peer_that_linked_again_is_not_believed() {
    // Node 2 follows node 0 over link 10. Node 0 links again (link 12):
    // it dials anew only once its old link is closed at its end, so what
    // link 10 still delivers (late, after a partition) is stale.
    let (mut c, mut e) = node(2);
    link_in(&mut c, &mut e, at(1), 10, 0);
    heartbeat(&mut c, &mut e, at(1), 10, true, None);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    link_in(&mut c, &mut e, at(2), 12, 0);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    assert_eq!(conns, [10]);
    // A stale heartbeat on the old link changes nothing.
    heartbeat(&mut c, &mut e, at(3), 10, false, Some(1));
    assert!(c.peers[0].claims_active);
    assert_eq!(c.peers[0].following, None);
    assert_eq!(c.role(), Role::Standby { following: Some(0) });
    c.check_invariants(at(3), &e);
    // Its close leaves the peer alive: the new link is open.
    c.on_close(at(4), 10, &mut e);
    assert!(c.alive(0) && c.superseded.is_empty());
    heartbeat(&mut c, &mut e, at(5), 12, true, None);
    c.check_invariants(at(5), &e);
}

/// Peer `peer` refuses each `HELLO` newer than [`wire::MIN_VERSION`] as a
/// node of the oldest release does, on links `first_conn` on: each refusal
/// lowers the version this node dials it with by one.
fn refuse_newer_versions(c: &mut Cluster, e: &mut Engine, peer: usize, first_conn: ConnId) {
    for (conn, refused) in (first_conn..).zip((wire::MIN_VERSION + 1..=wire::VERSION).rev()) {
        e.open(conn);
        c.outbound_open(at(0), conn, peer, e);
        let hello = lines_of(e, conn);
        assert!(
            hello[0].starts_with(&format!("P HELLO {refused} ")),
            "{hello:?}"
        );
        let refusal = format!(
            "E peer protocol version \"{refused}\" unsupported (this node speaks 2): run \
             the same ringlock release on every node in line 1"
        );
        assert!(c.on_refusal(at(0), conn, refusal.as_bytes()).is_err());
        c.on_close(at(0), conn, e);
        e.close(conn);
    }
}

/// Node 0 of this release with node 1 of this release and node 2 of an
/// older release (peer protocol 2): node 2 refuses each newer `HELLO` as an
/// older node does, is dialed with 2 at last, and gets the grants without
/// their holders while node 1 gets them with; once node 2 says it speaks
/// the newest version (it was upgraded), the link to it is dialed again
/// with that.
#[test]
fn a_peer_of_the_older_protocol_is_dialed_with_it_and_gets_no_holders() {
    let (mut c, mut e) = node(0);
    e.open(20);
    c.outbound_open(at(0), 20, 1, &mut e);
    Remote::new(1).accept(&mut c, &mut e, at(0), 20).unwrap();
    refuse_newer_versions(&mut c, &mut e, 2, 30);
    e.open(22);
    c.outbound_open(at(200), 22, 2, &mut e);
    let hello = String::from_utf8(e.output_mut(22).clone()).unwrap();
    assert!(hello.starts_with("P HELLO 2 "), "{hello}");
    let mut old = Remote::new(2);
    old.version = 2;
    old.accept(&mut c, &mut e, at(200), 22).unwrap();
    link_in(&mut c, &mut e, at(201), 10, 1);
    old.dial(&mut c, &mut e, at(201), 11).unwrap();
    for ms in (202..=TIMEOUT_MS + 250).step_by(50) {
        heartbeat(&mut c, &mut e, at(ms), 10, false, None);
        heartbeat(&mut c, &mut e, at(ms), 11, false, None);
        c.tick(at(ms), &mut e);
    }
    assert_eq!(c.role(), Role::Active);
    let now = at(TIMEOUT_MS + 300);
    e.open(0);
    e.set_remote(0, "10.0.0.5:4242".parse().unwrap());
    client(&mut e, now, 0, "O job-1");
    client(&mut e, now, 0, "A k 10 0");
    let t = e.holder(b"k").unwrap().0;
    heartbeat(&mut c, &mut e, now, 10, false, Some(0));
    heartbeat(&mut c, &mut e, now, 11, false, Some(0));
    for conn in [20, 22] {
        e.output_mut(conn).clear();
    }
    c.flush_replication(now, &mut e);
    assert_eq!(
        lines_of(&mut e, 20)[1],
        format!("P G k {t} 10001 10.0.0.5:4242 job-1")
    );
    assert_eq!(lines_of(&mut e, 22)[1], format!("P G k {t} 10001"));
    client(&mut e, now, 0, &format!("N k {t} 5"));
    c.flush_replication(now, &mut e);
    // A lag probe behind the deltas on the newest link only.
    assert_eq!(
        lines_of(&mut e, 20),
        [
            format!("P G k {t} 5001 10.0.0.5:4242 job-1"),
            "P PROBE 1".into()
        ]
    );
    assert_eq!(lines_of(&mut e, 22), [format!("P G k {t} 5001")]);
    c.check_invariants(now, &e);
    // Node 2 cannot learn shared grants and permits: while it follows,
    // G and C are refused.
    for line in ["G s 10 0", "C p 2 10 0"] {
        assert_eq!(
            try_client(&mut e, now, 0, line),
            Err(Refusal::FollowerTooOld)
        );
    }
    // Node 2 comes back upgraded: its new link says the newest version,
    // and ours to it is given up to be dialed again with it.
    let mut new = Remote::new(2);
    new.incarnation = 2;
    new.dial(&mut c, &mut e, now, 12).unwrap();
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert!(
        doomed
            .iter()
            .any(|(conn, why)| *conn == 22 && why.contains(&format!("version {}", wire::VERSION))),
        "{doomed:?}"
    );
    c.on_close(now, 22, &mut e);
    e.close(22);
    let mut dials = Vec::new();
    c.take_dials(at(now.ms + 200), &mut dials);
    assert!(dials.iter().any(|&(peer, _)| peer == 2), "{dials:?}");
    e.open(23);
    c.outbound_open(at(now.ms + 200), 23, 2, &mut e);
    let hello = String::from_utf8(e.output_mut(23).clone()).unwrap();
    assert!(
        hello.starts_with(&format!("P HELLO {} ", wire::VERSION)),
        "{hello}"
    );
    // With no follower below version 5 left, G is served again.
    c.flush_replication(at(now.ms + 200), &mut e);
    client(&mut e, at(now.ms + 200), 0, "G s 10 0");
}

/// Two nodes of this release, both at peer protocol 2 on their links to
/// each other, would stay there for good: a `HELLO 2` only says what the
/// link speaks, not that its sender speaks nothing newer (a node of this
/// release dials 2 after a refusal by the release before it was upgraded
/// from). So a `HELLO 2` never lowers the version this node dials with:
/// only a refusal does (by one version), and a `HELLO 4` raises it again.
#[test]
fn a_hello_2_does_not_lower_the_version_this_node_dials_with() {
    // Node 1 (this release) dials first, with 2: this node restarted
    // upgraded, and node 1 still dials it as it dialed the release before.
    let (mut c, mut e) = node(0);
    let mut peer = Remote::new(1);
    peer.version = 2;
    peer.dial(&mut c, &mut e, at(0), 10).unwrap();
    e.open(20);
    c.outbound_open(at(1), 20, 1, &mut e);
    let hello = lines_of(&mut e, 20);
    assert!(
        hello[0].starts_with(&format!("P HELLO {} ", wire::VERSION)),
        "{hello:?}"
    );
    // A refusal still lowers it (by one), and a HELLO 2 then keeps it
    // there: no dial that is refused again and again.
    let refusal = format!(
        "E peer protocol version \"{}\" unsupported (this node speaks 2): run the same \
         ringlock release on every node in line 1",
        wire::VERSION
    );
    assert!(c.on_refusal(at(2), 20, refusal.as_bytes()).is_err());
    c.on_close(at(2), 20, &mut e);
    e.close(20);
    let mut old = Remote::new(1);
    old.version = 2;
    old.incarnation = 2;
    old.dial(&mut c, &mut e, at(3), 11).unwrap();
    e.open(21);
    c.outbound_open(at(300), 21, 1, &mut e);
    let hello = lines_of(&mut e, 21);
    assert!(
        hello[0].starts_with(&format!("P HELLO {} ", wire::VERSION - 1)),
        "{hello:?}"
    );
}

/// Out of order: a version refusal on a link the peer already
/// authenticated (the peer cannot mean it, or someone else is talking) and
/// a `HELLO` on the link this node dialed change nothing of the version it
/// dials with.
#[test]
fn a_version_refusal_after_the_handshake_does_not_lower_the_version() {
    let (mut c, mut e) = node(0);
    e.open(20);
    c.outbound_open(at(0), 20, 1, &mut e);
    Remote::new(1).accept(&mut c, &mut e, at(0), 20).unwrap();
    let hello = b"P HELLO 2 0123456789abcdef 1 127.0.0.1:7001 1 00000000000000000000000000000000";
    let msg = wire::parse(hello).unwrap();
    assert!(c.on_message(at(1), 20, msg, &mut e).is_err());
    let refusal = b"E peer protocol version \"4\" unsupported (this node speaks 2 to 3) in line 1";
    assert!(c.on_refusal(at(1), 20, refusal).is_err());
    c.on_close(at(1), 20, &mut e);
    e.close(20);
    e.open(21);
    c.outbound_open(at(300), 21, 1, &mut e);
    let hello = lines_of(&mut e, 21);
    assert!(
        hello[0].starts_with(&format!("P HELLO {} ", wire::VERSION)),
        "{hello:?}"
    );
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

#[test]
fn an_active_measures_each_follower_s_lag_with_a_probe_behind_its_deltas() {
    let (mut c, mut e) = active_node0();
    let ms = TIMEOUT_MS + 60;
    e.open(0);
    heartbeat(&mut c, &mut e, at(ms), 10, false, Some(0));
    heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
    c.flush_replication(at(ms), &mut e);
    // A snapshot alone carries no probe.
    for conn in [20, 21] {
        assert!(
            !lines_of(&mut e, conn)
                .iter()
                .any(|l| l.starts_with("P PROBE"))
        );
    }
    client(&mut e, at(ms), 0, "A k 5 0");
    c.flush_replication(at_us(ms, 100), &mut e);
    let probe_1 = lines_of(&mut e, 20).pop().unwrap();
    assert_eq!(probe_1, "P PROBE 1");
    assert_eq!(lines_of(&mut e, 21).pop().unwrap(), "P PROBE 2");
    // Node 1 answers 2.35 ms later (on its own link to us, conn 10); an
    // answer to a probe that is not in flight counts nothing.
    c.on_message(at_us(ms + 2, 450), 10, PeerMsg::Probed { seq: 2 }, &mut e)
        .unwrap();
    c.on_message(at_us(ms + 2, 450), 10, PeerMsg::Probed { seq: 1 }, &mut e)
        .unwrap();
    c.on_message(at_us(ms + 2, 500), 10, PeerMsg::Probed { seq: 1 }, &mut e)
        .unwrap();
    let one = lag_of(&c, "127.0.0.1:7001");
    assert_eq!(one.lag_us.count(), 1);
    assert_eq!(one.lag_us.sum, 2350);
    assert_eq!((one.events, one.writes, one.probes_lost), (1, 1, 0));
    assert!(one.bytes > 0);
    assert_eq!(lag_of(&c, "127.0.0.1:7002").lag_us.count(), 0);
    // Within PROBE_EVERY_MS no new probe goes, whatever flows; after it
    // one goes to node 1, none to node 2 while its probe is in flight.
    let token = e.holder(b"k").unwrap().0;
    client(&mut e, at(ms + 3), 0, &format!("R k {token}"));
    c.flush_replication(at(ms + 3), &mut e);
    assert_eq!(lines_of(&mut e, 20), [format!("P X k {token}")]);
    client(&mut e, at(ms + PROBE_EVERY_MS), 0, "A k 5 0");
    c.flush_replication(at(ms + PROBE_EVERY_MS), &mut e);
    assert_eq!(lines_of(&mut e, 20).pop().unwrap(), "P PROBE 3");
    assert!(
        !lines_of(&mut e, 21)
            .iter()
            .any(|l| l.starts_with("P PROBE"))
    );
    // Unanswered within the peer timeout, node 2's probe is given up and
    // the next deltas carry a new one (node 1's, sent later, is still in
    // flight).
    let later = ms + TIMEOUT_MS + 1;
    heartbeat(&mut c, &mut e, at(later), 10, false, Some(0));
    heartbeat(&mut c, &mut e, at(later), 11, false, Some(0));
    let token = e.holder(b"k").unwrap().0;
    client(&mut e, at(later), 0, &format!("R k {token}"));
    c.flush_replication(at_us(later, 50), &mut e);
    assert_eq!(lines_of(&mut e, 21).pop().unwrap(), "P PROBE 4");
    assert_eq!(lines_of(&mut e, 20), [format!("P X k {token}")]);
    let two = lag_of(&c, "127.0.0.1:7002");
    assert_eq!((two.probes_lost, two.events, two.writes), (1, 4, 4));
    c.check_invariants(at_us(later, 50), &e);
}

#[test]
fn a_standby_answers_the_probes_of_the_active_it_follows_only() {
    let (mut c, mut e) = node(2);
    for (conn, peer) in [(20, 0), (21, 1)] {
        e.open(conn);
        c.outbound_open(at(0), conn, peer, &mut e);
        Remote::new(peer)
            .accept(&mut c, &mut e, at(0), conn)
            .unwrap();
    }
    link_in(&mut c, &mut e, at(1), 10, 0);
    link_in(&mut c, &mut e, at(1), 11, 1);
    heartbeat(&mut c, &mut e, at(2), 11, true, None);
    heartbeat(&mut c, &mut e, at(2), 10, false, Some(1));
    assert_eq!(c.role(), Role::Standby { following: Some(1) });
    for conn in [20, 21] {
        e.output_mut(conn).clear();
    }
    c.on_message(at(3), 11, PeerMsg::Probe { seq: 7 }, &mut e)
        .unwrap();
    assert_eq!(lines_of(&mut e, 21), ["P PROBED 7"]);
    // A node it does not follow gets no answer: we do not apply its
    // replication.
    c.on_message(at(3), 10, PeerMsg::Probe { seq: 8 }, &mut e)
        .unwrap();
    assert!(lines_of(&mut e, 20).is_empty());
    assert!(lines_of(&mut e, 21).is_empty());
    c.check_invariants(at(3), &e);
}

#[test]
fn an_active_coalesces_replication_for_at_most_its_bound() {
    let (mut c, mut e) = active_node0_coalescing(500);
    let ms = TIMEOUT_MS + 60;
    e.open(0);
    heartbeat(&mut c, &mut e, at(ms), 10, false, Some(0));
    heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
    c.flush_replication(at(ms), &mut e);
    for conn in [20, 21] {
        e.output_mut(conn).clear();
    }
    let turn = |c: &mut Cluster, e: &mut Engine, now: Now, line: &str| {
        if !line.is_empty() {
            client(e, now, 0, line);
        }
        c.flush_replication(now, e);
        let sent: Vec<bool> = [20, 21].iter().map(|&l| c.sends_more(l)).collect();
        assert_eq!(sent[0], sent[1], "both followers alike");
        let lines = lines_of(e, 20);
        e.output_mut(21).clear();
        (sent[0], lines)
    };
    // A link quiet for longer than the bound: the first deltas go at once.
    let (more, lines) = turn(&mut c, &mut e, at_us(ms + 10, 0), "A a 5 0");
    assert!(!more && lines[0].starts_with("P G a "), "{lines:?}");
    // Within the bound of that send: held (MSG_MORE), turn after turn,
    // until the oldest held bytes have waited 500 µs.
    let (more, _) = turn(&mut c, &mut e, at_us(ms + 10, 100), "A b 5 0");
    assert!(more);
    let (more, _) = turn(&mut c, &mut e, at_us(ms + 10, 550), "A c 5 0");
    assert!(more, "held since 100 µs: due at 600");
    assert_eq!(
        c.push_deadline(),
        Some(ms + 11),
        "the loop wakes for the push"
    );
    assert!(c.next_deadline() <= ms + 11);
    let (more, lines) = turn(&mut c, &mut e, at_us(ms + 10, 600), "A d 5 0");
    assert!(!more && lines[0].starts_with("P G d "), "{lines:?}");
    // Held again, then nothing more to send: the flush at the deadline
    // pushes it with a heartbeat of its own.
    let (more, _) = turn(&mut c, &mut e, at_us(ms + 10, 700), "A e 5 0");
    assert!(more);
    assert_eq!(c.push_deadline(), Some(ms + 12));
    let (more, lines) = turn(&mut c, &mut e, at_us(ms + 11, 100), "");
    assert!(
        !more && lines.is_empty(),
        "not due before 1200 µs: {lines:?}"
    );
    let (more, lines) = turn(&mut c, &mut e, at_us(ms + 11, 200), "");
    assert!(!more, "pushed");
    assert_eq!(lines.len(), 1);
    assert!(lines[0].starts_with("P HB A "), "{lines:?}");
    assert_eq!(c.push_deadline(), None, "nothing held");
    c.check_invariants(at(ms + 12), &e);
}

#[test]
fn without_coalescing_every_turn_s_replication_goes_at_once() {
    let (mut c, mut e) = active_node0();
    let ms = TIMEOUT_MS + 60;
    e.open(0);
    heartbeat(&mut c, &mut e, at(ms), 10, false, Some(0));
    heartbeat(&mut c, &mut e, at(ms), 11, false, Some(0));
    c.flush_replication(at(ms), &mut e);
    for (i, key) in ["a", "b", "c"].iter().enumerate() {
        client(&mut e, at_us(ms, i as u64 * 10), 0, &format!("A {key} 5 0"));
        c.flush_replication(at_us(ms, i as u64 * 10), &mut e);
        assert!(!c.sends_more(20) && !c.sends_more(21));
    }
}
