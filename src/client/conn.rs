//! One connection slot: a background task that dials an address, runs the
//! connection (writer and reader side by side), and redials when it drops.
//!
//! Requests reach the connection through an unbounded channel. The writer
//! takes everything queued, registers each request as pending (per key, in
//! send order, with its op), and writes the whole batch with one
//! `write_all`. The reader splits answer lines with a `BufReader` and hands
//! each to the oldest pending request it answers, as PROTOCOL.md says:
//! `A`/`T` the oldest `A` of the key, `R` the oldest `R`, `N` the oldest `N`,
//! `S` the oldest `S`, `M` the oldest request of the key whatever its op.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::proto::{Answer, Role, parse_answer};

/// Longest answer line the client accepts (the longest legal one is about
/// 280 bytes; anything past this is a broken server).
const MAX_ANSWER_LINE: usize = 4096;
/// The writer stops coalescing once a batch holds this many bytes.
const MAX_BATCH: usize = 64 * 1024;

/// The op of a request, for matching answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Release,
    Renew,
    Status,
}

/// What a pending request learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Granted(u64),
    TimedOut,
    /// `M key addr`; `None` for `-`.
    Moved(Option<String>),
    /// `R key 1|0` or `N key 1|0`.
    Flag(bool),
    Status {
        role: Role,
        active: Option<String>,
        token: u64,
    },
    /// The connection closed (or was never there) before the answer.
    Lost,
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
    /// `None`: nobody waits for the answer (a background release).
    pub reply: Option<oneshot::Sender<Reply>>,
    /// An acquire holds one of its connection's waiting-acquire permits until
    /// it is answered, so that no connection ever has more than the server's
    /// limit of acquires waiting.
    #[allow(dead_code)] // held for its Drop
    pub permit: Option<OwnedSemaphorePermit>,
    /// Set by the writer when it takes the request.
    #[allow(dead_code)] // held for its Drop
    pub in_flight: Option<InFlight>,
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
}

/// A live connection: where requests go.
pub(crate) struct Conn {
    tx: mpsc::UnboundedSender<Request>,
    /// Permits for acquires waiting on this connection.
    pub acquires: Arc<Semaphore>,
}

impl Conn {
    /// Hands a request to the connection's writer. Gives it back if the
    /// connection has closed.
    pub(crate) fn submit(&self, req: Request) -> Result<(), Request> {
        self.tx.send(req).map_err(|e| e.0)
    }

    /// Sends a request and waits for its answer ([`Reply::Lost`] if the
    /// connection closes first).
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
        };
        if self.submit(req).is_err() {
            return Reply::Lost;
        }
        rx.await.unwrap_or(Reply::Lost)
    }
}

/// One entry of the client's connection list: an address and, while it is
/// up, its connection.
pub(crate) struct Slot {
    pub addr: String,
    live: Mutex<Option<Arc<Conn>>>,
    /// Dial attempts that failed since the slot was created.
    pub failures: AtomicUsize,
    pub ever_connected: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl Slot {
    pub(crate) fn new(addr: String) -> Slot {
        Slot {
            addr,
            live: Mutex::new(None),
            failures: AtomicUsize::new(0),
            ever_connected: AtomicBool::new(false),
            last_error: Mutex::new(None),
        }
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

/// What every slot task shares with the client.
pub(crate) struct Shared {
    /// Bumped whenever a connection comes up or goes down.
    pub changed: watch::Sender<u64>,
    pub in_flight: Arc<AtomicUsize>,
    pub redial: Duration,
    pub connect_timeout: Duration,
    pub max_waiting_acquires: usize,
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

/// The slot's background task: dial, serve, redial every `redial` (measured
/// from the previous dial, so a connection that lived long is redialled at
/// once and a flapping one at most once per period). Ends when the client is
/// dropped (`shutdown`'s sender is gone).
pub(crate) async fn run_slot(
    slot: Arc<Slot>,
    shared: Arc<Shared>,
    client: Weak<super::Inner>,
    mut shutdown: watch::Receiver<()>,
) {
    loop {
        let dialed_at = Instant::now();
        let dial = tokio::time::timeout(shared.connect_timeout, TcpStream::connect(&slot.addr));
        let dialed = tokio::select! {
            r = dial => r,
            _ = shutdown.changed() => return,
        };
        match dialed {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                slot.ever_connected.store(true, Ordering::Relaxed);
                let why = serve(&slot, &shared, &client, stream, &mut shutdown).await;
                match why {
                    None => return,
                    Some(why) => slot.set_error(why),
                }
            }
            Ok(Err(e)) => {
                slot.set_error(format!("connect to {}: {e}", slot.addr));
                slot.failures.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                slot.set_error(format!("connect to {}: timed out", slot.addr));
                slot.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        shared.bump();
        tokio::select! {
            _ = tokio::time::sleep_until(dialed_at + shared.redial) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Pending requests of one connection, in send order.
#[derive(Default)]
struct Pending {
    by_key: HashMap<Vec<u8>, VecDeque<Request>>,
    status: VecDeque<Request>,
}

impl Pending {
    fn push(&mut self, req: Request) {
        if req.op == Op::Status {
            self.status.push_back(req);
        } else {
            self.by_key
                .entry(req.key.clone())
                .or_default()
                .push_back(req);
        }
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
        req
    }

    fn drain(&mut self) -> impl Iterator<Item = Request> + '_ {
        self.status
            .drain(..)
            .chain(self.by_key.drain().flat_map(|(_, q)| q))
    }
}

/// How a connection ended.
enum End {
    /// Closed or failed: pending requests may be retried elsewhere.
    Closed(String),
    /// The server broke the protocol (or sent `E`): pending requests fail.
    Protocol(String),
}

/// Runs one connection until it ends. Returns why it ended, or `None` if the
/// client was dropped.
async fn serve(
    slot: &Arc<Slot>,
    shared: &Arc<Shared>,
    client: &Weak<super::Inner>,
    stream: TcpStream,
    shutdown: &mut watch::Receiver<()>,
) -> Option<String> {
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Request>();
    let conn = Arc::new(Conn {
        tx,
        acquires: Arc::new(Semaphore::new(shared.max_waiting_acquires)),
    });
    let pending = Mutex::new(Pending::default());
    *lock(&slot.live) = Some(conn.clone());
    shared.bump();

    let writer = async {
        let mut buf = Vec::with_capacity(16 * 1024);
        loop {
            let Some(first) = rx.recv().await else {
                return End::Closed("request channel closed".into());
            };
            {
                let mut pending = lock(&pending);
                let mut next = Some(first);
                while let Some(req) = next {
                    // An acquire whose caller is gone is not worth queueing.
                    let abandoned = req.op == Op::Acquire
                        && req.reply.as_ref().is_some_and(|tx| tx.is_closed());
                    if !abandoned {
                        let mut req = req;
                        req.in_flight = Some(InFlight::new(&shared.in_flight));
                        buf.extend_from_slice(&req.line);
                        pending.push(req);
                    }
                    next = if buf.len() < MAX_BATCH {
                        rx.try_recv().ok()
                    } else {
                        None
                    };
                }
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
        let mut rd = BufReader::with_capacity(16 * 1024, rd);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let read = (&mut rd)
                .take(MAX_ANSWER_LINE as u64)
                .read_until(b'\n', &mut line)
                .await;
            match read {
                Err(e) => return End::Closed(format!("read from {}: {e}", slot.addr)),
                Ok(0) => return End::Closed(format!("{} closed the connection", slot.addr)),
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') {
                if line.len() >= MAX_ANSWER_LINE {
                    return End::Protocol(format!(
                        "answer line from {} longer than {MAX_ANSWER_LINE} bytes",
                        slot.addr
                    ));
                }
                return End::Closed(format!("{} closed the connection mid-line", slot.addr));
            }
            line.pop();
            if let Err(end) = dispatch(&line, &pending, client, &slot.addr) {
                return end;
            }
        }
    };

    let end = tokio::select! {
        end = writer => Some(end),
        end = reader => Some(end),
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
        Some(End::Closed(why)) => (Reply::Lost, Some(why)),
        None => (Reply::Lost, None),
    };
    // Requests never written are simply lost (they may be retried).
    while let Ok(req) = rx.try_recv() {
        let _ = req.answer(Reply::Lost);
    }
    let drained: Vec<Request> = lock(&pending).drain().collect();
    for req in drained {
        let _ = req.answer(reply.clone());
    }
    why
}

/// Hands one answer line to the request it answers. An answer that matches
/// nothing, or a malformed line, ends the connection as a protocol error.
fn dispatch(
    line: &[u8],
    pending: &Mutex<Pending>,
    client: &Weak<super::Inner>,
    addr: &str,
) -> Result<(), End> {
    let answer = parse_answer(line).map_err(|e| End::Protocol(format!("{addr}: {e}")))?;
    let unmatched = || {
        End::Protocol(format!(
            "{addr}: answer {:?} matches no pending request",
            String::from_utf8_lossy(line)
        ))
    };
    let mut pending = lock(pending);
    match answer {
        Answer::Error { reason } => {
            return Err(End::Protocol(format!(
                "{addr} says: E {}",
                String::from_utf8_lossy(reason)
            )));
        }
        Answer::Granted { key, token } => {
            let req = pending.take(key, Some(Op::Acquire)).ok_or_else(unmatched)?;
            drop(pending);
            if req.answer(Reply::Granted(token)).is_err() {
                // Whoever asked is gone (the acquire future was dropped): do
                // not leave the lock held until its lease runs out.
                super::release_in_background(client, key.to_vec(), token);
            }
        }
        Answer::TimedOut { key } => {
            let req = pending.take(key, Some(Op::Acquire)).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::TimedOut);
        }
        Answer::Moved { key, addr: active } => {
            let req = pending.take(key, None).ok_or_else(unmatched)?;
            let active = active.map(|a| String::from_utf8_lossy(a).into_owned());
            let _ = req.answer(Reply::Moved(active));
        }
        Answer::Released { key, ok } => {
            let req = pending.take(key, Some(Op::Release)).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::Flag(ok));
        }
        Answer::Renewed { key, ok } => {
            let req = pending.take(key, Some(Op::Renew)).ok_or_else(unmatched)?;
            let _ = req.answer(Reply::Flag(ok));
        }
        Answer::Status {
            role,
            addr: active,
            token,
        } => {
            let req = pending.status.pop_front().ok_or_else(unmatched)?;
            let active = active.map(|a| String::from_utf8_lossy(a).into_owned());
            let _ = req.answer(Reply::Status {
                role,
                active,
                token,
            });
        }
        // This client never sends `H` on its pooled connections.
        Answer::Health { .. } => return Err(unmatched()),
    }
    Ok(())
}
