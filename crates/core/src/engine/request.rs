//! The request path: [`Engine::handle`] and the acquire, release, renewal
//! and owner label it answers, with the checks of a standby and of a node
//! with identities.

use std::sync::Arc;

use super::list::ListForm;
use super::stats::HOLD_SHIFT;
use super::table::{self, HolderId, Holders, LockId};
use super::{ConnId, Engine, MAX_WAITING_PER_CONN, Now, Refusal, Serving, Timer, deadline};
use crate::access::Access;
use crate::outbox::Outbox;
use crate::proto::{Answer, Request};

impl Engine {
    /// Handles one request from `conn`. `Err` means the request breaks the
    /// connection: the caller sends `E` and closes it. Answers to earlier
    /// requests are already in the output.
    pub fn handle(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
        out: &mut Outbox,
    ) -> Result<(), Refusal> {
        debug_assert!(self.conns[conn.index()].open);
        debug_assert_eq!(
            self.checked,
            self.identities || self.serving != Serving::Active
        );
        if self.checked
            && let Some(result) = self.handle_checked(now, conn, request, out)
        {
            return result;
        }
        match request {
            Request::Acquire {
                key,
                lease_ms,
                wait_ms,
            } => return self.acquire(now, conn, key, lease_ms, wait_ms, out),
            Request::Release { key, token } => {
                let ok = self.release(now, key, token, out);
                if !ok {
                    self.stats.release_stale += 1;
                }
                out.answer(conn, Answer::Released { key, ok });
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
                out.answer(conn, Answer::Renewed { key, ok });
            }
            Request::Status | Request::Health => self.status(conn, request, out),
            Request::List {
                cursor,
                limit,
                prefix,
            } => self.list(now, conn, cursor, limit, prefix, ListForm::Plain, out),
            Request::Who {
                cursor,
                limit,
                prefix,
            } => self.list(now, conn, cursor, limit, prefix, ListForm::Who, out),
            Request::Kinds {
                cursor,
                limit,
                prefix,
            } => self.list(now, conn, cursor, limit, prefix, ListForm::Kinds, out),
            Request::Owner { owner } => self.set_owner(conn, owner, out),
            Request::Queue { key } => self.queue(now, conn, key, out),
            Request::Shared { .. } | Request::Permit { .. } => {
                return self.handle_kind(now, conn, request, out);
            }
        }
        Ok(())
    }

    /// `O`: the owner label of `conn`'s grants from now on (those it holds
    /// keep theirs).
    #[cold]
    #[inline(never)]
    pub(super) fn set_owner(&mut self, conn: ConnId, owner: &[u8], out: &mut Outbox) {
        let c = &mut self.conns[conn.index()];
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        c.owner = Some(owner.into());
        out.answer(conn, Answer::Owner { owner });
    }

    /// The holder entry for a grant to `conn`, with the grant's reference.
    #[inline]
    pub(super) fn grant_holder(&mut self, conn: ConnId) -> HolderId {
        match self.conns[conn.index()].holder {
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
    pub(super) fn first_holder(&mut self, conn: ConnId) -> HolderId {
        let c = &self.conns[conn.index()];
        let addr = c
            .addr
            .map(|a| a.to_string().into_bytes().into_boxed_slice());
        debug_assert!(
            addr.as_ref()
                .is_none_or(|a| a.len() <= crate::proto::MAX_HOLDER_ADDR)
        );
        let identity = self.access.get(conn.index()).and_then(|a| a.as_deref());
        let identity = identity.map(Access::identity);
        let holder = self.holders.insert(addr, c.owner.as_deref(), identity);
        self.holders.add_ref(holder);
        self.conns[conn.index()].holder = Some(holder);
        holder
    }

    pub(super) fn acquire(
        &mut self,
        now: Now,
        conn: ConnId,
        key: &[u8],
        lease_ms: u64,
        wait_ms: u64,
        out: &mut Outbox,
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
            self.grant(now, lock, conn, lease_ms, token, out);
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
    pub(super) fn refuse_semaphore(&mut self, lock: LockId) -> Refusal {
        let l = self.table.lock(lock);
        self.not_allowed = format!(
            "key \"{}\" is a semaphore of {} permits: acquire it with C",
            crate::proto::Quoted(l.key()),
            l.limit
        );
        self.stats.kind_refused += 1;
        Refusal::Semaphore
    }

    pub(super) fn release(&mut self, now: Now, key: &[u8], token: u64, out: &mut Outbox) -> bool {
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
                    self.hand_off(now, lock, out);
                }
                true
            }
            _ => self.release_other(now, lock, token, out),
        }
    }

    /// A release whose token is not the exclusive holder's: a shared
    /// grant's or permit's, a believed grant's after a heal, or stale.
    #[cold]
    #[inline(never)]
    pub(super) fn release_other(
        &mut self,
        now: Now,
        lock: LockId,
        token: u64,
        out: &mut Outbox,
    ) -> bool {
        if self.table.lock(lock).members > 0 {
            self.release_member(now, lock, token, out)
        } else if self.merged.is_empty() {
            false
        } else {
            self.release_believed(now, lock, token)
        }
    }

    pub(super) fn renew(&mut self, now: Now, key: &[u8], token: u64, lease_ms: u64) -> bool {
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
    pub(super) fn handle_checked(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
        out: &mut Outbox,
    ) -> Option<Result<(), Refusal>> {
        if let (Serving::Standby { active }, Some(key)) = (&self.serving, request.key()) {
            let answer = Answer::Moved {
                key,
                addr: active.as_deref(),
            };
            out.answer(conn, answer);
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
        out.answer(conn, answer);
        Some(Ok(()))
    }

    /// On a node with identities: whether `key`'s grant with `token` (or
    /// its believed grant with lease left, after a merge) is held by an
    /// identity that `conn` may not release and renew for.
    pub(super) fn held_by_another(&self, now: Now, conn: ConnId, key: &[u8], token: u64) -> bool {
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
    pub(super) fn check_access(&mut self, conn: ConnId, key: &[u8]) -> Result<(), Refusal> {
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
}

/// On a node with identities: whether `conn` may release or renew a grant
/// held by `holder`: its own identity's, or any as admin. A grant whose
/// holder's identity is not known (replicated over a link too old to carry
/// it) is released and renewed by an admin only.
#[cold]
#[inline(never)]
pub(super) fn may_touch(
    access: &[Option<Arc<Access>>],
    holders: &Holders,
    conn: ConnId,
    holder: HolderId,
) -> bool {
    let Some(access) = access.get(conn.index()).and_then(Option::as_ref) else {
        return false;
    };
    access.is_admin() || holders.get(holder).identity == Some(access.identity())
}
