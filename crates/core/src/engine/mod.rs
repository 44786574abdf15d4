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
//! 4. [`Engine::next_deadline`] to know how long it may sleep.
//!
//! The engine holds no output either. Every method that may answer a
//! connection takes the [`Outbox`](crate::outbox::Outbox) it writes into: the node owns it and
//! lends it to the engine and to the cluster in turn (a release hands the
//! lock to a waiter on another connection, so one request can answer
//! several connections). The loop learns from the outbox which connections
//! have answers waiting and sends them. The same engine runs under
//! io_uring, under epoll and inside tests with a fake clock.

mod conns;
mod handoff;
mod holders;
mod ids;
mod invariants;
mod list;
pub mod merge;
mod multi;
mod replicated;
pub mod replication;
mod request;
pub mod stats;
pub mod table;
pub mod token;
pub mod wheel;

use std::sync::Arc;

use crate::access::Access;
pub use merge::Merged;
pub use replication::Replication;
pub(crate) use replication::{LineEncoder, ReplicationLog};
use stats::EngineStats;
use table::{HolderId, Holders, LockId, Table, WaiterId};
use token::TokenClock;
use wheel::Wheel;

pub use crate::outbox::ConnId;

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

/// The highest `--max-locks`: 2^31. Locks and timers are found by 32-bit
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

/// What the engine's timers are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// The lease of the lock's holder runs out.
    Lease(LockId),
    /// The waiter's wait runs out.
    Wait(WaiterId),
    /// The lease of a shared grant or permit runs out (a slot of
    /// [`multi::Members`]).
    Member(ids::MemberId),
}

/// Per-connection state the engine keeps.
#[derive(Default)]
struct Conn {
    open: bool,
    /// Its holder entry, which its grants name: made at its first grant,
    /// dropped when its owner label changes or it closes.
    holder: Option<HolderId>,
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
    merged: std::collections::HashMap<LockId, Vec<merge::Believed>>,
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
    pass_pending: Vec<LockId>,
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

    /// Node `index` of a cluster of `nodes` issues only tokens that are
    /// `index` modulo `nodes`, so that no two nodes issue the same one.
    pub(crate) fn share_tokens(&mut self, index: usize, nodes: usize) {
        self.tokens.share(index, nodes);
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
        if let Some(c) = self.conns.get_mut(conn.index()) {
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
        let Some(c) = self.conns.get_mut(conn.index()) else {
            return;
        };
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        let i = conn.index();
        if self.access.len() <= i {
            self.access.resize(i + 1, None);
        }
        self.access[i] = Some(access);
    }

    /// `conn`'s identity and rules, on a node with identities.
    fn access_of(&self, conn: ConnId) -> Option<&Access> {
        self.access.get(conn.index()).and_then(|a| a.as_deref())
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

    /// The earliest monotonic ms at which [`Engine::tick`] has work, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        if !self.pass_pending.is_empty() {
            return Some(0);
        }
        self.wheel.next_deadline()
    }
}

/// When a lease or wait of `duration_ms` that starts now runs out. One ms is
/// added because `now.ms` is a floor: the real time may be up to 1 ms later,
/// and a lease or wait must never end before its full length.
fn deadline(now: Now, duration_ms: u64) -> u64 {
    now.ms.saturating_add(duration_ms).saturating_add(1)
}

#[cfg(test)]
mod tests;
