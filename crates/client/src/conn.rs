//! One connection slot: a background task that dials an address, checks
//! that the node answers (the hello), runs the connection (writer, reader
//! and liveness watch side by side), and redials when it ends.
//!
//! Requests reach the connection through an unbounded channel. The writer
//! takes everything queued, registers each request as pending (per key, in
//! send order, with its op), and writes the whole batch with one
//! `write_all`. The reader splits answer lines (each at most
//! [`MAX_ANSWER_LINE`] bytes) and hands each to the oldest pending request it
//! answers, as docs/protocol.md says ("6. Matching answers to requests"):
//! `A`/`T` the oldest `A` of the key, `R` the oldest `R`, `N` the oldest
//! `N`, `S` the oldest `S`, `M` the oldest request of the key whatever its
//! op.
//!
//! Liveness: a connection is only put in the rotation once its node has
//! answered an `S` (the hello) within the probe timeout, so a node that
//! accepts connections but is hung never gets a request. While requests are
//! outstanding, a connection that has received nothing for the probe
//! interval sends an `S` (the probe): at once when a request goes out on a
//! connection that was quiet that long, else when the silence reaches it.
//! If nothing at all arrives within the probe timeout after the probe, the
//! connection counts as dead: it is closed, its pending requests fail with
//! [`Reply::Lost`] (acquires move to the next connection), and the slot
//! redials as for any dropped connection.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;

use ringlock_proto::{Answer, Role, parse_answer};

/// Longest answer line the client accepts on its pooled connections (the
/// longest legal one is about 500 bytes; anything past this is a broken
/// server).
pub(crate) const MAX_ANSWER_LINE: usize = 4096;
/// The writer stops coalescing once a batch holds this many bytes.
const MAX_BATCH: usize = 64 * 1024;

/// The reading half of a connection.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;
/// What a dial gives: both halves of a fresh connection.
pub(crate) type DialFuture =
    Pin<Box<dyn Future<Output = io::Result<(ReadHalf, WriteHalf)>> + Send>>;
/// Opens a connection to an address (TCP; tests dial in-memory streams).
pub(crate) type Dialer = Arc<dyn Fn(&str) -> DialFuture + Send + Sync>;

/// The dialer of real clients: TCP, `TCP_NODELAY`.
pub(crate) fn tcp_dialer() -> Dialer {
    Arc::new(|addr: &str| {
        let addr = addr.to_string();
        Box::pin(async move {
            let stream = TcpStream::connect(&addr).await?;
            let _ = stream.set_nodelay(true);
            let (rd, wr) = stream.into_split();
            Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
        })
    })
}

/// Says what an I/O error means: a TLS failure in words (feature `tls`),
/// anything else as the OS says it.
pub(crate) fn why(err: &io::Error) -> String {
    #[cfg(feature = "tls")]
    if let Some(explained) = crate::tls::explain(err) {
        return explained;
    }
    err.to_string()
}

/// The op of a request, for matching answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    /// `G`: a shared acquire.
    Shared,
    /// `C`: a semaphore acquire.
    Permit,
    Release,
    Renew,
    Status,
}

impl Op {
    /// The op of a `G` or `C` answer.
    fn of(kind: ringlock_proto::Kind) -> Op {
        match kind {
            ringlock_proto::Kind::Shared => Op::Shared,
            ringlock_proto::Kind::Permit => Op::Permit,
        }
    }

    /// An acquire of any kind.
    pub(crate) fn is_acquire(self) -> bool {
        matches!(self, Op::Acquire | Op::Shared | Op::Permit)
    }
}

/// What a pending request learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Granted(u64),
    TimedOut,
    /// `G|C key semaphore <limit>` (`limit` > 0) or `C key lock` (0): the
    /// key is of another kind; nothing changed.
    Refused(u32),
    /// `M key addr`; `None` for `-`.
    Moved(Option<String>),
    /// `R key 1|0` or `N key 1|0`.
    Flag(bool),
    Status {
        role: Role,
        active: Option<String>,
        token: u64,
    },
    /// The connection closed, failed or went silent (or was never there)
    /// before the answer; the text says which.
    Lost(String),
    /// The server sent `E` or a line that breaks the protocol.
    Protocol(String),
}

/// Counts requests the writer has taken (to write them, or written) and that
/// are not yet answered or dropped.
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(crate) fn new(counter: &Arc<AtomicUsize>) -> InFlight {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One request on its way to a connection.
pub(crate) struct Request {
    pub op: Op,
    /// Empty for `S`.
    pub key: Vec<u8>,
    /// The whole line, with its `\n`.
    pub line: Vec<u8>,
    /// `None`: nobody waits for the answer (a background release, a probe).
    pub reply: Option<oneshot::Sender<Reply>>,
    /// An acquire holds one of its connection's waiting-acquire permits until
    /// it is answered, so that no connection ever has more than the server's
    /// limit of acquires waiting.
    #[allow(dead_code)] // held for its Drop
    pub permit: Option<OwnedSemaphorePermit>,
    /// Set by the writer when it takes the request.
    #[allow(dead_code)] // held for its Drop
    pub in_flight: Option<InFlight>,
    /// A liveness probe: not counted as outstanding, nor as in flight.
    pub probe: bool,
}

impl Request {
    fn answer(mut self, reply: Reply) -> Result<(), Reply> {
        // No longer pending by the time the caller sees the answer.
        self.in_flight = None;
        self.permit = None;
        match self.reply.take() {
            Some(tx) => tx.send(reply),
            None => Ok(()),
        }
    }

    fn probe() -> Request {
        Request {
            op: Op::Status,
            key: Vec::new(),
            line: b"S\n".to_vec(),
            reply: None,
            permit: None,
            in_flight: None,
            probe: true,
        }
    }
}

/// A live connection: where requests go.
pub(crate) struct Conn {
    tx: mpsc::UnboundedSender<Request>,
    /// Permits for acquires waiting on this connection.
    pub acquires: Arc<Semaphore>,
    /// The address it was dialled at.
    pub addr: String,
}

impl Conn {
    /// Hands a request to the connection's writer. Gives it back if the
    /// connection has closed.
    pub(crate) fn submit(&self, req: Request) -> Result<(), Request> {
        self.tx.send(req).map_err(|e| e.0)
    }

    /// Sends a request and waits for its answer ([`Reply::Lost`] if the
    /// connection closes or goes silent first). Not bounded by itself:
    /// callers bound it (acquires by their wait, the rest by the request
    /// timeout), and the liveness watch ends a silent connection.
    pub(crate) async fn call(
        &self,
        op: Op,
        key: &[u8],
        line: Vec<u8>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Reply {
        let (tx, rx) = oneshot::channel();
        let req = Request {
            op,
            key: key.to_vec(),
            line,
            reply: Some(tx),
            permit,
            in_flight: None,
            probe: false,
        };
        if self.submit(req).is_err() {
            return Reply::Lost(format!("{}: the connection had closed", self.addr));
        }
        rx.await
            .unwrap_or_else(|_| Reply::Lost(format!("{}: the connection closed", self.addr)))
    }
}

/// One entry of the client's connection list: an address and, while it is
/// up, its connection.
pub(crate) struct Slot {
    pub addr: String,
    live: Mutex<Option<Arc<Conn>>>,
    /// Dial attempts that failed (no connection, or no answer to the hello)
    /// since the slot was created.
    pub failures: AtomicUsize,
    pub ever_connected: AtomicBool,
    last_error: Mutex<Option<String>>,
    /// The dials of this slot, for redirects that want it dialled now.
    dials: Mutex<Dials>,
    /// Wakes the slot's task out of its redial wait (see [`Slot::dial_now`]).
    kick: Notify,
    /// The node answered `E` to the owner label (`O`): a server older than
    /// it. Its connections go on without one.
    owner_refused: AtomicBool,
}

/// The first wait after a redirect dial failed before a redirect may
/// dial the same slot again; doubled after each failure in a row.
pub(crate) const KICK_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest wait between redirect dials of one slot.
pub(crate) const KICK_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What a slot's dials are doing, for [`Slot::dial_now`].
#[derive(Debug, Default)]
struct Dials {
    /// Dials started so far (the one under way, if `dialing`, is number
    /// `started`).
    started: u64,
    /// The last dial that ended (connected, or failed).
    ended: u64,
    dialing: bool,
    /// A redirect asked for a dial the slot has not started yet.
    kicked: bool,
    /// Redirect dials that failed in a row, a connection they made that
    /// lasted less than [`KICK_BACKOFF_MAX`] counting as a failure (reset
    /// by a connection that lasted longer), and when the last of them
    /// ended.
    kick_failures: u32,
    kick_failed_at: Option<Instant>,
}

impl Dials {
    fn kick_failed(&mut self) {
        self.kick_failures = self.kick_failures.saturating_add(1);
        self.kick_failed_at = Some(Instant::now());
    }
}

/// What [`Slot::dial_now`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DialNow {
    /// Dial number `n` (under way or about to start) decides: wait for it.
    Wait(u64),
    /// A redirect dial of this slot failed too recently: the request backs
    /// off instead.
    TooSoon,
}

impl Slot {
    pub(crate) fn new(addr: String) -> Slot {
        Slot {
            addr,
            live: Mutex::new(None),
            failures: AtomicUsize::new(0),
            ever_connected: AtomicBool::new(false),
            last_error: Mutex::new(None),
            dials: Mutex::new(Dials::default()),
            kick: Notify::new(),
            owner_refused: AtomicBool::new(false),
        }
    }

    /// A node an `M` answer named and that this slot has no connection to:
    /// dial it now instead of at the next redial tick. At most one dial is
    /// under way per slot: if one is, the request waits for it. After a
    /// redirect dial failed, the next one waits 50 ms, doubling to 1 s
    /// while they keep failing (`M` storms do not become dial storms).
    pub(crate) fn dial_now(&self) -> DialNow {
        let mut d = lock(&self.dials);
        if d.dialing {
            return DialNow::Wait(d.started);
        }
        if d.kicked {
            return DialNow::Wait(d.started + 1);
        }
        if let Some(at) = d.kick_failed_at {
            let shift = d.kick_failures.saturating_sub(1).min(8);
            let gap = (KICK_BACKOFF_MIN * (1u32 << shift)).min(KICK_BACKOFF_MAX);
            if Instant::now() < at + gap {
                return DialNow::TooSoon;
            }
        }
        d.kicked = true;
        let next = d.started + 1;
        drop(d);
        self.kick.notify_one();
        DialNow::Wait(next)
    }

    /// True once dial number `n` has ended (whether it connected: see
    /// [`Slot::live`]).
    pub(crate) fn dial_ended(&self, n: u64) -> bool {
        lock(&self.dials).ended >= n
    }

    /// Marks the start of a dial; says whether a redirect asked for it.
    fn dial_starts(&self) -> bool {
        let mut d = lock(&self.dials);
        d.started += 1;
        d.dialing = true;
        std::mem::take(&mut d.kicked)
    }

    /// Marks the end of the dial under way.
    fn dial_done(&self, connected: bool, kicked: bool) {
        let mut d = lock(&self.dials);
        d.dialing = false;
        d.ended = d.started;
        if !connected && kicked {
            d.kick_failed();
        }
    }

    /// Marks the end of a connection that lasted `lived`: one that a
    /// redirect dialled and that dropped at once counts as a failed
    /// redirect dial (a node that accepts, answers the hello and drops the
    /// connection does not get a dial per `M`).
    fn conn_ended(&self, lived: Duration, kicked: bool) {
        let mut d = lock(&self.dials);
        if lived >= KICK_BACKOFF_MAX {
            d.kick_failures = 0;
            d.kick_failed_at = None;
        } else if kicked {
            d.kick_failed();
        }
    }

    /// True while a dial (connect and hello) is under way.
    pub(crate) fn is_dialing(&self) -> bool {
        lock(&self.dials).dialing
    }

    /// True if a redirect asked for a dial not yet started.
    fn is_kicked(&self) -> bool {
        lock(&self.dials).kicked
    }

    /// The connection, if it is up.
    pub(crate) fn live(&self) -> Option<Arc<Conn>> {
        lock(&self.live).clone()
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    fn set_error(&self, why: String) {
        *lock(&self.last_error) = Some(why);
    }
}

/// Every timing the client keeps to (see `ClientBuilder`).
#[derive(Debug, Clone)]
pub(crate) struct Timing {
    pub connect_timeout: Duration,
    pub redial: Duration,
    pub probe_interval: Duration,
    pub probe_timeout: Duration,
    pub request_timeout: Duration,
    pub acquire_grace: Duration,
    pub retry_every: Duration,
    pub retry_for: Duration,
    pub no_active_timeout: Duration,
}

/// What every slot task shares with the client.
pub(crate) struct Shared {
    /// Bumped whenever a connection comes up or goes down.
    pub changed: watch::Sender<u64>,
    pub in_flight: Arc<AtomicUsize>,
    pub timing: Timing,
    pub max_waiting_acquires: usize,
    pub dialer: Dialer,
    /// The owner label each connection sets first (`O`), if any.
    pub owner: Option<Vec<u8>>,
}

impl Shared {
    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Locks a mutex, ignoring poisoning (no code here panics while holding one,
/// and a poisoned connection table must not take the client down).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slot's background task: dial, hello, serve, redial every `redial`
/// (measured from the previous dial, so a connection that lived long is
/// redialled at once and a flapping one at most once per period), or at
/// once when a redirect names the address ([`Slot::dial_now`]). Ends when
/// the client is dropped (`shutdown`'s sender is gone).
pub(crate) async fn run_slot(
    slot: Arc<Slot>,
    shared: Arc<Shared>,
    client: Weak<super::Inner>,
    mut shutdown: watch::Receiver<()>,
) {
    loop {
        let dialed_at = Instant::now();
        let kicked = slot.dial_starts();
        let dialed = tokio::select! {
            r = dial_slot(&slot, &shared) => r,
            _ = shutdown.changed() => return,
        };
        match dialed {
            Ok((rd, wr)) => {
                slot.ever_connected.store(true, Ordering::Relaxed);
                let up_at = Instant::now();
                let why = serve(&slot, &shared, &client, rd, wr, &mut shutdown, kicked).await;
                slot.conn_ended(up_at.elapsed(), kicked);
                match why {
                    None => return,
                    Some(why) => slot.set_error(why),
                }
            }
            Err(why) => {
                slot.set_error(why);
                slot.failures.fetch_add(1, Ordering::Relaxed);
                slot.dial_done(false, kicked);
            }
        }
        shared.bump();
        let redial_at = dialed_at + shared.timing.redial;
        loop {
            if slot.is_kicked() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(redial_at) => break,
                _ = slot.kick.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// [`dial`] with the client's owner label, unless the node refused it: a
/// node that answers `E` to `O` (a server older than owner labels) is
/// dialled again at once without it, and so from then on.
async fn dial_slot(
    slot: &Slot,
    shared: &Shared,
) -> Result<(BufReader<ReadHalf>, WriteHalf), String> {
    let owner = shared
        .owner
        .as_deref()
        .filter(|_| !slot.owner_refused.load(Ordering::Relaxed));
    match dial(&slot.addr, shared, owner).await {
        Err(Hello::OwnerRefused) => {
            slot.owner_refused.store(true, Ordering::Relaxed);
            dial(&slot.addr, shared, None).await.map_err(Hello::why)
        }
        other => other.map_err(Hello::why),
    }
}

/// Why a dial did not give a connection.
enum Hello {
    Failed(String),
    /// `E` in answer to the owner label.
    OwnerRefused,
}

impl Hello {
    fn why(self) -> String {
        match self {
            Hello::Failed(why) => why,
            Hello::OwnerRefused => "the node refused the owner label twice".into(),
        }
    }
}

impl From<String> for Hello {
    fn from(why: String) -> Hello {
        Hello::Failed(why)
    }
}

/// Dials `addr` (within the connect timeout) and checks that the node
/// answers: it sends `S` and wants an `S` answer within the probe timeout.
/// With an `owner`, `O <owner>` goes first, and its `O` answer must come
/// before the `S` one.
/// A node that accepts connections but is hung (stopped, overloaded beyond
/// help, or not a ringlock node at all) fails here, and never gets a
/// request.
async fn dial(
    addr: &str,
    shared: &Shared,
    owner: Option<&[u8]>,
) -> Result<(BufReader<ReadHalf>, WriteHalf), Hello> {
    let timing = &shared.timing;
    let (rd, mut wr) =
        match tokio::time::timeout(timing.connect_timeout, (shared.dialer)(addr)).await {
            Ok(Ok(halves)) => halves,
            Ok(Err(e)) => return Err(format!("connect to {addr}: {}", why(&e)).into()),
            Err(_) => {
                return Err(format!(
                    "connect to {addr}: timed out after {:?}",
                    timing.connect_timeout
                )
                .into());
            }
        };
    let mut rd = BufReader::with_capacity(16 * 1024, rd);
    let hello = async {
        let mut request = Vec::with_capacity(160);
        if let Some(owner) = owner {
            ringlock_proto::Request::Owner { owner }.encode(&mut request);
        }
        request.extend_from_slice(b"S\n");
        wr.write_all(&request)
            .await
            .map_err(|e| format!("write to {addr}: {}", why(&e)))?;
        let mut line = Vec::with_capacity(128);
        let mut read = async |line: &mut Vec<u8>| {
            read_line(&mut rd, line, MAX_ANSWER_LINE, addr)
                .await
                .map_err(|end| match end {
                    End::Closed(why) | End::Protocol(why) => why,
                })
        };
        if let Some(owner) = owner {
            read(&mut line).await?;
            match parse_answer(&line) {
                Ok(Answer::Owner { owner: echoed }) if echoed == owner => {}
                Ok(Answer::Error { .. }) => return Err(Hello::OwnerRefused),
                _ => {
                    return Err(format!(
                        "{addr} answered O with {:?}: not a ringlock node?",
                        String::from_utf8_lossy(&line)
                    )
                    .into());
                }
            }
        }
        read(&mut line).await?;
        match parse_answer(&line) {
            Ok(Answer::Status { .. }) => Ok(()),
            Ok(Answer::Error { reason }) => Err(format!(
                "{addr} refused the connection: E {}",
                String::from_utf8_lossy(reason)
            )
            .into()),
            _ => Err(format!(
                "{addr} answered S with {:?}: not a ringlock node?",
                String::from_utf8_lossy(&line)
            )
            .into()),
        }
    };
    match tokio::time::timeout(timing.probe_timeout, hello).await {
        Ok(Ok(())) => Ok((rd, wr)),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(format!(
            "{addr} accepted the connection but did not answer S within {:?} (hung?)",
            timing.probe_timeout
        )
        .into()),
    }
}

/// Reads one line of at most `max` bytes into `line` (without its `\n`).
async fn read_line<R: AsyncBufRead + Unpin>(
    rd: &mut R,
    line: &mut Vec<u8>,
    max: usize,
    addr: &str,
) -> Result<(), End> {
    line.clear();
    let read = (&mut *rd).take(max as u64).read_until(b'\n', line).await;
    match read {
        Err(e) => return Err(End::Closed(format!("read from {addr}: {}", why(&e)))),
        Ok(0) => return Err(End::Closed(format!("{addr} closed the connection"))),
        Ok(_) => {}
    }
    if line.last() != Some(&b'\n') {
        if line.len() >= max {
            return Err(End::Protocol(format!(
                "answer line from {addr} longer than {max} bytes"
            )));
        }
        return Err(End::Closed(format!(
            "{addr} closed the connection mid-line"
        )));
    }
    line.pop();
    Ok(())
}

/// Pending requests of one connection, in send order, and what the
/// liveness watch needs to know.
struct ConnState {
    by_key: HashMap<Vec<u8>, VecDeque<Request>>,
    status: VecDeque<Request>,
    /// Requests written and not answered, probes not counted.
    outstanding: usize,
    /// When the last answer line arrived (or the hello's answer).
    last_rx: Instant,
    /// When the probe now outstanding was handed to the writer.
    probe_at: Option<Instant>,
}

impl ConnState {
    fn new(now: Instant) -> ConnState {
        ConnState {
            by_key: HashMap::new(),
            status: VecDeque::new(),
            outstanding: 0,
            last_rx: now,
            probe_at: None,
        }
    }

    /// Registers a request the writer took. True if the connection just
    /// became busy.
    fn push(&mut self, req: Request) -> bool {
        let mut became_busy = false;
        if !req.probe {
            became_busy = self.outstanding == 0;
            self.outstanding += 1;
        }
        if req.op == Op::Status {
            self.status.push_back(req);
        } else {
            self.by_key
                .entry(req.key.clone())
                .or_default()
                .push_back(req);
        }
        became_busy
    }

    fn taken(&mut self, req: Option<Request>) -> Option<Request> {
        if let Some(r) = &req
            && !r.probe
        {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        req
    }

    /// Removes the oldest pending request of `key` with op `op` (any op if
    /// `None`).
    fn take(&mut self, key: &[u8], op: Option<Op>) -> Option<Request> {
        let queue = self.by_key.get_mut(key)?;
        let at = match op {
            Some(op) => queue.iter().position(|r| r.op == op)?,
            None => 0,
        };
        let req = queue.remove(at);
        if queue.is_empty() {
            self.by_key.remove(key);
        }
        self.taken(req)
    }

    fn take_status(&mut self) -> Option<Request> {
        let req = self.status.pop_front();
        self.taken(req)
    }

    fn drain(&mut self) -> Vec<Request> {
        self.outstanding = 0;
        self.status
            .drain(..)
            .chain(self.by_key.drain().flat_map(|(_, q)| q))
            .collect()
    }
}

/// How a connection ended.
enum End {
    /// Closed, failed or silent: pending requests may be retried elsewhere.
    Closed(String),
    /// The server broke the protocol (or sent `E`): pending requests fail.
    Protocol(String),
}

/// What the liveness watch does next.
enum Watch {
    /// Nothing outstanding: wait until the connection gets busy.
    Idle,
    /// Look again at this time.
    At(Instant),
    /// The connection is dead.
    Dead(String),
}

/// Runs one connection until it ends. Returns why it ended, or `None` if the
/// client was dropped.
#[expect(clippy::too_many_lines)]
async fn serve(
    slot: &Arc<Slot>,
    shared: &Arc<Shared>,
    client: &Weak<super::Inner>,
    mut rd: BufReader<ReadHalf>,
    mut wr: WriteHalf,
    shutdown: &mut watch::Receiver<()>,
    kicked: bool,
) -> Option<String> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Request>();
    let conn = Arc::new(Conn {
        tx,
        acquires: Arc::new(Semaphore::new(shared.max_waiting_acquires)),
        addr: slot.addr.clone(),
    });
    let state = Mutex::new(ConnState::new(Instant::now()));
    let busy = Notify::new();
    *lock(&slot.live) = Some(conn.clone());
    slot.dial_done(true, kicked);
    shared.bump();
    let timing = &shared.timing;

    let writer = async {
        let mut buf = Vec::with_capacity(16 * 1024);
        loop {
            let Some(first) = rx.recv().await else {
                return End::Closed("request channel closed".into());
            };
            let mut became_busy = false;
            {
                let mut state = lock(&state);
                let mut next = Some(first);
                while let Some(req) = next {
                    // An acquire whose caller is gone is not worth queueing.
                    let abandoned =
                        req.op.is_acquire() && req.reply.as_ref().is_some_and(|tx| tx.is_closed());
                    if !abandoned {
                        let mut req = req;
                        if !req.probe {
                            req.in_flight = Some(InFlight::new(&shared.in_flight));
                        }
                        buf.extend_from_slice(&req.line);
                        became_busy |= state.push(req);
                    }
                    next = if buf.len() < MAX_BATCH {
                        rx.try_recv().ok()
                    } else {
                        None
                    };
                }
            }
            if became_busy {
                busy.notify_one();
            }
            if buf.is_empty() {
                continue;
            }
            if let Err(e) = wr.write_all(&buf).await {
                return End::Closed(format!("write to {}: {e}", slot.addr));
            }
            buf.clear();
        }
    };

    let reader = async {
        let mut line = Vec::with_capacity(256);
        loop {
            if let Err(end) = read_line(&mut rd, &mut line, MAX_ANSWER_LINE, &slot.addr).await {
                return end;
            }
            if let Err(end) = dispatch(&line, &state, client, &slot.addr) {
                return end;
            }
        }
    };

    let liveness = async {
        loop {
            let next = {
                let mut st = lock(&state);
                let now = Instant::now();
                if let Some(probed) = st.probe_at {
                    let dead_at = probed + timing.probe_timeout;
                    if now >= dead_at {
                        Watch::Dead(format!(
                            "{} stopped answering: no answer to a probe within {:?}",
                            slot.addr, timing.probe_timeout
                        ))
                    } else {
                        Watch::At(dead_at)
                    }
                } else if st.outstanding == 0 {
                    Watch::Idle
                } else {
                    // Silence counts from the last answer: a request sent on
                    // a connection quiet for the interval is probed at once.
                    let probe_at = st.last_rx + timing.probe_interval;
                    if now >= probe_at {
                        st.probe_at = Some(now);
                        // The writer is ours: the send fails only once the
                        // connection is ending anyway.
                        let _ = conn.submit(Request::probe());
                        Watch::At(now + timing.probe_timeout)
                    } else {
                        Watch::At(probe_at)
                    }
                }
            };
            match next {
                Watch::Idle => busy.notified().await,
                Watch::At(at) => tokio::time::sleep_until(at).await,
                Watch::Dead(why) => return End::Closed(why),
            }
        }
    };

    // The reader first: answers already received count before the liveness
    // watch judges the connection.
    let end = tokio::select! {
        biased;
        end = reader => Some(end),
        end = writer => Some(end),
        end = liveness => Some(end),
        _ = shutdown.changed() => None,
    };

    // Out of the rotation first, so that retries go elsewhere; then fail
    // what was waiting here.
    *lock(&slot.live) = None;
    conn.acquires.close();
    rx.close();
    drop(conn);
    let (reply, why) = match end {
        Some(End::Protocol(why)) => (Reply::Protocol(why.clone()), Some(why)),
        Some(End::Closed(why)) => (Reply::Lost(why.clone()), Some(why)),
        None => (Reply::Lost("the client was dropped".into()), None),
    };
    // Requests never written are simply lost (they may be retried).
    while let Ok(req) = rx.try_recv() {
        let _ = req.answer(reply_lost(&reply));
    }
    let drained = lock(&state).drain();
    for req in drained {
        let _ = req.answer(reply.clone());
    }
    why
}

/// The answer for a request that was never written: lost, whatever ended
/// the connection (a protocol error was not about it).
fn reply_lost(reply: &Reply) -> Reply {
    match reply {
        Reply::Protocol(why) => Reply::Lost(why.clone()),
        other => other.clone(),
    }
}

/// The node an `M` or `S` answer names: printable ASCII, since it may be
/// dialled (and shown); anything else makes the answer malformed, which
/// ends the connection as a protocol error (as in the Python client).
fn named_addr(field: &[u8], from: &str) -> Result<String, End> {
    match std::str::from_utf8(field) {
        Ok(text) if field.iter().all(|b| (0x21..=0x7e).contains(b)) => Ok(text.to_string()),
        _ => Err(End::Protocol(format!(
            "{from}: an answer names an address with unprintable bytes: {:?}",
            String::from_utf8_lossy(field)
        ))),
    }
}

/// The key of a `G` or `C` answer.
fn answer_key<'a>(answer: &Answer<'a>) -> &'a [u8] {
    match *answer {
        Answer::KindGranted { key, .. } | Answer::KindRefused { key, .. } => key,
        _ => unreachable!("not a G or C answer"),
    }
}

/// The op of the request a `G` or `C` answer answers.
fn answer_op(answer: &Answer<'_>) -> Op {
    match *answer {
        Answer::KindGranted { kind, .. } | Answer::KindRefused { kind, .. } => Op::of(kind),
        _ => unreachable!("not a G or C answer"),
    }
}

/// Hands a `G` or `C` answer to `req`: a grant (token 0: the wait ran
/// out) or a refusal. A grant nobody waits for any more is released.
fn kind_answer(answer: Answer<'_>, req: Request, client: &Weak<super::Inner>) {
    match answer {
        Answer::KindGranted { key, token, .. } => {
            let reply = if token == 0 {
                Reply::TimedOut
            } else {
                Reply::Granted(token)
            };
            if req.answer(reply).is_err() && token != 0 {
                super::release_in_background(client, key.to_vec(), token);
            }
        }
        Answer::KindRefused { limit, .. } => {
            let _ = req.answer(Reply::Refused(limit));
        }
        _ => unreachable!("not a G or C answer"),
    }
}

/// Hands one answer line to the request it answers. An answer that matches
/// nothing, or a malformed line, ends the connection as a protocol error.
fn dispatch(
    line: &[u8],
    state: &Mutex<ConnState>,
    client: &Weak<super::Inner>,
    addr: &str,
) -> Result<(), End> {
    let mut state = lock(state);
    // Any line is a sign of life.
    state.last_rx = Instant::now();
    state.probe_at = None;
    let answer = parse_answer(line).map_err(|e| End::Protocol(format!("{addr}: {e}")))?;
    let unmatched = || {
        End::Protocol(format!(
            "{addr}: answer {:?} matches no pending request",
            String::from_utf8_lossy(line)
        ))
    };
    match answer {
        Answer::Error { reason } => {
            return Err(End::Protocol(format!(
                "{addr} says: E {}",
                String::from_utf8_lossy(reason)
            )));
        }
        Answer::Granted { key, token } => {
            let req = state.take(key, Some(Op::Acquire)).ok_or_else(unmatched)?;
            drop(state);
            if req.answer(Reply::Granted(token)).is_err() {
                // Whoever asked is gone (the acquire future was dropped): do
                // not leave the lock held until its lease runs out.
                super::release_in_background(client, key.to_vec(), token);
            }
        }
        Answer::TimedOut { key } => {
            let req = state.take(key, Some(Op::Acquire)).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::TimedOut);
        }
        Answer::KindGranted { .. } | Answer::KindRefused { .. } => {
            let req = state.take(answer_key(&answer), Some(answer_op(&answer)));
            drop(state);
            kind_answer(answer, req.ok_or_else(unmatched)?, client);
        }
        Answer::Moved { key, addr: active } => {
            let active = active.map(|a| named_addr(a, addr)).transpose()?;
            let req = state.take(key, None).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::Moved(active));
        }
        Answer::Released { key, ok } => {
            let req = state.take(key, Some(Op::Release)).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::Flag(ok));
        }
        Answer::Renewed { key, ok } => {
            let req = state.take(key, Some(Op::Renew)).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::Flag(ok));
        }
        Answer::Status {
            role,
            addr: active,
            token,
        } => {
            let active = active.map(|a| named_addr(a, addr)).transpose()?;
            let req = state.take_status().ok_or_else(unmatched)?;
            let _ = req.answer(Reply::Status {
                role,
                active,
                token,
            });
        }
        // This client never sends `H`, `L`, `W`, `V` or `Q` on its pooled
        // connections, and reads the answer to its `O` before this.
        Answer::Health { .. }
        | Answer::Lock { .. }
        | Answer::ListEnd { .. }
        | Answer::Owner { .. }
        | Answer::LockWho { .. }
        | Answer::WhoEnd { .. }
        | Answer::LockKinds { .. }
        | Answer::KindsEnd { .. }
        | Answer::Waiter { .. }
        | Answer::QueueEnd { .. } => {
            return Err(unmatched());
        }
    }
    Ok(())
}
