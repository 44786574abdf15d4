//! Fencing token exhaustion: what is refused and answered when no token
//! is left.

use super::*;
use crate::outbox::cid;

/// A harness whose token clock has issued or seen everything up to
/// `MAX_TOKEN - left`: `left` more grants are possible.
fn near_exhaustion(conns: u32, left: u64) -> Harness {
    let mut h = Harness::new(conns);
    h.engine.observe_token(token::MAX_TOKEN - left);
    h
}

#[test]
fn an_acquire_without_a_token_left_is_refused_and_leaves_nothing() {
    let mut h = near_exhaustion(2, 1);
    assert_eq!(h.grant(cid(0), "k", "10"), token::MAX_TOKEN);
    assert_eq!(h.send(cid(1), "A free 10 0"), Err(Refusal::TokensExhausted));
    assert!(h.answers(cid(1)).is_empty());
    assert_eq!(h.engine.lock_count(), 1, "the refused key left no lock");
    assert!(h.engine.table.find(b"free").is_none());
    // Nothing else changed: the grant is live, releases and renewals work,
    // and an acquire of a held key still queues (it needs no token yet).
    h.send(cid(1), &format!("N k {} 10", token::MAX_TOKEN))
        .unwrap();
    h.send(cid(1), "S").unwrap();
    assert_eq!(
        h.answers(cid(1)),
        [
            "N k 1".to_string(),
            format!("S active 127.0.0.1:7171 {}", token::MAX_TOKEN)
        ]
    );
    assert_eq!(h.send(cid(1), "A k 10 0"), Ok(()));
    assert!(h.answers(cid(1)).is_empty());
}

#[test]
fn the_refusal_says_why() {
    assert_eq!(
        Refusal::TokensExhausted.to_string(),
        "fencing tokens exhausted: token 9223372036854775807 was issued or seen, \
         nothing can be granted"
    );
}

#[test]
fn a_release_without_a_token_left_times_out_every_waiter() {
    let mut h = near_exhaustion(4, 1);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(2), "A k 10 5").unwrap();
    h.send(cid(3), "A k 10 0").unwrap();
    h.send(cid(0), &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
    for c in 1..4 {
        assert_eq!(h.answers(cid(c)), ["T k"], "connection {c}");
    }
    assert_eq!(h.engine.lock_count(), 0, "the lock left the table");
    // The cancelled wait timer of connection 2 does not fire later.
    h.advance(10_000);
    assert!(h.answers(cid(2)).is_empty());
    assert_eq!(h.engine.next_deadline(), None);
}

#[test]
fn a_lease_expiry_without_a_token_left_times_out_every_waiter() {
    let mut h = near_exhaustion(3, 1);
    h.grant(cid(0), "k", "1");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(2), "A k 10 0").unwrap();
    h.advance(1_001);
    assert_eq!(h.answers(cid(1)), ["T k"]);
    assert_eq!(h.answers(cid(2)), ["T k"]);
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn exhaustion_keeps_rule_3_on_one_connection() {
    // Connection 1: an acquire without limit, then one that times out and
    // is held back behind it, then another without limit. When no token is
    // left at the release, all three are answered T, in order.
    let mut h = near_exhaustion(2, 1);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(1), "A k 10 0.1").unwrap();
    h.send(cid(1), "A k 10 0").unwrap();
    h.advance(200);
    assert!(h.answers(cid(1)).is_empty(), "the T is held back");
    h.send(cid(0), &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(cid(1)), ["T k", "T k", "T k"]);
    assert_eq!(h.engine.table.conn_len(cid(1)), 0);
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn the_last_token_is_handed_off_then_waiters_time_out() {
    let mut h = near_exhaustion(3, 2);
    let t = h.grant(cid(0), "k", "10");
    assert_eq!(t, token::MAX_TOKEN - 1);
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(2), "A k 10 0").unwrap();
    h.send(cid(0), &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(cid(1)), [format!("A k {}", token::MAX_TOKEN)]);
    assert!(
        h.answers(cid(2)).is_empty(),
        "still waiting behind the last grant"
    );
    h.send(cid(1), &format!("R k {}", token::MAX_TOKEN))
        .unwrap();
    assert_eq!(h.answers(cid(2)), ["T k"]);
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn a_wall_clock_beyond_the_token_space_grants_once_then_refuses() {
    let mut h = Harness::new(1);
    h.now.unix_ns = u64::MAX;
    assert_eq!(h.grant(cid(0), "a", "10"), token::MAX_TOKEN);
    assert_eq!(h.send(cid(0), "A b 10 0"), Err(Refusal::TokensExhausted));
}
