//! Identities: only a grant's holder (or an admin) releases and renews it.

use super::*;
use crate::outbox::cid;

/// An engine with identities: connection `c` is `names[c]` under `rules`.
fn identified(names: &[&str], rules: &str) -> Harness {
    let mut h = Harness::new(names.len() as u32);
    h.engine.require_identities();
    let acl = crate::access::Acl::parse(rules).unwrap();
    for (c, name) in names.iter().enumerate() {
        h.engine
            .set_access(ConnId::from_index(c), acl.access(name.as_bytes()));
    }
    h
}

const RULES: &str = "alice a/ lock\nbob a/ lock\nops * admin\n";

#[test]
fn only_the_holder_releases_and_renews_its_grant() {
    let mut h = identified(&["alice", "bob"], RULES);
    let t = h.grant(cid(0), "a/k", "10000");
    let held = h.engine.holder(b"a/k");
    assert_eq!(held.map(|(token, _)| token), Some(t));
    h.send(cid(1), &format!("R a/k {t}")).unwrap();
    h.send(cid(1), &format!("N a/k {t} 50000")).unwrap();
    assert_eq!(h.answers(cid(1)), ["R a/k 0", "N a/k 0"]);
    assert_eq!(h.engine.holder(b"a/k"), held, "nothing changed");
    assert_eq!(h.engine.stats().release_not_holder, 1);
    assert_eq!(h.engine.stats().renew_not_holder, 1);
    assert_eq!(h.engine.stats().release_stale, 0);
    assert_eq!(
        h.engine.holder_of(b"a/k").unwrap().identity,
        Some(&b"alice"[..])
    );
    h.send(cid(0), &format!("N a/k {t} 5000")).unwrap();
    h.send(cid(0), &format!("R a/k {t}")).unwrap();
    assert_eq!(h.answers(cid(0)), ["N a/k 1", "R a/k 1"]);
    // A stale token stays stale, whoever sends it.
    h.send(cid(1), &format!("R a/k {t}")).unwrap();
    assert_eq!(h.answers(cid(1)), ["R a/k 0"]);
    assert_eq!(h.engine.stats().release_stale, 1);
}

#[test]
fn only_the_holder_releases_and_renews_its_shared_grant_or_permit() {
    let mut h = identified(&["alice", "bob", "ops"], RULES);
    for (line, key) in [("G a/s 10000 0", "a/s"), ("C a/p 2 10000 0", "a/p")] {
        h.send(cid(0), line).unwrap();
        let granted = h.answers(cid(0));
        assert_eq!(granted.len(), 1, "{granted:?}");
        let t = token_of(&granted[0].replacen(&granted[0][..1], "A", 1), key);
        h.send(cid(1), &format!("R {key} {t}")).unwrap();
        h.send(cid(1), &format!("N {key} {t} 50000")).unwrap();
        assert_eq!(
            h.answers(cid(1)),
            [format!("R {key} 0"), format!("N {key} 0")]
        );
        assert_eq!(h.engine.member_count(), 1, "nothing changed");
        h.send(cid(0), &format!("N {key} {t} 5000")).unwrap();
        assert_eq!(h.answers(cid(0)), [format!("N {key} 1")]);
        // An admin may.
        h.send(cid(2), &format!("R {key} {t}")).unwrap();
        assert_eq!(h.answers(cid(2)), [format!("R {key} 1")]);
        assert_eq!(h.engine.member_count(), 0);
    }
    assert_eq!(h.engine.stats().release_not_holder, 2);
    assert_eq!(h.engine.stats().renew_not_holder, 2);
    // Outside the rules, a shared acquire is refused like an exclusive one.
    assert_eq!(h.send(cid(1), "G b/x 1000 0"), Err(Refusal::NotAllowed));
}

#[test]
fn an_admin_releases_and_renews_anyones_grant() {
    let mut h = identified(&["alice", "ops"], RULES);
    let t = h.grant(cid(0), "a/k", "10000");
    h.send(cid(1), &format!("N a/k {t} 5000")).unwrap();
    h.send(cid(1), &format!("R a/k {t}")).unwrap();
    assert_eq!(h.answers(cid(1)), ["N a/k 1", "R a/k 1"]);
    assert_eq!(h.engine.holder(b"a/k"), None);
}

#[test]
fn an_acquire_outside_the_rules_is_refused_and_l_lists_only_allowed_keys() {
    let mut h = identified(&["alice", "ops"], "alice a/ lock\nops * admin\n");
    let refusal = h.send(cid(0), "A b/x 1000 0").unwrap_err();
    assert_eq!(refusal, Refusal::NotAllowed);
    assert_eq!(
        h.engine.not_allowed_reason(),
        "not allowed: identity \"alice\" may not lock \"b/x\""
    );
    assert_eq!(h.engine.lock_count(), 0, "nothing was made for it");
    h.grant(cid(1), "b/x", "10000");
    h.grant(cid(0), "a/y", "10000");
    h.send(cid(0), "L 0 100").unwrap();
    let listed = h.answers(cid(0));
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed[0].starts_with("K a/y "), "{listed:?}");
    h.send(cid(0), "Q b/x").unwrap();
    assert_eq!(h.answers(cid(0)), ["Q b/x 0"]);
    h.send(cid(1), "L 0 100").unwrap();
    assert_eq!(h.answers(cid(1)).len(), 3, "an admin lists every key");
}

#[test]
fn a_replicated_grant_keeps_its_identity_and_one_without_is_an_admins_only() {
    let mut h = identified(&["alice", "bob", "ops"], RULES);
    h.engine.step_down(Some("10.0.0.1:7171"), &mut h.out);
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
    h.send(cid(1), "R a/1 5").unwrap();
    h.send(cid(0), "R a/2 6").unwrap();
    assert_eq!(h.answers(cid(1)), ["R a/1 0"]);
    assert_eq!(
        h.answers(cid(0)),
        ["R a/2 0"],
        "no identity known: not alice's"
    );
    h.send(cid(0), "R a/1 5").unwrap();
    h.send(cid(2), "R a/2 6").unwrap();
    assert_eq!(h.answers(cid(0)), ["R a/1 1"]);
    assert_eq!(h.answers(cid(2)), ["R a/2 1"]);
}

#[test]
fn without_identities_anyone_releases_as_before() {
    let mut h = Harness::new(2);
    let t = h.grant(cid(0), "k", "10000");
    h.send(cid(1), &format!("R k {t}")).unwrap();
    assert_eq!(h.answers(cid(1)), ["R k 1"]);
    assert_eq!(h.engine.stats().release_not_holder, 0);
}
