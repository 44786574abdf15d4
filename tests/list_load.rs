//! `L` from a hostile client: pipelined list requests must not hold the
//! loop. Each test measures the round trip of `S` on another connection
//! while one connection floods `L`, and fails if a turn stalls.

#[macro_use]
mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Conn, Server};

/// The slowest `S` round trip tolerated while the flood runs. A turn that
/// handles a few thousand `L` requests in well-bounded work takes a few
/// milliseconds; the stalls these tests catch take seconds.
const STALL: Duration = Duration::from_millis(300);

/// Sends `lines` (each with its `\n`) on `c` in batches, reading each
/// batch's answers before the next.
fn pipelined(c: &mut Conn, lines: impl Iterator<Item = String>) -> Vec<String> {
    let mut answers = Vec::new();
    let lines: Vec<String> = lines.collect();
    for batch in lines.chunks(5000) {
        c.send(batch.concat().as_bytes());
        for _ in batch {
            answers.push(c.recv());
        }
    }
    answers
}

/// Floods `L` requests (`line`, `count` times) on a fresh connection whose
/// answers a thread drains, and returns the slowest `S` round trip on
/// another connection while the flood is answered.
fn slowest_status_during_flood(server: &Server, line: &str, count: usize) -> Duration {
    let mut probe = server.connect();
    assert!(probe.call("S").starts_with("S active"));
    let mut flood = server.connect();
    let mut writer = flood.stream().try_clone().unwrap();
    let payload = line.repeat(count);
    let drain = std::thread::spawn(move || {
        let mut ends = 0;
        while ends < count {
            let answer = flood.recv();
            if answer.starts_with("L ") {
                ends += 1;
            } else {
                assert!(answer.starts_with("K "), "{answer}");
            }
        }
    });
    let started = Instant::now();
    writer.write_all(payload.as_bytes()).unwrap();
    let mut slowest = Duration::ZERO;
    // Probe for as long as the flood is being answered, and a little after.
    let limit = Duration::from_secs(60);
    while !drain.is_finished() && started.elapsed() < limit {
        let t = Instant::now();
        assert!(probe.call("S").starts_with("S active"));
        slowest = slowest.max(t.elapsed());
    }
    drain.join().unwrap();
    eprintln!(
        "{count} x {:?}: answered in {:?}, slowest S {:?}",
        line.trim_end(),
        started.elapsed(),
        slowest
    );
    slowest
}

/// A table that once held many locks and no longer does: listing it from
/// the start, thousands of times in one write, must not hold the loop.
fn list_after_a_large_table_does_not_stall(io: &str) {
    let server = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io]);
    let mut c = server.connect();
    let n = 200_000;
    let grants = pipelined(&mut c, (0..n).map(|i| format!("A k{i} 600 0\n")));
    // Released last to first: the table reuses the slot freed last, so the
    // one lock taken afterwards sits in the lowest slot, below 199999 free
    // ones.
    let releases = pipelined(
        &mut c,
        grants
            .iter()
            .enumerate()
            .rev()
            .map(|(i, g)| format!("R k{i} {}\n", Conn::token_of(g))),
    );
    assert!(releases.iter().all(|r| r.ends_with(" 1")));
    Conn::token_of(&c.call("A last 600 0"));
    let slowest = slowest_status_during_flood(&server, "L 0 1 zz\n", 12_000);
    assert!(
        slowest < STALL,
        "S took {slowest:?} while L requests were answered"
    );
}

/// A lock with 65536 waiters (16 connections of 4096), listed thousands of
/// times in one write: counting its queue must not hold the loop.
fn list_of_a_long_queue_does_not_stall(io: &str) {
    let server = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io]);
    let mut holder = server.connect();
    Conn::token_of(&holder.call("A hot 600 0"));
    let mut waiters: Vec<Conn> = (0..16).map(|_| server.connect()).collect();
    for w in &mut waiters {
        w.send("A hot 600 0\n".repeat(4096).as_bytes());
        // Requests of one connection are handled in order: once S is
        // answered, its 4096 acquires are queued.
        assert!(w.call("S").starts_with("S active"));
    }
    holder.line("L 0 1 hot");
    let k = holder.recv();
    assert!(k.ends_with(" 65536"), "{k}");
    assert_eq!(holder.recv(), "L 0");
    let slowest = slowest_status_during_flood(&server, "L 0 1 hot\n", 12_000);
    assert!(
        slowest < STALL,
        "S took {slowest:?} while L requests were answered"
    );
}

/// A page of 1000 locks with 250-byte keys would be about 290 KB in one
/// answer, on top of the 64 KiB of unread answers past which a connection
/// is no longer read: an answer stops at about 16 KiB, its cursor says
/// where to go on, and paging lists every lock once.
fn a_page_of_long_keys_is_bounded_in_bytes(io: &str) {
    let server = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io]);
    let mut c = server.connect();
    let key = |i: usize| format!("{i:04}{}", "k".repeat(246));
    let grants = pipelined(&mut c, (0..1000).map(|i| format!("A {} 600 0\n", key(i))));
    assert!(grants.iter().all(|g| g.starts_with("A ")));
    let mut seen = std::collections::HashSet::new();
    let mut cursor = 0u64;
    let mut pages = 0;
    loop {
        c.line(&format!("L {cursor} 1000"));
        let mut bytes = 0;
        let end = loop {
            let line = c.recv();
            bytes += line.len() + 1;
            if let Some(end) = line.strip_prefix("L ") {
                break end.parse::<u64>().unwrap();
            }
            let k = line.split(' ').nth(1).unwrap().to_string();
            assert!(seen.insert(k), "listed twice: {line}");
        };
        assert!(bytes <= 16 * 1024 + 300, "an L answer of {bytes} bytes");
        pages += 1;
        assert!(pages <= 1000, "the cursor does not move on");
        if end == 0 {
            break;
        }
        cursor = end;
    }
    assert_eq!(seen.len(), 1000);
    assert!(pages > 1);
}

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [both()])
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        list_after_a_large_table_does_not_stall:
            list_after_a_large_table_does_not_stall_uring, list_after_a_large_table_does_not_stall_epoll;
        list_of_a_long_queue_does_not_stall:
            list_of_a_long_queue_does_not_stall_uring, list_of_a_long_queue_does_not_stall_epoll;
        a_page_of_long_keys_is_bounded_in_bytes:
            a_page_of_long_keys_is_bounded_in_bytes_uring, a_page_of_long_keys_is_bounded_in_bytes_epoll;
    }
}
