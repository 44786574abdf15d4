//! Connections as the engine knows them: open and close, with their output
//! in the node's [`Outbox`].

use super::table::LockId;
use super::{Conn, ConnId, Engine, Now};
use crate::outbox::Outbox;

impl Engine {
    /// Registers a new connection and opens its output in `out`. `conn`
    /// must not be open.
    pub fn open(&mut self, conn: ConnId, out: &mut Outbox) {
        let i = conn.index();
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, Conn::default);
        }
        let c = &mut self.conns[i];
        assert!(!c.open, "connection {conn} opened twice");
        debug_assert_eq!(self.table.conn_len(conn), 0);
        c.open = true;
        out.open(conn);
    }

    /// Forgets a connection: its waiting acquires leave their queues (their
    /// answers are never sent), its grants stay, its unsent output in `out`
    /// is dropped.
    pub fn close(&mut self, conn: ConnId, out: &mut Outbox) {
        let c = &mut self.conns[conn.index()];
        assert!(c.open, "connection {conn} closed twice");
        c.open = false;
        c.addr = None;
        c.owner = None;
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        if let Some(access) = self.access.get_mut(conn.index()) {
            *access = None;
        }
        out.close(conn);
        loop {
            let w = self.table.conn_first(conn);
            if w.is_nil() {
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
    pub(super) fn withdrawn_from_members(&mut self, lock: LockId) {
        if !self.pass_pending.contains(&lock) {
            self.pass_pending.push(lock);
        }
    }

    /// Grants what the connections closed since the last turn let be
    /// granted (see [`Engine::close`]); the node calls it right after
    /// closing.
    pub fn settle(&mut self, now: Now, out: &mut Outbox) {
        if !self.pass_pending.is_empty() {
            self.settle_pending(now, out);
        }
    }

    /// Whether `conn` is open here (false for an id never opened). The node
    /// checks that its outbox agrees.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.get(conn.index()).is_some_and(|c| c.open)
    }

    /// How many connection ids the engine has slots for: none at or above
    /// it was ever opened.
    pub(crate) fn conn_slots(&self) -> usize {
        self.conns.len()
    }
}
