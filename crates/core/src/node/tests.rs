//! The node driven directly, as a loop drives it: what its log says of a
//! peer link that breaks the protocol.

use crate::outbox::cid;
use std::sync::{Arc, Mutex};

use super::*;
use crate::cluster::auth::{self, Identity, Secret, Side, Transcript};
use crate::session::{Flow, Session};

const SECRET: &[u8] = b"a secret of at least thirty-two bytes";

fn at(ms: u64) -> Now {
    Now {
        ms,
        us: ms * 1000,
        unix_ns: 1_700_000_000_000_000_000 + ms * 1_000_000,
    }
}

fn peers() -> Vec<String> {
    (1..=3).map(|i| format!("127.0.0.1:700{i}")).collect()
}

/// Node 0 of three.
fn node0() -> Node {
    let cfg = ClusterConfig {
        peers: peers(),
        me: PeerId(0),
        heartbeat_ms: 100,
        peer_timeout_ms: 500,
        failback_delay_ms: 0,
        incarnation: 1,
        secret: Secret::from_bytes(SECRET),
        read_batch_us: 0,
    };
    Node::new(
        at(0),
        NodeConfig {
            advertise: peers()[0].clone(),
            cluster: Some(cfg),
            max_locks: crate::engine::DEFAULT_MAX_LOCKS,
        },
    )
}

/// Peer 1 links to the node as connection `conn` and proves itself:
/// `HELLO`, the node's `CHALLENGE`, `AUTH`.
fn link_in(node: &mut Node, session: &mut Session, now: Now, conn: ConnId) {
    let peers = peers();
    let fingerprint = auth::fingerprint(wire::FINGERPRINT_VERSION, &peers);
    let nonce = [9; auth::NONCE_LEN];
    let mut line = Vec::new();
    wire::encode(
        &mut line,
        &wire::PeerMsg::Hello {
            version: wire::VERSION,
            fingerprint,
            from: PeerId(1),
            addr: peers[1].as_bytes(),
            incarnation: 1,
            nonce,
        },
    );
    assert_eq!(session.feed(node, now, conn, &line), Flow::Open);
    let out = std::mem::take(node.output_mut(conn));
    let challenge = out.strip_suffix(b"\n").unwrap();
    let Ok(wire::PeerMsg::Challenge {
        fingerprint: theirs,
        index,
        addr,
        nonce: their_nonce,
        ..
    }) = wire::parse(challenge)
    else {
        panic!("not a CHALLENGE: {}", String::from_utf8_lossy(&out));
    };
    let transcript = Transcript {
        dialer: Identity {
            fingerprint,
            index: 1,
            addr: peers[1].as_bytes(),
            nonce,
        },
        dialer_incarnation: 1,
        acceptor: Identity {
            fingerprint: theirs,
            index: index.0 as u64,
            addr,
            nonce: their_nonce,
        },
    };
    let mac = Secret::from_bytes(SECRET).sign(Side::Dialer, &transcript);
    line.clear();
    wire::encode(&mut line, &wire::PeerMsg::Auth { mac });
    assert_eq!(session.feed(node, now, conn, &line), Flow::Open);
    assert!(node.cluster().unwrap().is_authenticated_in(conn));
}

/// The messages of the log events of this thread while it is installed.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        self.0.lock().unwrap().push(message);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn an_over_long_line_on_a_peer_link_is_logged_with_its_reason() {
    // In one read, and cut across two (the first part kept as a partial
    // line).
    for split in [None, Some(300)] {
        let mut node = node0();
        let mut session = Session::new();
        node.open(cid(5));
        node.set_remote(cid(5), "127.0.0.1:40001".parse().unwrap());
        link_in(&mut node, &mut session, at(1), cid(5));
        // A grant line of 600 bytes: past any line's 512.
        let mut line = b"P G ".to_vec();
        line.resize(600, b'k');
        line.push(b'\n');
        let log = Capture::default();
        let flow = tracing::subscriber::with_default(log.clone(), || match split {
            None => session.feed(&mut node, at(2), cid(5), &line),
            Some(cut) => {
                let first = session.feed(&mut node, at(2), cid(5), &line[..cut]);
                assert_eq!(first, Flow::Open);
                session.feed(&mut node, at(2), cid(5), &line[cut..])
            }
        });
        assert_eq!(flow, Flow::Broken, "{split:?}");
        let out = String::from_utf8(std::mem::take(node.output_mut(cid(5)))).unwrap();
        assert_eq!(out, "E line longer than 512 bytes in line 3\n");
        let lines = log.0.lock().unwrap().clone();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("127.0.0.1:40001") && l.contains("line longer than 512 bytes")),
            "{split:?}: {lines:?}"
        );
        node.check_invariants(at(2));
    }
}

#[test]
fn a_request_on_a_peer_only_connection_refused_in_the_same_turn_is_not_served() {
    // Node 0, active alone after its start-up wait. A connection taken
    // beyond --max-conns (peer-only) does not authenticate by its
    // deadline: the tick that starts the turn refuses it. An acquire read
    // from it later in that turn, before the loop closes it, must be
    // refused too: served, it would grant the key to a client that reads
    // the refusal first and never learns it holds the lock (and the answer
    // would leave before its replication, with the refused connection's
    // output).
    let mut node = node0();
    let mut session = Session::new();
    // Ticks as a running loop's (a longer gap would be a stall).
    for ms in (0..=600).step_by(50) {
        node.tick(at(ms));
    }
    assert_eq!(node.role(), Role::Active);
    node.open_peer_only(at(600), cid(7));
    for ms in (650..=1200).step_by(50) {
        node.tick(at(ms));
    }
    let mut doomed = Vec::new();
    node.take_doomed(at(1200), &mut doomed);
    assert_eq!(doomed, [cid(7)]);
    let flow = session.feed(&mut node, at(1200), cid(7), b"A k 2.0 0\n");
    assert_ne!(
        flow,
        Flow::Open,
        "a refused connection's request is refused"
    );
    let out = String::from_utf8(std::mem::take(node.output_mut(cid(7)))).unwrap();
    assert!(!out.contains("\nA k") && !out.starts_with("A k"), "{out:?}");
    assert_eq!(node.engine().holder(b"k"), None);
    // No deadline stays in the past for it while it closes.
    assert_eq!(node.peer_only_deadline(), None);
    node.check_invariants(at(1200));
    node.close(at(1200), cid(7));
    node.check_invariants(at(1200));
}

#[test]
fn a_peer_giving_up_a_handshake_that_expired_this_turn_is_not_answered() {
    // Peer 1 dials the node and says HELLO; the node's CHALLENGE does not
    // reach it (a one-way cut). At the deadline both give up: the tick
    // that starts the node's turn closes the handshake, and the peer's own
    // `E` line giving it up is read in the same turn, before the loop has
    // taken the link to close. That line is the peer's, not a client
    // request: the node answers it with nothing (no "unknown op").
    let mut node = node0();
    let mut session = Session::new();
    node.tick(at(0));
    node.open(cid(5));
    let peers = peers();
    let mut hello = Vec::new();
    wire::encode(
        &mut hello,
        &wire::PeerMsg::Hello {
            version: wire::VERSION,
            fingerprint: auth::fingerprint(wire::FINGERPRINT_VERSION, &peers),
            from: PeerId(1),
            addr: peers[1].as_bytes(),
            incarnation: 1,
            nonce: [9; auth::NONCE_LEN],
        },
    );
    assert_eq!(session.feed(&mut node, at(1), cid(5), &hello), Flow::Open);
    let challenge = std::mem::take(node.output_mut(cid(5)));
    assert!(challenge.starts_with(b"P CHALLENGE "));
    // Ticks as a running loop's, to the handshake's deadline.
    for ms in (50..=550).step_by(50) {
        node.tick(at(ms));
    }
    let flow = session.feed(
        &mut node,
        at(550),
        cid(5),
        b"E n1:1 did not answer this node's HELLO within 500 ms\n",
    );
    assert_eq!(flow, Flow::Broken);
    let out = String::from_utf8(std::mem::take(node.output_mut(cid(5)))).unwrap();
    assert!(out.starts_with("E peer handshake not finished"), "{out:?}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
    let mut doomed = Vec::new();
    node.take_doomed(at(550), &mut doomed);
    assert_eq!(doomed, [cid(5)]);
    node.check_invariants(at(550));
}
