//! Engine tests with a fake clock: every answer the engine writes is checked.

use super::*;
use crate::proto::Holder;

/// An engine with a hand-driven clock and a few connections.
struct Harness {
    engine: Engine,
    now: Now,
}

impl Harness {
    fn new(conns: u32) -> Harness {
        let now = Now {
            ms: 1_000,
            us: 1_000_000,
            unix_ns: 1_700_000_000_000_000_000,
        };
        let mut engine = Engine::new(now, "127.0.0.1:7171");
        for c in 0..conns {
            engine.open(c);
        }
        Harness { engine, now }
    }

    /// Sends one request line (without `\n`).
    fn send(&mut self, conn: ConnId, line: &str) -> Result<(), Refusal> {
        let wire = format!("{line}\n");
        let (request, _) = crate::proto::parse_request(wire.as_bytes())
            .expect("valid request")
            .expect("whole line");
        let result = self.engine.handle(self.now, conn, request);
        self.engine.check_invariants();
        result
    }

    /// Moves the clock forward and runs the timers.
    fn advance(&mut self, ms: u64) {
        self.now.ms += ms;
        self.now.unix_ns += ms * 1_000_000;
        self.engine.tick(self.now);
        self.engine.check_invariants();
    }

    /// Takes the answers written to `conn` so far, one string per line.
    fn answers(&mut self, conn: ConnId) -> Vec<String> {
        let out = std::mem::take(self.engine.output_mut(conn));
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Sends an acquire that must be granted at once; returns its token.
    fn grant(&mut self, conn: ConnId, key: &str, lease: &str) -> u64 {
        self.send(conn, &format!("A {key} {lease} 0")).unwrap();
        let answers = self.answers(conn);
        assert_eq!(answers.len(), 1, "{answers:?}");
        token_of(&answers[0], key)
    }
}

fn token_of(answer: &str, key: &str) -> u64 {
    let rest = answer
        .strip_prefix(&format!("A {key} "))
        .unwrap_or_else(|| panic!("not a grant of {key}: {answer:?}"));
    rest.parse().unwrap()
}

#[test]
fn grant_release_and_stale_tokens() {
    let mut h = Harness::new(1);
    let t = h.grant(0, "k", "10");
    assert!(t >= h.now.unix_ns);
    h.send(0, &format!("R k {t}")).unwrap();
    h.send(0, &format!("R k {t}")).unwrap();
    h.send(0, &format!("N k {t} 10")).unwrap();
    assert_eq!(h.answers(0), ["R k 1", "R k 0", "N k 0"]);
    assert_eq!(h.engine.lock_count(), 0, "a free lock leaves the table");
}

#[test]
fn waiters_are_granted_in_arrival_order_with_growing_tokens() {
    let mut h = Harness::new(4);
    let mut token = h.grant(0, "k", "10");
    for c in 1..4 {
        h.send(c, "A k 10 0").unwrap();
        assert!(h.answers(c).is_empty());
    }
    for c in 1..4 {
        h.send(0, &format!("R k {token}")).unwrap();
        assert_eq!(h.answers(0), ["R k 1"]);
        let answers = h.answers(c);
        assert_eq!(answers.len(), 1);
        let next = token_of(&answers[0], "k");
        assert!(next > token);
        token = next;
        for other in (c + 1)..4 {
            assert!(h.answers(other).is_empty(), "only the head is granted");
        }
    }
}

#[test]
fn lease_expiry_hands_over_and_the_old_token_is_dead() {
    let mut h = Harness::new(2);
    let old = h.grant(0, "k", "0.5");
    h.send(1, "A k 10 0").unwrap();
    h.advance(500);
    assert!(h.answers(1).is_empty(), "the lease runs its full length");
    h.advance(1);
    let new = token_of(&h.answers(1)[0], "k");
    assert!(new > old);
    h.send(0, &format!("R k {old}")).unwrap();
    h.send(0, &format!("N k {old} 1")).unwrap();
    assert_eq!(h.answers(0), ["R k 0", "N k 0"]);
}

#[test]
fn renew_moves_the_expiry_and_keeps_the_token() {
    let mut h = Harness::new(2);
    let t = h.grant(0, "k", "1");
    h.advance(900);
    h.send(0, &format!("N k {t} 2")).unwrap();
    assert_eq!(h.answers(0), ["N k 1"]);
    h.send(1, "A k 1 0").unwrap();
    h.advance(1_900);
    assert!(h.answers(1).is_empty());
    h.advance(200);
    assert!(token_of(&h.answers(1)[0], "k") > t);
}

#[test]
fn a_timed_out_waiter_is_never_granted() {
    let mut h = Harness::new(3);
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0.3").unwrap();
    h.send(2, "A k 10 0").unwrap();
    h.advance(299);
    assert!(h.answers(1).is_empty());
    h.advance(2);
    assert_eq!(h.answers(1), ["T k"]);
    h.send(0, &format!("R k {t}")).unwrap();
    assert!(h.answers(1).is_empty());
    assert_eq!(h.answers(2).len(), 1, "the next waiter got it");
}

#[test]
fn a_later_timeout_waits_for_the_earlier_acquire_of_the_same_key() {
    let mut h = Harness::new(2);
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0").unwrap();
    h.send(1, "A k 10 0.2").unwrap();
    h.send(1, "A other 10 0").unwrap();
    assert_eq!(h.answers(1).len(), 1, "other is granted at once");
    h.advance(500);
    assert!(
        h.answers(1).is_empty(),
        "T held back behind the first acquire"
    );
    h.send(0, &format!("R k {t}")).unwrap();
    let answers = h.answers(1);
    assert_eq!(answers.len(), 2);
    token_of(&answers[0], "k");
    assert_eq!(answers[1], "T k");
}

#[test]
fn held_back_timeouts_come_out_in_order_when_the_first_times_out() {
    let mut h = Harness::new(2);
    h.grant(0, "k", "10");
    h.send(1, "A k 10 1").unwrap();
    h.send(1, "A k 10 0.2").unwrap();
    h.send(1, "A k 10 0.1").unwrap();
    h.send(1, "A k 10 0").unwrap();
    h.advance(300);
    assert!(h.answers(1).is_empty());
    h.advance(800);
    assert_eq!(h.answers(1), ["T k", "T k", "T k"]);
    assert_eq!(
        h.engine.table.conn_len(1),
        1,
        "the no-limit acquire still waits"
    );
}

#[test]
fn closing_a_connection_withdraws_its_waiters_but_not_its_grants() {
    let mut h = Harness::new(3);
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0").unwrap();
    h.send(1, "A k 10 0.1").unwrap();
    h.send(2, "A k 10 0").unwrap();
    h.engine.close(1);
    h.engine.check_invariants();
    h.engine.close(0);
    h.engine.open(0);
    h.send(0, &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(0), ["R k 1"]);
    assert_eq!(h.answers(2).len(), 1, "the withdrawn waiter was skipped");
    h.advance(1_000);
    assert!(h.answers(2).is_empty());
}

#[test]
fn the_4097th_waiting_acquire_is_refused() {
    let mut h = Harness::new(2);
    h.grant(0, "k", "10");
    for _ in 0..MAX_WAITING_PER_CONN {
        h.send(1, "A k 10 0").unwrap();
    }
    assert_eq!(h.send(1, "A k 10 0"), Err(Refusal::TooManyWaiting));
    // A grant does not count: a free key is still granted.
    h.send(1, "A free 10 0").unwrap();
    assert_eq!(h.answers(1).len(), 1);
}

// ----- Fencing token exhaustion -----

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
    assert_eq!(h.grant(0, "k", "10"), token::MAX_TOKEN);
    assert_eq!(h.send(1, "A free 10 0"), Err(Refusal::TokensExhausted));
    assert!(h.answers(1).is_empty());
    assert_eq!(h.engine.lock_count(), 1, "the refused key left no lock");
    assert!(h.engine.table.find(b"free").is_none());
    // Nothing else changed: the grant is live, releases and renewals work,
    // and an acquire of a held key still queues (it needs no token yet).
    h.send(1, &format!("N k {} 10", token::MAX_TOKEN)).unwrap();
    h.send(1, "S").unwrap();
    assert_eq!(
        h.answers(1),
        [
            "N k 1".to_string(),
            format!("S active 127.0.0.1:7171 {}", token::MAX_TOKEN)
        ]
    );
    assert_eq!(h.send(1, "A k 10 0"), Ok(()));
    assert!(h.answers(1).is_empty());
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
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0").unwrap();
    h.send(2, "A k 10 5").unwrap();
    h.send(3, "A k 10 0").unwrap();
    h.send(0, &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(0), ["R k 1"]);
    for c in 1..4 {
        assert_eq!(h.answers(c), ["T k"], "connection {c}");
    }
    assert_eq!(h.engine.lock_count(), 0, "the lock left the table");
    // The cancelled wait timer of connection 2 does not fire later.
    h.advance(10_000);
    assert!(h.answers(2).is_empty());
    assert_eq!(h.engine.next_deadline(), None);
}

#[test]
fn a_lease_expiry_without_a_token_left_times_out_every_waiter() {
    let mut h = near_exhaustion(3, 1);
    h.grant(0, "k", "1");
    h.send(1, "A k 10 0").unwrap();
    h.send(2, "A k 10 0").unwrap();
    h.advance(1_001);
    assert_eq!(h.answers(1), ["T k"]);
    assert_eq!(h.answers(2), ["T k"]);
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn exhaustion_keeps_rule_3_on_one_connection() {
    // Connection 1: an acquire without limit, then one that times out and
    // is held back behind it, then another without limit. When no token is
    // left at the release, all three are answered T, in order.
    let mut h = near_exhaustion(2, 1);
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0").unwrap();
    h.send(1, "A k 10 0.1").unwrap();
    h.send(1, "A k 10 0").unwrap();
    h.advance(200);
    assert!(h.answers(1).is_empty(), "the T is held back");
    h.send(0, &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(1), ["T k", "T k", "T k"]);
    assert_eq!(h.engine.table.conn_len(1), 0);
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn the_last_token_is_handed_off_then_waiters_time_out() {
    let mut h = near_exhaustion(3, 2);
    let t = h.grant(0, "k", "10");
    assert_eq!(t, token::MAX_TOKEN - 1);
    h.send(1, "A k 10 0").unwrap();
    h.send(2, "A k 10 0").unwrap();
    h.send(0, &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(1), [format!("A k {}", token::MAX_TOKEN)]);
    assert!(
        h.answers(2).is_empty(),
        "still waiting behind the last grant"
    );
    h.send(1, &format!("R k {}", token::MAX_TOKEN)).unwrap();
    assert_eq!(h.answers(2), ["T k"]);
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn a_wall_clock_beyond_the_token_space_grants_once_then_refuses() {
    let mut h = Harness::new(1);
    h.now.unix_ns = u64::MAX;
    assert_eq!(h.grant(0, "a", "10"), token::MAX_TOKEN);
    assert_eq!(h.send(0, "A b 10 0"), Err(Refusal::TokensExhausted));
}

// ----- Replicated grants (peer input) -----

/// A standby harness (no waiters: it answers acquires `M`).
fn standby(conns: u32) -> Harness {
    let mut h = Harness::new(conns);
    h.engine.step_down(Some("10.0.0.1:7171"));
    h
}

#[test]
fn a_replicated_grant_is_held_for_its_remaining_lease() {
    let mut h = standby(1);
    let t = 1_800_000_000_000_000_000;
    h.engine
        .apply_grant(h.now, b"k", t, MAX_LEASE_MS, Holder::default())
        .expect("in range");
    assert_eq!(h.engine.holder(b"k"), Some((t, h.now.ms + MAX_LEASE_MS)));
    assert_eq!(h.engine.highest_token(), t);
    h.advance(MAX_LEASE_MS - 1);
    assert!(h.engine.holder(b"k").is_some());
    h.advance(1);
    assert_eq!(h.engine.holder(b"k"), None, "expired on time");
    assert_eq!(h.engine.lock_count(), 0);
}

#[test]
fn replicated_grants_out_of_range_are_refused_and_change_nothing() {
    let mut h = standby(1);
    let now = h.now;
    let e = &mut h.engine;
    e.apply_grant(now, b"k", 5, 1_000, Holder::default())
        .unwrap();
    for (token, remaining, refusal) in [
        (
            token::MAX_TOKEN + 1,
            1_000,
            GrantRefusal::TokenOutOfRange(token::MAX_TOKEN + 1),
        ),
        (u64::MAX, 1_000, GrantRefusal::TokenOutOfRange(u64::MAX)),
        (
            7,
            MAX_LEASE_MS + 1,
            GrantRefusal::LeaseOutOfRange(MAX_LEASE_MS + 1),
        ),
        (7, u64::MAX, GrantRefusal::LeaseOutOfRange(u64::MAX)),
    ] {
        for key in [&b"k"[..], b"new"] {
            assert_eq!(
                e.apply_grant(now, key, token, remaining, Holder::default()),
                Err(refusal)
            );
        }
    }
    assert_eq!(e.holder(b"k"), Some((5, now.ms + 1_000)));
    assert_eq!(e.lock_count(), 1, "no lock for the refused new key");
    assert_eq!(e.highest_token(), 5, "refused tokens are not observed");
    e.check_invariants();
    assert_eq!(
        GrantRefusal::LeaseOutOfRange(86_400_001).to_string(),
        "replicated grant with 86400001 ms of lease left, more than 86400000"
    );
}

#[test]
fn replicated_releases_and_snapshots_apply_to_any_table() {
    let mut h = standby(1);
    let now = h.now;
    let e = &mut h.engine;
    e.apply_grant(now, b"a", 5, 1_000, Holder::default())
        .unwrap();
    e.apply_grant(now, b"b", 6, 2_000, Holder::default())
        .unwrap();
    e.apply_grant(now, b"a", 7, 3_000, Holder::default())
        .unwrap();
    // Unknown keys and stale tokens are ignored.
    e.apply_release(now, b"nothing", 5);
    e.apply_release(now, b"a", 5);
    e.apply_release(now, b"a", u64::MAX);
    assert_eq!(e.holder(b"a"), Some((7, now.ms + 3_000)));
    e.apply_release(now, b"a", 7);
    assert_eq!(e.holder(b"a"), None);
    e.observe_token(token::MAX_TOKEN);
    e.clear_grants();
    assert_eq!(e.lock_count(), 0);
    assert_eq!(e.next_deadline(), None, "every lease timer went with them");
    e.check_invariants();
}

#[test]
fn requests_at_the_bounds_of_the_parser_set_timers_without_trouble() {
    // The parser lets through leases and waits of 86400 s; the wheel takes
    // them, and longer ones too (see the wheel's parking).
    let mut h = Harness::new(2);
    let t = h.grant(0, "k", "86400");
    h.send(1, "A k 86400 86399.999").unwrap();
    h.send(0, &format!("N k {t} 86400")).unwrap();
    assert_eq!(h.answers(0), ["N k 1"]);
    let far = Request::Acquire {
        key: b"far",
        lease_ms: u64::MAX,
        wait_ms: u64::MAX,
    };
    h.engine.handle(h.now, 1, far).unwrap();
    assert_eq!(token_of(&h.answers(1)[0], "far"), t + 1);
    h.advance(MAX_LEASE_MS);
    assert_eq!(h.answers(1), ["T k"], "the wait ran out before the lease");
    assert_eq!(h.engine.holder(b"k").map(|g| g.0), Some(t));
    assert!(h.engine.holder(b"far").is_some(), "a lease of u64::MAX ms");
    h.engine.check_invariants();
}

// ----- --max-locks -----

/// A harness whose engine holds at most `max_locks` locks.
fn limited(conns: u32, max_locks: u32) -> Harness {
    let mut h = Harness::new(0);
    h.engine = Engine::with_max_locks(h.now, "127.0.0.1:7171", max_locks);
    for c in 0..conns {
        h.engine.open(c);
    }
    h
}

#[test]
fn a_new_key_beyond_max_locks_is_refused_and_changes_nothing() {
    let mut h = limited(3, 3);
    let a = h.grant(0, "a", "10");
    let b = h.grant(0, "b", "10");
    h.grant(0, "c", "10");
    let full = Refusal::LockTableFull { max_locks: 3 };
    assert_eq!(h.send(1, "A d 10 0"), Err(full));
    assert_eq!(h.send(1, "A d 10 5"), Err(full));
    assert!(h.answers(1).is_empty());
    assert_eq!(h.engine.lock_count(), 3);
    assert!(h.engine.table.find(b"d").is_none());
    // Keys that have a lock still work: their acquires queue, releases and
    // renewals are answered; and the first waiter is granted on release.
    h.send(1, "A a 10 0").unwrap();
    h.send(2, "A b 10 0.1").unwrap();
    h.send(0, &format!("N b {b} 10")).unwrap();
    h.send(0, &format!("R a {a}")).unwrap();
    assert_eq!(h.answers(0), ["N b 1", "R a 1"]);
    assert!(token_of(&h.answers(1)[0], "a") > a);
    h.advance(101);
    assert_eq!(h.answers(2), ["T b"]);
    // A lock that goes makes room for a new key.
    h.send(0, &format!("R b {b}")).unwrap();
    assert_eq!(h.engine.lock_count(), 2);
    h.grant(2, "d", "10");
    assert_eq!(h.send(2, "A e 10 0"), Err(full));
    assert_eq!(full.to_string(), "lock table full: 3 locks (--max-locks)");
}

#[test]
fn waiters_and_held_back_timeouts_keep_their_lock_counted() {
    let mut h = limited(3, 2);
    let a = h.grant(0, "a", "10");
    // "a" is held by 0, waited for by 1 (no limit, then a held-back T).
    h.send(1, "A a 10 0").unwrap();
    h.send(1, "A a 10 0.1").unwrap();
    h.advance(200);
    assert!(h.answers(1).is_empty(), "the T is held back");
    h.grant(2, "b", "0.5");
    assert_eq!(
        h.send(2, "A c 10 0"),
        Err(Refusal::LockTableFull { max_locks: 2 })
    );
    // "b" expires: one lock left ("a": holder, waiter, held-back T).
    h.advance(501);
    assert_eq!(h.engine.lock_count(), 1);
    h.grant(2, "c", "10");
    h.send(0, &format!("R a {a}")).unwrap();
    let answers = h.answers(1);
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
    h.engine.step_down(None);
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
    e.apply_release(now, b"b", 6);
    e.apply_grant(now, b"c", 9, 1_000, Holder::default())
        .unwrap();
    assert_eq!(e.lock_count(), 2);
    e.check_invariants();
    assert!(full.to_string().contains("the same on every node"));
}

#[test]
fn status_reports_role_address_and_highest_token() {
    let mut h = Harness::new(1);
    h.send(0, "S").unwrap();
    assert_eq!(h.answers(0), ["S active 127.0.0.1:7171 0"]);
    let t = h.grant(0, "k", "10");
    h.send(0, "S").unwrap();
    assert_eq!(h.answers(0), [format!("S active 127.0.0.1:7171 {t}")]);
}

#[test]
fn stepping_down_answers_every_waiter_then_redirects() {
    let mut h = Harness::new(2);
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0").unwrap();
    h.send(1, "A k 10 0.1").unwrap();
    h.send(1, "A j 10 0").unwrap();
    h.advance(200);
    let j = token_of(&h.answers(1)[0], "j");
    h.engine.step_down(Some("10.0.0.2:7171"));
    h.engine.check_invariants();
    assert_eq!(h.answers(1), ["M k 10.0.0.2:7171", "T k"]);
    h.send(0, &format!("R k {t}")).unwrap();
    h.send(0, "A x 1 0").unwrap();
    h.send(0, "S").unwrap();
    assert_eq!(
        h.answers(0),
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
        let conn = (next() % conns as u64) as ConnId;
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
                    h.engine.close(conn);
                    h.engine.open(conn);
                    h.engine.check_invariants();
                }
            }
        }
        // Read every connection's answers and track the holders. Grants of
        // one step may reach connections in any order; each is above every
        // token of the steps before.
        let mut step_max = last_token;
        for c in 0..conns {
            for answer in h.answers(c) {
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

// ----- Replication events -----

/// The events recorded since the last call, with owned keys.
fn events(e: &mut Engine) -> Vec<(String, u64, Option<u64>)> {
    let mut log = ReplicationLog::new();
    e.take_replication(&mut log);
    log.iter()
        .map(|event| match event {
            Replication::Granted {
                key,
                token,
                remaining_ms,
                ..
            }
            | Replication::Believed {
                key,
                token,
                remaining_ms,
                ..
            } => (
                String::from_utf8_lossy(key).into(),
                token,
                Some(remaining_ms),
            ),
            Replication::Released { key, token } => {
                (String::from_utf8_lossy(key).into(), token, None)
            }
        })
        .collect()
}

#[test]
fn an_active_records_every_change_of_its_table_in_order() {
    let mut h = Harness::new(2);
    h.engine.enable_replication();
    let t1 = h.grant(0, "k", "10");
    h.send(1, "A k 5 0").unwrap();
    h.advance(1_000);
    h.send(0, &format!("N k {t1} 20")).unwrap();
    h.send(0, &format!("R k {t1}")).unwrap();
    assert_eq!(h.answers(0), ["N k 1", "R k 1"]);
    let t2 = token_of(&h.answers(1)[0], "k");
    let key = "x".repeat(250);
    let t3 = h.grant(0, &key, "0.5");
    h.advance(600);
    assert_eq!(
        events(&mut h.engine),
        [
            // Granted, renewed, released and handed to the waiter; a lease
            // that ran out. A lease's remaining ms include the ms of slack
            // that `deadline` adds.
            ("k".into(), t1, Some(10_001)),
            ("k".into(), t1, Some(20_001)),
            ("k".into(), t1, None),
            ("k".into(), t2, Some(5_001)),
            (key.clone(), t3, Some(501)),
            (key, t3, None),
        ]
    );
    assert_eq!(events(&mut h.engine), [], "taken once");
    // Failed releases and renewals change nothing.
    h.send(0, &format!("R k {t1}")).unwrap();
    h.send(0, &format!("N k {t1} 1")).unwrap();
    assert_eq!(events(&mut h.engine), []);
}

#[test]
fn only_an_active_with_replication_enabled_records() {
    let mut h = Harness::new(1);
    let t = h.grant(0, "k", "10");
    h.send(0, &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(0), ["R k 1"]);
    assert_eq!(events(&mut h.engine), [], "replication not enabled");

    let mut h = standby(1);
    h.engine.enable_replication();
    let now = h.now;
    h.engine
        .apply_grant(now, b"k", 5, 100, Holder::default())
        .unwrap();
    h.engine.apply_release(now, b"k", 5);
    h.engine
        .apply_grant(now, b"k", 6, 100, Holder::default())
        .unwrap();
    h.advance(200);
    assert_eq!(h.engine.holder(b"k"), None);
    assert_eq!(events(&mut h.engine), [], "a standby records nothing");
    h.engine.become_active();
    let t = h.grant(0, "k", "1");
    assert_eq!(events(&mut h.engine), [("k".into(), t, Some(1_001))]);
}

#[test]
fn a_log_reused_turn_after_turn_keeps_its_room() {
    let mut h = Harness::new(1);
    h.engine.enable_replication();
    let mut log = ReplicationLog::new();
    for turn in 0..3 {
        for i in 0..64 {
            let t = h.grant(0, &format!("key-{i:03}"), "10");
            h.send(0, &format!("R key-{i:03} {t}")).unwrap();
            assert_eq!(h.answers(0), [format!("R key-{i:03} 1")]);
        }
        h.engine.take_replication(&mut log);
        assert_eq!(log.iter().count(), 128, "turn {turn}");
        let keys: Vec<&[u8]> = log
            .iter()
            .map(|e| match e {
                Replication::Granted { key, .. }
                | Replication::Released { key, .. }
                | Replication::Believed { key, .. } => key,
            })
            .collect();
        assert_eq!(keys[126], b"key-063");
        assert_eq!(keys[127], b"key-063");
    }
}

#[test]
fn a_snapshot_lists_the_grants_with_lease_left() {
    let mut h = Harness::new(1);
    let a = h.grant(0, "a", "10");
    let b = h.grant(0, "b", "0.1");
    h.advance(50);
    let mut grants: Vec<_> = h.engine.snapshot(h.now).collect();
    grants.sort_by_key(|e| match e {
        Replication::Granted { token, .. }
        | Replication::Released { token, .. }
        | Replication::Believed { token, .. } => *token,
    });
    assert_eq!(
        grants,
        [
            Replication::Granted {
                key: b"a",
                token: a,
                remaining_ms: 9_951,
                holder: h.engine.holder_of(b"a").unwrap(),
            },
            Replication::Granted {
                key: b"b",
                token: b,
                remaining_ms: 51,
                holder: h.engine.holder_of(b"b").unwrap(),
            },
        ]
    );
}

/// The engine is below the cluster: it records typed events and never
/// names the cluster, its wire format or the node. Every path it uses from
/// this crate is its own or the client protocol's.
#[test]
fn the_engine_uses_nothing_above_it() {
    let sources = [
        ("mod.rs", include_str!("mod.rs")),
        ("replication.rs", include_str!("replication.rs")),
        ("table.rs", include_str!("table.rs")),
        ("token.rs", include_str!("token.rs")),
        ("wheel.rs", include_str!("wheel.rs")),
    ];
    for (file, source) in sources {
        for (at, _) in source.match_indices("crate::") {
            let path = &source[at + "crate::".len()..];
            assert!(
                path.starts_with("proto")
                    || path.starts_with("engine")
                    || path.starts_with("access"),
                "crates/core/src/engine/{file} uses crate::{}",
                path.lines().next().unwrap_or_default()
            );
        }
        for above in ["cluster::", "node::", "io::"] {
            let uses = source
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .filter(|l| l.contains(above) && !l.contains("std::io::"))
                .count();
            assert_eq!(uses, 0, "crates/core/src/engine/{file} names {above}");
        }
    }
}

// ----- Holders: `O`, `W`, `Q` -----

#[test]
fn who_holds_and_who_waits_is_listed_with_addresses_and_owners() {
    let mut h = Harness::new(3);
    h.engine.set_remote(0, "10.0.0.1:5000".parse().unwrap());
    h.engine.set_remote(1, "[::1]:6000".parse().unwrap());
    h.send(0, "O host-a/job-42").unwrap();
    assert_eq!(h.answers(0), ["O host-a/job-42"]);
    let t = h.grant(0, "k", "10");
    h.advance(1_500);
    h.send(1, "A k 10 0").unwrap();
    h.send(2, "A k 10 0").unwrap();
    h.advance(500);
    h.send(2, "W 0 10").unwrap();
    let held_ms = (h.now.unix_ns - t) / 1_000_000;
    assert_eq!(held_ms, 2_000, "the fixed clock moves with the test's");
    assert_eq!(
        h.answers(2),
        [
            format!("K k {t} 8001 2 2000 10.0.0.1:5000 host-a/job-42"),
            "W 0".to_string()
        ]
    );
    // `L` is unchanged: an existing parser sees today's fields.
    h.send(2, "L 0 10").unwrap();
    assert_eq!(h.answers(2), [format!("K k {t} 8001 2"), "L 0".to_string()]);
    h.send(0, "Q k").unwrap();
    assert_eq!(
        h.answers(0),
        [
            format!("K k {t} 8001 2 2000 10.0.0.1:5000 host-a/job-42"),
            "J 500 [::1]:6000 -".to_string(),
            "J 500 - -".to_string(),
            "Q k 2".to_string(),
        ]
    );
    h.send(0, "Q nothing").unwrap();
    assert_eq!(h.answers(0), ["Q nothing 0"]);
    // A new label counts for later grants; the grant keeps its holder.
    h.send(0, "O host-a/job-43").unwrap();
    assert_eq!(h.answers(0), ["O host-a/job-43"]);
    let t2 = h.grant(0, "k2", "10");
    h.send(0, "W 0 10 k2").unwrap();
    assert_eq!(
        h.answers(0)[..1],
        [format!("K k2 {t2} 10001 0 0 10.0.0.1:5000 host-a/job-43")]
    );
    h.send(0, "W 0 10 k").unwrap();
    assert!(h.answers(0)[0].ends_with(" host-a/job-42"));
    // The holder outlives its connection; its entry goes with its grants.
    h.engine.close(0);
    h.engine.check_invariants();
    h.send(2, "W 0 1 k").unwrap();
    assert!(h.answers(2)[0].ends_with(" 10.0.0.1:5000 host-a/job-42"));
    h.send(2, &format!("R k {t}")).unwrap();
    h.send(2, &format!("R k2 {t2}")).unwrap();
    let answers = h.answers(1);
    assert_eq!(answers.len(), 1, "the head waiter got k: {answers:?}");
    h.engine.close(1);
    h.engine.close(2);
    h.engine.check_invariants();
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
    e.step_down(Some("127.0.0.1:7172"));
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
    e.apply_release(now, b"a", 10);
    e.apply_release(now, b"b", 11);
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
    h.engine.set_remote(0, "10.0.0.1:5000".parse().unwrap());
    let mut tokens = Vec::new();
    for i in 0..200 {
        h.send(0, &format!("O {}{i}", "o".repeat(120))).unwrap();
        // Labels set and replaced without a grant in between cost nothing.
        h.send(0, &format!("O label-{i}")).unwrap();
        h.answers(0);
        tokens.push(h.grant(0, &format!("k{i}"), "1"));
    }
    h.answers(0);
    h.engine.check_invariants();
    assert_eq!(h.engine.holder_count(), 200);
    // Half released, the other half expire.
    for (i, t) in tokens.iter().enumerate().take(100) {
        h.send(1, &format!("R k{i} {t}")).unwrap();
    }
    h.engine.check_invariants();
    assert_eq!(h.engine.holder_count(), 100);
    h.advance(1_100);
    h.engine.check_invariants();
    // The connection's own entry: its label stays for its next grant.
    assert_eq!(h.engine.holder_count(), 1);
    h.engine.close(0);
    assert_eq!(h.engine.holder_count(), 0);
    for _ in 0..100 {
        h.engine.open(0);
        h.send(0, "O x").unwrap();
        h.answers(0);
        let t = h.grant(0, "k", "10");
        h.send(0, &format!("R k {t}")).unwrap();
        h.engine.close(0);
    }
    h.engine.check_invariants();
    assert_eq!(h.engine.holder_count(), 0);
}

/// `O`, `W` and `Q` behind a waiting acquire on the same connection are
/// answered at once, in order (docs/protocol.md, section 6): nothing waits
/// for the acquire.
#[test]
fn owner_and_listings_behind_a_waiting_acquire_are_answered_at_once() {
    let mut h = Harness::new(2);
    let t = h.grant(0, "k", "10");
    h.send(1, "A k 10 0").unwrap();
    h.send(1, "O later").unwrap();
    h.send(1, "Q k").unwrap();
    h.send(1, "W 0 1 k").unwrap();
    assert_eq!(
        h.answers(1),
        [
            "O later".to_string(),
            format!("K k {t} 10001 1 0 - -"),
            "J 0 - later".to_string(),
            "Q k 1".to_string(),
            format!("K k {t} 10001 1 0 - -"),
            "W 0".to_string(),
        ]
    );
    h.send(0, &format!("R k {t}")).unwrap();
    let granted = h.answers(1);
    assert_eq!(granted.len(), 1, "{granted:?}");
    h.send(0, "Q k").unwrap();
    let q = h.answers(0);
    assert_eq!(q[0], "R k 1");
    assert!(
        q[1].ends_with(" - later"),
        "the grant took the label: {q:?}"
    );
}

/// A heal's merge on the active that stays: a key it does not hold is
/// adopted, the same grant keeps the longer lease, and a key both sides
/// granted keeps both holders, each able to renew and release with its
/// token, and goes to nobody new until both are done.
#[test]
fn a_merged_grant_is_adopted_or_kept_beside_and_the_key_waits_for_both() {
    let mut h = Harness::new(3);
    h.engine.enable_replication();
    let mine = h.grant(0, "k", "1");
    let theirs = mine + 1_000;
    let now = h.now;
    let merge = |h: &mut Harness, key: &[u8], token, ms| {
        let now = h.now;
        let got = h.engine.merge_grant(now, key, token, ms, Holder::default());
        h.engine.check_invariants();
        got
    };
    assert_eq!(merge(&mut h, b"k", theirs, 3_000), Ok(Merged::Beside));
    assert_eq!(merge(&mut h, b"j", theirs + 1, 500), Ok(Merged::Adopted));
    assert_eq!(h.engine.holder(b"j"), Some((theirs + 1, now.ms + 500)));
    assert_eq!(merge(&mut h, b"j", theirs + 1, 200), Ok(Merged::Known));
    assert_eq!(h.engine.holder(b"j"), Some((theirs + 1, now.ms + 500)));
    assert_eq!(h.engine.believed_count(), 1);
    assert!(h.engine.highest_token() > theirs, "the clock moved above");
    // A new acquire of k waits: both holders may still believe in it.
    h.send(1, "A k 5 10").unwrap();
    assert!(h.answers(1).is_empty());
    // The key's own holder releases: the merged one holds it now.
    h.send(0, &format!("R k {mine}")).unwrap();
    assert_eq!(h.answers(0), ["R k 1"]);
    assert!(h.answers(1).is_empty());
    assert_eq!(h.engine.holder(b"k").map(|g| g.0), Some(theirs));
    h.send(2, &format!("N k {theirs} 2")).unwrap();
    assert_eq!(h.answers(2), ["N k 1"]);
    h.engine.check_invariants();
    h.send(2, &format!("R k {theirs}")).unwrap();
    assert_eq!(h.answers(2), ["R k 1"]);
    let granted = h.answers(1);
    assert_eq!(granted.len(), 1, "{granted:?}");
    let t: u64 = granted[0].strip_prefix("A k ").unwrap().parse().unwrap();
    assert!(t > theirs + 1, "the next grant is above every merged token");
    assert_eq!(h.engine.believed_count(), 0);
    h.engine.check_invariants();
}

/// The lock-delay never outlasts the merged leases: with both holders
/// silent, the key goes to its waiter once the longest lease ends, not
/// before; a believed grant whose lease ran out cannot be renewed.
#[test]
fn the_lock_delay_ends_with_the_longest_merged_lease() {
    let mut h = Harness::new(2);
    let mine = h.grant(0, "k", "1");
    let now = h.now;
    let got = h
        .engine
        .merge_grant(now, b"k", mine + 7, 2_000, Holder::default());
    assert_eq!(got, Ok(Merged::Beside));
    h.send(1, "A k 5 10").unwrap();
    h.advance(1_500);
    assert!(h.answers(1).is_empty(), "granted while a merged lease runs");
    assert_eq!(h.engine.holder(b"k").map(|g| g.0), Some(mine + 7));
    h.advance(600);
    let granted = h.answers(1);
    assert_eq!(granted.len(), 1, "{granted:?}");
    h.send(0, &format!("N k {} 1", mine + 7)).unwrap();
    assert_eq!(h.answers(0), ["N k 0"]);
    h.engine.check_invariants();
}

/// An engine with identities: connection `c` is `names[c]` under `rules`.
fn identified(names: &[&str], rules: &str) -> Harness {
    let mut h = Harness::new(names.len() as u32);
    h.engine.require_identities();
    let acl = crate::access::Acl::parse(rules).unwrap();
    for (c, name) in names.iter().enumerate() {
        h.engine
            .set_access(c as ConnId, acl.access(name.as_bytes()));
    }
    h
}

const RULES: &str = "alice a/ lock\nbob a/ lock\nops * admin\n";

#[test]
fn only_the_holder_releases_and_renews_its_grant() {
    let mut h = identified(&["alice", "bob"], RULES);
    let t = h.grant(0, "a/k", "10000");
    let held = h.engine.holder(b"a/k");
    assert_eq!(held.map(|(token, _)| token), Some(t));
    h.send(1, &format!("R a/k {t}")).unwrap();
    h.send(1, &format!("N a/k {t} 50000")).unwrap();
    assert_eq!(h.answers(1), ["R a/k 0", "N a/k 0"]);
    assert_eq!(h.engine.holder(b"a/k"), held, "nothing changed");
    assert_eq!(h.engine.stats().release_not_holder, 1);
    assert_eq!(h.engine.stats().renew_not_holder, 1);
    assert_eq!(h.engine.stats().release_stale, 0);
    assert_eq!(
        h.engine.holder_of(b"a/k").unwrap().identity,
        Some(&b"alice"[..])
    );
    h.send(0, &format!("N a/k {t} 5000")).unwrap();
    h.send(0, &format!("R a/k {t}")).unwrap();
    assert_eq!(h.answers(0), ["N a/k 1", "R a/k 1"]);
    // A stale token stays stale, whoever sends it.
    h.send(1, &format!("R a/k {t}")).unwrap();
    assert_eq!(h.answers(1), ["R a/k 0"]);
    assert_eq!(h.engine.stats().release_stale, 1);
}

#[test]
fn only_the_holder_releases_and_renews_its_shared_grant_or_permit() {
    let mut h = identified(&["alice", "bob", "ops"], RULES);
    for (line, key) in [("G a/s 10000 0", "a/s"), ("C a/p 2 10000 0", "a/p")] {
        h.send(0, line).unwrap();
        let granted = h.answers(0);
        assert_eq!(granted.len(), 1, "{granted:?}");
        let t = token_of(&granted[0].replacen(&granted[0][..1], "A", 1), key);
        h.send(1, &format!("R {key} {t}")).unwrap();
        h.send(1, &format!("N {key} {t} 50000")).unwrap();
        assert_eq!(h.answers(1), [format!("R {key} 0"), format!("N {key} 0")]);
        assert_eq!(h.engine.member_count(), 1, "nothing changed");
        h.send(0, &format!("N {key} {t} 5000")).unwrap();
        assert_eq!(h.answers(0), [format!("N {key} 1")]);
        // An admin may.
        h.send(2, &format!("R {key} {t}")).unwrap();
        assert_eq!(h.answers(2), [format!("R {key} 1")]);
        assert_eq!(h.engine.member_count(), 0);
    }
    assert_eq!(h.engine.stats().release_not_holder, 2);
    assert_eq!(h.engine.stats().renew_not_holder, 2);
    // Outside the rules, a shared acquire is refused like an exclusive one.
    assert_eq!(h.send(1, "G b/x 1000 0"), Err(Refusal::NotAllowed));
}

#[test]
fn an_admin_releases_and_renews_anyones_grant() {
    let mut h = identified(&["alice", "ops"], RULES);
    let t = h.grant(0, "a/k", "10000");
    h.send(1, &format!("N a/k {t} 5000")).unwrap();
    h.send(1, &format!("R a/k {t}")).unwrap();
    assert_eq!(h.answers(1), ["N a/k 1", "R a/k 1"]);
    assert_eq!(h.engine.holder(b"a/k"), None);
}

#[test]
fn an_acquire_outside_the_rules_is_refused_and_l_lists_only_allowed_keys() {
    let mut h = identified(&["alice", "ops"], "alice a/ lock\nops * admin\n");
    let refusal = h.send(0, "A b/x 1000 0").unwrap_err();
    assert_eq!(refusal, Refusal::NotAllowed);
    assert_eq!(
        h.engine.not_allowed_reason(),
        "not allowed: identity \"alice\" may not lock \"b/x\""
    );
    assert_eq!(h.engine.lock_count(), 0, "nothing was made for it");
    h.grant(1, "b/x", "10000");
    h.grant(0, "a/y", "10000");
    h.send(0, "L 0 100").unwrap();
    let listed = h.answers(0);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed[0].starts_with("K a/y "), "{listed:?}");
    h.send(0, "Q b/x").unwrap();
    assert_eq!(h.answers(0), ["Q b/x 0"]);
    h.send(1, "L 0 100").unwrap();
    assert_eq!(h.answers(1).len(), 3, "an admin lists every key");
}

#[test]
fn a_replicated_grant_keeps_its_identity_and_one_without_is_an_admins_only() {
    let mut h = identified(&["alice", "bob", "ops"], RULES);
    h.engine.step_down(Some("10.0.0.1:7171"));
    let alice = Holder {
        identity: Some(b"alice"),
        ..Holder::default()
    };
    h.engine
        .apply_grant(h.now, b"a/1", 5, 10_000, alice)
        .unwrap();
    h.engine
        .apply_grant(h.now, b"a/2", 6, 10_000, Holder::default())
        .unwrap();
    h.engine.become_active();
    h.send(1, "R a/1 5").unwrap();
    h.send(0, "R a/2 6").unwrap();
    assert_eq!(h.answers(1), ["R a/1 0"]);
    assert_eq!(h.answers(0), ["R a/2 0"], "no identity known: not alice's");
    h.send(0, "R a/1 5").unwrap();
    h.send(2, "R a/2 6").unwrap();
    assert_eq!(h.answers(0), ["R a/1 1"]);
    assert_eq!(h.answers(2), ["R a/2 1"]);
}

#[test]
fn without_identities_anyone_releases_as_before() {
    let mut h = Harness::new(2);
    let t = h.grant(0, "k", "10000");
    h.send(1, &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(1), ["R k 1"]);
    assert_eq!(h.engine.stats().release_not_holder, 0);
}

#[test]
fn peer_links_are_collected_before_the_clients_they_replicate() {
    let mut h = Harness::new(4);
    let mut dirty = Vec::new();
    // A client answered, then a link written to, then another client.
    h.send(0, "A a 5 0").unwrap();
    h.engine.write_to(3, b"P X a 1\n");
    h.send(1, "A b 5 0").unwrap();
    h.engine.write_to(2, b"P X b 1\n");
    h.engine.write_to(3, b"P HB\n");
    h.engine.take_dirty(&mut dirty);
    assert_eq!(dirty, [3, 2, 0, 1]);
    for c in 0..4 {
        h.engine.output_mut(c).clear();
    }
    // A link closed after its output, its id taken again by a client in
    // the same turn: listed once, among the clients; and the other way.
    h.engine.write_to(2, b"P HB\n");
    h.engine.close(2);
    h.engine.open(2);
    h.send(0, "A e 5 0").unwrap();
    h.send(2, "A c 5 0").unwrap();
    h.send(1, "A d 5 0").unwrap();
    h.engine.close(1);
    h.engine.open(1);
    h.engine.write_to(1, b"P HELLO\n");
    h.engine.take_dirty(&mut dirty);
    assert_eq!(dirty, [1, 0, 2]);
    h.engine.take_dirty(&mut dirty);
    assert!(dirty.is_empty(), "{dirty:?}");
}
