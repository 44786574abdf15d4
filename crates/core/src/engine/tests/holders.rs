//! Holders: `O`, `W` and `Q`, and the holder entries grants name.

use super::*;
use crate::outbox::cid;

#[test]
fn who_holds_and_who_waits_is_listed_with_addresses_and_owners() {
    let mut h = Harness::new(3);
    h.engine
        .set_remote(cid(0), "10.0.0.1:5000".parse().unwrap());
    h.engine.set_remote(cid(1), "[::1]:6000".parse().unwrap());
    h.send(cid(0), "O host-a/job-42").unwrap();
    assert_eq!(h.answers(cid(0)), ["O host-a/job-42"]);
    let t = h.grant(cid(0), "k", "10");
    h.advance(1_500);
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(2), "A k 10 0").unwrap();
    h.advance(500);
    h.send(cid(2), "W 0 10").unwrap();
    let held_ms = (h.now.unix_ns - t) / 1_000_000;
    assert_eq!(held_ms, 2_000, "the fixed clock moves with the test's");
    assert_eq!(
        h.answers(cid(2)),
        [
            format!("K k {t} 8001 2 2000 10.0.0.1:5000 host-a/job-42"),
            "W 0".to_string()
        ]
    );
    // `L` is unchanged: an existing parser sees today's fields.
    h.send(cid(2), "L 0 10").unwrap();
    assert_eq!(
        h.answers(cid(2)),
        [format!("K k {t} 8001 2"), "L 0".to_string()]
    );
    h.send(cid(0), "Q k").unwrap();
    assert_eq!(
        h.answers(cid(0)),
        [
            format!("K k {t} 8001 2 2000 10.0.0.1:5000 host-a/job-42"),
            "J 500 [::1]:6000 -".to_string(),
            "J 500 - -".to_string(),
            "Q k 2".to_string(),
        ]
    );
    h.send(cid(0), "Q nothing").unwrap();
    assert_eq!(h.answers(cid(0)), ["Q nothing 0"]);
    // A new label counts for later grants; the grant keeps its holder.
    h.send(cid(0), "O host-a/job-43").unwrap();
    assert_eq!(h.answers(cid(0)), ["O host-a/job-43"]);
    let t2 = h.grant(cid(0), "k2", "10");
    h.send(cid(0), "W 0 10 k2").unwrap();
    assert_eq!(
        h.answers(cid(0))[..1],
        [format!("K k2 {t2} 10001 0 0 10.0.0.1:5000 host-a/job-43")]
    );
    h.send(cid(0), "W 0 10 k").unwrap();
    assert!(h.answers(cid(0))[0].ends_with(" host-a/job-42"));
    // The holder outlives its connection; its entry goes with its grants.
    h.engine.close(cid(0), &mut h.out);
    h.check();
    h.send(cid(2), "W 0 1 k").unwrap();
    assert!(h.answers(cid(2))[0].ends_with(" 10.0.0.1:5000 host-a/job-42"));
    h.send(cid(2), &format!("R k {t}")).unwrap();
    h.send(cid(2), &format!("R k2 {t2}")).unwrap();
    let answers = h.answers(cid(1));
    assert_eq!(answers.len(), 1, "the head waiter got k: {answers:?}");
    h.engine.close(cid(1), &mut h.out);
    h.engine.close(cid(2), &mut h.out);
    h.check();
    // Waiter 2 was withdrawn with its connection; the grant to connection
    // 1 stays, and names its holder: the only entry left.
    assert_eq!(h.engine.holder_count(), 1);
    assert_eq!(
        h.engine.holder_of(b"k").unwrap(),
        Holder {
            addr: Some(b"[::1]:6000"),
            owner: None,
            identity: None,
        }
    );
}

#[test]
fn replicated_holders_are_interned_once_and_freed_with_their_last_grant() {
    let now = Now {
        ms: 1_000,
        us: 1_000_000,
        unix_ns: 1_700_000_000_000_000_000,
    };
    let mut e = Engine::new(now, "127.0.0.1:7171");
    e.step_down(Some("127.0.0.1:7172"), &mut Outbox::new());
    let holder = Holder {
        addr: Some(b"10.0.0.1:5000"),
        owner: Some(b"job"),
        identity: None,
    };
    for (i, key) in [&b"a"[..], b"b", b"c"].into_iter().enumerate() {
        e.apply_grant(now, key, 10 + i as u64, 1_000, holder)
            .unwrap();
    }
    // A renewal names the same holder again.
    e.apply_grant(now, b"a", 10, 2_000, holder).unwrap();
    e.check_invariants();
    assert_eq!(e.holder_count(), 1);
    assert_eq!(e.holder_of(b"b"), Some(holder));
    e.apply_grant(now, b"d", 20, 1_000, Holder::default())
        .unwrap();
    assert_eq!(e.holder_of(b"d"), Some(Holder::default()));
    e.apply_release(now, b"a", 10, &mut Outbox::new());
    e.apply_release(now, b"b", 11, &mut Outbox::new());
    e.check_invariants();
    assert_eq!(e.holder_count(), 1);
    e.clear_grants();
    e.check_invariants();
    assert_eq!(e.holder_count(), 0);
}

/// A connection that sets a new label before each grant has one holder
/// entry per label its grants still use, no more: each goes with the last
/// grant naming it (release or expiry), the connection's own with it.
/// Many connections that come and go leave nothing behind.
#[test]
fn owner_labels_are_freed_with_the_last_grant_that_names_them() {
    let mut h = Harness::new(2);
    h.engine
        .set_remote(cid(0), "10.0.0.1:5000".parse().unwrap());
    let mut tokens = Vec::new();
    for i in 0..200 {
        h.send(cid(0), &format!("O {}{i}", "o".repeat(120)))
            .unwrap();
        // Labels set and replaced without a grant in between cost nothing.
        h.send(cid(0), &format!("O label-{i}")).unwrap();
        h.answers(cid(0));
        tokens.push(h.grant(cid(0), &format!("k{i}"), "1"));
    }
    h.answers(cid(0));
    h.check();
    assert_eq!(h.engine.holder_count(), 200);
    // Half released, the other half expire.
    for (i, t) in tokens.iter().enumerate().take(100) {
        h.send(cid(1), &format!("R k{i} {t}")).unwrap();
    }
    h.check();
    assert_eq!(h.engine.holder_count(), 100);
    h.advance(1_100);
    h.check();
    // The connection's own entry: its label stays for its next grant.
    assert_eq!(h.engine.holder_count(), 1);
    h.engine.close(cid(0), &mut h.out);
    assert_eq!(h.engine.holder_count(), 0);
    for _ in 0..100 {
        h.engine.open(cid(0), &mut h.out);
        h.send(cid(0), "O x").unwrap();
        h.answers(cid(0));
        let t = h.grant(cid(0), "k", "10");
        h.send(cid(0), &format!("R k {t}")).unwrap();
        h.engine.close(cid(0), &mut h.out);
    }
    h.check();
    assert_eq!(h.engine.holder_count(), 0);
}

/// `O`, `W` and `Q` behind a waiting acquire on the same connection are
/// answered at once, in order (docs/protocol.md, section 6): nothing waits
/// for the acquire.
#[test]
fn owner_and_listings_behind_a_waiting_acquire_are_answered_at_once() {
    let mut h = Harness::new(2);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(1), "O later").unwrap();
    h.send(cid(1), "Q k").unwrap();
    h.send(cid(1), "W 0 1 k").unwrap();
    assert_eq!(
        h.answers(cid(1)),
        [
            "O later".to_string(),
            format!("K k {t} 10001 1 0 - -"),
            "J 0 - later".to_string(),
            "Q k 1".to_string(),
            format!("K k {t} 10001 1 0 - -"),
            "W 0".to_string(),
        ]
    );
    h.send(cid(0), &format!("R k {t}")).unwrap();
    let granted = h.answers(cid(1));
    assert_eq!(granted.len(), 1, "{granted:?}");
    h.send(cid(0), "Q k").unwrap();
    let q = h.answers(cid(0));
    assert_eq!(q[0], "R k 1");
    assert!(
        q[1].ends_with(" - later"),
        "the grant took the label: {q:?}"
    );
}
