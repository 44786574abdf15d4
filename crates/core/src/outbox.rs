//! The outbox: every connection's unsent output, and which connections have
//! some.
//!
//! One owner for the bytes that leave the node: the node holds the outbox
//! and lends it to the engine, which writes its answers here
//! ([`Outbox::answer`]), and to the cluster, which writes its peer lines
//! ([`Outbox::write_link`]); the node itself writes an `E` line before it
//! closes a connection. The I/O loop asks which connections have output
//! ([`Outbox::take_dirty`]: peer links first) and sends each one's buffer,
//! taking bytes from the front or swapping the buffer out
//! ([`Outbox::output_mut`]) so that a send copies nothing.

use crate::proto::Answer;

/// A connection, numbered by the I/O loop: small, dense and reused once the
/// connection is gone, so it indexes the per-connection slabs directly.
/// Printed as the bare number (log lines say `conn 7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ConnId(u32);

impl ConnId {
    /// The largest id; the io_uring loop packs ids into 32 bits of a
    /// completion's tag.
    pub const MAX: ConnId = ConnId(u32::MAX);

    /// The connection numbered `raw`.
    pub const fn new(raw: u32) -> ConnId {
        ConnId(raw)
    }

    /// The connection at slot `index` of a loop's slab. Slabs hold at most
    /// the process's descriptors, far below `u32::MAX`: more is a bug.
    pub fn from_index(index: usize) -> ConnId {
        ConnId(u32::try_from(index).expect("connection index over u32::MAX"))
    }

    /// The number, as the io_uring loop packs it.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The slot of this connection in a per-connection table.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// `ConnId::new`, short for the tests, which name many connections.
#[cfg(test)]
pub(crate) const fn cid(raw: u32) -> ConnId {
    ConnId::new(raw)
}

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Which of the dirty lists a connection is on. An id closed and taken
/// again within one turn may still be listed from its first life; it moves
/// when it is written to as what it is now.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Listed {
    #[default]
    No,
    Client,
    Link,
}

/// One connection's output.
#[derive(Default)]
struct Slot {
    open: bool,
    /// Bytes not yet taken by the I/O loop.
    out: Vec<u8>,
    /// Which of `Outbox::dirty` and `Outbox::dirty_links` lists it.
    listed: Listed,
}

/// See the module docs.
#[derive(Default)]
pub struct Outbox {
    slots: Vec<Slot>,
    /// Clients with output, in the order they were first written to.
    dirty: Vec<ConnId>,
    /// Peer links with output ([`Outbox::write_link`]): collected before
    /// `dirty`, so the loops hand a turn's replication to the kernel before
    /// the client answers it covers. A node stopped between two sends
    /// (SIGSTOP, a VM stall) then never leaves a client holding an answer
    /// its followers have not been sent: the kernel delivers what was
    /// written while the process is stopped.
    dirty_links: Vec<ConnId>,
}

impl Outbox {
    /// An outbox with no connection.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Opens `conn`'s output, empty. `conn` must not be open.
    pub(crate) fn open(&mut self, conn: ConnId) {
        let i = conn.index();
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, Slot::default);
        }
        let slot = &mut self.slots[i];
        debug_assert!(!slot.open, "output of connection {conn} opened twice");
        slot.open = true;
        slot.out.clear();
    }

    /// Drops `conn`'s unsent output; nothing more is written to it until it
    /// opens again.
    pub(crate) fn close(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn.index()];
        debug_assert!(slot.open, "output of connection {conn} closed twice");
        slot.open = false;
        slot.out.clear();
    }

    /// Appends an answer to a client's output and lists it.
    #[inline]
    pub(crate) fn answer(&mut self, conn: ConnId, answer: Answer<'_>) {
        let slot = &mut self.slots[conn.index()];
        debug_assert!(slot.open, "answer for closed connection {conn}");
        answer.encode(&mut slot.out);
        if slot.listed != Listed::Client {
            // Listed as a link by a life that ended this turn: that entry
            // is skipped.
            slot.listed = Listed::Client;
            self.dirty.push(conn);
        }
    }

    /// Lists a client after bytes were appended to its output directly
    /// ([`Outbox::output_mut`]).
    pub(crate) fn wrote_answers(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn.index()];
        if slot.listed != Listed::Client {
            slot.listed = Listed::Client;
            self.dirty.push(conn);
        }
    }

    /// Appends bytes for `conn` (a peer link) and lists it as a link.
    pub(crate) fn write_link(&mut self, conn: ConnId, bytes: &[u8]) {
        let slot = &mut self.slots[conn.index()];
        debug_assert!(slot.open);
        slot.out.extend_from_slice(bytes);
        if slot.listed != Listed::Link {
            // Listed as a client by a life that ended this turn (or before
            // its first peer line): that entry is skipped.
            slot.listed = Listed::Link;
            self.dirty_links.push(conn);
        }
    }

    /// The output waiting for `conn`. The I/O loop takes bytes from the
    /// front (or swaps the buffer out) as it sends them.
    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        &mut self.slots[conn.index()].out
    }

    /// Bytes in `conn`'s output not yet taken by the loop (0 for a
    /// connection never opened).
    pub fn len(&self, conn: ConnId) -> usize {
        self.slots.get(conn.index()).map_or(0, |s| s.out.len())
    }

    /// Moves the connections written to since the last call into `into`
    /// (which is cleared first): peer links first, then clients in the
    /// order they were answered. Closed connections are left out. Returns
    /// how many of them are peer links (at the front).
    pub fn take_dirty(&mut self, into: &mut Vec<ConnId>) -> usize {
        into.clear();
        let slots = &mut self.slots;
        if self.dirty_links.is_empty() {
            // No links listed: every entry is a client's.
            std::mem::swap(into, &mut self.dirty);
            into.retain(|&c| {
                let slot = &mut slots[c.index()];
                debug_assert_eq!(slot.listed, Listed::Client);
                slot.listed = Listed::No;
                slot.open && !slot.out.is_empty()
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
            let slot = &mut slots[c.index()];
            if slot.listed != listed {
                return false; // listed by the id's earlier life this turn
            }
            slot.listed = Listed::No;
            let kept = slot.open && !slot.out.is_empty();
            links_kept += usize::from(kept && listed == Listed::Link);
            kept
        });
        links_kept
    }

    /// True if some open connection has output that the next
    /// [`Outbox::take_dirty`] would return: written after the loop took
    /// this turn's (a grant made by a release handled while another
    /// connection's answers went out, a step-down when a link closed).
    /// Such output may answer what the next collection's replication
    /// carries: a loop sends no client output after it until it collects
    /// again.
    pub fn has_uncollected(&self) -> bool {
        self.dirty.iter().chain(&self.dirty_links).any(|&c| {
            let slot = &self.slots[c.index()];
            slot.open && !slot.out.is_empty()
        })
    }

    /// Whether `conn`'s output is open.
    pub(crate) fn is_open(&self, conn: ConnId) -> bool {
        self.slots.get(conn.index()).is_some_and(|s| s.open)
    }

    /// How many connection ids have a slot: none at or above it was ever
    /// opened.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Checks that a closed connection keeps no output.
    pub(crate) fn check_invariants(&self) {
        for (c, slot) in self.slots.iter().enumerate() {
            assert!(
                slot.open || slot.out.is_empty(),
                "closed connection {c} keeps output"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(conns: u32) -> Outbox {
        let mut out = Outbox::new();
        for c in 0..conns {
            out.open(cid(c));
        }
        out
    }

    fn granted(out: &mut Outbox, conn: ConnId, key: &str) {
        let key = key.as_bytes();
        out.answer(conn, Answer::Granted { key, token: 1 });
    }

    #[test]
    fn peer_links_are_collected_before_the_clients_they_replicate() {
        let mut out = outbox(4);
        let mut dirty = Vec::new();
        // A client answered, then a link written to, then another client.
        granted(&mut out, cid(0), "a");
        out.write_link(cid(3), b"P X a 1\n");
        granted(&mut out, cid(1), "b");
        out.write_link(cid(2), b"P X b 1\n");
        out.write_link(cid(3), b"P HB\n");
        assert_eq!(out.take_dirty(&mut dirty), 2, "two links in front");
        assert_eq!(dirty, [3, 2, 0, 1].map(ConnId::new));
        assert_eq!(out.output_mut(cid(3)).as_slice(), b"P X a 1\nP HB\n");
        assert_eq!(out.output_mut(cid(0)).as_slice(), b"A a 1\n");
        for c in 0..4 {
            out.output_mut(cid(c)).clear();
        }
        // A link closed after its output, its id taken again by a client in
        // the same turn: listed once, among the clients; and the other way.
        out.write_link(cid(2), b"P HB\n");
        out.close(cid(2));
        out.open(cid(2));
        granted(&mut out, cid(0), "e");
        granted(&mut out, cid(2), "c");
        granted(&mut out, cid(1), "d");
        out.close(cid(1));
        out.open(cid(1));
        out.write_link(cid(1), b"P HELLO\n");
        assert_eq!(out.take_dirty(&mut dirty), 1, "the closed link is no link");
        assert_eq!(dirty, [1, 0, 2].map(ConnId::new));
        assert_eq!(out.take_dirty(&mut dirty), 0);
        assert!(dirty.is_empty(), "{dirty:?}");
        out.check_invariants();
    }

    #[test]
    fn closed_and_emptied_connections_are_not_collected() {
        let mut out = outbox(3);
        let mut dirty = Vec::new();
        granted(&mut out, cid(0), "a");
        granted(&mut out, cid(1), "b");
        out.close(cid(1));
        assert!(out.has_uncollected(), "connection 0 waits");
        out.output_mut(cid(0)).clear();
        assert!(!out.has_uncollected(), "sent before it was collected");
        assert_eq!(out.take_dirty(&mut dirty), 0);
        assert!(dirty.is_empty(), "{dirty:?}");
        // Bytes written straight into the buffer count once listed.
        out.output_mut(cid(2)).extend_from_slice(b"E bye\n");
        assert!(!out.has_uncollected());
        out.wrote_answers(cid(2));
        assert!(out.has_uncollected());
        assert_eq!(out.take_dirty(&mut dirty), 0);
        assert_eq!(dirty, [2].map(ConnId::new));
        assert_eq!(out.len(cid(2)), 6);
        assert_eq!(out.len(cid(9)), 0, "never opened");
        out.check_invariants();
    }
}
