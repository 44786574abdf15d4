//! Shared grants and permits with a hand-driven clock: scenarios here,
//! random requests against a reference model in [`model`].

use crate::outbox::cid;
use std::collections::{BTreeMap, BTreeSet, HashMap};

mod model;

use super::*;
use crate::proto::Holder;

/// The token of a grant line (`A`, `G` or `C`), not 0.
pub(super) fn token(line: &str) -> u64 {
    let fields: Vec<&str> = line.split(' ').collect();
    assert!(
        fields.len() == 3 && ["A", "G", "C"].contains(&fields[0]),
        "not a grant: {line:?}"
    );
    let t: u64 = fields[2].parse().unwrap();
    assert!(t > 0, "not a grant: {line:?}");
    t
}

#[test]
fn readers_hold_together_a_writer_waits_and_a_later_reader_waits_behind_it() {
    let mut h = Harness::new(4);
    let r1 = h.granted(cid(0), "G k 10 0");
    let r2 = h.granted(cid(1), "G k 10 0");
    assert!(r2 > r1);
    h.send(cid(2), "A k 10 0").unwrap();
    h.send(cid(3), "G k 10 0").unwrap();
    assert!(
        h.answers(cid(2)).is_empty(),
        "the writer waits for the readers"
    );
    assert!(
        h.answers(cid(3)).is_empty(),
        "a reader behind a waiting writer waits"
    );
    h.send(cid(0), &format!("R k {r1}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
    assert!(h.answers(cid(2)).is_empty(), "one reader still holds");
    h.send(cid(1), &format!("R k {r2}")).unwrap();
    assert_eq!(h.answers(cid(1)), ["R k 1"]);
    let w = token(&h.answers(cid(2))[0]);
    assert!(w > r2);
    assert!(
        h.answers(cid(3)).is_empty(),
        "the reader waits for the writer"
    );
    h.send(cid(2), &format!("R k {w}")).unwrap();
    let r3 = token(&h.answers(cid(3))[0]);
    assert!(r3 > w);
    assert_eq!(h.engine.members_of(b"k").len(), 1);
}

#[test]
fn a_batch_of_readers_is_granted_up_to_the_first_writer() {
    let mut h = Harness::new(6);
    let w = h.granted(cid(0), "A k 10 0");
    for (c, line) in [
        (1, "G k 10 0"),
        (2, "G k 10 0"),
        (3, "A k 10 0"),
        (4, "G k 10 0"),
    ] {
        h.send(cid(c), line).unwrap();
    }
    h.send(cid(0), &format!("R k {w}")).unwrap();
    let (a, b) = (token(&h.answers(cid(1))[0]), token(&h.answers(cid(2))[0]));
    assert!(w < a && a < b, "granted in queue order");
    assert!(h.answers(cid(3)).is_empty() && h.answers(cid(4)).is_empty());
    // The writer gives up: the reader behind it joins the readers at once.
    h.reopen(cid(3));
    let c = token(&h.answers(cid(4))[0]);
    assert!(c > b);
    assert_eq!(h.engine.members_of(b"k").len(), 3);
}

#[test]
fn a_writer_whose_wait_runs_out_lets_the_readers_behind_it_in() {
    let mut h = Harness::new(3);
    h.granted(cid(0), "G k 10 0");
    h.send(cid(1), "A k 10 0.1").unwrap();
    h.send(cid(2), "G k 10 0").unwrap();
    h.advance_each_ms(101);
    assert_eq!(h.answers(cid(1)), ["T k"]);
    token(&h.answers(cid(2))[0]);
}

#[test]
fn a_semaphore_grants_up_to_its_limit_in_fifo_order() {
    let mut h = Harness::new(5);
    let a = h.granted(cid(0), "C s 2 10 0");
    let b = h.granted(cid(1), "C s 2 10 0");
    h.send(cid(2), "C s 2 10 0").unwrap();
    h.send(cid(3), "C s 2 10 0").unwrap();
    assert!(h.answers(cid(2)).is_empty() && h.answers(cid(3)).is_empty());
    assert_eq!(h.engine.semaphore_limit(b"s"), Some(2));
    h.send(cid(0), &format!("R s {a}")).unwrap();
    let c = token(&h.answers(cid(2))[0]);
    assert!(c > b);
    assert!(h.answers(cid(3)).is_empty(), "two permits held again");
    // A permit's lease runs out: the next waiter takes it.
    h.send(cid(1), &format!("N s {b} 0.05")).unwrap();
    assert_eq!(h.answers(cid(1)), ["N s 1"]);
    h.advance_each_ms(51);
    token(&h.answers(cid(3))[0]);
    h.send(cid(1), &format!("R s {b}")).unwrap();
    h.send(cid(1), &format!("N s {b} 1")).unwrap();
    assert_eq!(h.answers(cid(1)), ["R s 0", "N s 0"]);
}

#[test]
fn another_limit_or_kind_is_refused_and_changes_nothing() {
    let mut h = Harness::new(3);
    let p = h.granted(cid(0), "C s 2 10 0");
    h.send(cid(1), "C s 3 10 0").unwrap();
    h.send(cid(1), "G s 10 0").unwrap();
    assert_eq!(h.answers(cid(1)), ["C s semaphore 2", "G s semaphore 2"]);
    assert_eq!(h.engine.member_count(), 1);
    // `A` has no refusal answer: it breaks its connection.
    assert_eq!(h.send(cid(1), "A s 10 0"), Err(Refusal::Semaphore));
    assert_eq!(
        h.engine.not_allowed_reason(),
        "key \"s\" is a semaphore of 2 permits: acquire it with C"
    );
    // A lock is not a semaphore, held exclusively or shared.
    h.granted(cid(2), "A x 10 0");
    h.granted(cid(2), "G y 10 0");
    h.send(cid(1), "C x 1 10 0").unwrap();
    h.send(cid(1), "C y 1 10 0").unwrap();
    assert_eq!(h.answers(cid(1)), ["C x lock", "C y lock"]);
    // Once its last permit goes, the key is nobody's: a new limit is taken.
    h.send(cid(0), &format!("R s {p}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R s 1"]);
    assert_eq!(h.engine.semaphore_limit(b"s"), None);
    h.granted(cid(1), "C s 5 10 0");
    assert_eq!(h.engine.semaphore_limit(b"s"), Some(5));
}

#[test]
fn waits_of_g_and_c_run_out_with_their_own_answers_in_order() {
    let mut h = Harness::new(2);
    h.granted(cid(0), "A k 10 0");
    h.granted(cid(0), "C s 1 10 0");
    h.send(cid(1), "G k 10 0").unwrap();
    // Its wait runs out first, but its answer waits for the earlier
    // acquire of the same key on the connection (rule 3).
    h.send(cid(1), "G k 10 0.01").unwrap();
    h.send(cid(1), "C s 1 10 0.02").unwrap();
    h.advance_each_ms(30);
    assert_eq!(h.answers(cid(1)), ["C s 0"]);
    h.reopen(cid(0));
    h.engine.step_down(None, &mut h.out);
    assert_eq!(h.answers(cid(1)), ["M k -", "G k 0"]);
}

#[test]
fn a_close_settled_late_after_its_lock_went_is_harmless() {
    let mut h = Harness::new(2);
    let r = h.granted(cid(0), "G k 10 0");
    h.send(cid(1), "A k 10 0").unwrap();
    // Closed without a settle: the lock waits to be passed on...
    h.engine.close(cid(1), &mut h.out);
    h.engine.open(cid(1), &mut h.out);
    // ...and goes first, its last member released.
    h.send(cid(0), &format!("R k {r}")).unwrap();
    assert_eq!(h.engine.lock_count(), 0);
    h.advance_each_ms(1);
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
}

#[test]
fn an_active_with_a_follower_too_old_refuses_g_and_c() {
    let mut h = Harness::new(1);
    h.engine.enable_replication();
    h.engine.set_follower_too_old(true);
    assert_eq!(h.send(cid(0), "G k 10 0"), Err(Refusal::FollowerTooOld));
    assert_eq!(h.send(cid(0), "C k 1 10 0"), Err(Refusal::FollowerTooOld));
    assert_eq!(h.engine.lock_count(), 0);
    assert!(h.answers(cid(0)).is_empty());
    h.engine.set_follower_too_old(false);
    h.granted(cid(0), "G k 10 0");
}

/// Applies `events` (an active's replication) to a standby `e`.
fn apply_all(e: &mut Engine, now: Now, log: &ReplicationLog) {
    for event in log.iter() {
        match event {
            Replication::Granted {
                key,
                token,
                remaining_ms,
                holder,
            } => e
                .apply_grant(now, key, token, remaining_ms, holder)
                .unwrap(),
            Replication::Released { key, token } => {
                e.apply_release(now, key, token, &mut Outbox::new())
            }
            Replication::Member {
                key,
                token,
                remaining_ms,
                holder,
                limit,
            } => e
                .apply_member(now, key, token, remaining_ms, limit, holder)
                .unwrap(),
            Replication::Believed {
                key,
                token,
                remaining_ms,
                holder,
            } => {
                e.merge_grant(now, key, token, remaining_ms, holder, &mut Outbox::new())
                    .unwrap();
            }
        }
        e.check_invariants();
    }
}

fn standby(now: Now) -> Engine {
    let mut e = Engine::new(now, "127.0.0.1:7172");
    e.step_down(Some("127.0.0.1:7171"), &mut Outbox::new());
    e
}

/// What a standby must agree on with its active: per key, its members'
/// tokens and its limit.
fn members_state(e: &Engine, keys: &[&str]) -> Vec<(Vec<u64>, Option<u32>)> {
    keys.iter()
        .map(|k| {
            let tokens = e.members_of(k.as_bytes()).iter().map(|m| m.0).collect();
            (tokens, e.semaphore_limit(k.as_bytes()))
        })
        .collect()
}

/// Each member of `standby` ends no earlier than the active's (it applied
/// the grant later) and at most `late_ms` later.
fn expiries_follow(active: &Engine, standby: &Engine, keys: &[&str], late_ms: u64) {
    for k in keys {
        let (a, s) = (
            active.members_of(k.as_bytes()),
            standby.members_of(k.as_bytes()),
        );
        assert_eq!(a.len(), s.len());
        for ((_, ea), (_, es)) in a.iter().zip(&s) {
            assert!(*ea <= *es && *es <= ea + late_ms, "{k}: {ea} {es}");
        }
    }
}

#[test]
fn a_standby_holds_the_members_its_active_replicates_and_serves_them_after_failover() {
    let mut h = Harness::new(4);
    h.engine.enable_replication();
    let r1 = h.granted(cid(0), "G k 10000 0");
    let r2 = h.granted(cid(1), "G k 10000 0");
    let p1 = h.granted(cid(2), "C sem 2 10000 0");
    let p2 = h.granted(cid(3), "C sem 2 10000 0");
    let gone = h.granted(cid(3), "G other 10000 0");
    h.advance_each_ms(5);
    h.send(cid(0), &format!("N k {r1} 20000")).unwrap();
    h.send(cid(3), &format!("R other {gone}")).unwrap();
    let mut log = ReplicationLog::new();
    h.engine.take_replication(&mut log);
    let mut e = standby(h.now);
    apply_all(&mut e, h.now, &log);
    e.check_invariants();
    let keys = ["k", "sem", "other"];
    assert_eq!(members_state(&e, &keys), members_state(&h.engine, &keys));
    expiries_follow(&h.engine, &e, &keys, 5);
    assert_eq!(e.member_count(), 4);
    assert_eq!(e.highest_token(), h.engine.highest_token());
    // A snapshot gives a new standby the same.
    let mut log = ReplicationLog::new();
    for event in h
        .engine
        .snapshot(h.now)
        .chain(h.engine.member_snapshot(h.now))
    {
        log.push(event);
    }
    let mut fresh = standby(h.now);
    apply_all(&mut fresh, h.now, &log);
    assert_eq!(
        members_state(&fresh, &keys),
        members_state(&h.engine, &keys)
    );
    expiries_follow(&h.engine, &fresh, &keys, 0);

    // The active dies; the standby takes over with the replicated members.
    e.become_active();
    let mut s = Harness::with_engine(e, 4);
    s.now = h.now;
    // A semaphore of 2 with 2 replicated permits grants no third; a writer
    // waits for the replicated readers.
    s.send(cid(0), "C sem 2 10000 0").unwrap();
    s.send(cid(1), "A k 10000 0").unwrap();
    assert!(s.answers(cid(0)).is_empty() && s.answers(cid(1)).is_empty());
    // The holders renew and release with their tokens.
    s.send(cid(2), &format!("N sem {p1} 10000")).unwrap();
    assert_eq!(s.answers(cid(2)), ["N sem 1"]);
    s.send(cid(2), &format!("R sem {p1}")).unwrap();
    assert_eq!(s.answers(cid(2)), ["R sem 1"]);
    let third = token(&s.answers(cid(0))[0]);
    assert!(third > p2 && third > gone, "{third}");
    s.send(cid(3), &format!("R k {r2}")).unwrap();
    s.send(cid(3), &format!("R k {r1}")).unwrap();
    assert_eq!(s.answers(cid(3)), ["R k 1", "R k 1"]);
    let writer = token(&s.answers(cid(1))[0]);
    assert!(writer > third);
}

#[test]
fn replicated_members_expire_on_the_standby_and_bad_values_are_refused() {
    let now = Now {
        ms: 1_000,
        us: 1_000_000,
        unix_ns: 1_700_000_000_000_000_000,
    };
    let mut e = Engine::with_max_locks(now, "127.0.0.1:7172", 2);
    e.step_down(None, &mut Outbox::new());
    let h = Holder::default();
    assert_eq!(
        e.apply_member(now, b"k", 5, 10, crate::proto::MAX_PERMITS + 1, h),
        Err(GrantRefusal::LimitOutOfRange(crate::proto::MAX_PERMITS + 1))
    );
    assert_eq!(
        e.apply_member(now, b"k", token::MAX_TOKEN + 1, 10, 0, h),
        Err(GrantRefusal::TokenOutOfRange(token::MAX_TOKEN + 1))
    );
    assert_eq!(
        e.apply_member(now, b"k", 5, MAX_LEASE_MS + 1, 0, h),
        Err(GrantRefusal::LeaseOutOfRange(MAX_LEASE_MS + 1))
    );
    e.apply_member(now, b"k", 5, 10, 0, h).unwrap();
    e.apply_member(now, b"k", 6, 20, 0, h).unwrap();
    assert_eq!(
        e.apply_member(now, b"k", 7, 10, 0, h),
        Err(GrantRefusal::MembersFull { max_locks: 2 })
    );
    e.check_invariants();
    assert_eq!(e.lock_count(), 1);
    assert_eq!(e.highest_token(), 6);
    // An exclusive grant of the key from the active replaces them.
    e.apply_grant(now, b"k", 8, 10, h).unwrap();
    assert_eq!(e.member_count(), 0);
    e.apply_member(now, b"k", 9, 10, 2, h).unwrap();
    assert_eq!(e.holder(b"k"), None);
    assert_eq!(e.semaphore_limit(b"k"), Some(2));
    e.check_invariants();
    let later = Now {
        ms: now.ms + 12,
        us: now.us + 12_000,
        unix_ns: now.unix_ns + 12_000_000,
    };
    e.tick(later, &mut Outbox::new());
    e.check_invariants();
    assert_eq!(e.member_count(), 0);
    assert_eq!(e.lock_count(), 0);
}

#[test]
fn merged_members_join_the_winners_and_block_new_grants_until_under_the_limit() {
    let mut h = Harness::new(3);
    let mine = h.granted(cid(0), "C sem 2 10000 0");
    let o = Holder::default();
    // The other side held two permits of the same semaphore.
    let theirs = [mine + 100, mine + 101];
    for t in theirs {
        let merged = h
            .engine
            .merge_member(h.now, b"sem", t, 5_000, 2, o, &mut h.out)
            .unwrap();
        assert_eq!(merged, Merged::Beside);
    }
    assert_eq!(
        h.engine
            .merge_member(h.now, b"sem", theirs[0], 1_000, 2, o, &mut h.out),
        Ok(Merged::Known)
    );
    h.check();
    // Three held of two: nobody new until two have gone.
    h.send(cid(1), "C sem 2 10000 0").unwrap();
    h.send(cid(0), &format!("R sem {}", theirs[0])).unwrap();
    assert!(h.answers(cid(1)).is_empty());
    h.send(cid(0), &format!("R sem {mine}")).unwrap();
    let next = token(&h.answers(cid(1))[0]);
    assert!(next > theirs[1]);
    // A free key adopts a merged member with its kind.
    assert_eq!(
        h.engine
            .merge_member(h.now, b"free", 7, 5_000, 3, o, &mut h.out),
        Ok(Merged::Adopted)
    );
    assert_eq!(h.engine.semaphore_limit(b"free"), Some(3));
    h.check();
}

#[test]
fn merged_shared_and_exclusive_grants_of_one_key_keep_it_from_anyone_new() {
    let mut h = Harness::new(3);
    let o = Holder::default();
    // Here: an exclusive grant; there: a reader of the same key.
    let writer = h.granted(cid(0), "A w 10000 0");
    let reader = writer + 50;
    assert_eq!(
        h.engine
            .merge_member(h.now, b"w", reader, 5_000, 0, o, &mut h.out),
        Ok(Merged::Beside)
    );
    h.check();
    h.send(cid(1), "G w 10000 0").unwrap();
    h.send(cid(0), &format!("R w {writer}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R w 1"]);
    assert!(
        h.answers(cid(1)).is_empty(),
        "granted beside a merged reader"
    );
    h.send(cid(2), &format!("R w {reader}")).unwrap();
    assert_eq!(h.answers(cid(2)), ["R w 1"]);
    assert!(token(&h.answers(cid(1))[0]) > reader);

    // Here: readers and a waiting permit-less writer; there: a writer.
    let r1 = h.granted(cid(0), "G r 10000 0");
    let r2 = h.granted(cid(1), "G r 10000 0");
    h.send(cid(2), "A r 10000 0").unwrap();
    let theirs = r2 + 50;
    assert_eq!(
        h.engine
            .merge_grant(h.now, b"r", theirs, 5_000, o, &mut h.out),
        Ok(Merged::Beside)
    );
    h.check();
    assert!(h.engine.members_of(b"r").is_empty());
    assert_eq!(h.engine.holder(b"r").map(|(t, _)| t), Some(theirs));
    // The readers still release (and renew) with their tokens.
    h.send(cid(0), &format!("N r {r1} 10000")).unwrap();
    h.send(cid(0), &format!("R r {r1}")).unwrap();
    h.send(cid(1), &format!("R r {r2}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["N r 1", "R r 1"]);
    assert_eq!(h.answers(cid(1)), ["R r 1"]);
    assert!(
        h.answers(cid(2)).is_empty(),
        "the writer granted beside a merged writer"
    );
    h.send(cid(0), &format!("R r {theirs}")).unwrap();
    assert!(token(&h.answers(cid(2))[0]) > theirs);
    h.check();
}

#[test]
fn shared_grants_and_permits_are_bounded_by_max_locks() {
    // One connection asking a shared key again and again must not hold
    // grants without end: --max-locks bounds the members as it bounds the
    // locks.
    let now = Now {
        ms: 1_000,
        us: 1_000_000,
        unix_ns: 1_700_000_000_000_000_000,
    };
    let mut h = Harness::with_engine(Engine::with_max_locks(now, "127.0.0.1:7171", 3), 1);
    let first = h.granted(cid(0), "G k 10 0");
    h.granted(cid(0), "G k 10 0");
    h.granted(cid(0), "C s 5 10 0");
    assert_eq!(
        h.send(cid(0), "G k 10 0"),
        Err(Refusal::MembersFull { max_locks: 3 })
    );
    assert_eq!(
        h.send(cid(0), "C s 5 10 0"),
        Err(Refusal::MembersFull { max_locks: 3 })
    );
    assert!(h.answers(cid(0)).is_empty());
    assert_eq!(h.engine.member_count(), 3);
    // Once one ends, the next is granted.
    h.send(cid(0), &format!("R k {first}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
    h.granted(cid(0), "G k 10 0");
    assert_eq!(h.engine.member_count(), 3);
}

#[test]
fn listings_show_the_newest_member() {
    let mut h = Harness::new(2);
    h.granted(cid(0), "G k 10 0");
    let b = h.granted(cid(1), "G k 20 0");
    h.send(cid(0), "L 0 10").unwrap();
    assert_eq!(
        h.answers(cid(0)),
        [format!("K k {b} 20001 0"), "L 0".into()]
    );
    h.send(cid(0), "Q k").unwrap();
    let q = h.answers(cid(0));
    assert!(q[0].starts_with(&format!("K k {b} 20001 0 0 ")), "{q:?}");
}

#[test]
fn the_kinds_listing_says_how_each_key_is_held() {
    let mut h = Harness::new(4);
    let x = h.granted(cid(0), "A x 10 0");
    h.granted(cid(1), "G r 10 0");
    h.granted(cid(2), "G r 10 0");
    let r = h.granted(cid(3), "G r 10 0");
    h.granted(cid(0), "C s 2 10 0");
    let s = h.granted(cid(1), "C s 2 10 0");
    h.send(cid(2), "C s 2 10 0").unwrap();
    h.send(cid(3), "A x 10 0").unwrap();
    h.send(cid(1), "A r 10 0").unwrap();
    let _ = (h.answers(cid(2)), h.answers(cid(3)), h.answers(cid(1)));
    h.send(cid(0), "V 0 10").unwrap();
    let mut lines = h.answers(cid(0));
    assert_eq!(lines.pop().as_deref(), Some("V 0"));
    lines.sort();
    let fields: Vec<Vec<String>> = lines
        .iter()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect();
    // key, token, waiters, kind, limit, holders
    let shown: Vec<[&str; 6]> = fields
        .iter()
        .map(|f| [&*f[1], &*f[2], &*f[4], &*f[8], &*f[9], &*f[10]])
        .collect();
    let (r, s, x) = (r.to_string(), s.to_string(), x.to_string());
    assert_eq!(
        shown,
        [
            ["r", &*r, "1", "shared", "0", "3"],
            ["s", &*s, "1", "semaphore", "2", "2"],
            ["x", &*x, "1", "exclusive", "0", "1"],
        ],
        "{lines:?}"
    );
    // `L` and `W` keep their forms.
    h.send(cid(0), "L 0 10").unwrap();
    assert!(
        h.answers(cid(0))
            .iter()
            .all(|l| l.split(' ').count() == 5 || l == "L 0")
    );
    h.send(cid(0), "W 0 10").unwrap();
    assert!(
        h.answers(cid(0))
            .iter()
            .all(|l| l.split(' ').count() == 8 || l == "W 0")
    );
}

/// The active replicates more permits than the semaphore's limit (a heal
/// merged the other side's, or a release was lost): the standby applies
/// every one, since the active is authoritative and a refused permit would
/// be lost at a failover while its holder goes on. It counts the permits it
/// took over the limit (a renewal of one is not counted again). Promoted,
/// it lists the key with all its holders, grants no permit until the key
/// is back under its limit, then grants the waiter in FIFO order.
#[test]
fn permits_over_the_limit_are_applied_counted_and_served_after_failover() {
    let mut h = Harness::new(0);
    h.engine = standby(h.now);
    for c in 0..3 {
        h.engine.open(cid(c), &mut h.out);
    }
    let who = Holder::default();
    for token in [10, 11, 12] {
        h.engine
            .apply_member(h.now, b"s", token, 1_000, 2, who)
            .unwrap();
        h.check();
    }
    assert_eq!(h.engine.stats().permits_over_limit, 1);
    h.engine
        .apply_member(h.now, b"s", 12, 2_000, 2, who)
        .unwrap();
    assert_eq!(h.engine.stats().permits_over_limit, 1, "a renewal");
    assert_eq!(h.engine.members_of(b"s").len(), 3);
    h.engine.become_active();
    h.check();
    h.send(cid(0), "V 0 10").unwrap();
    let listed = h.answers(cid(0));
    assert_eq!(listed.len(), 2, "{listed:?}");
    let fields: Vec<&str> = listed[0].split(' ').collect();
    assert_eq!(
        [fields[1], fields[2], fields[8], fields[9], fields[10]],
        ["s", "12", "semaphore", "2", "3"],
        "{listed:?}"
    );
    // Over the limit and at it, a permit waits.
    h.send(cid(1), "C s 2 10 1").unwrap();
    assert!(h.answers(cid(1)).is_empty());
    h.send(cid(2), "R s 10").unwrap();
    assert_eq!(h.answers(cid(2)), ["R s 1"]);
    assert!(h.answers(cid(1)).is_empty(), "at the limit");
    // Under it: the waiter is granted, with a token above every one seen.
    h.send(cid(2), "R s 11").unwrap();
    assert_eq!(h.answers(cid(2)), ["R s 1"]);
    let granted = h.answers(cid(1));
    assert_eq!(granted.len(), 1, "{granted:?}");
    assert!(token(&granted[0]) > 12, "{granted:?}");
    assert_eq!(h.engine.members_of(b"s").len(), 2);
    // Full again: a new permit waits, and its wait runs out.
    h.send(cid(0), "C s 2 10 0.005").unwrap();
    assert!(h.answers(cid(0)).is_empty());
    h.advance_each_ms(10);
    assert_eq!(h.answers(cid(0)), ["C s 0"]);
}
