//! Replication: snapshots and deltas to followers, shared grants and
//! permits, slow followers, lag probes and batched reads.

use super::*;
use crate::outbox::cid;

#[test]
fn a_standby_applies_shared_grants_and_permits_and_refuses_a_permit_without_its_limit() {
    let (mut c, mut e, mut o) = node(2);
    link_in(&mut c, &mut e, &mut o, at(1), cid(11), 1);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(11), true, None);
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    let member = |key: &'static [u8], token, permit| PeerMsg::Member {
        key,
        token,
        remaining_ms: 1_000,
        holder: crate::proto::Holder::default(),
        permit,
    };
    c.on_message(at(3), cid(11), member(b"r", 5, false), &mut e, &mut o)
        .unwrap();
    c.on_message(at(3), cid(11), PeerMsg::Limit { limit: 2 }, &mut e, &mut o)
        .unwrap();
    c.on_message(at(3), cid(11), member(b"s", 6, true), &mut e, &mut o)
        .unwrap();
    assert_eq!(e.members_of(b"r").len(), 1);
    assert_eq!(e.semaphore_limit(b"s"), Some(2));
    assert!(e.highest_token() >= 6);
    e.check_invariants();
    // A permit without a limit, and a shared grant while a limit waits
    // for its permit, break the link.
    let err = c
        .on_message(at(4), cid(11), member(b"s", 7, true), &mut e, &mut o)
        .unwrap_err();
    assert!(err.to_string().contains("without its L line"), "{err}");
    c.on_message(at(4), cid(11), PeerMsg::Limit { limit: 2 }, &mut e, &mut o)
        .unwrap();
    let err = c
        .on_message(at(4), cid(11), member(b"r", 8, false), &mut e, &mut o)
        .unwrap_err();
    assert!(err.to_string().contains("after an L line"), "{err}");
    assert_eq!(e.member_count(), 2, "nothing applied from a broken pair");
}

#[test]
fn a_follower_that_does_not_read_is_dropped_and_resynced() {
    let (mut c, mut e, mut o) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, None);
    c.flush_replication(now, &mut e, &mut o);
    assert!(c.peers[1].snapshot_sent);
    // Deltas pile up unread on the link to node 1 (the loop never takes
    // its output): past the bound the link is given up.
    let line = format!("P G {} 5 1000\n", "k".repeat(200));
    let mut doomed = Vec::new();
    let mut written = 0;
    while doomed.is_empty() {
        assert!(written <= REPLICATION_BACKLOG_BYTES + 1024 * 1024);
        o.write_link(cid(20), line.as_bytes());
        written += line.len();
        c.flush_replication(now, &mut e, &mut o);
        c.take_doomed(&mut doomed);
    }
    assert_eq!(doomed[0].0, cid(20));
    assert!(doomed[0].1.contains("resyncs"), "{}", doomed[0].1);
    assert!(!c.peers[1].snapshot_sent && !c.peers[1].out.is_ready());
    c.check_invariants(now, &e);
}

#[test]
fn a_doomed_link_that_closes_is_no_longer_doomed() {
    let (mut c, mut e, mut o) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, None);
    c.flush_replication(now, &mut e, &mut o);
    // The link to node 1 is doomed (it does not read), then closes (its
    // socket failed) before the loop takes the doomed links: the loop may
    // give its id to a new, unrelated connection, which must not be
    // closed for the old link's fault.
    let line = format!("P G {} 5 1000\n", "k".repeat(200));
    let mut written = 0;
    while c.doomed.is_empty() {
        assert!(written <= REPLICATION_BACKLOG_BYTES + 1024 * 1024);
        o.write_link(cid(20), line.as_bytes());
        written += line.len();
        c.flush_replication(now, &mut e, &mut o);
    }
    e.close(cid(20), &mut o);
    c.on_close(now, cid(20), &mut e, &mut o);
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert!(doomed.is_empty(), "{doomed:?}");
    c.check_invariants(now, &e);
}

#[test]
fn followers_get_shared_grants_and_permits_in_snapshots_and_deltas() {
    let (mut c, mut e, mut o) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    e.open(cid(0), &mut o);
    e.set_remote(cid(0), "10.0.0.5:4242".parse().unwrap());
    client(&mut e, &mut o, now, cid(0), "G s 10 0");
    let t0 = e.members_of(b"s")[0].0;
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, Some(0));
    o.output_mut(cid(20)).clear();
    c.flush_replication(now, &mut e, &mut o);
    assert_eq!(
        replication_lines(&mut o, cid(20)),
        [
            format!("P SNAP {t0}"),
            format!("P S s {t0} 10001 10.0.0.5:4242 - -"),
            "P SYNCED".into()
        ]
    );
    client(&mut e, &mut o, now, cid(0), "C p 2 5 0");
    let t1 = e.members_of(b"p")[0].0;
    client(&mut e, &mut o, now, cid(0), &format!("N p {t1} 2"));
    client(&mut e, &mut o, now, cid(0), &format!("R s {t0}"));
    c.flush_replication(now, &mut e, &mut o);
    let h = "10.0.0.5:4242 - -";
    assert_eq!(
        replication_lines(&mut o, cid(20)),
        [
            "P L 2".to_string(),
            format!("P C p {t1} 5001 {h}"),
            "P L 2".into(),
            format!("P C p {t1} 2001 {h}"),
            format!("P x s {t0:x}"),
        ]
    );
    // An expiry is a release too.
    e.tick(at(now.ms + 2_100), &mut o);
    c.flush_replication(at(now.ms + 2_100), &mut e, &mut o);
    assert_eq!(
        replication_lines(&mut o, cid(20)),
        [format!("P x p {t1:x}")]
    );
    c.check_invariants(at(now.ms + 2_100), &e);
}

#[test]
fn followers_get_a_snapshot_then_the_turns_changes_as_peer_lines() {
    let (mut c, mut e, mut o) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    e.open(cid(0), &mut o);
    e.set_remote(cid(0), "10.0.0.5:4242".parse().unwrap());
    client(&mut e, &mut o, now, cid(0), "O host-a/job-42");
    client(&mut e, &mut o, now, cid(0), "A before 10 0");
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, Some(0));
    for conn in [20, 21] {
        o.output_mut(cid(conn)).clear();
    }
    c.flush_replication(now, &mut e, &mut o);
    let t0 = e.holder(b"before").unwrap().0;
    for conn in [20, 21] {
        assert_eq!(
            lines_of(&mut o, cid(conn)),
            [
                format!("P SNAP {t0}"),
                format!("P g before {t0:x} 2711 10.0.0.5:4242 host-a/job-42"),
                "P SYNCED".into()
            ]
        );
    }
    // One turn's changes, in order, in the same bytes on both links.
    client(&mut e, &mut o, now, cid(0), "A k 5 0");
    let t1 = e.holder(b"k").unwrap().0;
    client(&mut e, &mut o, now, cid(0), &format!("N k {t1} 2"));
    client(&mut e, &mut o, now, cid(0), &format!("R k {t1}"));
    client(&mut e, &mut o, now, cid(0), &format!("R before {t0}"));
    c.flush_replication(now, &mut e, &mut o);
    let h = "10.0.0.5:4242 host-a/job-42";
    let expected =
        format!("P g k {t1:x} 1389 {h}\nP g k {t1:x} 7d1 {h}\nP x k {t1:x}\nP x before {t0:x}\n");
    // Behind the deltas, each follower's first lag probe.
    for (conn, probe) in [(20, 1), (21, 2)] {
        let out = String::from_utf8(std::mem::take(o.output_mut(cid(conn)))).unwrap();
        assert_eq!(out, format!("{expected}P PROBE {probe}\n"));
    }
    // An expiry is a release too; a turn without changes writes nothing.
    client(&mut e, &mut o, now, cid(0), "A short 0.1 0");
    let t2 = e.holder(b"short").unwrap().0;
    c.flush_replication(now, &mut e, &mut o);
    e.tick(at(now.ms + 200), &mut o);
    c.flush_replication(now, &mut e, &mut o);
    c.flush_replication(now, &mut e, &mut o);
    for conn in [20, 21] {
        assert_eq!(
            lines_of(&mut o, cid(conn)),
            [
                format!("P g short {t2:x} 65 {h}"),
                format!("P x short {t2:x}")
            ]
        );
        assert!(lines_of(&mut o, cid(conn)).is_empty());
    }
    c.check_invariants(now, &e);
}

#[test]
fn an_active_measures_each_follower_s_lag_with_a_probe_behind_its_deltas() {
    let (mut c, mut e, mut o) = active_node0();
    let ms = TIMEOUT_MS + 60;
    e.open(cid(0), &mut o);
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
    c.flush_replication(at(ms), &mut e, &mut o);
    // A snapshot alone carries no probe.
    for conn in [20, 21] {
        assert!(
            !lines_of(&mut o, cid(conn))
                .iter()
                .any(|l| l.starts_with("P PROBE"))
        );
    }
    client(&mut e, &mut o, at(ms), cid(0), "A k 5 0");
    c.flush_replication(at_us(ms, 100), &mut e, &mut o);
    let probe_1 = lines_of(&mut o, cid(20)).pop().unwrap();
    assert_eq!(probe_1, "P PROBE 1");
    assert_eq!(lines_of(&mut o, cid(21)).pop().unwrap(), "P PROBE 2");
    // Node 1 answers 2.35 ms later (on its own link to us, conn 10); an
    // answer to a probe that is not in flight counts nothing.
    c.on_message(
        at_us(ms + 2, 450),
        cid(10),
        PeerMsg::Probed { seq: 2 },
        &mut e,
        &mut o,
    )
    .unwrap();
    c.on_message(
        at_us(ms + 2, 450),
        cid(10),
        PeerMsg::Probed { seq: 1 },
        &mut e,
        &mut o,
    )
    .unwrap();
    c.on_message(
        at_us(ms + 2, 500),
        cid(10),
        PeerMsg::Probed { seq: 1 },
        &mut e,
        &mut o,
    )
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
    client(&mut e, &mut o, at(ms + 3), cid(0), &format!("R k {token}"));
    c.flush_replication(at(ms + 3), &mut e, &mut o);
    assert_eq!(lines_of(&mut o, cid(20)), [format!("P x k {token:x}")]);
    client(&mut e, &mut o, at(ms + PROBE_EVERY_MS), cid(0), "A k 5 0");
    c.flush_replication(at(ms + PROBE_EVERY_MS), &mut e, &mut o);
    assert_eq!(lines_of(&mut o, cid(20)).pop().unwrap(), "P PROBE 3");
    assert!(
        !lines_of(&mut o, cid(21))
            .iter()
            .any(|l| l.starts_with("P PROBE"))
    );
    // Unanswered within the peer timeout, node 2's probe is given up and
    // the next deltas carry a new one (node 1's, sent later, is still in
    // flight).
    let later = ms + TIMEOUT_MS + 1;
    heartbeat(&mut c, &mut e, &mut o, at(later), cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, at(later), cid(11), false, Some(0));
    let token = e.holder(b"k").unwrap().0;
    client(&mut e, &mut o, at(later), cid(0), &format!("R k {token}"));
    c.flush_replication(at_us(later, 50), &mut e, &mut o);
    assert_eq!(lines_of(&mut o, cid(21)).pop().unwrap(), "P PROBE 4");
    assert_eq!(lines_of(&mut o, cid(20)), [format!("P x k {token:x}")]);
    let two = lag_of(&c, "127.0.0.1:7002");
    assert_eq!((two.probes_lost, two.events, two.writes), (1, 4, 4));
    c.check_invariants(at_us(later, 50), &e);
}

#[test]
fn a_standby_answers_the_probes_of_the_active_it_follows_only() {
    let (mut c, mut e, mut o) = node_linked(2, 0);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(11), true, None);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(10), false, Some(1));
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    for conn in [20, 21] {
        o.output_mut(cid(conn)).clear();
    }
    c.on_message(at(3), cid(11), PeerMsg::Probe { seq: 7 }, &mut e, &mut o)
        .unwrap();
    assert_eq!(lines_of(&mut o, cid(21)), ["P PROBED 7"]);
    // A node it does not follow gets no answer: we do not apply its
    // replication.
    c.on_message(at(3), cid(10), PeerMsg::Probe { seq: 8 }, &mut e, &mut o)
        .unwrap();
    assert!(lines_of(&mut o, cid(20)).is_empty());
    assert!(lines_of(&mut o, cid(21)).is_empty());
    c.check_invariants(at(3), &e);
}

#[test]
fn only_the_link_from_the_followed_active_is_read_in_batches() {
    let (mut c, mut e, mut o) = node_linked(2, 700);
    let all = [10, 11, 20, 21, 99].map(cid);
    assert!(
        all.iter().all(|&conn| c.read_batch_us(conn) == 0),
        "following nobody yet"
    );
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(11), true, None);
    heartbeat(&mut c, &mut e, &mut o, at(2), cid(10), false, Some(1));
    assert_eq!(
        c.role(),
        Role::Standby {
            following: Some(PeerId(1))
        }
    );
    let batched: Vec<u64> = all.iter().map(|&conn| c.read_batch_us(conn)).collect();
    assert_eq!(
        batched,
        [0, 700, 0, 0, 0],
        "its link from node 1 only: not node 0's, not its own links"
    );
    // Node 1 goes away: nothing is batched any more.
    c.on_close(at(3), cid(11), &mut e, &mut o);
    c.on_close(at(3), cid(21), &mut e, &mut o);
    assert!(all.iter().all(|&conn| c.read_batch_us(conn) == 0));
    c.check_invariants(at(3), &e);
}

#[test]
fn every_turn_s_replication_goes_to_every_follower_at_once() {
    let (mut c, mut e, mut o) = active_node0();
    let ms = TIMEOUT_MS + 60;
    e.open(cid(0), &mut o);
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, Some(0));
    c.flush_replication(at(ms), &mut e, &mut o);
    for conn in [20, 21] {
        o.output_mut(cid(conn)).clear();
    }
    for (i, key) in ["a", "b", "c"].iter().enumerate() {
        let now = at_us(ms, i as u64 * 10);
        client(&mut e, &mut o, now, cid(0), &format!("A {key} 5 0"));
        c.flush_replication(now, &mut e, &mut o);
        for conn in [20, 21] {
            let lines = replication_lines(&mut o, cid(conn));
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].starts_with(&format!("P g {key} ")), "{lines:?}");
        }
    }
}
