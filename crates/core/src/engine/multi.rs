//! Shared grants and permits: the keys that several hold at once.
//!
//! A key acquired with `A` and `G` is a read/write lock; a key acquired
//! with `C` is a counting semaphore (docs/protocol.md, "`G` and `C`, shared
//! locks and semaphores"). Both keep the one FIFO of the table: a waiter
//! records what it waits for ([`table::Waiter::kind`]), and
//! [`Engine::pass_on`] grants from the head every acquire that can be
//! granted, in order: an exclusive one alone, shared ones in a batch up to
//! the first exclusive one, permits up to the limit.
//!
//! The exclusive holder of a key stays in its lock ([`table::Lock::holder`]),
//! so that the exclusive path is what it was. Every shared holder and every
//! permit is a [`Member`] of its lock: a grant of its own, with its own
//! token, lease timer and holder entry, found by `(lock, token)`. A lock
//! counts its members ([`table::Lock::members`]) and keeps its limit.
//!
//! On a node with peers the active records every member's grant, renewal
//! and end in the replication log ([`super::Replication::Member`], and the
//! `Released` of its token); a standby applies them into its own members
//! ([`Engine::apply_member`]), timers and all, so that a failover or a
//! hand-off keeps them. An active one of whose followers speaks a peer
//! protocol too old for them refuses `G` and `C`
//! ([`Refusal::FollowerTooOld`]). At a heal, the loser's members join
//! the winner's ([`Engine::merge_member`], [`Engine::merge_over_members`]):
//! a key may then hold more permits than its limit (no new one is granted
//! until it is back under it), and an exclusive grant and members of one
//! key become one grant with the others believed beside it
//! ([`super::merge`]).

use super::{
    ConnId, Engine, MAX_WAITING_PER_CONN, Now, Refusal, Timer, deadline,
    ids::MemberId,
    table::{HolderId, LockId},
    wheel::TimerId,
};
use crate::outbox::Outbox;
use crate::proto::{Answer, Kind};

mod replication;

/// One shared grant or permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) lock: LockId,
    pub(crate) token: u64,
    /// Monotonic ms at which the lease runs out.
    pub(crate) expires_ms: u64,
    pub(crate) timer: TimerId,
    /// A [`table::Holders`] entry this grant counts a reference to.
    pub(crate) holder: HolderId,
    /// A permit of a semaphore (its lock has a limit), not a shared grant.
    pub(crate) permit: bool,
}

/// The members of the engine: a slab (timers name a slot) and an index by
/// `(lock, token)`, in token order within a lock (the newest last).
///
/// `permits` counts the members that are permits of a semaphore
/// ([`Member::permit`]), the others are shared grants.
#[derive(Default)]
pub(crate) struct Members {
    slab: slab::Slab<Member>,
    by_lock: std::collections::BTreeMap<(LockId, u64), MemberId>,
    permits: usize,
}

impl Members {
    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    fn find(&self, lock: LockId, token: u64) -> Option<MemberId> {
        self.by_lock.get(&(lock, token)).copied()
    }

    /// The holder entry of `lock`'s member with `token`, if there is one.
    pub(crate) fn holder_of(&self, lock: LockId, token: u64) -> Option<HolderId> {
        self.find(lock, token).map(|m| self.get(m).holder)
    }

    fn get(&self, m: MemberId) -> &Member {
        &self.slab[m.index()]
    }

    #[inline]
    fn insert(&mut self, member: Member) -> MemberId {
        let (lock, token) = (member.lock, member.token);
        let m = MemberId::from_index(self.slab.insert(member));
        self.permits += usize::from(member.permit);
        let old = self.by_lock.insert((lock, token), m);
        assert!(old.is_none(), "token {token} granted twice on lock {lock}");
        m
    }

    fn remove(&mut self, m: MemberId) -> Member {
        let member = self.slab.remove(m.index());
        self.permits -= usize::from(member.permit);
        let removed = self.by_lock.remove(&(member.lock, member.token));
        debug_assert_eq!(removed, Some(m));
        member
    }

    /// The members of `lock`, oldest grant first.
    pub(crate) fn of(&self, lock: LockId) -> impl DoubleEndedIterator<Item = &Member> + '_ {
        self.by_lock
            .range((lock, 0)..=(lock, u64::MAX))
            .map(|(_, &m)| &self.slab[m.index()])
    }

    /// The newest member of `lock` (the highest token), if any.
    pub(crate) fn newest(&self, lock: LockId) -> Option<&Member> {
        self.of(lock).next_back()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (MemberId, &Member)> + '_ {
        self.slab.iter().map(|(i, m)| (MemberId::from_index(i), m))
    }
}

impl Engine {
    /// Shared grants and permits held, all keys.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Shared grants held, all keys.
    pub fn shared_count(&self) -> usize {
        self.members.len() - self.members.permits
    }

    /// Permits of semaphores held, all keys.
    pub fn permit_count(&self) -> usize {
        self.members.permits
    }

    /// `G` or `C`.
    #[cold]
    #[inline(never)]
    pub(super) fn handle_kind(
        &mut self,
        now: Now,
        conn: ConnId,
        request: crate::proto::Request<'_>,
        out: &mut Outbox,
    ) -> Result<(), Refusal> {
        use crate::proto::Request;
        match request {
            Request::Shared {
                key,
                lease_ms,
                wait_ms,
            } => self.acquire_kind(now, conn, Kind::Shared, key, 0, lease_ms, wait_ms, out),
            Request::Permit {
                key,
                limit,
                lease_ms,
                wait_ms,
            } => self.acquire_kind(now, conn, Kind::Permit, key, limit, lease_ms, wait_ms, out),
            _ => unreachable!("not a G or C request"),
        }
    }

    /// `G` (`limit` 0) or `C` (`limit` > 0) of `key`.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire_kind(
        &mut self,
        now: Now,
        conn: ConnId,
        kind: Kind,
        key: &[u8],
        limit: u32,
        lease_ms: u64,
        wait_ms: u64,
        out: &mut Outbox,
    ) -> Result<(), Refusal> {
        debug_assert_eq!(limit == 0, kind == Kind::Shared);
        if self.follower_too_old {
            return Err(Refusal::FollowerTooOld);
        }
        if self.identities {
            self.check_access(conn, key)?;
        }
        let Some(lock) = self
            .table
            .find_or_insert_within(key, self.max_locks as usize)
        else {
            return Err(Refusal::LockTableFull {
                max_locks: self.max_locks,
            });
        };
        let l = self.table.lock(lock);
        // What the key is now: a semaphore of `l.limit` while it has
        // permits, a lock while it has an exclusive holder or shared ones.
        let live_limit = if l.members > 0 { l.limit } else { 0 };
        let refused = match kind {
            Kind::Shared => live_limit > 0,
            Kind::Permit => l.holder.is_some() || (l.members > 0 && live_limit != limit),
        };
        if refused {
            self.stats.kind_refused += 1;
            self.stats.of_kind(kind).refused += 1;
            let answer = Answer::KindRefused {
                kind,
                key,
                limit: live_limit,
            };
            out.answer(conn, answer);
            self.table.remove_if_idle(lock);
            return Ok(());
        }
        let grantable = self.table.head(lock).is_none()
            && match kind {
                Kind::Shared => l.holder.is_none(),
                Kind::Permit => l.members < limit,
            };
        if grantable {
            if self.members.len() >= self.max_locks as usize {
                self.table.remove_if_idle(lock);
                return Err(Refusal::MembersFull {
                    max_locks: self.max_locks,
                });
            }
            let Some(token) = self.tokens.next(now.unix_ns) else {
                self.table.remove_if_idle(lock);
                return Err(Refusal::TokensExhausted);
            };
            self.table.lock_mut(lock).limit = limit;
            self.grant_member(now, lock, conn, kind, lease_ms, token, out);
            self.stats.of_kind(kind).granted_at_once += 1;
            return Ok(());
        }
        if self.table.conn_len(conn) >= MAX_WAITING_PER_CONN {
            return Err(Refusal::TooManyWaiting);
        }
        let w = self
            .table
            .enqueue_kind(lock, conn, lease_ms, now.ms, Some(kind));
        if wait_ms > 0 {
            let timer = self.wheel.insert(deadline(now, wait_ms), Timer::Wait(w));
            self.table.waiter_mut(w).timer = Some(timer);
        }
        Ok(())
    }

    /// Grants `lock` to `conn` as a member of `kind` with `token` (just
    /// issued), and answers it.
    #[allow(clippy::too_many_arguments)]
    fn grant_member(
        &mut self,
        now: Now,
        lock: LockId,
        conn: ConnId,
        kind: Kind,
        lease_ms: u64,
        token: u64,
        out: &mut Outbox,
    ) {
        debug_assert!(self.table.lock(lock).holder.is_none());
        let expires_ms = deadline(now, lease_ms);
        let holder = self.grant_holder(conn);
        // The slot the member will take: its timer names it.
        let slot = MemberId::next_slot(self.members.slab.vacant_key());
        let timer = self.wheel.insert(expires_ms, Timer::Member(slot));
        let m = self.members.insert(Member {
            lock,
            token,
            expires_ms,
            timer,
            holder,
            permit: kind == Kind::Permit,
        });
        debug_assert_eq!(m, slot);
        let l = self.table.lock_mut(lock);
        l.members += 1;
        debug_assert!(l.limit == 0 || l.members <= l.limit);
        self.replicate_member(now, m);
        match kind {
            Kind::Shared => self.stats.granted_shared += 1,
            Kind::Permit => self.stats.granted_permits += 1,
        }
        let answer = Answer::KindGranted {
            kind,
            key: self.table.lock(lock).key(),
            token,
        };
        out.answer(conn, answer);
    }

    /// `R` of a member's token: its grant ends, and the key passes on.
    /// (With identities, [`Engine::handle_checked`] answered a release by
    /// another identity before this.)
    #[cold]
    #[inline(never)]
    pub(super) fn release_member(
        &mut self,
        now: Now,
        lock: LockId,
        token: u64,
        out: &mut Outbox,
    ) -> bool {
        let Some(m) = self.members.find(lock, token) else {
            return false;
        };
        self.stats
            .hold
            .record(now.unix_ns.saturating_sub(token) >> super::stats::HOLD_SHIFT);
        self.end_member(now, m, out);
        true
    }

    /// `N` of a member's token.
    #[cold]
    #[inline(never)]
    pub(super) fn renew_member(
        &mut self,
        now: Now,
        lock: LockId,
        token: u64,
        lease_ms: u64,
    ) -> bool {
        let Some(m) = self.members.find(lock, token) else {
            return false;
        };
        let member = *self.members.get(m);
        self.wheel.cancel(member.timer);
        let expires_ms = deadline(now, lease_ms);
        let timer = self.wheel.insert(expires_ms, Timer::Member(m));
        let entry = &mut self.members.slab[m.index()];
        entry.expires_ms = expires_ms;
        entry.timer = timer;
        self.replicate_member(now, m);
        true
    }

    /// A member's lease ran out (its timer fired).
    #[cold]
    #[inline(never)]
    pub(super) fn member_expired(&mut self, now: Now, m: MemberId, out: &mut Outbox) {
        self.stats.lease_expiries += 1;
        // The timer fired: cancelling it again would be wrong.
        let member = self.members.remove(m);
        self.after_member(now, member, out);
    }

    /// Ends member `m` (released): its timer, its holder reference, its
    /// count; then the key passes on.
    fn end_member(&mut self, now: Now, m: MemberId, out: &mut Outbox) {
        let member = self.members.remove(m);
        self.wheel.cancel(member.timer);
        self.after_member(now, member, out);
    }

    #[inline]
    fn after_member(&mut self, now: Now, member: Member, out: &mut Outbox) {
        self.replicate_release(member.lock, member.token);
        self.holders.unref(member.holder);
        let l = self.table.lock_mut(member.lock);
        debug_assert!(l.members > 0);
        l.members -= 1;
        self.pass_on(now, member.lock, out);
    }

    /// Grants, from the head of `lock`'s queue, every acquire that can be
    /// granted now, in order: an exclusive one when the key has no holder
    /// (and then nothing more), a shared one when it has no exclusive
    /// holder, a permit while fewer than the limit are held. Then a key
    /// without members is nobody's kind, and a free key leaves the table.
    ///
    /// With no fencing token left, the waiters are answered as by
    /// [`Engine::hand_off`].
    #[cold]
    #[inline(never)]
    pub(super) fn pass_on(&mut self, now: Now, lock: LockId, out: &mut Outbox) {
        while let Some(w) = self.table.head(lock) {
            let waiter = self.table.waiter(w);
            let (conn, kind, lease_ms, queued_ms) = (
                waiter.conn,
                waiter.kind,
                u64::from(waiter.lease_ms),
                waiter.queued_ms,
            );
            let l = self.table.lock(lock);
            let grantable = match kind {
                None => !l.is_held(),
                Some(Kind::Shared) => l.holder.is_none(),
                Some(Kind::Permit) => l.members < l.limit,
            };
            if !grantable {
                break;
            }
            if let Some(timer) = self.table.waiter_mut(w).timer.take() {
                self.wheel.cancel(timer);
            }
            let Some(token) = self.tokens.next(now.unix_ns) else {
                self.time_out_all(lock, w, out);
                return;
            };
            match kind {
                None => self.grant(now, lock, conn, lease_ms, token, out),
                Some(kind) => {
                    self.grant_member(now, lock, conn, kind, lease_ms, token, out);
                    self.stats.of_kind(kind).granted_after_wait += 1;
                }
            }
            self.stats.wait_ms.record(now.ms.saturating_sub(queued_ms));
            self.answered(w, out);
            if kind.is_none() {
                break;
            }
        }
        let l = self.table.lock_mut(lock);
        if l.members == 0 {
            l.limit = 0;
        }
        self.table.remove_if_idle(lock);
    }

    /// Locks whose queue lost a waiter while they had members
    /// ([`Engine::close`] has no time): passed on now.
    pub(super) fn settle_pending(&mut self, now: Now, out: &mut Outbox) {
        while let Some(lock) = self.pass_pending.pop() {
            // It may have gone meanwhile (its members released before the
            // settle, on an engine driven without one after each close).
            if self.table.is_live(lock) {
                self.pass_on(now, lock, out);
            }
        }
    }

    /// The answer to a waiter whose wait ran out: `T` for `A`, `G key 0`
    /// or `C key 0` for the others.
    #[inline]
    pub(super) fn timed_out_answer(kind: Option<Kind>, key: &[u8]) -> Answer<'_> {
        match kind {
            None => Answer::TimedOut { key },
            Some(kind) => Answer::KindGranted {
                kind,
                key,
                token: 0,
            },
        }
    }

    /// What `L`, `W` and `Q` show of `lock`'s grant: its exclusive holder,
    /// or its newest member (`(token, expires_ms, holder)`).
    pub(super) fn shown_grant(&self, lock: LockId) -> Option<(u64, u64, HolderId)> {
        let l = self.table.lock(lock);
        match l.holder {
            Some(g) => Some((g.token, g.expires_ms, g.holder)),
            None if l.members > 0 => self
                .members
                .newest(lock)
                .map(|m| (m.token, m.expires_ms, m.holder)),
            None => None,
        }
    }

    /// The members of `key`: `(token, expires_ms)`, oldest first. For
    /// tests and tools.
    pub fn members_of(&self, key: &[u8]) -> Vec<(u64, u64)> {
        let Some(lock) = self.table.find(key) else {
            return Vec::new();
        };
        self.members
            .of(lock)
            .map(|m| (m.token, m.expires_ms))
            .collect()
    }

    /// Every shared grant and permit: `(key, token, expires_ms)`, as
    /// [`Engine::grants`] lists the exclusive ones. For tests and tools.
    pub fn member_grants(&self) -> impl Iterator<Item = (&[u8], u64, u64)> {
        self.members
            .iter()
            .map(|(_, m)| (self.table.lock(m.lock).key(), m.token, m.expires_ms))
    }

    /// The limit of `key` if it is a live semaphore.
    pub fn semaphore_limit(&self, key: &[u8]) -> Option<u32> {
        let lock = self.table.lock(self.table.find(key)?);
        (lock.limit > 0).then_some(lock.limit)
    }

    /// The members' part of [`Engine::check_invariants`]: every member is
    /// indexed, counted by its lock and timed; every head waiter is one
    /// that cannot be granted now (or its lock waits in `pass_pending`).
    pub(super) fn check_members(&self, refs: &mut std::collections::HashMap<HolderId, u32>) {
        assert_eq!(self.members.by_lock.len(), self.members.slab.len());
        let permits = self.members.iter().filter(|(_, m)| m.permit).count();
        assert_eq!(self.members.permits, permits, "permits held");
        let mut counted = std::collections::HashMap::new();
        for (m, member) in self.members.iter() {
            assert_eq!(self.members.find(member.lock, member.token), Some(m));
            let l = self.table.lock(member.lock);
            assert!(l.holder.is_none(), "a member beside an exclusive holder");
            assert_eq!(member.permit, l.limit > 0, "a member of another kind");
            assert!(member.token <= self.tokens.highest());
            *counted.entry(member.lock).or_insert(0u32) += 1;
            if !member.holder.is_nil() {
                *refs.entry(member.holder).or_insert(0) += 1;
            }
        }
        for id in self.table.lock_ids() {
            let l = self.table.lock(id);
            assert_eq!(
                l.members,
                counted.get(&id).copied().unwrap_or(0),
                "members of lock {id}"
            );
            let Some(head) = self.table.head(id) else {
                continue;
            };
            if self.pass_pending.contains(&id) {
                continue;
            }
            let kind = self.table.waiter(head).kind;
            let grantable = match kind {
                None => !l.is_held(),
                Some(Kind::Shared) => l.holder.is_none(),
                Some(Kind::Permit) => l.members < l.limit,
            };
            assert!(
                !grantable,
                "lock {id}: its head waiter ({kind:?}) could be granted"
            );
            let mut w = Some(head);
            while let Some(i) = w {
                let k = self.table.waiter(i).kind;
                if l.members > 0 && l.limit > 0 {
                    assert_eq!(
                        k,
                        Some(Kind::Permit),
                        "lock {id}: {k:?} waits on a semaphore"
                    );
                } else {
                    assert_ne!(k, Some(Kind::Permit), "lock {id}: a permit waits on a lock");
                }
                w = self.table.queue_next(i);
            }
        }
    }
}
