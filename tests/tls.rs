//! TLS with real `ringlock serve` processes under both backends: requests
//! over TLS, mutual TLS refusing a client without a certificate or with one
//! from another CA, the words a plain-text client and an untrusted or
//! expired certificate get, the handshake deadline, certificate rotation on
//! SIGHUP under load, and a cluster whose peer links are TLS failing over
//! and handing off. Every certificate is made here (rcgen), none is checked
//! in.

#[macro_use]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certs::{Ca, client_config, s, scratch};
use common::{Server, StderrLog};

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [both()])
}

fn both() -> Vec<common::harness::Test> {
    on_both! {
        requests_over_tls: requests_over_tls_uring, requests_over_tls_epoll;
        pipelined_answers_past_the_pause: pipelined_tls_uring, pipelined_tls_epoll;
        plain_text_client_on_a_tls_port: plain_on_tls_uring, plain_on_tls_epoll;
        mutual_tls_admits_only_known_clients: mutual_tls_uring, mutual_tls_epoll;
        untrusted_and_expired_server_certificates: bad_server_cert_uring, bad_server_cert_epoll;
        stalled_handshake_is_closed: stalled_handshake_uring, stalled_handshake_epoll;
        rotation_on_sighup_under_load: rotation_uring, rotation_epoll;
        cluster_over_tls_fails_over_and_hands_off: tls_cluster_uring, tls_cluster_epoll;
        plain_text_without_tls_flags: plain_without_tls_uring, plain_without_tls_epoll;
        node_with_a_foreign_certificate_does_not_serve:
            foreign_node_cert_uring, foreign_node_cert_epoll;
        a_certificate_for_another_name: other_name_uring, other_name_epoll;
    }
}

// ---------------------------------------------------------------------------
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

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let s = self.stream.get_mut();
        s.write_all(bytes)?;
        s.flush()
    }

    fn recv(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.stream.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        assert!(line.ends_with('\n'), "partial line {line:?}");
        line.pop();
        Ok(line)
    }

    fn call(&mut self, line: &str) -> String {
        self.send(format!("{line}\n").as_bytes()).expect("send");
        self.recv().expect("answer")
    }
}

fn token_of(answer: &str) -> u64 {
    answer.rsplit(' ').next().unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------
// The command line as a client.

fn cli(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RINGLOCK_SERVERS")
        .env_remove("RINGLOCK_TLS_CA")
        .env_remove("RINGLOCK_TLS_CERT")
        .env_remove("RINGLOCK_TLS_KEY")
        .env_remove("RINGLOCK_TLS_SERVER_NAME");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ringlock");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ringlock {args:?} did not finish within 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn err_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// ---------------------------------------------------------------------------
// A single TLS server.

struct Pki {
    dir: PathBuf,
    ca: Ca,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(name: &str) -> Pki {
    let dir = scratch(name);
    let ca = Ca::new(&dir, "ca");
    let (cert, key) = ca.issue(&dir, "server", &["localhost", "127.0.0.1"], false);
    Pki { dir, ca, cert, key }
}

fn tls_server(io: &str, pki: &Pki, extra: &[&str]) -> (Server, StderrLog) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--io",
        io,
        "--tls-cert",
        s(&pki.cert),
        "--tls-key",
        s(&pki.key),
    ];
    args.extend_from_slice(extra);
    Server::start_logged(&args)
}

/// The protocol over TLS, from a raw TLS client and from the command line
/// (flags, and the environment variables).
fn requests_over_tls(io: &str) {
    let pki = pki(&format!("requests-{io}"));
    let (server, log) = tls_server(io, &pki, &[]);
    assert!(log.text().contains("; TLS)"), "{}", log.text());
    let mut c = TlsConn::new(server.addr, client_config(&pki.ca.pem, None));
    assert_eq!(c.call("S"), format!("S active {} 0", server.addr));
    let token = token_of(&c.call("A k 10 0"));
    assert_eq!(c.call(&format!("R k {token}")), "R k 1");

    let addr = server.addr.to_string();
    let out = cli(
        &[
            "acquire",
            "-s",
            &addr,
            "--tls-ca",
            s(&pki.ca.pem),
            "job",
            "--lease",
            "5",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // The same through the environment, as a cron line would have it.
    let out = cli(
        &["release", "job", &token.to_string()],
        &[
            ("RINGLOCK_SERVERS", &addr),
            ("RINGLOCK_TLS_CA", s(&pki.ca.pem)),
        ],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let out = cli(
        &["status"],
        &[
            ("RINGLOCK_SERVERS", &addr),
            ("RINGLOCK_TLS_CA", s(&pki.ca.pem)),
        ],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("active"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(&pki.dir);
}

/// Without TLS flags the port speaks plain text exactly as before, says so
/// on its first line, and a TLS client is not answered in TLS.
fn plain_text_without_tls_flags(io: &str) {
    let pki = pki(&format!("plain-off-{io}"));
    let (server, log) = Server::start_logged(&["--listen", "127.0.0.1:0", "--io", io]);
    assert!(log.text().contains("; plain text)"), "{}", log.text());
    let mut c = server.connect();
    assert_eq!(c.call("S"), format!("S active {} 0", server.addr));
    let out = cli(&["acquire", "-s", &server.addr.to_string(), "k"], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    let mut tls = TlsConn::new(server.addr, client_config(&pki.ca.pem, None));
    let answer = tls.send(b"S\n").and_then(|()| tls.recv());
    assert!(
        answer.is_err(),
        "a TLS client got {answer:?} from a plain port"
    );
    assert!(
        c.call("S").starts_with("S active"),
        "the plain client carries on"
    );
    let _ = std::fs::remove_dir_all(&pki.dir);
}

/// 20 000 requests in one write: the answers pass the 64 KiB pause, so
/// reading stops and resumes as the client takes them, through TLS; every
/// answer comes, in order.
fn pipelined_answers_past_the_pause(io: &str) {
    let pki = pki(&format!("pipelined-{io}"));
    let (server, _log) = tls_server(io, &pki, &[]);
    let mut c = TlsConn::new(server.addr, client_config(&pki.ca.pem, None));
    let n = 20_000;
    let batch = b"S\n".repeat(n);
    // Writing all of it before reading works only because the server keeps
    // reading until its answers pass the pause; a writer thread would need
    // the connection split. The batch (~200 KiB) fits in the socket buffers
    // plus the server's pause window.
    c.send(&batch).expect("send the batch");
    let want = format!("S active {} 0", server.addr);
    for i in 0..n {
        let answer = c.recv().unwrap_or_else(|e| panic!("answer {i}: {e}"));
        assert_eq!(answer, want, "answer {i}");
    }
    let answer = c.call("A k 10 0");
    assert!(
        answer.starts_with("A k "),
        "still serving after the burst: {answer}"
    );
}

/// A plain-text client on the TLS port gets a plain-text `E` that names the
/// cause, the server logs it, and the command line says it.
fn plain_text_client_on_a_tls_port(io: &str) {
    let pki = pki(&format!("plain-{io}"));
    let (server, log) = tls_server(io, &pki, &[]);
    let mut c = common::Conn::new(server.addr);
    c.line("S");
    let answer = c.recv();
    assert!(answer.starts_with("E this port speaks TLS"), "{answer}");
    assert_eq!(c.try_recv(), None, "closed after the E line");
    log.wait_for("spoke plain text to the TLS port", Duration::from_secs(5));

    let out = cli(&["status", "-s", &server.addr.to_string()], &[]);
    assert!(!out.status.success());
    assert!(
        err_of(&out).contains("this port speaks TLS")
            || String::from_utf8_lossy(&out.stdout).contains("this port speaks TLS"),
        "stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        err_of(&out)
    );
    let out = cli(&["acquire", "-s", &server.addr.to_string(), "k"], &[]);
    assert_eq!(out.status.code(), Some(69));
    assert!(
        err_of(&out).contains("this port speaks TLS"),
        "{}",
        err_of(&out)
    );
}

/// With `--tls-client-ca`, a client with no certificate and one whose
/// certificate another CA signed are refused, each with its cause named on
/// both sides; one signed by the client CA is served.
fn mutual_tls_admits_only_known_clients(io: &str) {
    let pki = pki(&format!("mtls-{io}"));
    let clients = Ca::new(&pki.dir, "clients");
    let (good_cert, good_key) = clients.issue(&pki.dir, "alice", &["alice"], false);
    let stranger_ca = Ca::new(&pki.dir, "stranger-ca");
    let (bad_cert, bad_key) = stranger_ca.issue(&pki.dir, "mallory", &["mallory"], false);
    let (server, log) = tls_server(io, &pki, &["--tls-client-ca", s(&clients.pem)]);
    assert!(
        log.text().contains("client certificates required"),
        "{}",
        log.text()
    );
    let addr = server.addr.to_string();
    let ca = s(&pki.ca.pem);

    // No certificate.
    let out = cli(&["acquire", "-s", &addr, "--tls-ca", ca, "k"], &[]);
    assert_eq!(out.status.code(), Some(69), "{}", err_of(&out));
    assert!(
        err_of(&out).contains("requires a client certificate"),
        "{}",
        err_of(&out)
    );
    log.wait_for("presented no certificate", Duration::from_secs(5));
    let mut raw = TlsConn::new(server.addr, client_config(&pki.ca.pem, None));
    let refused = raw.send(b"S\n").and_then(|()| raw.recv());
    assert!(
        refused.is_err(),
        "served without a certificate: {refused:?}"
    );

    // Another CA's certificate.
    let out = cli(
        &[
            "acquire",
            "-s",
            &addr,
            "--tls-ca",
            ca,
            "--tls-cert",
            s(&bad_cert),
            "--tls-key",
            s(&bad_key),
            "k",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(69), "{}", err_of(&out));
    assert!(
        err_of(&out).contains("does not accept our client certificate"),
        "{}",
        err_of(&out)
    );
    log.wait_for("not signed by a trusted CA", Duration::from_secs(5));

    // The client CA's.
    let out = cli(
        &["acquire", "-s", &addr, "--tls-ca", ca, "--lease", "5", "k"],
        &[
            ("RINGLOCK_TLS_CERT", s(&good_cert)),
            ("RINGLOCK_TLS_KEY", s(&good_key)),
        ],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let mut c = TlsConn::new(
        server.addr,
        client_config(&pki.ca.pem, Some((&good_cert, &good_key))),
    );
    assert!(c.call("S").starts_with("S active"));
}

/// A client that does not trust the server's CA, and a server whose
/// certificate has expired: the client says which.
fn untrusted_and_expired_server_certificates(io: &str) {
    let pki = pki(&format!("badcert-{io}"));
    let other = Ca::new(&pki.dir, "other");
    let (server, log) = tls_server(io, &pki, &[]);
    let addr = server.addr.to_string();
    let out = cli(
        &["acquire", "-s", &addr, "--tls-ca", s(&other.pem), "k"],
        &[],
    );
    assert_eq!(out.status.code(), Some(69));
    assert!(
        err_of(&out).contains("is not signed by the CA given"),
        "{}",
        err_of(&out)
    );
    log.wait_for(
        "it does not trust our certificate's CA",
        Duration::from_secs(5),
    );
    drop(server);

    let (cert, key) = pki
        .ca
        .issue(&pki.dir, "expired", &["localhost", "127.0.0.1"], true);
    let (server, _log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        io,
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
    ]);
    let out = cli(
        &[
            "acquire",
            "-s",
            &server.addr.to_string(),
            "--tls-ca",
            s(&pki.ca.pem),
            "k",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(69));
    assert!(err_of(&out).contains("has expired"), "{}", err_of(&out));
}

/// A node whose certificate names only `node1.example`, dialed at
/// 127.0.0.1: the command line refuses it and names its own flag and
/// variable for the name (not the Rust API's); with either, it connects.
/// The Rust client's own message names `TlsConfig::server_name`.
fn a_certificate_for_another_name(io: &str) {
    let dir = scratch(&format!("othername-{io}"));
    let ca = Ca::new(&dir, "ca");
    let (cert, key) = ca.issue(&dir, "node1", &["node1.example"], false);
    let (server, _log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        io,
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
    ]);
    let addr = server.addr.to_string();
    // `status` shows the cause in its table, `acquire` on stderr.
    let out = cli(&["status", "-s", &addr, "--tls-ca", s(&ca.pem)], &[]);
    assert_eq!(out.status.code(), Some(69), "{}", err_of(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("--tls-server-name NAME"), "{table}");
    let base = ["acquire", "-s", &addr, "--tls-ca", s(&ca.pem), "k"];
    let out = cli(&base, &[]);
    assert_eq!(out.status.code(), Some(69), "{}", err_of(&out));
    let err = err_of(&out);
    assert!(
        err.contains("does not name the address dialed (if it holds another name, give that one with --tls-server-name NAME or RINGLOCK_TLS_SERVER_NAME)"),
        "{err}"
    );
    assert!(!err.contains("TlsConfig"), "{err}");
    let mut named = base.to_vec();
    named.extend(["--tls-server-name", "node1.example", "--lease", "1"]);
    let out = cli(&named, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", err_of(&out));
    let base = ["status", "-s", &addr, "--tls-ca", s(&ca.pem)];
    let out = cli(&base, &[("RINGLOCK_TLS_SERVER_NAME", "node1.example")]);
    assert_eq!(out.status.code(), Some(0), "{}", err_of(&out));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tls = ringlock_client::TlsConfig::from_pem_files(&ca.pem, None::<(&Path, &Path)>).unwrap();
    let limit = Duration::from_secs(5);
    let err = runtime
        .block_on(ringlock_client::node_status_tls(&addr, limit, &tls))
        .unwrap_err()
        .to_string();
    assert!(err.contains(ringlock_client::SERVER_NAME_HINT), "{err}");
    assert!(err.contains("TlsConfig::server_name"), "{err}");
    let tls = tls.server_name("node1.example");
    assert!(
        runtime
            .block_on(ringlock_client::node_status_tls(&addr, limit, &tls))
            .is_ok()
    );
}

/// A connection that opens and never finishes its handshake is closed by
/// the deadline, and the server says why; one that completes in time stays.
fn stalled_handshake_is_closed(io: &str) {
    let pki = pki(&format!("stall-{io}"));
    let (server, log) = tls_server(io, &pki, &["--tls-handshake-timeout-ms", "300"]);
    let mut stalled = TcpStream::connect(server.addr).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Half a ClientHello record header: TLS, but never completed.
    stalled.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = stalled.read(&mut buf).unwrap_or(0);
    let waited = started.elapsed();
    assert_eq!(n, 0, "closed without an answer");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(8),
        "closed after {waited:?}, deadline 300 ms"
    );
    log.wait_for("handshake not finished in time", Duration::from_secs(5));
    // A finished handshake is not subject to the deadline.
    let mut c = TlsConn::new(server.addr, client_config(&pki.ca.pem, None));
    assert!(c.call("S").starts_with("S active"));
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        c.call("S").starts_with("S active"),
        "still open past the deadline"
    );
}

/// Certificates rotate on SIGHUP while clients keep connecting and locking:
/// new connections get the new certificate, open ones carry on, no request
/// fails; a reload that cannot read its files keeps the certificates in
/// use and says why.
fn rotation_on_sighup_under_load(io: &str) {
    let pki = pki(&format!("rotate-{io}"));
    let new_ca = Ca::new(&pki.dir, "new-ca");
    // The load trusts both CAs, as clients do during a rotation.
    let both = pki.dir.join("both.pem");
    std::fs::write(
        &both,
        std::fs::read_to_string(&pki.ca.pem).unwrap()
            + &std::fs::read_to_string(&new_ca.pem).unwrap(),
    )
    .unwrap();
    // The server reads copies, which the test replaces.
    let cert = pki.dir.join("live.pem");
    let key = pki.dir.join("live.key");
    std::fs::copy(&pki.cert, &cert).unwrap();
    std::fs::copy(&pki.key, &key).unwrap();
    let (server, log) = Server::start_logged(&[
        "--listen",
        "127.0.0.1:0",
        "--io",
        io,
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
    ]);
    let old_only = client_config(&pki.ca.pem, None);
    let new_only = client_config(&new_ca.pem, None);
    let mut long_lived = TlsConn::new(server.addr, old_only.clone());
    assert!(long_lived.call("S").starts_with("S active"));

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, addr, config) = (stop.clone(), server.addr, client_config(&both, None));
        std::thread::spawn(move || {
            let mut done = 0u64;
            let started = Instant::now();
            // Bounded: the test stops it, or 30 s pass.
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && started.elapsed() < Duration::from_secs(30)
            {
                // A new connection every 20 requests: handshakes throughout.
                let mut c = TlsConn::new(addr, config.clone());
                for _ in 0..10 {
                    let token = token_of(&c.call("A load 5 0"));
                    assert_eq!(c.call(&format!("R load {token}")), "R load 1");
                    done += 2;
                }
            }
            done
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let (new_cert, new_key) = new_ca.issue(&pki.dir, "server2", &["localhost", "127.0.0.1"], false);
    // Replace by rename, as certificate tools do.
    std::fs::copy(&new_cert, pki.dir.join("tmp.pem")).unwrap();
    std::fs::rename(pki.dir.join("tmp.pem"), &cert).unwrap();
    std::fs::copy(&new_key, pki.dir.join("tmp.key")).unwrap();
    std::fs::rename(pki.dir.join("tmp.key"), &key).unwrap();
    server.signal(libc::SIGHUP);
    log.wait_for("TLS certificates reloaded", Duration::from_secs(5));
    // New connections present the new certificate.
    let mut fresh = TlsConn::new(server.addr, new_only.clone());
    assert!(fresh.call("S").starts_with("S active"));
    let mut stale = TlsConn::new(server.addr, old_only.clone());
    assert!(
        stale.send(b"S\n").and_then(|()| stale.recv()).is_err(),
        "a client trusting only the old CA must now fail"
    );
    // The connection opened before the rotation carries on.
    assert!(long_lived.call("S").starts_with("S active"));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let done = load.join().expect("no request failed during the rotation");
    assert!(done > 20, "the load ran ({done} requests)");

    // A broken key: the reload fails, the certificates in use stay.
    std::fs::write(&key, "not a key\n").unwrap();
    server.signal(libc::SIGHUP);
    let line = log.wait_for("TLS reload failed", Duration::from_secs(5));
    assert!(line.contains("live.key"), "names the file: {line}");
    let mut after = TlsConn::new(server.addr, new_only);
    assert!(after.call("S").starts_with("S active"));
    let _ = std::fs::remove_dir_all(&pki.dir);
}

// ---------------------------------------------------------------------------
// A cluster whose peer links are TLS.

/// Asks a TLS node for its status; `None` if it cannot be reached or does
/// not answer within `limit`.
fn tls_status(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    limit: Duration,
) -> Option<common::NodeStatus> {
    let tcp = TcpStream::connect_timeout(&addr, limit).ok()?;
    tcp.set_read_timeout(Some(limit)).ok()?;
    tcp.set_write_timeout(Some(limit)).ok()?;
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
    let mut stream = BufReader::new(rustls::StreamOwned::new(conn, tcp));
    stream.get_mut().write_all(b"S\n").ok()?;
    stream.get_mut().flush().ok()?;
    let mut line = String::new();
    stream.read_line(&mut line).ok()?;
    common::NodeStatus::parse(line.strip_suffix('\n')?)
}

struct TlsCluster {
    addrs: Vec<SocketAddr>,
    args: Vec<Vec<String>>,
    nodes: Vec<Option<(Server, StderrLog)>>,
    client: Arc<rustls::ClientConfig>,
}

impl TlsCluster {
    /// Three nodes' command lines (not started): TLS peer links checked
    /// against `peer_ca`, node `i`'s certificate issued by `issuers[i]` for
    /// the loopback address and "localhost"; the test's clients trust
    /// `client_trust`.
    fn new(
        io: &str,
        dir: &Path,
        peer_ca: &Ca,
        issuers: [&Ca; 3],
        client_trust: &Path,
    ) -> TlsCluster {
        let ip = common::loopback_ip();
        let addrs = common::free_addrs(ip, 3);
        let peers = addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let ip_name = ip.to_string();
        let mut args = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let (cert, key) =
                issuers[i].issue(dir, &format!("node{i}"), &[&ip_name, "localhost"], false);
            args.push(
                [
                    "--listen",
                    &addr.to_string(),
                    "--peers",
                    &peers,
                    "--io",
                    io,
                    "--cluster-secret-file",
                    common::secret_file(),
                    "--tls-cert",
                    s(&cert),
                    "--tls-key",
                    s(&key),
                    "--tls-peer-ca",
                    s(&peer_ca.pem),
                ]
                .map(String::from)
                .to_vec(),
            );
        }
        TlsCluster {
            addrs,
            args,
            nodes: vec![None, None, None],
            client: client_config(client_trust, None),
        }
    }

    fn start_node(&mut self, i: usize) {
        let args: Vec<&str> = self.args[i].iter().map(String::as_str).collect();
        self.nodes[i] = Some(Server::start_logged(&args));
    }

    fn statuses(&self) -> Vec<Option<common::NodeStatus>> {
        self.addrs
            .iter()
            .map(|&a| tls_status(a, &self.client, Duration::from_millis(500)))
            .collect()
    }

    /// Waits until node `active` is active and every other live node
    /// follows it.
    fn wait_settled(&self, active: usize, alive: &[usize]) {
        let name = self.addrs[active].to_string();
        common::poll_until(
            &format!("the TLS cluster settled on node {active}"),
            Duration::from_secs(15),
            || self.statuses(),
            |st| {
                alive.iter().all(|&i| {
                    st[i].as_ref().is_some_and(|s| {
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

    fn connect(&self, i: usize) -> TlsConn {
        TlsConn::new(self.addrs[i], self.client.clone())
    }
}

/// Three nodes with TLS peer links, their certificates signed by a node CA
/// and naming the address peers dial and "localhost", settled with node 0
/// active; and the directory of their files.
fn start_tls_cluster(io: &str) -> (TlsCluster, PathBuf) {
    let dir = scratch(&format!("cluster-{io}"));
    let node_ca = Ca::new(&dir, "node-ca");
    // Each node's certificate names the address its peers dial, and
    // "localhost" for the test's clients; the node CA signs it, so it
    // serves clients and proves the node to its peers.
    let mut c = TlsCluster::new(io, &dir, &node_ca, [&node_ca; 3], &node_ca.pem);
    for i in 0..3 {
        c.start_node(i);
    }
    c.wait_settled(0, &[0, 1, 2]);
    (c, dir)
}

/// Three nodes with TLS peer links (certificates from a node CA, clients
/// without certificates): they come up, a client cannot pose as a peer,
/// kill -9 of the active fails over to node 1 with the grants, and SIGTERM
/// of node 1 hands over to node 2, as over plain links.
fn cluster_over_tls_fails_over_and_hands_off(io: &str) {
    let (mut c, dir) = start_tls_cluster(io);

    // A client (no certificate from the node CA) cannot speak as a peer.
    let mut intruder = c.connect(0);
    intruder.send(b"P HELLO 1 2 3\n").expect("send a peer line");
    let answer = intruder.recv().expect("an E answer");
    assert!(
        answer.contains("without a certificate signed by the peer CA"),
        "{answer}"
    );

    let mut n0 = c.connect(0);
    let held = token_of(&n0.call("A tls/held 60 0"));
    // Replicated to both standbys before node 0 dies.
    common::poll_until(
        "the standbys have node 0's grant",
        Duration::from_secs(10),
        || c.statuses(),
        |st| {
            st[1].as_ref().is_some_and(|s| s.token >= held)
                && st[2].as_ref().is_some_and(|s| s.token >= held)
        },
    );
    drop(n0);
    let (mut node0, _) = c.nodes[0].take().unwrap();
    node0.kill9();
    c.wait_settled(1, &[1, 2]);
    let mut n1 = c.connect(1);
    assert_eq!(
        n1.call("A tls/held 60 0.2"),
        "T tls/held",
        "the grant survived"
    );
    let t1 = token_of(&n1.call("A tls/new 60 0"));
    assert!(t1 > held, "tokens go on rising: {t1} after {held}");
    common::poll_until(
        "node 2 has node 1's grant",
        Duration::from_secs(10),
        || c.statuses(),
        |st| st[2].as_ref().is_some_and(|s| s.token >= t1),
    );

    // SIGTERM: node 1 hands over to node 2 at once.
    let (mut node1, _) = c.nodes[1].take().unwrap();
    node1.signal(libc::SIGTERM);
    let status = node1
        .wait_timeout(Duration::from_secs(10))
        .expect("node 1 exits after SIGTERM");
    assert_eq!(status.code(), Some(0));
    c.wait_settled(2, &[2]);
    let mut n2 = c.connect(2);
    assert_eq!(
        n2.call("A tls/new 60 0.2"),
        "T tls/new",
        "node 1's grant came along"
    );
    assert!(token_of(&n2.call("A tls/third 60 0")) > t1);
    // The handshake between peers went over TLS: the log of node 2 has
    // no TLS failure.
    let log2 = &c.nodes[2].as_ref().unwrap().1;
    assert!(
        log2.lines_with("TLS connection")
            .iter()
            .all(|l| !l.contains("certificate")),
        "{}",
        log2.text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node whose certificate another CA signed (its cluster secret is
/// right) cannot join: its dials fail their TLS handshake, it says why
/// (`H`), and it does not take the active role beside the others, as a
/// node with the wrong secret would not; the other two serve on.
fn node_with_a_foreign_certificate_does_not_serve(io: &str) {
    let dir = scratch(&format!("foreign-{io}"));
    let node_ca = Ca::new(&dir, "node-ca");
    let foreign_ca = Ca::new(&dir, "foreign-ca");
    let both = dir.join("both.pem");
    std::fs::write(
        &both,
        std::fs::read_to_string(&node_ca.pem).unwrap()
            + &std::fs::read_to_string(&foreign_ca.pem).unwrap(),
    )
    .unwrap();
    // Node 2's certificate is signed by another CA.
    let mut c = TlsCluster::new(io, &dir, &node_ca, [&node_ca, &node_ca, &foreign_ca], &both);
    c.start_node(0);
    c.start_node(1);
    c.wait_settled(0, &[0, 1]);
    c.start_node(2);
    // Six peer timeouts: node 2 never active, nodes 0 and 1 unmoved.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let st = c.statuses();
        assert!(
            !st[2].as_ref().is_some_and(|s| s.is_active()),
            "node 2, whose certificate its peers refuse, took the active role: {st:#?}"
        );
        assert!(st[0].as_ref().is_some_and(|s| s.is_active()), "{st:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut n2 = c.connect(2);
    let problem = n2.call("H");
    assert!(problem.contains("peer TLS failed"), "{problem}");
    let log2 = &c.nodes[2].as_ref().unwrap().1;
    log2.wait_for("TLS connection with", Duration::from_secs(5));
    c.wait_settled(0, &[0, 1]);
    let _ = std::fs::remove_dir_all(&dir);
}
