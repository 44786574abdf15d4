//! Clients through a failback, with real `ringlock serve` processes on
//! loopback: the active is killed, the next node takes over, and the killed
//! node, restarted, takes the role back within a few tens of milliseconds
//! of starting, long before a client's 3 s redial of it. A `ringlock run
//! --lease 2` holder, given every address, keeps its lock: its renewals
//! meet `M` naming the returning node, and the client dials it at once
//! (docs/protocol.md, "12. The official clients"). Both io backends.

#[macro_use]
mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Cluster;

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [both()])
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        run_keeps_its_lock_through_a_failback:
            run_keeps_its_lock_through_a_failback_uring, run_keeps_its_lock_through_a_failback_epoll;
    }
}

/// Bound for the waits that only need to end eventually.
const SETTLE: Duration = Duration::from_secs(10);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringlock-failback-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run_keeps_its_lock_through_a_failback(io: &str) {
    let mut c = Cluster::start(3, io);
    let list = c.addr_strings().join(",");
    let dir = scratch(&format!("run-{io}"));
    let file = dir.join("token");
    let script = format!(
        "echo $RINGLOCK_TOKEN > {}.tmp && mv {0}.tmp {0}; sleep 9; exit 5",
        file.display()
    );
    let child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["run", "failback/run", "--lease", "2", "--server", &list])
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let token: u64 = common::read_line_file(&file, SETTLE).parse().unwrap();
    c.wait_token(1, token, SETTLE);

    // The active crashes; node 1 takes over.
    c.kill9(0);
    c.wait_settled(1, SETTLE);
    // A second after the crash (the holder's redial of node 0 failed at
    // the crash; its next one is 3 s after it), node 0 comes back, syncs
    // and takes the role back.
    std::thread::sleep(Duration::from_millis(700));
    c.start_node(0);
    c.wait_settled(0, SETTLE);
    // Longer than the lease after the hand-back: the lock is still held on
    // node 0, so renewals reached it.
    std::thread::sleep(Duration::from_millis(2500));
    let mut n0 = c.connect(0);
    let probe = n0.call("A failback/run 1 0.1");

    let out = common::wait_output(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "{io}: ringlock run through a failback: exit {:?}; stderr: {err}",
        out.status.code()
    );
    assert_eq!(
        probe, "T failback/run",
        "the lock is still held; stderr: {err}"
    );
    assert_eq!(out.status.code(), Some(5), "CMD's status: {err}");
    assert!(!err.contains("LOCK LOST"), "{err}");
    // Released at the end, on node 0.
    let answer = n0.call("A failback/run 1 2");
    assert!(common::Conn::token_of(&answer) > token, "{answer}");
    let _ = std::fs::remove_dir_all(dir);
}
