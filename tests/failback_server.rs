//! The server's half of failback and pauses, with real `ringlock serve`
//! processes on loopback (three nodes) and the official CLI as the client:
//! a returning node of higher priority gets the role back only after the
//! failback delay, and an active that was stopped (SIGSTOP) and resumes
//! keeps what the node that took over granted meanwhile. In both, a
//! `ringlock run --lease 2` holder keeps its lock. Both io backends.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, status_of};

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [
            on_both! {
                a_stopped_active_keeps_what_was_granted_meanwhile:
                    a_stopped_active_keeps_what_was_granted_meanwhile_uring,
                    a_stopped_active_keeps_what_was_granted_meanwhile_epoll;
                a_restarted_active_takes_the_role_back_after_the_delay:
                    a_restarted_active_takes_the_role_back_after_the_delay_uring,
                    a_restarted_active_takes_the_role_back_after_the_delay_epoll;
            },
            tests![a_failback_delay_beyond_the_bound_is_refused],
        ],
    )
}

/// Bound for the waits that only need to end eventually.
const SETTLE: Duration = Duration::from_secs(15);

/// `ringlock`'s exit status when the lock is held (`--no-wait`).
const EXIT_HELD: i32 = 75;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ringlock-failback-server-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `ringlock run KEY --lease 2` holder given every address, whose CMD
/// writes its token to `dir/token` and runs until `dir/go` exists (at most
/// 40 s), then exits 5. Returns it and its token.
fn start_holder(c: &Cluster, key: &str, dir: &Path) -> (Child, u64) {
    let list = c.addr_strings().join(",");
    let file = dir.join("token");
    let go = dir.join("go");
    let script = format!(
        "echo $RINGLOCK_TOKEN > {f}.tmp && mv {f}.tmp {f}; i=0; \
         while [ ! -e {g} ] && [ $i -lt 400 ]; do sleep 0.1; i=$((i+1)); done; exit 5",
        f = file.display(),
        g = go.display()
    );
    let child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["run", key, "--lease", "2", "--server", &list])
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let token = common::read_line_file(&file, SETTLE).parse().unwrap();
    (child, token)
}

/// Lets the holder's CMD end and checks that it held its lock throughout:
/// CMD's own status, no `LOCK LOST`.
fn finish_holder(child: Child, dir: &Path, io: &str) {
    std::fs::write(dir.join("go"), b"").unwrap();
    let out = common::wait_output(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "{io}: ringlock run: exit {:?}; stderr: {err}",
        out.status.code()
    );
    assert!(!err.contains("LOCK LOST"), "{err}");
    assert_eq!(out.status.code(), Some(5), "CMD's status: {err}");
}

/// `ringlock acquire KEY --no-wait` against every address: its exit status.
fn acquire_no_wait(c: &Cluster, key: &str) -> Option<i32> {
    let list = c.addr_strings().join(",");
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args([
            "acquire",
            key,
            "--lease",
            "60",
            "--no-wait",
            "--server",
            &list,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    out.status.code()
}

/// Polls node `i`'s status until `cond` holds; returns when it did.
fn until_status(
    c: &Cluster,
    i: usize,
    what: &str,
    cond: impl Fn(&common::NodeStatus) -> bool,
) -> Instant {
    let addr = c.addrs[i];
    common::poll_until(
        what,
        SETTLE,
        || status_of(addr, Duration::from_millis(500)),
        |s| s.as_ref().is_some_and(&cond),
    );
    Instant::now()
}

/// SIGSTOP of the active for 2.5 s (five peer timeouts) while node 1 takes
/// over and grants a key; SIGCONT: node 0 steps down before serving,
/// follows node 1 and gets the role back only after the failback delay.
/// The lease-2 holder keeps its lock, and the key granted meanwhile is
/// still held: a `--no-wait` acquire of it is refused after the resume.
fn a_stopped_active_keeps_what_was_granted_meanwhile(io: &str) {
    const DELAY_MS: u64 = 1_500;
    let mut c = Cluster::configure(3, io, &[]);
    c.failback_delay_ms = DELAY_MS;
    for i in 0..3 {
        c.start_node(i);
    }
    c.wait_settled(0, SETTLE);
    let (a0, a1) = (c.addr(0), c.addr(1));
    let dir = scratch(&format!("stop-{io}"));
    let (holder, token) = start_holder(&c, "fs/held", &dir);
    c.wait_token(1, token, SETTLE);

    let stopped = Instant::now();
    c.node(0).signal(libc::SIGSTOP);
    until_status(&c, 1, "node 1 active while node 0 is stopped", |s| {
        s.is_active()
    });
    // A lock taken on node 1 meanwhile (and kept: `acquire` exits, the
    // lease runs on).
    let list = c.addr_strings().join(",");
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args([
            "acquire",
            "fs/meanwhile",
            "--lease",
            "60",
            "--server",
            &list,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // The scenario: a stop of 2.5 s.
    if let Some(rest) = Duration::from_millis(2_500).checked_sub(stopped.elapsed()) {
        std::thread::sleep(rest);
    }
    c.node(0).signal(libc::SIGCONT);
    let resumed = Instant::now();
    assert_eq!(acquire_no_wait(&c, "fs/meanwhile"), Some(EXIT_HELD));
    until_status(&c, 0, "resumed node 0 follows node 1", |s| s.follows(&a1));
    assert_eq!(acquire_no_wait(&c, "fs/meanwhile"), Some(EXIT_HELD));
    // The hand-back: after node 0 synced, itself after the resume.
    let back = until_status(&c, 0, "node 0 active again", |s| s.is_active());
    assert!(
        back - resumed >= Duration::from_millis(DELAY_MS),
        "node 0 was active again {:?} after its resume, before the {DELAY_MS} ms delay",
        back - resumed
    );
    c.wait_settled(0, SETTLE);
    assert_eq!(acquire_no_wait(&c, "fs/meanwhile"), Some(EXIT_HELD));
    let mut n1 = c.connect(1);
    assert_eq!(n1.call("A fs/x 60 0"), format!("M fs/x {a0}"));
    finish_holder(holder, &dir, io);
    let _ = std::fs::remove_dir_all(dir);
}

/// kill -9 of the active and a restart 1 s later, with the server's default
/// failback delay (5 s): node 1 serves until the delay after node 0 synced
/// is over, then hands the role back; the lease-2 holder keeps its lock.
fn a_restarted_active_takes_the_role_back_after_the_delay(io: &str) {
    const DEFAULT_DELAY_MS: u64 = 5_000;
    let mut c = Cluster::configure(3, io, &[]);
    c.failback_delay_ms = DEFAULT_DELAY_MS;
    for i in 0..3 {
        c.start_node(i);
    }
    c.wait_settled(0, SETTLE);
    let a1 = c.addr(1);
    let dir = scratch(&format!("kill-{io}"));
    let (holder, token) = start_holder(&c, "fs/held", &dir);
    c.wait_token(1, token, SETTLE);

    let killed = Instant::now();
    c.kill9(0);
    c.wait_settled(1, SETTLE);
    if let Some(rest) = Duration::from_secs(1).checked_sub(killed.elapsed()) {
        std::thread::sleep(rest);
    }
    let restarted = Instant::now();
    c.start_node(0);
    until_status(&c, 0, "restarted node 0 follows node 1", |s| s.follows(&a1));
    let back = until_status(&c, 0, "node 0 active again", |s| s.is_active());
    assert!(
        back - restarted >= Duration::from_millis(DEFAULT_DELAY_MS),
        "node 0 was active again {:?} after its restart, before the {DEFAULT_DELAY_MS} ms delay",
        back - restarted
    );
    eprintln!("{io}: failback {:?} after the restart", back - restarted);
    c.wait_settled(0, SETTLE);
    // The holder's lock is held on node 0 now.
    let mut n0 = c.connect(0);
    assert_eq!(n0.call("A fs/held 1 0.1"), "T fs/held");
    finish_holder(holder, &dir, io);
    let _ = std::fs::remove_dir_all(dir);
}

/// A delay beyond the bound is refused at start, with the reason.
fn a_failback_delay_beyond_the_bound_is_refused() {
    for (delay, refused) in [("600001", true), ("600000", false)] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args([
                "--peers",
                "127.0.0.1:1,127.0.0.1:2",
                "--advertise",
                "127.0.0.1:1",
            ])
            // A secret file that does not exist: a delay within the bound
            // gets as far as reading it.
            .args(["--cluster-secret-file", "/nonexistent/ringlock-secret"])
            .args(["--failback-delay-ms", delay])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{delay}: {err}");
        assert_eq!(
            err.contains("--failback-delay-ms must be at most 600000"),
            refused,
            "{delay}: {err}"
        );
    }
}
