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
    /// Its `--metrics-listen` address, from its "metrics on" line.
    metrics: Option<String>,
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
        let mut metrics = None;
        let addr = loop {
            let mut line = String::new();
            assert!(lines.read_line(&mut line).unwrap() > 0, "server exited");
            if let Some(rest) = line.split("metrics on http://").nth(1) {
                metrics = rest.split('/').next().map(str::to_string);
            }
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines.lines() {});
        Running {
            child,
            addr,
            metrics,
        }
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

/// `--rate`: the cycles start at the pace asked for, not as fast as the
/// server answers (which here is tens of times faster), and no faster
/// either.
#[test]
fn a_paced_run_offers_its_rate() {
    let server = Running::start(
        server().to_str().unwrap(),
        &["serve", "--listen", "127.0.0.1:0", "--io", "epoll"],
    );
    let r = run(&[
        "--addr",
        &server.addr,
        "--conns",
        "4",
        "--pipeline",
        "2",
        "--rate",
        "2000",
    ]);
    // 0.4 s measured at 2000 per second.
    let cycles = f(&r, &["cycles"]);
    assert!((720.0..=820.0).contains(&cycles), "{cycles} cycles: {r}");
    assert_eq!(f(&r, &["errors"]), 0.0);
    assert_eq!(r["drained"], true);
    let refused = Command::new(GEN)
        .args(["--addr", &server.addr, "--mode", "memory", "--rate", "10"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--rate: uncontended or contended"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
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

/// Free loopback ports (bound, then let go: the nodes bind them next).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// `GET /metrics` of a node, within a few seconds.
fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// Three nodes: the first (highest priority) active, the other two its
/// standbys holding its snapshot; waits for that, 20 s at most.
fn cluster(dir: &Path) -> Vec<Running> {
    let secret = dir.join("cluster.secret");
    let status = Command::new(server())
        .arg("keygen")
        .arg(&secret)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let peers: Vec<String> = free_ports(3)
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let list = peers.join(",");
    let nodes: Vec<Running> = peers
        .iter()
        .map(|listen| {
            Running::start(
                server().to_str().unwrap(),
                &[
                    "serve",
                    "--listen",
                    listen,
                    "--peers",
                    &list,
                    "--cluster-secret-file",
                    secret.to_str().unwrap(),
                    "--metrics-listen",
                    "127.0.0.1:0",
                ],
            )
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let m: Vec<String> = nodes
            .iter()
            .map(|n| metrics(n.metrics.as_deref().expect("a metrics line")))
            .collect();
        let has = |i: usize, line: &str| m[i].lines().any(|l| l == line);
        if has(0, "ringlock_active 1")
            && has(0, "ringlock_peers_up 2")
            && (1..3).all(|i| has(i, "ringlock_active 0") && has(i, "ringlock_ready 1"))
        {
            return nodes;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no active with two synced standbys: {m:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A cluster row's run: each standby's CPU, and the replication of each
/// follower with changes, writes and lag probes.
fn check_cluster_run(r: &serde_json::Value, nodes: &[Running]) {
    assert!(f(r, &["cycles"]) > 0.0);
    assert_eq!(f(r, &["errors"]), 0.0);
    let followers = r["follower_cpu"].as_array().unwrap();
    assert_eq!(followers.len(), 2, "{r}");
    for cpu in followers {
        assert!(f(cpu, &["cpu_s"]) >= 0.0, "{cpu}");
    }
    let repl = r["replication"].as_array().unwrap();
    assert_eq!(repl.len(), 2, "one entry per follower: {r}");
    let mut addrs: Vec<&str> = repl
        .iter()
        .map(|x| x["follower"].as_str().unwrap())
        .collect();
    addrs.sort_unstable();
    let mut standbys = vec![nodes[1].addr.as_str(), nodes[2].addr.as_str()];
    standbys.sort_unstable();
    assert_eq!(addrs, standbys);
    for x in repl {
        let cycles = f(r, &["cycles"]);
        // Two changes (grant, release) per cycle in the window, give
        // or take the warm-up's and the drain's.
        assert!(f(x, &["events"]) >= cycles, "{x} vs {cycles} cycles");
        assert!(f(x, &["writes"]) > 0.0 && f(x, &["bytes"]) > f(x, &["events"]));
        assert!(f(x, &["probes"]) > 0.0, "{x}");
        let (p50, p99, max) = (
            f(x, &["lag_p50_us"]),
            f(x, &["lag_p99_us"]),
            f(x, &["lag_max_us"]),
        );
        assert!(p50 >= 1.0 && p50 <= p99 && p99 <= max, "{x}");
        assert!(f(x, &["lag_mean_us"]) <= max, "{x}");
    }
}

/// The report of a single node's and a cluster's runs: its replication
/// table with the ratios, and the cluster goals.
fn check_cluster_report(runs_path: &Path, dir: &Path) {
    let md = report(runs_path, &dir.join("result"));
    assert!(
        md.contains("## Replication: an active and two standbys beside the single node"),
        "{md}"
    );
    for scenario in ["conns-50", "pipelined"] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| {scenario} | ringlock-x-cluster | ")))
            .unwrap_or_else(|| panic!("no {scenario} cluster row: {md}"));
        let cells: Vec<&str> = row.split(" | ").collect();
        // active CPU, single, ratio: the ratio is theirs.
        let (a, s, ratio): (f64, f64, f64) = (
            cells[2].parse().unwrap(),
            cells[3].parse().unwrap(),
            cells[4].parse().unwrap(),
        );
        assert!((a / s - ratio).abs() < 0.02, "{row}");
        assert_eq!(cells[5].split(" / ").count(), 2, "two standbys: {row}");
    }
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap();
    let goals: Vec<&serde_json::Value> = result["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["label"] == "ringlock-x-cluster")
        .collect();
    // CPU against the single node in both shapes, and the lag at 50
    // connections, are measured; against Redis not (no Redis row here).
    let verdicts: Vec<&str> = goals
        .iter()
        .map(|t| t["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(goals.len(), 5, "{goals:?}");
    assert_eq!(
        verdicts.iter().filter(|v| **v == "not measured").count(),
        2,
        "{goals:?}"
    );
}

/// A cluster row (bench.sh's `<label>-cluster`): each standby's CPU, the
/// active's replication lag per follower from its /metrics, and the report's
/// replication tables beside the single node's row.
#[test]
fn cluster_rows_report_standby_cpu_and_replication_lag() {
    let dir = std::env::temp_dir().join(format!("ringlock-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let single = Running::start(
        server().to_str().unwrap(),
        &["serve", "--listen", "127.0.0.1:0"],
    );
    let nodes = cluster(&dir);
    let mut runs = Vec::new();
    for scenario in ["conns-50", "pipelined"] {
        let shape: &[&str] = if scenario == "pipelined" {
            &["--conns", "2", "--pipeline", "8"]
        } else {
            &["--conns", "4"]
        };
        let mut args = vec!["--scenario", scenario, "--label", "ringlock-x"];
        args.extend_from_slice(shape);
        let pid = single.pid();
        let r = run(&[&args[..], &["--addr", &single.addr, "--server-pid", &pid]].concat());
        assert_eq!(r["follower_cpu"].as_array().map(Vec::len), Some(0), "{r}");
        runs.push(r);

        args[3] = "ringlock-x-cluster";
        let pids: Vec<String> = nodes.iter().map(Running::pid).collect();
        let metrics_addr = nodes[0].metrics.clone().unwrap();
        let cluster_args = [
            "--addr",
            &nodes[0].addr,
            "--server-pid",
            &pids[0],
            "--follower-pid",
            &pids[1],
            "--follower-pid",
            &pids[2],
            "--metrics-addr",
            &metrics_addr,
        ];
        let r = run(&[&args[..], &cluster_args[..]].concat());
        check_cluster_run(&r, &nodes);
        runs.push(r);
    }
    let runs_path = dir.join("runs.jsonl");
    let lines: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
    std::fs::write(&runs_path, lines.join("\n") + "\n").unwrap();
    check_cluster_report(&runs_path, &dir);
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
