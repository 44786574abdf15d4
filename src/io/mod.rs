//! The event loops that move bytes between sockets and the engine.
//!
//! Both backends share what is not about syscalls: the [`Clock`], the
//! per-connection [`Lifecycle`] (open, paused, closing, lingering, closed)
//! with its [`Session`] that cuts received bytes into requests and feeds
//! them to the engine, the limits below and their [`LoopConfig`]. `uring`
//! drives io_uring (provided buffer ring, multishot accept, one submit per
//! turn); `epoll` is the fallback for kernels and containers where io_uring
//! is off.

pub mod epoll;
// The io_uring backend is the one place with unsafe code (the crate denies
// it everywhere else): buffers shared with the kernel, submissions pointing
// into memory the kernel uses until their completions arrive, descriptors
// born in completions. Each unsafe block there says why it is sound.
#[allow(unsafe_code)]
pub mod uring;

pub use ringlock_core::{lifecycle, session};

pub use lifecycle::{Lifecycle, Step};
pub use session::{Flow, LINGER_MS, OUTPUT_PAUSE_BYTES, Session, take_final_output};

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cluster::PeerId;
use crate::engine::Now;
use crate::node::Node;

/// What the event loops need to know besides the engine.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub max_conns: usize,
    /// `--spin-us`.
    pub spin_us: u64,
    /// TLS for every connection, if the node has it.
    pub tls: Option<LoopTls>,
    /// With `--metrics-listen`: where the node's snapshots go.
    pub metrics: Option<crate::metrics::Shared>,
}

impl LoopConfig {
    /// Hands the snapshot the node took this turn, if any, to the metrics
    /// listener.
    pub fn publish(&self, node: &mut Node) {
        if let (Some(shared), Some(snapshot)) = (&self.metrics, node.take_snapshot()) {
            crate::metrics::publish(shared, snapshot);
        }
    }
}

/// TLS as the loops use it.
#[derive(Debug, Clone)]
pub struct LoopTls {
    /// The configurations in force (reloaded on SIGHUP by another thread).
    pub tls: std::sync::Arc<crate::tls::Tls>,
    /// How long a new connection's handshake may take before it is closed.
    pub handshake_ms: u64,
}

impl LoopTls {
    /// The lifecycle of a connection just accepted.
    pub fn accepted(&self, now_ms: u64) -> Result<Lifecycle, String> {
        let configs = self.tls.current();
        let conn = rustls::ServerConnection::new(configs.server.clone())
            .map_err(|e| format!("cannot start TLS: {e}"))?;
        Ok(Lifecycle::with_tls(
            rustls::Connection::Server(conn),
            now_ms.saturating_add(self.handshake_ms),
            configs.peer_check.clone(),
            self.tls.acl(),
        ))
    }

    /// The lifecycle of a link just dialed to the peer at `addr`.
    pub fn dialed(&self, addr: &str, now_ms: u64) -> Result<Lifecycle, String> {
        let configs = self.tls.current();
        let Some(client) = &configs.peer_client else {
            return Err("no TLS configuration for peer links".into());
        };
        let name = crate::tls::peer_server_name(addr)?;
        let conn = rustls::ClientConnection::new(client.clone(), name)
            .map_err(|e| format!("cannot start TLS to {addr}: {e}"))?;
        Ok(Lifecycle::with_tls(
            rustls::Connection::Client(conn),
            now_ms.saturating_add(self.handshake_ms),
            None,
            None,
        ))
    }
}

/// A new connection's lifecycle: plain, or TLS if the node has it. `Err`:
/// TLS could not start (the connection is dropped; the reason logged).
pub fn accepted_lifecycle(tls: Option<&LoopTls>, now_ms: u64) -> Result<Lifecycle, String> {
    match tls {
        None => Ok(Lifecycle::new()),
        Some(tls) => tls.accepted(now_ms),
    }
}

/// A dialed peer link's lifecycle, like [`accepted_lifecycle`].
pub fn dialed_lifecycle(
    tls: Option<&LoopTls>,
    node: &Node,
    peer: PeerId,
    now_ms: u64,
) -> Result<Lifecycle, String> {
    match tls {
        None => Ok(Lifecycle::new()),
        Some(tls) => match node.cluster() {
            Some(cluster) => tls.dialed(cluster.peer_addr(peer), now_ms),
            None => Err("a dial without a cluster".into()),
        },
    }
}

/// Dials peers off the loop, so that a slow or unreachable peer never
/// blocks it. The loop asks with [`Dialer::dial`]; a thread takes the
/// requests and runs each dial on a thread of its own (the cluster has at
/// most one dial per peer under way, so a dial to a silent peer never
/// holds up the dial to another); each result comes back through
/// [`Dialer::results`] with a byte on [`Dialer::wake`], which the loop
/// watches like any socket.
///
/// Fields drop in order: `requests` first, so the thread takes no new dial
/// and ends; `results` next, so a dial still under way finds no receiver
/// and its thread returns before writing a wake byte; `wake` last. A wake
/// byte racing with the drop meets a closed socket, which is an error for
/// the thread (sent with `MSG_NOSIGNAL`), never a `SIGPIPE` for the
/// process.
pub struct Dialer {
    requests: std::sync::mpsc::Sender<(PeerId, String)>,
    results: std::sync::mpsc::Receiver<(PeerId, std::io::Result<std::net::TcpStream>)>,
    wake: std::os::unix::net::UnixStream,
}

/// How long one dial may take before it counts as failed.
pub const DIAL_TIMEOUT_MS: u64 = 500;

/// Within a dial, how soon another connection attempt goes out while the
/// first is unanswered: a SYN lost in a partition that has just healed is
/// not retransmitted by TCP for a second, so a dial that waited on it alone
/// would hear the peer only after its whole [`DIAL_TIMEOUT_MS`] and the
/// next dial. The first attempt to connect wins; the others are closed.
pub const DIAL_AGAIN_MS: u64 = 50;

/// Connects to `addr` as [`Dialer`] does: a new attempt every
/// [`DIAL_AGAIN_MS`] while none has connected, for at most
/// [`DIAL_TIMEOUT_MS`] in all. An attempt refused (nothing listens there)
/// fails the dial at once unless another is still under way.
fn dial_overlapping(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use mio::unix::SourceFd;
    use std::os::fd::AsRawFd;
    let mut poll = mio::Poll::new()?;
    let mut events = mio::Events::with_capacity(16);
    let start = Instant::now();
    let deadline = start + std::time::Duration::from_millis(DIAL_TIMEOUT_MS);
    let again = std::time::Duration::from_millis(DIAL_AGAIN_MS);
    let most = (DIAL_TIMEOUT_MS / DIAL_AGAIN_MS) as usize;
    // Attempts by token; `None` once failed.
    let mut tries: Vec<Option<socket2::Socket>> = Vec::new();
    let mut next = start;
    let mut last_error = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(last_error.unwrap_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "dial timed out")
            }));
        }
        if now >= next && tries.len() < most {
            next = now + again;
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            socket.set_nonblocking(true)?;
            match socket.connect(&addr.into()) {
                Ok(()) => return Ok(socket.into()),
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                    let fd = socket.as_raw_fd();
                    poll.registry().register(
                        &mut SourceFd(&fd),
                        mio::Token(tries.len()),
                        mio::Interest::WRITABLE,
                    )?;
                    tries.push(Some(socket));
                }
                Err(e) => last_error = Some(e),
            }
        }
        let pending = tries.iter().filter(|t| t.is_some()).count();
        if pending == 0 && last_error.is_some() {
            // Refused (or unreachable) with nothing else under way.
            return Err(last_error.unwrap_or_else(|| std::io::Error::other("dial failed")));
        }
        let until = if tries.len() < most {
            next.min(deadline)
        } else {
            deadline
        };
        match poll.poll(&mut events, Some(until.saturating_duration_since(now))) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for event in &events {
            let Some(slot) = tries.get_mut(event.token().0) else {
                continue;
            };
            let Some(socket) = slot.take() else { continue };
            match socket.take_error() {
                Ok(None) if socket.peer_addr().is_ok() => return Ok(socket.into()),
                Ok(None) => *slot = Some(socket), // not connected yet
                Ok(Some(e)) | Err(e) => {
                    last_error = Some(e);
                    let fd = socket.as_raw_fd();
                    let _ = poll.registry().deregister(&mut SourceFd(&fd));
                }
            }
        }
    }
}

impl Dialer {
    /// Starts the dial thread. Each connected link gets `TCP_USER_TIMEOUT`
    /// and keepalive of `link_timeout` (the peer timeout): data the peer
    /// has not acknowledged for that long fails the socket, instead of TCP
    /// retransmitting into a partition with an ever longer back-off.
    pub fn spawn(link_timeout: std::time::Duration) -> std::io::Result<Dialer> {
        use std::net::ToSocketAddrs;
        // What can fail fails before the thread exists: on an error here the
        // pair (and the channels) drop and close as this function returns.
        let (wake, wake_writer) = std::os::unix::net::UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        let (requests, request_rx) = std::sync::mpsc::channel::<(PeerId, String)>();
        let (result_tx, results) = std::sync::mpsc::channel();
        // The thread's ends (`request_rx`, `result_tx`, `wake_writer`) move
        // into its closure. If the thread cannot be started, `spawn` drops
        // the closure, closing them, before it returns the error; the loop's
        // ends then drop as `?` returns. Either way no descriptor leaks and
        // no thread is left with a socket whose other end is gone.
        std::thread::Builder::new()
            .name("ringlock-dialer".into())
            .spawn(move || {
                let fail = |peer: PeerId, why: &str| {
                    let failed = std::io::Error::other(why.to_string());
                    let sent = result_tx.send((peer, Err(failed))).is_ok();
                    let _ = socket2::SockRef::from(&wake_writer)
                        .send_with_flags(&[1], libc::MSG_NOSIGNAL);
                    sent
                };
                for (peer, addr) in request_rx {
                    let tx = result_tx.clone();
                    let Ok(wake) = wake_writer.try_clone() else {
                        if !fail(peer, "cannot start a dial") {
                            return;
                        }
                        continue;
                    };
                    let one = move || {
                        let result = addr.to_socket_addrs().and_then(|mut addrs| {
                            let addr = addrs.next().ok_or_else(|| {
                                std::io::Error::other(format!("{addr} resolves to nothing"))
                            })?;
                            let stream = dial_overlapping(addr)?;
                            stream.set_nodelay(true)?;
                            stream.set_nonblocking(true)?;
                            let socket = socket2::SockRef::from(&stream);
                            socket.set_tcp_user_timeout(Some(link_timeout))?;
                            // Keepalive counts in whole seconds: at least 1.
                            let second = std::time::Duration::from_secs(1);
                            let probes = socket2::TcpKeepalive::new()
                                .with_time(link_timeout.max(second))
                                .with_interval(second)
                                .with_retries(3);
                            socket.set_tcp_keepalive(&probes)?;
                            Ok(stream)
                        });
                        if tx.send((peer, result)).is_err() {
                            return; // the loop is gone
                        }
                        let _ =
                            socket2::SockRef::from(&wake).send_with_flags(&[1], libc::MSG_NOSIGNAL);
                    };
                    let started = std::thread::Builder::new()
                        .name("ringlock-dial".into())
                        .spawn(one);
                    // No thread for it: the dial fails, and is retried.
                    if started.is_err() && !fail(peer, "cannot start a dial thread") {
                        return;
                    }
                }
            })?;
        Ok(Dialer {
            requests,
            results,
            wake,
        })
    }

    pub fn dial(&self, peer: PeerId, addr: String) {
        let _ = self.requests.send((peer, addr));
    }

    /// The results ready now (after draining the wake socket).
    pub fn results(&self) -> Vec<(PeerId, std::io::Result<std::net::TcpStream>)> {
        use std::io::Read;
        let mut buf = [0u8; 64];
        while matches!((&self.wake).read(&mut buf), Ok(n) if n > 0) {}
        self.results.try_iter().collect()
    }

    /// The socket that becomes readable when a result is ready.
    pub fn wake(&self) -> &std::os::unix::net::UnixStream {
        &self.wake
    }
}

/// Reads the time for the engine: monotonic ms since start, and the wall
/// clock for tokens.
pub struct Clock {
    start: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now(&self) -> Now {
        self.now_precise().0
    }

    /// [`Clock::now`], and the monotonic reading behind it at full
    /// resolution (for [`LongestTurn`]).
    pub fn now_precise(&self) -> (Now, Duration) {
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let elapsed = self.start.elapsed();
        let now = Now {
            ms: elapsed.as_millis() as u64,
            us: elapsed.as_micros() as u64,
            unix_ns,
        };
        (now, elapsed)
    }
}

/// The longest loop turn so far: from the loop waking up (the clock read
/// after its wait) to it going back to wait (the clock read before the
/// next one). Both readings are the ones the loops take anyway, once per
/// turn; a spin before sleeping (`--spin-us`) is part of the wait.
#[derive(Debug, Default, Clone, Copy)]
pub struct LongestTurn {
    started: Option<Duration>,
    longest: Duration,
}

impl LongestTurn {
    /// The loop woke up at `at` (a [`Clock::now_precise`] reading).
    pub fn begin(&mut self, at: Duration) {
        self.started = Some(at);
    }

    /// The loop is about to wait again, at `at`: returns how long the turn
    /// took (`None` before the first one).
    pub fn end(&mut self, at: Duration) -> Option<Duration> {
        let started = self.started.take()?;
        let turn = at.saturating_sub(started);
        self.longest = self.longest.max(turn);
        Some(turn)
    }

    /// The longest turn ended so far.
    pub fn longest(&self) -> Duration {
        self.longest
    }
}

/// Which backend `--io` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoChoice {
    /// io_uring where the kernel allows it, epoll where it does not.
    Auto,
    Uring,
    Epoll,
}

/// Raises the soft limit of open files to the hard limit, so that
/// `--max-conns` is not cut short by a default of 1024. Returns the limit
/// now in force, if known.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            limit = raised;
        }
    }
    limit.current
}

/// Turns transparent huge pages off for this process (`prctl` with
/// `PR_SET_THP_DISABLE`), whatever mimalloc asks for (it advises huge pages
/// for its arenas) or the system's default is. With them, the kernel fills
/// a whole 2 MiB page at its first touch: while the lock table grew, every
/// few dozen loop turns one paid for one, about 4 ms each on the
/// development VM and more where two coincided (docs/architecture.md).
/// With 4 KiB pages the same work is spread thin over every turn. False if the
/// kernel does not allow it; the server runs either way.
pub fn disable_huge_pages() -> bool {
    rustix::thread::disable_transparent_huge_pages(true).is_ok()
}

/// Opens the listening socket: `SO_REUSEADDR` (a restarted node takes its
/// port back at once), non-blocking, a deep backlog for connection bursts.
pub fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_turn_counts_from_waking_to_waiting_again() {
        let ms = Duration::from_millis;
        let mut turns = LongestTurn::default();
        turns.end(ms(5)); // before the first wait: no turn yet
        assert_eq!(turns.longest(), Duration::ZERO);
        for (woke, waits) in [(10, 12), (20, 27), (40, 41)] {
            turns.begin(ms(woke));
            turns.end(ms(waits));
        }
        assert_eq!(turns.longest(), ms(7));
        // The time asleep between turns does not count.
        turns.end(ms(1_000));
        assert_eq!(turns.longest(), ms(7));
    }
}
