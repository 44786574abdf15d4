//! The handshake and the links: nothing is believed or sent before a
//! peer proves itself; handshakes that do not finish, conflicts, links
//! given up, silent or superseded.

use super::*;
use crate::outbox::cid;

#[test]
fn nothing_is_believed_before_auth() {
    let (mut c, mut e, mut o) = node(2);
    e.open(cid(5), &mut o);
    let hello = hello_as_node0(&c, 9, 1);
    c.on_message(at(1), cid(5), hello, &mut e, &mut o).unwrap();
    // The challenge is all that goes out: no token, no role.
    let out = lines_of(&mut o, cid(5));
    assert_eq!(out.len(), 1);
    assert!(out[0].starts_with("P CHALLENGE "), "{out:?}");
    // A heartbeat claiming the role, or a huge token, before AUTH: refused.
    let hb = PeerMsg::Heartbeat {
        active: true,
        following: None,
        highest: 1 << 62,
        synced: true,
    };
    let err = c
        .on_message(at(2), cid(5), hb, &mut e, &mut o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("before AUTH"), "{err}");
    assert_eq!(e.highest_token(), 0);
    assert!(c.peers[0].heard_ms.is_none());
    // Without HELLO at all.
    e.open(cid(6), &mut o);
    let err = c
        .on_message(at(2), cid(6), hb, &mut e, &mut o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("before HELLO"), "{err}");
    c.check_invariants(at(2), &e);
}

#[test]
fn a_wrong_secret_or_a_replayed_auth_is_refused() {
    let (mut c, mut e, mut o) = node(2);
    let mut stranger = Remote::new(0);
    stranger.secret = Secret::from_bytes(b"another secret of thirty-two bytes!!");
    let err = stranger
        .dial(&mut c, &mut e, &mut o, at(1), cid(5))
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
    let (mut c, mut e, mut o) = node(2);
    e.open(cid(5), &mut o);
    let peer = Remote::new(0);
    let (hello, mac) = hello_and_auth(&peer, &mut c, &mut e, &mut o, at(1), cid(5));
    c.on_message(at(1), cid(5), PeerMsg::Auth { mac }, &mut e, &mut o)
        .unwrap();
    e.open(cid(6), &mut o);
    c.on_message(at(2), cid(6), hello, &mut e, &mut o).unwrap();
    let err = c
        .on_message(at(2), cid(6), PeerMsg::Auth { mac }, &mut e, &mut o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("authentication failed"), "{err}");
    assert_eq!(c.peers[0].links_in, 1, "only the genuine link counts");
    c.check_invariants(at(2), &e);
}

#[test]
fn a_second_hello_never_resets_a_live_peer() {
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(5), 0);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(5), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    let hello = hello_as_node0(&c, 12345, 3);
    // On the authenticated link itself.
    assert!(c.on_message(at(3), cid(5), hello, &mut e, &mut o).is_err());
    // On a new connection, from a stranger who cannot finish the handshake.
    e.open(cid(6), &mut o);
    c.on_message(at(3), cid(6), hello, &mut e, &mut o).unwrap();
    assert!(c.peers[0].claims_active, "still the active");
    assert_eq!(c.peers[0].incarnation, 1);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    c.check_invariants(at(3), &e);
}

#[test]
fn unfinished_handshakes_are_closed_after_the_peer_timeout() {
    let (mut c, mut e, mut o) = node(2);
    e.open(cid(5), &mut o);
    let hello = hello_as_node0(&c, 9, 1);
    c.on_message(at(1), cid(5), hello, &mut e, &mut o).unwrap();
    // Our own dial to node 1 gets no CHALLENGE.
    dial_out(&mut c, &mut e, &mut o, at(1), cid(6), 1);
    assert!(c.next_deadline() <= 1 + TIMEOUT_MS);
    let mut doomed = Vec::new();
    // Ticks as the loop does, at least once per heartbeat (a longer gap
    // reads as a stall of this process, which gives handshakes more time).
    for ms in (50..TIMEOUT_MS).step_by(50) {
        c.tick(at(ms), &mut e, &mut o);
    }
    c.tick(at(TIMEOUT_MS), &mut e, &mut o);
    c.take_doomed(&mut doomed);
    assert!(doomed.is_empty(), "not yet: {doomed:?}");
    c.tick(at(TIMEOUT_MS + 1), &mut e, &mut o);
    c.take_doomed(&mut doomed);
    let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    assert_eq!(conns, [5, 6].map(ConnId::new));
    // Each ends with an E line saying why.
    assert!(
        lines_of(&mut o, cid(5))
            .last()
            .unwrap()
            .starts_with("E peer handshake")
    );
    assert!(
        lines_of(&mut o, cid(6))
            .last()
            .unwrap()
            .contains("did not answer")
    );
    // And the node kept no state for them once the loop closes them.
    c.on_close(at(TIMEOUT_MS + 1), cid(5), &mut e, &mut o);
    c.on_close(at(TIMEOUT_MS + 1), cid(6), &mut e, &mut o);
    assert!(c.pending.is_empty() && c.peers[1].out.conn().is_none());
    c.check_invariants(at(TIMEOUT_MS + 1), &e);
}

#[test]
fn pending_handshakes_are_bounded() {
    let (mut c, mut e, mut o) = node(2);
    let hello = hello_as_node0(&c, 9, 1);
    for conn in (0..MAX_PENDING_HANDSHAKES).map(ConnId::from_index) {
        e.open(conn, &mut o);
        c.on_message(at(1), conn, hello, &mut e, &mut o).unwrap();
    }
    // One more: the oldest gives way (a stranger holding every slot cannot
    // keep a real peer out), and is closed with the reason.
    let conn = ConnId::from_index(MAX_PENDING_HANDSHAKES);
    e.open(conn, &mut o);
    c.on_message(at(2), conn, hello, &mut e, &mut o).unwrap();
    assert_eq!(c.pending.len(), MAX_PENDING_HANDSHAKES);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert_eq!(doomed.len(), 1);
    assert_eq!(doomed[0].0, cid(0), "the oldest");
    assert!(doomed[0].1.contains("gives way"), "{}", doomed[0].1);
    assert!(c.pending.contains_key(&conn));
    c.check_invariants(at(2), &e);
}

#[test]
fn a_node_that_meets_only_wrong_macs_does_not_serve() {
    // Node 2 of three, alone: its dials are answered by live processes
    // with another secret. It never takes the role.
    let (mut c, mut e, mut o) = node(2);
    let odd = Secret::from_bytes(b"the others' secret, not this node's!!");
    let mut next_conn = 20;
    let mut dials = Vec::new();
    // Each dial (retried as the loop does) meets a wrong MAC.
    for ms in (1..=3 * TIMEOUT_MS).step_by(50) {
        c.tick(at(ms), &mut e, &mut o);
        dials.clear();
        c.take_dials(at(ms), &mut dials);
        for &(peer, _) in &dials {
            let conn = next_conn;
            next_conn += 1;
            e.open(cid(conn), &mut o);
            c.outbound_open(at(ms), cid(conn), peer, &mut o);
            let mut answer = Remote::new(peer.0);
            answer.secret = odd.clone();
            assert!(
                answer
                    .accept(&mut c, &mut e, &mut o, at(ms), cid(conn))
                    .is_err()
            );
            c.on_close(at(ms), cid(conn), &mut e, &mut o);
            e.close(cid(conn), &mut o);
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
        c.tick(at(ms), &mut e, &mut o);
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
    let (mut c, mut e, mut o) = active_node0();
    e.open(cid(40), &mut o);
    c.on_close(at(600), cid(21), &mut e, &mut o);
    c.outbound_open(at(600), cid(40), PeerId(2), &mut o);
    let mut bad = Remote::new(2);
    bad.secret = Secret::from_bytes(b"a third secret, for the odd node only");
    assert!(
        bad.accept(&mut c, &mut e, &mut o, at(601), cid(40))
            .is_err()
    );
    assert_eq!(c.role(), Role::Active);
}

#[test]
fn our_link_sends_nothing_before_the_peer_proves_itself() {
    let (mut c, mut e, mut o) = node(0);
    dial_out(&mut c, &mut e, &mut o, at(0), cid(20), 1);
    // Heartbeat time: only the HELLO is queued on the unproven link.
    c.tick(at(60), &mut e, &mut o);
    let out = String::from_utf8(o.output_mut(cid(20)).clone()).unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with(&format!("P HELLO {} ", wire::VERSION)));
    // A CHALLENGE made with another secret: refused, no AUTH sent.
    let mut impostor = Remote::new(1);
    impostor.secret = Secret::from_bytes(b"not the cluster's secret, 32 bytes.");
    let err = impostor
        .accept(&mut c, &mut e, &mut o, at(61), cid(20))
        .unwrap_err()
        .to_string();
    assert!(err.contains("authentication failed"), "{err}");
    assert!(o.output_mut(cid(20)).is_empty(), "no AUTH for an impostor");
    assert!(!c.peers[1].out.is_ready());

    // The genuine peer: AUTH, then our heartbeat at once.
    let (mut c, mut e, mut o) = node(0);
    dial_out(&mut c, &mut e, &mut o, at(0), cid(20), 1);
    let answer = Remote::new(1)
        .accept(&mut c, &mut e, &mut o, at(1), cid(20))
        .unwrap();
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
    let (mut c, mut e, mut o) = active_node0();
    let err = other
        .dial(&mut c, &mut e, &mut o, at(600), cid(30))
        .unwrap_err()
        .to_string();
    assert!(err.contains("same list, in the same order"), "{err}");
    assert!(c.problem(at(600)).is_some());
    // Exactly one of the two configurations may serve.
    assert_eq!(c.role() == Role::Active, mine < their_fp);
    c.check_invariants(at(600), &e);
    // The conflict ends when it is no longer heard of.
    for ms in (650..=600 + 3 * TIMEOUT_MS).step_by(50) {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, None);
        c.tick(at(ms), &mut e, &mut o);
    }
    assert!(c.problem(at(600 + 3 * TIMEOUT_MS)).is_none());
    assert_eq!(c.role(), Role::Active);

    // The dialer side: our link to a node that answers with another list.
    let (mut c, mut e, mut o) = node(0);
    dial_out(&mut c, &mut e, &mut o, at(0), cid(20), 1);
    let mut b = Remote::new(1);
    b.peers = theirs;
    b.index = 0; // "b" is node 0 in its list
    let err = b
        .accept(&mut c, &mut e, &mut o, at(1), cid(20))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is node 0 of its --peers"), "{err}");
    // It got our AUTH, so it learns of the conflict as surely as we did.
    assert!(o.output_mut(cid(20)).starts_with(b"P AUTH "));
    assert!(!c.peers[1].out.is_ready());
    assert!(c.problem(at(1)).is_some());
}

#[test]
fn a_relayed_challenge_gets_no_auth_and_is_no_conflict() {
    // Node 1 is down and a stranger holds its address. Node 0 dials it; the
    // stranger relays node 0's HELLO to node 2, which answers with a valid
    // CHALLENGE (it holds the secret) naming itself.
    let (mut c, mut e, mut o) = active_node0();
    c.on_close(at(600), cid(20), &mut e, &mut o);
    e.close(cid(20), &mut o);
    dial_out(&mut c, &mut e, &mut o, at(600), cid(40), 1);
    let relay = Remote::new(2);
    let err = relay
        .accept(&mut c, &mut e, &mut o, at(601), cid(40))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not the node this node dialed"), "{err}");
    // No AUTH that the stranger could carry on to node 2 as node 0's, and
    // no conflict that would stop node 0 serving.
    assert!(o.output_mut(cid(40)).is_empty());
    assert!(c.problem(at(601)).is_none());
    assert_eq!(c.role(), Role::Active);
    c.check_invariants(at(601), &e);
}

#[test]
fn a_silent_peer_s_links_are_closed_and_dialed_afresh() {
    let (mut c, mut e, mut o) = active_node0();
    let t0 = TIMEOUT_MS + 50;
    // Node 2 keeps talking; node 1 falls silent (a partition).
    let mut doomed = Vec::new();
    for ms in (t0..=t0 + TIMEOUT_MS + 50).step_by(50) {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
        c.tick(at(ms), &mut e, &mut o);
        c.take_doomed(&mut doomed);
    }
    let mut conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    conns.sort_unstable();
    assert_eq!(
        conns,
        [10, 20].map(ConnId::new),
        "node 1's links, both ways: {doomed:?}"
    );
    assert!(doomed.iter().all(|d| d.1.contains("silent for")));
    // The loop closes them; a fresh dial follows.
    let now = at(t0 + TIMEOUT_MS + 60);
    for conn in [10, 20] {
        c.on_close(now, cid(conn), &mut e, &mut o);
        e.close(cid(conn), &mut o);
    }
    let mut dials = Vec::new();
    c.take_dials(at(now.ms + DIAL_RETRY_MS), &mut dials);
    assert_eq!(dials.iter().map(|d| d.0).collect::<Vec<_>>(), [PeerId(1)]);
    c.check_invariants(now, &e);
}

#[test]
fn a_link_the_peer_gave_up_is_no_crash() {
    // Node 2 follows node 0, which paused: node 0 gave up node 2's links
    // as silent, with E lines. When node 2 reads them and its links close,
    // node 0 is alive (it just said so), so node 2 must not promote itself.
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 0);
    dial_out(&mut c, &mut e, &mut o, at(1), cid(20), 0);
    Remote::new(0)
        .accept(&mut c, &mut e, &mut o, at(1), cid(20))
        .unwrap();
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(10), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    for ms in (50..=TIMEOUT_MS).step_by(50) {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), true, None);
        c.tick(at(ms), &mut e, &mut o);
    }
    let now = at(TIMEOUT_MS + 10);
    for conn in [10, 20] {
        let err = c
            .on_refusal(now, cid(conn), b"E 127.0.0.1:7002 silent for 500 ms")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gave the link up"), "{err}");
        c.on_close(now, cid(conn), &mut e, &mut o);
        e.close(cid(conn), &mut o);
    }
    assert!(c.peers[0].heard_ms.is_some(), "alive: it just spoke");
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    c.check_invariants(now, &e);
}

#[test]
fn a_stall_of_this_process_does_not_fail_handshakes_in_progress() {
    // A peer's HELLO is answered; then this process does not run for
    // longer than the handshake timeout (SIGSTOP, a VM stall). The peer's
    // AUTH waits unread meanwhile: it must be taken, as heartbeats are
    // after a stall, not refused as a line out of place.
    // So must the CHALLENGE that answers our own HELLO.
    let (mut c, mut e, mut o) = node(2);
    c.tick(at(1), &mut e, &mut o);
    e.open(cid(5), &mut o);
    let peer = Remote::new(0);
    let (_, mac) = hello_and_auth(&peer, &mut c, &mut e, &mut o, at(1), cid(5));
    dial_out(&mut c, &mut e, &mut o, at(1), cid(6), 1);
    // The process resumes 3 timeouts later: its first turn ticks, then
    // reads what waited.
    let resumed = at(1 + 3 * TIMEOUT_MS);
    c.tick(resumed, &mut e, &mut o);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert!(doomed.is_empty(), "{doomed:?}");
    c.on_message(resumed, cid(5), PeerMsg::Auth { mac }, &mut e, &mut o)
        .unwrap();
    assert!(c.is_authenticated_in(cid(5)));
    Remote::new(1)
        .accept(&mut c, &mut e, &mut o, resumed, cid(6))
        .unwrap();
    assert!(c.peers[1].out.is_ready());
    c.check_invariants(resumed, &e);
}

#[test]
fn an_older_link_of_a_peer_that_linked_again_is_not_believed() {
    // Node 2 follows node 0 over link 10. Node 0 links again (link 12):
    // it dials anew only once its old link is closed at its end, so what
    // link 10 still delivers (late, after a partition) is stale.
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 0);
    heartbeat(&mut c, &mut e, &mut o, at(1), cid(10), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    link_in(&mut c, &mut e, &mut o, at(2), cid(12), 0);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
    assert_eq!(conns, [10].map(ConnId::new));
    // A stale heartbeat on the old link changes nothing.
    heartbeat(&mut c, &mut e, &mut o, at(3), cid(10), false, Some(1));
    assert!(c.peers[0].claims_active);
    assert_eq!(c.peers[0].following, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(0))
        }
    );
    c.check_invariants(at(3), &e);
    // Its close leaves the peer alive: the new link is open.
    c.on_close(at(4), cid(10), &mut e, &mut o);
    assert!(c.alive(PeerId(0)) && c.superseded.is_empty());
    heartbeat(&mut c, &mut e, &mut o, at(5), cid(12), true, None);
    c.check_invariants(at(5), &e);
}

#[test]
fn a_challenge_on_a_link_given_up_is_not_believed() {
    // Our HELLO goes unanswered past the peer timeout: the link is given
    // up. A CHALLENGE read before it closes gets no AUTH and does not
    // make it a link our state goes on.
    let (mut c, mut e, mut o) = node(0);
    e.open(cid(6), &mut o);
    c.tick(at(1), &mut e, &mut o);
    c.outbound_open(at(1), cid(6), PeerId(1), &mut o);
    // Ticks as a running loop's (a longer gap would be a stall).
    for ms in (11..=1 + TIMEOUT_MS).step_by(10) {
        c.tick(at(ms), &mut e, &mut o);
    }
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert_eq!(doomed.len(), 1, "{doomed:?}");
    assert_eq!(doomed[0].0, cid(6));
    let answer = Remote::new(1)
        .accept(&mut c, &mut e, &mut o, at(1 + TIMEOUT_MS), cid(6))
        .unwrap();
    assert!(answer.is_empty(), "{answer:?}");
    assert!(!c.peers[1].out.is_ready());
    c.check_invariants(at(1 + TIMEOUT_MS), &e);
    c.on_close(at(1 + TIMEOUT_MS), cid(6), &mut e, &mut o);
    assert!(c.peers[1].out.conn().is_none());
    c.check_invariants(at(1 + TIMEOUT_MS), &e);
}

#[test]
fn a_stall_long_enough_to_be_counted_dead_redials_every_link() {
    // Node 2, linked both ways to nodes 0 and 1, runs (ticks every 50 ms);
    // then stops. Stopped for long enough that its peers may have counted
    // it dead (its last heartbeat was up to one heartbeat before its last
    // turn), they have closed their links with it; the closes of ours
    // reach us only when TCP retransmits into them. Ours are given up at
    // once, and dialed afresh once closed.
    for (gap, redialed) in [(TIMEOUT_MS - 51, false), (TIMEOUT_MS - 50, true)] {
        let (mut c, mut e, mut o) = node_linked(2, 0);
        let mut now = 1;
        for ms in (1..=301).step_by(50) {
            now = ms;
            heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
            heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, None);
            c.tick(at(ms), &mut e, &mut o);
        }
        let mut doomed = Vec::new();
        c.take_doomed(&mut doomed);
        assert!(doomed.is_empty(), "{doomed:?}");
        let resumed = now + gap;
        c.tick(at(resumed), &mut e, &mut o);
        c.take_doomed(&mut doomed);
        let conns: Vec<ConnId> = doomed.iter().map(|d| d.0).collect();
        if !redialed {
            assert!(conns.is_empty(), "a {gap} ms stall: {doomed:?}");
            assert!(c.peers[0].out.is_ready() && c.peers[1].out.is_ready());
            c.check_invariants(at(resumed), &e);
            continue;
        }
        assert_eq!(conns, [20, 21].map(ConnId::new), "a {gap} ms stall");
        for (_, why) in &doomed {
            assert!(why.contains("may have closed this link"), "{why}");
        }
        // Nothing more goes on them: the heartbeats go nowhere until the
        // new links are up. The inbound links stay (the peers close them,
        // and link again).
        assert!(c.peers[0].out.ready_conn().is_none());
        assert!(c.peers[1].out.ready_conn().is_none());
        assert!(c.alive(PeerId(0)) && c.alive(PeerId(1)));
        c.check_invariants(at(resumed), &e);
        c.on_close(at(resumed), cid(20), &mut e, &mut o);
        c.on_close(at(resumed), cid(21), &mut e, &mut o);
        let mut dials = Vec::new();
        let mut t = resumed;
        while dials.len() < 2 && t < resumed + TIMEOUT_MS {
            t += 10;
            c.tick(at(t), &mut e, &mut o);
            c.take_dials(at(t), &mut dials);
        }
        let peers: Vec<usize> = dials.iter().map(|(p, _)| p.0).collect();
        assert_eq!(peers, [0, 1], "dialed again after the stall");
        c.check_invariants(at(t), &e);
    }
}
