use super::*;

/// A self-signed certificate with these subject alternative names and CN.
fn cert(sans: Vec<rcgen::SanType>, cn: Option<&str>) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = sans;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "ringlock tests");
    if let Some(cn) = cn {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
    }
    params.self_signed(&key).unwrap().der().to_vec()
}

fn dns(name: &str) -> rcgen::SanType {
    rcgen::SanType::DnsName(name.try_into().unwrap())
}

fn uri(name: &str) -> rcgen::SanType {
    rcgen::SanType::URI(name.try_into().unwrap())
}

#[test]
fn the_identity_is_the_first_uri_then_dns_san_then_the_cn() {
    let both = cert(
        vec![
            dns("b.example"),
            uri("spiffe://x/alice"),
            uri("spiffe://x/2"),
        ],
        Some("carol"),
    );
    assert_eq!(identity_of(&both).unwrap(), b"spiffe://x/alice");
    let dns_only = cert(vec![dns("b.example"), dns("c.example")], Some("carol"));
    assert_eq!(identity_of(&dns_only).unwrap(), b"b.example");
    let cn_only = cert(vec![], Some("carol"));
    assert_eq!(identity_of(&cn_only).unwrap(), b"carol");
    let nothing = cert(vec![], None);
    assert!(
        identity_of(&nothing)
            .unwrap_err()
            .to_string()
            .contains("names no identity")
    );
}

#[test]
fn identities_too_long_or_with_spaces_are_refused() {
    let long = "a".repeat(MAX_IDENTITY + 1);
    let err = identity_of(&cert(vec![], Some(&long)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no usable identity"), "{err}");
    assert!(identity_of(&cert(vec![], Some(&long[1..]))).is_ok());
    let err = identity_of(&cert(vec![], Some("two words")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("subject common name"), "{err}");
    assert!(identity_of(&cert(vec![], Some("-"))).is_err());
    assert!(identity_of(&cert(vec![], Some("*"))).is_err());
}

#[test]
fn truncated_or_corrupt_certificates_never_panic() {
    let good = cert(vec![dns("b.example")], Some("carol"));
    for cut in 0..good.len() {
        let _ = identity_of(&good[..cut]);
    }
    let mut bad = good.clone();
    for i in 0..bad.len() {
        let old = bad[i];
        for b in [0x00, 0x30, 0x80, 0x84, 0xff] {
            bad[i] = b;
            let _ = identity_of(&bad);
        }
        bad[i] = old;
    }
    assert!(identity_of(&[]).is_err());
    assert!(identity_of(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
}

const EXAMPLE: &str = "\
# identity   key prefix   rights (comma-separated: lock, admin)
alice        a/           lock
bob          b/           lock
ops          *            lock,admin
*            public/      lock
";

#[test]
fn rules_give_each_identity_its_prefixes() {
    let acl = Acl::parse(EXAMPLE).unwrap();
    assert_eq!(acl.len(), 4);
    let alice = acl.access(b"alice");
    assert!(alice.may_lock(b"a/x") && alice.may_lock(b"public/y"));
    assert!(!alice.may_lock(b"b/x") && !alice.may_lock(b"a"));
    assert!(!alice.is_admin());
    let ops = acl.access(b"ops");
    assert!(ops.is_admin() && ops.may_lock(b"anything"));
    let eve = acl.access(b"eve");
    assert!(eve.may_lock(b"public/1") && !eve.may_lock(b"a/1"));
    let anyone = Acl::allow_all().access(b"eve");
    assert!(anyone.may_lock(b"a/1") && !anyone.is_admin());
    assert!(!Acl::parse("").unwrap().access(b"eve").may_lock(b"k"));
}

#[test]
fn bad_rules_are_refused_with_their_line_number() {
    for (text, line, what) in [
        ("alice a/\n", 1, "want 3 fields"),
        ("# c\n\nalice a/ lock\nbob b/ write\n", 4, "unknown right"),
        ("alice a/ lock,\n", 1, "unknown right"),
        ("alice a/ admin\n", 1, "admin is about every key"),
        ("- a/ lock\n", 1, "bad identity"),
        ("alice a/ lock extra\n", 1, "want 3 fields"),
    ] {
        let err = Acl::parse(text).unwrap_err();
        assert_eq!(err.line, line, "{text:?}: {err}");
        assert!(err.why.contains(what), "{text:?}: {err}");
    }
    let long = format!("{} a/ lock\n", "x".repeat(MAX_IDENTITY + 1));
    assert!(Acl::parse(&long).unwrap_err().why.contains("bad identity"));
    let many = "a k lock\n".repeat(MAX_RULES + 1);
    assert_eq!(Acl::parse(&many).unwrap_err().line, MAX_RULES + 1);
}

#[test]
fn the_connections_of_one_identity_share_its_access() {
    let acl = Acl::parse(EXAMPLE).unwrap();
    let first = acl.access(b"alice");
    let second = acl.access(b"alice");
    assert!(
        std::sync::Arc::ptr_eq(&first, &second),
        "one copy per identity"
    );
    assert!(!std::sync::Arc::ptr_eq(&first, &acl.access(b"bob")));
    // Reloaded rules start their own copies, and give what they say.
    let reloaded = Acl::parse("alice b/ lock\n").unwrap();
    let after = reloaded.access(b"alice");
    assert!(!std::sync::Arc::ptr_eq(&first, &after));
    assert!(after.may_lock(b"b/1") && !after.may_lock(b"a/1"));
    assert!(
        first.may_lock(b"a/1"),
        "a connection keeps the rules it got"
    );
    assert_eq!(acl.clone(), acl, "rule sets compare by their rules");
}
