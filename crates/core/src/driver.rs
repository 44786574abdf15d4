//! The per-turn policy of a loop, without any I/O: what both event loops
//! (io_uring and epoll) decide the same way, so that they differ only in
//! their syscalls.
//!
//! A loop owns one [`Driver`] beside its [`Node`] and, each turn:
//!
//! 1. waits at most [`Driver::timeout_us`];
//! 2. reads the time and calls [`Node::tick`];
//! 3. handles what the kernel reported: an accepted socket goes through
//!    [`Driver::admit`] (refused, a client, or a connection kept for a
//!    peer's handshake), a failed accept through [`Driver::accept_failed`],
//!    a socket that could not be set up through [`Driver::setup_failed`],
//!    a connection that took a slot through [`Driver::opened`], SIGINT or
//!    SIGTERM through [`Driver::shut_down`];
//! 4. retries the accept if [`Driver::accept_retry_due`], closes what
//!    [`Driver::due_lingering`] and [`Driver::due_handshake`] name (the
//!    lifecycle acts on its own deadlines: a stale entry is harmless),
//!    reads without waiting the connections [`Driver::due_read`] names
//!    (a busy link read in batches, [`crate::read_batch`]: it asked with
//!    [`Driver::read_at`] when its lifecycle said
//!    [`crate::read_batch::NextRead::At`]), and dials what
//!    [`Driver::take_dials`] asks for;
//! 5. ends with [`Driver::end_turn`] (the invariant walkers of a debug
//!    build), and stops once [`Driver::finished`].
//!
//! Three drive it: the io_uring and epoll loops (`src/io/`), the whole-node
//! fuzz harness (`fuzz/fuzz_targets/harness/node.rs`: one node, its input
//! decides what the kernel reports) and the cluster simulator
//! (`tests/sim/`: every node of a cluster, over a simulated network, with
//! failed accepts, sockets that never finish a handshake, lingering
//! connections and SIGTERM among its faults). Each rule is here once, so
//! what those two check of it holds for the loops.

use std::collections::VecDeque;

use crate::engine::{ConnId, Now};
use crate::node::{Admission, Node};
use crate::session::LINGER_MS;

/// After an accept failed (out of descriptors, say), how long until the
/// loop tries again. At once, it would fail again at once for as long as a
/// connection waits in the backlog (a spin); not at all, connections that
/// wait there would wait until another one arrives (epoll's edges).
pub const ACCEPT_RETRY_MS: u64 = 50;

/// Connections by deadline. A queue's deadlines are all `now + ` one
/// constant, so they arrive in order and a FIFO is sorted; an entry may be
/// stale (its connection already gone, or its slot reused, or a later
/// deadline of its own queued since), which the lifecycle's own deadline
/// makes harmless.
#[derive(Debug, Default)]
struct DeadlineQueue {
    queue: VecDeque<(u64, ConnId)>,
}

impl DeadlineQueue {
    fn push(&mut self, until_ms: u64, conn: ConnId) {
        assert!(
            self.queue.back().is_none_or(|&(last, _)| last <= until_ms),
            "deadlines out of order"
        );
        self.queue.push_back((until_ms, conn));
    }

    fn next_deadline(&self) -> Option<u64> {
        self.queue.front().map(|&(until, _)| until)
    }

    fn pop_due(&mut self, now_ms: u64) -> Option<ConnId> {
        if self.next_deadline()? <= now_ms {
            self.queue.pop_front().map(|(_, conn)| conn)
        } else {
            None
        }
    }
}

/// What the shutdown [`Driver::shut_down`] began did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaving {
    /// The peer the node handed the active role over to ([`Node::leave`]):
    /// only an active names one.
    pub successor: Option<String>,
}

/// One loop's per-turn policy (see the module documentation).
#[derive(Debug)]
pub struct Driver {
    max_conns: usize,
    /// With TLS: how long a new connection's handshake may take.
    handshake_ms: Option<u64>,
    lingering: DeadlineQueue,
    /// TLS connections by handshake deadline.
    handshakes: DeadlineQueue,
    /// Connections read in batches, each with the time of its next read
    /// (monotonic µs), at most one entry per connection. Only a standby's
    /// link from its active is batched: a list of one, or a few while
    /// links are replaced.
    batch_reads: Vec<(u64, ConnId)>,
    /// When to try accepting again after an accept failed.
    accept_retry_at: Option<u64>,
    /// Shutting down: when the loop stops at the latest.
    shutdown_until: Option<u64>,
}

impl Driver {
    /// A driver for a loop of at most `max_conns` connections (beyond them,
    /// the peers' reserve: [`Node::admit`]); `handshake_ms` with TLS.
    pub fn new(max_conns: usize, handshake_ms: Option<u64>) -> Driver {
        Driver {
            max_conns,
            handshake_ms,
            lingering: DeadlineQueue::default(),
            handshakes: DeadlineQueue::default(),
            batch_reads: Vec::new(),
            accept_retry_at: None,
            shutdown_until: None,
        }
    }

    /// A new connection limit (the fuzz harness changes it mid-run).
    pub fn set_max_conns(&mut self, max_conns: usize) {
        self.max_conns = max_conns;
    }

    /// What to do with a socket just accepted while `open_conns`
    /// connections are open: refused (closed at once) while shutting down
    /// or beyond the limits, otherwise as [`Node::admit`] says.
    pub fn admit(&mut self, node: &mut Node, open_conns: usize) -> Admission {
        if self.shutdown_until.is_some() {
            return Admission::Refuse;
        }
        node.admit(open_conns, self.max_conns)
    }

    /// An accept failed (out of descriptors or memory): counted and logged
    /// (rate-limited); the backlog is tried again in [`ACCEPT_RETRY_MS`].
    pub fn accept_failed(&mut self, node: &mut Node, now: Now, error: &std::io::Error) {
        node.accept_failed(now, error);
        if self.shutdown_until.is_none() {
            self.accept_retry_at = Some(now.ms + ACCEPT_RETRY_MS);
        }
    }

    /// Whether the loop should try to accept again now (once per failed
    /// accept; never while shutting down).
    pub fn accept_retry_due(&mut self, now_ms: u64) -> bool {
        if self.accept_retry_at.is_some_and(|at| now_ms >= at) {
            self.accept_retry_at = None;
            return self.shutdown_until.is_none();
        }
        false
    }

    /// A socket accepted or dialed could not be set up (its options, its
    /// registration with the kernel, TLS): that connection is dropped,
    /// counted and logged (rate-limited); the loop goes on.
    pub fn setup_failed(
        &mut self,
        node: &mut Node,
        now: Now,
        what: &str,
        error: &dyn std::fmt::Display,
    ) {
        node.setup_failed(now, what, error);
    }

    /// Connection `conn` took a slot; `tls`: it starts with a handshake,
    /// which must be done by its deadline.
    pub fn opened(&mut self, now_ms: u64, conn: ConnId, tls: bool) {
        if let (true, Some(ms)) = (tls, self.handshake_ms) {
            self.handshakes.push(now_ms.saturating_add(ms), conn);
        }
    }

    /// Connection `conn` shut its sending side and lingers until `until_ms`
    /// ([`crate::lifecycle::Step::Shut`]).
    pub fn linger(&mut self, until_ms: u64, conn: ConnId) {
        self.lingering.push(until_ms, conn);
    }

    /// The next lingering connection whose deadline has passed.
    pub fn due_lingering(&mut self, now_ms: u64) -> Option<ConnId> {
        self.lingering.pop_due(now_ms)
    }

    /// The next connection whose TLS handshake deadline has passed.
    pub fn due_handshake(&mut self, now_ms: u64) -> Option<ConnId> {
        self.handshakes.pop_due(now_ms)
    }

    /// Connection `conn` is read next at `at_us` (monotonic µs), without
    /// waiting on its socket meanwhile: its lifecycle said
    /// [`crate::read_batch::NextRead::At`].
    pub fn read_at(&mut self, at_us: u64, conn: ConnId) {
        match self.batch_reads.iter_mut().find(|(_, c)| *c == conn) {
            Some(entry) => entry.0 = at_us,
            None => self.batch_reads.push((at_us, conn)),
        }
    }

    /// The next connection whose batched read is due at `now_us`. An entry
    /// may be stale: the loop reads only if the connection's lifecycle
    /// still says [`crate::read_batch::NextRead::At`] a time not after
    /// `now_us`.
    pub fn due_read(&mut self, now_us: u64) -> Option<ConnId> {
        let i = self.batch_reads.iter().position(|&(at, _)| at <= now_us)?;
        Some(self.batch_reads.swap_remove(i).1)
    }

    /// The dials the node asks for (none while shutting down: the node's
    /// are taken and dropped all the same, so that they count as under way
    /// and their deadline does not stay in the past, which would spin the
    /// loop until it stops).
    pub fn take_dials(
        &mut self,
        node: &mut Node,
        now: Now,
        into: &mut Vec<(crate::cluster::PeerId, String)>,
    ) {
        into.clear();
        node.take_dials(now, into);
        if self.shutdown_until.is_some() {
            into.clear();
        }
    }

    /// SIGINT or SIGTERM. The first begins the shutdown and returns what
    /// the node's leave did ([`Node::leave`]): the node leaves (an active
    /// hands its role over), and the loop stops accepting and finishes
    /// every connection ([`crate::lifecycle::Lifecycle::finish`]); the loop
    /// stops once they are closed, or [`LINGER_MS`] from now. Any later
    /// one returns `None`.
    pub fn shut_down(&mut self, node: &mut Node, now: Now) -> Option<Leaving> {
        if self.shutdown_until.is_some() {
            return None;
        }
        tracing::info!(
            target: "ringlock::io",
            "shutting down: answering waiting acquires, closing connections"
        );
        self.shutdown_until = Some(now.ms + LINGER_MS);
        self.accept_retry_at = None;
        let successor = node.leave(now);
        if let Some(to) = &successor {
            tracing::info!(target: "ringlock::io", "handed the active role over to {to}");
        }
        Some(Leaving { successor })
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown_until.is_some()
    }

    /// Whether the loop is done: shutting down, and every connection
    /// closed or the deadline passed.
    pub fn finished(&self, now_ms: u64, open_conns: usize) -> bool {
        self.shutdown_until
            .is_some_and(|until| open_conns == 0 || now_ms >= until)
    }

    /// How long the loop may wait for the kernel, in milliseconds: until
    /// the node's next deadline, a lingering connection's or a
    /// handshake's, the accept retry or the end of shutdown; `None`: until
    /// something happens. Batched reads are not in it: see
    /// [`Driver::timeout_us`].
    pub fn timeout_ms(&self, node: &Node, now_ms: u64) -> Option<u64> {
        self.deadline_ms(node)
            .map(|deadline| deadline.saturating_sub(now_ms))
    }

    /// [`Driver::timeout_ms`]'s deadline (monotonic ms).
    fn deadline_ms(&self, node: &Node) -> Option<u64> {
        node.next_deadline()
            .into_iter()
            .chain(self.lingering.next_deadline())
            .chain(self.handshakes.next_deadline())
            .chain(self.shutdown_until)
            .chain(self.accept_retry_at)
            .min()
    }

    /// How long the loop may wait for the kernel, in microseconds: until
    /// [`Driver::timeout_ms`]'s deadline or the next batched read
    /// ([`Driver::next_read_us`]), whichever comes first; `None`: until
    /// something happens.
    pub fn timeout_us(&self, node: &Node, now: Now) -> Option<u64> {
        self.deadline_ms(node)
            .map(|ms| ms.saturating_mul(1000))
            .into_iter()
            .chain(self.next_read_us())
            .min()
            .map(|deadline| deadline.saturating_sub(now.us))
    }

    /// When the next batched read is due (monotonic µs), if any.
    pub fn next_read_us(&self) -> Option<u64> {
        self.batch_reads.iter().map(|&(at, _)| at).min()
    }

    /// The end of a turn: in debug builds, the invariant walkers
    /// ([`Node::check_after_turn`]).
    pub fn end_turn(&mut self, node: &mut Node, now: Now) {
        node.check_after_turn(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeConfig;
    use crate::outbox::cid;

    fn at(ms: u64) -> Now {
        Now {
            ms,
            us: ms * 1000,
            unix_ns: 1_000_000 + ms * 1_000_000,
        }
    }

    fn node() -> Node {
        Node::new(
            at(0),
            NodeConfig {
                advertise: "x:1".into(),
                cluster: None,
                max_locks: crate::engine::DEFAULT_MAX_LOCKS,
            },
        )
    }

    #[test]
    fn admission_refuses_beyond_the_limit_and_while_shutting_down() {
        let mut node = node();
        let mut driver = Driver::new(2, None);
        assert_eq!(driver.admit(&mut node, 0), Admission::Client);
        assert_eq!(driver.admit(&mut node, 1), Admission::Client);
        assert_eq!(driver.admit(&mut node, 2), Admission::Refuse);
        assert_eq!(node.stats().conns_refused, 1);
        assert_eq!(
            driver.shut_down(&mut node, at(5)),
            Some(Leaving { successor: None }),
            "a node without peers names no successor"
        );
        assert_eq!(
            driver.shut_down(&mut node, at(6)),
            None,
            "only the first begins it"
        );
        assert_eq!(driver.admit(&mut node, 0), Admission::Refuse);
    }

    #[test]
    fn a_failed_accept_is_retried_once_after_the_pause() {
        let mut node = node();
        let mut driver = Driver::new(8, None);
        assert!(!driver.accept_retry_due(0));
        let emfile = std::io::Error::from_raw_os_error(24);
        driver.accept_failed(&mut node, at(100), &emfile);
        assert_eq!(driver.timeout_ms(&node, 100), Some(ACCEPT_RETRY_MS));
        assert!(!driver.accept_retry_due(100 + ACCEPT_RETRY_MS - 1));
        assert!(driver.accept_retry_due(100 + ACCEPT_RETRY_MS));
        assert!(!driver.accept_retry_due(100 + ACCEPT_RETRY_MS), "once");
        assert_eq!(
            driver.timeout_ms(&node, 200),
            None,
            "nothing left to wait for"
        );
        // Not while shutting down: the listener is gone.
        driver.accept_failed(&mut node, at(300), &emfile);
        driver.shut_down(&mut node, at(301));
        assert!(!driver.accept_retry_due(300 + ACCEPT_RETRY_MS));
    }

    #[test]
    fn a_handshake_that_never_completes_is_due_at_its_deadline() {
        let mut driver = Driver::new(8, Some(1_000));
        driver.opened(10, cid(3), true);
        driver.opened(20, cid(4), false); // plain text: no handshake
        driver.opened(30, cid(5), true);
        let node = node();
        assert_eq!(driver.timeout_ms(&node, 10), Some(1_000));
        assert_eq!(driver.due_handshake(1_009), None);
        assert_eq!(driver.due_handshake(1_010), Some(cid(3)));
        assert_eq!(driver.due_handshake(1_029), None);
        assert_eq!(driver.due_handshake(5_000), Some(cid(5)));
        assert_eq!(driver.due_handshake(5_000), None);
        // Without TLS nothing is ever due.
        let mut plain = Driver::new(8, None);
        plain.opened(10, cid(3), true);
        assert_eq!(plain.due_handshake(u64::MAX), None);
    }

    #[test]
    fn batched_reads_are_due_at_their_time_and_wake_the_loop_to_the_microsecond() {
        let node = node();
        let mut driver = Driver::new(8, None);
        let now = Now {
            us: 10_250,
            ..at(10)
        };
        assert_eq!(driver.timeout_us(&node, now), None, "nothing to wait for");
        driver.read_at(10_750, cid(4));
        driver.read_at(10_600, cid(7));
        assert_eq!(driver.next_read_us(), Some(10_600));
        assert_eq!(
            driver.timeout_us(&node, now),
            Some(350),
            "between milliseconds"
        );
        // A connection's later read replaces its earlier one: one entry each.
        driver.read_at(11_100, cid(7));
        assert_eq!(driver.next_read_us(), Some(10_750));
        assert_eq!(driver.due_read(10_749), None);
        assert_eq!(driver.due_read(10_750), Some(cid(4)));
        assert_eq!(driver.due_read(10_750), None, "once");
        assert_eq!(driver.due_read(20_000), Some(cid(7)));
        assert_eq!(driver.next_read_us(), None);
        // The millisecond deadlines count too, at their first microsecond.
        let mut node = node;
        let emfile = std::io::Error::from_raw_os_error(24);
        driver.accept_failed(&mut node, at(10), &emfile);
        assert_eq!(
            driver.timeout_us(&node, now),
            Some((10 + ACCEPT_RETRY_MS) * 1000 - 10_250)
        );
        driver.read_at(10_300, cid(1));
        assert_eq!(driver.timeout_us(&node, now), Some(50));
        assert_eq!(
            driver.timeout_ms(&node, 10),
            Some(ACCEPT_RETRY_MS),
            "batched reads are in the microsecond timeout only"
        );
    }

    #[test]
    fn no_dials_while_shutting_down_and_no_dial_deadline_left_in_the_past() {
        let mut node = Node::new(
            at(0),
            NodeConfig {
                advertise: "a:1".into(),
                cluster: Some(crate::cluster::ClusterConfig {
                    peers: vec!["a:1".into(), "b:1".into()],
                    me: crate::cluster::PeerId(0),
                    heartbeat_ms: 50,
                    peer_timeout_ms: 500,
                    failback_delay_ms: 0,
                    incarnation: 1,
                    secret: crate::cluster::auth::Secret::from_bytes(
                        b"a secret of the unit tests, 32+ bytes",
                    ),
                    read_batch_us: 0,
                }),
                max_locks: crate::engine::DEFAULT_MAX_LOCKS,
            },
        );
        let mut driver = Driver::new(8, None);
        node.tick(at(1));
        assert_eq!(driver.timeout_ms(&node, 1), Some(0), "a dial to b is due");
        driver.shut_down(&mut node, at(1));
        let mut dials = Vec::new();
        driver.take_dials(&mut node, at(1), &mut dials);
        assert!(dials.is_empty(), "dialed while shutting down: {dials:?}");
        assert_ne!(
            driver.timeout_ms(&node, 1),
            Some(0),
            "the dial's deadline stays in the past: the loop spins"
        );
    }

    #[test]
    fn shutdown_ends_when_the_connections_are_closed_or_at_the_linger_deadline() {
        let mut node = node();
        let mut driver = Driver::new(8, None);
        assert!(!driver.finished(0, 0), "not shutting down");
        driver.shut_down(&mut node, at(100));
        assert!(driver.is_shutting_down());
        assert!(!driver.finished(101, 3));
        assert!(driver.finished(101, 0));
        assert!(driver.finished(100 + LINGER_MS, 3));
        assert_eq!(driver.timeout_ms(&node, 100), Some(LINGER_MS));
        let mut dials = vec![(crate::cluster::PeerId(0), "stale".to_string())];
        driver.take_dials(&mut node, at(101), &mut dials);
        assert!(dials.is_empty());
    }
}
