//! Test harness: starts the real `ringlock` binary on a free loopback port
//! and stops it when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The io backends every server test runs under.
pub const BACKENDS: [&str; 2] = ["uring", "epoll"];

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
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on our own child's pid has no memory effects.
            unsafe {
                libc::kill(child.id() as i32, sig);
            }
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
