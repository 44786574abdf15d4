//! Fuzzes the request parser (and the answer parser) with arbitrary bytes.
//!
//! Run from the repository root with a nightly toolchain:
//! `cargo +nightly fuzz run parse_request -- -dict=fuzz/parse_request.dict`
//!
//! The same invariants run on stable, over generated inputs, in
//! `crates/proto/src/parser_tests.rs` (`generated_inputs_keep_invariants`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringlock::proto::{MAX_LINE, ParseError, Request, is_valid_key, parse_answer, parse_request};

/// The reason goes out as `E <reason> in line N`: one short line of
/// printable ASCII.
fn check_reason(err: &ParseError<'_>) {
    let reason = err.to_string();
    assert!(!reason.is_empty() && reason.len() <= 200, "{reason:?}");
    assert!(
        reason.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "{reason:?}"
    );
}

fn check(data: &[u8]) {
    let mut enc = Vec::with_capacity(MAX_LINE);
    let mut rest = data;
    loop {
        let window = &rest[..rest.len().min(MAX_LINE)];
        match parse_request(rest) {
            Ok(Some((req, used))) => {
                assert!(used > 0 && used <= MAX_LINE && used <= rest.len());
                assert_eq!(rest[used - 1], b'\n');
                assert!(!rest[..used - 1].contains(&b'\n'));
                if let Some(key) = req.key() {
                    assert!(is_valid_key(key));
                }
                match req {
                    Request::Acquire {
                        lease_ms, wait_ms, ..
                    } => {
                        assert!(lease_ms > 0 && lease_ms <= 86_400_000);
                        assert!(wait_ms <= 86_400_000);
                    }
                    Request::Release { token, .. } => assert!(token > 0),
                    Request::Renew {
                        token, lease_ms, ..
                    } => {
                        assert!(token > 0);
                        assert!(lease_ms > 0 && lease_ms <= 86_400_000);
                    }
                    Request::Shared {
                        lease_ms, wait_ms, ..
                    } => {
                        assert!(lease_ms > 0 && lease_ms <= 86_400_000);
                        assert!(wait_ms <= 86_400_000);
                    }
                    Request::Permit {
                        limit,
                        lease_ms,
                        wait_ms,
                        ..
                    } => {
                        assert!(limit > 0 && limit <= ringlock::proto::MAX_PERMITS);
                        assert!(lease_ms > 0 && lease_ms <= 86_400_000);
                        assert!(wait_ms <= 86_400_000);
                    }
                    Request::Owner { owner } => assert!(ringlock::proto::is_valid_owner(owner)),
                    Request::Queue { key } => assert!(is_valid_key(key)),
                    Request::Status
                    | Request::Health
                    | Request::List { .. }
                    | Request::Who { .. }
                    | Request::Kinds { .. } => {}
                }
                enc.clear();
                req.encode(&mut enc);
                assert!(enc.len() <= MAX_LINE);
                assert_eq!(parse_request(&enc), Ok(Some((req, enc.len()))));
                rest = &rest[used..];
            }
            Ok(None) => {
                assert!(rest.len() < MAX_LINE);
                assert!(!rest.contains(&b'\n'));
                break;
            }
            Err(ParseError::LineTooLong) => {
                assert!(rest.len() >= MAX_LINE);
                assert!(!window.contains(&b'\n'));
                break;
            }
            Err(e) => {
                check_reason(&e);
                // The line was whole (a server closes the connection here;
                // going on past it only widens the search).
                let nl = window
                    .iter()
                    .position(|&b| b == b'\n')
                    .expect("an error other than LineTooLong before a whole line");
                rest = &rest[nl + 1..];
            }
        }
    }

    // The answer parser must not panic on anything, and what it accepts
    // encodes to a single line.
    for line in data.split(|&b| b == b'\n') {
        if let Ok(answer) = parse_answer(line) {
            enc.clear();
            answer.encode(&mut enc);
            assert_eq!(enc.iter().filter(|&&b| b == b'\n').count(), 1);
            assert_eq!(enc.last(), Some(&b'\n'));
        }
    }
    let _ = parse_answer(data);
}

fuzz_target!(|data: &[u8]| check(data));
