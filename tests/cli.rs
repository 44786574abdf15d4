//! The `ringlock` command line against the real server binary: acquire,
//! release, renew, status, and `run` (holding a lock across a command longer
//! than the lease, passing the token, exit statuses, timeouts, lost locks).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The server's io backend: epoll, or `RINGLOCK_TEST_IO` (e.g. `uring`).
fn backend() -> String {
    std::env::var("RINGLOCK_TEST_IO").unwrap_or_else(|_| "epoll".into())
}

fn ringlock(server: &common::Server) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    cmd.env("RINGLOCK_SERVERS", server.addr.to_string());
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs to completion (at most 60 s) and returns the output.
fn output(cmd: &mut Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlock");
    wait_output(child, Duration::from_secs(60))
}

fn wait_output(mut child: Child, within: Duration) -> Output {
    let started = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "ringlock did not finish within {within:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringlock-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls until `path` holds a complete line; panics after `within`.
fn read_line_file(path: &PathBuf, within: Duration) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim_end().to_string();
        }
        assert!(
            started.elapsed() < within,
            "{path:?} not written within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn acquire_prints_the_token_and_release_and_renew_say_whether_it_was_held() {
    let server = common::Server::start(&backend());
    let out = output(ringlock(&server).args(["acquire", "cli/a", "--lease", "30"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let token: u64 = stdout(&out).trim().parse().expect("a token on stdout");
    assert!(token > 0);

    // The lock outlives the command that acquired it.
    let mut probe = server.connect();
    assert_eq!(probe.call("A cli/a 1 0.1"), "T cli/a");

    let t = token.to_string();
    let out = output(ringlock(&server).args(["renew", "cli/a", &t, "--lease", "0.5"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = output(ringlock(&server).args(["renew", "cli/a", "1"]));
    assert_eq!(out.status.code(), Some(1), "renew with a wrong token");
    let out = output(ringlock(&server).args(["release", "cli/a", &t]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = output(ringlock(&server).args(["release", "cli/a", &t]));
    assert_eq!(out.status.code(), Some(1), "second release");
    assert!(stderr(&out).contains("carries token"), "{}", stderr(&out));

    // --server wins over the environment.
    let out = output(
        ringlock(&server)
            .env("RINGLOCK_SERVERS", "127.0.0.1:1")
            .args(["acquire", "cli/b", "--server", &server.addr.to_string()]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let second: u64 = stdout(&out).trim().parse().unwrap();
    assert!(second > token);
}

#[test]
fn acquire_exits_75_when_the_wait_runs_out_and_2_on_bad_arguments() {
    let server = common::Server::start(&backend());
    let mut holder = server.connect();
    common::Conn::token_of(&holder.call("A cli/held 30 0"));
    let started = Instant::now();
    let out = output(ringlock(&server).args(["acquire", "cli/held", "--wait", "0.3"]));
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert!(stdout(&out).is_empty());
    assert!(stderr(&out).contains("timed out"), "{}", stderr(&out));

    for args in [
        &["acquire", "k", "--lease", "1.0001"][..],
        &["acquire", "k", "--lease", "0"],
        &["acquire", "k", "--wait", "86401"],
        &["acquire", "a b"],
        &["release", "k", "0"],
        &["run", "k"],
    ] {
        let out = output(ringlock(&server).args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    let out = output(ringlock(&server).args(["acquire", "k", "--server", "127.0.0.1:1"]));
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
}

#[test]
fn run_holds_the_lock_across_a_command_longer_than_the_lease() {
    let server = common::Server::start(&backend());
    let dir = scratch("long");
    let file = dir.join("token");
    let script = format!(
        "echo \"$RINGLOCK_TOKEN $RINGLOCK_KEY\" > {}.tmp && mv {0}.tmp {0}; sleep 2.5; exit 7",
        file.display()
    );
    let started = Instant::now();
    let child = ringlock(&server)
        .args(["run", "cli/run", "--lease", "1", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = read_line_file(&file, Duration::from_secs(20));
    let seen = Instant::now();
    let (token, key) = line.split_once(' ').expect("token and key");
    let token: u64 = token.parse().expect("RINGLOCK_TOKEN is a token");
    assert_eq!(key, "cli/run");

    // Probe all along: nobody else can have the lock, also well after the
    // 1 s lease would have run out without renewals.
    let mut probe = server.connect();
    let mut probes = 0;
    let last_probe = loop {
        let at = Instant::now();
        let answer = probe.call("A cli/run 1 0.1");
        assert_eq!(
            answer,
            "T cli/run",
            "probe {probes}, {:?} after the start",
            at - seen
        );
        probes += 1;
        if at - seen > Duration::from_millis(2000) {
            break at;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(last_probe - seen >= Duration::from_millis(2000));
    assert!(probes >= 8, "{probes} probes");

    let out = wait_output(child, Duration::from_secs(30));
    assert_eq!(
        out.status.code(),
        Some(7),
        "CMD's status; stderr:\n{}",
        stderr(&out)
    );
    assert!(started.elapsed() >= Duration::from_millis(2500));
    // Released: the next grant has a higher token.
    let answer = probe.call("A cli/run 5 3");
    assert!(common::Conn::token_of(&answer) > token, "{answer}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_releases_at_once_and_returns_the_command_status() {
    let server = common::Server::start(&backend());
    let mut probe = server.connect();
    let cases: [(&[&str], i32); 4] = [
        (&["true"], 0),
        (&["sh", "-c", "exit 3"], 3),
        (&["sh", "-c", "kill -TERM $$"], 128 + 15),
        (&["/nonexistent/ringlock-test-command"], 127),
    ];
    for (cmd, code) in cases {
        let mut args = vec!["run", "cli/status", "--lease", "30", "--"];
        args.extend_from_slice(cmd);
        let out = output(ringlock(&server).args(&args));
        assert_eq!(out.status.code(), Some(code), "{cmd:?}: {}", stderr(&out));
        // The 30 s lease was released, not left to run out.
        let started = Instant::now();
        let answer = probe.call("A cli/status 30 2");
        assert!(answer.starts_with("A cli/status "), "{cmd:?}: {answer}");
        assert!(started.elapsed() < Duration::from_secs(1));
        let token = common::Conn::token_of(&answer);
        assert_eq!(
            probe.call(&format!("R cli/status {token}")),
            "R cli/status 1"
        );
    }
}

#[test]
fn run_does_not_start_the_command_when_the_wait_runs_out() {
    let server = common::Server::start(&backend());
    let dir = scratch("busy");
    let marker = dir.join("ran");
    let mut holder = server.connect();
    common::Conn::token_of(&holder.call("A cli/busy 30 0"));
    let out = output(ringlock(&server).args([
        "run",
        "cli/busy",
        "--wait",
        "0.3",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]));
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("timed out"), "{}", stderr(&out));
    assert!(!marker.exists(), "the command ran without the lock");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_stops_the_command_when_the_lock_is_lost() {
    let server = common::Server::start(&backend());
    let dir = scratch("lost");
    let file = dir.join("token");
    let script = format!(
        "echo $RINGLOCK_TOKEN > {}.tmp && mv {0}.tmp {0}; exec sleep 30",
        file.display()
    );
    let child = ringlock(&server)
        .args(["run", "cli/lost", "--lease", "1", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let token = read_line_file(&file, Duration::from_secs(20));
    // Someone else releases it with the token: the next renewal finds it gone.
    let mut other = server.connect();
    let started = Instant::now();
    assert_eq!(other.call(&format!("R cli/lost {token}")), "R cli/lost 1");
    let out = wait_output(child, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));
    assert!(stderr(&out).contains("LOCK LOST"), "{}", stderr(&out));
    // Renewals every third of the 1 s lease: noticed well before 5 s.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn status_shows_each_node_and_unreachable_ones() {
    let server = common::Server::start(&backend());
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let addr = server.addr.to_string();
    let list = format!("{addr},{dead}");
    let out = output(ringlock(&server).args(["status", "--server", &list]));
    // One node active, every node that answered names it: healthy, with
    // the unreachable one named.
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(
        lines[3],
        format!("healthy: {addr} is active; the one node that answered; unreachable: {dead}"),
        "{text}"
    );
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["ADDRESS", "ROLE", "ACTIVE", "TOKEN"]);
    let live: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        live[..3],
        [addr.as_str(), "active", addr.as_str()],
        "{text}"
    );
    live[3].parse::<u64>().expect("a token");
    let down: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(down[..2], [dead.as_str(), "unreachable"], "{text}");

    let out = output(ringlock(&server).args(["status", "--server", &dead]));
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stdout(&out).ends_with(&format!(
            "unhealthy: no node answered; unreachable: {dead}\n"
        )),
        "{}",
        stdout(&out)
    );
}

#[test]
fn status_shows_a_node_whose_peer_list_differs() {
    // Two nodes, each given the other's list in another order: both hold
    // the secret, so each sees the other's configuration and refuses it.
    let addrs = common::free_addrs(common::loopback_ip(), 2);
    let (a, b) = (addrs[0].to_string(), addrs[1].to_string());
    let ab = format!("{a},{b}");
    let ba = format!("{b},{a}");
    let secret = common::secret_file();
    let io = backend();
    let start = |listen: &str, peers: &str| {
        common::Server::start_with(&[
            "--listen",
            listen,
            "--peers",
            peers,
            "--io",
            &io,
            "--cluster-secret-file",
            secret,
        ])
    };
    let node_a = start(&a, &ab);
    let _node_b = start(&b, &ba);
    let both = format!("{a},{b}");
    let (_, (code, text)) = common::poll_until(
        "a problem line for each node, and an unhealthy verdict",
        Duration::from_secs(10),
        || {
            let out = output(ringlock(&node_a).args(["status", "--server", &both]));
            (out.status.code(), stdout(&out))
        },
        |(code, text)| text.matches("problem: ").count() == 2 && *code == Some(1),
    );
    assert_eq!(code, Some(1));
    assert!(text.contains("same order"), "{text}");
    let verdict = text.lines().last().unwrap();
    assert!(verdict.starts_with("unhealthy: "), "{text}");
    // And at most one of them serves.
    let actives = text.lines().filter(|l| l.contains(" active ")).count();
    assert!(actives <= 1, "{text}");
}

// ---------------------------------------------------------------- hung nodes

/// Runs `args` against `server` (an address list) and checks that it ends
/// within `within` with exit status `code` and a stderr line naming `addr`.
fn fails_fast(server: &str, args: &[&str], code: i32, within: Duration, addr: &str) -> String {
    let started = Instant::now();
    // `--server` right after the subcommand (`run` takes CMD last).
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .arg(args[0])
            .args(["--server", server])
            .args(&args[1..])
            .stdin(Stdio::null()),
    );
    let took = started.elapsed();
    let err = stderr(&out);
    eprintln!(
        "{args:?}: exit {:?} after {took:?}: {err}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(took < within, "{args:?} took {took:?}");
    assert!(err.contains(addr), "{args:?}: {err}");
    err
}

/// What every command does against `addr`, a node that accepts connections
/// and never answers: it ends soon, with 69 and a line naming the node.
fn every_command_gives_up_on(addr: &str, marker: &std::path::Path) {
    let three = Duration::from_secs(3);
    let err = fails_fast(addr, &["acquire", "hung/k", "--wait", "1"], 69, three, addr);
    assert!(err.contains("did not answer"), "{err}");
    fails_fast(
        addr,
        &[
            "run",
            "hung/k",
            "--wait",
            "2",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
        69,
        three,
        addr,
    );
    assert!(!marker.exists(), "the command ran without the lock");
    fails_fast(addr, &["acquire", "hung/k"], 69, three, addr);
    fails_fast(addr, &["release", "hung/k", "123"], 69, three, addr);
    fails_fast(addr, &["renew", "hung/k", "123"], 69, three, addr);
    // status gives each node 3 s.
    let started = Instant::now();
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args(["status", "--server", addr])
            .stdin(Stdio::null()),
    );
    assert_eq!(out.status.code(), Some(69), "{}", stdout(&out));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        stdout(&out).contains("unhealthy: no node answered"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn commands_give_up_on_a_stopped_node_with_exit_69() {
    let server = common::Server::start(&backend());
    let dir = scratch("stopped");
    server.signal(libc::SIGSTOP);
    every_command_gives_up_on(&server.addr.to_string(), &dir.join("ran"));
    server.signal(libc::SIGCONT);
    let out = output(ringlock(&server).args(["acquire", "hung/after", "--wait", "5"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn commands_give_up_on_a_listener_that_never_answers() {
    // Bound and listening, never accepted: the kernel accepts for it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = scratch("silent");
    every_command_gives_up_on(&silent.local_addr().unwrap().to_string(), &dir.join("ran"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_warns_and_returns_when_its_release_cannot_reach_the_node() {
    let server = common::Server::start(&backend());
    let dir = scratch("release-hang");
    let marker = dir.join("started");
    let script = format!("touch {}; sleep 1; exit 3", marker.display());
    let child = ringlock(&server)
        .args(["run", "rel/k", "--lease", "30", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::poll_until(
        "the command started",
        Duration::from_secs(20),
        || marker.exists(),
        |&b| b,
    );
    server.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let out = wait_output(child, Duration::from_secs(30));
    let took = stopped.elapsed();
    eprintln!(
        "run with the node stopped under it: exit {:?} after {took:?}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(3), "CMD's status: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("warning: could not release rel/k"), "{err}");
    // CMD's 1 s, then the contract's 5 s of release retries.
    assert!(took >= Duration::from_millis(5500), "{took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    server.signal(libc::SIGCONT);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn acquire_and_run_go_on_through_a_stopped_active() {
    let c = common::Cluster::start(3, &backend());
    let list = c.addr_strings().join(",");
    let dir = scratch("stopped-active");
    c.node(0).signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let bound = Duration::from_millis(common::Cluster::PEER_TIMEOUT_MS)
        + ringlock_client::DEFAULT_PROBE_TIMEOUT
        + Duration::from_secs(1);
    let mut last = 0u64;
    for i in 0..3 {
        let started = Instant::now();
        let key = format!("fresh{i}");
        let out = output(
            Command::new(env!("CARGO_BIN_EXE_ringlock"))
                .args(["acquire", &key, "--wait", "5", "--server", &list])
                .stdin(Stdio::null()),
        );
        let took = started.elapsed();
        eprintln!(
            "{}: acquire {key} {:?} after the stop: exit {:?} in {took:?}",
            c.io,
            started - stopped,
            out.status.code()
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let token: u64 = stdout(&out).trim().parse().unwrap();
        assert!(token > last);
        last = token;
        // The first one pays for the failover; none more than the bound.
        assert!(
            started.elapsed() < bound + Duration::from_millis(500),
            "{took:?}"
        );
    }
    // A run with renewals (lease 2 s, renewed every 2/3 s) across 3 s.
    let started = Instant::now();
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args([
                "run", "loop", "--wait", "5", "--lease", "2", "--server", &list,
            ])
            .args(["--", "sh", "-c", "sleep 3; exit 4"])
            .stdin(Stdio::null()),
    );
    let took = started.elapsed();
    eprintln!(
        "{}: run --lease 2 -- sleep 3: exit {:?} in {took:?}",
        c.io,
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(took < Duration::from_secs(5), "{took:?}");
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------- --no-wait

#[test]
fn no_wait_exits_75_at_once_when_the_lock_is_held() {
    let server = common::Server::start(&backend());
    let dir = scratch("nowait");
    let marker = dir.join("ran");
    let mut holder = server.connect();
    common::Conn::token_of(&holder.call("A nw/held 30 0"));
    for flag in ["--no-wait", "-n"] {
        let started = Instant::now();
        let out = output(ringlock(&server).args(["acquire", "nw/held", flag]));
        assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(
            stderr(&out).contains("nw/held is held by someone else"),
            "{}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty());
    }
    let out = output(ringlock(&server).args([
        "run",
        "nw/held",
        "--no-wait",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]));
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(!marker.exists(), "the command ran without the lock");
    // A free lock is simply taken.
    let out = output(ringlock(&server).args(["acquire", "nw/free", "-n"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).trim().parse::<u64>().expect("a token");
    let out = output(ringlock(&server).args(["run", "nw/free2", "-n", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // --no-wait and --wait do not go together.
    let out = output(ringlock(&server).args(["acquire", "nw/x", "-n", "--wait", "3"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------- waiting notice

/// `script(1)`, to run a command on a terminal, if the machine has it.
fn script_bin() -> Option<&'static str> {
    ["/usr/bin/script", "/bin/script"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

/// What a waiting `acquire` says after a second, once: whom it waits for
/// (the holder's address and owner label), how long that one has held the
/// lock, and its own place in the queue.
fn waiting_line(text: &str, key: &str, holder: &str, owner: &str, queue: &str, limit: &str) {
    let start =
        format!("ringlock: waiting for the lock on {key}: held by {holder} (owner {owner}) for ");
    let line = text
        .lines()
        .find(|l| l.contains("waiting for the lock"))
        .unwrap_or_else(|| panic!("no waiting notice in {text:?}"));
    assert!(
        line.trim_end().starts_with(&start),
        "{line:?} does not start with {start:?}"
    );
    assert!(
        line.trim_end()
            .ends_with(&format!(" s; {queue} ({limit})...")),
        "{line:?}"
    );
    assert_eq!(
        text.matches("waiting for the lock").count(),
        1,
        "once: {text}"
    );
}

#[test]
fn a_waiting_acquire_says_whom_it_waits_for_whether_or_not_stderr_is_a_terminal() {
    let server = common::Server::start(&backend());
    let mut holder = server.connect();
    assert_eq!(holder.call("O test/holder"), "O test/holder");
    let holder_addr = holder.stream().local_addr().unwrap().to_string();
    common::Conn::token_of(&holder.call("A tty/held 30 0"));
    let addr = server.addr.to_string();
    // One more waiter ahead of the command.
    let mut ahead = server.connect();
    ahead.line("A tty/held 30 10");
    assert!(ahead.call("S").starts_with("S active"));

    // Not a terminal (a pipe): said all the same.
    let out = output(ringlock(&server).args([
        "acquire",
        "tty/held",
        "--wait",
        "2",
        "--owner",
        "test/pipe",
    ]));
    assert_eq!(out.status.code(), Some(75));
    waiting_line(
        &stderr(&out),
        "tty/held",
        &holder_addr,
        "test/holder",
        "1 ahead in the queue",
        "for up to 2 s in all",
    );

    let Some(script) = script_bin() else {
        eprintln!("no script(1) here: the terminal case is not tested");
        return;
    };
    let line = format!(
        "'{}' acquire tty/held --wait 1.5 --owner test/tty --server {addr}",
        env!("CARGO_BIN_EXE_ringlock")
    );
    let out = output(
        Command::new(script)
            .args(["-q", "-e", "-c", &line, "/dev/null"])
            .stdin(Stdio::null()),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(75), "{text}");
    waiting_line(
        &text,
        "tty/held",
        &holder_addr,
        "test/holder",
        "1 ahead in the queue",
        "for up to 1.5 s in all",
    );
}

/// A `ringlock run` (or `acquire`) inside `ringlock run` on the same key
/// would wait for its own parent: it is refused at once with exit 2, and
/// the parent's command goes on. Another key is fine.
#[test]
fn a_nested_run_on_the_same_key_is_refused_at_once() {
    let server = common::Server::start(&backend());
    let bin = env!("CARGO_BIN_EXE_ringlock");
    let script = format!(
        "'{bin}' run nest/k --wait 5 -- true; echo \"inner run $?\"; \
         '{bin}' acquire nest/k --wait 5; echo \"inner acquire $?\"; \
         '{bin}' run nest/other -- sh -c 'echo \"other $RINGLOCK_KEY\"'; echo \"other run $?\""
    );
    let started = Instant::now();
    let out = output(ringlock(&server).args(["run", "nest/k", "--", "sh", "-c", &script]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("inner run 2\n"), "{text}");
    assert!(text.contains("inner acquire 2\n"), "{text}");
    assert!(text.contains("other nest/other\nother run 0\n"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused at once: {:?}",
        started.elapsed()
    );
    let err = stderr(&out);
    assert_eq!(
        err.matches("nest/k is already held by the `ringlock run` this runs under")
            .count(),
        2,
        "{err}"
    );
    assert!(err.contains("locks are not reentrant"), "{err}");
}

#[test]
fn run_keeps_its_lock_when_the_active_is_stopped_under_it() {
    let c = common::Cluster::start(3, &backend());
    let list = c.addr_strings().join(",");
    let dir = scratch("stopped-under-run");
    let file = dir.join("token");
    let script = format!(
        "echo $RINGLOCK_TOKEN > {}.tmp && mv {0}.tmp {0}; sleep 7; exit 5",
        file.display()
    );
    let child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["run", "under", "--lease", "2", "--server", &list])
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let token: u64 = read_line_file(&file, Duration::from_secs(20))
        .parse()
        .unwrap();
    c.wait_token(1, token, Duration::from_secs(5));
    // The active hangs a second into the command: renewals (every 2/3 s)
    // go on at node 1 once the cluster has failed over.
    std::thread::sleep(Duration::from_secs(1));
    c.node(0).signal(libc::SIGSTOP);
    common::poll_until(
        "node 1 active",
        Duration::from_secs(5),
        || c.status(1),
        |s| s.as_ref().is_some_and(|s| s.is_active()),
    );
    // Well past the 2 s lease counted from before the stop: still held.
    std::thread::sleep(Duration::from_millis(2500));
    let mut n1 = c.connect(1);
    let probe = n1.call("A under 1 0.1");
    let out = wait_output(child, Duration::from_secs(30));
    let err = stderr(&out);
    assert_eq!(probe, "T under", "the lock is still held; stderr: {err}");
    eprintln!(
        "{}: run under a stopped active: exit {:?}; stderr: {err}",
        c.io,
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(5), "CMD's status: {err}");
    assert!(!err.contains("LOCK LOST"), "{err}");
    // Released at the end, on node 1.
    let answer = n1.call("A under 1 2");
    assert!(common::Conn::token_of(&answer) > token, "{answer}");
    let _ = std::fs::remove_dir_all(dir);
}
