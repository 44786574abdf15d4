//! Grants and hand-off: a free lock to its next waiter, leases and waits
//! that run out ([`Engine::tick`]), and the `T` answers that rule 3 holds
//! back.

use super::table::{self, LockId, WaiterId, WaiterState};
use super::{ConnId, Engine, LIST_TURN_SCAN, Now, Timer, deadline};
use crate::outbox::Outbox;
use crate::proto::Answer;

impl Engine {
    /// Ends the leases and waits that ran out by `now`.
    pub fn tick(&mut self, now: Now, out: &mut Outbox) {
        self.list_budget = LIST_TURN_SCAN;
        self.settle(now, out);
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
                        self.hand_off(now, lock, out);
                    }
                }
                Timer::Wait(w) => {
                    self.table.waiter_mut(w).timer = None;
                    self.wait_ran_out(now, w, out);
                }
                Timer::Member(m) => self.member_expired(now, m, out),
            }
        }
    }

    /// Grants the free `lock` to `conn` with `token` (just issued), and
    /// answers it.
    pub(super) fn grant(
        &mut self,
        now: Now,
        lock: LockId,
        conn: ConnId,
        lease_ms: u64,
        token: u64,
        out: &mut Outbox,
    ) {
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
        out.answer(conn, answer);
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
    pub(super) fn hand_off(&mut self, now: Now, lock: LockId, out: &mut Outbox) {
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
            return self.pass_on(now, lock, out);
        }
        let waiter = self.table.waiter_mut(w);
        let (conn, lease_ms, queued_ms) =
            (waiter.conn, u64::from(waiter.lease_ms), waiter.queued_ms);
        if let Some(timer) = waiter.timer.take() {
            self.wheel.cancel(timer);
        }
        match self.tokens.next(now.unix_ns) {
            Some(token) => {
                self.grant(now, lock, conn, lease_ms, token, out);
                self.stats.wait_ms.record(now.ms.saturating_sub(queued_ms));
                self.answered(w, out);
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
            None => self.time_out_all(lock, w, out),
        }
    }

    /// [`Engine::hand_off`] without a token: `w`, the head waiter (its wait
    /// timer already cancelled), and every waiter behind it are answered
    /// `T`; the lock leaves the table.
    #[cold]
    #[inline(never)]
    pub(super) fn time_out_all(&mut self, lock: LockId, mut w: WaiterId, out: &mut Outbox) {
        loop {
            self.time_out(w, out);
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
    pub(super) fn wait_ran_out(&mut self, now: Now, w: WaiterId, out: &mut Outbox) {
        let lock = self.table.waiter(w).lock;
        self.time_out(w, out);
        if self.table.lock(lock).members > 0 {
            // Those behind it may be granted now (shared ones behind an
            // exclusive one that gave up).
            return self.pass_on(now, lock, out);
        }
        self.table.remove_if_idle(lock);
    }

    /// Answers a queued waiter `T`. The `T` goes out now, unless an earlier
    /// acquire of the same key on the same connection is still unanswered
    /// (rule 3): then it is held back until that one is answered. Either way
    /// it has left the queue and will never be granted. The lock stays in
    /// the table even if nothing keeps it any more: the caller removes it.
    pub(super) fn time_out(&mut self, w: WaiterId, out: &mut Outbox) {
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
        while !earlier.is_nil() {
            let e = self.table.waiter(earlier);
            if e.lock == lock && e.state == WaiterState::Queued {
                self.table.waiter_mut(earlier).holds_back = true;
                return;
            }
            earlier = self.table.conn_prev(earlier);
        }
        let key = self.table.lock(lock).key();
        out.answer(conn, Engine::timed_out_answer(kind, key));
        self.answered(w, out);
    }

    /// `w` has been answered: send the `T`s it was holding back, then forget
    /// it. Those are the held-back acquires of the same key that follow it on
    /// its connection, up to the next one still queued (which holds back any
    /// after it).
    pub(super) fn answered(&mut self, w: WaiterId, out: &mut Outbox) {
        let waiter = self.table.waiter(w);
        if waiter.holds_back {
            let (conn, lock) = (waiter.conn, waiter.lock);
            let mut later = self.table.conn_next(w);
            while !later.is_nil() {
                let next = self.table.conn_next(later);
                let l = self.table.waiter(later);
                if l.lock == lock {
                    if l.state == WaiterState::Queued {
                        break;
                    }
                    let key = self.table.lock(lock).key();
                    let answer = Engine::timed_out_answer(l.kind, key);
                    out.answer(conn, answer);
                    self.table.finish(later);
                }
                later = next;
            }
        }
        self.table.finish(w);
    }
}
