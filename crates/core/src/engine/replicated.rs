//! The engine's side of replication: an active records its table's
//! changes, a standby applies its active's grants, releases and snapshots,
//! and the node steps down or takes over.

use super::table::{self, LockId, WaiterState};
use super::{
    ConnId, Engine, GrantRefusal, LineEncoder, MAX_LEASE_MS, Now, Replication, ReplicationLog,
    Serving, Timer, token,
};
use crate::outbox::Outbox;
use crate::proto::Answer;

impl Engine {
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
            // The form stays with the engine.
            log.set_encoder(into.encoder());
        }
    }

    /// Records the next turn's events as the lines `encoder` writes (the
    /// one form every follower reads), or (`None`) as events. Called
    /// between turns, after [`Engine::take_replication`].
    pub(crate) fn set_replication_encoder(&mut self, encoder: Option<LineEncoder>) {
        if let Some(log) = &mut self.replication {
            log.set_encoder(encoder);
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
    pub(crate) fn apply_release(&mut self, now: Now, key: &[u8], token: u64, out: &mut Outbox) {
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
            self.release_member(now, lock, token, out);
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

    /// Stops serving: every waiting acquire is answered (`M` naming `active`,
    /// or `T` for one whose wait already ran out and was held back), oldest
    /// first on each connection, and later requests get `M`. Grants stay in
    /// the table (a successor may have them replicated).
    pub(crate) fn step_down(&mut self, active: Option<&str>, out: &mut Outbox) {
        let active: Option<Box<[u8]>> = active.map(|a| a.as_bytes().into());
        for conn in (0..self.conns.len()).map(ConnId::from_index) {
            loop {
                let w = self.table.conn_first(conn);
                if w.is_nil() {
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
                out.answer(conn, answer);
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

    /// Records the grant of `lock` for the followers, on an active node
    /// with peers. The recording itself is out of line: the request path of
    /// a node without peers keeps only this check.
    #[inline]
    pub(super) fn replicate_grant(&mut self, now: Now, lock: LockId) {
        if self.replication.is_some() && matches!(self.serving, Serving::Active) {
            self.record_grant(now, lock);
        }
    }

    #[inline]
    pub(super) fn replicate_release(&mut self, lock: LockId, token: u64) {
        if self.replication.is_some() && matches!(self.serving, Serving::Active) {
            self.record_release(lock, token);
        }
    }

    #[inline(never)]
    pub(super) fn record_grant(&mut self, now: Now, lock: LockId) {
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
    pub(super) fn record_release(&mut self, lock: LockId, token: u64) {
        if let Some(log) = &mut self.replication {
            log.push(Replication::Released {
                key: self.table.lock(lock).key(),
                token,
            });
        }
    }
}
