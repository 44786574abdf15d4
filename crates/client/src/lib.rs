//! The official async client of ringlock (tokio).
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock_client::Client;
//!
//! # async fn demo() -> Result<(), ringlock_client::Error> {
//! let client = Client::connect(["127.0.0.1:7171"]).await?;
//! let guard = client
//!     .lock("reports/daily", Duration::from_secs(30), Some(Duration::from_secs(5)))
//!     .await?;
//! println!("holding with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Connection behaviour is that of every official client (docs/protocol.md,
//! "12. The official clients"), with a deadline on everything:
//!
//! - One persistent connection per address of the cluster's peer list, each
//!   run by a background task; given a single address, two connections to
//!   it. A fresh connection enters the rotation only once its node has
//!   answered an `S` within the probe timeout (a node that accepts
//!   connections but is hung never gets a request). [`Client::connect`]
//!   returns as soon as one connection is up, and fails only if none could
//!   be made: every address refused, failed or did not answer, or nothing
//!   answered within the connect timeout. The others keep being dialled in
//!   the background.
//! - Liveness: a connection with requests outstanding that has received
//!   nothing for the probe interval (500 ms) sends `S` (right behind the
//!   request if it was already that quiet); if nothing arrives within the
//!   probe timeout (500 ms) it counts as dead, like a dropped one.
//! - A connection that drops (or dies) leaves the rotation and is redialled
//!   every 3 s (measured from the previous dial: one that had been up for
//!   longer is redialled at once), or at once when an `M` names its node
//!   (below).
//! - Requests go round-robin over the live connections, pipelined: many
//!   tasks share one `Client` (it is `Clone + Send + Sync`), nothing waits for
//!   earlier answers. Answers are matched per connection by op and key exactly
//!   as the protocol says.
//! - At most 4096 acquires wait on one connection; more queue inside the
//!   client, so that the client's releases and renews never queue behind its
//!   own waiters.
//! - An acquire whose connection drops or dies before its answer is sent
//!   again on the next connection (with what is left of its wait); after as
//!   many connections as the client has have failed it,
//!   [`Error::Connection`]. An acquire with a wait ends by its wait plus the
//!   acquire grace (1 s) whatever happens.
//! - An `M key addr` answer sends the request again to `addr` and makes that
//!   node the preferred one of the rotation, at once if no earlier `M` for
//!   that request named it. If the client has no live connection to `addr`
//!   it dials it now (a new address, or a known one whose connection waits
//!   for its next redial), and the request waits for that dial and its
//!   hello, within its own deadline and the connect timeout. An `M` never
//!   starts a dial to an address that has one under way; after a redirect dial failed, the next
//!   one waits 50 ms, doubling up to 1 s while they keep failing (a
//!   connection it made that dropped within 1 s counts as failed). `M key -`
//!   (no active node known), and an `M` naming a node named before, are
//!   retried with a growing delay (50 ms up to 1 s) until the no-active
//!   timeout (10 s by default), then [`Error::NoActiveNode`].
//! - Releases and renews are retried every 200 ms for 5 s on connection
//!   trouble, each attempt bounded by the request timeout (2 s), then
//!   [`Error::Connection`].
//! - [`RenewingGuard`] renews a lock at a third of its lease for as long as
//!   it lives and says when the lock is lost.

#![deny(unsafe_code)]

mod conn;
mod error;
mod grant;
mod renew;
#[cfg(test)]
mod tests;
#[cfg(feature = "tls")]
mod tls;
// Tests in virtual time (tokio's `test-util`, a dev-dependency).
#[cfg(test)]
mod virtual_time {
    mod failback_tests;
    mod timer_tests;
}

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use conn::{Conn, DialNow, Dialer, Op, Reply, Request, Shared, Slot, Timing, lock};
pub use error::Error;
pub use grant::{Acquired, AddrStatus, Grant, LockGuard, NodeStatus};
pub use renew::{LockLost, RenewalStatus, RenewalWatch, RenewingGuard};
use ringlock_proto::{Answer, MAX_DURATION_MS, Request as Line, is_valid_key, parse_answer};
pub use ringlock_proto::{Held, MAX_OWNER, Role};
#[cfg(feature = "tls")]
pub use tls::{SERVER_NAME_HINT, TlsConfig};

/// The protocol's redial period for a dropped connection.
pub const REDIAL_INTERVAL: Duration = Duration::from_secs(3);
/// How often a release or renew is retried on connection trouble.
pub const RETRY_EVERY: Duration = Duration::from_millis(200);
/// For how long a release or renew is retried.
pub const RETRY_FOR: Duration = Duration::from_secs(5);
/// The most acquires the protocol lets wait on one connection.
pub const MAX_WAITING_ACQUIRES: usize = 4096;
/// Default: how long one dial may take (and [`ClientBuilder::connect`] waits
/// for a first connection).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default: silence on a connection with requests outstanding before it is
/// probed with `S`.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Default: how long a probe (or a fresh connection's first `S`) may go
/// unanswered before the connection counts as dead.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Default: the bound on one attempt of a release, renew, status or sync.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Default: how long past its wait an acquire may take before the client
/// gives up on the node that should have answered.
pub const DEFAULT_ACQUIRE_GRACE: Duration = Duration::from_secs(1);
/// Default: how long requests keep retrying while no node is active.
pub const DEFAULT_NO_ACTIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait of [`Client::try_acquire`]: the shortest the protocol allows
/// (a wait of 0 means no limit).
pub const TRY_WAIT: Duration = Duration::from_millis(1);
/// The most addresses `M` answers may add to the ones given (a cluster has
/// at most 16 nodes): a server that names ever new addresses is not
/// followed further.
const MAX_REDIRECT_ADDRS: usize = 16;
/// The longest any setting may be (longer ones are cut to this).
const MAX_SETTING: Duration = Duration::from_secs(365 * 24 * 3600);

/// Configures and connects a [`Client`].
#[derive(Clone)]
pub struct ClientBuilder {
    addrs: Vec<String>,
    timing: Timing,
    max_waiting_acquires: usize,
    dialer: Option<Dialer>,
    owner: Option<String>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("addrs", &self.addrs)
            .field("timing", &self.timing)
            .field("max_waiting_acquires", &self.max_waiting_acquires)
            .field("owner", &self.owner)
            .finish()
    }
}

/// A setting, kept between 1 ms and a year.
fn setting(d: Duration) -> Duration {
    d.clamp(Duration::from_millis(1), MAX_SETTING)
}

impl ClientBuilder {
    /// A builder for the cluster whose peer list is `addrs` (`host:port`
    /// each, as the nodes' `--peers` list spells them, so that `M` answers
    /// name known addresses).
    pub fn new<I, S>(addrs: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder {
            addrs: addrs.into_iter().map(Into::into).collect(),
            timing: Timing {
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                redial: REDIAL_INTERVAL,
                probe_interval: DEFAULT_PROBE_INTERVAL,
                probe_timeout: DEFAULT_PROBE_TIMEOUT,
                request_timeout: DEFAULT_REQUEST_TIMEOUT,
                acquire_grace: DEFAULT_ACQUIRE_GRACE,
                retry_every: RETRY_EVERY,
                retry_for: RETRY_FOR,
                no_active_timeout: DEFAULT_NO_ACTIVE_TIMEOUT,
            },
            max_waiting_acquires: MAX_WAITING_ACQUIRES,
            dialer: None,
            owner: None,
        }
    }

    /// The owner label of this client's grants, which `ringlock locks`
    /// (and [`list_locks`], [`lock_queue`]) show beside the holder's
    /// address: for example `"host-a/job-42"`. 1 to 128 bytes of printable
    /// ASCII without spaces, and not `-` ([`ClientBuilder::connect`] says
    /// so otherwise). Each connection sets it first (`O`); a server older
    /// than owner labels refuses it, and that connection goes on without.
    /// Default: none.
    pub fn owner(mut self, owner: impl Into<String>) -> ClientBuilder {
        self.owner = Some(owner.into());
        self
    }

    /// How long one dial may take, how long [`ClientBuilder::connect`] waits
    /// for a first connection, and how long a request waits for a live
    /// connection when none is up. Default 3 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timing.connect_timeout = setting(timeout);
        self
    }

    /// How long a request keeps retrying while nodes answer `M key -` (no
    /// active node known) or keep redirecting. Default 10 s.
    pub fn no_active_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timing.no_active_timeout = setting(timeout);
        self
    }

    /// The most acquires waiting on one connection before more queue in the
    /// client: 1 to 4096 (the protocol's limit, and the default).
    pub fn max_waiting_acquires(mut self, n: usize) -> ClientBuilder {
        self.max_waiting_acquires = n.clamp(1, MAX_WAITING_ACQUIRES);
        self
    }

    /// How long a connection with requests outstanding may receive nothing
    /// before the client probes it with `S`. Default 500 ms.
    pub fn probe_interval(mut self, interval: Duration) -> ClientBuilder {
        self.timing.probe_interval = setting(interval);
        self
    }

    /// How long a probe may go unanswered (nothing at all received) before
    /// the connection counts as dead; also how long a fresh connection's
    /// node has to answer its first `S`. Default 500 ms.
    pub fn probe_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timing.probe_timeout = setting(timeout);
        self
    }

    /// The bound on one attempt of a release or renew (retried within the
    /// retry window), and on the answer to a status or sync. Default 2 s.
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timing.request_timeout = setting(timeout);
        self
    }

    /// How long past its wait an acquire (with a wait) may take in all
    /// before it ends with an error naming what did not answer. Default 1 s.
    pub fn acquire_grace(mut self, grace: Duration) -> ClientBuilder {
        self.timing.acquire_grace = grace.min(MAX_SETTING);
        self
    }

    /// How often a release or renew is retried on connection trouble
    /// (default 200 ms, the protocol's), and for how long in all (default
    /// 5 s, the protocol's).
    pub fn release_retries(mut self, every: Duration, for_: Duration) -> ClientBuilder {
        self.timing.retry_every = setting(every);
        self.timing.retry_for = for_.min(MAX_SETTING);
        self
    }

    /// How often a connection that dropped is dialled again. Default 3 s,
    /// the protocol's.
    pub fn redial_interval(mut self, interval: Duration) -> ClientBuilder {
        self.timing.redial = setting(interval);
        self
    }

    /// Speaks TLS to the servers (feature `tls`), as `tls` says: the CA
    /// that signs their certificates, and the client certificate for
    /// servers that require one.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: TlsConfig) -> ClientBuilder {
        self.dialer = Some(tls.dialer());
        self
    }

    /// Dials with `dialer` instead of TCP (tests: in-memory streams).
    #[cfg(test)]
    #[allow(dead_code)] // used by the virtual-time tests
    pub(crate) fn dialer(mut self, dialer: Dialer) -> ClientBuilder {
        self.dialer = Some(dialer);
        self
    }

    /// Starts the background connections and waits for the first one to be
    /// up. Fails with [`Error::Connection`] only if no connection could be
    /// made at all: every address failed its first dial (or its node did not
    /// answer), or none connected within the connect timeout.
    pub async fn connect(self) -> Result<Client, Error> {
        let mut addrs: Vec<String> = Vec::new();
        for addr in self.addrs {
            let addr = addr.trim().to_string();
            if addr.is_empty() {
                continue;
            }
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        if addrs.is_empty() {
            return Err(Error::InvalidArgument("no server address given".into()));
        }
        if let Some(owner) = &self.owner
            && !ringlock_proto::is_valid_owner(owner.as_bytes())
        {
            return Err(Error::InvalidArgument(format!(
                "bad owner label {owner:?}: 1 to {} bytes of printable ASCII without spaces, \
                 not \"-\"",
                ringlock_proto::MAX_OWNER
            )));
        }
        let given = addrs.len();
        if addrs.len() == 1 {
            // One node: two connections, so that one dropping for a moment
            // does not interrupt service.
            addrs.push(addrs[0].clone());
        }
        let (shutdown, _) = watch::channel(());
        let (changed, _) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            slots: RwLock::new(Vec::new()),
            given,
            rr: AtomicUsize::new(0),
            active: Mutex::new(None),
            shared: Arc::new(Shared {
                changed,
                in_flight: Arc::new(AtomicUsize::new(0)),
                timing: self.timing,
                max_waiting_acquires: self.max_waiting_acquires,
                dialer: self.dialer.unwrap_or_else(conn::tcp_dialer),
                owner: self.owner.map(String::into_bytes),
            }),
            shutdown,
        });
        let client = Client { inner };
        let mut changes = client.inner.shared.changed.subscribe();
        for addr in addrs {
            client.add_slot(addr);
        }
        let connect_timeout = client.timing().connect_timeout;
        let until = Instant::now() + connect_timeout;
        loop {
            changes.borrow_and_update();
            if client.connected() > 0 {
                return Ok(client);
            }
            let all_failed = read(&client.inner.slots)
                .iter()
                .all(|s| s.failures.load(Ordering::Relaxed) > 0);
            if all_failed {
                return Err(Error::Connection(client.why_no_connection()));
            }
            match tokio::time::timeout_at(until, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    if client.connected() > 0 {
                        return Ok(client);
                    }
                    return Err(Error::Connection(format!(
                        "no connection within {connect_timeout:?}: {}",
                        client.why_no_connection()
                    )));
                }
            }
        }
    }
}

/// A handle on the cluster, cheap to clone and share between tasks; the
/// connections close when the last clone is dropped.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// Every connection slot, in the order of the given addresses, then the
    /// ones `M` answers added.
    slots: RwLock<Vec<Arc<Slot>>>,
    /// How many distinct addresses were given.
    given: usize,
    rr: AtomicUsize,
    /// The node an `M` named: preferred by the rotation while it is up.
    active: Mutex<Option<String>>,
    shared: Arc<Shared>,
    /// Dropped with the client: tells the connection tasks to stop.
    shutdown: watch::Sender<()>,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("addresses", &self.addresses())
            .field("connected", &self.connected())
            .finish()
    }
}

/// What an acquire was doing, for the error it ends with when its deadline
/// (wait plus grace) passes.
enum Doing {
    /// Waiting for a live connection.
    Connecting,
    /// Waiting for room on a connection (local queueing).
    Queueing,
    /// Waiting for `addr` to answer.
    Asking(String),
    /// Following `M` answers, or waiting after `M key -`.
    Redirected,
}

/// An acquire's progress, kept outside its future so that its deadline can
/// say what did not answer.
struct AcquireState {
    doing: Doing,
    /// The last failed attempt: what the acquire ends with if its wait runs
    /// out before another attempt could be made.
    failure: Option<Error>,
}

impl Client {
    /// Connects with default settings (see [`ClientBuilder`]).
    pub async fn connect<I, S>(addrs: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(addrs).connect().await
    }

    /// A builder, to change timeouts before connecting.
    pub fn builder<I, S>(addrs: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(addrs)
    }

    fn timing(&self) -> &Timing {
        &self.inner.shared.timing
    }

    /// The distinct addresses the client knows, given ones first, then the
    /// ones `M` answers named.
    pub fn addresses(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for slot in read(&self.inner.slots).iter() {
            if !out.contains(&slot.addr) {
                out.push(slot.addr.clone());
            }
        }
        out
    }

    /// How many connections are up right now.
    pub fn connected(&self) -> usize {
        read(&self.inner.slots)
            .iter()
            .filter(|s| s.live().is_some())
            .count()
    }

    /// How many connections the client keeps (up or not).
    pub fn connections(&self) -> usize {
        read(&self.inner.slots).len()
    }

    /// Requests taken by a connection's writer (being written or written)
    /// and not yet answered: a gauge for monitoring, in which waiting
    /// acquires count (liveness probes do not). Once a request counts here,
    /// anything handed to the same connection later is written after it.
    pub fn pending_requests(&self) -> usize {
        self.inner.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Acquires `key` for `lease`, waiting at most `wait` (`None` or zero:
    /// no limit) in the server's FIFO queue.
    ///
    /// `Ok(Acquired::Granted(grant))`: the lock is held until released or
    /// until the lease runs out; `Ok(Acquired::TimedOut)`: a node answered
    /// that the wait ran out (or the request waited in the client's own
    /// queue for all of it), and nothing is held. Errors:
    /// [`Error::InvalidArgument`] (checked before sending: key of 1..=250
    /// bytes in 0x21..=0x7E or >= 0x80, lease 1 ms..=86400 s, wait <= 86400
    /// s; millisecond resolution, the lease rounded down and the wait up),
    /// [`Error::Connection`], [`Error::NoActiveNode`], [`Error::Protocol`].
    ///
    /// With a wait, the call ends by the wait plus the acquire grace (1 s by
    /// default) whatever the nodes do: if the node asked last has not
    /// answered by then, [`Error::Connection`] names it. If the wait runs
    /// out while the request is between attempts (its connection died, a
    /// node answered `M`: no node was active, or it was being redirected,
    /// or an `M` named a node that could not be reached),
    /// the error of the last attempt is returned rather than `TimedOut`. Without a wait, a connection that dies is still
    /// noticed (liveness probes) and the request moves on.
    ///
    /// If the future is dropped after the request was sent, the server keeps
    /// the request queued (it belongs to the connection); should it be
    /// granted later, the client releases it at once.
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Acquired, Error> {
        self.acquire_kind(key, LockKind::Exclusive, lease, wait)
            .await
    }

    /// [`Client::acquire`] of a grant of `kind`: exclusive (what `acquire`
    /// asks for), shared (a read lock beside other shared holders), or one
    /// of a semaphore's permits. Each grant has its own token and lease,
    /// and is released and renewed like an exclusive one (a
    /// [`LockGuard`], [`Client::release`], [`Client::renew`]).
    ///
    /// Besides [`Client::acquire`]'s errors: [`Error::WrongKind`] when the
    /// key is of another kind (a semaphore, or one of another limit, or a
    /// lock for a permit); nothing changed. [`Error::InvalidArgument`] for
    /// a limit of 0 or above 65536. A node that predates shared locks, or
    /// an active whose follower runs a release that cannot replicate them, answers with an
    /// `E`: [`Error::Protocol`].
    pub async fn acquire_kind(
        &self,
        key: impl AsRef<[u8]>,
        kind: LockKind,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Acquired, Error> {
        let key = key.as_ref();
        check_key(key)?;
        if let LockKind::Permits(n) = kind
            && !(1..=ringlock_proto::MAX_PERMITS).contains(&n)
        {
            return Err(Error::InvalidArgument(format!(
                "a semaphore has 1 to {} permits, not {n}",
                ringlock_proto::MAX_PERMITS
            )));
        }
        let lease_ms = lease_ms(lease)?;
        let wait_ms = wait_ms(wait)?;
        let started = Instant::now();
        let mut state = AcquireState {
            doing: Doing::Connecting,
            failure: None,
        };
        if wait_ms == 0 {
            return self
                .acquire_loop(key, kind, lease_ms, 0, started, &mut state)
                .await;
        }
        let wait = Duration::from_millis(wait_ms);
        let deadline = started + wait + self.timing().acquire_grace;
        let attempt = self.acquire_loop(key, kind, lease_ms, wait_ms, started, &mut state);
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => {
                let within = format!(
                    "{:?} (its wait, {wait:?}, plus {:?} of grace)",
                    wait + self.timing().acquire_grace,
                    self.timing().acquire_grace
                );
                match state.doing {
                    Doing::Asking(addr) => Err(Error::Connection(format!(
                        "{addr} did not answer the acquire of {} within {within}",
                        String::from_utf8_lossy(key)
                    ))),
                    Doing::Connecting => Err(Error::Connection(format!(
                        "no connection within {within}: {}",
                        self.why_no_connection()
                    ))),
                    Doing::Redirected => Err(state.failure.unwrap_or(Error::NoActiveNode)),
                    Doing::Queueing => Ok(Acquired::TimedOut),
                }
            }
        }
    }

    #[expect(clippy::too_many_lines)]
    async fn acquire_loop(
        &self,
        key: &[u8],
        kind: LockKind,
        lease_ms: u64,
        wait_ms: u64,
        started: Instant,
        state: &mut AcquireState,
    ) -> Result<Acquired, Error> {
        let total = Duration::from_millis(wait_ms);
        let ran_out = |state: &mut AcquireState| match state.failure.take() {
            Some(e) => Err(e),
            None => Ok(Acquired::TimedOut),
        };
        let mut failed = 0usize;
        let mut asked = false;
        let mut moves = Moves::new(self.timing().no_active_timeout);
        loop {
            state.doing = Doing::Connecting;
            let Some(conn) = self.wait_live(None, self.timing().connect_timeout).await else {
                return Err(Error::Connection(self.why_no_connection()));
            };
            // Local queueing: wait for room on this connection (within the
            // wait, if there is one).
            state.doing = Doing::Queueing;
            let room = conn.acquires.clone().acquire_owned();
            let room = if wait_ms == 0 {
                room.await
            } else {
                match tokio::time::timeout_at(started + total, room).await {
                    Ok(room) => room,
                    Err(_) => return ran_out(state),
                }
            };
            let Ok(permit) = room else {
                failed += 1;
                let why = format!("{}: the connection closed", conn.addr);
                if failed >= self.connections() {
                    return Err(self.cut_off(failed, &why));
                }
                state.failure = Some(Error::Connection(why));
                continue;
            };
            // The wait is the server's to count: the first attempt always
            // goes out (with at least the shortest wait), however long
            // finding a connection took, so that a free key is granted
            // rather than reported held. Later attempts carry what is left.
            let wait_now = if wait_ms == 0 {
                0
            } else {
                let elapsed = started.elapsed();
                if elapsed < total {
                    ceil_ms(total - elapsed)
                } else if asked {
                    return ran_out(state);
                } else {
                    1
                }
            };
            asked = true;
            let mut line = Vec::with_capacity(key.len() + 40);
            let op = kind.line(key, lease_ms, wait_now, &mut line);
            let sent = Instant::now();
            state.doing = Doing::Asking(conn.addr.clone());
            let reply = conn.call(op, key, line, Some(permit)).await;
            drop(conn);
            match reply {
                Reply::Granted(token) => {
                    let lease = Duration::from_millis(lease_ms);
                    return Ok(Acquired::Granted(Grant {
                        key: key.to_vec(),
                        token,
                        lease,
                        deadline: sent + lease,
                    }));
                }
                Reply::TimedOut => return Ok(Acquired::TimedOut),
                Reply::Moved(to) => {
                    // No node said the wait ran out: if it runs out before
                    // another node answers, the acquire ends with
                    // NoActiveNode (`M key -` or `M key addr` alike), or an
                    // error naming a named node that could not be reached.
                    state.doing = Doing::Redirected;
                    // A node that redirects decided nothing: the attempt
                    // at the node it names goes out (with at least the
                    // shortest wait) even if the wait ran out meanwhile, so
                    // a try-lock during a failover asks the new active.
                    asked = false;
                    state.failure = Some(match &to {
                        None => Error::NoActiveNode,
                        Some(addr) => self.unreached(addr),
                    });
                    if moves.moved(self, to.clone()).await? {
                        state.failure = Some(Error::NoActiveNode);
                    } else if let Some(addr) = &to {
                        state.failure = Some(self.unreached(addr));
                    }
                }
                Reply::Lost(why) => {
                    failed += 1;
                    if failed >= self.connections() {
                        return Err(self.cut_off(failed, &why));
                    }
                    state.failure = Some(Error::Connection(why));
                }
                Reply::Protocol(why) => return Err(Error::from_refusal(why)),
                Reply::Refused(limit) => return Err(wrong_kind(key, limit)),
                other => return Err(unexpected("A", &other)),
            }
        }
    }

    /// Like [`Client::acquire`], but returns a guard that releases the lock
    /// when dropped, and [`Error::Timeout`] if the wait ran out.
    pub async fn lock(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        match self.acquire(key, lease, wait).await? {
            Acquired::Granted(grant) => Ok(LockGuard {
                client: self.clone(),
                grant,
                armed: true,
            }),
            Acquired::TimedOut => Err(Error::Timeout),
        }
    }

    /// One attempt at `key`, with the shortest wait the protocol allows
    /// ([`TRY_WAIT`], 1 ms: a wait of 0 would mean no limit), like flock's
    /// `-n`. `Ok(Acquired::TimedOut)`: someone else holds it.
    pub async fn try_acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Acquired, Error> {
        self.acquire(key, lease, Some(TRY_WAIT)).await
    }

    /// Like [`Client::try_acquire`], with a guard: `Ok(None)` if someone
    /// else holds the lock.
    pub async fn try_lock(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        match self.try_acquire(key, lease).await? {
            Acquired::Granted(grant) => Ok(Some(LockGuard {
                client: self.clone(),
                grant,
                armed: true,
            })),
            Acquired::TimedOut => Ok(None),
        }
    }

    /// [`Client::lock`] of a grant of `kind` ([`Client::acquire_kind`]).
    pub async fn lock_kind(
        &self,
        key: impl AsRef<[u8]>,
        kind: LockKind,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        match self.acquire_kind(key, kind, lease, wait).await? {
            Acquired::Granted(grant) => Ok(LockGuard {
                client: self.clone(),
                grant,
                armed: true,
            }),
            Acquired::TimedOut => Err(Error::Timeout),
        }
    }

    /// [`Client::lock_renewing`] of a grant of `kind`: renewed and watched
    /// exactly as an exclusive lock ([`RenewingGuard`]).
    pub async fn lock_renewing_kind(
        &self,
        key: impl AsRef<[u8]>,
        kind: LockKind,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<RenewingGuard, Error> {
        Ok(self.lock_kind(key, kind, lease, wait).await?.keep_renewed())
    }

    /// Like [`Client::lock`], and the lock is then renewed in the background
    /// at a third of its lease for as long as the guard lives (see
    /// [`RenewingGuard`]: it says when the lock is lost).
    pub async fn lock_renewing(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<RenewingGuard, Error> {
        Ok(self.lock(key, lease, wait).await?.keep_renewed())
    }

    /// Releases the grant of `key` that carries `token`. `Ok(true)`: it was
    /// held and is released (the next waiter, if any, has it); `Ok(false)`:
    /// no grant of `key` carries `token` (released before, expired, never
    /// issued); after a connection failure and a retry, `false` can also mean
    /// the first attempt had landed. Retried every 200 ms for 5 s on
    /// connection trouble, each attempt bounded by the request timeout, then
    /// [`Error::Connection`] (or [`Error::NoActiveNode`]).
    pub async fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, Error> {
        let key = key.as_ref();
        check_key(key)?;
        check_token(token)?;
        let mut line = Vec::with_capacity(key.len() + 24);
        Line::Release { key, token }.encode(&mut line);
        let until = Instant::now() + self.timing().retry_for;
        self.retrying(Op::Release, key, line, until, &mut |_| {})
            .await
            .map(|(held, _)| held)
    }

    /// Releases `grant` (see [`Client::release`]).
    pub async fn release_grant(&self, grant: &Grant) -> Result<bool, Error> {
        self.release(&grant.key, grant.token).await
    }

    /// Renews the grant of `key` with `token`: it now expires `lease` from
    /// when the server reads this. `Ok(false)`: no such grant (it expired or
    /// was released). Retried like a release.
    pub async fn renew(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        lease: Duration,
    ) -> Result<bool, Error> {
        let key = key.as_ref();
        let until = Instant::now() + self.timing().retry_for;
        self.renew_until(key, token, lease, until, &mut |_| {})
            .await
            .map(|(held, _)| held)
    }

    /// Renews `grant` for `lease` and, if it was held, moves its deadline.
    pub async fn renew_grant(&self, grant: &mut Grant, lease: Duration) -> Result<bool, Error> {
        let until = Instant::now() + self.timing().retry_for;
        let (held, sent) = self
            .renew_until(&grant.key, grant.token, lease, until, &mut |_| {})
            .await?;
        if held {
            let lease = Duration::from_millis(lease_ms(lease)?);
            grant.lease = lease;
            grant.deadline = sent + lease;
        }
        Ok(held)
    }

    /// A renew retried until `until`; `trouble` hears of each failed
    /// attempt. Gives the flag and when the attempt that got it was sent.
    pub(crate) async fn renew_until(
        &self,
        key: &[u8],
        token: u64,
        lease: Duration,
        until: Instant,
        trouble: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(bool, Instant), Error> {
        check_key(key)?;
        check_token(token)?;
        let lease_ms = lease_ms(lease)?;
        let mut line = Vec::with_capacity(key.len() + 32);
        Line::Renew {
            key,
            token,
            lease_ms,
        }
        .encode(&mut line);
        self.retrying(Op::Renew, key, line, until, trouble).await
    }

    /// Asks every known address for its status (`S`), on its live
    /// connection or, if it has none, on a one-off connection. Never fails
    /// as a whole: each address has its own result, had within the request
    /// timeout (live connection) or the connect timeout (one-off).
    pub async fn status(&self) -> Vec<AddrStatus> {
        let mut tasks = Vec::new();
        for addr in self.addresses() {
            let client = self.clone();
            tasks.push(tokio::spawn(async move {
                let status = client.status_of(&addr).await;
                AddrStatus { addr, status }
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for task in tasks {
            if let Ok(status) = task.await {
                out.push(status);
            }
        }
        out
    }

    async fn status_of(&self, addr: &str) -> Result<NodeStatus, Error> {
        if let Some(conn) = self.pick(Some(addr)) {
            let limit = self.timing().request_timeout;
            let call = conn.call(Op::Status, b"", b"S\n".to_vec(), None);
            match tokio::time::timeout(limit, call).await {
                Ok(Reply::Status {
                    role,
                    active,
                    token,
                }) => {
                    return Ok(NodeStatus {
                        role,
                        active,
                        token,
                    });
                }
                Ok(Reply::Lost(_)) => {}
                Ok(Reply::Protocol(why)) => return Err(Error::from_refusal(why)),
                Ok(other) => return Err(unexpected("S", &other)),
                Err(_) => {
                    return Err(Error::Connection(format!(
                        "{addr}: no answer to S within {limit:?}"
                    )));
                }
            }
        }
        node_status(addr, self.timing().connect_timeout).await
    }

    /// A barrier: sends `S` on every live connection and waits for the
    /// answers. When it returns `Ok`, every request this client had handed to
    /// a connection before the call has been read by its server (a node
    /// answers one connection's requests in order of reading). Errors if a
    /// connection dropped meanwhile, none is up, or an answer did not come
    /// within the request timeout.
    pub async fn sync(&self) -> Result<(), Error> {
        let conns: Vec<Arc<Conn>> = read(&self.inner.slots)
            .iter()
            .filter_map(|s| s.live())
            .collect();
        if conns.is_empty() {
            return Err(Error::Connection(self.why_no_connection()));
        }
        let mut answers = Vec::with_capacity(conns.len());
        for conn in &conns {
            let (tx, rx) = oneshot::channel();
            let req = Request {
                op: Op::Status,
                key: Vec::new(),
                line: b"S\n".to_vec(),
                reply: Some(tx),
                permit: None,
                in_flight: None,
                probe: false,
            };
            if conn.submit(req).is_err() {
                return Err(Error::Connection("a connection dropped during sync".into()));
            }
            answers.push((conn.addr.clone(), rx));
        }
        let limit = self.timing().request_timeout;
        let until = Instant::now() + limit;
        for (addr, rx) in answers {
            let reply = match tokio::time::timeout_at(until, rx).await {
                Ok(reply) => reply.unwrap_or(Reply::Lost(String::new())),
                Err(_) => {
                    return Err(Error::Connection(format!(
                        "sync: {addr} did not answer S within {limit:?}"
                    )));
                }
            };
            match reply {
                Reply::Status { .. } => {}
                Reply::Protocol(why) => return Err(Error::from_refusal(why)),
                Reply::Lost(_) => {
                    return Err(Error::Connection("a connection dropped during sync".into()));
                }
                other => return Err(unexpected("S", &other)),
            }
        }
        Ok(())
    }

    /// Sends a release or renew, retrying every `retry_every` until `until`
    /// when no connection carries it, and following `M`. Each attempt is
    /// bounded by the request timeout (and by `until`). `trouble` hears of
    /// each failed attempt. Returns the flag and when the request that got
    /// it was sent.
    async fn retrying(
        &self,
        op: Op,
        key: &[u8],
        line: Vec<u8>,
        until: Instant,
        trouble: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(bool, Instant), Error> {
        let timing = self.timing().clone();
        let what = if op == Op::Release {
            "release"
        } else {
            "renew"
        };
        let mut last = String::from("no attempt could be made");
        // The nodes `M` answers named for this request: a new one is tried
        // at once, a repeated one after the usual retry delay.
        let mut named: Vec<String> = Vec::new();
        let mut no_active = false;
        let started = Instant::now();
        loop {
            let now = Instant::now();
            if now >= until {
                break;
            }
            if let Some(conn) = self.pick(None) {
                let sent = now;
                let bound = timing.request_timeout.min(until - now);
                let call = conn.call(op, key, line.clone(), None);
                let reply = match tokio::time::timeout(bound, call).await {
                    Ok(reply) => reply,
                    Err(_) => Reply::Lost(format!("{} did not answer within {bound:?}", conn.addr)),
                };
                drop(conn);
                no_active = false;
                match reply {
                    Reply::Flag(held) => return Ok((held, sent)),
                    Reply::Moved(Some(addr)) => {
                        let left = until.saturating_duration_since(Instant::now());
                        let within = left.min(timing.connect_timeout);
                        last = format!("redirected to {addr}");
                        let news = !named.contains(&addr) && named.len() <= MAX_REDIRECT_ADDRS;
                        if news {
                            named.push(addr.clone());
                        }
                        if self.follow(addr, within).await && news {
                            continue;
                        }
                    }
                    Reply::Moved(None) => {
                        last = "no active node".into();
                        no_active = true;
                    }
                    Reply::Lost(why) => last = why,
                    Reply::Protocol(why) => return Err(Error::from_refusal(why)),
                    other => {
                        return Err(unexpected(
                            if op == Op::Release { "R" } else { "N" },
                            &other,
                        ));
                    }
                }
            } else {
                last = self.why_no_connection();
            }
            trouble(&last);
            if Instant::now() + timing.retry_every > until {
                break;
            }
            tokio::time::sleep(timing.retry_every).await;
        }
        if no_active {
            return Err(Error::NoActiveNode);
        }
        Err(Error::Connection(format!(
            "{what} gave up after {:?}: {last}",
            started.elapsed()
        )))
    }

    /// A live connection: round-robin over the preferred (active) node's
    /// connections if it has any up, else over all. With `addr`, only that
    /// address's connections.
    fn pick(&self, addr: Option<&str>) -> Option<Arc<Conn>> {
        let slots = read(&self.inner.slots);
        let n = slots.len();
        if n == 0 {
            return None;
        }
        let start = self.inner.rr.fetch_add(1, Ordering::Relaxed);
        let preferred = match addr {
            Some(addr) => Some(addr.to_string()),
            None => lock(&self.inner.active).clone(),
        };
        if let Some(want) = preferred {
            for i in 0..n {
                let slot = &slots[(start + i) % n];
                if slot.addr == want
                    && let Some(conn) = slot.live()
                {
                    return Some(conn);
                }
            }
            if addr.is_some() {
                return None;
            }
        }
        (0..n).find_map(|i| slots[(start + i) % n].live())
    }

    /// Waits up to `within` for a live connection (see [`Client::pick`]).
    async fn wait_live(&self, addr: Option<&str>, within: Duration) -> Option<Arc<Conn>> {
        let mut changes = self.inner.shared.changed.subscribe();
        let until = Instant::now() + within;
        loop {
            changes.borrow_and_update();
            if let Some(conn) = self.pick(addr) {
                return Some(conn);
            }
            match tokio::time::timeout_at(until, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return self.pick(addr),
            }
        }
    }

    /// Follows an `M` naming `addr`: makes it the preferred node and waits
    /// up to `within` for a live connection to it. A node the client has no
    /// connection to is dialled now, not at its next redial tick: an
    /// address not known yet gets a slot of its own, a known one's slot is
    /// woken out of its redial wait ([`Slot::dial_now`]: at most one dial
    /// under way per slot, redirect dials that keep failing spaced 50 ms
    /// up to 1 s). The request waits for that dial (the hello included). If
    /// it fails, or a redirect dial of the address failed too recently, the
    /// preference is dropped again and the request goes on by its own
    /// back-off.
    async fn follow(&self, addr: String, within: Duration) -> bool {
        // Under the write lock: requests on other threads that meet an `M`
        // naming the same new node at once must not each add a slot (nor
        // together pass the cap).
        let target = {
            let mut slots = self.inner.slots.write().unwrap_or_else(|e| e.into_inner());
            let mine: Vec<&Arc<Slot>> = slots.iter().filter(|s| s.addr == addr).collect();
            if mine.iter().any(|s| s.live().is_some()) {
                Target::Up
            } else if let Some(slot) = mine
                .iter()
                .find(|s| s.is_dialing())
                .or_else(|| mine.first())
            {
                match slot.dial_now() {
                    DialNow::Wait(n) => Target::Dial((*slot).clone(), n),
                    DialNow::TooSoon => return false,
                }
            } else {
                let mut seen: Vec<&str> = Vec::new();
                for s in slots.iter() {
                    if !seen.contains(&s.addr.as_str()) {
                        seen.push(&s.addr);
                    }
                }
                if !is_host_port(&addr) {
                    // Not an address this client could dial: not followed
                    // (as in the Python client).
                    return false;
                }
                if seen.len().saturating_sub(self.inner.given) >= MAX_REDIRECT_ADDRS {
                    // A cluster has at most 16 nodes: a server naming ever
                    // new addresses is not followed further.
                    return false;
                }
                let slot = Arc::new(Slot::new(addr.clone()));
                slots.push(slot.clone());
                Target::New(slot)
            }
        };
        let target = match target {
            Target::New(slot) => {
                self.run_slot(slot.clone());
                Target::Dial(slot, 1)
            }
            other => other,
        };
        *lock(&self.inner.active) = Some(addr.clone());
        let up = match target {
            Target::Dial(slot, n) => self.wait_dial(&slot, n, within).await.is_some(),
            _ => true,
        };
        if !up {
            let mut active = lock(&self.inner.active);
            if active.as_deref() == Some(addr.as_str()) {
                *active = None;
            }
        }
        up
    }

    /// Waits up to `within` for a live connection to `slot`'s address, or
    /// until its dial number `n` has ended without one.
    async fn wait_dial(&self, slot: &Slot, n: u64, within: Duration) -> Option<Arc<Conn>> {
        let mut changes = self.inner.shared.changed.subscribe();
        let until = Instant::now() + within;
        loop {
            changes.borrow_and_update();
            if let Some(conn) = self.pick(Some(&slot.addr)) {
                return Some(conn);
            }
            if slot.dial_ended(n) {
                return None;
            }
            match tokio::time::timeout_at(until, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return self.pick(Some(&slot.addr)),
            }
        }
    }

    fn add_slot(&self, addr: String) -> Arc<Slot> {
        let slot = Arc::new(Slot::new(addr));
        self.inner
            .slots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(slot.clone());
        self.run_slot(slot.clone());
        slot
    }

    /// Starts the background task of a slot just added.
    fn run_slot(&self, slot: Arc<Slot>) {
        tokio::spawn(conn::run_slot(
            slot,
            self.inner.shared.clone(),
            Arc::downgrade(&self.inner),
            self.inner.shutdown.subscribe(),
        ));
    }

    /// The error of an acquire redirected to `addr` that could not reach it.
    fn unreached(&self, addr: &str) -> Error {
        let why = read(&self.inner.slots)
            .iter()
            .find(|s| s.addr == addr)
            .and_then(|s| s.last_error())
            .unwrap_or_else(|| format!("{addr}: not connected yet"));
        Error::Connection(format!(
            "redirected to {addr}, which could not be reached ({why})"
        ))
    }

    fn why_no_connection(&self) -> String {
        let slots = read(&self.inner.slots);
        let mut errors: Vec<String> = Vec::new();
        for slot in slots.iter() {
            let why = slot
                .last_error()
                .unwrap_or_else(|| format!("{}: not connected yet", slot.addr));
            if !errors.contains(&why) {
                errors.push(why);
            }
        }
        format!("no live connection ({})", errors.join("; "))
    }

    fn cut_off(&self, failed: usize, last: &str) -> Error {
        Error::Connection(format!(
            "no answer on {failed} connection(s) in a row; the last: {last}"
        ))
    }
}

/// Where [`Client::follow`] finds the node an `M` named.
enum Target {
    /// A connection to it is up.
    Up,
    /// Not a known address: this slot was just added for it.
    New(Arc<Slot>),
    /// This slot's dial number `n` decides.
    Dial(Arc<Slot>, u64),
}

/// True for `host:port` (`[v6]:port` too): a host of at least one byte,
/// then a port of 1 to 65535, as an `M` answer must name a node.
fn is_host_port(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    }
}

/// Bounds the time spent following `M` answers.
struct Moves {
    first: Option<Instant>,
    /// The nodes `M` answers named so far for this request.
    named: Vec<String>,
    bound: Duration,
    backoff: Duration,
}

impl Moves {
    fn new(bound: Duration) -> Moves {
        Moves {
            first: None,
            named: Vec::new(),
            bound,
            backoff: Duration::from_millis(50),
        }
    }

    /// Handles one `M`: one that names a node no earlier `M` for this
    /// request named is followed at once (news: a failover happened);
    /// every `M key -`, and an `M` naming a node named before (a stale
    /// answer, or nodes sending the request around), waits a growing delay
    /// first. Gives up with [`Error::NoActiveNode`] once the bound has
    /// passed. `Ok(true)`: the named node is up (see [`Client::follow`]).
    async fn moved(&mut self, client: &Client, to: Option<String>) -> Result<bool, Error> {
        let first = *self.first.get_or_insert_with(Instant::now);
        if first.elapsed() >= self.bound {
            return Err(Error::NoActiveNode);
        }
        // (A server naming ever new nodes is news only so many times.)
        let news = match &to {
            Some(addr) if !self.named.contains(addr) && self.named.len() <= MAX_REDIRECT_ADDRS => {
                self.named.push(addr.clone());
                true
            }
            _ => false,
        };
        if !news {
            let left = self.bound.saturating_sub(first.elapsed());
            tokio::time::sleep(self.backoff.min(left)).await;
            self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
        }
        let Some(addr) = to else {
            return Ok(false);
        };
        let left = self.bound.saturating_sub(first.elapsed());
        Ok(client
            .follow(addr, left.min(client.timing().connect_timeout))
            .await)
    }
}

/// The longest `S` answer line read on a one-off connection.
const MAX_STATUS_LINE: usize = 4096;
/// The longest `H` answer line read: problems quote peer addresses and whole
/// `--peers` lists, a few KiB with 16 long addresses.
const MAX_HEALTH_LINE: usize = 64 * 1024;

/// Sends one request line to `addr` on a one-off connection and reads one
/// answer line (without its `\n`, at most `max` bytes), with `timeout` for
/// the whole exchange.
async fn one_off(
    dialer: Dialer,
    addr: &str,
    request: &[u8],
    max: usize,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let exchange = async {
        let (rd, mut wr) = dialer(addr)
            .await
            .map_err(|e| Error::Connection(format!("connect to {addr}: {}", conn::why(&e))))?;
        wr.write_all(request)
            .await
            .map_err(|e| Error::Connection(format!("write to {addr}: {}", conn::why(&e))))?;
        let mut line = Vec::new();
        let mut rd = BufReader::new(tokio::io::AsyncReadExt::take(rd, max as u64));
        rd.read_until(b'\n', &mut line)
            .await
            .map_err(|e| Error::Connection(format!("read from {addr}: {}", conn::why(&e))))?;
        if line.pop() != Some(b'\n') {
            if line.len() >= max {
                return Err(Error::Protocol(format!(
                    "answer line from {addr} longer than {max} bytes"
                )));
            }
            return Err(Error::Connection(format!("{addr} closed the connection")));
        }
        Ok(line)
    };
    let timeout = setting(timeout);
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::Connection(format!(
            "{addr}: no answer within {timeout:?}"
        ))),
    }
}

/// One lock of a node's table, as `V` (or, from an older node, `W` or
/// `L`) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub key: Vec<u8>,
    /// The holder's fencing token; 0 when nobody holds it (only held-back
    /// `T` answers keep it in the table).
    pub token: u64,
    /// The holder's lease left, ms.
    pub lease_ms: u64,
    /// Acquires waiting for it.
    pub waiters: u64,
    /// Who holds it; `None` from a node older than `W`.
    pub holder: Option<HolderInfo>,
    /// How it is held; `None` from a node older than `V`.
    pub kind: Option<KindInfo>,
}

/// How a key is held, as `V` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInfo {
    /// Exclusively, shared, as a semaphore, or by nobody.
    pub held: Held,
    /// A semaphore's limit; 0 for any other key.
    pub limit: u32,
    /// How many grants hold it: 1 exclusive one, the shared holders or
    /// the permits held.
    pub holders: u64,
}

/// Who holds a lock, or waits for one: what the node knows of the
/// connection that asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HolderInfo {
    /// The connection's address as the node saw it (`host:port`); `None`
    /// when not known (a grant replicated by an older node).
    pub addr: Option<String>,
    /// Its owner label ([`ClientBuilder::owner`]), if it set one.
    pub owner: Option<String>,
    /// How long it has held the lock (for a waiter: waited), ms; 0 for a
    /// lock nobody holds.
    pub for_ms: u64,
}

impl HolderInfo {
    fn of(holder: ringlock_proto::Holder<'_>, for_ms: u64) -> HolderInfo {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        HolderInfo {
            addr: holder.addr.map(text),
            owner: holder.owner.map(text),
            for_ms,
        }
    }
}

/// One key's queue, as `Q` tells it: [`lock_queue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// The key's lock with its holder; `None` if the key has no lock.
    pub lock: Option<LockInfo>,
    /// The first waiters (at most 100), oldest first: `for_ms` is how long
    /// each has waited.
    pub waiters: Vec<HolderInfo>,
    /// How many acquires wait in all (up to 65536), listed or not.
    pub waiting: u64,
}

/// One page of a node's lock table with each lock's holder and kind (`V
/// cursor limit [prefix]`, an operator's request; docs/protocol.md), on a
/// one-off connection with `timeout` for the whole exchange. Returns the
/// locks and the cursor of the next page (0: the listing is complete). A
/// node older than `V` answers `E`: then the page is asked again with `W`
/// on a new connection, and its locks come without their kind (`kind` is
/// `None`); a node older than `W` is asked with `L`, and its locks come
/// without holders either (`holder` is `None`). A node too old to know `L`
/// comes back as [`Error::Protocol`].
pub async fn list_locks(
    addr: &str,
    prefix: &[u8],
    cursor: u64,
    limit: u32,
    timeout: Duration,
) -> Result<(Vec<LockInfo>, u64), Error> {
    locks_or_older(conn::tcp_dialer(), addr, prefix, cursor, limit, timeout).await
}

/// [`list_locks`] over TLS (feature `tls`).
#[cfg(feature = "tls")]
pub async fn list_locks_tls(
    addr: &str,
    prefix: &[u8],
    cursor: u64,
    limit: u32,
    timeout: Duration,
    tls: &TlsConfig,
) -> Result<(Vec<LockInfo>, u64), Error> {
    locks_or_older(tls.dialer(), addr, prefix, cursor, limit, timeout).await
}

/// The list requests, newest first: what a page is asked with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListForm {
    /// `V`: with holders and kinds.
    Kinds,
    /// `W`: with holders.
    Who,
    /// `L`.
    Plain,
}

impl ListForm {
    /// The request of this form, its op and its line.
    fn request(self, cursor: u64, limit: u32, prefix: &[u8]) -> (&'static str, Vec<u8>) {
        use ringlock_proto::Request;
        let (op, request) = match self {
            ListForm::Kinds => (
                "V",
                Request::Kinds {
                    cursor,
                    limit,
                    prefix,
                },
            ),
            ListForm::Who => (
                "W",
                Request::Who {
                    cursor,
                    limit,
                    prefix,
                },
            ),
            ListForm::Plain => (
                "L",
                Request::List {
                    cursor,
                    limit,
                    prefix,
                },
            ),
        };
        let mut line = Vec::new();
        request.encode(&mut line);
        (op, line)
    }
}

/// `V`, then `W` from a node that answers `V` with `E`, then `L` from one
/// that answers `W` with `E`.
async fn locks_or_older(
    dialer: Dialer,
    addr: &str,
    prefix: &[u8],
    cursor: u64,
    limit: u32,
    timeout: Duration,
) -> Result<(Vec<LockInfo>, u64), Error> {
    let mut answer = Err(Error::Protocol(String::new()));
    for form in [ListForm::Kinds, ListForm::Who, ListForm::Plain] {
        answer = locks_via(dialer.clone(), addr, prefix, cursor, limit, timeout, form).await;
        match &answer {
            Err(Error::Protocol(why)) if why.contains(" says: E ") => continue,
            _ => break,
        }
    }
    answer
}

/// One page with `V`, `W` or `L` (`form`).
async fn locks_via(
    dialer: Dialer,
    addr: &str,
    prefix: &[u8],
    cursor: u64,
    limit: u32,
    timeout: Duration,
    form: ListForm,
) -> Result<(Vec<LockInfo>, u64), Error> {
    let (op, request) = form.request(cursor, limit, prefix);
    let exchange = async {
        let (rd, mut wr) = dialer(addr)
            .await
            .map_err(|e| Error::Connection(format!("connect to {addr}: {}", conn::why(&e))))?;
        wr.write_all(&request)
            .await
            .map_err(|e| Error::Connection(format!("write to {addr}: {}", conn::why(&e))))?;
        // At most `limit` lock lines and the end line, each bounded.
        let most = (u64::from(limit) + 1) * MAX_STATUS_LINE as u64;
        let mut rd = BufReader::new(tokio::io::AsyncReadExt::take(rd, most));
        let mut locks = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            rd.read_until(b'\n', &mut line)
                .await
                .map_err(|e| Error::Connection(format!("read from {addr}: {}", conn::why(&e))))?;
            if line.pop() != Some(b'\n') {
                return Err(Error::Connection(format!(
                    "{addr} closed the connection in the middle of an {op} answer"
                )));
            }
            let room = locks.len() < limit as usize;
            match (form, parse_answer(&line)) {
                (
                    ListForm::Plain,
                    Ok(Answer::Lock {
                        key,
                        token,
                        lease_ms,
                        waiters,
                    }),
                ) if room => locks.push(LockInfo {
                    key: key.to_vec(),
                    token,
                    lease_ms,
                    waiters,
                    holder: None,
                    kind: None,
                }),
                (ListForm::Who, Ok(answer @ Answer::LockWho { .. }))
                | (ListForm::Kinds, Ok(answer @ Answer::LockKinds { .. }))
                    if room =>
                {
                    locks.extend(lock_info(answer));
                }
                (ListForm::Plain, Ok(Answer::ListEnd { cursor }))
                | (ListForm::Who, Ok(Answer::WhoEnd { cursor }))
                | (ListForm::Kinds, Ok(Answer::KindsEnd { cursor })) => {
                    return Ok((locks, cursor));
                }
                (_, Ok(Answer::Error { reason })) => {
                    return Err(Error::Protocol(format!(
                        "{addr} says: E {}",
                        String::from_utf8_lossy(reason)
                    )));
                }
                _ => {
                    return Err(Error::Protocol(format!(
                        "{addr} answered {op} with {:?}",
                        String::from_utf8_lossy(&line)
                    )));
                }
            }
        }
    };
    let timeout = setting(timeout);
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::Connection(format!(
            "{addr}: no answer within {timeout:?}"
        ))),
    }
}

/// The [`LockInfo`] of a `K` line with its holder (`W`, `Q`), and its
/// kind (`V`).
fn lock_info(answer: Answer<'_>) -> Option<LockInfo> {
    let (key, token, lease_ms, waiters, held_ms, holder, kind) = match answer {
        Answer::LockWho {
            key,
            token,
            lease_ms,
            waiters,
            held_ms,
            holder,
        } => (key, token, lease_ms, waiters, held_ms, holder, None),
        Answer::LockKinds {
            key,
            token,
            lease_ms,
            waiters,
            held_ms,
            holder,
            held,
            limit,
            holders,
        } => {
            let kind = KindInfo {
                held,
                limit,
                holders,
            };
            (key, token, lease_ms, waiters, held_ms, holder, Some(kind))
        }
        _ => return None,
    };
    Some(LockInfo {
        key: key.to_vec(),
        token,
        lease_ms,
        waiters,
        holder: Some(HolderInfo::of(holder, held_ms)),
        kind,
    })
}

/// Who holds `key` and who waits for it (`Q key`, an operator's request;
/// docs/protocol.md), on a one-off connection with `timeout` for the whole
/// exchange. Ask the active node: a standby knows the holder (replicated)
/// but has no waiters. A node older than `Q` answers `E`, which comes back
/// as [`Error::Protocol`].
pub async fn lock_queue(addr: &str, key: &[u8], timeout: Duration) -> Result<QueueInfo, Error> {
    queue_via(conn::tcp_dialer(), addr, key, timeout).await
}

/// [`lock_queue`] over TLS (feature `tls`).
#[cfg(feature = "tls")]
pub async fn lock_queue_tls(
    addr: &str,
    key: &[u8],
    timeout: Duration,
    tls: &TlsConfig,
) -> Result<QueueInfo, Error> {
    queue_via(tls.dialer(), addr, key, timeout).await
}

async fn queue_via(
    dialer: Dialer,
    addr: &str,
    key: &[u8],
    timeout: Duration,
) -> Result<QueueInfo, Error> {
    check_key(key)?;
    let mut request = Vec::new();
    ringlock_proto::Request::Queue { key }.encode(&mut request);
    let exchange = async {
        let (rd, mut wr) = dialer(addr)
            .await
            .map_err(|e| Error::Connection(format!("connect to {addr}: {}", conn::why(&e))))?;
        wr.write_all(&request)
            .await
            .map_err(|e| Error::Connection(format!("write to {addr}: {}", conn::why(&e))))?;
        // A lock line, the listed waiters and the end line, each bounded.
        let most = (ringlock_proto::MAX_QUEUE_LISTED as u64 + 2) * MAX_STATUS_LINE as u64;
        let mut rd = BufReader::new(tokio::io::AsyncReadExt::take(rd, most));
        let mut queue = QueueInfo {
            lock: None,
            waiters: Vec::new(),
            waiting: 0,
        };
        let mut line = Vec::new();
        loop {
            line.clear();
            rd.read_until(b'\n', &mut line)
                .await
                .map_err(|e| Error::Connection(format!("read from {addr}: {}", conn::why(&e))))?;
            if line.pop() != Some(b'\n') {
                return Err(Error::Connection(format!(
                    "{addr} closed the connection in the middle of a Q answer"
                )));
            }
            match parse_answer(&line) {
                Ok(answer @ Answer::LockWho { key: k, .. })
                    if k == key && queue.lock.is_none() && queue.waiters.is_empty() =>
                {
                    queue.lock = lock_info(answer);
                }
                Ok(Answer::Waiter { waited_ms, holder })
                    if queue.waiters.len() < ringlock_proto::MAX_QUEUE_LISTED =>
                {
                    queue.waiters.push(HolderInfo::of(holder, waited_ms));
                }
                Ok(Answer::QueueEnd { key: k, waiters }) if k == key => {
                    queue.waiting = waiters;
                    return Ok(queue);
                }
                Ok(Answer::Error { reason }) => {
                    return Err(Error::Protocol(format!(
                        "{addr} says: E {}",
                        String::from_utf8_lossy(reason)
                    )));
                }
                _ => {
                    return Err(Error::Protocol(format!(
                        "{addr} answered Q with {:?}",
                        String::from_utf8_lossy(&line)
                    )));
                }
            }
        }
    };
    let timeout = setting(timeout);
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::Connection(format!(
            "{addr}: no answer within {timeout:?}"
        ))),
    }
}

/// Asks one node whether it knows of a problem in its cluster (`H`), on a
/// one-off connection with `timeout` for the whole exchange: `None` when it
/// knows of none. A server that does not know `H` counts as knowing none.
pub async fn node_problem(addr: &str, timeout: Duration) -> Result<Option<String>, Error> {
    problem_via(conn::tcp_dialer(), addr, timeout).await
}

/// [`node_problem`] over TLS (feature `tls`).
#[cfg(feature = "tls")]
pub async fn node_problem_tls(
    addr: &str,
    timeout: Duration,
    tls: &TlsConfig,
) -> Result<Option<String>, Error> {
    problem_via(tls.dialer(), addr, timeout).await
}

async fn problem_via(
    dialer: Dialer,
    addr: &str,
    timeout: Duration,
) -> Result<Option<String>, Error> {
    let line = one_off(dialer, addr, b"H\n", MAX_HEALTH_LINE, timeout).await?;
    match parse_answer(&line) {
        Ok(Answer::Health { problem }) => {
            Ok(problem.map(|p| String::from_utf8_lossy(p).into_owned()))
        }
        Ok(Answer::Error { .. }) => Ok(None),
        _ => Err(Error::Protocol(format!(
            "{addr} answered H with {:?}",
            String::from_utf8_lossy(&line)
        ))),
    }
}

/// Asks one node for its status on a one-off connection, with `timeout` for
/// the whole exchange.
pub async fn node_status(addr: &str, timeout: Duration) -> Result<NodeStatus, Error> {
    status_via(conn::tcp_dialer(), addr, timeout).await
}

/// [`node_status`] over TLS (feature `tls`).
#[cfg(feature = "tls")]
pub async fn node_status_tls(
    addr: &str,
    timeout: Duration,
    tls: &TlsConfig,
) -> Result<NodeStatus, Error> {
    status_via(tls.dialer(), addr, timeout).await
}

async fn status_via(dialer: Dialer, addr: &str, timeout: Duration) -> Result<NodeStatus, Error> {
    let line = one_off(dialer, addr, b"S\n", MAX_STATUS_LINE, timeout).await?;
    match parse_answer(&line) {
        Ok(Answer::Status { role, addr, token }) => Ok(NodeStatus {
            role,
            active: addr.map(|a| String::from_utf8_lossy(a).into_owned()),
            token,
        }),
        Ok(Answer::Error { reason }) => Err(Error::Protocol(format!(
            "{addr} says: E {}",
            String::from_utf8_lossy(reason)
        ))),
        Ok(_) => Err(Error::Protocol(format!(
            "{addr} answered S with {:?}",
            String::from_utf8_lossy(&line)
        ))),
        Err(e) => Err(Error::Protocol(format!("{addr}: {e}"))),
    }
}

/// Releases a grant whose acquirer is gone, from inside a connection task.
pub(crate) fn release_in_background(client: &Weak<Inner>, key: Vec<u8>, token: u64) {
    if let Some(inner) = client.upgrade() {
        release_with_client(&Client { inner }, key, token);
    }
}

/// Spawns a release (with the usual retries) on the current runtime, if any.
pub(crate) fn release_with_client(client: &Client, key: Vec<u8>, token: u64) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let client = client.clone();
        handle.spawn(async move {
            let _ = client.release(key, token).await;
        });
    }
}

fn unexpected(op: &str, reply: &Reply) -> Error {
    Error::Protocol(format!("unexpected answer to {op}: {reply:?}"))
}

/// Checks a key against the protocol before anything is sent.
pub fn check_key(key: &[u8]) -> Result<(), Error> {
    if is_valid_key(key) {
        Ok(())
    } else if key.is_empty() {
        Err(Error::InvalidArgument("empty key".into()))
    } else if key.len() > ringlock_proto::MAX_KEY {
        Err(Error::InvalidArgument(format!(
            "key of {} bytes (at most {})",
            key.len(),
            ringlock_proto::MAX_KEY
        )))
    } else {
        Err(Error::InvalidArgument(format!(
            "key {:?} has a space or control byte",
            String::from_utf8_lossy(key)
        )))
    }
}

fn check_token(token: u64) -> Result<(), Error> {
    if token == 0 {
        return Err(Error::InvalidArgument("token 0 (tokens start at 1)".into()));
    }
    Ok(())
}

/// What an acquire asks for ([`Client::acquire_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockKind {
    /// The key alone (`A`): what [`Client::acquire`] asks for.
    #[default]
    Exclusive,
    /// The key beside other shared holders, never beside an exclusive one
    /// (`G`): a read lock. Fair: it waits behind a waiting exclusive
    /// acquire.
    Shared,
    /// One of at most this many permits of the key (`C`): a counting
    /// semaphore, 1 to 65536.
    Permits(u32),
}

impl LockKind {
    /// Appends the request line; returns the op its answer carries.
    fn line(self, key: &[u8], lease_ms: u64, wait_ms: u64, out: &mut Vec<u8>) -> Op {
        let (line, op) = match self {
            LockKind::Exclusive => (
                Line::Acquire {
                    key,
                    lease_ms,
                    wait_ms,
                },
                Op::Acquire,
            ),
            LockKind::Shared => (
                Line::Shared {
                    key,
                    lease_ms,
                    wait_ms,
                },
                Op::Shared,
            ),
            LockKind::Permits(limit) => (
                Line::Permit {
                    key,
                    limit,
                    lease_ms,
                    wait_ms,
                },
                Op::Permit,
            ),
        };
        line.encode(out);
        op
    }
}

/// A `G` or `C` refused for the key's kind (`limit` 0: a lock).
fn wrong_kind(key: &[u8], limit: u32) -> Error {
    let key = String::from_utf8_lossy(key);
    Error::WrongKind(if limit == 0 {
        format!("{key} is a lock (exclusive or shared), not a semaphore")
    } else {
        format!("{key} is a semaphore of {limit} permits")
    })
}

/// A lease in whole milliseconds (rounded down): 1 ms to 86400 s.
fn lease_ms(lease: Duration) -> Result<u64, Error> {
    let ms = lease.as_millis();
    if ms == 0 {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} (at least 1 ms)"
        )));
    }
    if ms > u128::from(MAX_DURATION_MS) {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} (at most 86400 s)"
        )));
    }
    Ok(ms as u64)
}

/// A wait in whole milliseconds (rounded up, so that a tiny wait does not
/// become 0, "no limit"): `None` and zero are 0.
fn wait_ms(wait: Option<Duration>) -> Result<u64, Error> {
    let Some(wait) = wait else { return Ok(0) };
    let ms = ceil_ms(wait);
    if ms > MAX_DURATION_MS {
        return Err(Error::InvalidArgument(format!(
            "wait {wait:?} (at most 86400 s)"
        )));
    }
    Ok(ms)
}

fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}
