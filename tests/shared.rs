//! Shared locks (`G`) and semaphores (`C`) through a real `ringlock
//! serve` on loopback, on both io backends: readers hold together, a
//! writer waits for them, a reader behind a waiting writer waits; a
//! semaphore of 2 never has more than 2 holders; tokens grow in grant
//! order; the permit of a holder killed with SIGKILL comes back when its
//! lease runs out; the active node of a cluster grants both (and a standby
//! redirects them).

#[macro_use]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, Conn, Server};

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [on_both! {
            readers_hold_together_and_a_writer_waits_for_them:
                readers_hold_together_and_a_writer_waits_for_them_uring,
                readers_hold_together_and_a_writer_waits_for_them_epoll;
            a_semaphore_of_two_never_has_more_than_two_holders:
                a_semaphore_of_two_never_has_more_than_two_holders_uring,
                a_semaphore_of_two_never_has_more_than_two_holders_epoll;
            a_killed_holders_permit_comes_back_after_its_lease:
                a_killed_holders_permit_comes_back_after_its_lease_uring,
                a_killed_holders_permit_comes_back_after_its_lease_epoll;
            a_cluster_grants_shared_acquires_and_permits_on_its_active:
                a_cluster_grants_shared_acquires_and_permits_on_its_active_uring,
                a_cluster_grants_shared_acquires_and_permits_on_its_active_epoll;
            five_runs_with_two_permits_never_run_more_than_two_at_once:
                five_runs_with_two_permits_never_run_more_than_two_at_once_uring,
                five_runs_with_two_permits_never_run_more_than_two_at_once_epoll;
            the_command_line_takes_shared_locks_and_says_what_is_refused:
                the_command_line_takes_shared_locks_and_says_what_is_refused_uring,
                the_command_line_takes_shared_locks_and_says_what_is_refused_epoll;
        }],
    )
}

/// How long an answer that must not come is waited for.
const QUIET: Duration = Duration::from_millis(300);

/// The token of a `G`, `C` or `A` grant of `key`.
fn token(line: &str, op: &str, key: &str) -> u64 {
    let rest = line
        .strip_prefix(&format!("{op} {key} "))
        .unwrap_or_else(|| panic!("not a {op} grant of {key}: {line:?}"));
    let t: u64 = rest
        .parse()
        .unwrap_or_else(|_| panic!("no token: {line:?}"));
    assert!(t > 0, "{line:?}");
    t
}

fn readers_hold_together_and_a_writer_waits_for_them(io: &str) {
    let server = Server::start(io);
    let mut r1 = server.connect();
    let mut r2 = server.connect();
    let mut w = server.connect();
    let mut r3 = server.connect();
    let t1 = token(&r1.call("G k 30 0"), "G", "k");
    let t2 = token(&r2.call("G k 30 0"), "G", "k");
    assert!(t2 > t1);
    w.line("A k 30 0");
    assert!(w.quiet_for(QUIET), "the writer waits for the readers");
    r3.line("G k 30 0");
    assert!(
        r3.quiet_for(QUIET),
        "a reader behind a waiting writer waits"
    );
    // The lock is a read/write lock, not a semaphore.
    assert_eq!(r1.call("C k 2 30 0"), "C k lock");
    assert_eq!(r1.call(&format!("R k {t1}")), "R k 1");
    assert!(w.quiet_for(QUIET), "one reader still holds");
    assert_eq!(r2.call(&format!("N k {t2} 30")), "N k 1");
    assert_eq!(r2.call(&format!("R k {t2}")), "R k 1");
    let tw = token(&w.recv(), "A", "k");
    assert!(tw > t2, "tokens grow in grant order");
    assert!(r3.quiet_for(QUIET), "the reader waits for the writer");
    assert_eq!(w.call(&format!("R k {tw}")), "R k 1");
    let t3 = token(&r3.recv(), "G", "k");
    assert!(t3 > tw);
    // A dead token is dead for every kind.
    assert_eq!(r1.call(&format!("R k {t1}")), "R k 0");
    assert_eq!(r1.call(&format!("N k {t1} 1")), "N k 0");
}

fn a_semaphore_of_two_never_has_more_than_two_holders(io: &str) {
    let server = Server::start(io);
    let mut conns: Vec<Conn> = (0..5).map(|_| server.connect()).collect();
    let mut held: Vec<(usize, u64)> = Vec::new();
    for (i, c) in conns.iter_mut().enumerate().take(2) {
        held.push((i, token(&c.call("C sem 2 30 0"), "C", "sem")));
    }
    for c in &mut conns[2..] {
        c.line("C sem 2 30 0");
    }
    let mut last = held[1].1;
    let mut next = 2;
    while let Some((i, t)) = (!held.is_empty()).then(|| held.remove(0)) {
        for c in &mut conns[next..] {
            assert!(c.quiet_for(Duration::from_millis(100)), "a third holder");
        }
        assert_eq!(conns[i].call(&format!("R sem {t}")), "R sem 1");
        if next < conns.len() {
            let granted = token(&conns[next].recv(), "C", "sem");
            assert!(granted > last, "tokens grow in grant order");
            last = granted;
            held.push((next, granted));
            next += 1;
        }
        assert!(held.len() <= 2);
    }
    // Free again: a new limit is taken; while held, another is refused.
    let mut c = server.connect();
    let t = token(&c.call("C sem 3 30 0"), "C", "sem");
    assert_eq!(c.call("C sem 2 30 0"), "C sem semaphore 3");
    assert_eq!(c.call("G sem 30 0"), "G sem semaphore 3");
    // `A` has no refusal answer: the connection breaks, saying why.
    let e = c.call("A sem 30 0");
    assert_eq!(
        e,
        "E key \"sem\" is a semaphore of 3 permits: acquire it with C in line 4"
    );
    assert_eq!(c.try_recv(), None);
    let mut d = server.connect();
    assert_eq!(d.call(&format!("R sem {t}")), "R sem 1", "the permit stays");
}

fn a_killed_holders_permit_comes_back_after_its_lease(io: &str) {
    let server = Server::start(io);
    // A holder in a process of its own, killed with SIGKILL while it holds.
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; echo 'C sem 1 1.5 0' >&3; \
         read -r line <&3; echo \"$line\"; sleep 60",
        port = server.addr.port()
    );
    let start = Instant::now();
    let mut holder = Command::new("bash")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let t = token(line.trim_end(), "C", "sem");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let mut c = server.connect();
    c.line("C sem 1 30 0");
    let next = token(&c.recv(), "C", "sem");
    let waited = start.elapsed();
    assert!(next > t);
    // The lease ran its length (1.5 s from the grant, which came after
    // `start`), and no more than a generous bound beyond it.
    assert!(
        waited >= Duration::from_millis(1_500),
        "freed after {waited:?}"
    );
    assert!(waited < Duration::from_secs(10), "freed after {waited:?}");
    assert_eq!(c.call(&format!("R sem {t}")), "R sem 0");
}

/// `ringlock SUBCOMMAND --server ADDR ARGS...`, started.
fn ringlock(server: &Server, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg(args[0])
        .args(["--server", &server.addr.to_string()])
        .args(&args[1..])
        .env_remove("RINGLOCK_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn five_runs_with_two_permits_never_run_more_than_two_at_once(io: &str) {
    let server = Server::start(io);
    let dir = common::harness::scratch_dir().join(format!("permits-{io}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("running")).unwrap();
    // Each CMD marks itself running, counts who runs (when it starts and
    // before it ends), and logs the count and its token.
    let script = format!(
        "d={d}; touch $d/running/$$; a=$(ls $d/running | wc -l); sleep 0.3;          b=$(ls $d/running | wc -l); rm $d/running/$$;          echo \"$a $b $RINGLOCK_TOKEN\" >> $d/log",
        d = dir.display()
    );
    let runs: Vec<_> = (0..5)
        .map(|_| {
            ringlock(
                &server,
                &["run", "--permits", "2", "sem", "--", "sh", "-c", &script],
            )
        })
        .collect();
    for run in runs {
        let out = common::wait_output(run, Duration::from_secs(30));
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    let lines: Vec<Vec<u64>> = log
        .lines()
        .map(|l| l.split(' ').map(|f| f.trim().parse().unwrap()).collect())
        .collect();
    assert_eq!(lines.len(), 5, "{log}");
    let most = lines.iter().map(|l| l[0].max(l[1])).max().unwrap();
    assert!(most <= 2, "{most} ran at once:\n{log}");
    let mut tokens: Vec<u64> = lines.iter().map(|l| l[2]).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 5, "every permit has its own token: {log}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn the_command_line_takes_shared_locks_and_says_what_is_refused(io: &str) {
    let server = Server::start(io);
    let out = |child| common::wait_output(child, Duration::from_secs(30));
    let a = out(ringlock(&server, &["acquire", "--shared", "cfg"]));
    let b = out(ringlock(&server, &["acquire", "--shared", "cfg"]));
    assert!(a.status.success() && b.status.success());
    let ta: u64 = String::from_utf8_lossy(&a.stdout).trim().parse().unwrap();
    let tb: u64 = String::from_utf8_lossy(&b.stdout).trim().parse().unwrap();
    assert!(
        tb > ta,
        "two shared holders at once, each with its own token"
    );
    // An exclusive acquire waits for them: held, exit 75.
    let w = out(ringlock(&server, &["acquire", "-n", "cfg"]));
    assert_eq!(w.status.code(), Some(75));
    // A permit of a lock is refused: exit 2, saying why.
    let p = out(ringlock(&server, &["acquire", "--permits", "2", "cfg"]));
    assert_eq!(p.status.code(), Some(2));
    let said = String::from_utf8_lossy(&p.stderr);
    assert!(said.contains("cfg is a lock"), "{said}");
    // Released by token, as any grant.
    for t in [ta, tb] {
        let r = out(ringlock(&server, &["release", "cfg", &t.to_string()]));
        assert!(r.status.success());
    }
    let w = out(ringlock(&server, &["acquire", "-n", "cfg"]));
    assert!(w.status.success(), "free again");
}

fn a_cluster_grants_shared_acquires_and_permits_on_its_active(io: &str) {
    let cluster = Cluster::start(2, io);
    cluster.wait_settled(0, Duration::from_secs(15));
    for (line, op) in [("G k 30000 0", "G"), ("C s 2 30000 0", "C")] {
        let key = &line[2..3];
        let mut active = cluster.connect(0);
        let t = token(&active.call(line), op, key);
        // A standby redirects them like any request with a key.
        let mut standby = cluster.connect(1);
        assert_eq!(standby.call(line), format!("M {key} {}", cluster.addr(0)));
        // The standby learns the grant's token (its heartbeat says the
        // highest it has seen).
        cluster.wait_token(1, t, Duration::from_secs(10));
    }
}
