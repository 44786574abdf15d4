//! Grants merged at a heal: adopted, or kept beside the key's grant.

use super::*;
use crate::outbox::cid;

/// A heal's merge on the active that stays: a key it does not hold is
/// adopted, the same grant keeps the longer lease, and a key both sides
/// granted keeps both holders, each able to renew and release with its
/// token, and goes to nobody new until both are done.
#[test]
fn a_merged_grant_is_adopted_or_kept_beside_and_the_key_waits_for_both() {
    let mut h = Harness::new(3);
    h.engine.enable_replication();
    let mine = h.grant(cid(0), "k", "1");
    let theirs = mine + 1_000;
    let now = h.now;
    let merge = |h: &mut Harness, key: &[u8], token, ms| {
        let now = h.now;
        let got = h
            .engine
            .merge_grant(now, key, token, ms, Holder::default(), &mut h.out);
        h.check();
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
    h.send(cid(1), "A k 5 10").unwrap();
    assert!(h.answers(cid(1)).is_empty());
    // The key's own holder releases: the merged one holds it now.
    h.send(cid(0), &format!("R k {mine}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
    assert!(h.answers(cid(1)).is_empty());
    assert_eq!(h.engine.holder(b"k").map(|g| g.0), Some(theirs));
    h.send(cid(2), &format!("N k {theirs} 2")).unwrap();
    assert_eq!(h.answers(cid(2)), ["N k 1"]);
    h.check();
    h.send(cid(2), &format!("R k {theirs}")).unwrap();
    assert_eq!(h.answers(cid(2)), ["R k 1"]);
    let granted = h.answers(cid(1));
    assert_eq!(granted.len(), 1, "{granted:?}");
    let t: u64 = granted[0].strip_prefix("A k ").unwrap().parse().unwrap();
    assert!(t > theirs + 1, "the next grant is above every merged token");
    assert_eq!(h.engine.believed_count(), 0);
    h.check();
}

/// The lock-delay never outlasts the merged leases: with both holders
/// silent, the key goes to its waiter once the longest lease ends, not
/// before; a believed grant whose lease ran out cannot be renewed.
#[test]
fn the_lock_delay_ends_with_the_longest_merged_lease() {
    let mut h = Harness::new(2);
    let mine = h.grant(cid(0), "k", "1");
    let now = h.now;
    let got = h
        .engine
        .merge_grant(now, b"k", mine + 7, 2_000, Holder::default(), &mut h.out);
    assert_eq!(got, Ok(Merged::Beside));
    h.send(cid(1), "A k 5 10").unwrap();
    h.advance(1_500);
    assert!(
        h.answers(cid(1)).is_empty(),
        "granted while a merged lease runs"
    );
    assert_eq!(h.engine.holder(b"k").map(|g| g.0), Some(mine + 7));
    h.advance(600);
    let granted = h.answers(cid(1));
    assert_eq!(granted.len(), 1, "{granted:?}");
    h.send(cid(0), &format!("N k {} 1", mine + 7)).unwrap();
    assert_eq!(h.answers(cid(0)), ["N k 0"]);
    h.check();
}
