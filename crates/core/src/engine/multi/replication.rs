//! Replication of shared grants and permits (docs/cluster.md, "Shared
//! grants and permits"): an active records its members, a standby applies
//! them, and a heal merges the other side's.

use super::Member;
use crate::engine::ids::MemberId;
use crate::engine::table::{self, LockId};
use crate::engine::{
    Engine, GrantRefusal, MAX_LEASE_MS, Merged, Now, Replication, Timer, merge, token,
};
use crate::outbox::Outbox;

impl Engine {
    /// Whether a follower's link is too old to carry members: then `G` and
    /// `C` are refused ([`Refusal::FollowerTooOld`]).
    pub(crate) fn set_follower_too_old(&mut self, too_old: bool) {
        self.follower_too_old = too_old;
    }

    /// Records member `m`'s grant or renewal for the followers, on an
    /// active node with peers. The recording is out of line: a node
    /// without peers keeps only this check.
    #[inline]
    pub(super) fn replicate_member(&mut self, now: Now, m: MemberId) {
        if self.replication.is_some() && self.is_active() {
            self.record_member(now, m);
        }
    }

    #[inline(never)]
    fn record_member(&mut self, now: Now, m: MemberId) {
        let member = *self.members.get(m);
        let l = self.table.lock(member.lock);
        if let Some(log) = &mut self.replication {
            log.push(Replication::Member {
                key: l.key(),
                token: member.token,
                remaining_ms: member.expires_ms.saturating_sub(now.ms),
                holder: self.holders.get(member.holder),
                limit: l.limit,
            });
        }
    }

    /// Every member with lease left at `now`, as a [`Replication::Member`]:
    /// the members' part of a snapshot (and of a merge).
    pub fn member_snapshot(&self, now: Now) -> impl Iterator<Item = Replication<'_>> {
        self.members.slab.iter().filter_map(move |(_, m)| {
            let remaining_ms = m.expires_ms.saturating_sub(now.ms);
            let l = self.table.lock(m.lock);
            (remaining_ms > 0).then(|| Replication::Member {
                key: l.key(),
                token: m.token,
                remaining_ms,
                holder: self.holders.get(m.holder),
                limit: l.limit,
            })
        })
    }

    /// The bounds every replicated or merged member is checked against
    /// (values no node of ours sends).
    fn check_member_fields(remaining_ms: u64, token: u64, limit: u32) -> Result<(), GrantRefusal> {
        if token > token::MAX_TOKEN {
            return Err(GrantRefusal::TokenOutOfRange(token));
        }
        if remaining_ms > MAX_LEASE_MS {
            return Err(GrantRefusal::LeaseOutOfRange(remaining_ms));
        }
        if limit > crate::proto::MAX_PERMITS {
            return Err(GrantRefusal::LimitOutOfRange(limit));
        }
        Ok(())
    }

    /// The lock of `key` for a replicated or merged member, and the slot
    /// its member would take if it is new (`None`: the member with `token`
    /// is there already).
    fn member_lock(
        &mut self,
        key: &[u8],
        token: u64,
    ) -> Result<(LockId, Option<MemberId>), GrantRefusal> {
        let Some(lock) = self
            .table
            .find_or_insert_within(key, self.max_locks as usize)
        else {
            return Err(GrantRefusal::LockTableFull {
                max_locks: self.max_locks,
            });
        };
        if let Some(m) = self.members.find(lock, token) {
            return Ok((lock, Some(m)));
        }
        if self.members.len() >= self.max_locks as usize {
            self.table.remove_if_idle(lock);
            return Err(GrantRefusal::MembersFull {
                max_locks: self.max_locks,
            });
        }
        Ok((lock, None))
    }

    /// Member `m`'s lease runs out at `expires_ms` now.
    fn set_member_expiry(&mut self, m: MemberId, expires_ms: u64) {
        let timer = self.members.get(m).timer;
        self.wheel.cancel(timer);
        let timer = self.wheel.insert(expires_ms, Timer::Member(m));
        let entry = &mut self.members.slab[m.index()];
        entry.expires_ms = expires_ms;
        entry.timer = timer;
    }

    /// Adds a member of `lock` with `token` (not one of its members),
    /// counted by the lock; the caller set the lock's limit.
    fn add_member(
        &mut self,
        lock: LockId,
        token: u64,
        expires_ms: u64,
        holder: crate::proto::Holder<'_>,
    ) -> MemberId {
        let holder = self.holders.intern(holder);
        let slot = MemberId::next_slot(self.members.slab.vacant_key());
        let timer = self.wheel.insert(expires_ms, Timer::Member(slot));
        // A semaphore's members are its permits (a shared lock has no limit).
        let permit = self.table.lock(lock).limit > 0;
        let m = self.members.insert(Member {
            lock,
            token,
            expires_ms,
            timer,
            holder,
            permit,
        });
        debug_assert_eq!(m, slot);
        self.table.lock_mut(lock).members += 1;
        m
    }

    /// A standby takes a shared grant (`limit` 0) or a permit of a
    /// semaphore of `limit` replicated by the active: `key` is held by the
    /// member with `token` for `remaining_ms` from now (a renewal if it is
    /// there). What the active sends is the newest word: an exclusive
    /// grant of the key, or members of another kind, give way to it; a
    /// permit beyond the semaphore's limit is taken and counted
    /// ([`super::super::stats::EngineStats::permits_over_limit`]). Values
    /// no node of ours sends are refused, and nothing changes.
    pub(crate) fn apply_member(
        &mut self,
        now: Now,
        key: &[u8],
        token: u64,
        remaining_ms: u64,
        limit: u32,
        holder: crate::proto::Holder<'_>,
    ) -> Result<(), GrantRefusal> {
        debug_assert!(
            !self.is_active(),
            "only a standby applies replicated members"
        );
        Engine::check_member_fields(remaining_ms, token, limit)?;
        let (lock, known) = self.member_lock(key, token)?;
        self.tokens.observe(token);
        let expires_ms = now.ms.saturating_add(remaining_ms);
        if let Some(m) = known {
            self.set_member_expiry(m, expires_ms);
            return Ok(());
        }
        if self.table.lock(lock).holder.is_some() {
            self.drop_exclusive(lock);
        }
        let l = self.table.lock(lock);
        if l.members > 0 && l.limit != limit {
            self.drop_members(lock);
        }
        self.table.lock_mut(lock).limit = limit;
        self.add_member(lock, token, expires_ms, holder);
        if limit > 0 && self.table.lock(lock).members > limit {
            // Taken all the same: the active's word is authoritative, and
            // a refused permit would be lost at a failover while its
            // holder goes on. `pass_on` grants no permit until the key is
            // back under its limit.
            self.stats.permits_over_limit += 1;
        }
        Ok(())
    }

    /// A standby forgets `lock`'s exclusive grant and the grants believed
    /// beside it (the active replaced them).
    #[cold]
    fn drop_exclusive(&mut self, lock: LockId) {
        if let Some(grant) = self.table.lock_mut(lock).holder.take() {
            self.wheel.cancel(grant.timer);
            self.holders.unref(grant.holder);
        }
        for b in self.merged.remove(&lock).unwrap_or_default() {
            self.holders.unref(b.holder);
        }
    }

    /// A standby forgets every member of `lock` (the key's kind is the
    /// active's again).
    #[cold]
    pub(in crate::engine) fn drop_members(&mut self, lock: LockId) {
        let slots: Vec<MemberId> = self
            .members
            .by_lock
            .range((lock, 0)..=(lock, u64::MAX))
            .map(|(_, &m)| m)
            .collect();
        for m in slots {
            let member = self.members.remove(m);
            self.wheel.cancel(member.timer);
            self.holders.unref(member.holder);
        }
        let l = self.table.lock_mut(lock);
        l.members = 0;
        l.limit = 0;
    }

    /// A standby about to take a snapshot forgets every member.
    pub(in crate::engine) fn clear_members(&mut self) {
        let locks: Vec<LockId> = self.members.iter().map(|(_, m)| m.lock).collect();
        for lock in locks {
            if self.table.lock(lock).members > 0 {
                self.drop_members(lock);
            }
        }
        debug_assert_eq!(self.members.len(), 0);
    }

    /// Takes a member from the other side of a healed split brain (or, on
    /// a standby, from its active between `MERGE` and `MERGED`), as
    /// [`Engine::merge_grant`] takes an exclusive grant: a key free here
    /// adopts it (with its kind and limit); a key with members here counts
    /// it as one of them, of the key's kind here (a semaphore may then be
    /// over its limit: [`Engine::pass_on`] grants no permit until it is
    /// back under it); a key held exclusively here keeps it beside its
    /// grant, as a believed grant ([`merge`]). Values no node of
    /// ours sends are refused.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn merge_member(
        &mut self,
        now: Now,
        key: &[u8],
        token: u64,
        remaining_ms: u64,
        limit: u32,
        holder: crate::proto::Holder<'_>,
        out: &mut Outbox,
    ) -> Result<Merged, GrantRefusal> {
        Engine::check_member_fields(remaining_ms, token, limit)?;
        if self
            .table
            .find(key)
            .is_some_and(|lock| self.table.lock(lock).holder.is_some())
        {
            // Beside an exclusive grant: as a merged exclusive grant.
            return self.merge_grant(now, key, token, remaining_ms, holder, out);
        }
        let (lock, known) = self.member_lock(key, token)?;
        self.tokens.observe(token);
        let expires_ms = now.ms.saturating_add(remaining_ms);
        if let Some(m) = known {
            if expires_ms > self.members.get(m).expires_ms {
                self.set_member_expiry(m, expires_ms);
                self.replicate_member(now, m);
            }
            return Ok(Merged::Known);
        }
        let adopted = self.table.lock(lock).members == 0;
        if adopted {
            debug_assert!(self.table.head(lock).is_none(), "waiters on a free key");
            self.table.lock_mut(lock).limit = limit;
        }
        let m = self.add_member(lock, token, expires_ms, holder);
        self.replicate_member(now, m);
        Ok(if adopted {
            Merged::Adopted
        } else {
            Merged::Beside
        })
    }

    /// A merged exclusive grant of `lock`, which has members here: the
    /// merged grant becomes the key's grant and the members are kept
    /// beside it as believed grants (the longest leases, up to
    /// [`merge::MAX_BELIEVED_PER_KEY`]), so that the key goes to
    /// nobody new until all of them end. Permits waiting on a semaphore
    /// key cannot wait on a lock: they are answered `C key 0` (timed out).
    #[cold]
    #[inline(never)]
    pub(in crate::engine) fn merge_over_members(
        &mut self,
        now: Now,
        lock: LockId,
        token: u64,
        expires_ms: u64,
        holder: crate::proto::Holder<'_>,
        out: &mut Outbox,
    ) {
        debug_assert!(self.table.lock(lock).holder.is_none());
        if self.table.lock(lock).limit > 0 {
            while let Some(w) = self.table.head(lock) {
                if let Some(timer) = self.table.waiter_mut(w).timer.take() {
                    self.wheel.cancel(timer);
                }
                self.time_out(w, out);
            }
        }
        let slots: Vec<MemberId> = self
            .members
            .by_lock
            .range((lock, 0)..=(lock, u64::MAX))
            .map(|(_, &m)| m)
            .collect();
        let mut beside = Vec::with_capacity(slots.len());
        for m in slots {
            let member = self.members.remove(m);
            self.wheel.cancel(member.timer);
            self.replicate_release(lock, member.token);
            beside.push(merge::Believed {
                token: member.token,
                expires_ms: member.expires_ms,
                holder: member.holder,
            });
        }
        beside.sort_by_key(|b| std::cmp::Reverse(b.expires_ms));
        for b in beside.split_off(beside.len().min(merge::MAX_BELIEVED_PER_KEY)) {
            self.holders.unref(b.holder);
        }
        let l = self.table.lock_mut(lock);
        l.members = 0;
        l.limit = 0;
        let holder = self.holders.intern(holder);
        let timer = self.wheel.insert(expires_ms, Timer::Lease(lock));
        self.table.lock_mut(lock).holder = Some(table::Grant {
            token,
            expires_ms,
            timer,
            holder,
        });
        self.replicate_grant(now, lock);
        let tokens: Vec<u64> = beside.iter().map(|b| b.token).collect();
        if !beside.is_empty() {
            self.merged.insert(lock, beside);
        }
        for t in tokens {
            self.replicate_believed(now, lock, t);
        }
    }
}
