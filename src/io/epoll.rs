//! The epoll backend (through mio): the fallback where io_uring is off.
//!
//! Readiness is edge-triggered, so each connection remembers whether it may
//! still have input (`readable`) and is read until the kernel says
//! `WouldBlock`, unless its unsent answers pass [`OUTPUT_PAUSE_BYTES`]: then it
//! is not read from until the client takes them (TCP backpressure). Answers
//! are written from the engine's output buffer at the end of each turn, one
//! `write` per connection.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use std::os::fd::AsRawFd;

use super::{
    Clock, Dialer, Flow, LINGER_MS, LingerQueue, LongestTurn, OUTPUT_PAUSE_BYTES, Session,
    take_final_output,
};
use crate::engine::{ConnId, Now};
use crate::node::{Admission, Node};
use crate::server::LoopConfig;

const LISTENER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);
const DIALER: Token = Token(usize::MAX - 3);

/// Reads per connection per turn before others get their turn.
const READS_PER_TURN: usize = 8;
/// Size of the one receive buffer all connections share.
const READ_BUF: usize = 64 * 1024;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Serving requests.
    Open,
    /// Going away: its last answers (`final_out`) are being written; the
    /// engine has already forgotten it.
    Closing,
    /// Its last answers are written and our side shut; waiting (up to the
    /// deadline) for the client to close, discarding what it sends, so that
    /// closing does not reset the connection before the client read them.
    Lingering { until_ms: u64 },
}

struct Conn {
    stream: TcpStream,
    session: Session,
    phase: Phase,
    /// The kernel may have input we have not read.
    readable: bool,
    /// An event said the client's FIN (or an error) is in: read on to the
    /// end even after a short read, since no further edge will announce it.
    read_closed: bool,
    /// The client closed its sending side.
    eof: bool,
    final_out: Vec<u8>,
}

/// Runs the epoll loop until SIGINT/SIGTERM (a byte on `signals`); returns
/// its longest turn.
pub fn run(
    listener: std::net::TcpListener,
    signals: StdUnixStream,
    mut node: Node,
    clock: Clock,
    config: &LoopConfig,
) -> io::Result<LongestTurn> {
    let mut poll = Poll::new()?;
    let mut listener = Some(TcpListener::from_std(listener));
    if let Some(l) = &mut listener {
        poll.registry().register(l, LISTENER, Interest::READABLE)?;
    }
    signals.set_nonblocking(true)?;
    let mut signals = UnixStream::from_std(signals);
    poll.registry()
        .register(&mut signals, SIGNALS, Interest::READABLE)?;
    let dialer = Dialer::spawn(node.link_timeout())?;
    let wake_fd = dialer.wake().as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&wake_fd), DIALER, Interest::READABLE)?;
    let mut dials = Vec::new();

    let mut state = Loop {
        conns: Slab::with_capacity(1024),
        buf: vec![0u8; READ_BUF],
        ready: Vec::new(),
        dirty: Vec::new(),
        from_engine: Vec::new(),
        lingering: LingerQueue::default(),
        max_conns: config.max_conns,
    };
    let mut events = Events::with_capacity(1024);
    let mut shutting_down_until: Option<u64> = None;
    let mut turns = LongestTurn::default();
    loop {
        let (now, at) = clock.now_precise();
        turns.end(at);
        let timeout = state.timeout_ms(&node, now.ms, shutting_down_until);
        if let Err(e) = wait(
            &mut poll,
            &mut events,
            timeout.map(Duration::from_millis),
            Duration::from_micros(config.spin_us),
        ) && e.kind() != io::ErrorKind::Interrupted
        {
            return Err(e);
        }
        let (now, at) = clock.now_precise();
        turns.begin(at);
        node.tick(now);
        for event in events.iter() {
            match event.token() {
                LISTENER => {
                    if let Some(l) = &listener {
                        state.accept(l, &poll, &mut node, now)?;
                    }
                }
                SIGNALS => {
                    let mut byte = [0u8; 16];
                    while matches!(signals.read(&mut byte), Ok(n) if n > 0) {}
                    if shutting_down_until.is_none() {
                        eprintln!(
                            "ringlock: shutting down: answering waiting acquires, closing connections"
                        );
                        // Closed at once: new clients are refused rather than
                        // queued on a socket nobody will accept from.
                        if let Some(mut l) = listener.take() {
                            poll.registry().deregister(&mut l)?;
                        }
                        if let Some(to) = node.leave(now) {
                            eprintln!("ringlock: handed the active role over to {to}");
                        }
                        state.close_all(&mut node, now);
                        shutting_down_until = Some(now.ms + LINGER_MS);
                    }
                }
                DIALER => {
                    for (peer, result) in dialer.results() {
                        match result {
                            Ok(stream) if shutting_down_until.is_none() => {
                                state.adopt_peer_link(stream, peer, &poll, &mut node, now)?;
                            }
                            Ok(_) => {}
                            Err(_) => node.dial_failed(now, peer),
                        }
                    }
                }
                Token(c) => {
                    if let Some(conn) = state.conns.get_mut(c) {
                        if event.is_readable() || event.is_read_closed() {
                            conn.readable = true;
                            conn.read_closed |= event.is_read_closed() || event.is_error();
                            state.ready.push(c as ConnId);
                        }
                        if event.is_writable() && !matches!(conn.phase, Phase::Lingering { .. }) {
                            state.dirty.push(c as ConnId);
                        }
                    }
                }
            }
        }
        state.read_ready(&mut node, now);
        state.flush(&mut node, now);
        state.expire_lingering(now.ms);
        if shutting_down_until.is_none() {
            dials.clear();
            node.take_dials(now, &mut dials);
            for (peer, addr) in dials.drain(..) {
                dialer.dial(peer, addr);
            }
        }
        if shutting_down_until.is_some_and(|until| state.conns.is_empty() || now.ms >= until) {
            turns.end(clock.now_precise().1);
            return Ok(turns);
        }
    }
}

struct Loop {
    conns: Slab<Conn>,
    buf: Vec<u8>,
    /// Connections to read from this turn.
    ready: Vec<ConnId>,
    /// Connections with output to write this turn.
    dirty: Vec<ConnId>,
    /// Scratch for [`Engine::take_dirty`].
    from_engine: Vec<ConnId>,
    lingering: LingerQueue,
    max_conns: usize,
}

impl Loop {
    /// How long the next poll may sleep: until the engine's next timer, a
    /// lingering connection's deadline or the end of shutdown; not at all if
    /// some connection still has input to read.
    fn timeout_ms(&self, node: &Node, now_ms: u64, shutdown: Option<u64>) -> Option<u64> {
        if !self.ready.is_empty() {
            return Some(0);
        }
        node.next_deadline()
            .into_iter()
            .chain(self.lingering.next_deadline())
            .chain(shutdown)
            .min()
            .map(|deadline| deadline.saturating_sub(now_ms))
    }

    fn accept(
        &mut self,
        listener: &TcpListener,
        poll: &Poll,
        node: &mut Node,
        now: Now,
    ) -> io::Result<()> {
        loop {
            let (stream, remote) = match listener.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or memory: leave the backlog for
                    // later rather than stop serving everyone.
                    eprintln!("ringlock: accept: {e}");
                    return Ok(());
                }
            };
            let admission = node.admit(self.conns.len(), self.max_conns);
            if admission == Admission::Refuse {
                drop(stream);
                continue;
            }
            stream.set_nodelay(true)?;
            let id = self.insert(stream, poll)?;
            if admission == Admission::PeerOnly {
                node.open_peer_only(now, id);
            } else {
                node.open(id);
            }
            node.set_remote(id, remote);
        }
    }

    /// Registers a new connection's socket and gives it a slot; it is read
    /// this turn.
    fn insert(&mut self, mut stream: TcpStream, poll: &Poll) -> io::Result<ConnId> {
        let entry = self.conns.vacant_entry();
        let id = entry.key();
        poll.registry().register(
            &mut stream,
            Token(id),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        entry.insert(Conn {
            stream,
            session: Session::new(),
            phase: Phase::Open,
            readable: true,
            read_closed: false,
            eof: false,
            final_out: Vec::new(),
        });
        self.ready.push(id as ConnId);
        Ok(id as ConnId)
    }

    /// Takes a dialed peer link into the loop.
    fn adopt_peer_link(
        &mut self,
        stream: std::net::TcpStream,
        peer: usize,
        poll: &Poll,
        node: &mut Node,
        now: Now,
    ) -> io::Result<()> {
        let remote = stream.peer_addr().ok();
        let id = self.insert(TcpStream::from_std(stream), poll)?;
        node.outbound_open(now, id, peer);
        if let Some(remote) = remote {
            node.set_remote(id, remote);
        }
        Ok(())
    }

    /// Reads from the connections that may have input, up to
    /// [`READS_PER_TURN`] reads each; those that still may are kept for the
    /// next turn.
    fn read_ready(&mut self, node: &mut Node, now: Now) {
        let mut ready = std::mem::take(&mut self.ready);
        ready.sort_unstable();
        ready.dedup();
        for &id in &ready {
            let Some(conn) = self.conns.get_mut(id as usize) else {
                continue;
            };
            for _ in 0..READS_PER_TURN {
                let mut flow = Flow::Open;
                if conn.phase == Phase::Open {
                    if node.output_mut(id).len() > OUTPUT_PAUSE_BYTES {
                        break; // backpressure: go on once the client catches up
                    }
                    if conn.session.has_stash() {
                        flow = conn.session.resume(node, now, id);
                    }
                }
                if flow == Flow::Open && conn.session.has_stash() {
                    continue;
                }
                if flow == Flow::Open {
                    if !conn.readable || conn.eof {
                        break;
                    }
                    match conn.stream.read(&mut self.buf) {
                        Ok(0) => {
                            conn.eof = true;
                            conn.readable = false;
                        }
                        Ok(n) if conn.phase == Phase::Open => {
                            // A short read emptied the socket: whatever
                            // arrives next raises a new edge, so asking
                            // again would only hear WouldBlock (one wasted
                            // syscall per request in ping-pong).
                            if n < self.buf.len() && !conn.read_closed {
                                conn.readable = false;
                            }
                            flow = conn.session.feed(node, now, id, &self.buf[..n]);
                        }
                        Ok(_) => {} // closing: input is discarded
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => conn.readable = false,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            conn.eof = true;
                            conn.readable = false;
                        }
                    }
                }
                match flow {
                    Flow::Open if conn.readable && !conn.eof => {}
                    Flow::Open | Flow::Paused => break,
                    Flow::Broken => {
                        conn.final_out = take_final_output(node, now, id);
                        conn.phase = Phase::Closing;
                        self.dirty.push(id);
                        break;
                    }
                }
            }
            if conn.eof && matches!(conn.phase, Phase::Lingering { .. }) {
                self.conns.remove(id as usize);
                continue;
            }
            if conn.eof && conn.phase == Phase::Open {
                // The client sent all it will. What was decided is sent; its
                // waiting acquires are withdrawn (a grant must never go to a
                // client that cannot take it). See docs/protocol.md.
                conn.final_out = take_final_output(node, now, id);
                conn.phase = Phase::Closing;
                self.dirty.push(id);
            }
        }
        ready.retain(|&id| {
            self.conns.get(id as usize).is_some_and(|c| {
                (c.session.has_stash() || (c.readable && !c.eof))
                    && (c.phase != Phase::Open || node.output_mut(id).len() <= OUTPUT_PAUSE_BYTES)
            })
        });
        self.ready = ready;
    }

    /// Writes the answers of every connection that has some.
    fn flush(&mut self, node: &mut Node, now: Now) {
        let now_ms = now.ms;
        let mut dirty = std::mem::take(&mut self.dirty);
        node.take_dirty(now, &mut self.from_engine);
        dirty.extend_from_slice(&self.from_engine);
        // Connections the node gave up on: closed like a protocol break.
        node.take_doomed(now, &mut self.from_engine);
        for &id in &self.from_engine {
            if let Some(conn) = self.conns.get_mut(id as usize)
                && conn.phase == Phase::Open
            {
                conn.final_out = take_final_output(node, now, id);
                conn.phase = Phase::Closing;
                dirty.push(id);
            }
        }
        for id in dirty.drain(..) {
            let Some(conn) = self.conns.get_mut(id as usize) else {
                continue;
            };
            let result = match conn.phase {
                Phase::Open => {
                    let out = node.output_mut(id);
                    let paused = out.len() > OUTPUT_PAUSE_BYTES;
                    let result = write_some(&mut conn.stream, out);
                    if paused
                        && out.len() <= OUTPUT_PAUSE_BYTES
                        && (conn.readable || conn.session.has_stash())
                    {
                        self.ready.push(id); // the client caught up
                    }
                    result
                }
                Phase::Closing => write_some(&mut conn.stream, &mut conn.final_out),
                Phase::Lingering { .. } => Ok(()),
            };
            if result.is_err() {
                self.drop_conn(node, now, id);
                continue;
            }
            let conn = &mut self.conns[id as usize];
            if conn.phase == Phase::Closing && conn.final_out.is_empty() {
                let _ = conn.stream.shutdown(Shutdown::Write);
                if conn.eof {
                    self.drop_conn(node, now, id);
                } else {
                    conn.phase = Phase::Lingering {
                        until_ms: now_ms + LINGER_MS,
                    };
                    self.lingering.push(now_ms + LINGER_MS, id);
                    // Keep reading (and discarding) until the client closes.
                    self.ready.push(id);
                }
            }
        }
        self.dirty = dirty;
    }

    /// Closes the lingering connections whose client closed (their input is
    /// read and discarded by [`Loop::read_ready`]) or whose deadline passed.
    fn expire_lingering(&mut self, now_ms: u64) {
        while let Some((until, id)) = self.lingering.pop_due(now_ms) {
            if self
                .conns
                .get(id as usize)
                .is_some_and(|c| c.phase == Phase::Lingering { until_ms: until })
            {
                self.conns.remove(id as usize);
            }
        }
    }

    /// Begins closing every connection (shutdown): each gets its last answers.
    fn close_all(&mut self, node: &mut Node, now: Now) {
        for (id, conn) in self.conns.iter_mut() {
            if conn.phase == Phase::Open {
                conn.final_out = take_final_output(node, now, id as ConnId);
                conn.phase = Phase::Closing;
                self.dirty.push(id as ConnId);
            }
        }
    }

    /// Closes a connection now (its peer is gone).
    fn drop_conn(&mut self, node: &mut Node, now: Now, id: ConnId) {
        let conn = self.conns.remove(id as usize);
        if conn.phase == Phase::Open {
            node.close(now, id);
        }
    }
}

/// Writes as much of `out` as the socket takes, removing it from the front.
/// `Err` means the connection is dead.
fn write_some(stream: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    let mut written = 0;
    while written < out.len() {
        match stream.write(&out[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.drain(..written);
    Ok(())
}

/// Waits for events, at most `timeout` (forever if `None`). With a `spin`
/// (`--spin-us`), polls without sleeping for up to that long first, then
/// sleeps for the rest of the timeout like the plain wait: an idle process
/// does not keep its core busy. Public for the load generator, whose
/// `--spin-us` is the same.
pub fn wait(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Option<Duration>,
    spin: Duration,
) -> io::Result<()> {
    if !spin.is_zero() {
        let limit = spin.min(timeout.unwrap_or(Duration::MAX));
        let start = std::time::Instant::now();
        loop {
            poll.poll(events, Some(Duration::ZERO))?;
            if !events.is_empty() {
                return Ok(());
            }
            let spun = start.elapsed();
            if spun >= limit {
                return poll.poll(events, timeout.map(|t| t.saturating_sub(spun)));
            }
            std::hint::spin_loop();
        }
    }
    poll.poll(events, timeout)
}
