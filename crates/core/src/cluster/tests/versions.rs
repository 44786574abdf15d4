//! Peer protocol versions: a peer of an older release is dialed with its
//! version, and only a refusal lowers the version a node dials with.

use super::*;
use crate::outbox::cid;

/// Peer `peer` refuses each `HELLO` newer than [`wire::MIN_VERSION`] as a
/// node of the oldest release does, on links `first_conn` on: each refusal
/// lowers the version this node dials it with by one.
fn refuse_newer_versions(
    c: &mut Cluster,
    e: &mut Engine,
    o: &mut Outbox,
    peer: usize,
    first_conn: ConnId,
) {
    for (conn, refused) in (first_conn.get()..)
        .map(ConnId::new)
        .zip((wire::MIN_VERSION + 1..=wire::VERSION).rev())
    {
        dial_out(c, e, o, at(0), conn, peer);
        let hello = lines_of(o, conn);
        assert!(
            hello[0].starts_with(&format!("P HELLO {refused} ")),
            "{hello:?}"
        );
        let refusal = format!(
            "E peer protocol version \"{refused}\" unsupported (this node speaks 2): run \
             the same ringlock release on every node in line 1"
        );
        assert!(c.on_refusal(at(0), conn, refusal.as_bytes()).is_err());
        c.on_close(at(0), conn, e, o);
        e.close(conn, o);
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
    let (mut c, mut e, mut o) = node(0);
    dial_out(&mut c, &mut e, &mut o, at(0), cid(20), 1);
    Remote::new(1)
        .accept(&mut c, &mut e, &mut o, at(0), cid(20))
        .unwrap();
    refuse_newer_versions(&mut c, &mut e, &mut o, 2, cid(30));
    dial_out(&mut c, &mut e, &mut o, at(200), cid(22), 2);
    let hello = String::from_utf8(o.output_mut(cid(22)).clone()).unwrap();
    assert!(hello.starts_with("P HELLO 2 "), "{hello}");
    let mut old = Remote::new(2);
    old.version = 2;
    old.accept(&mut c, &mut e, &mut o, at(200), cid(22))
        .unwrap();
    link_in(&mut c, &mut e, &mut o, at(201), cid(10), 1);
    old.dial(&mut c, &mut e, &mut o, at(201), cid(11)).unwrap();
    for ms in (202..=TIMEOUT_MS + 250).step_by(50) {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(11), false, None);
        c.tick(at(ms), &mut e, &mut o);
    }
    assert_eq!(c.role(), Role::Active);
    let now = at(TIMEOUT_MS + 300);
    e.open(cid(0), &mut o);
    e.set_remote(cid(0), "10.0.0.5:4242".parse().unwrap());
    client(&mut e, &mut o, now, cid(0), "O job-1");
    client(&mut e, &mut o, now, cid(0), "A k 10 0");
    let t = e.holder(b"k").unwrap().0;
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, Some(0));
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, Some(0));
    for conn in [20, 22] {
        o.output_mut(cid(conn)).clear();
    }
    c.flush_replication(now, &mut e, &mut o);
    assert_eq!(
        lines_of(&mut o, cid(20))[1],
        format!("P g k {t:x} 2711 10.0.0.5:4242 job-1")
    );
    assert_eq!(lines_of(&mut o, cid(22))[1], format!("P G k {t} 10001"));
    client(&mut e, &mut o, now, cid(0), &format!("N k {t} 5"));
    c.flush_replication(now, &mut e, &mut o);
    // A lag probe behind the deltas on the newest link only.
    assert_eq!(
        lines_of(&mut o, cid(20)),
        [
            format!("P g k {t:x} 1389 10.0.0.5:4242 job-1"),
            "P PROBE 1".into()
        ]
    );
    assert_eq!(lines_of(&mut o, cid(22)), [format!("P G k {t} 5001")]);
    c.check_invariants(now, &e);
    // Node 2 cannot learn shared grants and permits: while it follows,
    // G and C are refused.
    for line in ["G s 10 0", "C p 2 10 0"] {
        assert_eq!(
            try_client(&mut e, &mut o, now, cid(0), line),
            Err(Refusal::FollowerTooOld)
        );
    }
    // Node 2 comes back upgraded: its new link says the newest version,
    // and ours to it is given up to be dialed again with it.
    let mut new = Remote::new(2);
    new.incarnation = 2;
    new.dial(&mut c, &mut e, &mut o, now, cid(12)).unwrap();
    let mut doomed = Vec::new();
    c.take_doomed(&mut doomed);
    assert!(
        doomed
            .iter()
            .any(|(conn, why)| *conn == cid(22)
                && why.contains(&format!("version {}", wire::VERSION))),
        "{doomed:?}"
    );
    c.on_close(now, cid(22), &mut e, &mut o);
    e.close(cid(22), &mut o);
    let mut dials = Vec::new();
    c.take_dials(at(now.ms + 200), &mut dials);
    assert!(dials.iter().any(|&(p, _)| p == PeerId(2)), "{dials:?}");
    dial_out(&mut c, &mut e, &mut o, at(now.ms + 200), cid(23), 2);
    let hello = String::from_utf8(o.output_mut(cid(23)).clone()).unwrap();
    assert!(
        hello.starts_with(&format!("P HELLO {} ", wire::VERSION)),
        "{hello}"
    );
    // With no follower below version 5 left, G is served again.
    c.flush_replication(at(now.ms + 200), &mut e, &mut o);
    client(&mut e, &mut o, at(now.ms + 200), cid(0), "G s 10 0");
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
    let (mut c, mut e, mut o) = node(0);
    let mut peer = Remote::new(1);
    peer.version = 2;
    peer.dial(&mut c, &mut e, &mut o, at(0), cid(10)).unwrap();
    dial_out(&mut c, &mut e, &mut o, at(1), cid(20), 1);
    let hello = lines_of(&mut o, cid(20));
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
    assert!(c.on_refusal(at(2), cid(20), refusal.as_bytes()).is_err());
    c.on_close(at(2), cid(20), &mut e, &mut o);
    e.close(cid(20), &mut o);
    let mut old = Remote::new(1);
    old.version = 2;
    old.incarnation = 2;
    old.dial(&mut c, &mut e, &mut o, at(3), cid(11)).unwrap();
    dial_out(&mut c, &mut e, &mut o, at(300), cid(21), 1);
    let hello = lines_of(&mut o, cid(21));
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
    let (mut c, mut e, mut o) = node(0);
    dial_out(&mut c, &mut e, &mut o, at(0), cid(20), 1);
    Remote::new(1)
        .accept(&mut c, &mut e, &mut o, at(0), cid(20))
        .unwrap();
    let hello = b"P HELLO 2 0123456789abcdef 1 127.0.0.1:7001 1 00000000000000000000000000000000";
    let msg = wire::parse(hello).unwrap();
    assert!(c.on_message(at(1), cid(20), msg, &mut e, &mut o).is_err());
    let refusal = b"E peer protocol version \"4\" unsupported (this node speaks 2 to 3) in line 1";
    assert!(c.on_refusal(at(1), cid(20), refusal).is_err());
    c.on_close(at(1), cid(20), &mut e, &mut o);
    e.close(cid(20), &mut o);
    dial_out(&mut c, &mut e, &mut o, at(300), cid(21), 1);
    let hello = lines_of(&mut o, cid(21));
    assert!(
        hello[0].starts_with(&format!("P HELLO {} ", wire::VERSION)),
        "{hello:?}"
    );
}

/// Every grant of `e`, exclusive, shared and permits, as text, sorted.
fn all_grants(e: &Engine, now: Now) -> Vec<String> {
    let mut grants: Vec<String> = e
        .snapshot(now)
        .chain(e.member_snapshot(now))
        .map(|g| format!("{g:?}"))
        .collect();
    grants.sort();
    grants
}

/// A standby (node 1) that follows node 0 and has applied `lines` (a
/// snapshot, then deltas) as they came from it: its grants, sorted, and
/// its highest token.
fn standby_after(lines: &[u8], now: Now) -> (Vec<String>, u64) {
    let (mut c, mut e, mut o) = node(1);
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 0);
    heartbeat(&mut c, &mut e, &mut o, at(1), cid(10), true, None);
    for line in lines.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let msg = wire::parse(line).unwrap();
        c.on_message(now, cid(10), msg, &mut e, &mut o).unwrap();
    }
    assert!(c.synced);
    (all_grants(&e, now), e.highest_token())
}

/// What an active replicates to a follower of version 6 (`P g`, `P x`, in
/// hex) and to one of version 5 (`P G`, `P X`) leaves both with its own
/// table: the same grants, tokens, leases and holders.
#[test]
fn version_6_and_version_5_replication_apply_to_the_same_state() {
    let (c, mut e, mut o) = active_node0();
    let now = at(TIMEOUT_MS + 60);
    e.open(cid(0), &mut o);
    e.set_remote(cid(0), "10.0.0.5:4242".parse().unwrap());
    client(&mut e, &mut o, now, cid(0), "O host-a/job-42");
    client(&mut e, &mut o, now, cid(0), "A before 10 0");
    client(&mut e, &mut o, now, cid(0), "A gone 10 0");
    e.open(cid(1), &mut o);
    client(&mut e, &mut o, now, cid(1), "A other 86399 0");
    let mut log = crate::engine::ReplicationLog::new();
    e.take_replication(&mut log);
    let mut v5 = super::super::replication::encode_snapshot(now, &e, wire::HEX_VERSION - 1);
    let mut v6 = super::super::replication::encode_snapshot(now, &e, wire::HEX_VERSION);
    // Then a turn's changes: a grant, a renewal, releases.
    client(&mut e, &mut o, now, cid(0), "A k 5 0");
    let t = e.holder(b"k").unwrap().0;
    client(&mut e, &mut o, now, cid(0), &format!("N k {t} 2"));
    let gone = e.holder(b"gone").unwrap().0;
    client(&mut e, &mut o, now, cid(0), &format!("R gone {gone}"));
    client(&mut e, &mut o, now, cid(1), "A k2 1 0");
    e.take_replication(&mut log);
    for event in log.iter() {
        wire::encode_replication(&mut v5, event, wire::HEX_VERSION - 1);
        wire::encode_replication(&mut v6, event, wire::HEX_VERSION);
    }
    let text = String::from_utf8_lossy(&v6);
    assert!(text.contains("P g ") && text.contains("P x "), "{text}");
    assert!(!text.contains("P G ") && !text.contains("P X "), "{text}");
    let (old, new) = (standby_after(&v5, now), standby_after(&v6, now));
    assert_eq!(old, new);
    assert_eq!(new, (all_grants(&e, now), e.highest_token()));
    assert_eq!(new.0.len(), 4, "{:?}", new.0);
    drop(c);
}

/// A grant of the longest lease a client may ask for (86400 s) ends 1 ms
/// after it on the active (its deadline rounds up), yet what the active
/// replicates of it, in a snapshot and in a turn's changes, at every
/// version a follower may speak, is within the bound every follower
/// accepts: the link stays up and the standby holds the grant.
#[test]
fn the_longest_lease_replicates_within_the_followers_bound() {
    for version in [wire::HEX_VERSION, wire::HEX_VERSION - 1, 3, 2] {
        let (c, mut e, mut o) = active_node0();
        let now = at(TIMEOUT_MS + 60);
        e.open(cid(0), &mut o);
        e.set_remote(cid(0), "10.0.0.5:4242".parse().unwrap());
        client(&mut e, &mut o, now, cid(0), "A before 86400 0");
        let mut log = crate::engine::ReplicationLog::new();
        e.take_replication(&mut log);
        let mut lines = super::super::replication::encode_snapshot(now, &e, version);
        client(&mut e, &mut o, now, cid(0), "A k 86400 0");
        client(&mut e, &mut o, now, cid(0), "G s 86400 0");
        client(&mut e, &mut o, now, cid(0), "C p 2 86400 0");
        e.take_replication(&mut log);
        for event in log.iter() {
            wire::encode_replication(&mut lines, event, version);
        }
        let (grants, _) = standby_after(&lines, now);
        let expected = if version >= wire::SHARED_VERSION {
            4
        } else {
            2
        };
        assert_eq!(grants.len(), expected, "version {version}: {grants:?}");
        drop(c);
    }
}

/// While every follower speaks the newest version the active records a
/// turn's changes as their lines at once; a follower of an older release
/// that joins gets its snapshot, and from the next turn on its own form
/// of each change, while the other keeps getting the newest; once it has
/// gone, the newest lines alone again.
#[test]
fn an_older_follower_joining_and_leaving_gets_its_own_form_of_each_change() {
    let (mut c, mut e, mut o) = node(0);
    dial_out(&mut c, &mut e, &mut o, at(0), cid(20), 1);
    Remote::new(1)
        .accept(&mut c, &mut e, &mut o, at(0), cid(20))
        .unwrap();
    link_in(&mut c, &mut e, &mut o, at(1), cid(10), 1);
    for ms in (2..=TIMEOUT_MS + 50).step_by(50) {
        heartbeat(&mut c, &mut e, &mut o, at(ms), cid(10), false, None);
        c.tick(at(ms), &mut e, &mut o);
    }
    assert_eq!(c.role(), Role::Active);
    let mut now = at(TIMEOUT_MS + 60);
    heartbeat(&mut c, &mut e, &mut o, now, cid(10), false, Some(0));
    c.flush_replication(now, &mut e, &mut o);
    o.output_mut(cid(20)).clear();
    e.open(cid(0), &mut o);
    let grant = |c: &mut Cluster, e: &mut Engine, o: &mut Outbox, now: Now, key: &str| {
        client(e, o, now, cid(0), &format!("A {key} 10 0"));
        c.flush_replication(now, e, o);
        e.holder(key.as_bytes()).unwrap().0
    };
    // Node 1 alone: the newest lines.
    let t = grant(&mut c, &mut e, &mut o, now, "a");
    assert_eq!(
        lines_of(&mut o, cid(20))[0],
        format!("P g a {t:x} 2711 - -")
    );

    // Node 2, of the oldest release, joins and follows.
    refuse_newer_versions(&mut c, &mut e, &mut o, 2, cid(30));
    dial_out(&mut c, &mut e, &mut o, now, cid(22), 2);
    let mut old = Remote::new(2);
    old.version = 2;
    old.accept(&mut c, &mut e, &mut o, now, cid(22)).unwrap();
    old.dial(&mut c, &mut e, &mut o, now, cid(11)).unwrap();
    heartbeat(&mut c, &mut e, &mut o, now, cid(11), false, Some(0));
    o.output_mut(cid(22)).clear();
    // A change in the turn node 2 gets its snapshot: node 1 its line, node
    // 2 the change within the snapshot.
    let t = grant(&mut c, &mut e, &mut o, now, "b");
    assert_eq!(
        lines_of(&mut o, cid(20))[0],
        format!("P g b {t:x} 2711 - -")
    );
    let snapshot = lines_of(&mut o, cid(22));
    assert!(snapshot[0].starts_with("P SNAP "), "{snapshot:?}");
    assert!(
        snapshot.contains(&format!("P G b {t} 10001")),
        "{snapshot:?}"
    );
    // The next turn: each its own form.
    now = at(now.ms + 1);
    let t = grant(&mut c, &mut e, &mut o, now, "c");
    assert_eq!(
        lines_of(&mut o, cid(20))[0],
        format!("P g c {t:x} 2711 - -")
    );
    assert_eq!(lines_of(&mut o, cid(22)), [format!("P G c {t} 10001")]);

    // Node 2 goes: the newest lines alone again.
    for conn in [cid(22), cid(11)] {
        c.on_close(now, conn, &mut e, &mut o);
        e.close(conn, &mut o);
    }
    c.flush_replication(now, &mut e, &mut o);
    now = at(now.ms + 1);
    let t = grant(&mut c, &mut e, &mut o, now, "d");
    assert_eq!(
        lines_of(&mut o, cid(20))[0],
        format!("P g d {t:x} 2711 - -")
    );
    c.check_invariants(now, &e);
}
