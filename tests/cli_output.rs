//! The command line and its own standard output: a reader that closes the
//! pipe early ends a command quietly with 141 (as `ls | head` does), a
//! full disk is one line on stderr and exit 74 (docs/client.md, "Exit
//! status"); never a panic. Each command that prints: `acquire` (the
//! token), `status` and `locks` (listings of several lines). Standard
//! error too: a message that cannot be written is lost, never a panic (the
//! command line's statuses, and the server's log).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BROKEN_PIPE: i32 = 141;
const OUTPUT_ERROR: i32 = 74;

fn ringlock(server: &common::Server, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    cmd.args(args)
        .env("RINGLOCK_SERVERS", server.addr.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Waits at most 30 s for the command and returns its output.
fn finish(mut child: std::process::Child) -> Output {
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("ringlock did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

/// The commands that print, each with what makes it print something.
fn printing_commands() -> [Vec<&'static str>; 3] {
    [
        vec!["acquire", "out/printed", "--lease", "30", "--no-wait"],
        vec!["status"],
        vec!["locks"],
    ]
}

/// A server holding `n` locks `out/NNNNN` (one connection, pipelined).
fn server_with_locks(n: usize) -> (common::Server, common::Conn) {
    let server = common::Server::start("epoll");
    let mut conn = server.connect();
    let requests: String = (0..n).map(|i| format!("A out/{i:05} 60 0\n")).collect();
    conn.send(requests.as_bytes());
    for _ in 0..n {
        let answer = conn.recv();
        assert!(answer.starts_with("A out/"), "{answer}");
    }
    (server, conn)
}

/// Whether `out/printed` is free: a try-acquire on a fresh connection.
fn free(server: &common::Server) -> bool {
    let mut conn = server.connect();
    let answer = conn.call("A out/printed 1 0.001");
    answer.starts_with("A out/printed ")
}

/// Standard output is a pipe whose read end is already closed when the
/// command starts: every write fails with EPIPE. Each command ends with
/// 141 and says nothing; `acquire` gives back the lock it could not print.
#[test]
fn a_closed_pipe_ends_each_command_quietly() {
    let (server, _holder) = server_with_locks(3);
    for args in printing_commands() {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let child = ringlock(&server, &args)
            .stdout(writer)
            .spawn()
            .expect("spawn");
        let out = finish(child);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(BROKEN_PIPE), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?} said something");
    }
    assert!(
        free(&server),
        "acquire kept a lock whose token it never printed"
    );
}

/// `ringlock locks | head -1` with a listing far longer than a pipe holds
/// (64 KiB by default): the reader takes the first line and closes, the
/// command's write then fails, and it ends quietly with 141.
#[test]
fn locks_into_a_reader_that_stops_after_one_line() {
    let (server, _holder) = server_with_locks(5000);
    let (reader, writer) = std::io::pipe().expect("pipe");
    let child = ringlock(&server, &["locks"])
        .stdout(writer)
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    BufReader::new(reader)
        .read_line(&mut first)
        .expect("read the first line");
    assert!(first.starts_with("KEY "), "{first}");
    // The BufReader (and with it the read end) is gone here.
    let out = finish(child);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(BROKEN_PIPE), "{stderr}");
    assert_eq!(stderr, "");
}

/// Standard output is /dev/full: one line on stderr that says why, exit
/// 74; `acquire` gives back the lock it could not print.
#[test]
fn a_full_disk_is_one_line_and_exit_74() {
    assert!(
        std::path::Path::new("/dev/full").exists(),
        "Linux has /dev/full"
    );
    let (server, _holder) = server_with_locks(3);
    for args in printing_commands() {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        let child = ringlock(&server, &args)
            .stdout(full)
            .spawn()
            .expect("spawn");
        let out = finish(child);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(OUTPUT_ERROR), "{args:?}: {stderr}");
        assert_eq!(
            stderr.lines().collect::<Vec<_>>(),
            ["ringlock: cannot write to standard output: No space left on device (os error 28)"],
            "{args:?}"
        );
    }
    assert!(
        free(&server),
        "acquire kept a lock whose token it never printed"
    );
}

/// The help and version texts obey the same rules as every other output:
/// into a closed pipe, 141 and nothing said; into /dev/full, one line and
/// 74 (not exit 0 with the text lost). No server is needed.
#[test]
fn help_and_version_into_a_closed_pipe_or_a_full_disk() {
    for args in [
        &["--help"][..],
        &["help"],
        &["acquire", "--help"],
        &["status", "-h"],
        &["serve", "--help"],
        &["--version"],
    ] {
        let run = |stdout: Stdio| {
            let child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
                .args(args)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            finish(child)
        };
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = run(writer.into());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(BROKEN_PIPE), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?} said something");

        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        let out = run(full.into());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(OUTPUT_ERROR), "{args:?}: {stderr}");
        assert_eq!(
            stderr.lines().collect::<Vec<_>>(),
            ["ringlock: cannot write to standard output: No space left on device (os error 28)"],
            "{args:?}"
        );

        // Into a pipe that is read, the text is whole and the status 0.
        let out = run(Stdio::piped());
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("ringlock") || text.contains("Usage:"),
            "{args:?}: {text}"
        );
    }
}

/// Standard error that cannot be written (a full disk here; a closed pipe
/// is the same) changes nothing but the messages: no panic (exit 101), the
/// documented statuses, and `run` still stops CMD when the lock is lost.
#[test]
fn an_unwritable_stderr_keeps_the_exit_statuses_and_run_stops_cmd() {
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full")
    };
    let server = common::Server::start("epoll");
    let mut holder = server.connect();
    let token = common::Conn::token_of(&holder.call("A held 60000 0"));
    assert!(token > 0);
    let out = finish(
        ringlock(&server, &["acquire", "held", "--no-wait"])
            .stdout(Stdio::null())
            .stderr(full())
            .spawn()
            .expect("spawn"),
    );
    assert_eq!(out.status.code(), Some(75), "acquire of a held lock");
    let out = finish(
        ringlock(&server, &["release", "held", "1"])
            .stderr(full())
            .spawn()
            .expect("spawn"),
    );
    assert_eq!(out.status.code(), Some(1), "release with a wrong token");
    let secret =
        std::env::temp_dir().join(format!("ringlock-stderr-{}.secret", std::process::id()));
    let _ = std::fs::remove_file(&secret);
    let status = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("keygen")
        .arg(&secret)
        .stderr(full())
        .status()
        .expect("run keygen");
    let written = secret.exists();
    let _ = std::fs::remove_file(&secret);
    assert_eq!(status.code(), Some(0), "keygen");
    assert!(written, "keygen wrote no file");

    // run: CMD writes its token and pid, then sleeps; the test releases the
    // lock behind its back; the next renewal finds it lost.
    let dir = std::env::temp_dir().join(format!("ringlock-stderr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "echo $RINGLOCK_TOKEN $$ > {0}/t.tmp && mv {0}/t.tmp {0}/t && exec sleep 30",
        dir.display()
    );
    let child = ringlock(
        &server,
        &["run", "job", "--lease", "1", "--", "sh", "-c", &script],
    )
    .stdout(Stdio::null())
    .stderr(full())
    .spawn()
    .expect("spawn");
    let started = Instant::now();
    let info = loop {
        if let Ok(text) = std::fs::read_to_string(dir.join("t")) {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "CMD did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut fields = info.split_whitespace();
    let token: u64 = fields.next().unwrap().parse().unwrap();
    let pid: i32 = fields.next().unwrap().parse().unwrap();
    assert_eq!(holder.call(&format!("R job {token}")), "R job 1");
    let out = finish(child);
    let cmd_alive = kill_ok(pid, 0);
    if cmd_alive {
        let _ = kill_ok(pid, 9);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(76), "run whose lock was lost");
    assert!(
        !cmd_alive,
        "CMD (pid {pid}) still runs after the lock was lost"
    );
}

/// Whether signal `sig` could be sent to `pid` (0: whether it exists), by
/// kill(1).
fn kill_ok(pid: i32, sig: i32) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The server's log on a standard error that cannot be written (a full
/// disk): the lines are lost, the node is not. It starts, serves, logs a
/// SIGHUP and its stop, and exits 0 on SIGTERM (not 101 at its first line).
#[test]
fn a_server_whose_log_cannot_be_written_serves_on() {
    let addr = common::free_addrs(common::loopback_ip(), 1)[0];
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["serve", "--listen", &addr.to_string()])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(full)
        .spawn()
        .expect("spawn ringlock serve");
    let started = Instant::now();
    let mut conn = loop {
        if let Ok(status) = child.try_wait() {
            assert!(status.is_none(), "the server exited: {status:?}");
        }
        if std::net::TcpStream::connect(addr).is_ok() {
            break common::Conn::new(addr);
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server did not listen within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(conn.call("S").starts_with("S active "));
    let pid = child.id().to_string();
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    std::thread::sleep(Duration::from_millis(200));
    assert!(conn.call("A k 5000 0").starts_with("A k "));
    let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(term.success());
    let out = finish(child);
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
}
