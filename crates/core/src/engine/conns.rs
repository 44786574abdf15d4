//! Connections as the engine knows them, and their output: open and close,
//! the per-connection answer buffers and the lists of those with output.

use super::table::NIL;
use super::{Conn, ConnId, Engine, Listed, Now};
use crate::proto::Answer;

impl Engine {
    /// Bytes in `conn`'s output not yet taken by the loop (0 for a
    /// connection the engine does not know).
    pub(crate) fn output_len(&self, conn: ConnId) -> usize {
        self.conns.get(conn as usize).map_or(0, |c| c.out.len())
    }

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
        c.out.clear();
    }

    /// Forgets a connection: its waiting acquires leave their queues (their
    /// answers are never sent), its grants stay, its unsent output is dropped.
    pub fn close(&mut self, conn: ConnId) {
        let c = &mut self.conns[conn as usize];
        assert!(c.open, "connection {conn} closed twice");
        c.open = false;
        c.out.clear();
        c.addr = None;
        c.owner = None;
        if let Some(holder) = c.holder.take() {
            self.holders.unref(holder);
        }
        if let Some(access) = self.access.get_mut(conn as usize) {
            *access = None;
        }
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

    /// The answers waiting for `conn`. The I/O loop takes bytes from the
    /// front (or swaps the buffer out) as it sends them.
    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        &mut self.conns[conn as usize].out
    }

    /// Moves the connections that got answers since the last call into
    /// `into` (which is cleared first): peer links first, then clients in
    /// the order they were answered. Closed connections are left out.
    /// Returns how many of them are peer links (at the front).
    pub fn take_dirty(&mut self, into: &mut Vec<ConnId>) -> usize {
        into.clear();
        let conns = &mut self.conns;
        if self.dirty_links.is_empty() {
            // No links listed: every entry is a client's.
            std::mem::swap(into, &mut self.dirty);
            into.retain(|&c| {
                let conn = &mut conns[c as usize];
                debug_assert_eq!(conn.dirty, Listed::Client);
                conn.dirty = Listed::No;
                conn.open && !conn.out.is_empty()
            });
            return 0;
        }
        let links = self.dirty_links.len();
        into.append(&mut self.dirty_links);
        into.append(&mut self.dirty);
        let mut i = 0;
        let mut links_kept = 0;
        into.retain(|&c| {
            let listed = if i < links {
                Listed::Link
            } else {
                Listed::Client
            };
            i += 1;
            let conn = &mut conns[c as usize];
            if conn.dirty != listed {
                return false; // listed by the id's earlier life this turn
            }
            conn.dirty = Listed::No;
            let kept = conn.open && !conn.out.is_empty();
            links_kept += usize::from(kept && listed == Listed::Link);
            kept
        });
        links_kept
    }

    /// True if some open connection has answers that the next
    /// [`Engine::take_dirty`] would return: written after the loop took
    /// this turn's (a grant made by a release handled while another
    /// connection's answers went out, a step-down when a link closed).
    pub(crate) fn has_uncollected_output(&self) -> bool {
        self.dirty.iter().chain(&self.dirty_links).any(|&c| {
            let conn = &self.conns[c as usize];
            conn.open && !conn.out.is_empty()
        })
    }

    /// Appends bytes for `conn` (a peer link) and marks it dirty.
    pub(crate) fn write_to(&mut self, conn: ConnId, bytes: &[u8]) {
        let c = &mut self.conns[conn as usize];
        debug_assert!(c.open);
        c.out.extend_from_slice(bytes);
        if c.dirty != Listed::Link {
            // Listed as a client by a life that ended this turn (or before
            // its first peer line): that entry is skipped.
            c.dirty = Listed::Link;
            self.dirty_links.push(conn);
        }
    }
}

/// Marks `conn` dirty after bytes were appended to its output directly.
pub(super) fn emit_bytes(conns: &mut [Conn], dirty: &mut Vec<ConnId>, conn: ConnId) {
    let c = &mut conns[conn as usize];
    if c.dirty != Listed::Client {
        c.dirty = Listed::Client;
        dirty.push(conn);
    }
}

/// Appends an answer to a connection's output and marks it dirty.
#[inline]
pub(super) fn emit(conns: &mut [Conn], dirty: &mut Vec<ConnId>, conn: ConnId, answer: Answer<'_>) {
    let c = &mut conns[conn as usize];
    debug_assert!(c.open, "answer for closed connection {conn}");
    answer.encode(&mut c.out);
    if c.dirty != Listed::Client {
        // Listed as a link by a life that ended this turn: that entry is
        // skipped.
        c.dirty = Listed::Client;
        dirty.push(conn);
    }
}
