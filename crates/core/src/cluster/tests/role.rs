//! The role rule: who becomes active, who steps down, whom a standby
//! follows or names, and the hand-off of the role.

use super::*;
use crate::outbox::cid;

#[test]
fn handoff_is_taken_only_from_the_followed_node() {
    // Node 2 follows nobody yet (start-up grace), so it has no state of
    // node 1's: a HANDOFF from node 1 is refused.
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(11), false, None);
    assert_eq!(c.role(), Role::Standby { following: None });
    let handoff = PeerMsg::Handoff { highest: 5 };
    c.on_message(at(3), cid(11), handoff, &mut e, &mut o)
        .unwrap();
    assert_eq!(c.role(), Role::Standby { following: None });
    // Its token is observed all the same: tokens never go back.
    assert!(e.highest_token() >= 5);

    // Following node 1, it has node 1's state: the role is taken at once.
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(11), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    let handoff = PeerMsg::Handoff { highest: 6 };
    c.on_message(at(3), cid(11), handoff, &mut e, &mut o)
        .unwrap();
    assert_eq!(c.role(), Role::Active);
}

#[test]
fn a_leaving_active_hands_off_only_to_a_follower() {
    // Nobody follows it yet: no hand-off (a non-follower would take the
    // role without its grants).
    let (mut c, mut e, mut o) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, None);
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, None);
    assert_eq!(c.leave(now, &mut e, &mut o), None);

    // Node 2 follows it, node 1 does not: node 2 it is, though 1 has the
    // higher priority.
    let (mut c, mut e, mut o) = active_node0();
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, None);
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, Some(0));
    assert_eq!(c.leave(now, &mut e, &mut o), Some(PeerId(2)));
}

#[test]
fn ready_means_active_or_following_with_the_whole_snapshot() {
    // Node 2 follows nobody (start-up grace): not ready.
    let (mut c, mut e, mut o) = node(2);
    assert!(!c.is_ready());
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(11), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    // Following node 1, but its snapshot is not in yet: not ready.
    assert!(!c.is_ready());
    c.on_message(
        at(3),
        cid(11),
        PeerMsg::Snapshot { highest: 7 },
        &mut e,
        &mut o,
    )
    .unwrap();
    assert!(!c.is_ready());
    c.on_message(at(4), cid(11), PeerMsg::Synced, &mut e, &mut o)
        .unwrap();
    assert!(c.is_ready());
    // Node 1 hands over: active, ready.
    c.on_message(
        at(5),
        cid(11),
        PeerMsg::Handoff { highest: 8 },
        &mut e,
        &mut o,
    )
    .unwrap();
    assert_eq!(c.role(), Role::Active);
    assert!(c.is_ready());
    assert_eq!(c.stats().became_active, 1);
    // Leaving: not ready any more.
    c.leave(at(6), &mut e, &mut o);
    assert!(!c.is_ready());
}

#[test]
fn a_fresh_active_steps_down_to_an_active_that_holds_the_state() {
    let now = at(TIMEOUT_MS + 60);
    // Node 0 restarted cut off and took the role alone; node 1 served the
    // cluster meanwhile. Node 0 has the priority, node 1 the state: node 1
    // wins.
    let (mut c, mut e, mut o) = fresh_active(0);
    link_in(&mut c, &mut e, &mut o, now, cid(10), 1);
    heartbeat_synced(&mut c, &mut e, &mut o, now, cid(10), true, None, true);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    assert!(!e.is_active());
    c.check_invariants(now, &e);

    // Two actives alike (neither holds the state): the priority decides.
    let (mut c, mut e, mut o) = fresh_active(0);
    link_in(&mut c, &mut e, &mut o, now, cid(10), 1);
    heartbeat_synced(&mut c, &mut e, &mut o, now, cid(10), true, None, false);
    assert_eq!(c.role(), Role::Active);

    // Node 2 hears both: it follows the one that holds the state, as the
    // two actives themselves decide.
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 0);
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    heartbeat_synced(&mut c, &mut e, &mut o, at(2), cid(10), true, None, false);
    heartbeat_synced(&mut c, &mut e, &mut o, at(2), cid(11), true, None, true);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    // Should node 0 come to hold the state too, the priority decides.
    heartbeat_synced(&mut c, &mut e, &mut o, at(3), cid(10), true, None, true);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
}

#[test]
fn an_active_holding_the_state_stays_when_a_fresh_higher_node_appears() {
    // Node 1 follows node 0 and takes its snapshot; node 0 goes silent and
    // node 1 takes over, holding the state.
    let (mut c, mut e, mut o) = node(1);
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 0);
    heartbeat(&mut c, &mut e, &mut o, at(1), cid(10), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    c.on_message(
        at(2),
        cid(10),
        PeerMsg::Snapshot { highest: 7 },
        &mut e,
        &mut o,
    )
    .unwrap();
    c.on_message(at(2), cid(10), PeerMsg::Synced, &mut e, &mut o)
        .unwrap();
    assert!(c.synced);
    let mut ms = 2;
    while c.role() != Role::Active {
        ms += 50;
        assert!(ms < 3 * TIMEOUT_MS, "node 1 never took over");
        c.tick(at(ms), &mut e, &mut o);
    }
    assert!(c.synced, "it took the role holding the state");
    c.on_close(at(ms), cid(10), &mut e, &mut o);
    // Node 0 restarted (a new incarnation), alone and active with nothing:
    // node 1 keeps the role.
    let mut restarted = Remote::new(0);
    restarted.incarnation = 2;
    restarted
        .dial(&mut c, &mut e, &mut o, at(ms), cid(12))
        .unwrap();
    heartbeat_synced(&mut c, &mut e, &mut o, at(ms), cid(12), true, None, false);
    assert_eq!(c.role(), Role::Active);
    c.check_invariants(at(ms), &e);
    // Its heartbeats say it holds the state.
    dial_out(&mut c, &mut e, &mut o, at(ms), cid(20), 0);
    let lines = restarted
        .accept(&mut c, &mut e, &mut o, at(ms), cid(20))
        .unwrap();
    let hb = lines.iter().find(|l| l.starts_with("P HB ")).unwrap();
    assert!(hb.starts_with("P HB A - ") && hb.ends_with(" 1"), "{hb}");
}

#[test]
fn a_fresh_active_holds_the_state_once_a_follower_synced_to_it() {
    let (mut c, mut e, mut o) = active_node0();
    assert!(!c.synced);
    let now = at(TIMEOUT_MS + 60);
    heartbeat_synced(&mut c, &mut e, &mut o, now, cid(10), false, Some(0), false);
    // Not before it has our snapshot.
    assert!(!c.synced);
    c.flush_replication(now, &mut e, &mut o);
    assert!(lines_of(&mut o, cid(20)).iter().any(|l| l == "P SYNCED"));
    heartbeat_synced(&mut c, &mut e, &mut o, now, cid(10), false, Some(0), true);
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
    let (mut c, mut e, mut o) = node(2);
    e.open(cid(0), &mut o);
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    let mut ms = 1;
    while ms < 3 * TIMEOUT_MS {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
        c.tick(at(ms), &mut e, &mut o);
        ms += 50;
    }
    assert_eq!(c.role(), Role::Standby { following: None });
    client(&mut e, &mut o, at(ms), cid(0), "A k 10 0");
    assert_eq!(lines_of(&mut o, cid(0)), ["M k 127.0.0.1:7000"]);
    // Once its peers follow nobody either, it names nobody.
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, None);
    client(&mut e, &mut o, at(ms), cid(0), "A k 10 0");
    assert_eq!(lines_of(&mut o, cid(0)), ["M k -"]);
    // Hearing the active itself, it follows it.
    link_in(&mut c, &mut e, &mut o, at(ms), cid(10), 0);
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    client(&mut e, &mut o, at(ms), cid(0), "A k 10 0");
    assert_eq!(lines_of(&mut o, cid(0)), ["M k 127.0.0.1:7000"]);
    c.check_invariants(at(ms), &e);
}

#[test]
fn a_standby_does_not_take_over_while_a_live_peer_follows_the_active() {
    // Node 1 holds node 0's state; node 0's packets to it stop. Node 2
    // still hears node 0 and follows it: node 1 waits.
    let (mut c, mut e, mut o) = node(1);
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 0);
    link_in(&mut c, &mut e, &mut o, at(1), cid(12), 2);
    heartbeat(&mut c, &mut e, &mut o, at(1), cid(10), true, None);
    c.on_message(
        at(1),
        cid(10),
        PeerMsg::Snapshot { highest: 7 },
        &mut e,
        &mut o,
    )
    .unwrap();
    c.on_message(at(1), cid(10), PeerMsg::Synced, &mut e, &mut o)
        .unwrap();
    let mut ms = 1;
    while ms < 4 * TIMEOUT_MS {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(12), false, Some(0));
        c.tick(at(ms), &mut e, &mut o);
        ms += 50;
    }
    assert!(c.peers[0].heard_ms.is_none(), "node 0 is silent here");
    assert_eq!(c.role(), Role::Standby { following: None });
    c.check_invariants(at(ms), &e);
    // Node 2 finds node 0 gone too: node 1 takes over, with the state.
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(12), false, None);
    assert_eq!(c.role(), Role::Active);
    assert!(c.synced);
}

#[test]
fn a_peer_still_following_a_node_we_hear_as_a_standby_does_not_hold_us_back() {
    // Node 0 follows node 1 and holds its state. Node 1 steps down (it
    // follows nobody now) while node 2 still follows it, as a standby
    // keeps following a live higher-priority node. That is no active
    // elsewhere: node 0 hears node 1 itself, so node 0 takes the role.
    let (mut c, mut e, mut o) = node(0);
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    link_in(&mut c, &mut e, &mut o, at(1), cid(12), 2);
    heartbeat(&mut c, &mut e, &mut o, at(1), cid(11), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    c.on_message(
        at(1),
        cid(11),
        PeerMsg::Snapshot { highest: 7 },
        &mut e,
        &mut o,
    )
    .unwrap();
    c.on_message(at(1), cid(11), PeerMsg::Synced, &mut e, &mut o)
        .unwrap();
    let mut ms = 1;
    while ms < 2 * TIMEOUT_MS {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), true, None);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(12), false, Some(1));
        c.tick(at(ms), &mut e, &mut o);
        ms += 50;
    }
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, None);
    assert_eq!(
        c.role(),
        Role::Active,
        "not held back by node 2's stale view"
    );
    c.check_invariants(at(ms), &e);
}

#[test]
fn a_rival_active_that_does_not_hear_us_gets_our_link_redialed() {
    // Node 1 claims the role; node 0, active, outranks it. Were our link to
    // node 1 working, node 1 would step down within a delivery. It keeps
    // claiming: its end of our link is gone (closed during a partition,
    // the close still in TCP's back-off), so ours is closed and dialed anew.
    let (mut c, mut e, mut o) = active_node0();
    let start = TIMEOUT_MS + 60;
    let mut doomed = Vec::new();
    let mut ms = start;
    while ms < start + TIMEOUT_MS / 2 {
        heartbeat_synced(&mut c, &mut e, &mut o, at(ms), cid(10), true, None, false);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
        c.tick(at(ms), &mut e, &mut o);
        c.take_doomed(&mut doomed);
        assert!(doomed.is_empty(), "too soon, at {ms}: {doomed:?}");
        ms += 50;
    }
    heartbeat_synced(&mut c, &mut e, &mut o, at(ms), cid(10), true, None, false);
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
    c.tick(at(ms), &mut e, &mut o);
    assert_link_to_node1_redialed(&mut (c, e, o), ms, "has claimed the active role");
}

/// Node 0, active: its link to node 1 (20), only, has been given up as
/// one node 1 does not hear (`how`), and is dialed again once closed.
fn assert_link_to_node1_redialed(n: &mut (Cluster, Engine, Outbox), ms: u64, how: &str) {
    let (c, e, o) = n;
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    assert_eq!(conns, [20].map(ConnId::new), "our link to node 1, only");
    assert!(
        doomed[0].1.contains(how) && doomed[0].1.contains("does not hear this link"),
        "{doomed:?}"
    );
    assert_eq!(c.role(), Role::Active);
    c.on_close(at(ms), cid(20), e, o);
    assert!(c.alive(PeerId(1)), "we still hear it");
    let mut dials = Vec::new();
    c.take_dials(at(ms + DIAL_RETRY_MS), &mut dials);
    assert_eq!(dials.len(), 1);
    assert_eq!(dials[0].0, PeerId(1));
    c.check_invariants(at(ms), e);
}

#[test]
fn a_standby_that_follows_no_active_gets_our_link_redialed() {
    // Node 0, active. Node 1 is a standby that follows nobody: were our
    // link to it working, it would follow us within a delivery. It keeps
    // following nobody (its process crashed across a partition and came
    // back: our link reached the old process), so ours is closed and
    // dialed anew before its start-up wait ends. Node 2 follows another
    // node (as in a one-way partition it hears that one, not us): not
    // ours to redial.
    let (mut c, mut e, mut o) = active_node0();
    // Both follow us at first.
    let mut ms = TIMEOUT_MS + 60;
    for _ in 0..3 {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, Some(0));
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
        c.tick(at(ms), &mut e, &mut o);
        ms += 50;
    }
    let start = ms;
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert!(doomed.is_empty(), "{doomed:?}");
    while ms < start + TIMEOUT_MS / 2 {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(1));
        c.tick(at(ms), &mut e, &mut o);
        c.take_doomed(&mut doomed);
        assert!(doomed.is_empty(), "too soon, at {ms}: {doomed:?}");
        ms += 50;
    }
    for _ in 0..3 {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(1));
        c.tick(at(ms), &mut e, &mut o);
        ms += 50;
    }
    assert_link_to_node1_redialed(&mut (c, e, o), ms, "has followed no active");
}

/// Node 0's heartbeat, on its link to us (10): claims the role or not,
/// follows whom, holds its active's snapshot or not.
fn node0_says(n: &mut (Cluster, Engine, Outbox), ms: u64, state: (bool, Option<usize>, bool)) {
    let (c, e, o) = n;
    let (active, following, synced) = state;
    heartbeat_synced(c, e, o, at(ms), cid(10), active, following, synced);
}

/// Node 1, active alone with "x" granted, linked both ways to node 0,
/// which follows it with its snapshot: node 1 hands the role back to it
/// (failback). Returns the node and the time; the HANDOFF is on link 20.
fn handed_back_to_node0() -> ((Cluster, Engine, Outbox), u64) {
    let mut n = fresh_active(1);
    let (c, e, o) = &mut n;
    let mut ms = TIMEOUT_MS + 100;
    e.open(cid(1), o);
    client(e, o, at(ms), cid(1), "A x 30000 0");
    assert!(lines_of(o, cid(1))[0].starts_with("A x "));
    dial_out(c, e, o, at(ms), cid(20), 0);
    Remote::new(0).accept(c, e, o, at(ms), cid(20)).unwrap();
    link_in(c, e, o, at(ms), cid(10), 0);
    ms += 1;
    node0_says(&mut n, ms, (false, Some(1), false));
    // The turn's end: node 0 is sent our snapshot.
    let (c, e, o) = &mut n;
    c.flush_replication(at(ms), e, o);
    ms += 1;
    node0_says(&mut n, ms, (false, Some(1), true));
    let (c, e, o) = &mut n;
    c.tick(at(ms), e, o);
    let following = Some(PeerId(0));
    assert_eq!(c.role(), Role::Standby { following }, "handed back");
    let sent = lines_of(o, cid(20));
    assert!(sent.iter().any(|l| l.starts_with("P HANDOFF")), "{sent:?}");
    (n, ms)
}

#[test]
fn a_node_handed_the_role_that_follows_another_active_is_sent_our_grants() {
    // Node 0 had heard another active (node 2, at a heal) just before our
    // HANDOFF came: it follows node 2 now and ignored the HANDOFF, and its
    // table may hold node 2's snapshot instead of our grants. When it is
    // active later and sends us its snapshot, our grants go to it first,
    // as a merge, before its snapshot replaces our table.
    let (mut n, ms) = handed_back_to_node0();
    node0_says(&mut n, ms + 1, (false, Some(2), false));
    node0_says(&mut n, ms + 2, (true, None, true));
    let (c, e, o) = &mut n;
    let merges = |sent: &[String]| sent.iter().filter(|l| l.starts_with("P MERGE")).count();
    assert_eq!(merges(&lines_of(o, cid(20))), 0, "not before its snapshot");
    let snapshot = PeerMsg::Snapshot { highest: 0 };
    c.on_message(at(ms + 2), cid(10), snapshot, e, o).unwrap();
    let sent = lines_of(o, cid(20));
    let merge = sent.iter().position(|l| l.starts_with("P MERGE "));
    let grant = sent.iter().position(|l| l.starts_with("P g x "));
    let merged = sent.iter().position(|l| l == "P MERGED");
    assert!(
        merge < grant && grant < merged && merge.is_some(),
        "our grant of x as a merge: {sent:?}"
    );
    // Its snapshot replaced our table; nothing is owed any more.
    assert_eq!(e.lock_count(), 0);
    assert!(!c.settling());
}

#[test]
fn a_node_that_took_the_role_we_handed_it_is_sent_no_merge() {
    // Its first heartbeat since our HANDOFF says it is active: it took the
    // role with our state, and its snapshot replaces our table as is.
    let (mut n, ms) = handed_back_to_node0();
    node0_says(&mut n, ms + 1, (true, None, true));
    let (c, e, o) = &mut n;
    let snapshot = PeerMsg::Snapshot { highest: 0 };
    c.on_message(at(ms + 1), cid(10), snapshot, e, o).unwrap();
    let sent = lines_of(o, cid(20));
    assert!(sent.iter().all(|l| !l.starts_with("P MERGE")), "{sent:?}");
    assert!(!c.settling());
}
