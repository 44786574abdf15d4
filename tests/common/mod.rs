//! Test harness: starts the real `ringlock` binary on a free loopback port
//! and stops it when dropped.
//!
//! A test file whose tests have prerequisites (io_uring, a tool, a
//! toolchain: the Go and TypeScript clients' wrappers too) runs under
//! [`harness`], which reports a missing prerequisite as an ignored test
//! with its reason: its top comment says how to put a file under it.
// Shared by several test binaries, each using a part of it: `pub` is this
// module's interface, and what one binary leaves unused is not dead.
#![allow(dead_code, unreachable_pub, unused_macros)]

pub mod certs;
#[macro_use]
pub mod harness;
pub mod python;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The io backends every server test runs under.
pub const BACKENDS: [&str; 2] = ["uring", "epoll"];

/// The prerequisite of every test's io_uring variant: io_uring runs here
/// (not refused by the kernel or a seccomp profile). Where it does not,
/// the harness reports those variants as ignored with the reason.
pub fn uring() -> Result<(), String> {
    ringlock::testing::uring()
}

/// Two tests per scenario, `scenario: uring_name, epoll_name;`, running it
/// under each backend, for the list a test file's `main` hands to
/// [`harness::run`] (a `Vec<harness::Test>`); the io_uring one requires
/// [`uring`]. Test files take it with `#[macro_use] mod common;`.
macro_rules! on_both {
    ($($scenario:ident: $uring:ident, $epoll:ident;)*) => {
        vec![$(
            $crate::common::harness::Test::new(stringify!($uring), || $scenario("uring"))
                .requires("io_uring", $crate::common::uring),
            $crate::common::harness::Test::new(stringify!($epoll), || $scenario("epoll")),
        )*]
    };
}

/// A running `ringlock serve` child process.
pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// The backend the server said it runs (`uring` or `epoll`).
    pub io: String,
    args: Vec<String>,
}

impl Server {
    /// Starts a single node on 127.0.0.1 with a port picked by the kernel.
    pub fn start(io: &str) -> Server {
        Server::start_with(&["--listen", "127.0.0.1:0", "--io", io])
    }

    /// Starts `ringlock serve ARGS...` and waits for its "listening on" line.
    /// Panics if the server does not come up, or if it was asked for io_uring
    /// and runs something else: a uring test must never pass on epoll.
    pub fn start_with(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringlock serve");
        let stderr = child.stderr.take().expect("stderr piped");
        let mut lines = BufReader::new(stderr);
        let mut seen = String::new();
        let (addr, io) = loop {
            let mut line = String::new();
            let n = lines.read_line(&mut line).expect("read server stderr");
            if n == 0 {
                let status = child.wait().expect("wait for ringlock");
                panic!("ringlock serve {args:?} exited ({status}) before listening:\n{seen}");
            }
            seen.push_str(&line);
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr: SocketAddr = rest
                    .split_whitespace()
                    .next()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("bad listening line: {line}"));
                let io = rest
                    .split("(io: ")
                    .nth(1)
                    .map(|s| s.trim_end_matches(|c: char| c == ')' || c.is_whitespace()))
                    .map(|s| s.split(';').next().unwrap().to_string())
                    .unwrap_or_else(|| panic!("no io in listening line: {line}"));
                break (addr, io);
            }
        };
        let wanted = args
            .windows(2)
            .find(|w| w[0] == "--io")
            .map(|w| w[1].to_string());
        if let Some(wanted) = wanted.filter(|w| w != "auto") {
            assert_eq!(io, wanted, "asked for --io {wanted}, server runs {io}");
        }
        // Keep draining the server's log so that it never blocks on a full
        // pipe; show it in the test's output (visible on failure).
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = lines.read_to_string(&mut rest);
            if !rest.is_empty() {
                eprint!("{rest}");
            }
        });
        Server {
            child: Some(child),
            addr,
            io,
            args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Sends SIGKILL and waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal (e.g. `libc::SIGTERM`) without waiting.
    pub fn signal(&self, sig: i32) {
        if let Some(child) = &self.child
            && let (Some(pid), Some(sig)) = (
                rustix::process::Pid::from_raw(child.id() as i32),
                rustix::process::Signal::from_named_raw(sig),
            )
        {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }

    /// Waits for the process to exit and returns its status code.
    pub fn wait(&mut self) -> Option<i32> {
        self.child.take().and_then(|mut c| c.wait().ok()?.code())
    }

    /// Opens a client connection with generous timeouts.
    pub fn connect(&self) -> Conn {
        Conn::new(self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A raw protocol connection: write lines, read answer lines.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Conn {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    /// Sends raw bytes (a line must carry its own `\n`).
    pub fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("send");
    }

    /// Sends one line, adding `\n`.
    pub fn line(&mut self, line: &str) {
        self.send(format!("{line}\n").as_bytes());
    }

    /// Reads one answer line without its `\n`; panics on EOF or timeout.
    pub fn recv(&mut self) -> String {
        self.try_recv()
            .expect("connection closed, an answer was expected")
    }

    /// Reads one line; `None` at EOF.
    pub fn try_recv(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => {
                assert!(line.ends_with('\n'), "partial line {line:?}");
                line.pop();
                Some(line)
            }
            Err(e) => panic!("read answer: {e}"),
        }
    }

    /// Sends a line and reads one answer.
    pub fn call(&mut self, line: &str) -> String {
        self.line(line);
        self.recv()
    }

    /// Sets how long `recv` waits before panicking.
    pub fn set_timeout(&self, timeout: Duration) {
        self.writer.set_read_timeout(Some(timeout)).unwrap();
    }

    /// True if nothing arrives within `within` (the connection stays usable).
    pub fn quiet_for(&mut self, within: Duration) -> bool {
        if !self.reader.buffer().is_empty() {
            return false;
        }
        self.writer.set_read_timeout(Some(within)).unwrap();
        let mut byte = [0u8; 1];
        let quiet = match self.reader.get_mut().peek(&mut byte) {
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        self.writer
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        quiet
    }

    /// The token of a grant line `A <key> <token>`.
    pub fn token_of(answer: &str) -> u64 {
        let fields: Vec<&str> = answer.split(' ').collect();
        assert_eq!(fields.len(), 3, "not a grant: {answer:?}");
        assert_eq!(fields[0], "A", "not a grant: {answer:?}");
        fields[2].parse().expect("token")
    }
}

// ---------------------------------------------------------------------------
// Additions for tests/server.rs (the functions above keep their behaviour).

impl Server {
    /// The server process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The arguments the server was started with (after `serve`).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Waits at most `limit` for the process to exit. `None` if it still
    /// runs (it is then still killed on drop).
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's resident set size in KiB (from /proc), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }
}

impl Conn {
    /// The underlying socket (clone it to write from another thread while
    /// this `Conn` reads).
    pub fn stream(&self) -> &TcpStream {
        &self.writer
    }

    /// Reads one answer line as raw bytes, with its `\n`. `None` when the
    /// server closed the connection (EOF, or a reset that followed its
    /// close). Panics on a read timeout or on a partial line at EOF.
    pub fn recv_raw(&mut self) -> Option<Vec<u8>> {
        let mut line = Vec::new();
        match self.reader.read_until(b'\n', &mut line) {
            Ok(0) => None,
            Ok(_) => {
                assert!(
                    line.ends_with(b"\n"),
                    "partial line at EOF: {:?}",
                    String::from_utf8_lossy(&line)
                );
                Some(line)
            }
            Err(e)
                if line.is_empty()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                    ) =>
            {
                None
            }
            Err(e) => panic!(
                "read answer: {e} (after {:?})",
                String::from_utf8_lossy(&line)
            ),
        }
    }

    /// Like [`Conn::try_recv`], but a reset after the server's close also
    /// counts as closed, and non-UTF-8 bytes are shown lossily.
    pub fn recv_or_closed(&mut self) -> Option<String> {
        self.recv_raw().map(|mut l| {
            l.pop();
            String::from_utf8_lossy(&l).into_owned()
        })
    }
}

/// The kernel's send and receive queue lengths (bytes) of the IPv4 TCP
/// socket with this local and remote address, from /proc/net/tcp.
pub fn tcp_queues(local: SocketAddr, remote: SocketAddr) -> Option<(u64, u64)> {
    fn hex(addr: SocketAddr) -> Option<String> {
        match addr {
            SocketAddr::V4(a) => Some(format!(
                "{:08X}:{:04X}",
                u32::from_ne_bytes(a.ip().octets()),
                a.port()
            )),
            SocketAddr::V6(_) => None,
        }
    }
    let (local, remote) = (hex(local)?, hex(remote)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[1] != local || f[2] != remote {
            return None;
        }
        let (tx, rx) = f[4].split_once(':')?;
        Some((
            u64::from_str_radix(tx, 16).ok()?,
            u64::from_str_radix(rx, 16).ok()?,
        ))
    })
}

// ---------------------------------------------------------------------------
// Additions for tests/cluster.rs: clusters of real processes (the functions
// above keep their behaviour).

/// A loopback address of its own for each call: 127.x.y.z with x, y, z from
/// the process id, a counter and the clock (127.0.0.0/8 is all loopback on
/// Linux). Ports picked on it cannot be taken by another test's outgoing
/// connections, whose source address is 127.0.0.1.
pub fn loopback_ip() -> std::net::Ipv4Addr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut h = (u64::from(std::process::id()) << 32) ^ u64::from(nanos) ^ (u64::from(n) << 20);
    // splitmix64 finaliser: spread the bits.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    let [a, b, c, ..] = h.to_le_bytes();
    // Not 127.0.0.x (shared with everything else), and no .0/.255 host part.
    std::net::Ipv4Addr::new(127, a.max(1), b, c.clamp(1, 254))
}

/// `n` distinct free ports on `ip`: all bound at once (so they differ), then
/// released for the caller to listen on.
pub fn free_addrs(ip: std::net::Ipv4Addr, n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind((ip, 0)).expect("bind a free loopback port"))
        .collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

impl Server {
    /// CPU time the server has used so far (user + system, from /proc),
    /// while it runs.
    pub fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()?)).ok()?;
        // Fields after the command name, which is in parentheses.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        let hz = rustix::param::clock_ticks_per_second().max(1);
        Some(Duration::from_millis(ticks * 1000 / hz))
    }
}

/// One node's answer to `S`: `S <role> <active> <token>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// `active` or `standby`.
    pub role: String,
    /// The active node's address as listed in `--peers`, or `-`.
    pub active: String,
    /// The highest token the node has issued or seen.
    pub token: u64,
}

impl NodeStatus {
    /// Parses an `S` answer line.
    pub fn parse(line: &str) -> Option<NodeStatus> {
        let f: Vec<&str> = line.split(' ').collect();
        match f[..] {
            ["S", role, active, token] if role == "active" || role == "standby" => {
                Some(NodeStatus {
                    role: role.to_string(),
                    active: active.to_string(),
                    token: token.parse().ok()?,
                })
            }
            _ => None,
        }
    }

    pub fn is_active(&self) -> bool {
        self.role == "active"
    }

    /// True if this is a standby that names `active` as the active node.
    pub fn follows(&self, active: &str) -> bool {
        self.role == "standby" && self.active == active
    }
}

/// Asks the node at `addr` for its status on a fresh connection. `None` if
/// it cannot be reached or does not answer within `limit` (a stopped or
/// dead process), or answers something else than an `S` line.
pub fn status_of(addr: SocketAddr, limit: Duration) -> Option<NodeStatus> {
    let mut stream = TcpStream::connect_timeout(&addr, limit).ok()?;
    stream.set_nodelay(true).ok()?;
    stream.set_read_timeout(Some(limit)).ok()?;
    stream.write_all(b"S\n").ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    NodeStatus::parse(line.strip_suffix('\n')?)
}

/// Polls `cond` every few milliseconds until it holds and returns how long
/// that took; panics with `what` (and the last `state` seen) after `within`.
pub fn poll_until<T: std::fmt::Debug>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> T,
    mut cond: impl FnMut(&T) -> bool,
) -> (Duration, T) {
    let started = std::time::Instant::now();
    loop {
        let state = probe();
        if cond(&state) {
            return (started.elapsed(), state);
        }
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}; last seen: {state:#?}"
        );
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// A cluster of `ringlock serve` processes on one loopback address, every
/// node started with the same `--peers` list (node 0 first: highest
/// priority). Dropping it continues stopped nodes and kills every node.
pub struct Cluster {
    pub io: String,
    /// Node `i` listens on `addrs[i]`, which is also its `--peers` entry.
    pub addrs: Vec<SocketAddr>,
    /// The `--peers` value.
    pub peers: String,
    /// `--heartbeat-ms` and `--peer-timeout-ms` of every node.
    pub heartbeat_ms: u64,
    pub peer_timeout_ms: u64,
    /// `--failback-delay-ms` of every node.
    pub failback_delay_ms: u64,
    nodes: Vec<Option<Server>>,
    extra: Vec<String>,
}

/// A cluster secret file for this test process (made once, mode 600),
/// for `--cluster-secret-file`.
pub fn secret_file() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // Under the harness, in the test's own directory (removed after it).
        let path =
            harness::scratch_dir().join(format!("ringlock-test-secret-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let status = Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .arg("keygen")
            .arg(&path)
            .stderr(Stdio::null())
            .status()
            .expect("run ringlock keygen");
        assert!(status.success(), "ringlock keygen {}", path.display());
        path.to_string_lossy().into_owned()
    })
}

impl Cluster {
    /// The cluster settings the tests run with (the server's defaults,
    /// spelled out): heartbeats every 50 ms, a peer dead after 500 ms.
    pub const HEARTBEAT_MS: u64 = 50;
    pub const PEER_TIMEOUT_MS: u64 = 500;
    /// Not the server's default (5 s): the hand-back to a returning node
    /// at once, for the tests that are not about the delay.
    pub const FAILBACK_DELAY_MS: u64 = 0;

    /// Starts `n` nodes under `--io io` and waits until node 0 is active and
    /// every other node a standby naming it.
    pub fn start(n: usize, io: &str) -> Cluster {
        Cluster::start_with(n, io, &[])
    }

    /// Like [`Cluster::start`], with more `serve` arguments for every node.
    pub fn start_with(n: usize, io: &str, extra: &[&str]) -> Cluster {
        let mut cluster = Cluster::configure(n, io, extra);
        for i in 0..n {
            cluster.start_node(i);
        }
        cluster.wait_settled(0, Duration::from_secs(10));
        cluster
    }

    /// A cluster of `n` nodes with their addresses picked and no node
    /// started yet (see [`Cluster::start_node`]); the default timings,
    /// which the caller may change before starting nodes.
    pub fn configure(n: usize, io: &str, extra: &[&str]) -> Cluster {
        let addrs = free_addrs(loopback_ip(), n);
        let peers = addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            io: io.to_string(),
            addrs,
            peers,
            heartbeat_ms: Self::HEARTBEAT_MS,
            peer_timeout_ms: Self::PEER_TIMEOUT_MS,
            failback_delay_ms: Self::FAILBACK_DELAY_MS,
            nodes: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Node `i`'s `serve` arguments (the same on every restart).
    pub fn node_args(&self, i: usize) -> Vec<String> {
        let mut args: Vec<String> = [
            "--listen".to_string(),
            self.addrs[i].to_string(),
            "--peers".to_string(),
            self.peers.clone(),
            "--io".to_string(),
            self.io.clone(),
            "--heartbeat-ms".to_string(),
            self.heartbeat_ms.to_string(),
            "--peer-timeout-ms".to_string(),
            self.peer_timeout_ms.to_string(),
            "--failback-delay-ms".to_string(),
            self.failback_delay_ms.to_string(),
            "--cluster-secret-file".to_string(),
            secret_file().to_string(),
        ]
        .into();
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Starts node `i` (again, after a kill: same address, same arguments)
    /// and waits for its "listening on" line.
    pub fn start_node(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node {i} is running already");
        let args = self.node_args(i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::start_with(&args);
        assert_eq!(server.addr, self.addrs[i], "node {i} listens elsewhere");
        self.nodes[i] = Some(server);
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`'s address as `--peers` spells it (and `M` and `S` name it).
    pub fn addr(&self, i: usize) -> String {
        self.addrs[i].to_string()
    }

    /// Every node's address, in priority order.
    pub fn addr_strings(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.addr(i)).collect()
    }

    /// The running node `i`; panics if it was killed.
    pub fn node(&self, i: usize) -> &Server {
        self.nodes[i]
            .as_ref()
            .unwrap_or_else(|| panic!("node {i} is not running"))
    }

    pub fn node_mut(&mut self, i: usize) -> &mut Server {
        self.nodes[i]
            .as_mut()
            .unwrap_or_else(|| panic!("node {i} is not running"))
    }

    /// True while node `i` has a process (running or stopped).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].as_ref().is_some_and(|s| s.child.is_some())
    }

    /// SIGKILL node `i` and wait until the process is gone.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut server) = self.nodes[i].take() {
            server.signal(libc::SIGCONT);
            server.kill9();
        }
    }

    /// Takes node `i` out of the cluster's hands (e.g. to wait for its exit
    /// status after SIGTERM); it is still killed when the result drops.
    pub fn take_node(&mut self, i: usize) -> Server {
        self.nodes[i]
            .take()
            .unwrap_or_else(|| panic!("node {i} is not running"))
    }

    /// A raw connection to node `i`.
    pub fn connect(&self, i: usize) -> Conn {
        Conn::new(self.addrs[i])
    }

    /// Node `i`'s status (`None`: not running, unreachable, or no answer
    /// within 500 ms).
    pub fn status(&self, i: usize) -> Option<NodeStatus> {
        if !self.is_running(i) {
            return None;
        }
        status_of(self.addrs[i], Duration::from_millis(500))
    }

    /// Every node's status, in priority order.
    pub fn statuses(&self) -> Vec<Option<NodeStatus>> {
        (0..self.len()).map(|i| self.status(i)).collect()
    }

    /// True if, in `statuses`, node `active` is active and every other
    /// running node a standby naming it. Nodes without a process are left
    /// out; a running node that does not answer fails the check.
    pub fn is_settled_on(&self, statuses: &[Option<NodeStatus>], active: usize) -> bool {
        let want = self.addr(active);
        statuses.iter().enumerate().all(|(i, s)| {
            if !self.is_running(i) {
                return true;
            }
            match s {
                Some(s) if i == active => s.is_active() && s.active == want,
                Some(s) => s.follows(&want),
                None => false,
            }
        })
    }

    /// Waits until node `active` is the one active node and every other
    /// running node follows it; returns how long that took.
    pub fn wait_settled(&self, active: usize, within: Duration) -> Duration {
        let what = format!(
            "{} node cluster ({}) settled on node {active} ({})",
            self.len(),
            self.io,
            self.addr(active)
        );
        poll_until(
            &what,
            within,
            || self.statuses(),
            |s| self.is_settled_on(s, active),
        )
        .0
    }

    /// Waits until node `i`'s status token is at least `token`: everything
    /// the active sent before that token reached it (replication and
    /// heartbeats share one ordered link).
    pub fn wait_token(&self, i: usize, token: u64, within: Duration) -> Duration {
        poll_until(
            &format!("node {i} has seen token {token}"),
            within,
            || self.status(i),
            |s| s.as_ref().is_some_and(|s| s.token >= token),
        )
        .0
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A node stopped by a failing test is continued, then killed (by
        // the Server's own drop).
        for server in self.nodes.iter().flatten() {
            server.signal(libc::SIGCONT);
        }
    }
}

// ---------------------------------------------------------------------------
// Additions for tests/hostile_peers.rs: a server's stderr, collected while it
// runs (the functions above keep their behaviour).

/// Every line a server wrote to stderr so far, collected by a thread of its
/// own (and still echoed to the test's output, shown on failure).
#[derive(Clone, Default)]
pub struct StderrLog(std::sync::Arc<std::sync::Mutex<String>>);

impl StderrLog {
    /// Everything collected so far.
    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// The collected lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits until a collected line contains `needle` and returns it; panics
    /// with the whole log after `within`.
    pub fn wait_for(&self, needle: &str, within: Duration) -> String {
        let (_, found) = poll_until(
            &format!("a server stderr line with {needle:?}"),
            within,
            || self.lines_with(needle).into_iter().next(),
            Option::is_some,
        );
        found.unwrap()
    }

    /// The address of the server's metrics listener (`--metrics-listen`),
    /// from its start-up line, which comes within 10 s.
    pub fn metrics_addr(&self) -> SocketAddr {
        let line = self.wait_for("metrics on http://", Duration::from_secs(10));
        line.split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
    }

    fn push(&self, line: &str) {
        self.0.lock().unwrap().push_str(line);
    }
}

impl Server {
    /// Like [`Server::start_with`], and collects the server's stderr (its
    /// start-up lines included) into the returned [`StderrLog`].
    pub fn start_logged(args: &[&str]) -> (Server, StderrLog) {
        Server::start_bin_logged(std::path::Path::new(env!("CARGO_BIN_EXE_ringlock")), args)
    }

    /// Like [`Server::start_logged`], with another `ringlock` binary (an
    /// older release's: tests/rolling_upgrade.rs).
    pub fn start_bin_logged(bin: &std::path::Path, args: &[&str]) -> (Server, StderrLog) {
        let mut child = Command::new(bin)
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringlock serve");
        let log = StderrLog::default();
        let mut lines = BufReader::new(child.stderr.take().expect("stderr piped"));
        let (addr, io) = loop {
            let mut line = String::new();
            let n = lines.read_line(&mut line).expect("read server stderr");
            if n == 0 {
                let status = child.wait().expect("wait for ringlock");
                panic!(
                    "ringlock serve {args:?} exited ({status}) before listening:\n{}",
                    log.text()
                );
            }
            log.push(&line);
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr: SocketAddr = rest
                    .split_whitespace()
                    .next()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("bad listening line: {line}"));
                let io = rest
                    .split("(io: ")
                    .nth(1)
                    .and_then(|s| s.split([';', ')']).next())
                    .unwrap_or_else(|| panic!("no io in listening line: {line}"))
                    .to_string();
                break (addr, io);
            }
        };
        let wanted = args.windows(2).find(|w| w[0] == "--io").map(|w| w[1]);
        if let Some(wanted) = wanted.filter(|&w| w != "auto") {
            assert_eq!(io, wanted, "asked for --io {wanted}, server runs {io}");
        }
        let collected = log.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
                eprint!("{line}");
                collected.push(&line);
                line.clear();
            }
        });
        let server = Server {
            child: Some(child),
            addr,
            io,
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        (server, log)
    }
}

impl Cluster {
    /// Like [`Cluster::start_with`], with every node's stderr collected
    /// (`logs[i]` is node `i`'s).
    pub fn start_logged(n: usize, io: &str, extra: &[&str]) -> (Cluster, Vec<StderrLog>) {
        let mut cluster = Cluster::configure(n, io, extra);
        let logs = (0..n).map(|i| cluster.start_node_logged(i)).collect();
        cluster.wait_settled(0, Duration::from_secs(10));
        (cluster, logs)
    }

    /// Like [`Cluster::start_node`], with the node's stderr collected.
    pub fn start_node_logged(&mut self, i: usize) -> StderrLog {
        let args = self.node_args(i);
        self.start_node_args(i, &args)
    }

    /// Starts node `i` with `args` instead of [`Cluster::node_args`] (say,
    /// another secret file), its stderr collected.
    pub fn start_node_args(&mut self, i: usize, args: &[String]) -> StderrLog {
        self.start_node_bin_args(
            i,
            std::path::Path::new(env!("CARGO_BIN_EXE_ringlock")),
            args,
        )
    }

    /// Like [`Cluster::start_node_args`], running the `ringlock` binary
    /// `bin` (an older release's: tests/rolling_upgrade.rs).
    pub fn start_node_bin_args(
        &mut self,
        i: usize,
        bin: &std::path::Path,
        args: &[String],
    ) -> StderrLog {
        assert!(self.nodes[i].is_none(), "node {i} is running already");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (server, log) = Server::start_bin_logged(bin, &args);
        assert_eq!(server.addr, self.addrs[i], "node {i} listens elsewhere");
        self.nodes[i] = Some(server);
        log
    }
}

/// Node.js 20 or later and npm on PATH, or why not (the Node.js client's
/// prerequisite: tests/node_client.rs, tests/conformance.rs).
pub fn node_20() -> Result<(), String> {
    let out = Command::new("node")
        .args(["-p", "process.versions.node"])
        .output()
        .map_err(|e| format!("no node on PATH ({e})"))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| format!("node -p process.versions.node said {version:?}"))?;
    if major < 20 {
        return Err(format!("node {version} is older than 20"));
    }
    match Command::new("npm").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("npm --version failed: {}", o.status)),
        Err(e) => Err(format!("no npm on PATH ({e})")),
    }
}

/// Polls until `path` holds a complete line; panics after `within`.
pub fn read_line_file(path: &std::path::Path, within: Duration) -> String {
    let started = std::time::Instant::now();
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

/// Waits for `child` to end and returns its output; kills it and panics,
/// with its stderr, if it has not ended within `within`.
pub fn wait_output(mut child: Child, within: Duration) -> std::process::Output {
    let started = std::time::Instant::now();
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
