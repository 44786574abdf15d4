//! The operator's requests: `S` and `H`, and the listings `L`, `W`, `V`
//! and `Q`.

use super::table::{self, HolderId, Holders, LockId, Table};
use super::{
    ConnId, Engine, LIST_ANSWER_BYTES, LIST_MIN_SCAN, LIST_SCAN, LIST_WAITERS_CAP, Now, Serving,
};
use crate::outbox::Outbox;
use crate::proto::{Answer, Held, Request, Role};

impl Engine {
    /// What `W` and `Q` say of a waiter's connection.
    pub(super) fn conn_holder(&self, conn: ConnId) -> (Option<String>, Option<&[u8]>) {
        let c = &self.conns[conn.index()];
        (c.addr.map(|a| a.to_string()), c.owner.as_deref())
    }

    /// `Q`: `key`'s lock with its holder (no line if it has no lock), its
    /// first [`crate::proto::MAX_QUEUE_LISTED`] waiters, oldest first, then
    /// `Q <key> <waiters>`.
    #[cold]
    #[inline(never)]
    pub(super) fn queue(&mut self, now: Now, conn: ConnId, key: &[u8], out: &mut Outbox) {
        let mut buf = std::mem::take(out.output_mut(conn));
        let mut waiters = 0;
        let hidden = self.access_of(conn).is_some_and(|a| !a.may_lock(key));
        if let Some(lock) = self.table.find(key).filter(|_| !hidden) {
            let shown = self.shown_grant(lock);
            let l = self.table.lock(lock);
            lock_who(&self.table, &self.holders, now, l, shown).encode(&mut buf);
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
                .encode(&mut buf);
                w = self.table.queue_next(i);
            }
        }
        Answer::QueueEnd { key, waiters }.encode(&mut buf);
        *out.output_mut(conn) = buf;
        out.wrote_answers(conn);
    }

    /// `S` and `H`: rare, kept out of the request path's way.
    #[cold]
    #[inline(never)]
    pub(super) fn status(&mut self, conn: ConnId, request: Request<'_>, out: &mut Outbox) {
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
        out.answer(conn, answer);
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
    #[allow(clippy::too_many_arguments)]
    pub(super) fn list(
        &mut self,
        now: Now,
        conn: ConnId,
        cursor: u64,
        limit: u32,
        prefix: &[u8],
        form: ListForm,
        out: &mut Outbox,
    ) {
        let bound = self.table.slot_bound();
        let start = usize::try_from(cursor).unwrap_or(usize::MAX).min(bound);
        let scan = self.list_budget.clamp(LIST_MIN_SCAN, LIST_SCAN);
        let end = start.saturating_add(scan).min(bound);
        self.list_budget = self.list_budget.saturating_sub(end - start);
        let mut listed = 0;
        let mut next = end;
        let out_start = out.len(conn);
        // With identities, only keys the connection may lock (an admin: all).
        let access = self.access.get(conn.index()).cloned().flatten();
        let hidden = |key: &[u8]| access.as_ref().is_some_and(|a| !a.may_lock(key));
        for i in start..end {
            let Some(lock) = self.table.lock_at(i) else {
                continue;
            };
            if !lock.key().starts_with(prefix) || hidden(lock.key()) {
                continue;
            }
            let written = out.len(conn) - out_start;
            if listed == limit || written >= LIST_ANSWER_BYTES {
                next = i;
                break;
            }
            listed += 1;
            let id = LockId::from_index(i);
            let shown = match lock.holder {
                Some(g) => Some((g.token, g.expires_ms, g.holder)),
                None => self.shown_grant(id),
            };
            let lock = self.table.lock(id);
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
            out.answer(conn, answer);
        }
        let cursor = if next >= bound { 0 } else { next as u64 };
        let end = match form {
            ListForm::Plain => Answer::ListEnd { cursor },
            ListForm::Who => Answer::WhoEnd { cursor },
            ListForm::Kinds => Answer::KindsEnd { cursor },
        };
        out.answer(conn, end);
    }

    /// What `H` answers from now on: a problem (one line of printable
    /// text), or `None` for `H ok`.
    pub(crate) fn set_problem(&mut self, problem: Option<&[u8]>) {
        if self.problem.as_deref() != problem {
            self.problem = problem.map(Box::from);
        }
    }
}

/// The `K` line of `W` and `Q`: the lock's fields and its holder's.
/// `shown` is the grant it shows ([`Engine::shown_grant`]).
pub(super) fn lock_who<'a>(
    table: &'a Table,
    holders: &'a Holders,
    now: Now,
    lock: &'a table::Lock,
    shown: Option<(u64, u64, HolderId)>,
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
pub(super) enum ListForm {
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
pub(super) fn with_kind<'a>(who: Answer<'a>, lock: &table::Lock) -> Answer<'a> {
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
        // Members may be over the limit: merged at a heal, or replicated
        // so by the active ([`Engine::apply_member`]).
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
