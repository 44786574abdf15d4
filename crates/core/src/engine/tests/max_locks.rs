//! `--max-locks`: what a full lock table refuses.

use super::*;
use crate::outbox::cid;

/// A harness whose engine holds at most `max_locks` locks.
fn limited(conns: u32, max_locks: u32) -> Harness {
    let mut h = Harness::new(0);
    h.engine = Engine::with_max_locks(h.now, "127.0.0.1:7171", max_locks);
    for c in 0..conns {
        h.engine.open(cid(c), &mut h.out);
    }
    h
}

#[test]
fn a_new_key_beyond_max_locks_is_refused_and_changes_nothing() {
    let mut h = limited(3, 3);
    let a = h.grant(cid(0), "a", "10");
    let b = h.grant(cid(0), "b", "10");
    h.grant(cid(0), "c", "10");
    let full = Refusal::LockTableFull { max_locks: 3 };
    assert_eq!(h.send(cid(1), "A d 10 0"), Err(full));
    assert_eq!(h.send(cid(1), "A d 10 5"), Err(full));
    assert!(h.answers(cid(1)).is_empty());
    assert_eq!(h.engine.lock_count(), 3);
    assert!(h.engine.table.find(b"d").is_none());
    // Keys that have a lock still work: their acquires queue, releases and
    // renewals are answered; and the first waiter is granted on release.
    h.send(cid(1), "A a 10 0").unwrap();
    h.send(cid(2), "A b 10 0.1").unwrap();
    h.send(cid(0), &format!("N b {b} 10")).unwrap();
    h.send(cid(0), &format!("R a {a}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["N b 1", "R a 1"]);
    assert!(token_of(&h.answers(cid(1))[0], "a") > a);
    h.advance(101);
    assert_eq!(h.answers(cid(2)), ["T b"]);
    // A lock that goes makes room for a new key.
    h.send(cid(0), &format!("R b {b}")).unwrap();
    assert_eq!(h.engine.lock_count(), 2);
    h.grant(cid(2), "d", "10");
    assert_eq!(h.send(cid(2), "A e 10 0"), Err(full));
    assert_eq!(full.to_string(), "lock table full: 3 locks (--max-locks)");
}

#[test]
fn waiters_and_held_back_timeouts_keep_their_lock_counted() {
    let mut h = limited(3, 2);
    let a = h.grant(cid(0), "a", "10");
    // "a" is held by 0, waited for by 1 (no limit, then a held-back T).
    h.send(cid(1), "A a 10 0").unwrap();
    h.send(cid(1), "A a 10 0.1").unwrap();
    h.advance(200);
    assert!(h.answers(cid(1)).is_empty(), "the T is held back");
    h.grant(cid(2), "b", "0.5");
    assert_eq!(
        h.send(cid(2), "A c 10 0"),
        Err(Refusal::LockTableFull { max_locks: 2 })
    );
    // "b" expires: one lock left ("a": holder, waiter, held-back T).
    h.advance(501);
    assert_eq!(h.engine.lock_count(), 1);
    h.grant(cid(2), "c", "10");
    h.send(cid(0), &format!("R a {a}")).unwrap();
    let answers = h.answers(cid(1));
    assert_eq!(answers.len(), 2);
    token_of(&answers[0], "a");
    assert_eq!(answers[1], "T a");
}

#[test]
fn max_locks_is_kept_within_its_range() {
    let h = limited(0, 0);
    assert_eq!(h.engine.max_locks, 1);
    let now = h.now;
    let e = Engine::with_max_locks(now, "x:1", 5);
    assert!(e.reserved_locks() >= 5);
}

#[test]
fn a_replicated_grant_beyond_max_locks_is_refused() {
    let mut h = limited(1, 2);
    h.engine.step_down(None, &mut h.out);
    let now = h.now;
    let e = &mut h.engine;
    e.apply_grant(now, b"a", 5, 1_000, Holder::default())
        .unwrap();
    e.apply_grant(now, b"b", 6, 1_000, Holder::default())
        .unwrap();
    let full = GrantRefusal::LockTableFull { max_locks: 2 };
    assert_eq!(
        e.apply_grant(now, b"c", 7, 1_000, Holder::default()),
        Err(full)
    );
    assert_eq!(e.highest_token(), 6, "the refused token is not observed");
    // A key it has is still replaced, and a release makes room.
    e.apply_grant(now, b"a", 8, 2_000, Holder::default())
        .unwrap();
    assert_eq!(e.holder(b"a"), Some((8, now.ms + 2_000)));
    e.apply_release(now, b"b", 6, &mut Outbox::new());
    e.apply_grant(now, b"c", 9, 1_000, Holder::default())
        .unwrap();
    assert_eq!(e.lock_count(), 2);
    e.check_invariants();
    assert!(full.to_string().contains("the same on every node"));
}
