//! Shared grants and permits through failover and hand-off, with three
//! real `ringlock serve` processes on loopback and the official CLI as the
//! client, on both io backends: two readers and two permits of a
//! semaphore of 2 are held by `ringlock run --shared` and `ringlock run
//! --permits 2` (lease 2 s, renewed by the CLI), a third permit waits;
//! the active is killed with SIGKILL, then the node that took over is
//! stopped with SIGTERM (a hand-off). Through both, the holders keep their
//! grants (renewed on the new active, never lost), the key stays held
//! against an exclusive acquire and a third permit, the waiting permit is
//! granted only once a holder releases, and every token issued after a
//! failover is above every earlier one.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Cluster, status_of};

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [on_both! {
            shared_grants_and_permits_survive_failover_and_hand_off:
                shared_grants_and_permits_survive_failover_and_hand_off_uring,
                shared_grants_and_permits_survive_failover_and_hand_off_epoll;
        }],
    )
}

/// Bound for the waits that only need to end eventually.
const SETTLE: Duration = Duration::from_secs(15);

/// `ringlock`'s exit status when the key is held (`--no-wait`).
const EXIT_HELD: i32 = 75;

/// The holders' lease: a grant not renewed on the new active would end
/// within it.
const LEASE_S: u64 = 2;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ringlock-cluster-shared-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `ringlock run <kind...> KEY --lease 2` holder given every address,
/// whose CMD writes its token to `dir/<name>` and runs until `dir/go-<name>`
/// exists (at most 60 s), then exits 5.
fn start_holder(c: &Cluster, kind: &[&str], key: &str, dir: &Path, name: &str) -> Child {
    let list = c.addr_strings().join(",");
    let file = dir.join(name);
    let go = dir.join(format!("go-{name}"));
    let script = format!(
        "echo $RINGLOCK_TOKEN > {f}.tmp && mv {f}.tmp {f}; i=0; \
         while [ ! -e {g} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 5",
        f = file.display(),
        g = go.display()
    );
    Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("run")
        .args(kind)
        .args([key, "--lease", &LEASE_S.to_string(), "--server", &list])
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn token_of(dir: &Path, name: &str) -> u64 {
    common::read_line_file(&dir.join(name), SETTLE)
        .parse()
        .unwrap()
}

/// Lets holder `name`'s CMD end and checks that it held its grant
/// throughout: CMD's own status, no `LOCK LOST`.
fn finish_holder(child: Child, dir: &Path, name: &str) {
    std::fs::write(dir.join(format!("go-{name}")), b"").unwrap();
    let out = common::wait_output(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "{name}: ringlock run: exit {:?}; stderr: {err}",
        out.status.code()
    );
    assert!(!err.contains("LOCK LOST"), "{name}: {err}");
    assert_eq!(out.status.code(), Some(5), "{name}: CMD's status: {err}");
}

/// `ringlock acquire <kind...> KEY --no-wait` against every address: its
/// exit status and, granted, its token.
fn acquire_no_wait(c: &Cluster, kind: &[&str], key: &str) -> (Option<i32>, Option<u64>) {
    let list = c.addr_strings().join(",");
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("acquire")
        .args(kind)
        .args([key, "--lease", "60", "--no-wait", "--server", &list])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let token = String::from_utf8_lossy(&out.stdout).trim().parse().ok();
    (out.status.code(), token)
}

/// The readers' key and the semaphore are held: an exclusive acquire and a
/// third permit are refused at once.
fn still_held(c: &Cluster, when: &str) {
    assert_eq!(
        acquire_no_wait(c, &[], "cs/readers").0,
        Some(EXIT_HELD),
        "{when}: an exclusive acquire of the readers' key"
    );
    assert_eq!(
        acquire_no_wait(c, &["--permits", "2"], "cs/sem").0,
        Some(EXIT_HELD),
        "{when}: a third permit of a semaphore of 2"
    );
}

/// The token of a fresh exclusive grant of `key` (a key of its own, held
/// for its 60 s lease after `acquire` exits).
fn fresh_token(c: &Cluster, key: &str) -> u64 {
    let (code, token) = acquire_no_wait(c, &[], key);
    assert_eq!(code, Some(0), "{key}");
    token.expect("acquire prints its token")
}

fn until_active(c: &Cluster, i: usize) {
    let addr = c.addrs[i];
    common::poll_until(
        &format!("node {i} active"),
        SETTLE,
        || status_of(addr, Duration::from_millis(500)),
        |s| s.as_ref().is_some_and(|s| s.is_active()),
    );
}

fn shared_grants_and_permits_survive_failover_and_hand_off(io: &str) {
    let mut c = Cluster::start(3, io);
    let dir = scratch(io);
    let readers: Vec<Child> = ["r1", "r2"]
        .iter()
        .map(|n| start_holder(&c, &["--shared"], "cs/readers", &dir, n))
        .collect();
    let permits: Vec<Child> = ["p1", "p2"]
        .iter()
        .map(|n| start_holder(&c, &["--permits", "2"], "cs/sem", &dir, n))
        .collect();
    let mut held: Vec<u64> = ["r1", "r2", "p1", "p2"]
        .iter()
        .map(|n| token_of(&dir, n))
        .collect();
    // The third permit waits behind them.
    let waiting = start_holder(&c, &["--permits", "2"], "cs/sem", &dir, "p3");
    still_held(&c, "before the failover");
    let mut highest = fresh_token(&c, "cs/before");
    assert!(held.iter().all(|&t| t < highest));
    for i in [1, 2] {
        c.wait_token(i, highest, SETTLE);
    }

    // kill -9 of the active: node 1 takes over with every member.
    c.kill9(0);
    until_active(&c, 1);
    still_held(&c, "after the kill -9");
    // Longer than a lease: the holders renewed on node 1.
    std::thread::sleep(Duration::from_secs(LEASE_S + 1));
    still_held(&c, "a lease after the kill -9");
    assert!(
        !dir.join("p3").exists(),
        "a third permit granted beside two"
    );
    let after_kill = fresh_token(&c, "cs/after-kill");
    assert!(after_kill > highest, "{after_kill} not above {highest}");
    highest = after_kill;
    c.wait_token(2, highest, SETTLE);

    // SIGTERM of node 1: it hands the role to node 2.
    c.node(1).signal(libc::SIGTERM);
    until_active(&c, 2);
    still_held(&c, "after the hand-off");
    std::thread::sleep(Duration::from_secs(LEASE_S + 1));
    still_held(&c, "a lease after the hand-off");
    assert!(
        !dir.join("p3").exists(),
        "a third permit granted beside two"
    );
    let after_handoff = fresh_token(&c, "cs/after-hand-off");
    assert!(
        after_handoff > highest,
        "{after_handoff} not above {highest}"
    );
    held.push(after_handoff);

    // One permit released: the waiting one is granted, above every token.
    let mut permits = permits.into_iter();
    finish_holder(permits.next().unwrap(), &dir, "p1");
    let third = token_of(&dir, "p3");
    assert!(
        held.iter().all(|&t| t < third),
        "{third} not above {held:?}"
    );
    for (child, name) in readers.into_iter().zip(["r1", "r2"]) {
        finish_holder(child, &dir, name);
    }
    finish_holder(permits.next().unwrap(), &dir, "p2");
    finish_holder(waiting, &dir, "p3");
    let _ = std::fs::remove_dir_all(dir);
}
