//! Connections as the engine knows them: open and close, and the way to
//! their output ([`crate::outbox`]).

use super::table::NIL;
use super::{Conn, ConnId, Engine, Now};
use crate::outbox::Outbox;

impl Engine {
    /// Registers a new connection. `conn` must not be open.
    pub fn open(&mut self, conn: ConnId) {
        let i = conn as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, Conn::default);
        }
        let c = &mut self.conns[i];
        assert!(!c.open, "connection {conn} opened twice");
        debug_assert_eq!(self.table.conn_len(conn), 0);
        c.open = true;
        self.outbox.open(conn);
    }

    /// Forgets a connection: its waiting acquires leave their queues (their
    /// answers are never sent), its grants stay, its unsent output is dropped.
    pub fn close(&mut self, conn: ConnId) {
        let c = &mut self.conns[conn as usize];
        assert!(c.open, "connection {conn} closed twice");
        c.open = false;
        c.addr = None;
        c.owner = None;
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        if let Some(access) = self.access.get_mut(conn as usize) {
            *access = None;
        }
        self.outbox.close(conn);
        loop {
            let w = self.table.conn_first(conn);
            if w == NIL {
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
    pub(super) fn withdrawn_from_members(&mut self, lock: u32) {
        if !self.pass_pending.contains(&lock) {
            self.pass_pending.push(lock);
        }
    }

    /// Grants what the connections closed since the last turn let be
    /// granted (see [`Engine::close`]); the node calls it right after
    /// closing.
    pub fn settle(&mut self, now: Now) {
        if !self.pass_pending.is_empty() {
            self.settle_pending(now);
        }
    }

    /// The outbox the engine writes its answers into: the way for the
    /// node and the cluster to every connection's output.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Same, to write peer lines and `E` lines, and for the loop to take
    /// what it sends.
    pub fn outbox_mut(&mut self) -> &mut Outbox {
        &mut self.outbox
    }

    /// The answers waiting for `conn` ([`Outbox::output_mut`]).
    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        self.outbox.output_mut(conn)
    }

    /// The connections with output since the last call, peer links first
    /// ([`Outbox::take_dirty`]).
    pub fn take_dirty(&mut self, into: &mut Vec<ConnId>) -> usize {
        self.outbox.take_dirty(into)
    }
}
