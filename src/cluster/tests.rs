//! The hand-off rules of the state machine, driven directly: who may be
//! chosen as successor, and from whom `HANDOFF` is taken.

use super::*;

const TIMEOUT_MS: u64 = 500;

fn at(ms: u64) -> Now {
    Now {
        ms,
        unix_ns: 1_700_000_000_000_000_000 + ms * 1_000_000,
    }
}

/// Node `me` of three, with an engine.
fn node(me: usize) -> (Cluster, Engine) {
    let peers: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect();
    let mut engine = Engine::new(at(0), &peers[me]);
    let cfg = ClusterConfig {
        peers,
        me,
        heartbeat_ms: 50,
        peer_timeout_ms: TIMEOUT_MS,
        incarnation: 1,
    };
    let cluster = Cluster::new(cfg, at(0), &mut engine);
    (cluster, engine)
}

/// Peer `from` links to the node (inbound conn `conn`) and says who it is.
fn link_in(c: &mut Cluster, e: &mut Engine, now: Now, conn: ConnId, from: usize) {
    e.open(conn);
    let addr = c.cfg.peers[from].clone();
    c.on_message(
        now,
        conn,
        PeerMsg::Hello {
            from,
            addr: addr.as_bytes(),
            incarnation: 1,
        },
        e,
    )
    .unwrap();
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

/// Node 0, active after its start-up grace, with outbound links to 1 and 2
/// and inbound links from both.
fn active_node0() -> (Cluster, Engine) {
    let (mut c, mut e) = node(0);
    for (conn, peer) in [(20, 1), (21, 2)] {
        e.open(conn);
        c.outbound_open(conn, peer, &mut e);
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
