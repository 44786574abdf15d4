//! The peer-line harness, shared by the fuzz target
//! (fuzz/fuzz_targets/peer_line.rs) and its stable twin (tests/fuzz_node.rs).
//!
//! Arbitrary bytes go to `cluster::wire::parse`, one line at a time (split
//! at `\n`) and whole. It must never panic, and must say what the general
//! parser (`wire::parse_general`, without the fast path of `P g` and `P x`)
//! says of the same line; what it accepts must carry only
//! bounded fields (tokens <= `MAX_TOKEN`, remaining leases <=
//! `MAX_REMAINING_MS`, indexes < `MAX_PEERS`, keys and addresses valid keys)
//! and re-encode (`wire::encode`) to one line of fewer than `MAX_LINE` bytes
//! that parses to the same message; what it refuses gets a reason that is
//! one short line of printable ASCII (it goes out on an `E` line, and into
//! the log).
//!
//! Written for both editions the two crates use (2021 and 2024).

use ringlock::cluster::wire::{self, MAX_PEERS, MAX_REMAINING_MS, PeerMsg};
use ringlock::engine::token::MAX_TOKEN;
use ringlock::proto::{MAX_LINE, is_valid_key};

/// The longest reason `wire::parse` may give: it goes out as
/// `E <reason> in line N\n` (N up to 20 digits), which must fit in
/// `MAX_LINE`, the other side's limit.
pub const MAX_REASON: usize = MAX_LINE - "E ".len() - " in line ".len() - 20 - 1;

/// What one call saw, for the stable twin's coverage checks.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub parsed: usize,
    pub refused: usize,
}

/// Checks every line of `data` and `data` whole.
pub fn check(data: &[u8]) -> Outcome {
    let mut outcome = Outcome::default();
    let mut enc = Vec::with_capacity(MAX_LINE);
    for line in data.split(|&b| b == b'\n') {
        check_line(line, &mut enc, &mut outcome);
    }
    if data.contains(&b'\n') {
        check_line(data, &mut enc, &mut outcome);
    }
    outcome
}

/// Checks one line (which the loops hand over without its `\n`).
pub fn check_line(line: &[u8], enc: &mut Vec<u8>, outcome: &mut Outcome) {
    // The fast path of `P g` and `P x` decides nothing the general
    // parser would not: the same message, or the same error.
    assert_eq!(
        wire::parse(line),
        wire::parse_general(line),
        "the fast path and the general parser differ on {:?}",
        esc(line)
    );
    let msg = match wire::parse(line) {
        Ok(msg) => msg,
        Err(reason) => {
            let reason = reason.to_string();
            assert!(!reason.is_empty(), "empty reason for {:?}", esc(line));
            assert!(
                reason.len() <= MAX_REASON,
                "reason of {} bytes for {:?}",
                reason.len(),
                esc(line)
            );
            assert!(
                reason.bytes().all(|b| (0x20..0x7f).contains(&b)),
                "reason not printable ASCII: {reason:?}"
            );
            outcome.refused += 1;
            return;
        }
    };
    outcome.parsed += 1;
    assert!(
        wire::is_peer_line(line),
        "parsed a non-peer line {:?}",
        esc(line)
    );
    check_bounds(&msg, line);
    enc.clear();
    wire::encode(enc, &msg);
    assert_eq!(enc.last(), Some(&b'\n'), "{:?}", esc(enc));
    let body = &enc[..enc.len() - 1];
    assert!(!body.contains(&b'\n'), "two lines: {:?}", esc(enc));
    assert!(enc.len() < MAX_LINE, "{} bytes: {:?}", enc.len(), esc(enc));
    assert_eq!(
        wire::parse(body),
        Ok(msg),
        "{:?} re-encoded as {:?}",
        esc(line),
        esc(enc)
    );
}

/// Every field within its documented bound (the wire module's docs).
pub fn check_bounds(msg: &PeerMsg<'_>, line: &[u8]) {
    let token = |t: u64| assert!(t <= MAX_TOKEN, "token {t} in {:?}", esc(line));
    let index = |i: usize| assert!(i < MAX_PEERS, "index {i} in {:?}", esc(line));
    let key = |k: &[u8]| assert!(is_valid_key(k), "key {:?} in {:?}", esc(k), esc(line));
    match *msg {
        PeerMsg::Hello { from, addr, .. } => {
            index(from.0);
            key(addr);
        }
        PeerMsg::Challenge { index: i, addr, .. } => {
            index(i.0);
            key(addr);
        }
        PeerMsg::Auth { .. }
        | PeerMsg::Synced
        | PeerMsg::Merged
        | PeerMsg::Probe { .. }
        | PeerMsg::Probed { .. } => {}
        PeerMsg::Heartbeat {
            following, highest, ..
        } => {
            if let Some(f) = following {
                index(f.0);
            }
            token(highest);
        }
        PeerMsg::Snapshot { highest }
        | PeerMsg::Handoff { highest }
        | PeerMsg::Merge { highest } => token(highest),
        PeerMsg::Limit { limit } => assert!(
            (1..=ringlock::proto::MAX_PERMITS).contains(&limit),
            "limit {limit} in {:?}",
            esc(line)
        ),
        PeerMsg::Grant {
            key: k,
            token: t,
            remaining_ms,
            holder,
        }
        | PeerMsg::Member {
            key: k,
            token: t,
            remaining_ms,
            holder,
            ..
        } => {
            key(k);
            token(t);
            if let Some(a) = holder.addr {
                key(a);
            }
            if let Some(o) = holder.owner {
                assert!(
                    ringlock::proto::is_valid_owner(o),
                    "owner in {:?}",
                    esc(line)
                );
            }
            assert!(
                remaining_ms <= MAX_REMAINING_MS,
                "remaining {remaining_ms} in {:?}",
                esc(line)
            );
        }
        PeerMsg::Release { key: k, token: t } => {
            key(k);
            token(t);
        }
    }
}

pub fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}
