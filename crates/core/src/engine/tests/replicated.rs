//! Replicated grants and releases (peer input), the replication events
//! an active records, snapshots, and the engine's place below the cluster.

use super::*;
use crate::outbox::cid;

/// A standby harness (no waiters: it answers acquires `M`).
fn standby(conns: u32) -> Harness {
    let mut h = Harness::new(conns);
    h.engine.step_down(Some("10.0.0.1:7171"), &mut h.out);
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
    e.apply_release(now, b"nothing", 5, &mut Outbox::new());
    e.apply_release(now, b"a", 5, &mut Outbox::new());
    e.apply_release(now, b"a", u64::MAX, &mut Outbox::new());
    assert_eq!(e.holder(b"a"), Some((7, now.ms + 3_000)));
    e.apply_release(now, b"a", 7, &mut Outbox::new());
    assert_eq!(e.holder(b"a"), None);
    e.observe_token(token::MAX_TOKEN);
    e.clear_grants();
    assert_eq!(e.lock_count(), 0);
    assert_eq!(e.next_deadline(), None, "every lease timer went with them");
    e.check_invariants();
}

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
            }
            | Replication::Member {
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
    let t1 = h.grant(cid(0), "k", "10");
    h.send(cid(1), "A k 5 0").unwrap();
    h.advance(1_000);
    h.send(cid(0), &format!("N k {t1} 20")).unwrap();
    h.send(cid(0), &format!("R k {t1}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["N k 1", "R k 1"]);
    let t2 = token_of(&h.answers(cid(1))[0], "k");
    let key = "x".repeat(250);
    let t3 = h.grant(cid(0), &key, "0.5");
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
    h.send(cid(0), &format!("R k {t1}")).unwrap();
    h.send(cid(0), &format!("N k {t1} 1")).unwrap();
    assert_eq!(events(&mut h.engine), []);
}

#[test]
fn only_an_active_with_replication_enabled_records() {
    let mut h = Harness::new(1);
    let t = h.grant(cid(0), "k", "10");
    h.send(cid(0), &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["R k 1"]);
    assert_eq!(events(&mut h.engine), [], "replication not enabled");

    let mut h = standby(1);
    h.engine.enable_replication();
    let now = h.now;
    h.engine
        .apply_grant(now, b"k", 5, 100, Holder::default())
        .unwrap();
    h.engine.apply_release(now, b"k", 5, &mut h.out);
    h.engine
        .apply_grant(now, b"k", 6, 100, Holder::default())
        .unwrap();
    h.advance(200);
    assert_eq!(h.engine.holder(b"k"), None);
    assert_eq!(events(&mut h.engine), [], "a standby records nothing");
    h.engine.become_active();
    let t = h.grant(cid(0), "k", "1");
    assert_eq!(events(&mut h.engine), [("k".into(), t, Some(1_001))]);
}

#[test]
fn a_log_reused_turn_after_turn_keeps_its_room() {
    let mut h = Harness::new(1);
    h.engine.enable_replication();
    let mut log = ReplicationLog::new();
    for turn in 0..3 {
        for i in 0..64 {
            let t = h.grant(cid(0), &format!("key-{i:03}"), "10");
            h.send(cid(0), &format!("R key-{i:03} {t}")).unwrap();
            assert_eq!(h.answers(cid(0)), [format!("R key-{i:03} 1")]);
        }
        h.engine.take_replication(&mut log);
        assert_eq!(log.iter().count(), 128, "turn {turn}");
        let keys: Vec<&[u8]> = log
            .iter()
            .map(|e| match e {
                Replication::Granted { key, .. }
                | Replication::Released { key, .. }
                | Replication::Believed { key, .. }
                | Replication::Member { key, .. } => key,
            })
            .collect();
        assert_eq!(keys[126], b"key-063");
        assert_eq!(keys[127], b"key-063");
    }
}

#[test]
fn a_snapshot_lists_the_grants_with_lease_left() {
    let mut h = Harness::new(1);
    let a = h.grant(cid(0), "a", "10");
    let b = h.grant(cid(0), "b", "0.1");
    h.advance(50);
    let mut grants: Vec<_> = h.engine.snapshot(h.now).collect();
    grants.sort_by_key(|e| match e {
        Replication::Granted { token, .. }
        | Replication::Released { token, .. }
        | Replication::Believed { token, .. }
        | Replication::Member { token, .. } => *token,
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
/// this crate is its own, the client protocol's, the access rules' or the
/// outbox's (which itself names only the client protocol).
#[test]
fn the_engine_uses_nothing_above_it() {
    let sources = [
        ("conns.rs", include_str!("../conns.rs")),
        ("handoff.rs", include_str!("../handoff.rs")),
        ("holders.rs", include_str!("../holders.rs")),
        ("invariants.rs", include_str!("../invariants.rs")),
        ("list.rs", include_str!("../list.rs")),
        ("merge.rs", include_str!("../merge.rs")),
        ("mod.rs", include_str!("../mod.rs")),
        ("multi.rs", include_str!("../multi.rs")),
        (
            "multi/replication.rs",
            include_str!("../multi/replication.rs"),
        ),
        ("replicated.rs", include_str!("../replicated.rs")),
        ("replication.rs", include_str!("../replication.rs")),
        ("request.rs", include_str!("../request.rs")),
        ("stats.rs", include_str!("../stats.rs")),
        ("table.rs", include_str!("../table.rs")),
        ("token.rs", include_str!("../token.rs")),
        ("wheel.rs", include_str!("../wheel.rs")),
        ("../outbox.rs", include_str!("../../outbox.rs")),
    ];
    for (file, source) in sources {
        for (at, _) in source.match_indices("crate::") {
            let path = &source[at + "crate::".len()..];
            assert!(
                path.starts_with("proto")
                    || path.starts_with("engine")
                    || path.starts_with("access")
                    || path.starts_with("outbox"),
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
