//! The lock table: key → holder + an intrusive FIFO of waiters.
//!
//! Locks and waiters live in slabs and point at each other by index
//! ([`LockId`], [`WaiterId`]: a `u32` each), so
//! the lists cost no allocation per waiter and every list operation is O(1):
//!
//! - each lock has a FIFO of its *queued* waiters (`q_prev`/`q_next`), granted
//!   from the head;
//! - each connection has a list of all its unanswered acquires in arrival
//!   order (`c_prev`/`c_next`), withdrawn at once when it closes. It also holds
//!   *timed-out* waiters whose `T` is held back (matching rule 3): they left
//!   their lock's FIFO but keep their place in the connection's list until the
//!   earlier acquire of the same key is answered.
//!
//! Keys are interned: one copy per lock, inline for keys of up to
//! `INLINE_KEY` bytes, found through a hash index of lock indices. A lock
//! with no holder, no waiter and no held-back `T` is removed at once, so the
//! table holds only live locks.
//!
//! Nothing here grows in one big step while it serves, so that the loop
//! never stops for long as the table fills (docs/architecture.md has the
//! numbers):
//!
//! - The slabs are sized when the table is made ([`Table::with_capacity`]:
//!   the engine asks for `--max-locks` locks). That takes address space,
//!   not memory: a page is touched when a lock is first stored in it. A
//!   slab that never outgrows its room never reallocates, and a slab that
//!   reallocates copies everything it holds in one go (at 2^20 locks, one
//!   loop turn of 165–495 ms).
//! - The index is `SHARDS` small hash tables, the key's hash choosing
//!   one. A hash table grows by rehashing everything it holds; a shard holds
//!   1/1024th of the keys. Keys spread evenly, so the shards would all fill
//!   up, and rehash, at about the same moment: each shard therefore grows
//!   early, at its own fill level between 1/2 and 1 of its capacity (the
//!   shard of rank `r`, a permutation of its number, at `1/2 + r/2048`),
//!   which spreads their rehashes evenly over every doubling of the table.
//!
//! The table knows nothing of time, tokens or answers; the engine does.

use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::HashTable;
use slab::Slab;

pub use super::holders::Holders;
pub use super::ids::{HolderId, LockId, WaiterId};
use super::wheel::TimerId;
use super::{ConnId, reservable};

/// Shards of the key index.
pub(crate) const SHARDS: usize = 1 << SHARD_BITS;
const SHARD_BITS: u32 = 10;

/// Waiters the table reserves room for when it is made: the waiting
/// acquires of 256 connections at their limit of 4096 each. Past that the
/// waiter slab grows by doubling, which copies it.
pub(crate) const RESERVED_WAITERS: usize = 1 << 20;

/// The shard of a key's hash: bits 32..42. A shard's own table uses the
/// low bits (the bucket) and the top seven (the control byte).
#[inline]
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize & (SHARDS - 1)
}

/// One shard of the key index.
struct Shard {
    index: HashTable<LockId>,
    /// Entries at which this shard grows, early (see the module docs).
    grow_at: usize,
}

impl Shard {
    /// Makes room for one more entry: doubles the shard if it reached its
    /// own fill level, or, if tombstones of removed entries left it no room
    /// before that, does what hashbrown would do inside the insert (clean
    /// up in place, or double). Then sets the next level. Rehashing reads
    /// each entry's hash from its lock.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, shard: usize, locks: &Slab<Lock>) {
        let (len, capacity) = (self.index.len(), self.index.capacity());
        let additional = if len >= self.grow_at {
            capacity - len + 1
        } else {
            1
        };
        self.index.reserve(additional, |&i| locks[i.index()].hash);
        let capacity = self.index.capacity();
        // The levels go by the shard's number bit-reversed, so that shards
        // with near numbers (which a test, say, may fill in order) have
        // levels far apart.
        let rank = shard.reverse_bits() >> (usize::BITS - SHARD_BITS);
        self.grow_at = capacity / 2 + capacity * rank / (2 * SHARDS);
    }
}

/// Keys up to this length are stored inside the lock, without allocation.
pub(crate) const INLINE_KEY: usize = 30;

/// A key's bytes, inline when short.
enum KeyBuf {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

const _: () = assert!(std::mem::size_of::<KeyBuf>() == 32);

impl KeyBuf {
    fn new(key: &[u8]) -> KeyBuf {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            KeyBuf::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            KeyBuf::Heap(key.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBuf::Heap(bytes) => bytes,
        }
    }
}

/// A live grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    /// Monotonic ms at which the lease runs out.
    pub expires_ms: u64,
    /// The lease timer; it fires at `expires_ms`.
    pub timer: TimerId,
    /// Who holds it: an entry of [`Holders`] that this grant counts a
    /// reference to, or [`HolderId::NIL`] (not known: replicated by an
    /// older node).
    pub holder: HolderId,
}

/// A grant costs no more with its holder: the index fits where the
/// timer's padding was.
const _: () = assert!(std::mem::size_of::<Grant>() == 24);
const _: () = assert!(std::mem::size_of::<Lock>() == 96);

/// One key's state.
pub struct Lock {
    key: KeyBuf,
    hash: u64,
    pub holder: Option<Grant>,
    head: WaiterId,
    tail: WaiterId,
    /// Timed-out waiters of this key whose `T` is held back.
    held_back: u32,
    /// Waiters in the FIFO (`head` to `tail`), so that `L` need not walk it.
    queued: u32,
    /// Shared holders or permits holding the key (the engine keeps their
    /// grants); a key with any has no exclusive `holder`.
    pub(crate) members: u32,
    /// 0: a lock (exclusive and shared acquires); else the key is a
    /// semaphore of this many permits. Meaningful while `members` > 0, and
    /// 0 whenever `members` is.
    pub(crate) limit: u32,
}

impl Lock {
    pub fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.head.is_nil() && self.held_back == 0 && self.members == 0
    }

    /// True if the key has a holder of any kind.
    pub(crate) fn is_held(&self) -> bool {
        self.holder.is_some() || self.members > 0
    }
}

/// Where a waiter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaiterState {
    /// In its lock's FIFO, waiting for a grant.
    Queued,
    /// Its wait ran out while an earlier acquire of the same key on the same
    /// connection was unanswered: out of the FIFO, its `T` held back.
    HeldBack,
}

/// One unanswered acquire.
pub struct Waiter {
    pub conn: ConnId,
    pub lock: LockId,
    /// At most [`crate::proto::MAX_DURATION_MS`], which fits.
    pub lease_ms: u32,
    /// Monotonic ms of the acquire: for the wait histogram.
    pub(crate) queued_ms: u64,
    /// The wait timer, if the acquire has a wait limit and is queued.
    pub timer: Option<TimerId>,
    pub(crate) state: WaiterState,
    /// What it waits for: `None` an exclusive grant (`A`), else a shared
    /// grant (`G`) or a permit (`C`).
    pub(crate) kind: Option<crate::proto::Kind>,
    /// A later acquire of the same key on the same connection is held back
    /// until this one is answered.
    pub(crate) holds_back: bool,
    q_prev: WaiterId,
    q_next: WaiterId,
    c_prev: WaiterId,
    c_next: WaiterId,
}

/// A connection's unanswered acquires, oldest first.
#[derive(Debug, Clone, Copy)]
struct ConnList {
    head: WaiterId,
    tail: WaiterId,
    len: u32,
}

impl ConnList {
    const EMPTY: ConnList = ConnList {
        head: WaiterId::NIL,
        tail: WaiterId::NIL,
        len: 0,
    };
}

/// See the module docs.
pub struct Table {
    shards: Box<[Shard; SHARDS]>,
    hasher: foldhash::fast::RandomState,
    locks: Slab<Lock>,
    waiters: Slab<Waiter>,
    conns: Vec<ConnList>,
    /// One past the highest slot a lock has had since the table was last
    /// empty: the bound of [`Table::lock_at`]'s indices. Kept here because
    /// the slab can only find its highest live slot by walking back over
    /// every freed one.
    slot_bound: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

impl Table {
    /// A table with room for 65536 locks (see [`Table::with_capacity`]).
    pub fn new() -> Table {
        Table::with_capacity(1 << 16)
    }

    /// A table with room reserved for `locks` locks and
    /// `RESERVED_WAITERS` waiters, as much of it as the system grants
    /// (`reservable`). Memory is taken as they come.
    pub fn with_capacity(locks: usize) -> Table {
        let shards: Vec<Shard> = (0..SHARDS)
            .map(|_| Shard {
                index: HashTable::new(),
                grow_at: 0,
            })
            .collect();
        let Ok(shards) = shards.into_boxed_slice().try_into() else {
            unreachable!("{SHARDS} shards made");
        };
        Table {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            locks: Slab::with_capacity(reservable::<Lock>(locks)),
            waiters: Slab::with_capacity(reservable::<Waiter>(RESERVED_WAITERS)),
            conns: Vec::new(),
            slot_bound: 0,
        }
    }

    /// Number of live locks (held, waited for, or with a held-back `T`).
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// Number of unanswered acquires in the table, all connections.
    pub fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    /// The hash of `key` in the index: `hasher.hash_one(key)`, written out
    /// so that it is inlined where the table looks a key up (called out of
    /// line, it cost the call and a second pass over its arguments).
    #[inline(always)]
    #[expect(
        clippy::manual_hash_one,
        reason = "hash_one is the call this keeps from being out of line"
    )]
    fn hash(&self, key: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        key.hash(&mut state);
        state.finish()
    }

    /// The lock of `key`, if it is live.
    #[inline]
    pub fn find(&self, key: &[u8]) -> Option<LockId> {
        let hash = self.hash(key);
        let locks = &self.locks;
        self.shards[shard_of(hash)]
            .index
            .find(hash, |&i| locks[i.index()].key() == key)
            .copied()
    }

    /// The lock of `key`, created free if it is not live.
    #[inline]
    pub fn find_or_insert(&mut self, key: &[u8]) -> LockId {
        match self.find_or_insert_within(key, usize::MAX) {
            Some(lock) => lock,
            None => unreachable!("no limit"),
        }
    }

    /// The lock of `key`, created free if it is not live and the table
    /// holds fewer than `max_len` locks; `None` if the table is full.
    #[inline]
    pub(crate) fn find_or_insert_within(&mut self, key: &[u8], max_len: usize) -> Option<LockId> {
        let hash = self.hash(key);
        let s = shard_of(hash);
        let shard = &mut self.shards[s];
        let locks = &self.locks;
        if let Some(&i) = shard.index.find(hash, |&i| locks[i.index()].key() == key) {
            return Some(i);
        }
        if locks.len() >= max_len {
            return None;
        }
        if shard.index.len() >= shard.grow_at || shard.index.len() == shard.index.capacity() {
            shard.grow(s, locks);
        }
        let i = self.locks.insert(Lock {
            key: KeyBuf::new(key),
            hash,
            holder: None,
            head: WaiterId::NIL,
            tail: WaiterId::NIL,
            held_back: 0,
            queued: 0,
            members: 0,
            limit: 0,
        });
        self.slot_bound = self.slot_bound.max(i + 1);
        // The engine keeps the table within `MAX_LOCKS_LIMIT` (2^31).
        let i = LockId::from_index(i);
        let locks = &self.locks;
        shard
            .index
            .insert_unique(hash, i, |&j| locks[j.index()].hash);
        Some(i)
    }

    /// True if `lock` is a live lock's index.
    pub(crate) fn is_live(&self, lock: LockId) -> bool {
        self.locks.contains(lock.index())
    }

    /// Locks the table has room reserved for (see [`Table::with_capacity`]).
    pub fn reserved_locks(&self) -> usize {
        self.locks.capacity()
    }

    /// Removes `lock` if nothing refers to it any more. Returns true if
    /// removed: the index is then invalid.
    #[inline(always)]
    pub fn remove_if_idle(&mut self, lock: LockId) -> bool {
        let l = &self.locks[lock.index()];
        if !l.is_idle() {
            return false;
        }
        let hash = l.hash;
        match self.shards[shard_of(hash)]
            .index
            .find_entry(hash, |&i| i == lock)
        {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("live lock {lock} missing from the index"),
        }
        self.locks.remove(lock.index());
        if self.locks.is_empty() {
            self.slot_bound = 0;
        }
        true
    }

    /// Every live lock, in no particular order.
    pub fn locks(&self) -> impl Iterator<Item = &Lock> {
        self.locks.iter().map(|(_, lock)| lock)
    }

    /// One past the highest slot a lock has had since the table was last
    /// empty (0: empty): the bound of [`Table::lock_at`]'s indices. O(1):
    /// slots above the highest live one may be free, which a listing skips.
    pub(crate) fn slot_bound(&self) -> usize {
        self.slot_bound
    }

    /// The live lock in slot `i`, if any (for listing the table a page at
    /// a time: slots are stable while a lock lives).
    pub(crate) fn lock_at(&self, i: usize) -> Option<&Lock> {
        self.locks.get(i)
    }

    /// How many acquires wait in the queue of `lock`, up to `cap`. O(1).
    pub(crate) fn queue_len(&self, lock: &Lock, cap: u64) -> u64 {
        u64::from(lock.queued).min(cap)
    }

    /// The indices of every live lock.
    pub(crate) fn lock_ids(&self) -> Vec<LockId> {
        self.locks
            .iter()
            .map(|(i, _)| LockId::from_index(i))
            .collect()
    }

    pub fn lock(&self, lock: LockId) -> &Lock {
        &self.locks[lock.index()]
    }

    pub fn lock_mut(&mut self, lock: LockId) -> &mut Lock {
        &mut self.locks[lock.index()]
    }

    pub(crate) fn waiter(&self, waiter: WaiterId) -> &Waiter {
        &self.waiters[waiter.index()]
    }

    pub(crate) fn waiter_mut(&mut self, waiter: WaiterId) -> &mut Waiter {
        &mut self.waiters[waiter.index()]
    }

    /// Unanswered acquires of `conn` (queued and held back).
    pub(crate) fn conn_len(&self, conn: ConnId) -> u32 {
        self.conns.get(conn.index()).map_or(0, |c| c.len)
    }

    /// The oldest unanswered acquire of `conn`, or [`WaiterId::NIL`].
    pub(crate) fn conn_first(&self, conn: ConnId) -> WaiterId {
        self.conns
            .get(conn.index())
            .map_or(WaiterId::NIL, |c| c.head)
    }

    /// The next younger acquire on the same connection, or
    /// [`WaiterId::NIL`].
    pub(crate) fn conn_next(&self, waiter: WaiterId) -> WaiterId {
        self.waiters[waiter.index()].c_next
    }

    /// The next older acquire on the same connection, or [`WaiterId::NIL`].
    pub(crate) fn conn_prev(&self, waiter: WaiterId) -> WaiterId {
        self.waiters[waiter.index()].c_prev
    }

    /// True if `lock` has queued waiters or held-back `T`s.
    pub(crate) fn has_waiters(&self, lock: LockId) -> bool {
        let l = &self.locks[lock.index()];
        !l.head.is_nil() || l.held_back > 0
    }

    /// The waiter queued right after `waiter` on its lock, or `None`.
    pub fn queue_next(&self, waiter: WaiterId) -> Option<WaiterId> {
        Some(self.waiters[waiter.index()].q_next).filter(|w| !w.is_nil())
    }

    /// The first queued waiter of `lock`, or `None`.
    pub fn head(&self, lock: LockId) -> Option<WaiterId> {
        Some(self.locks[lock.index()].head).filter(|w| !w.is_nil())
    }

    /// Queues a new waiter at the tail of `lock`'s FIFO and of `conn`'s list.
    pub fn enqueue(
        &mut self,
        lock: LockId,
        conn: ConnId,
        lease_ms: u64,
        queued_ms: u64,
    ) -> WaiterId {
        self.enqueue_kind(lock, conn, lease_ms, queued_ms, None)
    }

    /// [`Table::enqueue`] of an acquire of `kind` (`None`: exclusive).
    #[inline]
    pub(crate) fn enqueue_kind(
        &mut self,
        lock: LockId,
        conn: ConnId,
        lease_ms: u64,
        queued_ms: u64,
        kind: Option<crate::proto::Kind>,
    ) -> WaiterId {
        if self.conns.len() <= conn.index() {
            self.conns.resize(conn.index() + 1, ConnList::EMPTY);
        }
        let list = self.conns[conn.index()];
        let l = &self.locks[lock.index()];
        debug_assert!(l.is_held(), "a free lock is granted, not waited for");
        let w = self.waiters.insert(Waiter {
            conn,
            lock,
            lease_ms: u32::try_from(lease_ms).unwrap_or(u32::MAX),
            queued_ms,
            timer: None,
            state: WaiterState::Queued,
            kind,
            holds_back: false,
            q_prev: l.tail,
            q_next: WaiterId::NIL,
            c_prev: list.tail,
            c_next: WaiterId::NIL,
        });
        let w = WaiterId::from_index(w);
        match l.tail {
            WaiterId::NIL => self.locks[lock.index()].head = w,
            tail => self.waiters[tail.index()].q_next = w,
        }
        let l = &mut self.locks[lock.index()];
        l.tail = w;
        l.queued += 1;
        match list.tail {
            WaiterId::NIL => self.conns[conn.index()].head = w,
            tail => self.waiters[tail.index()].c_next = w,
        }
        let list = &mut self.conns[conn.index()];
        list.tail = w;
        list.len += 1;
        w
    }

    /// Takes a queued waiter out of its lock's FIFO, marking it held back: it
    /// stays in its connection's list until [`Table::finish`].
    pub(crate) fn unqueue(&mut self, waiter: WaiterId) {
        let (lock, prev, next) = {
            let w = &mut self.waiters[waiter.index()];
            debug_assert_eq!(w.state, WaiterState::Queued);
            w.state = WaiterState::HeldBack;
            let links = (w.lock, w.q_prev, w.q_next);
            w.q_prev = WaiterId::NIL;
            w.q_next = WaiterId::NIL;
            links
        };
        match prev {
            WaiterId::NIL => self.locks[lock.index()].head = next,
            p => self.waiters[p.index()].q_next = next,
        }
        match next {
            WaiterId::NIL => self.locks[lock.index()].tail = prev,
            n => self.waiters[n.index()].q_prev = prev,
        }
        let l = &mut self.locks[lock.index()];
        l.held_back += 1;
        l.queued -= 1;
    }

    /// Forgets an answered (or withdrawn) waiter: out of its lock's FIFO if
    /// still queued, out of its connection's list, slot freed. The lock may
    /// now be idle: the caller decides when to [`Table::remove_if_idle`].
    pub fn finish(&mut self, waiter: WaiterId) -> Waiter {
        if self.waiters[waiter.index()].state == WaiterState::Queued {
            self.unqueue(waiter);
        }
        let w = self.waiters.remove(waiter.index());
        self.locks[w.lock.index()].held_back -= 1;
        match w.c_prev {
            WaiterId::NIL => self.conns[w.conn.index()].head = w.c_next,
            p => self.waiters[p.index()].c_next = w.c_next,
        }
        match w.c_next {
            WaiterId::NIL => self.conns[w.conn.index()].tail = w.c_prev,
            n => self.waiters[n.index()].c_prev = w.c_prev,
        }
        self.conns[w.conn.index()].len -= 1;
        w
    }

    /// The length of `lock`'s FIFO, walked (for [`Table::check_invariants`]).
    fn queue_walk(&self, lock: &Lock) -> usize {
        let mut n = 0;
        let mut w = lock.head;
        while !w.is_nil() {
            n += 1;
            w = self.waiters[w.index()].q_next;
        }
        n
    }

    /// Checks every list against the slabs. For tests: O(size of the table).
    pub fn check_invariants(&self) {
        let mut queued = 0;
        let mut held_back = 0;
        for (i, lock) in &self.locks {
            assert!(!lock.is_idle(), "idle lock {i} kept");
            assert!(
                lock.holder.is_none() || lock.members == 0,
                "lock {i} held exclusively and by {} members",
                lock.members
            );
            // Past the limit only after a merge (`Engine::merge_member`);
            // a grant never takes it there (`Engine::grant_member`).
            assert!(
                lock.limit == 0 || lock.members > 0,
                "lock {i}: {} members of a limit of {}",
                lock.members,
                lock.limit
            );
            assert_eq!(self.find(lock.key()), Some(LockId::from_index(i)));
            let mut prev = WaiterId::NIL;
            let mut w = lock.head;
            while !w.is_nil() {
                let waiter = &self.waiters[w.index()];
                assert_eq!(waiter.lock, LockId::from_index(i));
                assert_eq!(waiter.state, WaiterState::Queued);
                assert_eq!(waiter.q_prev, prev);
                assert!(lock.is_held(), "waiters queued on a free lock");
                queued += 1;
                prev = w;
                w = waiter.q_next;
            }
            assert_eq!(lock.tail, prev);
            assert_eq!(lock.queued as usize, self.queue_walk(lock));
            held_back += lock.held_back as usize;
        }
        let mut listed = 0;
        for (c, list) in self.conns.iter().enumerate() {
            let mut prev = WaiterId::NIL;
            let mut w = list.head;
            let mut len = 0;
            while !w.is_nil() {
                let waiter = &self.waiters[w.index()];
                assert_eq!(waiter.conn.index(), c);
                assert_eq!(waiter.c_prev, prev);
                len += 1;
                prev = w;
                w = waiter.c_next;
            }
            assert_eq!(list.tail, prev);
            assert_eq!(list.len, len);
            listed += len as usize;
        }
        assert_eq!(listed, self.waiters.len());
        assert_eq!(queued + held_back, self.waiters.len());
        // Every lock was found above through its own shard; with the
        // counts equal, the shards hold nothing else.
        let indexed: usize = self.shards.iter().map(|s| s.index.len()).sum();
        assert_eq!(indexed, self.locks.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Vec<u8> {
        format!("key-{i:08}").into_bytes()
    }

    fn capacities(table: &Table) -> Vec<usize> {
        table.shards.iter().map(|s| s.index.capacity()).collect()
    }

    /// Keys that spread over the shards perfectly evenly (the `k`-th goes
    /// to shard `k % SHARDS`): the worst case for growth, since every shard
    /// reaches the same load at the same moment. Each shard still grows at
    /// its own level, so the rehashes are spread over the inserts.
    #[test]
    fn shards_grow_one_at_a_time_even_when_they_fill_in_step() {
        const PER_SHARD: usize = 300;
        let mut table = Table::with_capacity(SHARDS * PER_SHARD);
        let mut by_shard: Vec<Vec<Vec<u8>>> = vec![Vec::new(); SHARDS];
        let mut i = 0;
        while by_shard.iter().any(|k| k.len() < PER_SHARD) {
            let k = key(i);
            by_shard[shard_of(table.hash(&k))].push(k);
            i += 1;
        }
        let mut before = capacities(&table);
        let mut worst = (0, 0);
        for round in 0..PER_SHARD {
            for (s, keys) in by_shard.iter().enumerate() {
                table.find_or_insert(&keys[round]);
                if s % 64 == 63 {
                    let now = capacities(&table);
                    let growths = before.iter().zip(&now).filter(|(b, n)| b != n).count();
                    // The first growths (tables of 3, 7 and 14 entries)
                    // are too small to matter, or to stagger.
                    if round >= 30 {
                        worst = worst.max((growths, round));
                    }
                    before = now;
                }
            }
        }
        // About one shard in 1/1024th of a doubling; in step, all 64 of a
        // window would grow together.
        assert!(
            worst.0 <= 4,
            "{} shards grew within 64 inserts (round {})",
            worst.0,
            worst.1
        );
        table.check_invariants_index();
    }

    #[test]
    fn a_shard_full_of_removed_entries_is_cleaned_or_grown_and_stays_bounded() {
        // Churn: keys come and go while the table holds about 2000 of them,
        // so removals leave tombstones in the shards' tables.
        let mut table = Table::with_capacity(4096);
        for i in 0..300_000 {
            let lock = table.find_or_insert(&key(i));
            table.lock_mut(lock).held_back = 1; // not idle
            if i >= 2_000 {
                let old = table.find(&key(i - 2_000)).expect("live");
                table.lock_mut(old).held_back = 0;
                assert!(table.remove_if_idle(old));
            }
        }
        assert_eq!(table.len(), 2_000);
        table.check_invariants_index();
        let total: usize = capacities(&table).iter().sum();
        assert!(
            total < 20 * 2_000,
            "the index grew to {total} for 2000 keys"
        );
    }

    #[test]
    fn the_room_asked_for_is_reserved_when_the_system_grants_it() {
        let table = Table::with_capacity(100_000);
        assert!(table.locks.capacity() >= 100_000);
        assert!(table.waiters.capacity() >= RESERVED_WAITERS);
        // More than any machine has: cut down, not a failure.
        let n = reservable::<[u8; 1024]>(usize::MAX / 2048);
        assert!(n > 0 && n < usize::MAX / 2048);
    }

    impl Table {
        /// The index part of `check_invariants`, without the lists.
        fn check_invariants_index(&self) {
            let indexed: usize = self.shards.iter().map(|s| s.index.len()).sum();
            assert_eq!(indexed, self.locks.len());
            for (i, lock) in &self.locks {
                assert_eq!(self.find(lock.key()), Some(LockId::from_index(i)));
            }
        }
    }
}
