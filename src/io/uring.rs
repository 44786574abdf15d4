//! The io_uring backend.
//!
//! One ring, one thread, one `io_uring_enter` per loop turn that both submits
//! everything queued during the turn and waits for completions (with the
//! engine's next deadline as its timeout).
//!
//! - Accept: one multishot accept on the listener, re-armed if the kernel
//!   ends it.
//! - Receive: a single-shot `recv` per connection that picks its buffer from
//!   a provided buffer ring ([`BufRing`]), so idle connections hold no
//!   buffer. It is re-armed after each completion while the connection's
//!   [`Lifecycle`] wants input: not while its unsent answers pass
//!   [`super::OUTPUT_PAUSE_BYTES`], so the socket is not read until the
//!   client takes them, which is exactly TCP backpressure (a multishot
//!   receive would keep reading and need a cancel to pause). A busy link
//!   read in batches ([`ringlock_core::read_batch`]) has no receive armed
//!   between its reads: at each batch's time it gets one that does not
//!   wait (`MSG_DONTWAIT`), which takes what the socket holds or comes
//!   back `EAGAIN`, and nothing wakes the loop for the bytes in between.
//! - Send: at most one `send` in flight per connection, from the buffer its
//!   [`Lifecycle`] holds still until the completion arrives; answers produced
//!   meanwhile collect in the node's outbox and go in the next send.
//!
//! When to pause, shut, linger and close is the [`Lifecycle`]'s; this file
//! has the submissions and completions.
//!
//! Every operation in flight has an owner until its completion arrives: a
//! connection's slot (and its socket) is freed only once neither its receive
//! nor its send is in flight, so the kernel never writes into, or reads from,
//! memory that has been reused.

mod bufring;

use std::io;
use std::net::Shutdown;
use std::num::{NonZeroU16, NonZeroU32};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use bufring::BufRing;
use io_uring::types::{Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};
use slab::Slab;

use super::lifecycle::Phase;
use super::{
    Clock, Dialer, Lifecycle, LongestTurn, LoopConfig, LoopTls, Step, accepted_lifecycle,
    dialed_lifecycle,
};
use crate::driver::Driver;
use crate::engine::{ConnId, Now};
use crate::node::{Admission, Node};
use ringlock_core::read_batch::NextRead;

/// Submission queue entries; the completion queue has four times as many.
const RING_ENTRIES: u32 = 4096;
/// Provided receive buffers: count (a power of two) and size of each.
const RECV_BUFS: NonZeroU16 = NonZeroU16::new(512).unwrap();
const RECV_BUF_SIZE: NonZeroU32 = NonZeroU32::new(8 * 1024).unwrap();
/// The provided buffer group id of the receive buffers.
const RECV_GROUP: u16 = 0;
/// `IORING_RECVSEND_POLL_FIRST` (linux/io_uring.h, 5.19+; older kernels
/// ignore it): a receive arms its poll before trying to read.
const RECVSEND_POLL_FIRST: u16 = 1;

/// What a completion is for: the operation kind in the top 8 bits of
/// `user_data`, the generation of the connection's slot in the next 24
/// ([`Generations`]), the connection's index (its `ConnId`) in the low 32.
/// The loop's own operations (accept, signal, dialer) carry generation and
/// index 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Signal = 4,
    Cancel = 5,
    /// The dialer has results.
    Dialed = 6,
}

/// Bits of a slot's generation in `user_data`.
const GENERATION_BITS: u32 = 24;
const GENERATION_MASK: u32 = (1 << GENERATION_BITS) - 1;

fn user_data(op: Op, generation: u32, conn: ConnId) -> u64 {
    debug_assert!(generation <= GENERATION_MASK);
    ((op as u64) << 56) | (u64::from(generation & GENERATION_MASK) << 32) | u64::from(conn.get())
}

fn decode(user_data: u64) -> (Option<Op>, u32, ConnId) {
    let op = match user_data >> 56 {
        1 => Some(Op::Accept),
        2 => Some(Op::Recv),
        3 => Some(Op::Send),
        4 => Some(Op::Signal),
        5 => Some(Op::Cancel),
        6 => Some(Op::Dialed),
        _ => None,
    };
    let generation = (user_data >> 32) as u32 & GENERATION_MASK;
    (op, generation, ConnId::new(user_data as u32))
}

/// The generation of each connection slot, bumped each time the slot gets a
/// new connection and carried in the tag of every operation of the
/// connection. The loop frees a slot only once nothing of its connection is
/// in flight, so a completion should never outlive its connection; if one
/// does, its generation tells it apart from the slot's next connection, and
/// it is dropped instead of being taken for that connection's.
#[derive(Debug, Default)]
struct Generations(Vec<u32>);

impl Generations {
    /// Starts the next generation of slot `id`, for a new connection.
    fn bump(&mut self, id: ConnId) -> u32 {
        let slot = id.index();
        if self.0.len() <= slot {
            self.0.resize(slot + 1, 0);
        }
        self.0[slot] = (self.0[slot] + 1) & GENERATION_MASK;
        self.0[slot]
    }

    /// The generation of the connection in slot `id`.
    fn of(&self, id: ConnId) -> u32 {
        self.0.get(id.index()).copied().unwrap_or(0)
    }

    /// Whether a completion tagged `(op, generation, id)` is stale: an
    /// operation of a connection that is no longer in slot `id` (the slot is
    /// free, `occupied` false, or holds a later connection).
    fn is_stale(&self, op: Option<Op>, generation: u32, id: ConnId, occupied: bool) -> bool {
        matches!(op, Some(Op::Recv | Op::Send)) && !(occupied && self.of(id) == generation)
    }
}

/// Builds the ring the loop runs on. Kernels of 6.1 and later get the
/// single-issuer, deferred-task-run setup (completions are processed only
/// when this thread enters the kernel, which it does once per turn).
///
/// With `spin` (`--spin-us`) the ring also raises `IORING_SQ_TASKRUN` in
/// the shared submission-queue flags when deferred work is waiting: the spin
/// watches that word and enters the kernel only to run the work. A
/// socket's wake-up then costs the sender an atomic store, not an
/// interrupt of the spinning core (which a plain ring sends to run the
/// completion as task work; on the development VM a spin on a plain ring
/// bought nothing, see docs/performance.md).
fn build_ring(spin: bool) -> io::Result<IoUring> {
    let mut deferred = IoUring::builder();
    deferred
        .setup_cqsize(RING_ENTRIES * 4)
        .setup_single_issuer()
        .setup_defer_taskrun();
    if spin {
        deferred.setup_taskrun_flag();
    }
    deferred.build(RING_ENTRIES).or_else(|_| {
        IoUring::builder()
            .setup_cqsize(RING_ENTRIES * 4)
            .build(RING_ENTRIES)
    })
}

/// Checks that this kernel lets us use io_uring with everything the loop
/// needs. `Err` says why not, for the startup line.
pub fn probe() -> Result<(), String> {
    let ring = build_ring(false).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel has no io_uring (ENOSYS)".to_string(),
        Some(libc::EPERM) => "io_uring_setup is not permitted (EPERM: a seccomp profile or \
             kernel.io_uring_disabled blocks it)"
            .to_string(),
        _ => format!("io_uring_setup failed: {e}"),
    })?;
    if !ring.params().is_feature_ext_arg() {
        return Err("the kernel lacks IORING_FEAT_EXT_ARG (needs Linux 5.11+)".into());
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("io_uring probe failed: {e}"))?;
    for (code, name) in [
        (opcode::AcceptMulti::CODE, "accept"),
        (opcode::Recv::CODE, "recv"),
        (opcode::Send::CODE, "send"),
        (opcode::Read::CODE, "read"),
        (opcode::AsyncCancel::CODE, "async cancel"),
    ] {
        if !probe.is_supported(code) {
            return Err(format!("the kernel's io_uring lacks {name}"));
        }
    }
    // Provided buffer rings came with multishot accept, in Linux 5.19.
    let bufs = BufRing::new(NonZeroU16::MIN, NonZeroU32::new(64).unwrap());
    bufs.register(&ring, RECV_GROUP)
        .map_err(|e| format!("provided buffer rings unsupported (needs Linux 5.19+): {e}"))?;
    drop(ring);
    drop(bufs);
    Ok(())
}

struct Conn {
    fd: OwnedFd,
    /// Once closed, the slot is freed as soon as no operation of it is in
    /// flight.
    life: Lifecycle,
    recv_in_flight: bool,
    /// The last receive said more input was waiting in the socket
    /// (`IORING_CQE_F_SOCK_NONEMPTY`): the next one reads at once instead
    /// of arming a poll first.
    input_waiting: bool,
    send_in_flight: bool,
    cancel_sent: bool,
    /// The receive in flight does not wait: a batched read
    /// ([`NextRead::At`]), which comes back `EAGAIN` on an empty socket.
    recv_nowait: bool,
}

/// The loop's state. Field order matters: the ring drops before the buffers
/// its operations point into.
struct Uring {
    ring: IoUring,
    bufs: BufRing,
    conns: Slab<Conn>,
    generations: Generations,
    /// `None` once shutting down (closed, so new clients are refused).
    listener: Option<std::net::TcpListener>,
    signals: UnixStream,
    signal_buf: Box<[u8; 16]>,
    dialer: Dialer,
    dialer_buf: Box<[u8; 64]>,
    /// `--spin-us`: how long to watch for completions before sleeping.
    spin_us: u64,
    /// Connections that may have something to send this turn.
    to_send: Vec<ConnId>,
    /// Connections to look at after the turn (to free or to re-arm).
    touched: Vec<ConnId>,
    /// The per-turn policy: admission, deadlines, accept retry, shutdown.
    driver: Driver,
    tls: Option<LoopTls>,
}

/// Runs the io_uring loop until SIGINT/SIGTERM (a byte on `signals`);
/// returns its longest turn.
pub fn run(
    listener: std::net::TcpListener,
    signals: UnixStream,
    mut node: Node,
    clock: Clock,
    config: &LoopConfig,
) -> io::Result<LongestTurn> {
    let ring = build_ring(config.spin_us > 0)?;
    let bufs = BufRing::new(RECV_BUFS, RECV_BUF_SIZE);
    bufs.register(&ring, RECV_GROUP)?;
    let mut lp = Uring {
        ring,
        bufs,
        conns: Slab::with_capacity(1024),
        generations: Generations::default(),
        listener: Some(listener),
        signals,
        signal_buf: Box::new([0u8; 16]),
        dialer: Dialer::spawn(node.link_timeout())?,
        dialer_buf: Box::new([0u8; 64]),
        spin_us: config.spin_us,
        to_send: Vec::new(),
        touched: Vec::new(),
        driver: Driver::new(
            config.max_conns,
            config.tls.as_ref().map(|t| t.handshake_ms),
        ),
        tls: config.tls.clone(),
    };
    lp.arm_accept();
    lp.arm_signal();
    lp.arm_dialer();
    let mut dials = Vec::new();
    let mut completions: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
    let mut dirty = Vec::new();
    let mut turns = LongestTurn::default();
    loop {
        let (now, at) = clock.now_precise();
        if let Some(turn) = turns.end(at) {
            node.turn_ended(turn);
        }
        // What the turn published reaches the metrics listener before the
        // loop sleeps.
        config.publish(&mut node);
        lp.wait(lp.driver.timeout_us(&node, now))?;
        let (now, at) = clock.now_precise();
        turns.begin(at);
        node.tick(now);
        completions.clear();
        completions.extend(
            lp.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(data, result, flags) in &completions {
            lp.complete(&mut node, now, data, result, flags);
        }
        lp.bufs.publish();
        // Batched reads due now: armed after the turn (`after_turn`).
        while let Some(id) = lp.driver.due_read(now.us) {
            if lp.conns.contains(id.index()) {
                lp.touched.push(id);
            }
        }
        let links = node.take_dirty(now, &mut dirty);
        // The node's peer links first (`Node::take_dirty`), also before a
        // client whose send completed this turn, so that the ring gets no
        // answer before the replication of what it answers; then the
        // clients in the order they were listed.
        let (node_links, node_clients) = dirty.split_at(links.min(dirty.len()));
        lp.to_send.splice(0..0, node_links.iter().copied());
        lp.to_send.extend_from_slice(node_clients);
        lp.close_doomed(&mut node, now, &mut dirty);
        lp.send_all(&mut node);
        lp.after_turn(&mut node, now);
        lp.driver.take_dials(&mut node, now, &mut dials);
        for (peer, addr) in dials.drain(..) {
            lp.dialer.dial(peer, addr);
        }
        lp.driver.end_turn(&mut node, now);
        if lp.driver.finished(now.ms, lp.conns.len()) {
            let _ = turns.end(clock.now_precise().1);
            return Ok(turns);
        }
    }
}

impl Uring {
    /// Submits what the turn queued and waits for one completion, at most
    /// `timeout_us` (forever if `None`).
    fn wait(&mut self, timeout_us: Option<u64>) -> io::Result<()> {
        if self.spin_us > 0 && self.spin(timeout_us)? {
            return Ok(());
        }
        let result = match timeout_us {
            None => self.ring.submit_and_wait(1),
            Some(us) => {
                let ts = Timespec::new()
                    .sec(us / 1_000_000)
                    .nsec((us % 1_000_000) as u32 * 1_000);
                let args = SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `--spin-us`: submits, then watches the completion queue for up to
    /// `spin_us` (never past the timeout) before the loop sleeps in the
    /// kernel. True if completions arrived.
    fn spin(&mut self, timeout_us: Option<u64>) -> io::Result<bool> {
        if let Err(e) = self.ring.submit()
            && !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY))
        {
            return Err(e);
        }
        let limit =
            std::time::Duration::from_micros(self.spin_us.min(timeout_us.unwrap_or(u64::MAX)));
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if !self.ring.completion().is_empty() {
                return Ok(true);
            }
            if self.ring.submission().taskrun() {
                // Deferred completions are waiting: an enter with
                // GETEVENTS (which `submit` adds when the flag is up) runs
                // them and posts their CQEs, without sleeping.
                if let Err(e) = self.ring.submit()
                    && !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY))
                {
                    return Err(e);
                }
                continue;
            }
            std::hint::spin_loop();
        }
        Ok(!self.ring.completion().is_empty())
    }

    /// Queues a submission, flushing the queue to the kernel first if it is
    /// full (never growing anything without bound).
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid, and not be moved or
    /// reused, until its completion arrives.
    unsafe fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: the caller guarantees the entry's buffers outlive it.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit()
                && !matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                )
            {
                panic!("io_uring submit failed with a full queue: {e}");
            }
        }
    }

    fn arm_accept(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        let entry = opcode::AcceptMulti::new(Fd(listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(Op::Accept, 0, ConnId::new(0)));
        // SAFETY: multishot accept points to no buffer; the kernel holds its
        // own reference to the listening socket while the accept is armed,
        // so our closing the fd at shutdown is harmless.
        unsafe { self.push(entry) };
    }

    fn arm_signal(&mut self) {
        let buf = self.signal_buf.as_mut_ptr();
        let entry = opcode::Read::new(Fd(self.signals.as_raw_fd()), buf, 16)
            .build()
            .user_data(user_data(Op::Signal, 0, ConnId::new(0)));
        // SAFETY: `signal_buf` is a Box owned by the loop, never moved or
        // freed while the loop runs.
        unsafe { self.push(entry) };
    }

    fn arm_dialer(&mut self) {
        let buf = self.dialer_buf.as_mut_ptr();
        let entry = opcode::Read::new(Fd(self.dialer.wake().as_raw_fd()), buf, 64)
            .build()
            .user_data(user_data(Op::Dialed, 0, ConnId::new(0)));
        // SAFETY: `dialer_buf` is a Box owned by the loop, never moved or
        // freed while the loop runs; the dialer's socket lives as long.
        unsafe { self.push(entry) };
    }

    /// Takes the dialer's results: connected links join the loop.
    fn dialed(&mut self, node: &mut Node, now: Now) {
        if !self.driver.is_shutting_down() {
            self.arm_dialer();
        }
        for (peer, result) in self.dialer.results() {
            match result {
                Ok(stream) if !self.driver.is_shutting_down() => {
                    let remote = stream.peer_addr().ok();
                    let life = match dialed_lifecycle(self.tls.as_ref(), node, peer, now.ms) {
                        Ok(life) => life,
                        Err(e) => {
                            self.driver.setup_failed(node, now, "TLS", &e);
                            node.dial_failed(now, peer);
                            continue;
                        }
                    };
                    let id = self.insert_conn(OwnedFd::from(stream), life, now.ms);
                    node.outbound_open(now, id, peer);
                    if let Some(remote) = remote {
                        node.set_remote(id, remote);
                    }
                    self.arm_recv(id, false);
                    // A TLS link starts with our handshake.
                    self.to_send.push(id);
                }
                Ok(_) => {}
                Err(_) => node.dial_failed(now, peer),
            }
        }
    }

    fn insert_conn(&mut self, fd: OwnedFd, life: Lifecycle, now_ms: u64) -> ConnId {
        let id = ConnId::from_index(self.conns.vacant_key());
        self.generations.bump(id);
        self.driver.opened(now_ms, id, life.is_tls());
        let slot = self.conns.insert(Conn {
            fd,
            life,
            recv_in_flight: false,
            input_waiting: true,
            send_in_flight: false,
            cancel_sent: false,
            recv_nowait: false,
        });
        debug_assert_eq!(ConnId::from_index(slot), id);
        id
    }

    /// Arms `id`'s receive: one that waits for bytes, or (`nowait`, a
    /// batched read) one that takes what the socket holds now.
    fn arm_recv(&mut self, id: ConnId, nowait: bool) {
        let tag = user_data(Op::Recv, self.generations.of(id), id);
        let conn = &mut self.conns[id.index()];
        debug_assert!(!conn.recv_in_flight);
        conn.recv_in_flight = true;
        conn.recv_nowait = nowait;
        // Usually the client is still waiting for our answer, so the socket
        // is empty: a receive tried at once would fail, then arm a poll and
        // be tried again when data comes. Arming the poll first saves that
        // wasted attempt. A batched read tries at once and never waits.
        let ioprio = if conn.input_waiting || nowait {
            0
        } else {
            RECVSEND_POLL_FIRST
        };
        let msg_flags = if nowait { libc::MSG_DONTWAIT } else { 0 };
        let entry = opcode::Recv::new(
            Fd(conn.fd.as_raw_fd()),
            std::ptr::null_mut(),
            RECV_BUF_SIZE.get(),
        )
        .buf_group(RECV_GROUP)
        .flags(msg_flags)
        .ioprio(ioprio)
        .build()
        .flags(squeue::Flags::BUFFER_SELECT)
        .user_data(tag);
        // SAFETY: the receive writes into a provided buffer of `bufs`, which
        // lives as long as the ring; the fd stays open until the completion
        // (the slot is freed only when nothing is in flight).
        unsafe { self.push(entry) };
    }

    fn cancel(&mut self, id: ConnId) {
        let generation = self.generations.of(id);
        let entry = opcode::AsyncCancel::new(user_data(Op::Recv, generation, id))
            .build()
            .user_data(user_data(Op::Cancel, generation, id));
        // SAFETY: a cancel points to no buffer.
        unsafe { self.push(entry) };
    }

    fn complete(&mut self, node: &mut Node, now: Now, data: u64, res: i32, flags: u32) {
        let (op, generation, id) = decode(data);
        let occupied = self.conns.contains(id.index());
        if self.generations.is_stale(op, generation, id, occupied) {
            // Not the slot's connection's: its in-flight flags stay as they
            // are. A buffer the completion carries goes back to the kernel.
            if let Some(buf) = cqueue::buffer_select(flags).and_then(|bid| self.bufs.take(bid)) {
                self.bufs.give_back(buf);
            }
            return;
        }
        match op {
            Some(Op::Accept) => self.accepted(node, now, res, flags),
            Some(Op::Recv) => self.received(node, now, id, res, flags),
            Some(Op::Send) => self.sent(node, now, id, res),
            Some(Op::Signal) => self.signalled(node, now, res),
            Some(Op::Dialed) => self.dialed(node, now),
            Some(Op::Cancel) | None => {}
        }
    }

    fn accepted(&mut self, node: &mut Node, now: Now, res: i32, flags: u32) {
        let failed = res < 0 && res != -libc::ECANCELED;
        let error = || io::Error::from_raw_os_error(-res);
        if !cqueue::more(flags) && !self.driver.is_shutting_down() {
            if failed {
                // Out of descriptors or memory: the connection stays in the
                // backlog and an accept armed now would fail again at once;
                // the driver says when to try again.
                self.driver.accept_failed(node, now, &error());
            } else {
                self.arm_accept();
            }
        } else if failed {
            node.accept_failed(now, &error());
        }
        if res < 0 {
            return;
        }
        // SAFETY: a successful accept completion's result is a new file
        // descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        let admission = self.driver.admit(node, self.conns.len());
        if admission == Admission::Refuse {
            return; // dropped: closed at once
        }
        let borrowed = fd.as_fd();
        let socket = socket2::SockRef::from(&borrowed);
        if let Err(e) = socket.set_nodelay(true) {
            self.driver.setup_failed(node, now, "TCP_NODELAY", &e);
            return; // dropped: closed at once
        }
        let remote = socket.peer_addr().ok().and_then(|a| a.as_socket());
        let life = match accepted_lifecycle(self.tls.as_ref(), now.ms) {
            Ok(life) => life,
            Err(e) => {
                self.driver.setup_failed(node, now, "TLS", &e);
                return; // dropped: closed at once
            }
        };
        let id = self.insert_conn(fd, life, now.ms);
        if admission == Admission::PeerOnly {
            node.open_peer_only(now, id);
        } else {
            node.open(id);
        }
        if let Some(remote) = remote {
            node.set_remote(id, remote);
        }
        self.arm_recv(id, false);
    }

    /// Closes the connections the node gave up on, like a protocol break:
    /// their output (ending with the `E` line) goes out, then they close.
    fn close_doomed(&mut self, node: &mut Node, now: Now, scratch: &mut Vec<ConnId>) {
        node.take_doomed(now, scratch);
        for &id in scratch.iter() {
            if let Some(conn) = self.conns.get_mut(id.index()) {
                conn.life.finish(node, now, id);
                self.to_send.push(id);
            }
        }
        if !scratch.is_empty() {
            self.send_all(node);
        }
    }

    fn received(&mut self, node: &mut Node, now: Now, id: ConnId, res: i32, flags: u32) {
        let conn = &mut self.conns[id.index()];
        conn.recv_in_flight = false;
        let nowait = std::mem::take(&mut conn.recv_nowait);
        conn.input_waiting = cqueue::sock_nonempty(flags);
        self.touched.push(id);
        let mut res = res;
        if let Some(bid) = cqueue::buffer_select(flags) {
            // The buffer id and the length come from the kernel: one that
            // names no buffer it holds, or more than a buffer holds, fails
            // this connection, not the process.
            if let Some(buf) = self.bufs.take(bid) {
                match self.bufs.bytes(&buf, res.max(0) as usize) {
                    Some(data) if res > 0 => {
                        conn.life.received(node, now, id, data);
                        if conn.life.is_tls() {
                            self.to_send.push(id); // a handshake answer, maybe
                        }
                    }
                    Some(_) => {}
                    None => {
                        tracing::error!("io_uring received {res} bytes into a smaller buffer");
                        res = -libc::EIO;
                    }
                }
                self.bufs.give_back(buf);
            } else {
                tracing::error!("io_uring handed over receive buffer {bid}, not the kernel's");
                res = -libc::EIO;
            }
        }
        match res {
            r if r > 0 => {}
            0 => conn.life.peer_closed(node, now, id),
            r if r == -libc::ENOBUFS => {} // re-armed after the turn
            // A batched read found the socket empty: the link is quiet, and
            // the receive armed after the turn waits.
            r if r == -libc::EAGAIN && nowait => conn.life.read_nothing(),
            _ => conn.life.failed(node, now, id), // reset, or cancelled on the way out
        }
        if conn.life.phase() == Phase::Closing {
            self.to_send.push(id); // its last answers
        }
    }

    fn sent(&mut self, node: &mut Node, now: Now, id: ConnId, res: i32) {
        let conn = &mut self.conns[id.index()];
        conn.send_in_flight = false;
        self.touched.push(id);
        match usize::try_from(res) {
            // The client is taking answers: this may resume input kept back
            // by a pause.
            Ok(n) => conn.life.sent(node, now, id, n),
            Err(_) => {
                conn.life.failed(node, now, id);
                return;
            }
        }
        self.to_send.push(id);
    }

    fn signalled(&mut self, node: &mut Node, now: Now, res: i32) {
        if res <= 0 || self.driver.shut_down(node, now).is_none() {
            if !self.driver.is_shutting_down() {
                self.arm_signal();
            }
            return;
        }
        let entry = opcode::AsyncCancel::new(user_data(Op::Accept, 0, ConnId::new(0)))
            .build()
            .user_data(user_data(Op::Cancel, 0, ConnId::new(0)));
        // SAFETY: a cancel points to no buffer.
        unsafe { self.push(entry) };
        // Closed at once (the ring keeps its own reference until the accept
        // is cancelled): new clients are refused, not queued.
        self.listener = None;
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .map(|(id, _)| ConnId::from_index(id))
            .collect();
        for id in ids {
            self.conns[id.index()].life.finish(node, now, id);
            self.to_send.push(id);
            self.touched.push(id);
        }
    }

    /// Starts a send on every listed connection that has output and no send
    /// in flight.
    fn send_all(&mut self, node: &mut Node) {
        let mut ids = std::mem::take(&mut self.to_send);
        for &id in &ids {
            let Some(conn) = self.conns.get_mut(id.index()) else {
                continue;
            };
            if conn.send_in_flight {
                continue;
            }
            let rest = conn.life.pending(node, id);
            if !rest.is_empty() {
                // A send takes at most u32::MAX bytes; the rest goes next.
                let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
                let entry = opcode::Send::new(Fd(conn.fd.as_raw_fd()), rest.as_ptr(), len)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(user_data(Op::Send, self.generations.of(id), id));
                conn.send_in_flight = true;
                // SAFETY: the bytes are the connection's `Lifecycle`'s, which
                // keeps them in place until `sent` accounts for them all (see
                // its documentation); `pending` is not called again while
                // `send_in_flight` is set, and the slot is freed only when no
                // operation is in flight.
                unsafe { self.push(entry) };
            }
            self.touched.push(id);
        }
        ids.clear();
        self.to_send = ids;
    }

    /// Moves each touched connection on: re-arm its receive, shut a closing
    /// one whose last answers are out, free a closed one with nothing in
    /// flight.
    fn after_turn(&mut self, node: &mut Node, now: Now) {
        let now_ms = now.ms;
        if self.driver.accept_retry_due(now_ms) {
            self.arm_accept();
        }
        while let Some(id) = self.driver.due_lingering(now_ms) {
            // A stale entry (slot reused) is harmless: the lifecycle only
            // acts on its own deadline.
            if self.conns.contains(id.index()) {
                self.touched.push(id);
            }
        }
        while let Some(id) = self.driver.due_handshake(now_ms) {
            // Stale entries are harmless, as above: the lifecycle acts on
            // its own deadline, and only while its handshake is under way.
            if let Some(conn) = self.conns.get_mut(id.index())
                && conn.life.handshake_expired(node, now, id)
            {
                self.touched.push(id);
            }
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        for &id in &touched {
            let Some(conn) = self.conns.get_mut(id.index()) else {
                continue;
            };
            match conn.life.advance(now_ms) {
                Step::Shut { linger_until } => {
                    let _ = socket2::SockRef::from(&conn.fd.as_fd()).shutdown(Shutdown::Write);
                    if let Some(until) = linger_until {
                        self.driver.linger(until, id);
                    }
                }
                Step::Stay | Step::Close => {}
            }
            if !conn.recv_in_flight && conn.life.wants_read(node.outbox(), id) {
                match conn.life.next_read() {
                    NextRead::Waiting => self.arm_recv(id, false),
                    // Due, or more bytes wait in the socket (one read did not
                    // take them all): read them now.
                    NextRead::At(at) if at <= now.us || conn.input_waiting => {
                        self.arm_recv(id, true)
                    }
                    NextRead::At(at) => self.driver.read_at(at, id),
                }
                continue;
            }
            if conn.life.is_closed() {
                if conn.recv_in_flight && !conn.cancel_sent {
                    conn.cancel_sent = true;
                    self.cancel(id);
                } else if !conn.recv_in_flight && !conn.send_in_flight {
                    self.conns.remove(id.index());
                }
            }
        }
        touched.clear();
        self.touched = touched;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        let ops = [
            Op::Accept,
            Op::Recv,
            Op::Send,
            Op::Signal,
            Op::Cancel,
            Op::Dialed,
        ];
        for op in ops {
            for generation in [0, 1, 0x5a_5a5a, GENERATION_MASK] {
                for conn in [0, 1, 0xdead_beef, u32::MAX].map(ConnId::new) {
                    let tag = user_data(op, generation, conn);
                    assert_eq!(decode(tag), (Some(op), generation, conn), "{tag:#x}");
                }
            }
        }
        assert_eq!(decode(0).0, None, "untagged");
        assert_eq!(decode(0xff << 56).0, None, "unknown operation");
    }

    #[test]
    fn generations_wrap_within_their_bits() {
        let mut generations = Generations(vec![GENERATION_MASK - 1]);
        assert_eq!(generations.bump(ConnId::new(0)), GENERATION_MASK);
        assert_eq!(generations.bump(ConnId::new(0)), 0);
        let tag = user_data(Op::Send, generations.of(ConnId::new(0)), ConnId::new(0));
        assert_eq!(decode(tag), (Some(Op::Send), 0, ConnId::new(0)));
    }

    #[test]
    fn a_completion_for_a_reused_slot_is_stale() {
        let mut generations = Generations::default();
        let first = generations.bump(ConnId::new(7));
        let (op, generation, id) = decode(user_data(Op::Recv, first, ConnId::new(7)));
        assert!(!generations.is_stale(op, generation, id, true), "its own");
        // The connection is freed: a late completion names an empty slot.
        assert!(generations.is_stale(op, generation, id, false));
        // The slot goes to a new connection: the old tag is not its.
        let second = generations.bump(ConnId::new(7));
        assert_ne!(first, second);
        assert!(generations.is_stale(op, generation, id, true));
        let (op, generation, id) = decode(user_data(Op::Send, first, ConnId::new(7)));
        assert!(generations.is_stale(op, generation, id, true));
        let (op, generation, id) = decode(user_data(Op::Recv, second, ConnId::new(7)));
        assert!(!generations.is_stale(op, generation, id, true));
        // Slots never used, and the loop's own operations.
        assert!(generations.is_stale(Some(Op::Recv), 0, ConnId::new(8), false));
        for op in [Op::Accept, Op::Signal, Op::Dialed, Op::Cancel] {
            assert!(!generations.is_stale(Some(op), 0, ConnId::new(0), false));
        }
    }
}
