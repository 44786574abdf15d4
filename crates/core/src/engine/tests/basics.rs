//! Grants, waiters, timeouts, closes, `S` and stepping down; random
//! operations against the invariants.

use super::*;
use crate::outbox::cid;
use crate::proto::Request;

#[test]
fn grant_release_and_stale_tokens() {
    let mut h = Harness::new(1);
    let t = h.grant(cid(0), "k", "10");
    assert!(t >= h.now.unix_ns);
    h.send(cid(0), &format!("R k {t}")).unwrap();
    h.send(cid(0), &format!("R k {t}")).unwrap();
    h.send(cid(0), &format!("N k {t} 10")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1", "R k 0", "N k 0"]);
    assert_eq!(h.engine.lock_count(), 0, "a free lock leaves the table");
}

#[test]
fn waiters_are_granted_in_arrival_order_with_growing_tokens() {
    let mut h = Harness::new(4);
    let mut token = h.grant(cid(0), "k", "10");
    for c in 1..4 {
        h.send(cid(c), "A k 10 0").unwrap();
        assert!(h.answers(cid(c)).is_empty());
    }
    for c in 1..4 {
        h.send(cid(0), &format!("R k {token}")).unwrap();
        assert_eq!(h.answers(cid(0)), ["R k 1"]);
        let answers = h.answers(cid(c));
        assert_eq!(answers.len(), 1);
        let next = token_of(&answers[0], "k");
        assert!(next > token);
        token = next;
        for other in (c + 1)..4 {
            assert!(h.answers(cid(other)).is_empty(), "only the head is granted");
        }
    }
}

#[test]
fn lease_expiry_hands_over_and_the_old_token_is_dead() {
    let mut h = Harness::new(2);
    let old = h.grant(cid(0), "k", "0.5");
    h.send(cid(1), "A k 10 0").unwrap();
    h.advance(500);
    assert!(
        h.answers(cid(1)).is_empty(),
        "the lease runs its full length"
    );
    h.advance(1);
    let new = token_of(&h.answers(cid(1))[0], "k");
    assert!(new > old);
    h.send(cid(0), &format!("R k {old}")).unwrap();
    h.send(cid(0), &format!("N k {old} 1")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 0", "N k 0"]);
}

#[test]
fn renew_moves_the_expiry_and_keeps_the_token() {
    let mut h = Harness::new(2);
    let t = h.grant(cid(0), "k", "1");
    h.advance(900);
    h.send(cid(0), &format!("N k {t} 2")).unwrap();
    assert_eq!(h.answers(cid(0)), ["N k 1"]);
    h.send(cid(1), "A k 1 0").unwrap();
    h.advance(1_900);
    assert!(h.answers(cid(1)).is_empty());
    h.advance(200);
    assert!(token_of(&h.answers(cid(1))[0], "k") > t);
}

#[test]
fn a_timed_out_waiter_is_never_granted() {
    let mut h = Harness::new(3);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0.3").unwrap();
    h.send(cid(2), "A k 10 0").unwrap();
    h.advance(299);
    assert!(h.answers(cid(1)).is_empty());
    h.advance(2);
    assert_eq!(h.answers(cid(1)), ["T k"]);
    h.send(cid(0), &format!("R k {t}")).unwrap();
    assert!(h.answers(cid(1)).is_empty());
    assert_eq!(h.answers(cid(2)).len(), 1, "the next waiter got it");
}

#[test]
fn a_later_timeout_waits_for_the_earlier_acquire_of_the_same_key() {
    let mut h = Harness::new(2);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(1), "A k 10 0.2").unwrap();
    h.send(cid(1), "A other 10 0").unwrap();
    assert_eq!(h.answers(cid(1)).len(), 1, "other is granted at once");
    h.advance(500);
    assert!(
        h.answers(cid(1)).is_empty(),
        "T held back behind the first acquire"
    );
    h.send(cid(0), &format!("R k {t}")).unwrap();
    let answers = h.answers(cid(1));
    assert_eq!(answers.len(), 2);
    token_of(&answers[0], "k");
    assert_eq!(answers[1], "T k");
}

#[test]
fn held_back_timeouts_come_out_in_order_when_the_first_times_out() {
    let mut h = Harness::new(2);
    h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 1").unwrap();
    h.send(cid(1), "A k 10 0.2").unwrap();
    h.send(cid(1), "A k 10 0.1").unwrap();
    h.send(cid(1), "A k 10 0").unwrap();
    h.advance(300);
    assert!(h.answers(cid(1)).is_empty());
    h.advance(800);
    assert_eq!(h.answers(cid(1)), ["T k", "T k", "T k"]);
    assert_eq!(
        h.engine.table.conn_len(cid(1)),
        1,
        "the no-limit acquire still waits"
    );
}

#[test]
fn closing_a_connection_withdraws_its_waiters_but_not_its_grants() {
    let mut h = Harness::new(3);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(1), "A k 10 0.1").unwrap();
    h.send(cid(2), "A k 10 0").unwrap();
    h.engine.close(cid(1), &mut h.out);
    h.check();
    h.engine.close(cid(0), &mut h.out);
    h.engine.open(cid(0), &mut h.out);
    h.send(cid(0), &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
    assert_eq!(
        h.answers(cid(2)).len(),
        1,
        "the withdrawn waiter was skipped"
    );
    h.advance(1_000);
    assert!(h.answers(cid(2)).is_empty());
}

#[test]
fn the_4097th_waiting_acquire_is_refused() {
    let mut h = Harness::new(2);
    h.grant(cid(0), "k", "10");
    for _ in 0..MAX_WAITING_PER_CONN {
        h.send(cid(1), "A k 10 0").unwrap();
    }
    assert_eq!(h.send(cid(1), "A k 10 0"), Err(Refusal::TooManyWaiting));
    // A grant does not count: a free key is still granted.
    h.send(cid(1), "A free 10 0").unwrap();
    assert_eq!(h.answers(cid(1)).len(), 1);
}

#[test]
fn requests_at_the_bounds_of_the_parser_set_timers_without_trouble() {
    // The parser lets through leases and waits of 86400 s; the wheel takes
    // them, and longer ones too (see the wheel's parking).
    let mut h = Harness::new(2);
    let t = h.grant(cid(0), "k", "86400");
    h.send(cid(1), "A k 86400 86399.999").unwrap();
    h.send(cid(0), &format!("N k {t} 86400")).unwrap();
    assert_eq!(h.answers(cid(0)), ["N k 1"]);
    let far = Request::Acquire {
        key: b"far",
        lease_ms: u64::MAX,
        wait_ms: u64::MAX,
    };
    h.engine.handle(h.now, cid(1), far, &mut h.out).unwrap();
    assert_eq!(token_of(&h.answers(cid(1))[0], "far"), t + 1);
    h.advance(MAX_LEASE_MS);
    assert_eq!(
        h.answers(cid(1)),
        ["T k"],
        "the wait ran out before the lease"
    );
    assert_eq!(h.engine.holder(b"k").map(|g| g.0), Some(t));
    assert!(h.engine.holder(b"far").is_some(), "a lease of u64::MAX ms");
    h.check();
}

#[test]
fn status_reports_role_address_and_highest_token() {
    let mut h = Harness::new(1);
    h.send(cid(0), "S").unwrap();
    assert_eq!(h.answers(cid(0)), ["S active 127.0.0.1:7171 0"]);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(0), "S").unwrap();
    assert_eq!(h.answers(cid(0)), [format!("S active 127.0.0.1:7171 {t}")]);
}

#[test]
fn stepping_down_answers_every_waiter_then_redirects() {
    let mut h = Harness::new(2);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 10 0").unwrap();
    h.send(cid(1), "A k 10 0.1").unwrap();
    h.send(cid(1), "A j 10 0").unwrap();
    h.advance(200);
    let j = token_of(&h.answers(cid(1))[0], "j");
    h.engine.step_down(Some("10.0.0.2:7171"), &mut h.out);
    h.check();
    assert_eq!(h.answers(cid(1)), ["M k 10.0.0.2:7171", "T k"]);
    h.send(cid(0), &format!("R k {t}")).unwrap();
    h.send(cid(0), "A x 1 0").unwrap();
    h.send(cid(0), "S").unwrap();
    assert_eq!(
        h.answers(cid(0)),
        [
            "M k 10.0.0.2:7171",
            "M x 10.0.0.2:7171",
            &format!("S standby 10.0.0.2:7171 {j}")
        ]
    );
}

/// Random requests, timeouts and disconnects over a few keys; the table's
/// invariants hold after every step, at most one grant per key is live, and
/// tokens only grow.
#[test]
fn random_operations_keep_the_invariants() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let conns = 6;
    let mut h = Harness::new(conns);
    let mut held: Vec<Option<u64>> = vec![None; 4];
    let mut last_token = 0;
    for step in 0..20_000 {
        let key = (next() % 4) as usize;
        let conn = cid((next() % conns as u64) as u32);
        match next() % 10 {
            0..=3 => {
                let wait = ["0", "0.005", "0.05"][(next() % 3) as usize];
                let lease = ["0.01", "0.1", "1"][(next() % 3) as usize];
                let _ = h.send(conn, &format!("A k{key} {lease} {wait}"));
            }
            4..=5 => {
                if let Some(t) = held[key] {
                    h.send(conn, &format!("R k{key} {t}")).unwrap();
                }
            }
            6 => {
                if let Some(t) = held[key] {
                    h.send(conn, &format!("N k{key} {t} 0.05")).unwrap();
                }
            }
            7..=8 => h.advance(next() % 20),
            _ => {
                if step % 7 == 0 {
                    h.engine.close(conn, &mut h.out);
                    h.engine.open(conn, &mut h.out);
                    h.check();
                }
            }
        }
        // Read every connection's answers and track the holders. Grants of
        // one step may reach connections in any order; each is above every
        // token of the steps before.
        let mut step_max = last_token;
        for c in 0..conns {
            for answer in h.answers(cid(c)) {
                let fields: Vec<&str> = answer.split(' ').collect();
                let k: usize = fields[1][1..].parse().unwrap();
                match fields[0] {
                    "A" => {
                        let t: u64 = fields[2].parse().unwrap();
                        assert!(t > last_token, "tokens only grow");
                        step_max = step_max.max(t);
                        held[k] = Some(t);
                    }
                    "R" if fields[2] == "1" => held[k] = None,
                    _ => {}
                }
            }
        }
        last_token = step_max;
        for (k, t) in held.iter_mut().enumerate() {
            // A lease may have run out: the table is the truth.
            let live = h
                .engine
                .table
                .find(format!("k{k}").as_bytes())
                .and_then(|l| h.engine.table.lock(l).holder)
                .map(|g| g.token);
            if live != *t {
                assert!(live.is_none() || live > *t, "key {k}: {live:?} vs {t:?}");
                *t = live;
            }
        }
    }
}
