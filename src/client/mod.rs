//! The official async client of ringlock (tokio).
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock::client::Client;
//!
//! # async fn demo() -> Result<(), ringlock::client::Error> {
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
//! Connection behaviour is that of every official client (PROTOCOL.md, "The
//! official clients"):
//!
//! - One persistent connection per address of the cluster's peer list, each
//!   run by a background task; given a single address, two connections to
//!   it. [`Client::connect`] returns as soon as one connection is up, and
//!   fails only if none could be made: every address refused or failed, or
//!   nothing answered within the connect timeout (3 s by default). The others
//!   keep being dialled in the background.
//! - A connection that drops leaves the rotation and is redialled every 3 s
//!   (measured from the previous dial: one that had been up for longer is
//!   redialled at once).
//! - Requests go round-robin over the live connections, pipelined: many
//!   tasks share one `Client` (it is `Clone + Send + Sync`), nothing waits for
//!   earlier answers. Answers are matched per connection by op and key exactly
//!   as the protocol says.
//! - At most 4096 acquires wait on one connection; more queue inside the
//!   client, so that the client's releases and renews never queue behind its
//!   own waiters.
//! - An acquire whose connection drops before its answer is sent again on the
//!   next connection (with what is left of its wait); after as many
//!   connections as the client has have failed it, [`Error::Connection`].
//! - An `M key addr` answer sends the request again to `addr` (dialled if it
//!   is not one of the known addresses) and makes that node the preferred
//!   one of the rotation. `M key -` (no active node known) is retried with a
//!   growing delay (50 ms up to 1 s) until the no-active timeout (10 s by
//!   default), then [`Error::NoActiveNode`].
//! - Releases and renews whose connection fails are retried every 200 ms for
//!   5 s, then [`Error::Connection`].

mod conn;
mod error;
mod grant;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

pub use crate::proto::Role;
use crate::proto::{Answer, MAX_DURATION_MS, Request as Line, is_valid_key, parse_answer};
use conn::{Conn, Op, Reply, Request, Shared, Slot, lock};
pub use error::Error;
pub use grant::{Acquired, AddrStatus, Grant, LockGuard, NodeStatus};

/// The protocol's redial period for a dropped connection.
pub const REDIAL_INTERVAL: Duration = Duration::from_secs(3);
/// How often a release or renew is retried on connection trouble.
pub const RETRY_EVERY: Duration = Duration::from_millis(200);
/// For how long a release or renew is retried.
pub const RETRY_FOR: Duration = Duration::from_secs(5);
/// The most acquires the protocol lets wait on one connection.
pub const MAX_WAITING_ACQUIRES: usize = 4096;

/// Configures and connects a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    addrs: Vec<String>,
    connect_timeout: Duration,
    no_active_timeout: Duration,
    max_waiting_acquires: usize,
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
            connect_timeout: Duration::from_secs(3),
            no_active_timeout: Duration::from_secs(10),
            max_waiting_acquires: MAX_WAITING_ACQUIRES,
        }
    }

    /// How long one dial may take, how long [`ClientBuilder::connect`] waits
    /// for a first connection, and how long a request waits for a live
    /// connection when none is up. Default 3 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// How long a request keeps retrying while nodes answer `M key -` (no
    /// active node known) or keep redirecting. Default 10 s.
    pub fn no_active_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.no_active_timeout = timeout;
        self
    }

    /// The most acquires waiting on one connection before more queue in the
    /// client: 1 to 4096 (the protocol's limit, and the default).
    pub fn max_waiting_acquires(mut self, n: usize) -> ClientBuilder {
        self.max_waiting_acquires = n.clamp(1, MAX_WAITING_ACQUIRES);
        self
    }

    /// Starts the background connections and waits for the first one to be
    /// up. Fails with [`Error::Connection`] only if no connection could be
    /// made at all: every address failed its first dial, or none connected
    /// within the connect timeout.
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
        if addrs.len() == 1 {
            // One node: two connections, so that one dropping for a moment
            // does not interrupt service.
            addrs.push(addrs[0].clone());
        }
        let (shutdown, _) = watch::channel(());
        let (changed, _) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            slots: RwLock::new(Vec::new()),
            rr: AtomicUsize::new(0),
            active: Mutex::new(None),
            shared: Arc::new(Shared {
                changed,
                in_flight: Arc::new(AtomicUsize::new(0)),
                redial: REDIAL_INTERVAL,
                connect_timeout: self.connect_timeout,
                max_waiting_acquires: self.max_waiting_acquires,
            }),
            shutdown,
            no_active_timeout: self.no_active_timeout,
        });
        let client = Client { inner };
        let mut changes = client.inner.shared.changed.subscribe();
        for addr in addrs {
            client.add_slot(addr);
        }
        let until = tokio::time::Instant::now() + client.inner.shared.connect_timeout;
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
                        "no connection within {:?}: {}",
                        client.inner.shared.connect_timeout,
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
    rr: AtomicUsize,
    /// The node an `M` named: preferred by the rotation while it is up.
    active: Mutex<Option<String>>,
    shared: Arc<Shared>,
    /// Dropped with the client: tells the connection tasks to stop.
    shutdown: watch::Sender<()>,
    no_active_timeout: Duration,
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
    /// acquires count. Once a request counts here, anything handed to the
    /// same connection later is written after it.
    pub fn pending_requests(&self) -> usize {
        self.inner.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Acquires `key` for `lease`, waiting at most `wait` (`None` or zero:
    /// no limit) in the server's FIFO queue.
    ///
    /// `Ok(Acquired::Granted(grant))`: the lock is held until released or
    /// until the lease runs out; `Ok(Acquired::TimedOut)`: the wait ran out
    /// and nothing is held. Errors: [`Error::InvalidArgument`] (checked
    /// before sending: key of 1..=250 bytes in 0x21..=0x7E or >= 0x80, lease
    /// 1 ms..=86400 s, wait <= 86400 s; millisecond resolution, the lease
    /// rounded down and the wait up), [`Error::Connection`],
    /// [`Error::NoActiveNode`], [`Error::Protocol`].
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
        let key = key.as_ref();
        check_key(key)?;
        let lease_ms = lease_ms(lease)?;
        let wait_ms = wait_ms(wait)?;
        let started = Instant::now();
        let mut failed = 0usize;
        let mut moves = Moves::new(self.inner.no_active_timeout);
        loop {
            let Some(conn) = self
                .wait_live(None, self.inner.shared.connect_timeout)
                .await
            else {
                return Err(Error::Connection(self.why_no_connection()));
            };
            // Local queueing: wait for room on this connection (within the
            // wait, if there is one).
            let room = conn.acquires.clone().acquire_owned();
            let room = if wait_ms == 0 {
                room.await
            } else {
                let until = started + Duration::from_millis(wait_ms);
                match tokio::time::timeout_at(until.into(), room).await {
                    Ok(room) => room,
                    Err(_) => return Ok(Acquired::TimedOut),
                }
            };
            let Ok(permit) = room else {
                failed += 1;
                if failed >= self.connections() {
                    return Err(self.cut_off(failed));
                }
                continue;
            };
            let wait_now = if wait_ms == 0 {
                0
            } else {
                let total = Duration::from_millis(wait_ms);
                let elapsed = started.elapsed();
                if elapsed >= total {
                    return Ok(Acquired::TimedOut);
                }
                ceil_ms(total - elapsed)
            };
            let mut line = Vec::with_capacity(key.len() + 32);
            Line::Acquire {
                key,
                lease_ms,
                wait_ms: wait_now,
            }
            .encode(&mut line);
            let sent = Instant::now();
            let reply = conn.call(Op::Acquire, key, line, Some(permit)).await;
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
                Reply::Moved(to) => moves.moved(self, to).await?,
                Reply::Lost => {
                    failed += 1;
                    if failed >= self.connections() {
                        return Err(self.cut_off(failed));
                    }
                }
                Reply::Protocol(why) => return Err(Error::Protocol(why)),
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

    /// Releases the grant of `key` that carries `token`. `Ok(true)`: it was
    /// held and is released (the next waiter, if any, has it); `Ok(false)`:
    /// no grant of `key` carries `token` (released before, expired, never
    /// issued); after a connection failure and a retry, `false` can also mean
    /// the first attempt had landed. Retried every 200 ms for 5 s on
    /// connection trouble.
    pub async fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<bool, Error> {
        let key = key.as_ref();
        check_key(key)?;
        check_token(token)?;
        let mut line = Vec::with_capacity(key.len() + 24);
        Line::Release { key, token }.encode(&mut line);
        self.retrying(Op::Release, key, line)
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
        self.renew_inner(key, token, lease)
            .await
            .map(|(held, _)| held)
    }

    /// Renews `grant` for `lease` and, if it was held, moves its deadline.
    pub async fn renew_grant(&self, grant: &mut Grant, lease: Duration) -> Result<bool, Error> {
        let (held, sent) = self.renew_inner(&grant.key, grant.token, lease).await?;
        if held {
            let lease = Duration::from_millis(lease_ms(lease)?);
            grant.lease = lease;
            grant.deadline = sent + lease;
        }
        Ok(held)
    }

    async fn renew_inner(
        &self,
        key: &[u8],
        token: u64,
        lease: Duration,
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
        self.retrying(Op::Renew, key, line).await
    }

    /// Asks every known address for its status (`S`), on its live
    /// connection or, if it has none, on a one-off connection. Never fails
    /// as a whole: each address has its own result.
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
            let reply = conn.call(Op::Status, b"", b"S\n".to_vec(), None).await;
            match reply {
                Reply::Status {
                    role,
                    active,
                    token,
                } => {
                    return Ok(NodeStatus {
                        role,
                        active,
                        token,
                    });
                }
                Reply::Lost => {}
                Reply::Protocol(why) => return Err(Error::Protocol(why)),
                other => return Err(unexpected("S", &other)),
            }
        }
        node_status(addr, self.inner.shared.connect_timeout).await
    }

    /// A barrier: sends `S` on every live connection and waits for the
    /// answers. When it returns `Ok`, every request this client had handed to
    /// a connection before the call has been read by its server (a node
    /// answers one connection's requests in order of reading). Errors if a
    /// connection dropped meanwhile, or none is up.
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
            };
            if conn.submit(req).is_err() {
                return Err(Error::Connection("a connection dropped during sync".into()));
            }
            answers.push(rx);
        }
        for rx in answers {
            match rx.await.unwrap_or(Reply::Lost) {
                Reply::Status { .. } => {}
                Reply::Protocol(why) => return Err(Error::Protocol(why)),
                Reply::Lost => {
                    return Err(Error::Connection("a connection dropped during sync".into()));
                }
                other => return Err(unexpected("S", &other)),
            }
        }
        Ok(())
    }

    /// Sends a release or renew, retrying every 200 ms for 5 s when no
    /// connection carries it, and following `M`. Returns the flag and when
    /// the request that got it was sent.
    async fn retrying(&self, op: Op, key: &[u8], line: Vec<u8>) -> Result<(bool, Instant), Error> {
        let until = Instant::now() + RETRY_FOR;
        let what = if op == Op::Release {
            "release"
        } else {
            "renew"
        };
        let mut last;
        let mut followed = false;
        let mut no_active = false;
        loop {
            if let Some(conn) = self.pick(None) {
                let sent = Instant::now();
                let reply = conn.call(op, key, line.clone(), None).await;
                drop(conn);
                no_active = false;
                match reply {
                    Reply::Flag(held) => return Ok((held, sent)),
                    Reply::Moved(Some(addr)) => {
                        let left = until.saturating_duration_since(Instant::now());
                        let within = left.min(self.inner.shared.connect_timeout);
                        last = format!("redirected to {addr}");
                        self.follow(addr, within).await;
                        if !followed {
                            followed = true;
                            continue;
                        }
                    }
                    Reply::Moved(None) => {
                        last = "no active node".into();
                        no_active = true;
                    }
                    Reply::Lost => last = "connection lost".into(),
                    Reply::Protocol(why) => return Err(Error::Protocol(why)),
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
            if Instant::now() + RETRY_EVERY > until {
                if no_active {
                    return Err(Error::NoActiveNode);
                }
                return Err(Error::Connection(format!(
                    "{what} gave up after {RETRY_FOR:?}: {last}"
                )));
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
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
        let until = tokio::time::Instant::now() + within;
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

    /// Follows an `M` naming `addr`: makes it the preferred node (dialling
    /// it if unknown) and waits up to `within` for it to be up. If it does
    /// not come up, the preference is dropped again.
    async fn follow(&self, addr: String, within: Duration) -> bool {
        let (known, up) = {
            let slots = read(&self.inner.slots);
            let mut mine = slots.iter().filter(|s| s.addr == addr).peekable();
            (mine.peek().is_some(), mine.any(|s| s.live().is_some()))
        };
        if !known {
            self.add_slot(addr.clone());
        } else if !up {
            // A node we know and have no connection to: most likely a stale
            // `M` from a standby that has not yet seen that node die. Its
            // slot redials only every 3 s, so do not wait for it: the
            // request goes on through the rotation (with the usual backoff).
            return false;
        }
        *lock(&self.inner.active) = Some(addr.clone());
        if self.wait_live(Some(&addr), within).await.is_some() {
            return true;
        }
        let mut active = lock(&self.inner.active);
        if active.as_deref() == Some(addr.as_str()) {
            *active = None;
        }
        false
    }

    fn add_slot(&self, addr: String) {
        let slot = Arc::new(Slot::new(addr));
        self.inner
            .slots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(slot.clone());
        tokio::spawn(conn::run_slot(
            slot,
            self.inner.shared.clone(),
            Arc::downgrade(&self.inner),
            self.inner.shutdown.subscribe(),
        ));
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

    fn cut_off(&self, failed: usize) -> Error {
        Error::Connection(format!(
            "the connection dropped before the answer, on {failed} connection(s) in a row"
        ))
    }
}

/// Bounds the time spent following `M` answers.
struct Moves {
    first: Option<Instant>,
    count: u32,
    bound: Duration,
    backoff: Duration,
}

impl Moves {
    fn new(bound: Duration) -> Moves {
        Moves {
            first: None,
            count: 0,
            bound,
            backoff: Duration::from_millis(50),
        }
    }

    /// Handles one `M`: the first one to a named node is followed at once;
    /// later ones (and every `M key -`) wait a growing delay first. Gives up
    /// with [`Error::NoActiveNode`] once the bound has passed.
    async fn moved(&mut self, client: &Client, to: Option<String>) -> Result<(), Error> {
        let first = *self.first.get_or_insert_with(Instant::now);
        self.count += 1;
        if first.elapsed() >= self.bound {
            return Err(Error::NoActiveNode);
        }
        if to.is_none() || self.count > 1 {
            let left = self.bound.saturating_sub(first.elapsed());
            tokio::time::sleep(self.backoff.min(left)).await;
            self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
        }
        if let Some(addr) = to {
            let left = self.bound.saturating_sub(first.elapsed());
            client
                .follow(addr, left.min(client.inner.shared.connect_timeout))
                .await;
        }
        Ok(())
    }
}

/// Sends one request line to `addr` on a one-off connection and reads one
/// answer line (without its `\n`), with `timeout` for the whole exchange.
async fn one_off(addr: &str, request: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| Error::Connection(format!("connect to {addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (rd, mut wr) = stream.into_split();
        wr.write_all(request)
            .await
            .map_err(|e| Error::Connection(format!("write to {addr}: {e}")))?;
        let mut line = Vec::new();
        let mut rd = BufReader::new(tokio::io::AsyncReadExt::take(rd, 4096));
        rd.read_until(b'\n', &mut line)
            .await
            .map_err(|e| Error::Connection(format!("read from {addr}: {e}")))?;
        if line.pop() != Some(b'\n') {
            return Err(Error::Connection(format!("{addr} closed the connection")));
        }
        Ok(line)
    };
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
    let line = one_off(addr, b"H\n", timeout).await?;
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
    let line = one_off(addr, b"S\n", timeout).await?;
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
    } else if key.len() > crate::proto::MAX_KEY {
        Err(Error::InvalidArgument(format!(
            "key of {} bytes (at most {})",
            key.len(),
            crate::proto::MAX_KEY
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
