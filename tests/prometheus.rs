//! deploy/prometheus with the real Prometheus: `promtool` checks the
//! configuration and the alert rules and runs their unit tests
//! (deploy/prometheus/alerts_test.yml); then a Prometheus started from
//! deploy/prometheus/prometheus.yml (its targets pointed at a three-node
//! cluster on loopback) scrapes the nodes, sees one active node, sees the
//! role move when the active is killed, and raises the missing node's
//! alert. Where `promtool` or `prometheus` is not installed (Debian:
//! `apt-get install prometheus`), the harness reports its test as ignored.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, Server, poll_until};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus");

/// Whether `tool --version` runs, or what is missing.
fn installed(tool: &str) -> Result<(), String> {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{tool} is not installed (Debian: apt-get install prometheus)"
        )),
    }
}

/// The prerequisite of the promtool checks.
fn promtool() -> Result<(), String> {
    installed("promtool")
}

/// The prerequisite of the Prometheus cluster test.
fn prometheus() -> Result<(), String> {
    installed("prometheus")
}

/// A temporary directory of this test process, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ringlock-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (and reaped) when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tool args...` in `dir` with its output in files of `tmp`, killed
/// past `limit`; returns whether it succeeded and its stdout and stderr.
fn run(tmp: &Path, dir: &str, tool: &str, args: &[&str], limit: Duration) -> (bool, String) {
    let out_path = tmp.join(format!("{tool}.out"));
    let out = std::fs::File::create(&out_path).unwrap();
    let err = out.try_clone().unwrap();
    let mut child = Killed(
        Command::new(tool)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {tool}: {e}")),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < limit,
            "{tool} {args:?} still runs after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    (status.success(), text)
}

fn promtool_checks_the_config_and_tests_the_alert_rules() {
    let tmp = TempDir::new("promtool");
    let limit = Duration::from_secs(60);
    for args in [
        &["check", "config", "prometheus.yml"][..],
        &["check", "rules", "alerts.yml"],
        &["test", "rules", "alerts_test.yml"],
    ] {
        let (ok, out) = run(&tmp.0, DIR, "promtool", args, limit);
        assert!(ok, "promtool {args:?}:\n{out}");
        assert!(out.contains("SUCCESS"), "promtool {args:?}:\n{out}");
        eprintln!("promtool {}: ok", args.join(" "));
    }
    // Every alert of alerts.yml has a unit test.
    let rules = std::fs::read_to_string(format!("{DIR}/alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(format!("{DIR}/alerts_test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 9, "{alerts:?}");
    for alert in alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "no test fires {alert}"
        );
    }
}

/// `promtool check metrics` of a node's `/metrics` while it holds every
/// kind of grant (an exclusive lock, shared grants, permits) and has
/// counted every outcome of each: promtool finds nothing wrong with the
/// names, types and labels. The one thing it reports is not ours to fix:
/// the OpenMetrics text names a counter's family without `_total` in its
/// `# HELP`, which promtool's reading of the older text format takes for
/// a sample without help; that line alone is allowed, for counters only.
fn promtool_checks_the_metrics_of_every_kind() {
    let (server, log) =
        Server::start_logged(&["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]);
    let line = log.wait_for("metrics on http://", Duration::from_secs(10));
    let m: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let mut c = server.connect();
    for (request, answer) in [
        ("A p/x 30 0", "A p/x "),
        ("G p/r 30 0", "G p/r "),
        ("G p/r 30 0", "G p/r "),
        ("C p/s 2 30 0", "C p/s "),
        ("C p/s 3 30 0", "C p/s semaphore 2"),
        ("G p/s 30 0", "G p/s semaphore 2"),
        ("C p/r 2 30 0", "C p/r lock"),
    ] {
        let got = c.call(request);
        assert!(got.starts_with(answer), "{request}: {got}");
    }
    let (_, body) = poll_until(
        "the grants in the metrics",
        Duration::from_secs(10),
        || get(m, "/metrics").map(|(_, body)| body).unwrap_or_default(),
        |body| body.contains("ringlock_grants_held{lock_kind=\"shared\"} 2"),
    );
    for family in ["ringlock_acquires_total{", "ringlock_grants_held{"] {
        assert!(body.contains(family), "no {family} in {body}");
    }
    let tmp = TempDir::new("promtool-metrics");
    std::fs::write(tmp.0.join("metrics.txt"), &body).unwrap();
    let dir = tmp.0.to_str().unwrap();
    let check = ["-c", "promtool check metrics < metrics.txt"];
    let (_, out) = run(&tmp.0, dir, "sh", &check, Duration::from_secs(30));
    let counters: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    assert!(counters.contains(&"ringlock_acquires"), "{counters:?}");
    for problem in out.lines() {
        let allowed = problem
            .strip_suffix("_total no help text")
            .is_some_and(|name| counters.contains(&name));
        assert!(allowed, "promtool check metrics: {problem}\n{out}");
    }
    drop(server);
}

/// One GET over HTTP/1.0 (no chunked body; the server closes), every
/// wait bounded. `None` while nothing listens or the answer is cut.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// `s` for a URL's query string.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A GET of Prometheus's HTTP API: its `data`, or `None` if it does not
/// answer `success`.
fn api(prom: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let (status, body) = get(prom, path)?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    (status == 200 && v["status"] == "success").then(|| v["data"].clone())
}

/// An instant query: each result's labels and value.
fn query(prom: SocketAddr, promql: &str) -> Vec<(serde_json::Value, f64)> {
    let data = api(prom, &format!("/api/v1/query?query={}", escape(promql)))
        .unwrap_or_else(|| panic!("query {promql:?} failed"));
    assert_eq!(data["resultType"], "vector", "{promql}: {data}");
    data["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let v = r["value"][1].as_str().unwrap().parse().unwrap();
            (r["metric"].clone(), v)
        })
        .collect()
}

/// The instances (`host:port`) of a query's results, sorted.
fn instances(results: &[(serde_json::Value, f64)]) -> Vec<String> {
    let mut v: Vec<String> = results
        .iter()
        .map(|(m, _)| m["instance"].as_str().unwrap_or("?").to_string())
        .collect();
    v.sort();
    v
}

/// The alerts Prometheus holds: (name, instance label, state).
fn alerts(prom: SocketAddr) -> Vec<(String, String, String)> {
    let data = api(prom, "/api/v1/alerts").expect("/api/v1/alerts");
    data["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let label = |k: &str| a["labels"][k].as_str().unwrap_or("").to_string();
            (
                label("alertname"),
                label("instance"),
                a["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// deploy/prometheus/prometheus.yml for a cluster on loopback: the
/// targets are the nodes' metrics addresses, scrapes and rule evaluations
/// every 250 ms. The rules are alerts.yml with the node-down alert's
/// `for:` cut from 30 s to 2 s.
fn write_config(dir: &Path, targets: &[String]) -> PathBuf {
    let config = std::fs::read_to_string(format!("{DIR}/prometheus.yml")).unwrap();
    let quoted: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    let mut out = config.clone();
    for (from, to) in [
        (
            "  scrape_interval: 5s\n",
            "  scrape_interval: 250ms\n  scrape_timeout: 250ms\n",
        ),
        (
            "  evaluation_interval: 5s\n",
            "  evaluation_interval: 250ms\n",
        ),
        (
            "- targets: [\"127.0.0.1:9171\", \"127.0.0.1:9172\", \"127.0.0.1:9173\"]",
            &format!("- targets: [{}]", quoted.join(", ")),
        ),
    ] {
        assert_eq!(out.matches(from).count(), 1, "{from:?} in\n{config}");
        out = out.replace(from, to);
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, out).unwrap();
    let rules = std::fs::read_to_string(format!("{DIR}/alerts.yml")).unwrap();
    let (before, after) = rules
        .split_once("- alert: RinglockNodeDown\n")
        .expect("a RinglockNodeDown alert");
    let (rule, rest) = after.split_once("- alert: ").expect("an alert after it");
    assert_eq!(rule.matches("for: 30s\n").count(), 1, "{rule}");
    let rule = rule.replace("for: 30s\n", "for: 2s\n");
    std::fs::write(
        dir.join("alerts.yml"),
        format!("{before}- alert: RinglockNodeDown\n{rule}- alert: {rest}"),
    )
    .unwrap();
    path
}

const WITHIN: Duration = Duration::from_secs(30);

/// Three nodes on loopback, each with its metrics on a free loopback
/// port (given by the kernel, read from its log): the cluster and the
/// metrics addresses, node 0 active.
fn start_nodes() -> (Cluster, Vec<String>) {
    let (cluster, logs) = Cluster::start_logged(3, "epoll", &["--metrics-listen", "127.0.0.1:0"]);
    let metrics: Vec<String> = logs
        .iter()
        .map(|log| {
            let line = log.wait_for("metrics on http://", Duration::from_secs(10));
            let addr = line
                .split("http://")
                .nth(1)
                .and_then(|r| r.split('/').next());
            addr.unwrap_or_else(|| panic!("no address in {line:?}"))
                .to_string()
        })
        .collect();
    (cluster, metrics)
}

/// A Prometheus process and its temp dir (configuration, storage, log),
/// killed and removed when dropped, in that order.
struct Prometheus {
    addr: SocketAddr,
    log: PathBuf,
    _child: Killed,
    _tmp: TempDir,
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port with the configuration
    /// of [`write_config`] for `targets`, and waits until it is ready.
    fn start(targets: &[String]) -> Prometheus {
        let tmp = TempDir::new("prometheus");
        let config = write_config(&tmp.0, targets);
        let (ok, out) = run(
            &tmp.0,
            DIR,
            "promtool",
            &["check", "config", config.to_str().unwrap()],
            Duration::from_secs(60),
        );
        assert!(ok, "the generated config:\n{out}");
        let prom = common::free_addrs(common::loopback_ip(), 1)[0];
        let log_path = tmp.0.join("prometheus.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Killed(
            Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    tmp.0.join("data").display()
                ))
                .arg(format!("--web.listen-address={prom}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn prometheus"),
        );
        let ready = poll_until(
            "Prometheus is ready",
            WITHIN,
            || get(prom, "/-/ready").map(|(s, _)| s),
            |s| *s == Some(200),
        );
        eprintln!("Prometheus ready after {:?}", ready.0);
        Prometheus {
            addr: prom,
            log: log_path,
            _child: child,
            _tmp: tmp,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Each target's instance and health on the targets page, sorted.
fn targets(prom: SocketAddr) -> Option<Vec<(String, String)>> {
    api(prom, "/api/v1/targets").map(|d| {
        let mut t: Vec<(String, String)> = d["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["labels"]["instance"].as_str().unwrap_or("").to_string(),
                    t["health"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        t.sort();
        t
    })
}

/// Every target up, as the targets page and as `up`, and the metrics the
/// alerts and docs/operations.md use there from every node.
fn check_scraped(prom: SocketAddr, metrics: &[String]) {
    let mut sorted = metrics.to_vec();
    sorted.sort();
    let all_up: Vec<(String, String)> = sorted.iter().map(|i| (i.clone(), "up".into())).collect();
    poll_until(
        "every target scraped and up",
        WITHIN,
        || targets(prom),
        |t| t.as_ref() == Some(&all_up),
    );
    let up = query(prom, "up{job=\"ringlock\"}");
    assert_eq!(instances(&up), sorted);
    assert!(up.iter().all(|(_, v)| *v == 1.0), "{up:?}");

    for name in [
        "ringlock_active",
        "ringlock_ready",
        "ringlock_peers_up",
        "ringlock_locks",
        "ringlock_highest_token",
        "ringlock_connections_open",
        "ringlock_connections_refused_total",
        "ringlock_protocol_errors_total",
        "ringlock_loop_turn_seconds_count",
    ] {
        let got = poll_until(
            &format!("{name} from every node"),
            WITHIN,
            || instances(&query(prom, name)),
            |i| *i == sorted,
        );
        assert_eq!(got.1, sorted);
    }
    let buckets = query(prom, "ringlock_loop_turn_seconds_bucket{le=\"+Inf\"}");
    assert_eq!(instances(&buckets), sorted, "{buckets:?}");
    let requests = query(prom, "ringlock_requests_total{kind=\"acquire\"}");
    assert!(!requests.is_empty(), "no ringlock_requests_total");
}

fn prometheus_scrapes_the_cluster_and_alerts_on_a_killed_node() {
    let (mut cluster, metrics) = start_nodes();
    let prometheus = Prometheus::start(&metrics);
    let prom = prometheus.addr;
    check_scraped(prom, &metrics);

    // Exactly one node active: node 0, as the cluster says.
    let active = |prom| query(prom, "ringlock_active == 1");
    let (_, first) = poll_until(
        "one active node in Prometheus",
        WITHIN,
        || instances(&active(prom)),
        |i| i.len() == 1,
    );
    assert_eq!(first, [metrics[0].clone()]);
    assert_eq!(query(prom, "sum(ringlock_active)")[0].1, 1.0);
    // Until every target's first scrape, the nodes scraped so far may
    // all be standbys: RinglockNoActive may be pending (for: 5 s), then
    // nothing is.
    poll_until(
        "no alert in a healthy cluster",
        WITHIN,
        || alerts(prom),
        Vec::is_empty,
    );

    // SIGKILL the active: the role moves to node 1, and node 0's scrapes
    // fail until its alert fires.
    cluster.kill9(0);
    let killed_at = Instant::now();
    cluster.wait_settled(1, Duration::from_secs(10));
    poll_until(
        "the role moved to node 1 in Prometheus",
        WITHIN,
        || instances(&active(prom)),
        |i| *i == [metrics[1].clone()],
    );
    let down = format!("up{{instance=\"{}\"}} == 0", metrics[0]);
    poll_until(
        "node 0 up == 0",
        WITHIN,
        || query(prom, &down).len(),
        |n| *n == 1,
    );
    let mut states = Vec::new();
    let (took, last) = poll_until(
        "RinglockNodeDown firing for node 0",
        WITHIN,
        || {
            let now = alerts(prom);
            let node_down: Vec<_> = now
                .iter()
                .filter(|a| a.0 == "RinglockNodeDown")
                .cloned()
                .collect();
            if let Some(a) = node_down.first()
                && states.last() != Some(&a.2)
            {
                states.push(a.2.clone());
            }
            (node_down, now)
        },
        |(node_down, _)| node_down.iter().any(|a| a.2 == "firing"),
    );
    eprintln!(
        "RinglockNodeDown: {states:?}, firing {took:?} after the role moved, {:?} after the kill",
        killed_at.elapsed()
    );
    assert_eq!(
        last.0,
        [(
            "RinglockNodeDown".to_string(),
            metrics[0].clone(),
            "firing".to_string()
        )],
        "{}",
        prometheus.log()
    );
    // `for: 2s` at 250 ms evaluations: it was pending first.
    assert_eq!(
        states.first().map(String::as_str),
        Some("pending"),
        "{states:?}"
    );
    // The failover took well under the 5 s of RinglockNoActive's `for:`,
    // and one node is active: nothing else alerts.
    assert_eq!(last.1, last.0, "other alerts: {:?}", last.1);
    assert_eq!(query(prom, "sum(ringlock_active)")[0].1, 1.0);
}

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [tests![
            promtool_checks_the_config_and_tests_the_alert_rules if promtool,
            promtool_checks_the_metrics_of_every_kind if promtool,
            prometheus_scrapes_the_cluster_and_alerts_on_a_killed_node if prometheus,
        ]],
    )
}
