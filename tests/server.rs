//! Integration tests of the single-node server against the real
//! binary, each scenario under `--io uring` and `--io epoll`.
//!
//! Every expected line follows docs/protocol.md. No sleep stands in for
//! "the server has read my request": a request is followed by an `S` on the
//! same connection, whose answer proves the server processed both. Timing
//! checks have a lower bound from the protocol and a generous upper bound
//! (two cores shared with compilers).

#[macro_use]
mod common;

use common::harness::Test;
use common::{Conn, Server};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// Upper slack for anything timed: the server must act within this much
/// after the protocol says it may.
const SLACK: Duration = Duration::from_secs(4);

/// `--spin-us`: the busy-polling loop answers, hands off, and still sleeps
/// until timers (a wait runs out on time while nothing else happens).
fn spin_mode(io: &str) {
    let s = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io, "--spin-us", "200"]);
    let mut a = s.connect();
    let mut b = s.connect();
    let t1 = acquire(&mut a, "k", "10", "0");
    let started = Instant::now();
    assert_eq!(b.call("A k 10 0.3"), "T k");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "T after {waited:?}");
    b.line("A k 10 0");
    assert_eq!(status(&mut b, &s), t1);
    assert_eq!(a.call(&format!("R k {t1}")), "R k 1");
    let t2 = Conn::token_of(&b.recv());
    assert!(t2 > t1);

    // Spinning is for the moments after work: a server with nothing to do
    // sleeps. A loop that spun forever would use most of a core here even
    // on a busy machine; an idle one uses a few milliseconds.
    let before = s.cpu_time().expect("server CPU time");
    let window = Instant::now();
    thread::sleep(Duration::from_secs(1));
    let used = s.cpu_time().expect("server CPU time") - before;
    let elapsed = window.elapsed();
    assert!(
        used < Duration::from_millis(100),
        "idle --spin-us server used {used:?} of CPU in {elapsed:?}"
    );
}

/// A client sends more than the server answers before pausing it, with a
/// release at the end: the release is kept back and handled as that
/// client's answers go out. The lock it frees goes to a waiter on another
/// connection, whose grant must go out at once, not when some unrelated
/// event next wakes the loop (on a quiet server: the new grant's own lease
/// running out, after which the client would read a grant already over).
fn grant_from_a_kept_back_release_goes_out_at_once(io: &str) {
    let s = Server::start(io);
    let mut holder = s.connect();
    let t1 = acquire(&mut holder, "k", "30", "0");
    let mut waiter = s.connect();
    waiter.line("A k 30 60");
    status(&mut waiter, &s);
    let mut burst = s.connect();
    // About 150 KiB of answers: past the 64 KiB pause within one read.
    let mut input = b"S\n".repeat(5_000);
    input.extend_from_slice(format!("R k {t1}\n").as_bytes());
    burst.send(&input);
    for _ in 0..5_000 {
        let answer = burst.recv();
        assert!(answer.starts_with("S active "), "{answer:?}");
    }
    assert_eq!(burst.recv(), "R k 1");
    let released = Instant::now();
    waiter.set_timeout(SLACK + SLACK);
    let answer = waiter.recv();
    let late = released.elapsed();
    assert!(grant_of("k", &answer) > t1, "{answer:?}");
    assert!(
        late < SLACK,
        "the grant came {late:?} after the release was answered"
    );
}

// ---------------------------------------------------------------------------
// Test generation: every scenario under both backends.

/// One test pair per broken request form: `bad_line(io, bytes)`.
macro_rules! bad_input {
    ($($uring:ident, $epoll:ident: $bytes:expr;)*) => {
        vec![$(
            Test::new(stringify!($uring), || bad_line("uring", $bytes))
                .requires("io_uring", common::uring),
            Test::new(stringify!($epoll), || bad_line("epoll", $bytes)),
        )*]
    };
}

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [both(), bad_inputs(), tests![max_locks_out_of_range]],
    )
}

fn both() -> Vec<Test> {
    on_both! {
        basic: basic_uring, basic_epoll;
        spin_mode: spin_mode_uring, spin_mode_epoll;
        grant_from_a_kept_back_release_goes_out_at_once:
            grant_from_a_kept_back_release_goes_out_at_once_uring,
            grant_from_a_kept_back_release_goes_out_at_once_epoll;
        fifo_handoff: fifo_handoff_uring, fifo_handoff_epoll;
        lease_expiry_hands_over: lease_expiry_hands_over_uring, lease_expiry_hands_over_epoll;
        wait_timeout: wait_timeout_uring, wait_timeout_epoll;
        renew: renew_uring, renew_epoll;
        pipelining: pipelining_uring, pipelining_epoll;
        rule3_order: rule3_order_uring, rule3_order_epoll;
        disconnect_withdraws_waiters: disconnect_withdraws_waiters_uring, disconnect_withdraws_waiters_epoll;
        grants_outlive_connection: grants_outlive_connection_uring, grants_outlive_connection_epoll;
        bad_4097th_waiting_acquire: bad_4097th_waiting_acquire_uring, bad_4097th_waiting_acquire_epoll;
        waiting_limit_counts_only_waiting: waiting_limit_counts_only_waiting_uring, waiting_limit_counts_only_waiting_epoll;
        pipelined_5000: pipelined_5000_uring, pipelined_5000_epoll;
        backpressure: backpressure_uring, backpressure_epoll;
        concurrent_300: concurrent_300_uring, concurrent_300_epoll;
        tokens_survive_kill9: tokens_survive_kill9_uring, tokens_survive_kill9_epoll;
        max_conns: max_conns_uring, max_conns_epoll;
        max_locks: max_locks_uring, max_locks_epoll;
        sigterm_answers_waiters: sigterm_answers_waiters_uring, sigterm_answers_waiters_epoll;
        sigint_answers_waiters: sigint_answers_waiters_uring, sigint_answers_waiters_epoll;
        sighup_without_tls_carries_on: sighup_without_tls_carries_on_uring, sighup_without_tls_carries_on_epoll;
        crlf: crlf_uring, crlf_epoll;
        line_of_512: line_of_512_uring, line_of_512_epoll;
        valid_forms: valid_forms_uring, valid_forms_epoll;
        many_wait_timeouts: many_wait_timeouts_uring, many_wait_timeouts_epoll;
        bad_line_after_backlog: bad_line_after_backlog_uring, bad_line_after_backlog_epoll;
        contention: contention_uring, contention_epoll;
    }
}

fn bad_inputs() -> Vec<Test> {
    bad_input! {
        bad_unknown_op_uring, bad_unknown_op_epoll: b"X k 10 0\n";
        bad_lowercase_op_uring, bad_lowercase_op_epoll: b"a k 10 0\n";
        bad_empty_line_uring, bad_empty_line_epoll: b"\n";
        bad_acquire_too_few_fields_uring, bad_acquire_too_few_fields_epoll: b"A k 10\n";
        bad_acquire_too_many_fields_uring, bad_acquire_too_many_fields_epoll: b"A k 10 0 1\n";
        bad_release_too_few_fields_uring, bad_release_too_few_fields_epoll: b"R k\n";
        bad_release_too_many_fields_uring, bad_release_too_many_fields_epoll: b"R k 5 5\n";
        bad_renew_too_few_fields_uring, bad_renew_too_few_fields_epoll: b"N k 5\n";
        bad_status_with_field_uring, bad_status_with_field_epoll: b"S x\n";
        bad_empty_field_uring, bad_empty_field_epoll: b"A k  10 0\n";
        bad_trailing_space_uring, bad_trailing_space_epoll: b"R k 5 \n";
        bad_leading_space_uring, bad_leading_space_epoll: b" S\n";
        bad_key_too_long_uring, bad_key_too_long_epoll: format!("A {} 10 0\n", "k".repeat(251));
        bad_key_del_byte_uring, bad_key_del_byte_epoll: b"A k\x7fx 10 0\n";
        bad_key_control_byte_uring, bad_key_control_byte_epoll: b"A k\x01x 10 0\n";
        bad_key_nul_byte_uring, bad_key_nul_byte_epoll: b"R k\x00 5\n";
        bad_key_tab_uring, bad_key_tab_epoll: b"A k\tx 10 0\n";
        bad_lease_zero_uring, bad_lease_zero_epoll: b"A k 0 0\n";
        bad_lease_zero_decimals_uring, bad_lease_zero_decimals_epoll: b"A k 0.000 0\n";
        bad_lease_four_decimals_uring, bad_lease_four_decimals_epoll: b"A k 1.0000 0\n";
        bad_lease_over_max_uring, bad_lease_over_max_epoll: b"A k 86400.001 0\n";
        bad_lease_huge_uring, bad_lease_huge_epoll: b"A k 99999999999999999999999 0\n";
        bad_lease_not_number_uring, bad_lease_not_number_epoll: b"A k abc 0\n";
        bad_lease_negative_uring, bad_lease_negative_epoll: b"A k -1 0\n";
        bad_lease_plus_uring, bad_lease_plus_epoll: b"A k +1 0\n";
        bad_lease_trailing_dot_uring, bad_lease_trailing_dot_epoll: b"A k 1. 0\n";
        bad_lease_leading_dot_uring, bad_lease_leading_dot_epoll: b"A k .5 0\n";
        bad_wait_over_max_uring, bad_wait_over_max_epoll: b"A k 10 86400.001\n";
        bad_wait_86401_uring, bad_wait_86401_epoll: b"A k 10 86401\n";
        bad_wait_four_decimals_uring, bad_wait_four_decimals_epoll: b"A k 10 0.0001\n";
        bad_wait_negative_uring, bad_wait_negative_epoll: b"A k 10 -1\n";
        bad_token_zero_uring, bad_token_zero_epoll: b"R k 0\n";
        bad_token_zeros_uring, bad_token_zeros_epoll: b"R k 000\n";
        bad_token_overflow_uring, bad_token_overflow_epoll: b"R k 18446744073709551616\n";
        bad_token_not_number_uring, bad_token_not_number_epoll: b"R k 12x\n";
        bad_token_decimal_uring, bad_token_decimal_epoll: b"R k 1.5\n";
        bad_renew_token_zero_uring, bad_renew_token_zero_epoll: b"N k 0 5\n";
        bad_renew_lease_zero_uring, bad_renew_lease_zero_epoll: b"N k 5 0\n";
        bad_renew_lease_four_decimals_uring, bad_renew_lease_four_decimals_epoll: b"N k 5 0.0001\n";
        bad_cr_not_before_newline_uring, bad_cr_not_before_newline_epoll: b"A k 10 0\r\r\n";
        bad_owner_dash_uring, bad_owner_dash_epoll: b"O -\n";
        bad_owner_empty_uring, bad_owner_empty_epoll: b"O \n";
        bad_owner_high_byte_uring, bad_owner_high_byte_epoll: b"O caf\xc3\xa9\n";
        bad_owner_cr_inside_uring, bad_owner_cr_inside_epoll: b"O a\r\r\n";
        bad_owner_129_uring, bad_owner_129_epoll: format!("O {}\n", "o".repeat(129));
        bad_owner_two_fields_uring, bad_owner_two_fields_epoll: b"O a b\n";
        bad_who_limit_zero_uring, bad_who_limit_zero_epoll: b"W 0 0\n";
        bad_who_limit_1001_uring, bad_who_limit_1001_epoll: b"W 0 1001\n";
        bad_who_cursor_overflow_uring, bad_who_cursor_overflow_epoll: b"W 18446744073709551616 1\n";
        bad_who_prefix_251_uring, bad_who_prefix_251_epoll: format!("W 0 1 {}\n", "p".repeat(251));
        bad_who_five_fields_uring, bad_who_five_fields_epoll: b"W 0 1 a b\n";
        bad_queue_no_key_uring, bad_queue_no_key_epoll: b"Q\n";
        bad_queue_key_251_uring, bad_queue_key_251_epoll: format!("Q {}\n", "k".repeat(251));
        bad_queue_key_tab_uring, bad_queue_key_tab_epoll: b"Q k\tx\n";
        bad_line_513_uring, bad_line_513_epoll: padded_acquire(513, "\n");
        bad_line_513_crlf_uring, bad_line_513_crlf_epoll: padded_acquire(513, "\r\n");
        bad_512_without_newline_uring, bad_512_without_newline_epoll: {
            let mut l = padded_acquire(513, "\n");
            l.truncate(512);
            l
        };
    }
}

// ---------------------------------------------------------------------------
// Helpers.

/// Checks `line` is exactly `A <key> <token>` and returns the token.
fn grant_of(key: &str, line: &str) -> u64 {
    let token = Conn::token_of(line);
    assert_eq!(line, format!("A {key} {token}"), "grant line not canonical");
    assert!(token >= 1);
    token
}

/// `A key lease wait` that must be granted at once.
fn acquire(c: &mut Conn, key: &str, lease: &str, wait: &str) -> u64 {
    let answer = c.call(&format!("A {key} {lease} {wait}"));
    grant_of(key, &answer)
}

/// `S` on `c`; checks the answer is `S active <addr> <token>` and returns
/// the token. Because the server answers in order of reading, every request
/// sent on `c` before it has been processed once this returns.
fn status(c: &mut Conn, s: &Server) -> u64 {
    let answer = c.call("S");
    let prefix = format!("S active {} ", s.addr);
    let token = answer
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("expected {prefix:?}<token>, got {answer:?}"));
    let value: u64 = token
        .parse()
        .unwrap_or_else(|_| panic!("bad token in {answer:?}"));
    assert_eq!(token, value.to_string(), "leading zeros in {answer:?}");
    value
}

fn assert_between(elapsed: Duration, low: Duration, high: Duration, what: &str) {
    assert!(
        elapsed >= low,
        "{what}: after {elapsed:?}, must not be before {low:?}"
    );
    assert!(
        elapsed <= high,
        "{what}: after {elapsed:?}, expected within {high:?}"
    );
}

/// Reads up to `limit` lines until the server closes the connection; checks
/// the last line is `E ...` naming `line N`, that nothing follows it, and
/// returns the lines before it.
fn expect_error(c: &mut Conn, line_no: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let error = loop {
        let line = c
            .recv_or_closed()
            .unwrap_or_else(|| panic!("closed without an E line; answers were {lines:?}"));
        if line.starts_with("E ") {
            break line;
        }
        assert!(lines.len() < 16, "no E line; answers were {lines:?}");
        lines.push(line);
    };
    assert!(
        mentions_line(&error, line_no),
        "{error:?} should name line {line_no}"
    );
    if let Some(more) = c.recv_or_closed() {
        panic!("after {error:?} the connection must close, got {more:?}");
    }
    lines
}

/// True if `text` holds "line N" with nothing numeric right after N.
fn mentions_line(text: &str, n: usize) -> bool {
    let needle = format!("line {n}");
    text.match_indices(&needle).any(|(i, _)| {
        !text[i + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// An acquire of a 250-byte key whose lease is padded with leading zeros so
/// that the whole line, `end` included, is `len` bytes long.
fn padded_acquire(len: usize, end: &str) -> Vec<u8> {
    let key = "k".repeat(250);
    let bare = format!("A {key} 10 0{end}");
    assert!(bare.len() <= len);
    let zeros = "0".repeat(len - bare.len());
    let line = format!("A {key} {zeros}10 0{end}");
    assert_eq!(line.len(), len);
    line.into_bytes()
}

/// Waits until the server has processed the close of a connection, by
/// means of `--max-conns`: the server was started with exactly one slot
/// more than the connections still open, so a probe is served only once the
/// closed connection's slot is free. Bounded: 5 s.
fn wait_for_free_slot(s: &Server) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut tries = 0;
    loop {
        tries += 1;
        let mut probe = s.connect();
        probe.set_timeout(Duration::from_secs(5));
        probe.line("S");
        match probe.recv_or_closed() {
            Some(answer) => {
                assert!(answer.starts_with("S active "), "probe got {answer:?}");
                return;
            }
            None => {
                assert!(
                    Instant::now() < deadline,
                    "closed connection's slot still taken after {tries} probes"
                );
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Collects `n` answer lines, sorted (for answers to different ops or keys,
/// whose relative order the protocol leaves open).
fn recv_sorted(c: &mut Conn, n: usize) -> Vec<String> {
    let mut lines: Vec<String> = (0..n).map(|_| c.recv()).collect();
    lines.sort();
    lines
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Writes `bytes` from a new thread (so that the caller can read while the
/// server applies backpressure). Returns the progress counter and a done
/// flag. A write error (the server gone) ends the thread.
fn write_in_background(
    stream: &TcpStream,
    bytes: Vec<u8>,
    chunk: usize,
) -> (Arc<AtomicUsize>, Arc<AtomicBool>, thread::JoinHandle<()>) {
    let mut stream = stream.try_clone().expect("clone socket");
    stream
        .set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (w, d) = (written.clone(), done.clone());
    let handle = thread::spawn(move || {
        for part in bytes.chunks(chunk) {
            if stream.write_all(part).is_err() {
                return;
            }
            w.fetch_add(part.len(), Ordering::SeqCst);
        }
        d.store(true, Ordering::SeqCst);
    });
    (written, done, handle)
}

// ---------------------------------------------------------------------------
// 1. Basic acquire, release, renew, status.

fn basic(io: &str) {
    let s = Server::start(io);
    let mut c = s.connect();
    assert_eq!(c.call("S"), format!("S active {} 0", s.addr));

    let t1 = acquire(&mut c, "k", "10", "0");
    assert_eq!(status(&mut c, &s), t1);
    assert_eq!(c.call(&format!("N k {t1} 5")), "N k 1");
    assert_eq!(c.call(&format!("R k {t1}")), "R k 1");
    assert_eq!(c.call(&format!("R k {t1}")), "R k 0");
    assert_eq!(c.call(&format!("N k {t1} 5")), "N k 0");
    // Tokens never issued.
    assert_eq!(c.call("R k 7"), "R k 0");
    assert_eq!(c.call(&format!("R nokey {t1}")), "R nokey 0");
    assert_eq!(c.call("N nokey 7 5"), "N nokey 0");

    // Every grant, any key, has a higher token; S shows the highest.
    let t2 = acquire(&mut c, "k", "10", "0");
    assert!(t2 > t1, "{t2} > {t1}");
    let t3 = acquire(&mut c, "other", "10", "0");
    assert!(t3 > t2, "{t3} > {t2}");
    assert_eq!(status(&mut c, &s), t3);
    // A wrong token leaves the grant alone.
    assert_eq!(c.call(&format!("R k {t3}")), "R k 0");
    assert_eq!(c.call(&format!("N k {} 5", t2 + 1)), "N k 0");
    assert_eq!(c.call(&format!("R k {t2}")), "R k 1");
    assert_eq!(c.call(&format!("R other {t3}")), "R other 1");
    assert_eq!(status(&mut c, &s), t3);
}

// ---------------------------------------------------------------------------
// 2. FIFO hand-off among five waiters, and no overtaking by a newcomer.

fn fifo_handoff(io: &str) {
    let s = Server::start(io);
    let mut conns = vec![s.connect()];
    let mut token = acquire(&mut conns[0], "k", "30", "0");
    for _ in 0..5 {
        let mut w = s.connect();
        w.line("A k 30 0");
        assert_eq!(status(&mut w, &s), token);
        conns.push(w);
    }
    // conns[i] gets the key i-th; the newcomer (conns[6]) arrives while
    // conns[1] holds it and must be served after all five.
    for i in 1..=6 {
        assert_eq!(conns[i - 1].call(&format!("R k {token}")), "R k 1");
        let next = grant_of("k", &conns[i].recv());
        assert!(next > token, "hand-off token {next} > {token}");
        token = next;
        if i == 1 {
            let mut newcomer = s.connect();
            newcomer.line("A k 30 0");
            assert_eq!(status(&mut newcomer, &s), token);
            conns.push(newcomer);
        }
        for (j, c) in conns.iter_mut().enumerate().skip(i + 1) {
            // An A queued before this S would come first.
            assert_eq!(status(c, &s), token, "waiter {j} served before its turn");
        }
    }
    assert_eq!(conns[6].call(&format!("R k {token}")), "R k 1");
    assert_eq!(conns[0].call(&format!("R k {token}")), "R k 0");
}

// ---------------------------------------------------------------------------
// 3. Lease expiry hands over; the lease runs from the grant; stale tokens.

fn lease_expiry_hands_over(io: &str) {
    let s = Server::start(io);
    let mut h = s.connect();
    // The holder's lease leaves time to queue both waiters in order.
    let start = Instant::now();
    let t0 = acquire(&mut h, "k", "0.8", "0");
    let mut w1 = s.connect();
    w1.line("A k 0.3 0");
    assert_eq!(status(&mut w1, &s), t0);
    let mut w2 = s.connect();
    w2.line("A k 10 0");
    assert_eq!(status(&mut w2, &s), t0);

    let t1 = grant_of("k", &w1.recv());
    assert_between(
        start.elapsed(),
        Duration::from_millis(800),
        Duration::from_millis(800) + SLACK,
        "first expiry",
    );
    assert!(t1 > t0);
    // w1's lease runs from its grant, at least 0.8 s after start.
    let t2 = grant_of("k", &w2.recv());
    assert_between(
        start.elapsed(),
        Duration::from_millis(1100),
        Duration::from_millis(1100) + SLACK,
        "second expiry",
    );
    assert!(t2 > t1);

    assert_eq!(h.call(&format!("R k {t0}")), "R k 0");
    assert_eq!(h.call(&format!("N k {t0} 1")), "N k 0");
    assert_eq!(w1.call(&format!("N k {t1} 1")), "N k 0");
    assert_eq!(w1.call(&format!("R k {t1}")), "R k 0");
    assert_eq!(status(&mut h, &s), t2);
    assert_eq!(w2.call(&format!("R k {t2}")), "R k 1");

    // Expiry with nobody waiting frees the key.
    let t3 = acquire(&mut h, "k", "0.1", "0");
    let start = Instant::now();
    let t4 = grant_of("k", &w1.call("A k 10 5"));
    assert_between(start.elapsed(), Duration::ZERO, SLACK, "grant after expiry");
    assert!(t4 > t3);
    assert_eq!(h.call(&format!("R k {t3}")), "R k 0");
}

// ---------------------------------------------------------------------------
// 4. Wait timeout answers T, and the timed-out request is never granted.

fn wait_timeout(io: &str) {
    let s = Server::start(io);
    let mut h = s.connect();
    let th = acquire(&mut h, "k", "30", "0");
    let mut w = s.connect();
    let start = Instant::now();
    assert_eq!(w.call("A k 10 0.3"), "T k");
    assert_between(
        start.elapsed(),
        Duration::from_millis(300),
        Duration::from_millis(300) + SLACK,
        "T",
    );
    assert_eq!(h.call(&format!("R k {th}")), "R k 1");
    // Nothing was granted to the timed-out request: no A before this S, and
    // no token issued.
    assert_eq!(status(&mut w, &s), th);
    let mut x = s.connect();
    let start = Instant::now();
    let tx = acquire(&mut x, "k", "30", "0");
    assert!(start.elapsed() < SLACK);
    assert!(tx > th);
    assert!(w.quiet_for(Duration::from_millis(100)));

    // A wait of 0.000 is 0: no limit (x holds k).
    w.line("A k 10 0.000");
    assert_eq!(status(&mut w, &s), tx);
    assert!(
        w.quiet_for(Duration::from_millis(300)),
        "wait 0.000 ran out: it means no limit"
    );
    assert_eq!(x.call(&format!("R k {tx}")), "R k 1");
    let tw = grant_of("k", &w.recv());
    assert!(tw > tx);

    // A limited wait that is served in time is a grant, not a T (w holds k).
    x.line("A k 10 3");
    assert_eq!(status(&mut x, &s), tw);
    assert_eq!(w.call(&format!("R k {tw}")), "R k 1");
    let tx2 = grant_of("k", &x.recv());
    assert!(tx2 > tw);
    assert!(x.quiet_for(Duration::from_millis(100)));
    assert_eq!(x.call(&format!("R k {tx2}")), "R k 1");
}

// ---------------------------------------------------------------------------
// 5. Renew extends (and can shorten) a lease; the token stays.

fn renew(io: &str) {
    let s = Server::start(io);
    let mut h = s.connect();
    let start = Instant::now();
    let th = acquire(&mut h, "k", "0.5", "0");
    assert_eq!(h.call(&format!("N k {th} 5")), "N k 1");
    // The scenario needs the original lease to be over: wait until 1 s.
    thread::sleep(Duration::from_secs(1).saturating_sub(start.elapsed()));
    // The wait counts from the node's clock of the loop turn that read the
    // request; on a new connection that turn may be the one that accepted
    // it, whose clock was read before the request was sent, so the bound
    // is measured from before the connect.
    let t0 = Instant::now();
    let mut w = s.connect();
    assert_eq!(w.call("A k 10 0.3"), "T k");
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert_eq!(status(&mut w, &s), th);
    assert_eq!(h.call(&format!("N k {th} 5")), "N k 1");
    assert_eq!(h.call(&format!("R k {th}")), "R k 1");

    // N sets the expiry to now + lease, also when that is sooner.
    let t2 = acquire(&mut h, "k", "30", "0");
    w.line("A k 10 0");
    assert_eq!(status(&mut w, &s), t2);
    let start = Instant::now();
    assert_eq!(h.call(&format!("N k {t2} 0.2")), "N k 1");
    let t3 = grant_of("k", &w.recv());
    assert_between(
        start.elapsed(),
        Duration::from_millis(200),
        Duration::from_millis(200) + SLACK,
        "shortened lease",
    );
    assert!(t3 > t2);
    assert_eq!(h.call(&format!("N k {t2} 5")), "N k 0");
    assert_eq!(h.call(&format!("R k {t2}")), "R k 0");
    // Renewing someone else's grant with its token works (grants do not
    // belong to connections).
    assert_eq!(h.call(&format!("N k {t3} 5")), "N k 1");
    assert_eq!(w.call(&format!("R k {t3}")), "R k 1");
}

// ---------------------------------------------------------------------------
// 6. A waiting acquire does not hold up later requests on its connection.

fn pipelining(io: &str) {
    let s = Server::start(io);
    let mut h = s.connect();
    let t1 = acquire(&mut h, "k1", "30", "0");
    let mut c = s.connect();
    c.send(b"A k1 10 0\nA k2 10 0\nR k3 5\nN k3 5 1\nS\n");
    let answers = recv_sorted(&mut c, 4);
    let grant = answers
        .iter()
        .find(|l| l.starts_with("A "))
        .unwrap_or_else(|| panic!("no grant of k2 in {answers:?}"));
    let t2 = grant_of("k2", grant);
    assert!(t2 > t1);
    assert_eq!(
        answers,
        sorted(vec![
            format!("A k2 {t2}"),
            "R k3 0".into(),
            "N k3 0".into(),
            format!("S active {} {t2}", s.addr),
        ])
    );
    // A release on a connection whose acquire waits is not stuck behind it.
    assert_eq!(c.call(&format!("R k2 {t2}")), "R k2 1");
    assert_eq!(h.call(&format!("R k1 {t1}")), "R k1 1");
    let t3 = grant_of("k1", &c.recv());
    assert!(t3 > t2);
    assert_eq!(c.call(&format!("R k1 {t3}")), "R k1 1");
}

// ---------------------------------------------------------------------------
// 7. Rule 3: answers to acquires of one key on one connection keep order.

fn rule3_order(io: &str) {
    let s = Server::start(io);
    let mut h = s.connect();
    let mut c = s.connect();

    // A T due at 0.2 s waits behind the earlier acquire's answer.
    let th = acquire(&mut h, "k", "30", "0");
    c.send(b"A k 10 5\nA k 10 0.2\n");
    assert_eq!(status(&mut c, &s), th);
    assert!(
        c.quiet_for(Duration::from_millis(700)),
        "T of the second acquire sent before the first was answered"
    );
    assert_eq!(h.call(&format!("R k {th}")), "R k 1");
    let t1 = grant_of("k", &c.recv());
    assert!(t1 > th);
    assert_eq!(c.recv(), "T k");
    assert_eq!(status(&mut c, &s), t1);
    assert_eq!(c.call(&format!("R k {t1}")), "R k 1");

    // Both without limit: two grants, in order, one release apart.
    let th = acquire(&mut h, "k", "30", "0");
    c.send(b"A k 10 0\nA k 10 0\n");
    assert_eq!(status(&mut c, &s), th);
    assert_eq!(h.call(&format!("R k {th}")), "R k 1");
    let t1 = grant_of("k", &c.recv());
    assert!(t1 > th);
    assert_eq!(status(&mut c, &s), t1);
    c.line(&format!("R k {t1}"));
    let answers = recv_sorted(&mut c, 2);
    let t2 = answers
        .iter()
        .find(|l| l.starts_with("A "))
        .map(|l| grant_of("k", l))
        .unwrap_or_else(|| panic!("no second grant in {answers:?}"));
    assert!(t2 > t1);
    assert_eq!(answers, sorted(vec![format!("A k {t2}"), "R k 1".into()]));
    assert_eq!(c.call(&format!("R k {t2}")), "R k 1");

    // Both time out: the earlier (0.5 s) is answered first, so the second
    // T (due at 0.2 s) cannot come before 0.5 s.
    let th = acquire(&mut h, "k", "30", "0");
    let start = Instant::now();
    c.send(b"A k 10 0.5\nA k 10 0.2\n");
    assert_eq!(status(&mut c, &s), th);
    assert_eq!(c.recv(), "T k");
    assert_eq!(c.recv(), "T k");
    assert_between(
        start.elapsed(),
        Duration::from_millis(500),
        Duration::from_millis(500) + SLACK,
        "both T",
    );
    assert_eq!(status(&mut c, &s), th);
    assert_eq!(h.call(&format!("R k {th}")), "R k 1");
}

// ---------------------------------------------------------------------------
// 8. Disconnect withdraws waiters; grants outlive their connection.

fn disconnect_withdraws_waiters(io: &str) {
    // Three connections stay open (h, w1 until dropped, w2); one slot more
    // lets wait_for_free_slot see w1's close processed.
    let s = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io, "--max-conns", "3"]);
    let mut h = s.connect();
    let th = acquire(&mut h, "k", "30", "0");
    let mut w1 = s.connect();
    w1.send(b"A k 30 0\nA k 30 0\n");
    assert_eq!(status(&mut w1, &s), th);
    let mut w2 = s.connect();
    w2.line("A k 30 0");
    assert_eq!(status(&mut w2, &s), th);
    drop(w1);
    wait_for_free_slot(&s);
    assert_eq!(h.call(&format!("R k {th}")), "R k 1");
    let t2 = grant_of("k", &w2.recv());
    assert!(t2 > th);
    assert_eq!(w2.call(&format!("R k {t2}")), "R k 1");
    // Nobody else was waiting.
    let t3 = acquire(&mut h, "k", "30", "0.5");
    assert!(t3 > t2);
}

fn grants_outlive_connection(io: &str) {
    // c2 stays open; c1 closes; a probe fits only once c1's slot is free.
    let s = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io, "--max-conns", "2"]);
    let mut c2 = s.connect();
    assert_eq!(status(&mut c2, &s), 0);
    let mut c1 = s.connect();
    let t = acquire(&mut c1, "k", "30", "0");
    drop(c1);
    wait_for_free_slot(&s);
    let start = Instant::now();
    assert_eq!(c2.call("A k 10 0.2"), "T k");
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(c2.call(&format!("N k {t} 30")), "N k 1");
    assert_eq!(c2.call(&format!("R k {t}")), "R k 1");
    let t2 = acquire(&mut c2, "k", "30", "0");
    assert!(t2 > t);
}

// ---------------------------------------------------------------------------
// 9. Bad input: earlier decided answers, one E naming the line, close;
//    everything else untouched.

fn bad_line(io: &str, bad: impl AsRef<[u8]>) {
    let bad = bad.as_ref();
    let s = Server::start(io);
    let mut h = s.connect();
    let th = acquire(&mut h, "held", "30", "0");
    let mut other = s.connect();
    let to = acquire(&mut other, "theirs", "30", "0");

    // Line 1 is granted, line 2 waits (held by h), line 3 is answered,
    // line 4 is broken. Sent in one write, without reading.
    let mut c = s.connect();
    c.set_timeout(Duration::from_secs(10));
    let mut bytes = b"A mine 30 0\nA held 30 0\nS\n".to_vec();
    bytes.extend_from_slice(bad);
    c.send(&bytes);
    let before = expect_error(&mut c, 4);
    assert_eq!(before.len(), 2, "answers before E: {before:?}");
    let t = before
        .iter()
        .find(|l| l.starts_with("A "))
        .map(|l| grant_of("mine", l))
        .unwrap_or_else(|| panic!("grant of line 1 missing: {before:?}"));
    assert!(t > to);
    assert_eq!(
        sorted(before),
        sorted(vec![
            format!("A mine {t}"),
            format!("S active {} {t}", s.addr)
        ])
    );

    // Other connections are unaffected; the lock held elsewhere is too.
    assert_eq!(status(&mut other, &s), t);
    assert_eq!(other.call("A held 10 0.1"), "T held");
    assert_eq!(h.call(&format!("R held {th}")), "R held 1");
    // The broken connection's waiting acquire was withdrawn: the key is free.
    let t2 = acquire(&mut other, "held", "10", "2");
    assert!(t2 > t);
    // Its grant stays.
    assert_eq!(other.call(&format!("R mine {t}")), "R mine 1");
    assert_eq!(other.call(&format!("R theirs {to}")), "R theirs 1");
}

fn bad_4097th_waiting_acquire(io: &str) {
    let s = Server::start(io);
    let mut h = s.connect();
    let th = acquire(&mut h, "held", "30", "0");
    let mut c = s.connect();
    c.set_timeout(Duration::from_secs(10));
    // 4096 waiting acquires are allowed (line 4097 is S)...
    c.send("A held 10 0\n".repeat(4096).as_bytes());
    assert_eq!(status(&mut c, &s), th);
    // ...the 4097th (line 4098) breaks the connection.
    c.line("A held 10 0");
    let before = expect_error(&mut c, 4098);
    assert!(before.is_empty(), "unexpected answers {before:?}");
    // All its waiters were withdrawn: the key goes free on release.
    assert_eq!(h.call(&format!("R held {th}")), "R held 1");
    let mut x = s.connect();
    let t = acquire(&mut x, "held", "10", "2");
    assert!(t > th);
}

fn waiting_limit_counts_only_waiting(io: &str) {
    // Acquires that were answered (T, or granted at once) do not count
    // towards the 4096 waiting acquires of a connection.
    let s = Server::start(io);
    let mut h = s.connect();
    let th = acquire(&mut h, "held", "30", "0");
    let mut c = s.connect();
    c.set_timeout(Duration::from_secs(10));
    c.send("A held 10 0.1\n".repeat(4096).as_bytes());
    for i in 0..4096 {
        let answer = c.recv();
        assert_eq!(answer, "T held", "answer {i}");
    }
    let mut text = String::new();
    for i in 0..100 {
        text.push_str(&format!("A free{i} 10 0\n"));
    }
    c.send(text.as_bytes());
    let mut last = th;
    for i in 0..100 {
        let t = grant_of(&format!("free{i}"), &c.recv());
        assert!(t > last);
        last = t;
    }
    c.send("A held 10 0\n".repeat(4096).as_bytes());
    assert_eq!(status(&mut c, &s), last);
    assert_eq!(h.call(&format!("R held {th}")), "R held 1");
    let t = grant_of("held", &c.recv());
    assert!(t > last);
}

// ---------------------------------------------------------------------------
// 10. 5000 pipelined requests, written without reading.

/// Matches answers to requests as the official clients do (rule 2) and
/// returns them in request order.
fn match_answers(c: &mut Conn, requests: &[String]) -> Vec<String> {
    let mut pending: HashMap<(String, String), VecDeque<usize>> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        let mut f = r.split(' ');
        let op = f.next().unwrap().to_string();
        let key = f.next().unwrap_or("").to_string();
        pending.entry((op, key)).or_default().push_back(i);
    }
    let mut answers = vec![String::new(); requests.len()];
    for n in 0..requests.len() {
        let line = c.recv();
        let mut f = line.split(' ');
        let op = f.next().unwrap();
        let key = if op == "S" {
            ""
        } else {
            f.next().unwrap_or("")
        };
        let req_op = if op == "T" { "A" } else { op };
        let i = pending
            .get_mut(&(req_op.to_string(), key.to_string()))
            .and_then(|q| q.pop_front())
            .unwrap_or_else(|| panic!("answer {n} {line:?} matches no request"));
        answers[i] = line;
    }
    answers
}

fn pipelined_5000(io: &str) {
    let s = Server::start(io);
    let mut c = s.connect();
    let mut requests = Vec::new();
    for j in 0..1250 {
        requests.push(format!("A p{j} 60 0"));
        requests.push(format!("R p{j} 1"));
        requests.push(format!("N p{j} 1 5"));
        requests.push("S".to_string());
    }
    let mut bytes = Vec::new();
    for r in &requests {
        bytes.extend_from_slice(r.as_bytes());
        bytes.push(b'\n');
    }
    let (_, done, writer) = write_in_background(c.stream(), bytes, 4096);
    // Tokens grow in the order the grants arrive.
    let answers = match_answers(&mut c, &requests);
    writer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    let mut tokens = Vec::new();
    let mut last = 0;
    for j in 0..1250 {
        let a = &answers[4 * j..4 * j + 4];
        let t = grant_of(&format!("p{j}"), &a[0]);
        assert!(t > last, "token of p{j}");
        last = t;
        tokens.push(t);
        assert_eq!(a[1], format!("R p{j} 0"));
        assert_eq!(a[2], format!("N p{j} 0"));
        assert_eq!(a[3], format!("S active {} {t}", s.addr));
    }

    // And the releases, pipelined the same way.
    let requests: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(j, t)| format!("R p{j} {t}"))
        .collect();
    let bytes = requests
        .iter()
        .map(|r| format!("{r}\n"))
        .collect::<String>();
    let (_, done, writer) = write_in_background(c.stream(), bytes.into_bytes(), 4096);
    let answers = match_answers(&mut c, &requests);
    writer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    for (j, a) in answers.iter().enumerate() {
        assert_eq!(a, &format!("R p{j} 1"));
    }
    assert_eq!(status(&mut c, &s), last);
}

// ---------------------------------------------------------------------------
// 11. Backpressure: a client that does not read gets everything later, and
//     the server does not buffer its answers without bound.

fn backpressure(io: &str) {
    let s = Server::start(io);
    let expected = format!("S active {} 0", s.addr);

    // Warm up (buffers, rings) so that the memory measure below shows
    // per-connection buffering, not first use.
    let mut warm = s.connect();
    let (_, _, writer) = write_in_background(warm.stream(), b"S\n".repeat(20_000), 8192);
    for _ in 0..20_000 {
        assert_eq!(warm.recv(), expected);
    }
    writer.join().unwrap();
    drop(warm);
    let base = s.rss_kib().expect("server rss");

    const N: usize = 512 * 1024; // 1 MiB of "S\n"
    let mut c = s.connect();
    let (written, done, writer) = write_in_background(c.stream(), b"S\n".repeat(N), 16 * 1024);
    // Let the writer run until it is stuck (or done), bounded.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = usize::MAX;
    let mut stable_since = Instant::now();
    while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
        let now = written.load(Ordering::SeqCst);
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() > Duration::from_millis(500) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    // Let the server settle too: its memory and the socket queues stop
    // changing (bounded: 3 s).
    let client = c.stream().local_addr().unwrap();
    let snapshot = || {
        (
            s.rss_kib().expect("server rss"),
            common::tcp_queues(client, s.addr).expect("client socket"),
            common::tcp_queues(s.addr, client).expect("server socket"),
        )
    };
    let mut last = snapshot();
    for _ in 0..30 {
        thread::sleep(Duration::from_millis(100));
        let now = snapshot();
        if now == last {
            break;
        }
        last = now;
    }
    let (rss, (cli_tx, cli_rx), (srv_tx, srv_rx)) = last;
    let growth = rss.saturating_sub(base);
    // Where the bytes are: what the server has read and answered but still
    // holds itself is all its answers minus those in the kernel's queues.
    // Bounded means at most 64 KiB plus the answers to one read's worth of
    // requests; unbounded would be the ~14 MiB of answers to all of them.
    let sent = written.load(Ordering::SeqCst) as u64;
    let requests_read = (sent - cli_tx - srv_rx) / 2;
    let answered = requests_read * (expected.len() as u64 + 1);
    let held = answered.saturating_sub(cli_rx + srv_tx);
    eprintln!(
        "backpressure ({io}): {sent} of {} request bytes written; server read \
         {requests_read} requests, holds {held} answer bytes itself \
         (kernel: client tx {cli_tx} rx {cli_rx}, server tx {srv_tx} rx \
         {srv_rx}); server rss {base} KiB -> {rss} KiB",
        2 * N
    );
    assert!(
        held <= 1024 * 1024,
        "the server holds {held} bytes of unread answers"
    );
    // Unbounded buffering of the ~14 MiB of answers would show here.
    assert!(
        growth < 6 * 1024,
        "server grew by {growth} KiB while the client did not read \
         ({} of {} bytes written)",
        written.load(Ordering::SeqCst),
        2 * N
    );

    // Now read: every answer arrives, none lost, none extra.
    for i in 0..N {
        let answer = c.recv();
        assert_eq!(answer, expected, "answer {i}");
    }
    writer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert!(c.quiet_for(Duration::from_millis(100)));
    assert_eq!(status(&mut c, &s), 0);
}

// ---------------------------------------------------------------------------
// 12. 300 concurrent connections.

fn concurrent_300(io: &str) {
    const N: usize = 300;
    let s = Server::start(io);
    let mut conns: Vec<Conn> = (0..N).map(|_| s.connect()).collect();
    let barrier = Arc::new(Barrier::new(N));
    let addr = s.addr;
    let handles: Vec<_> = conns
        .drain(..)
        .enumerate()
        .map(|(i, mut c)| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let key = format!("own{i}");
                let t = acquire(&mut c, &key, "30", "0");
                assert_eq!(c.call(&format!("R {key} {t}")), format!("R {key} 1"));
                let answer = c.call("S");
                assert!(answer.starts_with(&format!("S active {addr} ")));
                (c, t)
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for h in handles {
        let (c, t) = h.join().expect("connection thread");
        conns.push(c);
        tokens.push(t);
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), N, "tokens must be distinct");

    // All 300 queue for one key and are served in arrival order.
    let mut token = acquire(&mut conns[0], "shared", "30", "0");
    for c in conns.iter_mut().skip(1) {
        c.line("A shared 30 0");
        assert_eq!(status(c, &s), token);
    }
    for i in 1..N {
        assert_eq!(
            conns[i - 1].call(&format!("R shared {token}")),
            "R shared 1"
        );
        let next = grant_of("shared", &conns[i].recv());
        assert!(next > token);
        token = next;
    }
    assert_eq!(
        conns[N - 1].call(&format!("R shared {token}")),
        "R shared 1"
    );
}

// ---------------------------------------------------------------------------
// 13. Tokens keep growing across kill -9 and a restart on the same port.

fn tokens_survive_kill9(io: &str) {
    let mut s = Server::start(io);
    let port = s.addr.port();
    let mut c = s.connect();
    let t1 = acquire(&mut c, "a", "30", "0");
    let t2 = acquire(&mut c, "b", "30", "0");
    assert_eq!(c.call(&format!("R a {t1}")), "R a 1");
    let t3 = acquire(&mut c, "a", "30", "0");
    let max = t1.max(t2).max(t3);
    drop(c);
    s.kill9();

    let listen = format!("127.0.0.1:{port}");
    let s = restart_on(&listen, io);
    assert_eq!(s.addr.port(), port);
    let mut c = s.connect();
    let answer = c.call("S");
    assert!(
        answer.starts_with(&format!("S active {listen} ")),
        "{answer:?}"
    );
    // No stored state: "a" is free, and its new token is above all before.
    let t4 = acquire(&mut c, "a", "30", "0.5");
    assert!(t4 > max, "token after restart {t4} must exceed {max}");
    let t5 = acquire(&mut c, "b", "30", "0.5");
    assert!(t5 > t4);
    assert_eq!(status(&mut c, &s), t5);
}

/// Starts a server on `listen` again right after a kill -9. Under io_uring
/// the kernel tears the dead process's ring down asynchronously, and the old
/// listening socket lingers for a few milliseconds; the server retries its
/// bind through that window, so an immediate restart must simply work.
fn restart_on(listen: &str, io: &str) -> Server {
    Server::start_with(&["--listen", listen, "--io", io])
}

// ---------------------------------------------------------------------------
// 14. --max-conns: one more is closed at once; the others are unaffected.

fn max_conns(io: &str) {
    let s = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io, "--max-conns", "5"]);
    let mut conns: Vec<Conn> = (0..5).map(|_| s.connect()).collect();
    for c in &mut conns {
        assert_eq!(status(c, &s), 0);
    }
    let mut sixth = s.connect();
    sixth.set_timeout(Duration::from_secs(5));
    let start = Instant::now();
    if let Some(line) = sixth.recv_or_closed() {
        panic!("6th connection must be closed, got {line:?}");
    }
    assert!(start.elapsed() < SLACK);
    let mut last = 0;
    for (i, c) in conns.iter_mut().enumerate() {
        let key = format!("k{i}");
        let t = acquire(c, &key, "30", "0");
        assert!(t > last);
        last = t;
        assert_eq!(c.call(&format!("R {key} {t}")), format!("R {key} 1"));
    }
    // A freed slot can be used again.
    conns.pop();
    wait_for_free_slot(&s);
    for c in &mut conns {
        assert_eq!(status(c, &s), last);
    }
}

// ---------------------------------------------------------------------------
// --max-locks: an acquire of one key more breaks its connection with E;
// existing grants, keys that have a lock and other connections go on.

fn max_locks(io: &str) {
    let s = Server::start_with(&["--listen", "127.0.0.1:0", "--io", io, "--max-locks", "3"]);
    let mut a = s.connect();
    let mut b = s.connect();
    let t1 = acquire(&mut a, "k1", "30", "0");
    let t2 = acquire(&mut a, "k2", "30", "0");
    let t3 = acquire(&mut b, "k3", "30", "0");
    // A waiter on a held key is no new lock: it waits as usual.
    b.line("A k1 30 0");
    assert_eq!(status(&mut b, &s), t3);

    // The 4th distinct key: answers before it, then E naming its line.
    let mut c = s.connect();
    c.send(b"S\nA k2 30 0.2\nA k4 30 0\nS\n");
    let before = expect_error(&mut c, 3);
    assert_eq!(before, [format!("S active {} {t3}", s.addr)]);
    let mut c = s.connect();
    c.line("A k4 30 0");
    let error = expect_error(&mut c, 1);
    assert!(error.is_empty());
    let mut c = s.connect();
    c.line("A k4 30 0");
    let line = c.recv_or_closed().expect("an E line");
    assert_eq!(line, "E lock table full: 3 locks (--max-locks) in line 1");

    // The others are unaffected: grants live, releases hand over, renewals
    // and acquires of the keys that have a lock work.
    assert_eq!(a.call(&format!("N k2 {t2} 30")), "N k2 1");
    assert_eq!(a.call("A k3 30 0.1"), "T k3");
    assert_eq!(a.call(&format!("R k1 {t1}")), "R k1 1");
    let t1b = grant_of("k1", &b.recv());
    assert!(t1b > t3);
    // A lock that goes makes room for a new key.
    assert_eq!(a.call(&format!("R k2 {t2}")), "R k2 1");
    let mut d = s.connect();
    let t4 = acquire(&mut d, "k4", "30", "0");
    assert!(t4 > t1b);
    assert_eq!(status(&mut a, &s), t4);
}

/// `--max-locks` out of its range stops the server before it listens.
fn max_locks_out_of_range() {
    for value in ["0", "2147483649"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args(["serve", "--listen", "127.0.0.1:0", "--max-locks", value])
            .output()
            .expect("run ringlock serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--max-locks {value} accepted");
        assert!(
            stderr.contains("--max-locks must be between 1 and 2147483648"),
            "{stderr}"
        );
        assert!(!stderr.contains("listening"), "{stderr}");
    }
}

// ---------------------------------------------------------------------------
// 15. SIGTERM / SIGINT: waiting acquires get `M <key> -`, then exit 0.

fn graceful_exit(io: &str, sig: i32) {
    let mut s = Server::start(io);
    let mut h = s.connect();
    let tk = acquire(&mut h, "k", "30", "0");
    let tq = acquire(&mut h, "q", "30", "0");
    let mut w = s.connect();
    w.send(b"A k 30 0\nA j 30 0\nA q 30 0\nA k 30 5\n");
    let tj = grant_of("j", &w.recv());
    assert!(tj > tq && tq > tk);
    assert_eq!(status(&mut w, &s), tj);

    s.signal(sig);
    w.set_timeout(Duration::from_secs(10));
    // Oldest first on the connection.
    assert_eq!(w.recv_or_closed().as_deref(), Some("M k -"));
    assert_eq!(w.recv_or_closed().as_deref(), Some("M q -"));
    assert_eq!(w.recv_or_closed().as_deref(), Some("M k -"));
    if let Some(line) = w.recv_or_closed() {
        panic!("after the M answers the server should exit, got {line:?}");
    }
    h.set_timeout(Duration::from_secs(10));
    if let Some(line) = h.recv_or_closed() {
        panic!("holder got {line:?}");
    }
    let exit = s
        .wait_timeout(Duration::from_secs(10))
        .expect("server still runs 10 s after the signal");
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
}

fn sigterm_answers_waiters(io: &str) {
    graceful_exit(io, libc::SIGTERM)
}

fn sigint_answers_waiters(io: &str) {
    graceful_exit(io, libc::SIGINT)
}

/// SIGHUP (what `systemctl reload` sends) to a node without TLS: there is
/// nothing to reload, it says so and serves on (SIGHUP's default action
/// would end it, with a status systemd counts as a clean exit). The grant
/// held before it is still held, the connection still answers, new ones
/// are accepted; a second SIGHUP is handled the same way.
fn sighup_without_tls_carries_on(io: &str) {
    let (mut s, log) = Server::start_logged(&["--listen", "127.0.0.1:0", "--io", io]);
    let mut c = s.connect();
    let t = acquire(&mut c, "hup", "30", "0");
    let said = "SIGHUP: nothing to reload (no --tls-cert";
    for n in 1..=2 {
        s.signal(libc::SIGHUP);
        common::poll_until(
            "the SIGHUP line",
            Duration::from_secs(10),
            || log.lines_with(said).len(),
            |&lines| lines == n,
        );
        assert!(
            s.wait_timeout(Duration::ZERO).is_none(),
            "SIGHUP ended the node: {}",
            log.text()
        );
        let mut fresh = s.connect();
        assert_eq!(status(&mut fresh, &s), t);
    }
    assert_eq!(c.call(&format!("N hup {t} 30")), "N hup 1");
    assert_eq!(c.call(&format!("R hup {t}")), "R hup 1");
    assert!(log.lines_with(" WARN ").is_empty(), "{}", log.text());
}

// ---------------------------------------------------------------------------
// 16. CRLF requests accepted; answers end in a bare LF.

fn crlf(io: &str) {
    let s = Server::start(io);
    let mut c = s.connect();
    c.send(b"A k 10 0\r\n");
    let raw = c.recv_raw().expect("answer");
    assert!(raw.ends_with(b"\n") && !raw.ends_with(b"\r\n"), "{raw:?}");
    let line = String::from_utf8(raw[..raw.len() - 1].to_vec()).unwrap();
    let t = grant_of("k", &line);
    c.send(format!("N k {t} 5\r\nR k {t}\r\nS\r\nR k {t}\n").as_bytes());
    for expected in [
        "N k 1\n".to_string(),
        "R k 1\n".to_string(),
        format!("S active {} {t}\n", s.addr),
        "R k 0\n".to_string(),
    ] {
        let raw = c.recv_raw().expect("answer");
        assert_eq!(String::from_utf8_lossy(&raw), expected);
    }
}

// ---------------------------------------------------------------------------
// 17. A line of exactly 512 bytes with a 250-byte key is accepted, also
//     when it arrives split, and also with CRLF.

fn line_of_512(io: &str) {
    let s = Server::start(io);
    let key = "k".repeat(250);
    let mut c = s.connect();
    let line = padded_acquire(512, "\n");
    // 511 bytes are a partial line, not an error.
    c.send(&line[..511]);
    assert!(
        c.quiet_for(Duration::from_millis(300)),
        "answer before the line ended"
    );
    c.send(&line[511..]);
    let t = grant_of(&key, &c.recv());
    // A 512-byte release with a zero-padded token.
    let mut release = format!("R {key} {t}\n");
    let pad = "0".repeat(512 - release.len());
    release = format!("R {key} {pad}{t}\n");
    assert_eq!(release.len(), 512);
    assert_eq!(c.call(release.trim_end()), format!("R {key} 1"));

    c.send(&padded_acquire(512, "\r\n"));
    let t2 = grant_of(&key, &c.recv());
    assert!(t2 > t);
    assert_eq!(c.call(&format!("R {key} {t2}")), format!("R {key} 1"));
}

// ---------------------------------------------------------------------------
// Valid forms at the edges of the value table of docs/protocol.md ("3. Values").

fn valid_forms(io: &str) {
    let s = Server::start(io);
    let mut c = s.connect();
    // Leading zeros; answers carry none.
    let t = grant_of("k", &c.call("A k 010 00"));
    assert_eq!(c.call(&format!("N k 00{t} 005.5")), "N k 1");
    assert_eq!(c.call(&format!("R k 0{t}")), "R k 1");
    // Millisecond and maximal values.
    let t1 = acquire(&mut c, "ms", "0.001", "0");
    let t2 = acquire(&mut c, "max", "86400", "86400");
    assert!(t2 > t1);
    let t3 = acquire(&mut c, "max2", "86400.000", "0.5");
    assert!(t3 > t2);
    assert_eq!(c.call("R k 18446744073709551615"), "R k 0");
    assert_eq!(c.call("N k 18446744073709551615 86400"), "N k 0");
    // An acquire waiting up to a day is fine.
    c.line("A max 1 86400.000");
    assert_eq!(status(&mut c, &s), t3);
    // Not reentrant: the second A of the same key waits behind the first.
    c.line(&format!("R max {t2}"));
    let answers = recv_sorted(&mut c, 2);
    let t4 = answers
        .iter()
        .find(|l| l.starts_with("A "))
        .map(|l| grant_of("max", l))
        .unwrap_or_else(|| panic!("no grant in {answers:?}"));
    assert!(t4 > t3);
    assert_eq!(
        answers,
        sorted(vec![format!("A max {t4}"), "R max 1".into()])
    );
    // Keys: every allowed ASCII byte, bytes >= 0x80 (UTF-8 or not), case.
    let punct: String = (0x21u8..=0x7e).map(char::from).collect();
    let tp = acquire(&mut c, &punct, "10", "0");
    assert!(tp > t4);
    let tu = acquire(&mut c, "ключ", "10", "0");
    assert!(tu > tp);
    c.send(b"A \x80\xff 10 0\n");
    let raw = c.recv_raw().expect("answer");
    assert!(raw.starts_with(b"A \x80\xff "), "{raw:?}");
    let tb: u64 = std::str::from_utf8(&raw[5..raw.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    assert!(tb > tu);
    let tk = acquire(&mut c, "K", "10", "0.2");
    assert!(tk > tb);
    c.send(format!("R \x7e\x21 {tb}\nR K {tk}\n").as_bytes());
    assert_eq!(c.recv(), "R ~! 0");
    assert_eq!(c.recv(), "R K 1");
    let mut release = b"R \x80\xff ".to_vec();
    release.extend_from_slice(format!("{tb}\n").as_bytes());
    c.send(&release);
    assert_eq!(c.recv_raw().unwrap(), b"R \x80\xff 1\n");
}

// ---------------------------------------------------------------------------
// Many wait timers at once.

fn many_wait_timeouts(io: &str) {
    const N: usize = 100;
    let s = Server::start(io);
    let mut h = s.connect();
    let mut text = String::new();
    for i in 0..N {
        text.push_str(&format!("A m{i} 30 0\n"));
    }
    h.send(text.as_bytes());
    for i in 0..N {
        grant_of(&format!("m{i}"), &h.recv());
    }
    let mut w = s.connect();
    let mut text = String::new();
    for i in 0..N {
        text.push_str(&format!("A m{i} 10 0.{:03}\n", 100 + 3 * i));
    }
    // One waiter that must not fire.
    text.push_str("A m0 10 86400\n");
    let start = Instant::now();
    w.send(text.as_bytes());
    let mut seen = [false; N];
    for _ in 0..N {
        let line = w.recv();
        let elapsed = start.elapsed();
        let i: usize = line
            .strip_prefix("T m")
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("expected T m<i>, got {line:?}"));
        assert!(!seen[i], "two answers for m{i}");
        seen[i] = true;
        let wait = Duration::from_millis(100 + 3 * i as u64);
        assert_between(elapsed, wait, wait + SLACK, &line);
    }
    assert!(w.quiet_for(Duration::from_millis(100)));
    let highest = status(&mut w, &s);
    assert!(highest > 0);
}

// ---------------------------------------------------------------------------
// A broken line behind a backlog of unread answers: all of them first.

fn bad_line_after_backlog(io: &str) {
    const N: usize = 50_000;
    let s = Server::start(io);
    let mut c = s.connect();
    let mut bytes = b"S\n".repeat(N);
    bytes.extend_from_slice(b"S x\n");
    let (_, done, writer) = write_in_background(c.stream(), bytes, 16 * 1024);
    let expected = format!("S active {} 0", s.addr);
    for i in 0..N {
        let answer = c
            .recv_or_closed()
            .unwrap_or_else(|| panic!("closed after {i} of {N} answers"));
        assert_eq!(answer, expected, "answer {i}");
    }
    let before = expect_error(&mut c, N + 1);
    assert!(before.is_empty(), "{before:?}");
    writer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    let mut other = s.connect();
    assert_eq!(status(&mut other, &s), 0);
}

// ---------------------------------------------------------------------------
// Contention: many clients, few keys, short waits, some clients vanishing
// while they wait. Each holder checks, inside its critical section, that
// nobody else is inside and that the key's tokens only grow: a double grant
// or a reordered token would show.

fn contention(io: &str) {
    const THREADS: usize = 12;
    const ROUNDS: usize = 60;
    const KEYS: usize = 3;
    let s = Server::start(io);
    let addr = s.addr;
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let last: Arc<std::sync::Mutex<Vec<u64>>> = Arc::new(std::sync::Mutex::new(vec![0; KEYS]));
    let grants = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (inside, last, grants) = (inside.clone(), last.clone(), grants.clone());
            thread::spawn(move || {
                let mut c = Conn::new(addr);
                c.set_timeout(Duration::from_secs(10));
                for round in 0..ROUNDS {
                    assert!(Instant::now() < deadline, "contention took too long");
                    let k = (t * 7 + round * 3) % KEYS;
                    let key = format!("c{k}");
                    if round % 20 == 19 {
                        // Vanish while (probably) waiting; a grant that
                        // raced the close expires after 0.2 s.
                        c.line(&format!("A {key} 0.2 0"));
                        c = Conn::new(addr);
                        c.set_timeout(Duration::from_secs(10));
                        continue;
                    }
                    let wait = ["0", "0.003", "0", "0.001"][round % 4];
                    let answer = c.call(&format!("A {key} 30 {wait}"));
                    if answer == format!("T {key}") {
                        assert_ne!(wait, "0", "T for an unlimited wait");
                        continue;
                    }
                    let token = grant_of(&key, &answer);
                    let before = inside[k].fetch_add(1, Ordering::SeqCst);
                    assert_eq!(before, 0, "two holders of {key} at once");
                    {
                        let mut last = last.lock().unwrap();
                        assert!(token > last[k], "token of {key} went back");
                        last[k] = token;
                    }
                    grants.fetch_add(1, Ordering::SeqCst);
                    // Hold it a little, so that others queue (and some
                    // short waits run out).
                    thread::sleep(Duration::from_millis(2));
                    inside[k].fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(c.call(&format!("R {key} {token}")), format!("R {key} 1"));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("contention thread");
    }
    let grants = grants.load(Ordering::SeqCst);
    eprintln!(
        "contention ({io}): {grants} grants of {} attempts",
        THREADS * ROUNDS
    );
    assert!(grants > THREADS * ROUNDS / 4);
}
