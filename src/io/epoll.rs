//! The epoll backend (through mio): the fallback where io_uring is off.
//!
//! Readiness is edge-triggered, so each connection remembers whether it may
//! still have input (`readable`) and is read until the kernel says
//! `WouldBlock`, unless its [`Lifecycle`] says not to (unsent answers past
//! [`super::OUTPUT_PAUSE_BYTES`]: TCP backpressure until the client takes
//! them). Answers are written at the end of each turn, until the socket
//! takes no more. A busy link read in batches
//! ([`ringlock_core::read_batch`]) is registered for writability only
//! between its reads, so that its input wakes nobody, and read at each
//! batch's time (a timerfd wakes the loop then: epoll's own timeout counts
//! whole milliseconds). Everything else about a connection's life
//! (pausing, closing, lingering) is the [`Lifecycle`]'s; this file has the
//! syscalls.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, timerfd_create, timerfd_settime,
};

use super::lifecycle::Phase;
use super::{
    Clock, Dialer, Lifecycle, LongestTurn, LoopConfig, LoopTls, Step, accepted_lifecycle,
    dialed_lifecycle,
};
use crate::driver::Driver;
use crate::engine::{ConnId, Now};
use crate::node::{Admission, Node};
use ringlock_core::read_batch::NextRead;

const LISTENER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);
const DIALER: Token = Token(usize::MAX - 3);
const TIMER: Token = Token(usize::MAX - 4);

/// Reads per connection per turn before others get their turn.
const READS_PER_TURN: usize = 8;
/// Size of the one receive buffer all connections share.
const READ_BUF: usize = 64 * 1024;

struct Conn {
    stream: TcpStream,
    life: Lifecycle,
    /// The kernel may have input we have not read.
    readable: bool,
    /// An event said the client's FIN (or an error) is in: read on to the
    /// end even after a short read, since no further edge will announce it.
    read_closed: bool,
    /// It is in [`Loop::ready`] (once at most: the list keeps the order in
    /// which input became ready, which is the order requests are served).
    in_ready: bool,
    /// Read in batches: registered for writability only, so that input
    /// wakes nobody until its next read ([`NextRead::At`]).
    batched: bool,
    /// This turn's read is a batch's: one that finds the socket empty ends
    /// the batching ([`Lifecycle::read_nothing`]).
    batch_read: bool,
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
    let mut sources = Sources::new(listener, signals, &node)?;
    let mut dials = Vec::new();

    let mut state = Loop {
        conns: Slab::with_capacity(1024),
        buf: vec![0u8; READ_BUF],
        ready: Vec::new(),
        dirty: Vec::new(),
        from_node: Vec::new(),
        driver: Driver::new(
            config.max_conns,
            config.tls.as_ref().map(|t| t.handshake_ms),
        ),
        tls: config.tls.clone(),
    };
    let mut events = Events::with_capacity(1024);
    let mut turns = LongestTurn::default();
    loop {
        let (now, at) = clock.now_precise();
        if let Some(turn) = turns.end(at) {
            node.turn_ended(turn);
        }
        // What the turn published reaches the metrics listener before the
        // loop sleeps.
        config.publish(&mut node);
        let timeout = state.timeout(&node, now, &mut sources.timer)?;
        if let Err(e) = wait(
            &mut sources.poll,
            &mut events,
            timeout,
            Duration::from_micros(config.spin_us),
        ) && e.kind() != io::ErrorKind::Interrupted
        {
            return Err(e);
        }
        let (now, at) = clock.now_precise();
        turns.begin(at);
        node.tick(now);
        for event in events.iter() {
            state.on_event(event, &mut sources, &mut node, now);
        }
        if state.driver.accept_retry_due(now.ms)
            && let Some(l) = &sources.listener
        {
            state.accept(l, &sources.poll, &mut node, now);
        }
        state.batch_reads_due(now);
        state.read_ready(&mut node, now, &sources.poll);
        state.flush(&mut node, now);
        state.expire_lingering(now.ms);
        state.expire_handshakes(&mut node, now);
        state.driver.take_dials(&mut node, now, &mut dials);
        for (peer, addr) in dials.drain(..) {
            sources.dialer.dial(peer, addr);
        }
        state.driver.end_turn(&mut node, now);
        if state.driver.finished(now.ms, state.conns.len()) {
            let _ = turns.end(clock.now_precise().1);
            return Ok(turns);
        }
    }
}

/// What the loop polls besides its connections.
struct Sources {
    poll: Poll,
    /// `None` once shutting down: new clients are refused rather than
    /// queued on a socket nobody will accept from.
    listener: Option<TcpListener>,
    signals: UnixStream,
    dialer: Dialer,
    /// Wakes the loop for a batched read between milliseconds.
    timer: FineTimer,
}

impl Sources {
    fn new(
        listener: std::net::TcpListener,
        signals: StdUnixStream,
        node: &Node,
    ) -> io::Result<Sources> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        signals.set_nonblocking(true)?;
        let mut signals = UnixStream::from_std(signals);
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        let dialer = Dialer::spawn(node.link_timeout())?;
        let wake_fd = dialer.wake().as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&wake_fd), DIALER, Interest::READABLE)?;
        let timer = FineTimer::new()?;
        poll.registry().register(
            &mut SourceFd(&timer.fd.as_raw_fd()),
            TIMER,
            Interest::READABLE,
        )?;
        Ok(Sources {
            poll,
            listener: Some(listener),
            signals,
            dialer,
            timer,
        })
    }
}

struct Loop {
    conns: Slab<Conn>,
    buf: Vec<u8>,
    /// Connections to read from this turn.
    ready: Vec<ConnId>,
    /// Connections with output to write this turn.
    dirty: Vec<ConnId>,
    /// Scratch for [`Node::take_dirty`] and [`Node::take_doomed`].
    from_node: Vec<ConnId>,
    /// The per-turn policy: admission, deadlines, accept retry, shutdown.
    driver: Driver,
    tls: Option<LoopTls>,
}

impl Loop {
    /// One event the kernel reported: an accept, a signal, dial results,
    /// or a connection's readiness.
    fn on_event(&mut self, event: &Event, src: &mut Sources, node: &mut Node, now: Now) {
        match event.token() {
            LISTENER => {
                if let Some(l) = &src.listener {
                    self.accept(l, &src.poll, node, now);
                }
            }
            SIGNALS => {
                let mut byte = [0u8; 16];
                while matches!(src.signals.read(&mut byte), Ok(n) if n > 0) {}
                if self.driver.shut_down(node, now).is_some() {
                    if let Some(mut l) = src.listener.take() {
                        let _ = src.poll.registry().deregister(&mut l);
                    }
                    self.close_all(node, now);
                }
            }
            TIMER => src.timer.fired(),
            DIALER => {
                for (peer, result) in src.dialer.results() {
                    match result {
                        Ok(stream) if !self.driver.is_shutting_down() => {
                            self.adopt_peer_link(stream, peer, &src.poll, node, now);
                        }
                        Ok(_) => {}
                        Err(_) => node.dial_failed(now, peer),
                    }
                }
            }
            Token(c) => {
                if let Some(conn) = self.conns.get_mut(c) {
                    let readable = event.is_readable() || event.is_read_closed();
                    if readable {
                        conn.readable = true;
                        conn.read_closed |= event.is_read_closed() || event.is_error();
                    }
                    if event.is_writable() && conn.life.linger_until().is_none() {
                        self.dirty.push(ConnId::from_index(c));
                    }
                    if readable {
                        self.mark_ready(ConnId::from_index(c));
                    }
                }
            }
        }
    }

    /// How long the next poll may sleep: as the driver says; not at all if
    /// some connection still has input to read. A batched read due before
    /// the driver's next millisecond deadline sets the fine timer, whose
    /// event ends the poll on time.
    fn timeout(
        &self,
        node: &Node,
        now: Now,
        timer: &mut FineTimer,
    ) -> io::Result<Option<Duration>> {
        if !self.ready.is_empty() {
            return Ok(Some(Duration::ZERO));
        }
        let wait = self
            .driver
            .timeout_ms(node, now.ms)
            .map(Duration::from_millis);
        let Some(read_at) = self.driver.next_read_us() else {
            return Ok(wait);
        };
        let until_read = Duration::from_micros(read_at.saturating_sub(now.us));
        if until_read.is_zero() {
            return Ok(Some(Duration::ZERO));
        }
        if wait.is_none_or(|w| until_read < w) {
            timer.arm(now.us, read_at)?;
        }
        Ok(wait)
    }

    /// The batched reads due at `now`: each connection whose lifecycle
    /// still says so is read this turn, without waiting.
    fn batch_reads_due(&mut self, now: Now) {
        while let Some(id) = self.driver.due_read(now.us) {
            let Some(conn) = self.conns.get_mut(id.index()) else {
                continue; // stale: its connection is gone
            };
            if matches!(conn.life.next_read(), NextRead::At(at) if at <= now.us) {
                conn.readable = true;
                conn.batch_read = true;
                self.mark_ready(id);
            }
        }
    }

    /// Accepts until the backlog is empty. A failure of one connection
    /// drops that connection; a failed accept (out of descriptors, say)
    /// leaves the backlog for the driver's retry.
    fn accept(&mut self, listener: &TcpListener, poll: &Poll, node: &mut Node, now: Now) {
        loop {
            let (stream, remote) = match listener.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.driver.accept_failed(node, now, &e);
                    return;
                }
            };
            let admission = self.driver.admit(node, self.conns.len());
            if admission == Admission::Refuse {
                drop(stream);
                continue;
            }
            if let Err(e) = stream.set_nodelay(true) {
                self.driver.setup_failed(node, now, "TCP_NODELAY", &e);
                continue;
            }
            let life = match accepted_lifecycle(self.tls.as_ref(), now.ms) {
                Ok(life) => life,
                Err(e) => {
                    self.driver.setup_failed(node, now, "TLS", &e);
                    continue;
                }
            };
            let id = match self.insert(stream, life, now.ms, poll) {
                Ok(id) => id,
                Err(e) => {
                    self.driver
                        .setup_failed(node, now, "epoll registration", &e);
                    continue;
                }
            };
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
    fn insert(
        &mut self,
        mut stream: TcpStream,
        life: Lifecycle,
        now_ms: u64,
        poll: &Poll,
    ) -> io::Result<ConnId> {
        let entry = self.conns.vacant_entry();
        let id = entry.key();
        poll.registry().register(
            &mut stream,
            Token(id),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.driver
            .opened(now_ms, ConnId::from_index(id), life.is_tls());
        entry.insert(Conn {
            stream,
            life,
            readable: true,
            read_closed: false,
            in_ready: false,
            batched: false,
            batch_read: false,
        });
        self.mark_ready(ConnId::from_index(id));
        Ok(ConnId::from_index(id))
    }

    /// Takes a dialed peer link into the loop.
    fn adopt_peer_link(
        &mut self,
        stream: std::net::TcpStream,
        peer: crate::cluster::PeerId,
        poll: &Poll,
        node: &mut Node,
        now: Now,
    ) {
        let remote = stream.peer_addr().ok();
        let life = match dialed_lifecycle(self.tls.as_ref(), node, peer, now.ms) {
            Ok(life) => life,
            Err(e) => {
                self.driver.setup_failed(node, now, "TLS", &e);
                node.dial_failed(now, peer);
                return;
            }
        };
        let id = match self.insert(TcpStream::from_std(stream), life, now.ms, poll) {
            Ok(id) => id,
            Err(e) => {
                self.driver
                    .setup_failed(node, now, "epoll registration", &e);
                node.dial_failed(now, peer);
                return;
            }
        };
        node.outbound_open(now, id, peer);
        // A TLS link starts with our handshake.
        self.dirty.push(id);
        if let Some(remote) = remote {
            node.set_remote(id, remote);
        }
    }

    /// Reads from the connections that may have input, up to
    /// [`READS_PER_TURN`] reads each; those that still may are kept for the
    /// next turn.
    /// Queues connection `id` to be read this turn, after those queued
    /// before it.
    fn mark_ready(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(id.index())
            && !conn.in_ready
        {
            conn.in_ready = true;
            self.ready.push(id);
        }
    }

    /// Reads the ready connections in the order their input became ready
    /// (epoll reports readiness in that order), so that requests arriving
    /// on different connections in one turn are served in arrival order, as
    /// the io_uring loop does, and no connection is favoured by its slot.
    fn read_ready(&mut self, node: &mut Node, now: Now, poll: &Poll) {
        let mut ready = std::mem::take(&mut self.ready);
        for &id in &ready {
            let Some(conn) = self.conns.get_mut(id.index()) else {
                continue;
            };
            if !conn.in_ready {
                continue; // a slot freed and reused since it was queued
            }
            conn.in_ready = false;
            for _ in 0..READS_PER_TURN {
                if !conn.readable || !conn.life.wants_read(node.outbox(), id) {
                    break; // paused: read on once the client catches up
                }
                match conn.stream.read(&mut self.buf) {
                    Ok(0) => {
                        conn.readable = false;
                        conn.life.peer_closed(node, now, id);
                    }
                    Ok(n) => {
                        conn.batch_read = false;
                        // A short read emptied the socket: whatever arrives
                        // next raises a new edge, so asking again would only
                        // hear WouldBlock (one wasted syscall per request in
                        // ping-pong).
                        if n < self.buf.len() && !conn.read_closed {
                            conn.readable = false;
                        }
                        let data = self.buf.get(..n).unwrap_or_default();
                        conn.life.received(node, now, id, data);
                        if conn.life.is_tls() {
                            self.dirty.push(id); // a handshake answer, maybe
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        conn.readable = false;
                        if std::mem::take(&mut conn.batch_read) {
                            conn.life.read_nothing(); // quiet: wait on it again
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        conn.readable = false;
                        conn.life.peer_closed(node, now, id);
                    }
                }
            }
            conn.batch_read = false;
            let wants = conn.life.wants_read(node.outbox(), id);
            if let Err(e) = batch(conn, id, wants, poll, &mut self.driver) {
                tracing::warn!(target: "ringlock::io", "conn {id}: epoll re-registration failed: {e}");
                conn.life.failed(node, now, id);
            }
            if conn.life.is_closed() {
                self.conns.remove(id.index());
            } else if conn.life.phase() == Phase::Closing {
                self.dirty.push(id); // its last answers go out this turn
            }
        }
        ready.retain(|&id| {
            self.conns.get_mut(id.index()).is_some_and(|c| {
                let again = !c.in_ready && c.readable && c.life.wants_read(node.outbox(), id);
                c.in_ready |= again;
                again
            })
        });
        debug_assert!(self.ready.is_empty(), "nothing queues reads while reading");
        self.ready = ready;
    }

    /// Writes the answers of every connection that has some.
    fn flush(&mut self, node: &mut Node, now: Now) {
        let mut dirty = std::mem::take(&mut self.dirty);
        let links = node.take_dirty(now, &mut self.from_node);
        // The node's peer links first (`Node::take_dirty`), before every
        // client, also one that an event of this turn listed (its readable
        // edge reports it writable too): no answer reaches the kernel
        // before the replication of what it answers, so a process stopped
        // between two writes holds no answer whose grant its followers
        // lack. Then the clients the events listed, in their order (the
        // order requests arrived, which keeps FIFO fair across clients),
        // then the node's.
        let (node_links, node_clients) = self.from_node.split_at(links.min(self.from_node.len()));
        dirty.splice(0..0, node_links.iter().copied());
        dirty.extend_from_slice(node_clients);
        // Connections the node gave up on: closed like a protocol break.
        node.take_doomed(now, &mut self.from_node);
        for &id in &self.from_node {
            if let Some(conn) = self.conns.get_mut(id.index()) {
                conn.life.finish(node, now, id);
                dirty.push(id);
            }
        }
        // Work done while this turn's output goes out (input kept back by a
        // pause and resumed as its answers leave, a close that grants a
        // waiter) can answer with grants whose replication the node has
        // not collected yet: the rest waits for the next turn, which sends
        // the links first. `next_deadline` turns again at once.
        let mut held = Vec::new();
        for (i, &id) in dirty.iter().enumerate() {
            if node.outbox().has_uncollected() {
                held.extend_from_slice(dirty.get(i..).unwrap_or_default());
                break;
            }
            let Some(conn) = self.conns.get_mut(id.index()) else {
                continue;
            };
            match write_out(conn, node, now, id) {
                Err(_) => conn.life.failed(node, now, id),
                Ok(Written::Held) => {
                    held.push(id);
                    continue;
                }
                Ok(Written::Done) => {
                    if conn.readable && conn.life.wants_read(node.outbox(), id) {
                        self.mark_ready(id); // the client caught up
                    }
                }
            }
            self.settle(now.ms, id);
        }
        dirty.clear();
        dirty.append(&mut held);
        dirty.append(&mut self.dirty);
        self.dirty = dirty;
    }

    /// Does what connection `id`'s lifecycle asks for after its I/O.
    fn settle(&mut self, now_ms: u64, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id.index()) else {
            return;
        };
        match conn.life.advance(now_ms) {
            Step::Stay => {}
            Step::Shut { linger_until } => {
                let _ = conn.stream.shutdown(Shutdown::Write);
                match linger_until {
                    Some(until) => {
                        self.driver.linger(until, id);
                        // Keep reading (and discarding) until the client closes.
                        self.mark_ready(id);
                    }
                    None => {
                        self.conns.remove(id.index());
                    }
                }
            }
            Step::Close => {
                self.conns.remove(id.index());
            }
        }
    }

    /// Closes the lingering connections whose deadline passed (those whose
    /// client closed are closed by [`Loop::read_ready`]).
    fn expire_lingering(&mut self, now_ms: u64) {
        while let Some(id) = self.driver.due_lingering(now_ms) {
            // A stale entry (its connection gone, the slot reused) is
            // harmless: the lifecycle only acts on its own deadline.
            self.settle(now_ms, id);
        }
    }

    /// Closes the TLS connections whose handshake is not done by its
    /// deadline.
    fn expire_handshakes(&mut self, node: &mut Node, now: Now) {
        while let Some(id) = self.driver.due_handshake(now.ms) {
            // A stale entry is harmless: the lifecycle acts on its own
            // deadline only, and only while its handshake is under way.
            if let Some(conn) = self.conns.get_mut(id.index())
                && conn.life.handshake_expired(node, now, id)
            {
                self.settle(now.ms, id);
            }
        }
    }

    /// Begins closing every connection (shutdown): each gets its last answers.
    fn close_all(&mut self, node: &mut Node, now: Now) {
        for (id, conn) in self.conns.iter_mut() {
            conn.life.finish(node, now, ConnId::from_index(id));
            self.dirty.push(ConnId::from_index(id));
        }
    }
}

/// Registers connection `id` for what its next read needs, after a read:
/// a batched one ([`NextRead::At`]) for writability only, its read queued
/// with the driver (unless it does not `want` to read now: paused, it is
/// read again once its client catches up); else for input again.
/// Registering for input again reports input that arrived meanwhile (epoll
/// checks readiness as it modifies), so nothing is missed.
fn batch(
    conn: &mut Conn,
    id: ConnId,
    want: bool,
    poll: &Poll,
    driver: &mut Driver,
) -> io::Result<()> {
    let token = Token(id.index());
    match conn.life.next_read() {
        NextRead::At(at) => {
            if want {
                driver.read_at(at, id);
            }
            if !conn.batched {
                poll.registry()
                    .reregister(&mut conn.stream, token, Interest::WRITABLE)?;
                conn.batched = true;
            }
        }
        NextRead::Waiting if conn.batched => {
            poll.registry().reregister(
                &mut conn.stream,
                token,
                Interest::READABLE | Interest::WRITABLE,
            )?;
            conn.batched = false;
        }
        NextRead::Waiting => {}
    }
    Ok(())
}

/// Wakes the loop at a microsecond (a timerfd): epoll's timeout counts
/// whole milliseconds, which would make a batched read up to one late.
struct FineTimer {
    fd: OwnedFd,
    /// When it is set to fire (monotonic µs of the loop's clock).
    armed_us: Option<u64>,
}

impl FineTimer {
    fn new() -> io::Result<FineTimer> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        Ok(FineTimer { fd, armed_us: None })
    }

    /// Sets the timer to fire at `at_us` (it is `now_us`), unless it is set
    /// for that time already.
    fn arm(&mut self, now_us: u64, at_us: u64) -> io::Result<()> {
        if self.armed_us == Some(at_us) {
            return Ok(());
        }
        let after = Duration::from_micros(at_us.saturating_sub(now_us).max(1));
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = rustix::time::Timespec {
            tv_sec: i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(after.subsec_nanos()),
        };
        timerfd_settime(
            &self.fd,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        self.armed_us = Some(at_us);
        Ok(())
    }

    /// It fired: its count is read (so that the next expiry raises a new
    /// edge) and it is unset.
    fn fired(&mut self) {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut count);
        self.armed_us = None;
    }
}

/// How [`write_out`] ended.
enum Written {
    /// The socket took all it could.
    Done,
    /// A send resumed work that wrote output the node has not collected
    /// (`Outbox::has_uncollected`): it may answer grants whose replication
    /// is not with the kernel yet, so the connection waits for the next
    /// turn, whose links go first.
    Held,
}

/// Writes as much of the connection's pending answers as the socket takes.
/// `Err` means the connection is dead.
fn write_out(conn: &mut Conn, node: &mut Node, now: Now, id: ConnId) -> io::Result<Written> {
    loop {
        if node.outbox().has_uncollected() {
            return Ok(Written::Held);
        }
        let out = conn.life.pending(node, id);
        if out.is_empty() {
            return Ok(Written::Done);
        }
        match conn.stream.write(out) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => conn.life.sent(node, now, id, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Written::Done),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
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
