//! Keeps `ringlock-bench` from rotting: a few short runs against the echo
//! floor and a real ringlock server, then report and compare on their
//! output. Each run is a fraction of a second; Redis is not needed.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const GEN: &str = env!("CARGO_BIN_EXE_ringlock-bench");

fn server() -> PathBuf {
    common::server(GEN)
}

/// A server child that prints "listening on ADDR" on stderr; killed on drop.
struct Running {
    child: Child,
    addr: String,
}

impl Running {
    fn start(program: &str, args: &[&str]) -> Running {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn server");
        let mut lines = BufReader::new(child.stderr.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(lines.read_line(&mut line).unwrap() > 0, "server exited");
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines.lines() {});
        Running { child, addr }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(args: &[&str]) -> serde_json::Value {
    let out = Command::new(GEN)
        .args(args)
        .args(["--json", "--quiet", "--warmup", "0.1", "--duration", "0.4"])
        .output()
        .expect("run ringlock-bench");
    assert!(
        out.status.success(),
        "ringlock-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON result")
}

/// `ringlock-bench report` over the runs in `runs`, written beside
/// `prefix` (no plots); returns its markdown.
fn report(runs: &Path, prefix: &Path) -> String {
    let out = Command::new(GEN)
        .args(["report", "--no-plots", "--runs"])
        .arg(runs)
        .arg("--out")
        .arg(prefix)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(prefix.with_extension("md")).unwrap()
}

fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {v}"))
}

/// Eight clients taking turns on one key: FIFO gives each the same number
/// of grants, give or take the one in flight when the run stops.
fn contended(addr: &str) -> serde_json::Value {
    let r = run(&[
        "--addr",
        addr,
        "--conns",
        "8",
        "--mode",
        "contended",
        "--keys",
        "1",
        "--scenario",
        "contended",
        "--label",
        "ringlock-x",
    ]);
    assert!(f(&r, &["latency_us", "handoff", "count"]) > 0.0);
    let (min, max) = (
        f(&r, &["fairness", "min_grants"]),
        f(&r, &["fairness", "max_grants"]),
    );
    assert!(max - min <= 1.0, "FIFO: grants per client {min}..{max}");
    assert_eq!(r["drained"], true);
    r
}

/// The epoll loop serves requests that arrive in one turn in the order
/// they arrived, not by connection slot (which favoured low slots).
#[test]
fn contended_clients_share_the_lock_evenly_under_epoll() {
    let server = Running::start(
        server().to_str().unwrap(),
        &["serve", "--listen", "127.0.0.1:0", "--io", "epoll"],
    );
    contended(&server.addr);
}

#[test]
#[expect(clippy::too_many_lines)]
fn load_generator_report_and_compare() {
    let echo = Running::start(GEN, &["echo-server", "--listen", "127.0.0.1:0"]);
    let server = Running::start(
        server().to_str().unwrap(),
        &["serve", "--listen", "127.0.0.1:0"],
    );
    let mut runs = Vec::new();

    // Echo floor, pipelined.
    let r = run(&[
        "--target",
        "echo",
        "--addr",
        &echo.addr,
        "--conns",
        "2",
        "--pipeline",
        "4",
        "--scenario",
        "conns-1",
        "--label",
        "echo",
    ]);
    assert!(f(&r, &["cycles"]) > 0.0);
    assert!(f(&r, &["latency_us", "round_trip", "count"]) > 0.0);
    runs.push(r);

    // ringlock, uncontended, with the server's CPU.
    let r = run(&[
        "--addr",
        &server.addr,
        "--conns",
        "2",
        "--pipeline",
        "3",
        "--keys",
        "7",
        "--server-pid",
        &server.pid(),
        "--scenario",
        "conns-1",
        "--label",
        "ringlock-x",
    ]);
    assert!(f(&r, &["cycles"]) > 0.0);
    assert_eq!(f(&r, &["errors"]), 0.0);
    assert_eq!(r["drained"], true);
    assert!(f(&r, &["server_cpu", "cpu_s"]) >= 0.0);
    runs.push(r);

    // The generator spinning (--spin-us): same work, recorded as such.
    let r = run(&[
        "--addr",
        &server.addr,
        "--spin-us",
        "100",
        "--scenario",
        "spinning-client",
        "--label",
        "ringlock-x",
    ]);
    assert!(f(&r, &["cycles"]) > 0.0);
    assert_eq!(f(&r, &["errors"]), 0.0);
    assert_eq!(f(&r, &["spin_us"]), 100.0);
    assert_eq!(r["drained"], true);
    runs.push(r);

    // ringlock, contended: hand-offs measured, FIFO shares the lock evenly.
    let r = contended(&server.addr);
    runs.push(r);

    // Memory mode: holds the locks and reads the server's RSS.
    let r = run(&[
        "--addr",
        &server.addr,
        "--mode",
        "memory",
        "--locks",
        "5000",
        "--conns",
        "2",
        "--pipeline",
        "64",
        "--lease",
        "60",
        "--server-pid",
        &server.pid(),
        "--scenario",
        "memory",
        "--label",
        "ringlock-x",
    ]);
    assert_eq!(f(&r, &["memory", "granted"]), 5000.0);
    assert!(f(&r, &["memory", "rss_after_kib"]) > 0.0);
    runs.push(r);

    // Report (no plots: no font needed) and compare of a result with itself.
    let dir = std::env::temp_dir().join(format!("ringlock-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let runs_path = dir.join("runs.jsonl");
    let lines: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
    std::fs::write(&runs_path, lines.join("\n") + "\n").unwrap();
    let md = report(&runs_path, &dir.join("result"));
    assert!(md.contains("## contended"), "{md}");
    assert!(md.contains("ringlock-x"), "{md}");
    assert!(md.contains("generator spinning 100 µs"), "{md}");
    assert!(md.contains("## memory: hold 5.0k locks"), "{md}");
    let json = dir.join("result.json");
    // A fill of 5000 locks says so, and does not meet the 1M-lock target.
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let memory = result["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == "1M locks memory" && t["label"] == "ringlock-x")
        .expect("the memory target's row");
    assert_eq!(memory["verdict"], "not measured", "{memory}");
    let measured = memory["measured"].as_str().unwrap();
    assert!(
        measured.ends_with("after a fill of 5000 locks (fewer than 1M: not judged)"),
        "{measured}"
    );
    let out = Command::new(GEN)
        .arg("compare")
        .arg(&json)
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 regression(s)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn instruction_cases_run() {
    for case in ["cycle", "engine-cycle", "handoff", "parse", "expire"] {
        let out = Command::new(GEN)
            .args(["instr", case, "--iters", "300"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "instr {case}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ops: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(ops >= 300, "instr {case}: {ops} operations");
    }
}

/// `--mode grow` at a small size: the fill completes, the probe runs, and
/// the server's longest loop turn is read from its stop line. (No timing is
/// checked: this only keeps the scenario from rotting.)
#[test]
fn grow_mode_and_its_report() {
    let dir = std::env::temp_dir().join(format!("ringlock-bench-grow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("server.log");
    let mut server = Command::new(server())
        .args(["serve", "--listen", "127.0.0.1:0", "--max-locks", "20001"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn ringlock serve");
    let addr = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
        assert!(
            server.try_wait().unwrap().is_none(),
            "server exited: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let pid = server.id().to_string();
    let out = Command::new(GEN)
        .args([
            "--mode", "grow", "--addr", &addr, "--locks", "20000", "--conns", "2",
        ])
        .args(["--pipeline", "64", "--lease", "60", "--duration", "60"])
        .args(["--server-pid", &pid, "--stop-server-log"])
        .arg(&log)
        .args([
            "--scenario",
            "growth",
            "--label",
            "ringlock-x",
            "--json",
            "--quiet",
        ])
        .output()
        .expect("run ringlock-bench");
    let status = server.wait().expect("the generator stopped the server");
    assert!(
        out.status.success(),
        "ringlock-bench --mode grow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(status.success(), "server exit {status}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON result");
    assert_eq!(f(&r, &["growth", "granted"]), 20000.0);
    assert!(f(&r, &["growth", "longest_turn_ms"]) >= 0.0);
    assert!(f(&r, &["cycles"]) > 0.0, "the probe ran");
    assert!(f(&r, &["latency_us", "cycle", "max"]) > 0.0);
    assert_eq!(f(&r, &["errors"]), 0.0);

    let runs = dir.join("runs.jsonl");
    std::fs::write(&runs, format!("{r}\n")).unwrap();
    let md = report(&runs, &dir.join("result"));
    assert!(md.contains("## growth"), "{md}");
    assert!(md.contains("longest loop turn"), "{md}");
    assert!(
        !md.contains("## Performance targets"),
        "nothing to check here: {md}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
