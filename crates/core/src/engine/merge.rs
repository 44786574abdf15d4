//! Grants merged at the heal of a split brain (docs/cluster.md, "Which
//! active stays" and "Guarantees").
//!
//! The node that gives way sends the one that stays every grant it holds
//! (`Engine::merge_grant` for each). A grant of a key the node does not
//! hold is adopted as its grant. A grant of a key it holds with another
//! token is kept *beside* that grant: both holders may still believe in
//! their lock, so the key goes to nobody new until every such grant is
//! released or has expired (a lock-delay, never longer than the longest of
//! their leases). A believed grant is released and renewed with its own
//! token, like the key's grant.
//!
//! The key's grant (`Lock::holder`) stays the one the table, its lease
//! timer and `W`, `Q` and `L` know; the believed grants beside it live
//! here, with no timer of their own. When the key's grant ends (released
//! or expired) and a believed grant has lease left, that one becomes the
//! key's grant (with a timer) in the same step, so a key with believed
//! grants is never free and its waiters stay queued; believed grants whose
//! lease ran out are dropped then. This is a rare path: a node that never
//! merged keeps this map empty, and the request path only checks that.

use super::*;
use crate::outbox::Outbox;

/// The most grants kept beside one key's grant. One split brain leaves at
/// most one per side; more come only from merges piling up (or a broken
/// peer), and past this the merged grant with the least lease left is
/// forgotten.
pub const MAX_BELIEVED_PER_KEY: usize = 16;

/// A grant kept beside a key's grant after a merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Believed {
    pub(crate) token: u64,
    pub(crate) expires_ms: u64,
    /// An entry of the holders table this grant counts a reference to.
    pub(crate) holder: HolderId,
}

/// What `Engine::merge_grant` did with a merged grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged {
    /// The key was free here: the merged grant is its grant now.
    Adopted,
    /// This node has that very grant (same token); its lease is the longer
    /// of the two.
    Known,
    /// The key is held here with another token: kept beside it.
    Beside,
}

impl Engine {
    /// Takes a grant from the other side of a healed split brain (or, on a
    /// standby, a believed grant its active replicates): see the module
    /// docs. Values no node of ours sends are refused, as by
    /// [`Engine::apply_grant`].
    pub(crate) fn merge_grant(
        &mut self,
        now: Now,
        key: &[u8],
        token: u64,
        remaining_ms: u64,
        holder: crate::proto::Holder<'_>,
        out: &mut Outbox,
    ) -> Result<Merged, GrantRefusal> {
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
        let expires_ms = now.ms.saturating_add(remaining_ms);
        let outcome = match self.table.lock(lock).holder {
            None if self.table.lock(lock).members > 0 => {
                if self.members.holder_of(lock, token).is_some() {
                    // That very token is a member here: nothing to add.
                    return Ok(Merged::Known);
                }
                self.merge_over_members(now, lock, token, expires_ms, holder, out);
                Merged::Beside
            }
            None => {
                debug_assert!(self.table.head(lock).is_none() && !self.merged.contains_key(&lock));
                let holder = self.holders.intern(holder);
                let timer = self.wheel.insert(expires_ms, Timer::Lease(lock));
                self.table.lock_mut(lock).holder = Some(table::Grant {
                    token,
                    expires_ms,
                    timer,
                    holder,
                });
                self.replicate_grant(now, lock);
                Merged::Adopted
            }
            Some(g) if g.token == token => {
                if expires_ms > g.expires_ms {
                    self.wheel.cancel(g.timer);
                    let timer = self.wheel.insert(expires_ms, Timer::Lease(lock));
                    if let Some(grant) = &mut self.table.lock_mut(lock).holder {
                        grant.expires_ms = expires_ms;
                        grant.timer = timer;
                    }
                    self.replicate_grant(now, lock);
                }
                Merged::Known
            }
            Some(_) => {
                self.keep_beside(lock, token, expires_ms, holder);
                self.replicate_believed(now, lock, token);
                Merged::Beside
            }
        };
        // After: the key is held, by this token or beside it.
        debug_assert!(self.table.lock(lock).holder.is_some_and(
            |g| g.token == token || self.merged[&lock].iter().any(|b| b.token == token)
        ));
        Ok(outcome)
    }

    /// Adds (or lengthens) a believed grant of `lock`, within
    /// [`MAX_BELIEVED_PER_KEY`].
    fn keep_beside(
        &mut self,
        lock: LockId,
        token: u64,
        expires_ms: u64,
        holder: crate::proto::Holder<'_>,
    ) {
        let beside = self.merged.entry(lock).or_default();
        if let Some(b) = beside.iter_mut().find(|b| b.token == token) {
            b.expires_ms = b.expires_ms.max(expires_ms);
            return;
        }
        if beside.len() >= MAX_BELIEVED_PER_KEY {
            let Some((i, least)) = beside
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.expires_ms)
                .map(|(i, b)| (i, *b))
            else {
                return;
            };
            if least.expires_ms >= expires_ms {
                return;
            }
            beside.swap_remove(i);
            self.holders.unref(least.holder);
        }
        let holder = self.holders.intern(holder);
        self.merged.entry(lock).or_default().push(Believed {
            token,
            expires_ms,
            holder,
        });
    }

    /// The key's grant of `lock` just ended: a believed grant with lease
    /// left takes its place (true), or, with none, the believed grants are
    /// forgotten and the caller hands the lock on (false).
    #[cold]
    #[inline(never)]
    pub(super) fn promote_believed(&mut self, now: Now, lock: LockId) -> bool {
        debug_assert!(self.table.lock(lock).holder.is_none());
        let Some(mut beside) = self.merged.remove(&lock) else {
            return false;
        };
        beside.retain(|b| {
            let live = b.expires_ms > now.ms;
            if !live {
                self.holders.unref(b.holder);
            }
            live
        });
        let Some(i) = (0..beside.len()).max_by_key(|&i| (beside[i].expires_ms, beside[i].token))
        else {
            return false;
        };
        let next = beside.swap_remove(i);
        let timer = self.wheel.insert(next.expires_ms, Timer::Lease(lock));
        self.table.lock_mut(lock).holder = Some(table::Grant {
            token: next.token,
            expires_ms: next.expires_ms,
            timer,
            holder: next.holder,
        });
        if !beside.is_empty() {
            self.merged.insert(lock, beside);
        }
        self.replicate_grant(now, lock);
        true
    }

    /// `R key token` of a believed grant of `lock` with lease left: it is
    /// forgotten (true).
    pub(super) fn release_believed(&mut self, now: Now, lock: LockId, token: u64) -> bool {
        let Some(beside) = self.merged.get_mut(&lock) else {
            return false;
        };
        let Some(i) = beside.iter().position(|b| b.token == token) else {
            return false;
        };
        // Only its holder (or an admin) ends a merged grant too: on a node
        // with identities, `handle_checked` saw to that.
        let b = beside.swap_remove(i);
        if beside.is_empty() {
            self.merged.remove(&lock);
        }
        self.holders.unref(b.holder);
        if b.expires_ms <= now.ms {
            return false;
        }
        self.replicate_release(lock, token);
        true
    }

    /// `N key token lease` of a believed grant of `lock` with lease left.
    pub(super) fn renew_believed(
        &mut self,
        now: Now,
        lock: LockId,
        token: u64,
        lease_ms: u64,
    ) -> bool {
        let Some(b) = self
            .merged
            .get_mut(&lock)
            .and_then(|beside| beside.iter_mut().find(|b| b.token == token))
        else {
            return false;
        };
        if b.expires_ms <= now.ms {
            return false;
        }
        b.expires_ms = deadline(now, lease_ms);
        self.replicate_believed(now, lock, token);
        true
    }

    /// A standby: the replicated release of a believed grant.
    pub(super) fn forget_believed(&mut self, lock: LockId, token: u64) {
        if let Some(beside) = self.merged.get_mut(&lock)
            && let Some(i) = beside.iter().position(|b| b.token == token)
        {
            let b = beside.swap_remove(i);
            if beside.is_empty() {
                self.merged.remove(&lock);
            }
            self.holders.unref(b.holder);
        }
    }

    /// Forgets every believed grant (a standby about to take a snapshot).
    pub(super) fn clear_believed(&mut self) {
        for (_, beside) in std::mem::take(&mut self.merged) {
            for b in beside {
                self.holders.unref(b.holder);
            }
        }
    }

    /// Believed grants with lease left at `now`, as grants: what a merge
    /// or a snapshot sends beside the keys' grants.
    pub fn believed(&self, now: Now) -> impl Iterator<Item = Replication<'_>> {
        self.merged.iter().flat_map(move |(&lock, beside)| {
            let key = self.table.lock(lock).key();
            beside.iter().filter_map(move |b| {
                let remaining_ms = b.expires_ms.saturating_sub(now.ms);
                (remaining_ms > 0).then(|| Replication::Granted {
                    key,
                    token: b.token,
                    remaining_ms,
                    holder: self.holders.get(b.holder),
                })
            })
        })
    }

    /// Keys held by more than one believed grant now.
    pub fn believed_count(&self) -> usize {
        self.merged.values().map(Vec::len).sum()
    }

    #[inline(never)]
    pub(super) fn replicate_believed(&mut self, now: Now, lock: LockId, token: u64) {
        if self.replication.is_none() || !matches!(self.serving, Serving::Active) {
            return;
        }
        let Some(b) = self
            .merged
            .get(&lock)
            .and_then(|beside| beside.iter().find(|b| b.token == token))
        else {
            return;
        };
        if let Some(log) = &mut self.replication {
            log.push(Replication::Believed {
                key: self.table.lock(lock).key(),
                token,
                remaining_ms: b.expires_ms.saturating_sub(now.ms),
                holder: self.holders.get(b.holder),
            });
        }
    }

    /// The believed grants' invariants; adds their holder references to
    /// `refs`.
    pub(super) fn check_believed(&self, refs: &mut std::collections::HashMap<HolderId, u32>) {
        for (&lock, beside) in &self.merged {
            let l = self.table.lock(lock);
            let grant = l.holder.expect("believed grants beside a free key");
            assert!(!beside.is_empty(), "an empty list of believed grants kept");
            assert!(beside.len() <= MAX_BELIEVED_PER_KEY);
            for (i, b) in beside.iter().enumerate() {
                assert_ne!(b.token, grant.token, "a believed grant repeats the key's");
                assert!(beside[..i].iter().all(|o| o.token != b.token));
                assert!(
                    b.token <= self.tokens.highest(),
                    "a believed token above the clock"
                );
                if !b.holder.is_nil() {
                    *refs.entry(b.holder).or_insert(0) += 1;
                }
            }
        }
    }
}
