//! Who may lock what, with real `ringlock serve` processes under both
//! backends and client certificates made here (rcgen): only a grant's
//! holder releases and renews it (an admin may too), an acquire outside the
//! identity's `--acl` rules is refused with `E not allowed: ...`, `L` shows
//! only what the identity may lock, the rules reload on SIGHUP (a bad
//! reload keeps the old ones), a bad rule file stops the start with its
//! line number, the holder's identity survives kill -9 failover and a
//! SIGTERM hand-off, and the command line and the Rust client name the
//! refusal (`ringlock release --force` for operators).

#[macro_use]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certs::{Ca, client_config, s, scratch};
use common::{Server, StderrLog};

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [both(), one()])
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        only_the_holder_releases_and_renews: holder_uring, holder_epoll;
        acquires_outside_the_rules_are_refused: outside_rules_uring, outside_rules_epoll;
        rules_reload_on_sighup: reload_uring, reload_epoll;
        the_identity_survives_failover_and_hand_off: identity_cluster_uring, identity_cluster_epoll;
    }
}

fn one() -> Vec<common::harness::Test> {
    tests![
        a_bad_rule_file_is_refused_at_start,
        the_cli_and_the_rust_client_say_not_allowed
    ]
}

const RULES: &str = "\
# identity   key prefix   rights
alice        a/           lock
bob          a/           lock
bob          b/           lock
ops          *            lock,admin
*            public/      lock
";

// ---------------------------------------------------------------------------
// Certificates.

/// A node CA with one node certificate (for `ip`, 127.0.0.1 and
/// localhost), a client CA, and a client certificate per identity (its
/// CN), and the rule file.
struct Pki {
    dir: PathBuf,
    node_ca: Ca,
    node: (PathBuf, PathBuf),
    client_ca: Ca,
    acl: PathBuf,
}

impl Pki {
    fn new(name: &str, ip: &str) -> Pki {
        let dir = scratch(name);
        let node_ca = Ca::new(&dir, "node-ca");
        let node = node_ca.issue(&dir, "node", &[ip, "127.0.0.1", "localhost"], false);
        let client_ca = Ca::new(&dir, "client-ca");
        for who in ["alice", "bob", "ops", "eve"] {
            client_ca.issue(&dir, who, &[], false);
        }
        let acl = dir.join("acl");
        std::fs::write(&acl, RULES).unwrap();
        Pki {
            dir,
            node_ca,
            node,
            client_ca,
            acl,
        }
    }

    fn cert(&self, who: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{who}.pem")),
            self.dir.join(format!("{who}.key")),
        )
    }

    /// `--tls-*` and `--acl` for a node.
    fn node_args(&self) -> Vec<String> {
        [
            "--tls-cert",
            s(&self.node.0),
            "--tls-key",
            s(&self.node.1),
            "--tls-client-ca",
            s(&self.client_ca.pem),
            "--tls-peer-ca",
            s(&self.node_ca.pem),
            "--acl",
            s(&self.acl),
        ]
        .map(String::from)
        .to_vec()
    }

    fn server(&self, io: &str) -> (Server, StderrLog) {
        let mut args = vec!["--listen", "127.0.0.1:0", "--io", io];
        let node = self.node_args();
        args.extend(node.iter().map(String::as_str));
        Server::start_logged(&args)
    }

    /// A connection as `who`.
    fn connect(&self, addr: SocketAddr, who: &str) -> TlsConn {
        let (cert, key) = self.cert(who);
        TlsConn::new(addr, client_config(&self.node_ca.pem, Some((&cert, &key))))
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// A raw TLS client (rustls, blocking): lines in, lines out.

struct TlsConn {
    stream: BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
}

impl TlsConn {
    fn new(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> TlsConn {
        let tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_nodelay(true).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(config, name).unwrap();
        TlsConn {
            stream: BufReader::new(rustls::StreamOwned::new(conn, tcp)),
        }
    }

    fn send(&mut self, line: &str) {
        let s = self.stream.get_mut();
        s.write_all(format!("{line}\n").as_bytes()).expect("send");
        s.flush().expect("send");
    }

    /// The next line; `None` once the node closed the connection.
    fn recv(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.stream.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                assert!(line.ends_with('\n'), "partial line {line:?}");
                line.pop();
                Some(line)
            }
        }
    }

    fn call(&mut self, line: &str) -> String {
        self.send(line);
        self.recv().expect("an answer")
    }

    fn grant(&mut self, key: &str) -> u64 {
        let answer = self.call(&format!("A {key} 60 0"));
        let token = answer
            .strip_prefix(&format!("A {key} "))
            .unwrap_or_else(|| panic!("not a grant of {key}: {answer}"));
        token.parse().unwrap()
    }
}

// ---------------------------------------------------------------------------
// One node.

/// Bob has the right token of alice's grant: his release and renewal change
/// nothing (`0`, counted, logged); alice's own work; ops (admin) releases
/// anyone's.
fn only_the_holder_releases_and_renews(io: &str) {
    let pki = Pki::new(&format!("holder-{io}"), "127.0.0.1");
    let (server, log) = pki.server(io);
    let mut alice = pki.connect(server.addr, "alice");
    let mut bob = pki.connect(server.addr, "bob");
    let mut ops = pki.connect(server.addr, "ops");
    let t = alice.grant("a/payroll");
    // `S` shows the token: knowing it is not enough.
    assert!(bob.call("S").ends_with(&format!(" {t}")));
    assert_eq!(bob.call(&format!("R a/payroll {t}")), "R a/payroll 0");
    assert_eq!(bob.call(&format!("N a/payroll {t} 60")), "N a/payroll 0");
    assert_eq!(bob.call("A a/payroll 60 0.2"), "T a/payroll", "still held");
    let line = log.wait_for("the grant is another identity's", Duration::from_secs(5));
    assert!(
        line.contains("identity \"bob\" at 127.0.0.1:")
            && line.contains("release of \"a/payroll\" refused"),
        "{line}"
    );
    assert_eq!(alice.call(&format!("N a/payroll {t} 60")), "N a/payroll 1");
    assert_eq!(alice.call(&format!("R a/payroll {t}")), "R a/payroll 1");

    let t = alice.grant("a/payroll");
    assert_eq!(ops.call(&format!("N a/payroll {t} 60")), "N a/payroll 1");
    assert_eq!(ops.call(&format!("R a/payroll {t}")), "R a/payroll 1");
    assert_eq!(
        alice.call(&format!("R a/payroll {t}")),
        "R a/payroll 0",
        "the admin released it"
    );
    // A flood of refusals is logged at most 5 times per 10 s (the test may
    // span two windows).
    for _ in 0..50 {
        assert_eq!(bob.call(&format!("R a/payroll {t}")), "R a/payroll 0");
    }
    let t = alice.grant("a/payroll");
    for _ in 0..50 {
        assert_eq!(bob.call(&format!("R a/payroll {t}")), "R a/payroll 0");
    }
    assert_eq!(ops.call("S").split(' ').next_back(), Some(&*t.to_string()));
    let logged = log.lines_with("the grant is another identity's").len();
    assert!(logged <= 10, "rate-limited: {}", log.text());
}

/// Alice may lock `a/` and `public/`: `b/x` is refused with the `E` line
/// that names the key and the identity, and the connection closes; `L`
/// shows her only what she may lock, an admin everything.
fn acquires_outside_the_rules_are_refused(io: &str) {
    let pki = Pki::new(&format!("rules-{io}"), "127.0.0.1");
    let (server, _log) = pki.server(io);
    let mut bob = pki.connect(server.addr, "bob");
    bob.grant("b/secret");
    bob.grant("a/shared");
    let mut eve = pki.connect(server.addr, "eve");
    eve.grant("public/board");
    let mut alice = pki.connect(server.addr, "alice");
    assert_eq!(alice.call("S").split(' ').next(), Some("S"));
    alice.send("A b/x 60 0");
    assert_eq!(
        alice.recv().as_deref(),
        Some("E not allowed: identity \"alice\" may not lock \"b/x\" in line 2")
    );
    assert_eq!(alice.recv(), None, "the connection closed");

    let mut alice = pki.connect(server.addr, "alice");
    alice.send("L 0 100");
    let mut keys = Vec::new();
    loop {
        let line = alice.recv().expect("an L answer");
        if line.starts_with("L ") {
            break;
        }
        keys.push(line.split(' ').nth(1).unwrap().to_string());
    }
    keys.sort();
    assert_eq!(keys, ["a/shared", "public/board"]);
    let mut ops = pki.connect(server.addr, "ops");
    ops.send("L 0 100");
    let mut all = 0;
    while !ops.recv().expect("an L answer").starts_with("L ") {
        all += 1;
    }
    assert_eq!(all, 3, "an admin lists every key");
    assert_eq!(ops.call("Q b/secret").split(' ').next(), Some("K"));
    assert_eq!(
        alice.call("Q b/secret"),
        "Q b/secret 0",
        "hidden from alice"
    );
    // A certificate whose name is no usable identity (over 32 bytes) is
    // refused right after the handshake, before any answer.
    let long = "a-name-much-longer-than-32-bytes-x";
    pki.client_ca.issue(&pki.dir, long, &[], false);
    let mut unnamed = pki.connect(server.addr, long);
    unnamed.send("S");
    let refused = unnamed.recv().unwrap_or_default();
    assert!(
        refused.starts_with("E not allowed: the client certificate's subject common name")
            && refused.contains("is no usable identity"),
        "{refused}"
    );
    assert_eq!(unnamed.recv(), None);
}

/// SIGHUP reads `--acl` again: new connections get the new rules; a bad
/// file keeps the old ones and the log says which line.
fn rules_reload_on_sighup(io: &str) {
    let pki = Pki::new(&format!("reload-{io}"), "127.0.0.1");
    let (server, log) = pki.server(io);
    let mut before = pki.connect(server.addr, "alice");
    assert_eq!(before.call("S").split(' ').next(), Some("S"));
    std::fs::write(&pki.acl, format!("{RULES}alice c/ lock\n")).unwrap();
    server.signal(libc::SIGHUP);
    let line = log.wait_for("--acl reloaded", Duration::from_secs(5));
    assert!(line.contains("6 rules"), "{line}");
    let mut after = pki.connect(server.addr, "alice");
    let t = after.grant("c/new");
    assert_eq!(after.call(&format!("R c/new {t}")), "R c/new 1");
    // A connection made before keeps the rules it was made with.
    before.send("A c/old 60 0");
    let refused = before.recv().unwrap_or_default();
    assert!(refused.starts_with("E not allowed: "), "{refused}");

    std::fs::write(&pki.acl, "alice a/ lock\nbob b/\n").unwrap();
    server.signal(libc::SIGHUP);
    let line = log.wait_for("--acl reload failed", Duration::from_secs(5));
    assert!(
        line.contains("line 2") && line.contains("keeping the rules in use"),
        "{line}"
    );
    let mut still = pki.connect(server.addr, "alice");
    let t = still.grant("c/kept");
    assert_eq!(still.call(&format!("R c/kept {t}")), "R c/kept 1");
}

/// A rule file with a bad line stops the node at start, naming the line;
/// `--acl` without client certificates is refused too.
fn a_bad_rule_file_is_refused_at_start() {
    let pki = Pki::new("bad-start", "127.0.0.1");
    std::fs::write(&pki.acl, "# ok\nalice a/ lock\nbob b/ lock,write\n").unwrap();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--io", "epoll"];
    let node = pki.node_args();
    args.extend(node.iter().map(String::as_str));
    let out = run_cli(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3: unknown right \"write\""),
        "names the line: {err}"
    );
    let out = run_cli(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            s(&pki.node.0),
            "--tls-key",
            s(&pki.node.1),
            "--acl",
            s(&pki.acl),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-client-ca"));
}

// ---------------------------------------------------------------------------
// The command line and the Rust client.

fn run_cli(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RINGLOCK_SERVERS")
        .env_remove("RINGLOCK_TLS_SERVER_NAME");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ringlock");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("ringlock {args:?} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// `ringlock acquire` outside the rules exits 77 saying "not allowed" at
/// once (no retry); `release --force` releases another identity's grant as
/// an admin, and not as anyone else; the Rust client's error is
/// `Error::NotAllowed`.
fn the_cli_and_the_rust_client_say_not_allowed() {
    let pki = Pki::new("cli", "127.0.0.1");
    let (server, _log) = pki.server("epoll");
    let addr = server.addr.to_string();
    let as_who = |who: &str| {
        let (cert, key) = pki.cert(who);
        vec![
            ("RINGLOCK_SERVERS", addr.clone()),
            ("RINGLOCK_TLS_CA", s(&pki.node_ca.pem).to_string()),
            ("RINGLOCK_TLS_CERT", s(&cert).to_string()),
            ("RINGLOCK_TLS_KEY", s(&key).to_string()),
            ("RINGLOCK_TLS_SERVER_NAME", "localhost".to_string()),
        ]
    };
    let env = |v: &[(&'static str, String)]| -> Vec<(&'static str, String)> { v.to_vec() };
    let cli = |args: &[&str], who: &str| {
        let vars = env(&as_who(who));
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        run_cli(args, &pairs)
    };
    let started = Instant::now();
    let out = cli(&["acquire", "b/x", "--lease", "60"], "alice");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{err}");
    assert!(
        err.contains("not allowed: identity \"alice\" may not lock \"b/x\""),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "not retried");

    let mut alice = pki.connect(server.addr, "alice");
    let t = alice.grant("a/job");
    let out = cli(&["release", "--force", "a/job"], "bob");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(alice.call(&format!("N a/job {t} 60")), "N a/job 1");
    let out = cli(&["release", "--force", "a/job"], "ops");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("released a/job (token {t})")),
        "{err}"
    );
    assert_eq!(alice.call(&format!("N a/job {t} 60")), "N a/job 0");
    let out = cli(&["release", "--force", "a/job"], "ops");
    assert_eq!(out.status.code(), Some(1), "nobody holds it: {out:?}");

    let (cert, key) = pki.cert("alice");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tls = ringlock_client::TlsConfig::from_pem_files(&pki.node_ca.pem, Some((&cert, &key)))
            .unwrap()
            .server_name("localhost");
        let client = ringlock_client::Client::builder([addr.as_str()])
            .tls(tls)
            .connect()
            .await
            .expect("connect");
        let started = Instant::now();
        let err = client
            .acquire(
                b"b/y",
                Duration::from_secs(60),
                Some(Duration::from_secs(5)),
            )
            .await
            .expect_err("not allowed");
        assert!(err.is_not_allowed(), "{err:?}");
        assert!(err.to_string().contains("may not lock \"b/y\""), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3), "not retried");
    });
}

// ---------------------------------------------------------------------------
// A cluster.

/// Three nodes with TLS peer links, client certificates and the rules;
/// alice holds two grants at node 0. After kill -9 of node 0, node 1 refuses
/// bob's release and renewal of them and takes alice's; after SIGTERM of
/// node 1, node 2 does the same.
fn the_identity_survives_failover_and_hand_off(io: &str) {
    let ip = common::loopback_ip();
    let pki = Pki::new(&format!("cluster-{io}"), &ip.to_string());
    let addrs = common::free_addrs(ip, 3);
    let mut nodes = start_cluster(io, &pki, &addrs);
    let settled = |active: usize, alive: &[usize]| settled(&pki, &addrs, active, alive);
    settled(0, &[0, 1, 2]);
    let mut alice = pki.connect(addrs[0], "alice");
    let t1 = alice.grant("a/one");
    let t2 = alice.grant("a/two");
    common::poll_until(
        "the standbys have alice's grants",
        Duration::from_secs(10),
        || [status(&pki, addrs[1]), status(&pki, addrs[2])],
        |st| st.iter().all(|s| s.as_ref().is_some_and(|s| s.token >= t2)),
    );
    drop(alice);
    nodes[0].take().unwrap().0.kill9();
    settled(1, &[1, 2]);
    let (mut bob, mut alice) = (pki.connect(addrs[1], "bob"), pki.connect(addrs[1], "alice"));
    assert_eq!(bob.call(&format!("R a/one {t1}")), "R a/one 0");
    assert_eq!(bob.call(&format!("N a/one {t1} 60")), "N a/one 0");
    assert_eq!(alice.call(&format!("N a/one {t1} 60")), "N a/one 1");
    assert_eq!(alice.call(&format!("R a/two {t2}")), "R a/two 1");
    // The renewal replicated from node 1 names alice too: SIGTERM hands
    // over to node 2 (after everything node 1 replicated to it, on the same
    // link), which refuses bob as well.
    let (mut node1, _) = nodes[1].take().unwrap();
    node1.signal(libc::SIGTERM);
    assert_eq!(
        node1
            .wait_timeout(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
    settled(2, &[2]);
    let (mut bob, mut alice) = (pki.connect(addrs[2], "bob"), pki.connect(addrs[2], "alice"));
    assert_eq!(bob.call(&format!("R a/one {t1}")), "R a/one 0");
    assert_eq!(bob.call(&format!("N a/one {t1} 60")), "N a/one 0");
    assert_eq!(
        alice.call(&format!("R a/two {t2}")),
        "R a/two 0",
        "released"
    );
    assert_eq!(alice.call(&format!("R a/one {t1}")), "R a/one 1");
    drop(nodes);
}

/// Three nodes at `addrs` with `pki`'s certificates and rules.
fn start_cluster(io: &str, pki: &Pki, addrs: &[SocketAddr]) -> Vec<Option<(Server, StderrLog)>> {
    let peers = addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    addrs
        .iter()
        .map(|addr| {
            let mut args = vec![
                "--listen".to_string(),
                addr.to_string(),
                "--peers".into(),
                peers.clone(),
                "--io".into(),
                io.into(),
                "--cluster-secret-file".into(),
                common::secret_file().into(),
            ];
            args.extend(pki.node_args());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Some(Server::start_logged(&args))
        })
        .collect()
}

/// Waits until node `active` is active and the other live nodes follow it.
fn settled(pki: &Pki, addrs: &[SocketAddr], active: usize, alive: &[usize]) {
    let name = addrs[active].to_string();
    common::poll_until(
        &format!("node {active} active, the others following it"),
        Duration::from_secs(15),
        || {
            alive
                .iter()
                .map(|&i| status(pki, addrs[i]))
                .collect::<Vec<_>>()
        },
        |st| {
            alive.iter().zip(st).all(|(&i, s)| {
                s.as_ref().is_some_and(|s| {
                    if i == active {
                        s.is_active()
                    } else {
                        s.follows(&name)
                    }
                })
            })
        },
    );
}

/// `S` of a node as ops; `None` if it does not answer within 500 ms.
fn status(pki: &Pki, addr: SocketAddr) -> Option<common::NodeStatus> {
    let limit = Duration::from_millis(500);
    let tcp = TcpStream::connect_timeout(&addr, limit).ok()?;
    tcp.set_read_timeout(Some(limit)).ok()?;
    tcp.set_write_timeout(Some(limit)).ok()?;
    let (cert, key) = pki.cert("ops");
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let conn =
        rustls::ClientConnection::new(client_config(&pki.node_ca.pem, Some((&cert, &key))), name)
            .ok()?;
    let mut stream = BufReader::new(rustls::StreamOwned::new(conn, tcp));
    stream.get_mut().write_all(b"S\n").ok()?;
    stream.get_mut().flush().ok()?;
    let mut line = String::new();
    stream.read_line(&mut line).ok()?;
    common::NodeStatus::parse(line.strip_suffix('\n')?)
}
