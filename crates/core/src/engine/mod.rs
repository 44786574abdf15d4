//! The sans-I/O core: the lock table, its timers and its token clock.
//!
//! The engine owns no socket and reads no clock. The I/O loop drives it:
//!
//! 1. [`Engine::open`] when a connection is accepted, [`Engine::close`] when
//!    it goes (its waiting acquires are withdrawn; its grants stay).
//! 2. [`Engine::tick`] with the current [`Now`] at the start of each loop
//!    turn, so that leases and waits that ran out are handled before the
//!    requests read in that turn.
//! 3. [`Engine::handle`] for each request, in the order read.
//! 4. [`Engine::take_dirty`] to learn which connections have answers waiting
//!    in [`Engine::output_mut`]; the loop sends them and clears what it sent.
//! 5. [`Engine::next_deadline`] to know how long it may sleep.
//!
//! Answers go straight into per-connection output buffers (a release hands
//! the lock to a waiter on another connection, so one request can answer
//! several connections). The same engine runs under io_uring, under epoll and
//! inside tests with a fake clock.

pub mod merge;
mod multi;
pub mod replication;
pub mod stats;
pub mod table;
pub mod token;
pub mod wheel;

use std::sync::Arc;

use crate::access::Access;
use crate::proto::{Answer, Held, Request, Role};
pub use merge::Merged;
pub use replication::Replication;
pub(crate) use replication::ReplicationLog;
use stats::{EngineStats, HOLD_SHIFT};
use table::{Holders, NIL, Table, WaiterState};
use token::TokenClock;
use wheel::Wheel;

/// A connection, numbered by the I/O loop (small, dense, reused).
pub type ConnId = u32;

/// The most acquires one connection may have waiting (docs/protocol.md,
/// "9. Load and limits").
pub(crate) const MAX_WAITING_PER_CONN: u32 = 4096;

/// The longest lease the engine takes, in ms: the 86400 s of docs/protocol.md
/// ("3. Values"), which the request parser enforces for clients (and for
/// waits). A replicated grant with more lease left than this is refused
/// ([`GrantRefusal`]).
pub(crate) const MAX_LEASE_MS: u64 = crate::proto::MAX_DURATION_MS;

// The timing wheel places every lease and wait directly: none is far
// enough ahead to be parked (see the wheel's module documentation).
const _: () = assert!(MAX_LEASE_MS < wheel::MAX_AHEAD_MS);

/// The most live locks (keys with a holder, waiters or a held-back `T`)
/// by default: `ringlock serve --max-locks`. A million held locks took
/// about 140 MiB at peak (docs/performance.md).
pub const DEFAULT_MAX_LOCKS: u32 = 1_000_000;

/// Table slots one `L` request looks at, at most: a page may hold fewer
/// than its limit (its cursor says where to go on), but no request holds
/// the loop for long (well under a millisecond).
pub(crate) const LIST_SCAN: usize = 65_536;

/// Table slots the `L` requests of one loop turn look at together, beyond
/// [`LIST_MIN_SCAN`] each: the first request of a turn may look at a whole
/// [`LIST_SCAN`], later ones at what is left. Many `L` requests pipelined
/// in one read (thousands fit in 64 KiB) would otherwise each scan
/// [`LIST_SCAN`] slots and hold the loop for seconds.
pub(crate) const LIST_TURN_SCAN: usize = LIST_SCAN;

/// Table slots an `L` request looks at even when its turn's
/// [`LIST_TURN_SCAN`] is spent: every request moves its cursor on, at the
/// cost of a few short requests.
pub(crate) const LIST_MIN_SCAN: usize = 64;

/// The bytes of lock lines after which an `L` answer stops (its cursor
/// says where to go on): a connection is no longer read past 64 KiB of
/// unsent answers, and one `L` answer of 1000 long keys (about 290 KB)
/// would otherwise go far past that.
pub(crate) const LIST_ANSWER_BYTES: usize = 16 * 1024;

/// The waiters `L` reports on one lock, at most: a lock with more is listed
/// with this many (the count is kept, not walked).
pub const LIST_WAITERS_CAP: u64 = 65_536;

/// The highest `--max-locks`: 2^31. Locks and timers are found by `u32`
/// index; this leaves half of the timing wheel's indices to waits, beside
/// one lease per lock.
pub const MAX_LOCKS_LIMIT: u32 = 1 << 31;

/// How many values of `T` a slab can reserve room for, up to `wanted`. The
/// room is address space, which a system may refuse for very large tables
/// (`ulimit -v`, strict overcommit): then half as much is tried, and so
/// on. A slab that outgrows its room still works, but grows by copying.
pub(crate) fn reservable<T>(wanted: usize) -> usize {
    // A slab entry is the value and the slab's tag, at most.
    let entry = std::mem::size_of::<T>() + 8;
    let mut n = wanted;
    while n > 0
        && Vec::<u8>::new()
            .try_reserve_exact(n.saturating_mul(entry))
            .is_err()
    {
        n /= 2;
    }
    n
}

/// The time, as the I/O loop read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic milliseconds (floor) since an arbitrary start.
    pub ms: u64,
    /// The same monotonic reading in microseconds (floor; `ms == us /
    /// 1000` where the loop reads the clock): what replication lag is
    /// measured with. Leases and every timer use `ms`.
    pub us: u64,
    /// Wall clock, nanoseconds since the Unix epoch: the floor of tokens.
    pub unix_ns: u64,
}

/// A request that breaks the connection although it parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An acquire of a key outside the rules of the connection's identity
    /// (`--acl`). It stays `Copy` (the request path's result is a word):
    /// the words that name the identity and the key are
    /// [`Engine::not_allowed_reason`].
    NotAllowed,
    /// One more than `MAX_WAITING_PER_CONN` waiting acquires.
    TooManyWaiting,
    /// A client request on a connection taken beyond `--max-conns` for the
    /// node's peers.
    TooManyConns,
    /// An acquire that would be granted, but no fencing token is left:
    /// [`token::MAX_TOKEN`] was issued or observed. Nothing can be granted
    /// any more; the operator's way out is in docs/protocol.md.
    TokensExhausted,
    /// An acquire of a key that has no lock while the table holds
    /// `max_locks` locks (`--max-locks`).
    LockTableFull { max_locks: u32 },
    /// A `G` or `C` that would be granted at once while `max_locks` shared
    /// grants and permits are held (`--max-locks` bounds them apart from
    /// the locks): one connection could otherwise take shared grants of a
    /// key without end.
    MembersFull { max_locks: u32 },
    /// An `A` of a key that is a live semaphore: `A` has no answer for a
    /// refusal. The words, which name the key, are
    /// [`Engine::not_allowed_reason`].
    Semaphore,
    /// A `G` or `C` on an active one of whose followers speaks a peer
    /// protocol too old to carry shared grants and permits (the cluster
    /// says so, each loop turn): that follower would
    /// lose them if it took over.
    FollowerTooOld,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotAllowed => {
                f.write_str("not allowed: the key is outside the identity's rules")
            }
            Refusal::TooManyWaiting => write!(
                f,
                "more than {MAX_WAITING_PER_CONN} waiting acquires on one connection"
            ),
            Refusal::TooManyConns => f.write_str(
                "too many connections: this one was taken beyond --max-conns for a peer",
            ),
            Refusal::TokensExhausted => write!(
                f,
                "fencing tokens exhausted: token {} was issued or seen, nothing can be granted",
                token::MAX_TOKEN
            ),
            Refusal::LockTableFull { max_locks } => {
                write!(f, "lock table full: {max_locks} locks (--max-locks)")
            }
            Refusal::MembersFull { max_locks } => write!(
                f,
                "shared grants and permits full: {max_locks} held (--max-locks)"
            ),
            Refusal::Semaphore => {
                f.write_str("the key is a semaphore: acquire it with C")
            }
            Refusal::FollowerTooOld => f.write_str(
                "a follower of this node runs an older release that cannot replicate shared locks and semaphores: G and C are refused until every node is upgraded",
            ),
        }
    }
}

/// A replicated grant (`Engine::apply_grant`) the engine does not take.
/// The peer that sent it is misconfigured or broken: the cluster breaks its
/// link with this as the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantRefusal {
    /// Its token is above [`token::MAX_TOKEN`].
    TokenOutOfRange(u64),
    /// Its remaining lease is above `MAX_LEASE_MS`.
    LeaseOutOfRange(u64),
    /// Its key has no lock here and the table holds `max_locks` locks: the
    /// active takes more than this node (every node needs the same
    /// `--max-locks`).
    LockTableFull { max_locks: u32 },
    /// A shared grant or permit while `max_locks` of them are held here.
    MembersFull { max_locks: u32 },
    /// A semaphore's limit above [`crate::proto::MAX_PERMITS`].
    LimitOutOfRange(u32),
}

impl std::fmt::Display for GrantRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrantRefusal::TokenOutOfRange(token) => write!(
                f,
                "replicated grant with token {token}, above the highest token {}",
                token::MAX_TOKEN
            ),
            GrantRefusal::LeaseOutOfRange(ms) => write!(
                f,
                "replicated grant with {ms} ms of lease left, more than {MAX_LEASE_MS}"
            ),
            GrantRefusal::LockTableFull { max_locks } => write!(
                f,
                "replicated grant of a new key, but the lock table is full: {max_locks} locks \
                 (--max-locks; it must be the same on every node)"
            ),
            GrantRefusal::MembersFull { max_locks } => write!(
                f,
                "replicated shared grant or permit, but {max_locks} are held (--max-locks; it \
                 must be the same on every node)"
            ),
            GrantRefusal::LimitOutOfRange(limit) => write!(
                f,
                "replicated permit of a semaphore of {limit}, more than {}",
                crate::proto::MAX_PERMITS
            ),
        }
    }
}

/// On a node with identities: whether `conn` may release or renew a grant
/// held by `holder`: its own identity's, or any as admin. A grant whose
/// holder's identity is not known (replicated over a link too old to carry
/// it) is released and renewed by an admin only.
#[cold]
#[inline(never)]
fn may_touch(access: &[Option<Arc<Access>>], holders: &Holders, conn: ConnId, holder: u32) -> bool {
    let Some(access) = access.get(conn as usize).and_then(Option::as_ref) else {
        return false;
    };
    access.is_admin() || holders.get(holder).identity == Some(access.identity())
}

/// What the engine's timers are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// The lease of the lock's holder runs out.
    Lease(u32),
    /// The waiter's wait runs out.
    Wait(u32),
    /// The lease of a shared grant or permit runs out (a slot of
    /// [`multi::Members`]).
    Member(u32),
}

/// Where a connection with output waits for [`Engine::take_dirty`]. An id
/// closed and taken again within one turn may still be listed from its
/// first life; it moves when it is written to as what it is now.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Listed {
    #[default]
    No,
    Client,
    Link,
}

/// Per-connection state the engine keeps.
#[derive(Default)]
struct Conn {
    open: bool,
    /// Answers not yet taken by the I/O loop.
    out: Vec<u8>,
    /// Which of `Engine::dirty` and `Engine::dirty_links` lists it.
    dirty: Listed,
    /// Its holder entry, which its grants name: made at its first grant,
    /// dropped when its owner label changes or it closes.
    holder: Option<u32>,
    /// The peer address, as the loop saw it at the accept.
    addr: Option<std::net::SocketAddr>,
    /// Its owner label (`O`), if it set one.
    owner: Option<Box<[u8]>>,
}

/// Whether this node serves clients.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Serving {
    Active,
    /// Answers `M` naming `active` (`None`: `-`).
    Standby {
        active: Option<Box<[u8]>>,
    },
}

/// See the module docs.
pub struct Engine {
    table: Table,
    /// `--max-locks`: the table never holds more locks.
    max_locks: u32,
    wheel: Wheel<Timer>,
    tokens: TokenClock,
    conns: Vec<Conn>,
    dirty: Vec<ConnId>,
    /// Peer links with output ([`Engine::write_to`]): collected before
    /// `dirty`, so the loops hand a turn's replication to the kernel before
    /// the client answers it covers. A node stopped between two sends
    /// (SIGSTOP, a VM stall) then never leaves a client holding an answer
    /// its followers have not been sent: the kernel delivers what was
    /// written while the process is stopped.
    dirty_links: Vec<ConnId>,
    serving: Serving,
    /// This node's address as clients should name it.
    advertise: Box<[u8]>,
    /// What `H` answers (`None`: `H ok`); the node keeps it current.
    problem: Option<Box<[u8]>>,
    /// Changes of the table since the last [`Engine::take_replication`];
    /// `None` on a node without peers.
    replication: Option<ReplicationLog>,
    /// Counters, bumped inline ([`stats`]).
    stats: EngineStats,
    /// Table slots `L` requests may still look at in this loop turn
    /// ([`LIST_TURN_SCAN`]); renewed by [`Engine::tick`].
    list_budget: usize,
    /// Who holds the grants (a grant names an entry).
    holders: Holders,
    /// Grants kept beside a key's grant after a healed split brain, by
    /// lock ([`merge`]); empty on a node that never merged.
    merged: std::collections::HashMap<u32, Vec<merge::Believed>>,
    /// Client certificates give identities ([`Engine::require_identities`]):
    /// only a grant's holder (or an admin) releases and renews it.
    identities: bool,
    /// Requests take [`Engine::handle_checked`] first: a standby, or a node
    /// with identities. The plain active's request path tests this one
    /// word and nothing else of either.
    checked: bool,
    /// With identities, by connection: its identity and what the rules
    /// allow it (set when its TLS handshake ended; shared by the
    /// connections of one identity under one rule set). Apart from
    /// [`Conn`], which a plain node's requests touch, and empty on it.
    access: Vec<Option<Arc<Access>>>,
    /// The reason of the last [`Refusal::NotAllowed`] or
    /// [`Refusal::Semaphore`].
    not_allowed: String,
    /// Shared grants and permits ([`multi`]).
    members: multi::Members,
    /// Locks with members whose queue lost a waiter in [`Engine::close`]
    /// (which has no time to grant with): [`Engine::tick`] passes them on.
    pass_pending: Vec<u32>,
    /// A follower's link speaks a peer protocol that cannot carry shared
    /// grants and permits: `G` and `C` are refused
    /// ([`Refusal::FollowerTooOld`]). The cluster keeps it current.
    follower_too_old: bool,
}

impl Engine {
    /// An active engine whose clock starts at `now`. `advertise` is the
    /// address `S` names for the active node when it is this one.
    pub fn new(now: Now, advertise: &str) -> Engine {
        Engine::with_max_locks(now, advertise, DEFAULT_MAX_LOCKS)
    }

    /// Same, holding at most `max_locks` locks (`--max-locks`, at least 1
    /// and at most [`MAX_LOCKS_LIMIT`]; clamped into that range). Room for
    /// them is reserved now, so that the table never stops to copy itself
    /// as it grows; see [`Engine::reserved_locks`].
    pub(crate) fn with_max_locks(now: Now, advertise: &str, max_locks: u32) -> Engine {
        let max_locks = max_locks.clamp(1, MAX_LOCKS_LIMIT);
        let locks = max_locks as usize;
        Engine {
            table: Table::with_capacity(locks),
            max_locks,
            // A lease per lock, a wait per waiter at most.
            wheel: Wheel::with_capacity(now.ms, locks + table::RESERVED_WAITERS),
            tokens: TokenClock::new(),
            conns: Vec::new(),
            dirty: Vec::new(),
            dirty_links: Vec::new(),
            serving: Serving::Active,
            advertise: advertise.as_bytes().into(),
            problem: None,
            replication: None,
            stats: EngineStats::default(),
            list_budget: LIST_TURN_SCAN,
            holders: Holders::default(),
            merged: std::collections::HashMap::new(),
            identities: false,
            checked: false,
            access: Vec::new(),
            not_allowed: String::new(),
            members: multi::Members::default(),
            pass_pending: Vec::new(),
            follower_too_old: false,
        }
    }

    /// What the engine has counted since it was made.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Waiting acquires (queued or with a held-back `T`).
    pub fn waiter_count(&self) -> usize {
        self.table.waiter_count()
    }

    /// Bytes in `conn`'s output not yet taken by the loop (0 for a
    /// connection the engine does not know).
    pub(crate) fn output_len(&self, conn: ConnId) -> usize {
        self.conns.get(conn as usize).map_or(0, |c| c.out.len())
    }

    /// The highest token issued or seen (what `S` reports).
    pub fn highest_token(&self) -> u64 {
        self.tokens.highest()
    }

    /// True while this node serves clients.
    pub fn is_active(&self) -> bool {
        self.serving == Serving::Active
    }

    /// Number of live locks.
    pub fn lock_count(&self) -> usize {
        self.table.len()
    }

    /// Locks the engine could reserve room for: `max_locks` unless the
    /// system refused that much address space. Past it the lock slab grows
    /// by doubling, which copies it in one loop turn.
    pub fn reserved_locks(&self) -> usize {
        self.table.reserved_locks()
    }

    /// The live grant of `key`: `(token, expires_ms)`.
    pub fn holder(&self, key: &[u8]) -> Option<(u64, u64)> {
        let lock = self.table.find(key)?;
        self.table
            .lock(lock)
            .holder
            .map(|g| (g.token, g.expires_ms))
    }

    /// Who holds the live grant of `key`, if it is held.
    pub fn holder_of(&self, key: &[u8]) -> Option<crate::proto::Holder<'_>> {
        let grant = self.table.lock(self.table.find(key)?).holder?;
        Some(self.holders.get(grant.holder))
    }

    /// Holder entries alive (one per connection that holds or held a grant
    /// and is open, one per distinct replicated holder). For tests.
    pub fn holder_count(&self) -> usize {
        self.holders.len()
    }

    /// The peer address of `conn` as the loop saw it: what `W` and `Q`
    /// say of its grants and waits. The loop tells it right after
    /// [`Engine::open`].
    pub fn set_remote(&mut self, conn: ConnId, addr: std::net::SocketAddr) {
        if let Some(c) = self.conns.get_mut(conn as usize) {
            c.addr = Some(addr);
        }
    }

    /// From now on grants are released and renewed only by their holder's
    /// identity or an admin: a node with client certificates, called at
    /// start (a standby's replicated grants count too).
    pub fn require_identities(&mut self) {
        self.identities = true;
        self.checked = true;
    }

    /// Whether [`Engine::require_identities`] was called.
    pub fn requires_identities(&self) -> bool {
        self.identities
    }

    /// `conn`'s identity and what it may do, from its client certificate
    /// (before its first request). Its later grants name the identity.
    pub fn set_access(&mut self, conn: ConnId, access: Arc<Access>) {
        debug_assert!(self.identities, "an identity on a node without them");
        let Some(c) = self.conns.get_mut(conn as usize) else {
            return;
        };
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        let i = conn as usize;
        if self.access.len() <= i {
            self.access.resize(i + 1, None);
        }
        self.access[i] = Some(access);
    }

    /// `conn`'s identity and rules, on a node with identities.
    fn access_of(&self, conn: ConnId) -> Option<&Access> {
        self.access.get(conn as usize).and_then(|a| a.as_deref())
    }

    /// `conn`'s identity, if it has one.
    pub fn identity_of(&self, conn: ConnId) -> Option<&[u8]> {
        self.access_of(conn).map(Access::identity)
    }

    /// Every live grant: `(key, token, expires_ms)`. For tests and tools.
    pub fn grants(&self) -> impl Iterator<Item = (&[u8], u64, u64)> {
        self.table
            .locks()
            .filter_map(|l| l.holder.map(|g| (l.key(), g.token, g.expires_ms)))
    }

    /// Registers a new connection. `conn` must not be open.
    pub fn open(&mut self, conn: ConnId) {
        let i = conn as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, Conn::default);
        }
        let c = &mut self.conns[i];
        assert!(!c.open, "connection {conn} opened twice");
        debug_assert_eq!(self.table.conn_len(conn), 0);
        c.open = true;
        c.out.clear();
    }

    /// Forgets a connection: its waiting acquires leave their queues (their
    /// answers are never sent), its grants stay, its unsent output is dropped.
    pub fn close(&mut self, conn: ConnId) {
        let c = &mut self.conns[conn as usize];
        assert!(c.open, "connection {conn} closed twice");
        c.open = false;
        c.out.clear();
        c.addr = None;
        c.owner = None;
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        if let Some(access) = self.access.get_mut(conn as usize) {
            *access = None;
        }
        loop {
            let w = self.table.conn_first(conn);
            if w == NIL {
                break;
            }
            if let Some(timer) = self.table.waiter_mut(w).timer.take() {
                self.wheel.cancel(timer);
            }
            let waiter = self.table.finish(w);
            if !self.table.remove_if_idle(waiter.lock) && self.table.lock(waiter.lock).members > 0 {
                self.withdrawn_from_members(waiter.lock);
            }
            self.stats.withdrawn += 1;
            if let Some(kind) = waiter.kind {
                self.stats.of_kind(kind).withdrawn += 1;
            }
        }
    }

    /// A waiter left the queue of `lock`, which has members: those behind
    /// it may now be granted, at the next [`Engine::tick`] (or
    /// [`Engine::settle`]).
    #[cold]
    #[inline(never)]
    fn withdrawn_from_members(&mut self, lock: u32) {
        if !self.pass_pending.contains(&lock) {
            self.pass_pending.push(lock);
        }
    }

    /// Grants what the connections closed since the last turn let be
    /// granted (see [`Engine::close`]); the node calls it right after
    /// closing.
    pub fn settle(&mut self, now: Now) {
        if !self.pass_pending.is_empty() {
            self.settle_pending(now);
        }
    }

    /// The answers waiting for `conn`. The I/O loop takes bytes from the
    /// front (or swaps the buffer out) as it sends them.
    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        &mut self.conns[conn as usize].out
    }

    /// Moves the connections that got answers since the last call into
    /// `into` (which is cleared first): peer links first, then clients in
    /// the order they were answered. Closed connections are left out.
    /// Returns how many of them are peer links (at the front).
    pub fn take_dirty(&mut self, into: &mut Vec<ConnId>) -> usize {
        into.clear();
        let conns = &mut self.conns;
        if self.dirty_links.is_empty() {
            // No links listed: every entry is a client's.
            std::mem::swap(into, &mut self.dirty);
            into.retain(|&c| {
                let conn = &mut conns[c as usize];
                debug_assert_eq!(conn.dirty, Listed::Client);
                conn.dirty = Listed::No;
                conn.open && !conn.out.is_empty()
            });
            return 0;
        }
        let links = self.dirty_links.len();
        into.append(&mut self.dirty_links);
        into.append(&mut self.dirty);
        let mut i = 0;
        let mut links_kept = 0;
        into.retain(|&c| {
            let listed = if i < links {
                Listed::Link
            } else {
                Listed::Client
            };
            i += 1;
            let conn = &mut conns[c as usize];
            if conn.dirty != listed {
                return false; // listed by the id's earlier life this turn
            }
            conn.dirty = Listed::No;
            let kept = conn.open && !conn.out.is_empty();
            links_kept += usize::from(kept && listed == Listed::Link);
            kept
        });
        links_kept
    }

    /// The earliest monotonic ms at which [`Engine::tick`] has work, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        if !self.pass_pending.is_empty() {
            return Some(0);
        }
        self.wheel.next_deadline()
    }

    /// True if some open connection has answers that the next
    /// [`Engine::take_dirty`] would return: written after the loop took
    /// this turn's (a grant made by a release handled while another
    /// connection's answers went out, a step-down when a link closed).
    pub(crate) fn has_uncollected_output(&self) -> bool {
        self.dirty.iter().chain(&self.dirty_links).any(|&c| {
            let conn = &self.conns[c as usize];
            conn.open && !conn.out.is_empty()
        })
    }

    /// Ends the leases and waits that ran out by `now`.
    pub fn tick(&mut self, now: Now) {
        self.list_budget = LIST_TURN_SCAN;
        self.settle(now);
        while let Some(timer) = self.wheel.poll(now.ms) {
            match timer {
                Timer::Lease(lock) => {
                    let grant = self.table.lock_mut(lock).holder.take();
                    debug_assert!(grant.is_some(), "lease timer of a free lock");
                    if let Some(grant) = grant {
                        self.stats.lease_expiries += 1;
                        self.holders.unref(grant.holder);
                        self.replicate_release(lock, grant.token);
                    }
                    if self.merged.is_empty() || !self.promote_believed(now, lock) {
                        self.hand_off(now, lock);
                    }
                }
                Timer::Wait(w) => {
                    self.table.waiter_mut(w).timer = None;
                    self.wait_ran_out(now, w);
                }
                Timer::Member(m) => self.member_expired(now, m),
            }
        }
    }

    /// Handles one request from `conn`. `Err` means the request breaks the
    /// connection: the caller sends `E` and closes it. Answers to earlier
    /// requests are already in the output.
    pub fn handle(&mut self, now: Now, conn: ConnId, request: Request<'_>) -> Result<(), Refusal> {
        debug_assert!(self.conns[conn as usize].open);
        debug_assert_eq!(
            self.checked,
            self.identities || self.serving != Serving::Active
        );
        if self.checked
            && let Some(result) = self.handle_checked(now, conn, request)
        {
            return result;
        }
        match request {
            Request::Acquire {
                key,
                lease_ms,
                wait_ms,
            } => return self.acquire(now, conn, key, lease_ms, wait_ms),
            Request::Release { key, token } => {
                let ok = self.release(now, key, token);
                if !ok {
                    self.stats.release_stale += 1;
                }
                emit(
                    &mut self.conns,
                    &mut self.dirty,
                    conn,
                    Answer::Released { key, ok },
                );
            }
            Request::Renew {
                key,
                token,
                lease_ms,
            } => {
                let ok = self.renew(now, key, token, lease_ms);
                if ok {
                    self.stats.renewed += 1;
                } else {
                    self.stats.renew_stale += 1;
                }
                emit(
                    &mut self.conns,
                    &mut self.dirty,
                    conn,
                    Answer::Renewed { key, ok },
                );
            }
            Request::Status | Request::Health => self.status(conn, request),
            Request::List {
                cursor,
                limit,
                prefix,
            } => self.list(now, conn, cursor, limit, prefix, ListForm::Plain),
            Request::Who {
                cursor,
                limit,
                prefix,
            } => self.list(now, conn, cursor, limit, prefix, ListForm::Who),
            Request::Kinds {
                cursor,
                limit,
                prefix,
            } => self.list(now, conn, cursor, limit, prefix, ListForm::Kinds),
            Request::Owner { owner } => self.set_owner(conn, owner),
            Request::Queue { key } => self.queue(now, conn, key),
            Request::Shared { .. } | Request::Permit { .. } => {
                return self.handle_kind(now, conn, request);
            }
        }
        Ok(())
    }

    /// `O`: the owner label of `conn`'s grants from now on (those it holds
    /// keep theirs).
    #[cold]
    #[inline(never)]
    fn set_owner(&mut self, conn: ConnId, owner: &[u8]) {
        let c = &mut self.conns[conn as usize];
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        c.owner = Some(owner.into());
        emit(
            &mut self.conns,
            &mut self.dirty,
            conn,
            Answer::Owner { owner },
        );
    }

    /// The holder entry for a grant to `conn`, with the grant's reference.
    #[inline]
    fn grant_holder(&mut self, conn: ConnId) -> u32 {
        match self.conns[conn as usize].holder {
            Some(holder) => {
                self.holders.add_ref(holder);
                holder
            }
            None => self.first_holder(conn),
        }
    }

    /// `conn`'s first grant (since it opened or set its label): its entry,
    /// with a reference for the connection and one for the grant.
    #[cold]
    #[inline(never)]
    fn first_holder(&mut self, conn: ConnId) -> u32 {
        let c = &self.conns[conn as usize];
        let addr = c
            .addr
            .map(|a| a.to_string().into_bytes().into_boxed_slice());
        debug_assert!(
            addr.as_ref()
                .is_none_or(|a| a.len() <= crate::proto::MAX_HOLDER_ADDR)
        );
        let identity = self.access.get(conn as usize).and_then(|a| a.as_deref());
        let identity = identity.map(Access::identity);
        let holder = self.holders.insert(addr, c.owner.as_deref(), identity);
        self.holders.add_ref(holder);
        self.conns[conn as usize].holder = Some(holder);
        holder
    }

    /// What `W` and `Q` say of a waiter's connection.
    fn conn_holder(&self, conn: ConnId) -> (Option<String>, Option<&[u8]>) {
        let c = &self.conns[conn as usize];
        (c.addr.map(|a| a.to_string()), c.owner.as_deref())
    }

    /// `Q`: `key`'s lock with its holder (no line if it has no lock), its
    /// first [`crate::proto::MAX_QUEUE_LISTED`] waiters, oldest first, then
    /// `Q <key> <waiters>`.
    #[cold]
    #[inline(never)]
    fn queue(&mut self, now: Now, conn: ConnId, key: &[u8]) {
        let mut out = std::mem::take(&mut self.conns[conn as usize].out);
        let mut waiters = 0;
        let hidden = self.access_of(conn).is_some_and(|a| !a.may_lock(key));
        if let Some(lock) = self.table.find(key).filter(|_| !hidden) {
            let shown = self.shown_grant(lock);
            let l = self.table.lock(lock);
            lock_who(&self.table, &self.holders, now, l, shown).encode(&mut out);
            waiters = self.table.queue_len(l, LIST_WAITERS_CAP);
            let mut w = self.table.head(lock);
            for _ in 0..crate::proto::MAX_QUEUE_LISTED {
                let Some(i) = w else { break };
                let waiter = self.table.waiter(i);
                let (addr, owner) = self.conn_holder(waiter.conn);
                Answer::Waiter {
                    waited_ms: now.ms.saturating_sub(waiter.queued_ms),
                    holder: crate::proto::Holder {
                        addr: addr.as_deref().map(str::as_bytes),
                        owner,
                        identity: None,
                    },
                }
                .encode(&mut out);
                w = self.table.queue_next(i);
            }
        }
        Answer::QueueEnd { key, waiters }.encode(&mut out);
        self.conns[conn as usize].out = out;
        emit_bytes(&mut self.conns, &mut self.dirty, conn);
    }

    /// `S` and `H`: rare, kept out of the request path's way.
    #[cold]
    #[inline(never)]
    fn status(&mut self, conn: ConnId, request: Request<'_>) {
        self.stats.status += 1;
        let answer = if request == Request::Health {
            Answer::Health {
                problem: self.problem.as_deref(),
            }
        } else {
            let (role, addr) = match &self.serving {
                Serving::Active => (Role::Active, Some(&*self.advertise)),
                Serving::Standby { active } => (Role::Standby, active.as_deref()),
            };
            let token = self.tokens.highest();
            Answer::Status { role, addr, token }
        };
        emit(&mut self.conns, &mut self.dirty, conn, answer);
    }

    /// `L`: up to `limit` locks whose key starts with `prefix`, about
    /// [`LIST_ANSWER_BYTES`] of them at most, from table
    /// slot `cursor` on, looking at no more than [`LIST_SCAN`] slots (less
    /// once this turn's [`LIST_TURN_SCAN`] is spent, down to
    /// [`LIST_MIN_SCAN`]); then `L <next cursor>` (0: the end). Rare (an
    /// operator's request) and bounded, so requests never hold the loop
    /// long however many arrive at once.
    /// `W` is the same with each lock's holder, `V` with its holder and
    /// kind ([`ListForm`]).
    #[cold]
    #[inline(never)]
    fn list(
        &mut self,
        now: Now,
        conn: ConnId,
        cursor: u64,
        limit: u32,
        prefix: &[u8],
        form: ListForm,
    ) {
        let bound = self.table.slot_bound();
        let start = usize::try_from(cursor).unwrap_or(usize::MAX).min(bound);
        let scan = self.list_budget.clamp(LIST_MIN_SCAN, LIST_SCAN);
        let end = start.saturating_add(scan).min(bound);
        self.list_budget = self.list_budget.saturating_sub(end - start);
        let mut listed = 0;
        let mut next = end;
        let out_start = self.conns[conn as usize].out.len();
        // With identities, only keys the connection may lock (an admin: all).
        let access = self.access.get(conn as usize).cloned().flatten();
        let hidden = |key: &[u8]| access.as_ref().is_some_and(|a| !a.may_lock(key));
        for i in start..end {
            let Some(lock) = self.table.lock_at(i) else {
                continue;
            };
            if !lock.key().starts_with(prefix) || hidden(lock.key()) {
                continue;
            }
            let written = self.conns[conn as usize].out.len() - out_start;
            if listed == limit || written >= LIST_ANSWER_BYTES {
                next = i;
                break;
            }
            listed += 1;
            let shown = match lock.holder {
                Some(g) => Some((g.token, g.expires_ms, g.holder)),
                None => self.shown_grant(i as u32),
            };
            let lock = self.table.lock(i as u32);
            let answer = match form {
                ListForm::Who => lock_who(&self.table, &self.holders, now, lock, shown),
                ListForm::Kinds => {
                    with_kind(lock_who(&self.table, &self.holders, now, lock, shown), lock)
                }
                ListForm::Plain => {
                    let (token, lease_ms) =
                        shown.map_or((0, 0), |(t, e, _)| (t, e.saturating_sub(now.ms)));
                    Answer::Lock {
                        key: lock.key(),
                        token,
                        lease_ms,
                        waiters: self.table.queue_len(lock, LIST_WAITERS_CAP),
                    }
                }
            };
            emit(&mut self.conns, &mut self.dirty, conn, answer);
        }
        let cursor = if next >= bound { 0 } else { next as u64 };
        let end = match form {
            ListForm::Plain => Answer::ListEnd { cursor },
            ListForm::Who => Answer::WhoEnd { cursor },
            ListForm::Kinds => Answer::KindsEnd { cursor },
        };
        emit(&mut self.conns, &mut self.dirty, conn, end);
    }

    /// What `H` answers from now on: a problem (one line of printable
    /// text), or `None` for `H ok`.
    pub(crate) fn set_problem(&mut self, problem: Option<&[u8]>) {
        if self.problem.as_deref() != problem {
            self.problem = problem.map(Box::from);
        }
    }

    /// Stops serving: every waiting acquire is answered (`M` naming `active`,
    /// or `T` for one whose wait already ran out and was held back), oldest
    /// first on each connection, and later requests get `M`. Grants stay in
    /// the table (a successor may have them replicated).
    pub(crate) fn step_down(&mut self, active: Option<&str>) {
        let active: Option<Box<[u8]>> = active.map(|a| a.as_bytes().into());
        for conn in 0..self.conns.len() as ConnId {
            loop {
                let w = self.table.conn_first(conn);
                if w == NIL {
                    break;
                }
                let waiter = self.table.waiter(w);
                let key = self.table.lock(waiter.lock).key();
                let answer = match waiter.state {
                    WaiterState::Queued => {
                        self.stats.redirected += 1;
                        Answer::Moved {
                            key,
                            addr: active.as_deref(),
                        }
                    }
                    WaiterState::HeldBack => Engine::timed_out_answer(waiter.kind, key),
                };
                emit(&mut self.conns, &mut self.dirty, conn, answer);
                if let Some(timer) = self.table.waiter_mut(w).timer.take() {
                    self.wheel.cancel(timer);
                }
                let waiter = self.table.finish(w);
                self.table.remove_if_idle(waiter.lock);
            }
        }
        self.serving = Serving::Standby { active };
        self.checked = true;
    }

    fn acquire(
        &mut self,
        now: Now,
        conn: ConnId,
        key: &[u8],
        lease_ms: u64,
        wait_ms: u64,
    ) -> Result<(), Refusal> {
        let Some(lock) = self
            .table
            .find_or_insert_within(key, self.max_locks as usize)
        else {
            return Err(Refusal::LockTableFull {
                max_locks: self.max_locks,
            });
        };
        let l = self.table.lock(lock);
        if !l.is_held() {
            debug_assert!(self.table.head(lock).is_none());
            let Some(token) = self.tokens.next(now.unix_ns) else {
                self.table.remove_if_idle(lock);
                return Err(Refusal::TokensExhausted);
            };
            self.grant(now, lock, conn, lease_ms, token);
            self.stats.granted_now += 1;
            return Ok(());
        }
        if l.limit > 0 {
            return Err(self.refuse_semaphore(lock));
        }
        if self.table.conn_len(conn) >= MAX_WAITING_PER_CONN {
            return Err(Refusal::TooManyWaiting);
        }
        let w = self.table.enqueue(lock, conn, lease_ms, now.ms);
        if wait_ms > 0 {
            let timer = self.wheel.insert(deadline(now, wait_ms), Timer::Wait(w));
            self.table.waiter_mut(w).timer = Some(timer);
        }
        Ok(())
    }

    /// `A` of a live semaphore: the words of the refusal.
    #[cold]
    #[inline(never)]
    fn refuse_semaphore(&mut self, lock: u32) -> Refusal {
        let l = self.table.lock(lock);
        self.not_allowed = format!(
            "key \"{}\" is a semaphore of {} permits: acquire it with C",
            crate::proto::Quoted(l.key()),
            l.limit
        );
        self.stats.kind_refused += 1;
        Refusal::Semaphore
    }

    fn release(&mut self, now: Now, key: &[u8], token: u64) -> bool {
        let Some(lock) = self.table.find(key) else {
            return false;
        };
        let holder = &mut self.table.lock_mut(lock).holder;
        match *holder {
            Some(grant) if grant.token == token => {
                *holder = None;
                self.wheel.cancel(grant.timer);
                self.holders.unref(grant.holder);
                // A token is the wall clock's ns at its grant (unless the
                // token clock ran ahead of it): no field of its own.
                self.stats
                    .hold
                    .record(now.unix_ns.saturating_sub(token) >> HOLD_SHIFT);
                self.replicate_release(lock, token);
                if self.merged.is_empty() || !self.promote_believed(now, lock) {
                    self.hand_off(now, lock);
                }
                true
            }
            _ => self.release_other(now, lock, token),
        }
    }

    /// A release whose token is not the exclusive holder's: a shared
    /// grant's or permit's, a believed grant's after a heal, or stale.
    #[cold]
    #[inline(never)]
    fn release_other(&mut self, now: Now, lock: u32, token: u64) -> bool {
        if self.table.lock(lock).members > 0 {
            self.release_member(now, lock, token)
        } else if self.merged.is_empty() {
            false
        } else {
            self.release_believed(now, lock, token)
        }
    }

    fn renew(&mut self, now: Now, key: &[u8], token: u64, lease_ms: u64) -> bool {
        let Some(lock) = self.table.find(key) else {
            return false;
        };
        let Some(grant) = self.table.lock(lock).holder.filter(|g| g.token == token) else {
            if self.table.lock(lock).members > 0 {
                return self.renew_member(now, lock, token, lease_ms);
            }
            if self.merged.is_empty() {
                return false;
            }
            return self.renew_believed(now, lock, token, lease_ms);
        };
        self.wheel.cancel(grant.timer);
        let expires_ms = deadline(now, lease_ms);
        let timer = self.wheel.insert(expires_ms, Timer::Lease(lock));
        self.table.lock_mut(lock).holder = Some(table::Grant {
            token,
            expires_ms,
            timer,
            holder: grant.holder,
        });
        self.replicate_grant(now, lock);
        true
    }

    /// What a plain active node's requests skip ([`Engine::checked`]): a
    /// standby answers a request with a key `M`; with identities an
    /// acquire outside the connection's rules is refused, and a release or
    /// renewal with the right token of a grant another identity holds is
    /// answered `0`, counted, and changes nothing. `None`: the request goes
    /// on as on a plain node.
    #[cold]
    #[inline(never)]
    fn handle_checked(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
    ) -> Option<Result<(), Refusal>> {
        if let (Serving::Standby { active }, Some(key)) = (&self.serving, request.key()) {
            let answer = Answer::Moved {
                key,
                addr: active.as_deref(),
            };
            emit(&mut self.conns, &mut self.dirty, conn, answer);
            self.stats.redirected += 1;
            return Some(Ok(()));
        }
        if !self.identities {
            return None;
        }
        let answer = match request {
            Request::Acquire { key, .. } => return self.check_access(conn, key).err().map(Err),
            Request::Release { key, token } if self.held_by_another(now, conn, key, token) => {
                self.stats.release_not_holder += 1;
                Answer::Released { key, ok: false }
            }
            Request::Renew { key, token, .. } if self.held_by_another(now, conn, key, token) => {
                self.stats.renew_not_holder += 1;
                Answer::Renewed { key, ok: false }
            }
            _ => return None,
        };
        emit(&mut self.conns, &mut self.dirty, conn, answer);
        Some(Ok(()))
    }

    /// On a node with identities: whether `key`'s grant with `token` (or
    /// its believed grant with lease left, after a merge) is held by an
    /// identity that `conn` may not release and renew for.
    fn held_by_another(&self, now: Now, conn: ConnId, key: &[u8], token: u64) -> bool {
        let Some(lock) = self.table.find(key) else {
            return false;
        };
        let holder = match self.table.lock(lock).holder {
            Some(grant) if grant.token == token => grant.holder,
            _ if self.table.lock(lock).members > 0 => match self.members.holder_of(lock, token) {
                Some(holder) => holder,
                None => return false,
            },
            _ => match self
                .merged
                .get(&lock)
                .and_then(|beside| beside.iter().find(|b| b.token == token))
            {
                Some(b) if b.expires_ms > now.ms => b.holder,
                _ => return false,
            },
        };
        !may_touch(&self.access, &self.holders, conn, holder)
    }

    /// On a node with identities: `Err` if `conn`'s identity may not
    /// acquire `key` (the words are kept for
    /// [`Engine::not_allowed_reason`]).
    #[cold]
    #[inline(never)]
    fn check_access(&mut self, conn: ConnId, key: &[u8]) -> Result<(), Refusal> {
        let identity = match self.access_of(conn) {
            Some(access) if access.may_lock(key) => return Ok(()),
            Some(access) => access.identity(),
            None => b"-",
        };
        self.not_allowed = format!(
            "not allowed: identity \"{}\" may not lock \"{}\"",
            crate::proto::Quoted(identity),
            crate::proto::Quoted(key)
        );
        Err(Refusal::NotAllowed)
    }

    /// The words of the last [`Refusal::NotAllowed`]: `not allowed: `, the
    /// identity and the key.
    pub fn not_allowed_reason(&self) -> &str {
        &self.not_allowed
    }

    /// Grants the free `lock` to `conn` with `token` (just issued), and
    /// answers it.
    fn grant(&mut self, now: Now, lock: u32, conn: ConnId, lease_ms: u64, token: u64) {
        debug_assert!(self.table.lock(lock).holder.is_none());
        let expires_ms = deadline(now, lease_ms);
        let timer = self.wheel.insert(expires_ms, Timer::Lease(lock));
        let holder = self.grant_holder(conn);
        let l = self.table.lock_mut(lock);
        l.holder = Some(table::Grant {
            token,
            expires_ms,
            timer,
            holder,
        });
        let answer = Answer::Granted {
            key: l.key(),
            token,
        };
        emit(&mut self.conns, &mut self.dirty, conn, answer);
        self.replicate_grant(now, lock);
    }

    /// The lock just became free: it passes to its head waiter in the same
    /// step, or, with nobody waiting, leaves the table.
    ///
    /// With the token space exhausted ([`Refusal::TokensExhausted`]) there
    /// is no token to grant with. This runs inside a release or a tick, not
    /// an acquire, so there is no request to refuse: the head waiter is
    /// answered `T`, as if its wait ran out, and so is every waiter behind
    /// it, in FIFO order (rule 3 holds: each goes through the same path as
    /// a timeout). Every acquire still gets exactly one answer, a `T` is
    /// final (the waiter is gone, never granted), and the lock leaves the
    /// table free. Leaving the waiters queued instead would leave them on a
    /// free lock that nothing ever grants.
    #[inline]
    fn hand_off(&mut self, now: Now, lock: u32) {
        debug_assert!(
            self.table.lock(lock).holder.is_none(),
            "hand-off of a held lock"
        );
        let Some(w) = self.table.head(lock) else {
            self.table.remove_if_idle(lock);
            return;
        };
        debug_assert_eq!(self.table.waiter(w).state, WaiterState::Queued);
        if self.table.waiter(w).kind.is_some() {
            return self.pass_on(now, lock);
        }
        let waiter = self.table.waiter_mut(w);
        let (conn, lease_ms, queued_ms) =
            (waiter.conn, u64::from(waiter.lease_ms), waiter.queued_ms);
        if let Some(timer) = waiter.timer.take() {
            self.wheel.cancel(timer);
        }
        match self.tokens.next(now.unix_ns) {
            Some(token) => {
                self.grant(now, lock, conn, lease_ms, token);
                self.stats.wait_ms.record(now.ms.saturating_sub(queued_ms));
                self.answered(w);
                // After: the head waiter holds the lock, with the newest
                // token, and has left the queue.
                debug_assert!(
                    self.table
                        .lock(lock)
                        .holder
                        .is_some_and(|g| g.token == token && token == self.tokens.highest())
                );
                debug_assert!(self.table.head(lock) != Some(w));
            }
            None => self.time_out_all(lock, w),
        }
    }

    /// [`Engine::hand_off`] without a token: `w`, the head waiter (its wait
    /// timer already cancelled), and every waiter behind it are answered
    /// `T`; the lock leaves the table.
    #[cold]
    #[inline(never)]
    fn time_out_all(&mut self, lock: u32, mut w: u32) {
        loop {
            self.time_out(w);
            let Some(next) = self.table.head(lock) else {
                break;
            };
            w = next;
            if let Some(timer) = self.table.waiter_mut(w).timer.take() {
                self.wheel.cancel(timer);
            }
        }
        self.table.remove_if_idle(lock);
    }

    /// A queued waiter's wait ran out: [`Engine::time_out`], and the lock
    /// leaves the table if that was the last thing keeping it.
    fn wait_ran_out(&mut self, now: Now, w: u32) {
        let lock = self.table.waiter(w).lock;
        self.time_out(w);
        if self.table.lock(lock).members > 0 {
            // Those behind it may be granted now (shared ones behind an
            // exclusive one that gave up).
            return self.pass_on(now, lock);
        }
        self.table.remove_if_idle(lock);
    }

    /// Answers a queued waiter `T`. The `T` goes out now, unless an earlier
    /// acquire of the same key on the same connection is still unanswered
    /// (rule 3): then it is held back until that one is answered. Either way
    /// it has left the queue and will never be granted. The lock stays in
    /// the table even if nothing keeps it any more: the caller removes it.
    fn time_out(&mut self, w: u32) {
        self.stats.timed_out += 1;
        let (conn, lock, kind) = {
            let waiter = self.table.waiter(w);
            (waiter.conn, waiter.lock, waiter.kind)
        };
        if let Some(kind) = kind {
            self.stats.of_kind(kind).timed_out += 1;
        }
        self.table.unqueue(w);
        let mut earlier = self.table.conn_prev(w);
        while earlier != NIL {
            let e = self.table.waiter(earlier);
            if e.lock == lock && e.state == WaiterState::Queued {
                self.table.waiter_mut(earlier).holds_back = true;
                return;
            }
            earlier = self.table.conn_prev(earlier);
        }
        let key = self.table.lock(lock).key();
        emit(
            &mut self.conns,
            &mut self.dirty,
            conn,
            Engine::timed_out_answer(kind, key),
        );
        self.answered(w);
    }

    /// `w` has been answered: send the `T`s it was holding back, then forget
    /// it. Those are the held-back acquires of the same key that follow it on
    /// its connection, up to the next one still queued (which holds back any
    /// after it).
    fn answered(&mut self, w: u32) {
        let waiter = self.table.waiter(w);
        if waiter.holds_back {
            let (conn, lock) = (waiter.conn, waiter.lock);
            let mut later = self.table.conn_next(w);
            while later != NIL {
                let next = self.table.conn_next(later);
                let l = self.table.waiter(later);
                if l.lock == lock {
                    if l.state == WaiterState::Queued {
                        break;
                    }
                    let key = self.table.lock(lock).key();
                    let answer = Engine::timed_out_answer(l.kind, key);
                    emit(&mut self.conns, &mut self.dirty, conn, answer);
                    self.table.finish(later);
                }
                later = next;
            }
        }
        self.table.finish(w);
    }

    // ----- Replication (used by the cluster; see docs/cluster.md) -----

    /// Starts recording replication events (a node with peers). Only an
    /// active engine records: a standby's table follows its active's.
    pub(crate) fn enable_replication(&mut self) {
        self.replication.get_or_insert_with(ReplicationLog::new);
    }

    /// Moves the events recorded since the last call into `into` (cleared
    /// first), in the order the table changed, and keeps `into`'s old
    /// buffers for the next ones: swapping two logs turn after turn
    /// allocates nothing once both have grown.
    pub(crate) fn take_replication(&mut self, into: &mut ReplicationLog) {
        into.clear();
        if let Some(log) = &mut self.replication {
            std::mem::swap(into, log);
        }
    }

    /// Every live grant with lease left at `now`, as a
    /// [`Replication::Granted`]: the body of a snapshot.
    pub fn snapshot(&self, now: Now) -> impl Iterator<Item = Replication<'_>> {
        self.table.locks().filter_map(move |lock| {
            let grant = lock.holder?;
            let remaining_ms = grant.expires_ms.saturating_sub(now.ms);
            (remaining_ms > 0).then(|| Replication::Granted {
                key: lock.key(),
                token: grant.token,
                remaining_ms,
                holder: self.holders.get(grant.holder),
            })
        })
    }

    /// A standby takes a grant replicated by the active: `key` is held with
    /// `token` for `remaining_ms` from now (replacing any grant it had).
    /// Values no node of ours sends are refused, and nothing changes: a
    /// token above [`token::MAX_TOKEN`], more than [`MAX_LEASE_MS`] left,
    /// and a new key when the table holds `max_locks` locks.
    pub(crate) fn apply_grant(
        &mut self,
        now: Now,
        key: &[u8],
        token: u64,
        remaining_ms: u64,
        holder: crate::proto::Holder<'_>,
    ) -> Result<(), GrantRefusal> {
        debug_assert!(
            !self.is_active(),
            "only a standby applies replicated grants"
        );
        if token > token::MAX_TOKEN {
            return Err(GrantRefusal::TokenOutOfRange(token));
        }
        if remaining_ms > MAX_LEASE_MS {
            return Err(GrantRefusal::LeaseOutOfRange(remaining_ms));
        }
        let Some(lock) = self
            .table
            .find_or_insert_within(key, self.max_locks as usize)
        else {
            return Err(GrantRefusal::LockTableFull {
                max_locks: self.max_locks,
            });
        };
        self.tokens.observe(token);
        if !self.merged.is_empty() {
            // The active made a believed grant the key's grant.
            self.forget_believed(lock, token);
        }
        if self.table.lock(lock).members > 0 {
            // The active's word is the newest: its releases of them were
            // lost (a broken peer; ours sends them first).
            self.drop_members(lock);
        }
        // The new entry first: a renewal names the same holder, whose
        // entry must not go in between.
        let holder = self.holders.intern(holder);
        if let Some(old) = self.table.lock_mut(lock).holder.take() {
            self.wheel.cancel(old.timer);
            self.holders.unref(old.holder);
        }
        let expires_ms = now.ms.saturating_add(remaining_ms);
        let timer = self.wheel.insert(expires_ms, Timer::Lease(lock));
        self.table.lock_mut(lock).holder = Some(table::Grant {
            token,
            expires_ms,
            timer,
            holder,
        });
        Ok(())
    }

    /// A standby takes a replicated release (or expiry) of `key`'s grant
    /// with `token`; a grant with another token is left alone.
    pub(crate) fn apply_release(&mut self, now: Now, key: &[u8], token: u64) {
        let Some(lock) = self.table.find(key) else {
            return;
        };
        let holder = &mut self.table.lock_mut(lock).holder;
        if let Some(grant) = holder.filter(|g| g.token == token) {
            *holder = None;
            self.wheel.cancel(grant.timer);
            self.holders.unref(grant.holder);
            if self.merged.is_empty() || !self.promote_believed(now, lock) {
                self.table.remove_if_idle(lock);
            }
        } else if self.table.lock(lock).members > 0 {
            self.release_member(now, lock, token);
        } else if !self.merged.is_empty() {
            self.forget_believed(lock, token);
        }
    }

    /// A standby about to receive a snapshot forgets every grant it had.
    ///
    /// A standby has no waiters: stepping down answered them all, and a
    /// standby answers acquires `M`. Should the cluster call this on a node
    /// that has some, a lock with waiters keeps its holder (a free lock with
    /// waiters would never be granted) and the rest are cleared.
    pub(crate) fn clear_grants(&mut self) {
        debug_assert!(!self.is_active());
        self.clear_believed();
        if self.members.len() > 0 {
            self.clear_members();
        }
        for lock in self.table.lock_ids() {
            if self.table.has_waiters(lock) {
                debug_assert!(false, "waiters on a standby");
                continue;
            }
            if let Some(grant) = self.table.lock_mut(lock).holder.take() {
                self.wheel.cancel(grant.timer);
                self.holders.unref(grant.holder);
            }
            let removed = self.table.remove_if_idle(lock);
            debug_assert!(removed);
        }
    }

    /// Records a token seen elsewhere (a peer's heartbeat, a hand-off), so
    /// that every token issued later is above it.
    pub(crate) fn observe_token(&mut self, token: u64) {
        self.tokens.observe(token);
    }

    /// Starts serving clients with the grants this node has (replicated
    /// ones keep their remaining lease).
    pub(crate) fn become_active(&mut self) {
        self.serving = Serving::Active;
        self.checked = self.identities;
        if let Some(log) = &mut self.replication {
            log.clear();
        }
    }

    /// Appends bytes for `conn` (a peer link) and marks it dirty.
    pub(crate) fn write_to(&mut self, conn: ConnId, bytes: &[u8]) {
        let c = &mut self.conns[conn as usize];
        debug_assert!(c.open);
        c.out.extend_from_slice(bytes);
        if c.dirty != Listed::Link {
            // Listed as a client by a life that ended this turn (or before
            // its first peer line): that entry is skipped.
            c.dirty = Listed::Link;
            self.dirty_links.push(conn);
        }
    }

    /// Records the grant of `lock` for the followers, on an active node
    /// with peers. The recording itself is out of line: the request path of
    /// a node without peers keeps only this check.
    #[inline]
    fn replicate_grant(&mut self, now: Now, lock: u32) {
        if self.replication.is_some() && matches!(self.serving, Serving::Active) {
            self.record_grant(now, lock);
        }
    }

    #[inline]
    fn replicate_release(&mut self, lock: u32, token: u64) {
        if self.replication.is_some() && matches!(self.serving, Serving::Active) {
            self.record_release(lock, token);
        }
    }

    #[inline(never)]
    fn record_grant(&mut self, now: Now, lock: u32) {
        let l = self.table.lock(lock);
        let grant = l.holder.expect("replicating a held lock");
        if let Some(log) = &mut self.replication {
            log.push(Replication::Granted {
                key: l.key(),
                token: grant.token,
                remaining_ms: grant.expires_ms.saturating_sub(now.ms),
                holder: self.holders.get(grant.holder),
            });
        }
    }

    #[inline(never)]
    fn record_release(&mut self, lock: u32, token: u64) {
        if let Some(log) = &mut self.replication {
            log.push(Replication::Released {
                key: self.table.lock(lock).key(),
                token,
            });
        }
    }

    /// What [`Engine::check_invariants`] visits: locks, waiters and
    /// connection slots.
    #[cfg(debug_assertions)]
    pub(crate) fn walk_len(&self) -> usize {
        self.table.len() + self.table.waiter_count() + self.conns.len()
    }

    /// Corrupts the table on purpose: a free lock left in it, which
    /// [`Engine::check_invariants`] finds ("idle lock ... kept"). Only for
    /// the test that proves the walkers run in a server process.
    #[cfg(debug_assertions)]
    pub(crate) fn break_invariant(&mut self) {
        self.table.find_or_insert(b"broken-on-purpose");
    }

    /// Checks the table's lists and the engine's bookkeeping: tests, the
    /// simulator, the fuzzer, and every loop turn of a debug build (the
    /// node runs it after each turn, sampled for a large table).
    pub fn check_invariants(&self) {
        self.table.check_invariants();
        let mut refs = std::collections::HashMap::new();
        for (c, conn) in self.conns.iter().enumerate() {
            if !conn.open {
                assert_eq!(self.table.conn_len(c as ConnId), 0);
                assert!(conn.holder.is_none() && conn.owner.is_none() && conn.addr.is_none());
                assert!(
                    self.access.get(c).is_none_or(Option::is_none),
                    "a closed connection kept its identity"
                );
            }
            if let Some(h) = conn.holder {
                *refs.entry(h).or_insert(0) += 1;
            }
        }
        for lock in self.table.locks() {
            if let Some(g) = lock.holder.filter(|g| g.holder != NIL) {
                *refs.entry(g.holder).or_insert(0) += 1;
            }
        }
        self.check_believed(&mut refs);
        self.check_members(&mut refs);
        self.holders.check_refs(&refs);
    }
}

/// When a lease or wait of `duration_ms` that starts now runs out. One ms is
/// added because `now.ms` is a floor: the real time may be up to 1 ms later,
/// and a lease or wait must never end before its full length.
fn deadline(now: Now, duration_ms: u64) -> u64 {
    now.ms.saturating_add(duration_ms).saturating_add(1)
}

/// The `K` line of `W` and `Q`: the lock's fields and its holder's.
/// `shown` is the grant it shows ([`Engine::shown_grant`]).
fn lock_who<'a>(
    table: &'a Table,
    holders: &'a Holders,
    now: Now,
    lock: &'a table::Lock,
    shown: Option<(u64, u64, u32)>,
) -> Answer<'a> {
    let (token, lease_ms, held_ms, holder) = match shown {
        Some((token, expires_ms, holder)) => (
            token,
            expires_ms.saturating_sub(now.ms),
            // A token is the wall clock's ns at its grant (unless the token
            // clock ran ahead of it): no field of its own.
            now.unix_ns.saturating_sub(token) / 1_000_000,
            holders.get(holder),
        ),
        None => (0, 0, 0, crate::proto::Holder::default()),
    };
    Answer::LockWho {
        key: lock.key(),
        token,
        lease_ms,
        waiters: table.queue_len(lock, LIST_WAITERS_CAP),
        held_ms,
        holder,
    }
}

/// Which of the list requests a [`Engine::list`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListForm {
    /// `L`: the lock's grant.
    Plain,
    /// `W`: with its holder.
    Who,
    /// `V`: with its holder and how the key is held.
    Kinds,
}

/// The `K` line of `V`: `who` (a [`lock_who`] line) with how `lock` is
/// held: exclusively (by its holder), shared or as a semaphore (by its
/// members), or not at all.
fn with_kind<'a>(who: Answer<'a>, lock: &table::Lock) -> Answer<'a> {
    let Answer::LockWho {
        key,
        token,
        lease_ms,
        waiters,
        held_ms,
        holder,
    } = who
    else {
        unreachable!("lock_who answers a LockWho")
    };
    let (held, limit, holders) = if lock.holder.is_some() {
        debug_assert_eq!(lock.members, 0);
        (Held::Exclusive, 0, 1)
    } else if lock.members == 0 {
        (Held::Free, 0, 0)
    } else if lock.limit > 0 {
        debug_assert!(lock.members <= lock.limit);
        (Held::Semaphore, lock.limit, lock.members)
    } else {
        (Held::Shared, 0, lock.members)
    };
    Answer::LockKinds {
        key,
        token,
        lease_ms,
        waiters,
        held_ms,
        holder,
        held,
        limit,
        holders: u64::from(holders),
    }
}

/// Marks `conn` dirty after bytes were appended to its output directly.
fn emit_bytes(conns: &mut [Conn], dirty: &mut Vec<ConnId>, conn: ConnId) {
    let c = &mut conns[conn as usize];
    if c.dirty != Listed::Client {
        c.dirty = Listed::Client;
        dirty.push(conn);
    }
}

/// Appends an answer to a connection's output and marks it dirty.
#[inline]
fn emit(conns: &mut [Conn], dirty: &mut Vec<ConnId>, conn: ConnId, answer: Answer<'_>) {
    let c = &mut conns[conn as usize];
    debug_assert!(c.open, "answer for closed connection {conn}");
    answer.encode(&mut c.out);
    if c.dirty != Listed::Client {
        // Listed as a link by a life that ended this turn: that entry is
        // skipped.
        c.dirty = Listed::Client;
        dirty.push(conn);
    }
}

#[cfg(test)]
mod multi_tests;
#[cfg(test)]
mod tests;
