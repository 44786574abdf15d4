//! Round trips, bounds and malformed lines of the peer protocol.

use super::encode::encode_member;
use super::*;
use crate::cluster::auth::{Fingerprint, MAC_LEN, NONCE_LEN};
use crate::engine::Replication;
use crate::engine::token::MAX_TOKEN;
use crate::proto::MAX_PERMITS;

fn all_kinds() -> Vec<PeerMsg<'static>> {
    vec![
        PeerMsg::Hello {
            version: VERSION,
            fingerprint: Fingerprint(0x0123_4567_89ab_cdef),
            from: PeerId(2),
            addr: b"127.0.0.1:7173",
            incarnation: u64::MAX,
            nonce: [0xa5; NONCE_LEN],
        },
        PeerMsg::Challenge {
            fingerprint: Fingerprint(0),
            index: PeerId(MAX_PEERS - 1),
            addr: b"db1.example:7171",
            nonce: [0; NONCE_LEN],
            mac: [0xff; MAC_LEN],
        },
        PeerMsg::Auth { mac: [7; MAC_LEN] },
        PeerMsg::Heartbeat {
            active: true,
            following: None,
            highest: MAX_TOKEN,
            synced: false,
        },
        PeerMsg::Heartbeat {
            active: false,
            following: Some(PeerId(0)),
            highest: 5,
            synced: true,
        },
        PeerMsg::Snapshot { highest: 7 },
        PeerMsg::Grant {
            key: b"k\xff",
            token: 3,
            remaining_ms: MAX_REMAINING_MS,
            holder: Holder::default(),
        },
        PeerMsg::Grant {
            key: b"k",
            token: 3,
            remaining_ms: 1,
            holder: Holder {
                addr: Some(b"[::1]:40000"),
                owner: Some(b"host-a/job-42"),
                identity: None,
            },
        },
        PeerMsg::Grant {
            key: b"k",
            token: 3,
            remaining_ms: 1,
            holder: Holder {
                addr: None,
                owner: Some(b"o"),
                identity: None,
            },
        },
        PeerMsg::Grant {
            key: b"k",
            token: 3,
            remaining_ms: 1,
            holder: Holder {
                addr: None,
                owner: None,
                identity: Some(b"spiffe://x/alice"),
            },
        },
        PeerMsg::Release {
            key: b"k",
            token: 3,
        },
        PeerMsg::Synced,
        PeerMsg::Handoff { highest: 11 },
        PeerMsg::Merge { highest: 12 },
        PeerMsg::Merged,
        PeerMsg::Probe { seq: 0 },
        PeerMsg::Probed { seq: u64::MAX },
    ]
    .into_iter()
    .chain(member_kinds())
    .collect()
}

fn member_kinds() -> Vec<PeerMsg<'static>> {
    vec![
        PeerMsg::Limit { limit: 1 },
        PeerMsg::Limit { limit: MAX_PERMITS },
        PeerMsg::Member {
            key: b"k\xff",
            token: MAX_TOKEN,
            remaining_ms: MAX_REMAINING_MS,
            holder: Holder::default(),
            permit: false,
        },
        PeerMsg::Member {
            key: b"k",
            token: 9,
            remaining_ms: 1,
            holder: Holder {
                addr: Some(b"[::1]:40000"),
                owner: Some(b"host-a/job-42"),
                identity: Some(b"spiffe://x/alice"),
            },
            permit: true,
        },
    ]
}

#[test]
fn every_message_round_trips() {
    for msg in all_kinds() {
        let mut out = Vec::new();
        encode(&mut out, &msg);
        assert_eq!(out.last(), Some(&b'\n'));
        let line = &out[..out.len() - 1];
        assert!(is_peer_line(line));
        assert!(line.len() < crate::proto::MAX_LINE, "{}", line.len());
        assert_eq!(parse(line), Ok(msg));
    }
}

#[test]
fn replication_events_become_grant_and_release_lines() {
    let events = [
        Replication::Granted {
            key: b"k\xff",
            token: 3,
            remaining_ms: MAX_REMAINING_MS,
            holder: Holder {
                addr: Some(b"127.0.0.1:5"),
                owner: None,
                identity: Some(b"alice"),
            },
        },
        Replication::Released {
            key: b"k",
            token: MAX_TOKEN,
        },
    ];
    let mut old = Vec::new();
    for event in events {
        encode_replication(&mut old, event, 2);
    }
    assert_eq!(old, b"P G k\xff 3 86400000\nP X k 9223372036854775807\n");
    let mut v3 = Vec::new();
    encode_replication(&mut v3, events[0], 3);
    assert_eq!(v3, b"P G k\xff 3 86400000 127.0.0.1:5 -\n");
    let mut out = Vec::new();
    for event in events {
        encode_replication(&mut out, event, HEX_VERSION - 1);
    }
    assert_eq!(
        out,
        b"P G k\xff 3 86400000 127.0.0.1:5 - alice\nP X k 9223372036854775807\n"
    );
    let mut lines = out.split(|&b| b == b'\n');
    assert_eq!(
        lines.next().map(parse),
        Some(Ok(PeerMsg::Grant {
            key: b"k\xff",
            token: 3,
            remaining_ms: MAX_REMAINING_MS,
            holder: Holder {
                addr: Some(b"127.0.0.1:5"),
                owner: None,
                identity: Some(b"alice"),
            },
        }))
    );
    assert_eq!(
        lines.next().map(parse),
        Some(Ok(PeerMsg::Release {
            key: b"k",
            token: MAX_TOKEN
        }))
    );
}

#[test]
fn members_become_shared_and_permit_lines_from_version_5() {
    let shared = Replication::Member {
        key: b"k",
        token: 7,
        remaining_ms: 500,
        holder: Holder {
            addr: Some(b"127.0.0.1:5"),
            owner: None,
            identity: Some(b"alice"),
        },
        limit: 0,
    };
    let permit = Replication::Member {
        key: b"sem",
        token: 8,
        remaining_ms: 600,
        holder: Holder::default(),
        limit: 3,
    };
    for version in MIN_VERSION..SHARED_VERSION {
        let mut out = Vec::new();
        encode_replication(&mut out, shared, version);
        encode_replication(&mut out, permit, version);
        assert_eq!(out, b"", "version {version}");
    }
    let mut out = Vec::new();
    encode_replication(&mut out, shared, VERSION);
    encode_replication(&mut out, permit, VERSION);
    assert_eq!(
        out,
        b"P S k 7 500 127.0.0.1:5 - alice\nP L 3\nP C sem 8 600 - - -\n"
    );
    let parsed: Vec<_> = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(parse)
        .collect();
    assert_eq!(
        parsed,
        [
            Ok(PeerMsg::Member {
                key: b"k",
                token: 7,
                remaining_ms: 500,
                holder: Holder {
                    addr: Some(b"127.0.0.1:5"),
                    owner: None,
                    identity: Some(b"alice"),
                },
                permit: false,
            }),
            Ok(PeerMsg::Limit { limit: 3 }),
            Ok(PeerMsg::Member {
                key: b"sem",
                token: 8,
                remaining_ms: 600,
                holder: Holder::default(),
                permit: true,
            }),
        ]
    );
}

#[test]
fn the_longest_member_line_fits() {
    let key = vec![b'k'; MAX_KEY];
    let addr = vec![b'a'; MAX_HOLDER_ADDR];
    let owner = vec![b'o'; MAX_OWNER];
    let identity = vec![b'i'; MAX_IDENTITY];
    let mut out = Vec::new();
    encode_member(
        &mut out,
        true,
        &key,
        MAX_TOKEN,
        MAX_REMAINING_MS,
        Holder {
            addr: Some(&addr),
            owner: Some(&owner),
            identity: Some(&identity),
        },
    );
    assert_eq!(out.len(), LONGEST_GRANT_LINE);
    assert!(parse(&out[..out.len() - 1]).is_ok());
}

#[test]
fn malformed_peer_lines_are_errors() {
    let nonce = "ab".repeat(NONCE_LEN);
    let mac = "cd".repeat(MAC_LEN);
    let lines = [
        "P".to_string(),
        "P HB A - 1".into(),
        "P HB Q - 1 0".into(),
        "P HB S 0 1 2".into(),
        "P HB S 16 1 1".into(),
        "P HB S 0 9223372036854775808 1".into(),
        "P HB S 0 18446744073709551615 1".into(),
        "P HB S 0 1 1 extra".into(),
        "P HB S 0 1 1 a b c d e f g h i j".into(),
        "P SNAP 18446744073709551615".into(),
        "P HANDOFF 18446744073709551615".into(),
        "P G k 1".into(),
        "P G k 1 1 -".into(),
        "P G k 1 1 - - x y".into(),
        "P G k 1 1 - - *".into(),
        "P G k 1 1 - - a\x01".into(),
        format!("P G k 1 1 - - {}", "i".repeat(MAX_IDENTITY + 1)),
        "P G k 1 1 a\x01b -".into(),
        "P G k 1 1 - caf\u{e9}".into(),
        format!("P G k 1 1 {} -", "a".repeat(65)),
        "P G k 1 1 - o\x7f".into(),
        "P G k 1 86400001".into(),
        "P G k 9223372036854775808 5".into(),
        "P G bad\x01key 1 1".into(),
        "P X k 18446744073709551615".into(),
        "P HELLO 1 0 a 1".into(),
        format!("P HELLO 2 0123456789abcdef 0 a:1 1 {}", &nonce[1..]),
        format!("P HELLO 2 0123456789ABCDEF 0 a:1 1 {nonce}"),
        format!("P HELLO 2 0123456789abcdef 16 a:1 1 {nonce}"),
        format!("P HELLO 2 0123456789abcdef 99999999999999999999 a:1 1 {nonce}"),
        format!("P HELLO 2 0123456789abcdef 0 a:1 x {nonce}"),
        format!("P CHALLENGE 0123456789abcdef 0 a:1 {nonce} {}", &mac[2..]),
        format!("P AUTH {mac}0"),
        "P AUTH".into(),
        "P MERGE".into(),
        "P MERGE 9223372036854775808".into(),
        "P MERGE 1 2".into(),
        "P MERGED 1".into(),
        "P L 0".into(),
        "P L 65537".into(),
        "P L 18446744073709551616".into(),
        "P L".into(),
        "P L 1 2".into(),
        "P S k 1 1 - -".into(),
        "P S k 1 1".into(),
        "P C k 1 1 - - - x".into(),
        "P S k 9223372036854775808 1 - - -".into(),
        "P C k 1 86400001 - - -".into(),
        "P S bad\x01key 1 1 - - -".into(),
        "P S k 1 1 a\x01b - -".into(),
        "P C k 1 1 - o\x7f -".into(),
        "P C k 1 1 - - *".into(),
        format!("P S k 1 1 - - {}", "i".repeat(MAX_IDENTITY + 1)),
        "P PROBE".into(),
        "P PROBE x".into(),
        "P PROBE 18446744073709551616".into(),
        "P PROBED 1 2".into(),
        "P PROBED -1".into(),
        "P NOPE".into(),
        "A k 1 0".into(),
    ];
    for line in lines {
        assert!(parse(line.as_bytes()).is_err(), "{line}");
    }
}

#[test]
fn error_reasons_are_printable_and_short() {
    let mut line = b"P G \x01\x7f\xff\r".to_vec();
    line.extend(std::iter::repeat_n(b'k', 400));
    let err = parse(&line).unwrap_err().to_string();
    assert!(err.bytes().all(|b| (0x20..0x7f).contains(&b)), "{err}");
    assert!(err.len() < 120, "{err}");
    assert!(err.contains("\\x01\\x7f\\xff"), "{err}");
}

#[test]
fn a_wrong_version_says_so() {
    let err = parse(b"P HELLO 1 0 127.0.0.1:7171 5")
        .unwrap_err()
        .to_string();
    assert!(err.contains("version \"1\" unsupported"), "{err}");
    let newer = format!("P HELLO {} 0 127.0.0.1:7171 5", VERSION + 1);
    let err = parse(newer.as_bytes()).unwrap_err().to_string();
    // What an older node says of a newer one: the dialer reads this
    // (`Cluster::downgrade_if_refused`).
    assert!(
        err.contains(&format!(
            "peer protocol version \"{}\" unsupported",
            VERSION + 1
        )),
        "{err}"
    );
}

#[test]
fn both_versions_are_spoken() {
    let nonce = "ab".repeat(NONCE_LEN);
    for version in MIN_VERSION..=VERSION {
        let line = format!("P HELLO {version} 0123456789abcdef 0 a:1 1 {nonce}");
        match parse(line.as_bytes()) {
            Ok(PeerMsg::Hello { version: v, .. }) => assert_eq!(v, version),
            other => panic!("{line}: {other:?}"),
        }
    }
}

#[test]
fn lines_cut_or_mangled_anywhere_never_panic() {
    // Every prefix and every single-byte change of every message kind.
    for msg in all_kinds() {
        let mut out = Vec::new();
        encode(&mut out, &msg);
        out.pop();
        for cut in 0..=out.len() {
            let _ = parse(&out[..cut]);
        }
        for i in 0..out.len() {
            for b in [b' ', b'0', b'9', b'a', b'-', 0, 0xff] {
                let mut changed = out.clone();
                changed[i] = b;
                let _ = parse(&changed);
            }
        }
    }
}

/// Replication events of every shape: grants with and without each holder
/// field, releases, tokens and leases at their bounds.
fn hex_events() -> Vec<Replication<'static>> {
    let holders = [
        Holder::default(),
        Holder {
            addr: Some(b"127.0.0.1:5"),
            owner: None,
            identity: Some(b"alice"),
        },
        Holder {
            addr: None,
            owner: Some(b"host-a/job-42"),
            identity: None,
        },
        Holder {
            addr: Some(b"[::1]:40000"),
            owner: Some(b"o"),
            identity: Some(b"CN=x"),
        },
    ];
    let mut events = Vec::new();
    for (i, token) in [0, 1, 15, 16, 1_700_000_000_000_000_000, MAX_TOKEN]
        .into_iter()
        .enumerate()
    {
        for remaining_ms in [0, 1, 30_000, MAX_REMAINING_MS] {
            events.push(Replication::Granted {
                key: if i % 2 == 0 { b"k" } else { b"instr-key-0042" },
                token,
                remaining_ms,
                holder: holders[i % holders.len()],
            });
        }
        events.push(Replication::Released {
            key: b"k\xff",
            token,
        });
    }
    events
}

fn parse_all(bytes: &[u8]) -> Vec<Result<PeerMsg<'_>, WireError>> {
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(parse)
        .collect()
}

#[test]
fn version_6_grants_and_releases_are_hex_lines() {
    let events = [
        Replication::Granted {
            key: b"k\xff",
            token: 1_700_000_000_000_000_000,
            remaining_ms: MAX_REMAINING_MS,
            holder: Holder {
                addr: Some(b"127.0.0.1:5"),
                owner: None,
                identity: Some(b"alice"),
            },
        },
        Replication::Granted {
            key: b"k",
            token: 0,
            remaining_ms: 30_000,
            holder: Holder::default(),
        },
        Replication::Released {
            key: b"k",
            token: MAX_TOKEN,
        },
    ];
    let mut out = Vec::new();
    for event in events {
        encode_replication(&mut out, event, HEX_VERSION);
    }
    assert_eq!(
        out,
        b"P g k\xff 17979cfe362a0000 5265c00 127.0.0.1:5 - alice\n\
          P g k 0 7530 - -\n\
          P x k 7fffffffffffffff\n"
    );
}

#[test]
fn version_6_and_version_5_lines_say_the_same() {
    // Each event's v6 line parses to what its v5 line does, so a follower
    // applies either to the same state; and both are the same lines count.
    let events = hex_events();
    let (mut v5, mut v6) = (Vec::new(), Vec::new());
    for &event in &events {
        encode_replication(&mut v5, event, HEX_VERSION - 1);
        encode_replication(&mut v6, event, HEX_VERSION);
    }
    assert!(v6.len() < v5.len(), "hex is shorter");
    let (old, new) = (parse_all(&v5), parse_all(&v6));
    assert_eq!(old.len(), events.len());
    assert_eq!(old, new);
    assert!(new.iter().all(Result::is_ok), "{new:?}");
    // And the snapshot's form: v6 lines start `P g` and `P x`.
    let kinds: Vec<_> = v6
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| &l[..4])
        .collect();
    assert!(kinds.iter().all(|&k| k == b"P g " || k == b"P x "));
}

#[test]
fn hex_lines_out_of_bounds_say_which_field() {
    let long_identity = format!("P g k 1 1 - - {}", "i".repeat(MAX_IDENTITY + 1));
    let long_addr = format!("P g k 1 1 {} -", "a".repeat(MAX_HOLDER_ADDR + 1));
    for (line, what) in [
        ("P g k 7fffffffffffffff 5265c00 - -", None),
        ("P g k 0 0 - - -", None),
        ("P x k 0", None),
        ("P x k 7fffffffffffffff", None),
        // A token over MAX_TOKEN, over 16 digits, not lowercase, padded.
        ("P g k 8000000000000000 1 - -", Some("token out of range")),
        ("P g k ffffffffffffffff 1 - -", Some("token out of range")),
        ("P g k 10000000000000000 1 - -", Some("token out of range")),
        ("P g k 0000000000000001 1 - -", Some("token out of range")),
        ("P g k 01 1 - -", Some("token out of range")),
        ("P g k A 1 - -", Some("token out of range")),
        ("P g k 12 - - -", Some("remaining lease out of range")),
        ("P g k 1 5265c01 - -", Some("remaining lease out of range")),
        ("P g k 1 -1 - -", Some("remaining lease out of range")),
        ("P g k 1 86400000 - -", Some("remaining lease out of range")),
        ("P g k 1 0x1 - -", Some("remaining lease out of range")),
        // Version 6 always has the holder's address and owner.
        ("P g k 1 1", Some("wrong number of fields")),
        ("P g k 1 1 -", Some("wrong number of fields")),
        ("P g k 1 1 - - i x", Some("wrong number of fields")),
        ("P g bad\x01key 1 1 - -", Some("bad key or address")),
        ("P g k 1 1 - - *", Some("bad identity")),
        (&long_identity, Some("bad identity")),
        (&long_addr, Some("bad holder address")),
        ("P g k 1 1 a\x01b -", Some("bad holder address")),
        ("P g k 1 1 - o\x7f", Some("bad owner")),
        ("P x k", Some("wrong number of fields")),
        ("P x k 1 2", Some("wrong number of fields")),
        ("P x k 8000000000000000", Some("token out of range")),
        ("P x k 10000000000000000", Some("token out of range")),
        ("P x k 00", Some("token out of range")),
        ("P x k -", Some("token out of range")),
        ("P x bad\x01key 1", Some("bad key or address")),
    ] {
        match (parse(line.as_bytes()), what) {
            (Ok(_), None) => {}
            (Err(WireError::Bad { what: got, .. }), Some(want)) => {
                assert_eq!(got, want, "{line:?}");
            }
            (other, _) => panic!("{line:?}: {other:?}"),
        }
    }
}

#[test]
fn hex_lines_cut_or_mangled_anywhere_never_panic() {
    let mut out = Vec::new();
    for event in hex_events() {
        out.clear();
        encode_replication(&mut out, event, HEX_VERSION);
        out.pop();
        for cut in 0..=out.len() {
            let _ = parse(&out[..cut]);
        }
        for i in 0..out.len() {
            for b in [b' ', b'0', b'9', b'a', b'f', b'g', b'-', 0, 0xff] {
                let mut changed = out.clone();
                changed[i] = b;
                let _ = parse(&changed);
            }
        }
    }
}

/// `P g` and `P x` lines of every shape the encoders write, and at the
/// bounds of each field: keys of 1 and 250 bytes, addresses of 64,
/// owners of 128 and identities of 32, numbers at their bounds.
fn hex_lines() -> Vec<Vec<u8>> {
    let key250 = vec![b'k'; MAX_KEY];
    let addr64 = vec![b'a'; MAX_HOLDER_ADDR];
    let owner128 = vec![b'o'; MAX_OWNER];
    let identity32 = vec![b'i'; MAX_IDENTITY];
    let mut lines = Vec::new();
    let mut out = Vec::new();
    for event in hex_events() {
        out.clear();
        encode_replication(&mut out, event, HEX_VERSION);
        lines.push(out[..out.len() - 1].to_vec());
    }
    let holders = [
        Holder {
            addr: Some(&addr64),
            owner: Some(&owner128),
            identity: Some(&identity32),
        },
        Holder {
            addr: Some(b"10.1.2.3:45678"),
            owner: Some(b"host-a/job-42"),
            identity: Some(b"spiffe://x/alice"),
        },
        Holder {
            addr: Some(b"[fe80::1%eth0]:7171"),
            owner: None,
            identity: None,
        },
    ];
    for key in [&key250[..], b"k", b"instr-key-0001", b"\x80\xff~!"] {
        for holder in holders {
            for (token, remaining_ms) in [(MAX_TOKEN, MAX_REMAINING_MS), (1 << 60, 7), (0xabc, 0)] {
                out.clear();
                encode_replication(
                    &mut out,
                    Replication::Granted {
                        key,
                        token,
                        remaining_ms,
                        holder,
                    },
                    HEX_VERSION,
                );
                encode_replication(&mut out, Replication::Released { key, token }, HEX_VERSION);
                lines.extend(
                    out.split(|&b| b == b'\n')
                        .filter(|l| !l.is_empty())
                        .map(<[u8]>::to_vec),
                );
            }
        }
    }
    lines
}

/// [`parse`] and [`parse_general`] give the same result (the same message,
/// or the same error) for `line`; and a valid `P g` or `P x` of eight bytes
/// or more after its kind is taken by the fast path.
fn same_as_general(line: &[u8]) -> bool {
    let fast = parse(line);
    let general = parse_general(line);
    assert_eq!(fast, general, "{}", crate::proto::Quoted(line));
    let stripped = line.strip_suffix(b"\r").unwrap_or(line);
    // What the fast path takes itself: it gives a line it declines to the
    // general parser, here one that refuses everything.
    let declined = |_| Err(WireError::Version { got: String::new() });
    let taken = super::fast::parse_replication(stripped, declined).ok();
    if let Some(msg) = taken {
        assert_eq!(Ok(msg), general);
    }
    let replication = stripped.starts_with(b"P g ") || stripped.starts_with(b"P x ");
    if replication && general.is_ok() && stripped.len() >= 12 {
        assert!(taken.is_some(), "{}", crate::proto::Quoted(line));
    }
    general.is_ok()
}

#[test]
fn the_fast_path_and_the_general_parser_agree_on_every_variant() {
    // Bytes that matter to some field: separators, digits at the edges of
    // hex, letters, the placeholders, the bounds of key and label bytes.
    let bytes = [
        b' ', b'0', b'1', b'9', b'a', b'f', b'g', b'A', b'F', b'-', b'*', b'\r', b'\n', b'\t', 0,
        0x1f, 0x20, 0x21, 0x7e, 0x7f, 0x80, 0xff, b'x', b'P',
    ];
    let (mut ok, mut refused) = (0, 0);
    let mut count = |valid: bool| {
        if valid {
            ok += 1;
        } else {
            refused += 1;
        }
    };
    for line in hex_lines() {
        count(same_as_general(&line));
        for suffix in [&b"\r"[..], b"\r\r", b" ", b" -", b" x y", b"  "] {
            count(same_as_general(&[&line[..], suffix].concat()));
        }
        for cut in 0..line.len() {
            count(same_as_general(&line[..cut]));
            // One byte out.
            count(same_as_general(&[&line[..cut], &line[cut + 1..]].concat()));
        }
        for at in 0..=line.len() {
            for &b in &bytes {
                // One byte in, and one byte changed.
                count(same_as_general(&[&line[..at], &[b], &line[at..]].concat()));
                if at < line.len() {
                    let mut changed = line.clone();
                    changed[at] = b;
                    count(same_as_general(&changed));
                }
            }
        }
    }
    assert!(
        ok > 1_000 && refused > 10_000,
        "{ok} taken, {refused} refused"
    );
}

#[test]
fn the_fast_path_and_the_general_parser_agree_on_generated_fields() {
    // Lines put together from fields valid and not, in every position.
    let fields: &[&[u8]] = &[
        b"k",
        b"instr-key-0001",
        &[b'k'; MAX_KEY],
        &[b'k'; MAX_KEY + 1],
        b"\x80key",
        b"0",
        b"00",
        b"1",
        b"7530",
        b"5265c00",
        b"5265c01",
        b"7fffffffffffffff",
        b"8000000000000000",
        b"17979cfe362a0000",
        b"10000000000000000",
        b"-",
        b"*",
        b"",
        b"127.0.0.1:5",
        &[b'a'; MAX_HOLDER_ADDR],
        &[b'a'; MAX_HOLDER_ADDR + 1],
        b"job/\x80",
        &[b'o'; MAX_OWNER],
        &[b'o'; MAX_OWNER + 1],
        &[b'i'; MAX_IDENTITY],
        &[b'i'; MAX_IDENTITY + 1],
        b"a\x7fb",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..300_000 {
        let mut line = if next(2) == 0 {
            b"P g".to_vec()
        } else {
            b"P x".to_vec()
        };
        for _ in 0..next(8) {
            line.push(b' ');
            line.extend_from_slice(fields[next(fields.len())]);
        }
        if next(16) == 0 {
            line.push(b'\r');
        }
        if same_as_general(&line) {
            ok += 1;
        } else {
            refused += 1;
        }
    }
    assert!(
        ok > 1_000 && refused > 100_000,
        "{ok} taken, {refused} refused"
    );
}
