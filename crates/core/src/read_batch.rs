//! Reading a busy link in batches: a standby's link from the active it
//! follows (`--replication-batch-us`).
//!
//! Under load the active writes to each follower every loop turn, tens of
//! thousands of times a second. A follower that waits on that socket wakes
//! at every write: the wake-up costs it a context switch, and on one host
//! (loopback) it costs the active too, whose core delivers the segment and
//! wakes the reader. Batching stops the waiting while the link is busy:
//! once a read finds bytes less than the interval after the one before,
//! the follower no longer waits on the socket and reads it once per
//! interval instead, taking whatever arrived meanwhile in one read. The
//! first read that finds the socket empty ends the batching: the link is
//! quiet again, and the follower waits on it as before, so a quiet link
//! costs nothing and a lone write is read at once.
//!
//! What arrives meanwhile is in the follower's kernel (its socket's
//! receive queue): nothing is held back on the active, and a stop or a
//! crash of the active loses nothing of it. The price is replication lag:
//! a change is applied at most one interval (plus a loop turn) after it
//! arrives. The peer timeout is far longer than the interval
//! ([`crate::cluster::MAX_READ_BATCH_US`]), so a follower never judges its
//! active silent while bytes from it wait unread.
//!
//! [`ReadBatch`] is the policy, without I/O or clock: the loops (and the
//! simulator) tell it each read's result through the connection's
//! [`crate::lifecycle::Lifecycle`] and ask it when to read next
//! ([`NextRead`]).

/// When the loop reads a connection next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRead {
    /// Wait on the socket: read as soon as bytes arrive.
    Waiting,
    /// Do not wait on the socket; at this time (monotonic µs, [`crate::engine::Now::us`])
    /// read what it holds without waiting, and tell the lifecycle if it
    /// held nothing ([`crate::lifecycle::Lifecycle::read_nothing`]).
    At(u64),
}

/// One connection's batching (see the module documentation).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadBatch {
    /// When a read last found bytes (µs).
    last_us: Option<u64>,
    /// Batching: the next read is at this time (µs).
    next_us: Option<u64>,
}

impl ReadBatch {
    /// A read at `now_us` found bytes. `interval_us` is how long this
    /// connection's reads may wait (0: never: it waits on the socket). It
    /// batches from now on if it already did (the link stays busy) or if
    /// its last read found bytes less than `interval_us` ago (it just got
    /// busy).
    pub(crate) fn found_bytes(&mut self, now_us: u64, interval_us: u64) {
        let busy = self.next_us.is_some()
            || self
                .last_us
                .is_some_and(|last| now_us.saturating_sub(last) < interval_us);
        self.next_us = (interval_us > 0 && busy).then(|| now_us.saturating_add(interval_us));
        self.last_us = Some(now_us);
        debug_assert!(self.next_us.is_none_or(|next| next > now_us));
    }

    /// A read without waiting found the socket empty: the link is quiet,
    /// the connection waits on it again.
    pub(crate) fn found_nothing(&mut self) {
        self.next_us = None;
    }

    pub(crate) fn next(&self) -> NextRead {
        match self.next_us {
            Some(at) => NextRead::At(at),
            None => NextRead::Waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: u64 = 250;

    #[test]
    fn a_lone_read_and_a_quiet_link_wait_on_the_socket() {
        let mut b = ReadBatch::default();
        assert_eq!(b.next(), NextRead::Waiting);
        b.found_bytes(1_000, INTERVAL);
        assert_eq!(b.next(), NextRead::Waiting, "the first read ever");
        // Heartbeats, 50 ms apart: never busy.
        for t in 1..20 {
            b.found_bytes(1_000 + t * 50_000, INTERVAL);
            assert_eq!(b.next(), NextRead::Waiting);
        }
        // Exactly one interval apart is not busy either.
        let t = 1_000 + 19 * 50_000;
        b.found_bytes(t + INTERVAL, INTERVAL);
        assert_eq!(b.next(), NextRead::Waiting);
    }

    #[test]
    fn a_busy_link_is_read_once_per_interval_until_a_read_finds_nothing() {
        let mut b = ReadBatch::default();
        b.found_bytes(10_000, INTERVAL);
        b.found_bytes(10_040, INTERVAL);
        assert_eq!(b.next(), NextRead::At(10_040 + INTERVAL), "busy: batched");
        // The batch reads come late (the loop's wake-up), and stay batched
        // whatever the gap, as long as each finds bytes.
        b.found_bytes(10_400, INTERVAL);
        assert_eq!(b.next(), NextRead::At(10_400 + INTERVAL));
        b.found_bytes(11_900, INTERVAL);
        assert_eq!(b.next(), NextRead::At(11_900 + INTERVAL));
        // Nothing there: quiet, wait on the socket.
        b.found_nothing();
        assert_eq!(b.next(), NextRead::Waiting);
        // The next arrival long after is read at once and does not batch.
        b.found_bytes(500_000, INTERVAL);
        assert_eq!(b.next(), NextRead::Waiting);
        // One soon after it does.
        b.found_bytes(500_100, INTERVAL);
        assert_eq!(b.next(), NextRead::At(500_100 + INTERVAL));
    }

    #[test]
    fn no_interval_never_batches() {
        let mut b = ReadBatch::default();
        for t in 0..10 {
            b.found_bytes(t, 0);
            assert_eq!(b.next(), NextRead::Waiting);
        }
        b.found_bytes(100, INTERVAL);
        assert_eq!(
            b.next(),
            NextRead::At(100 + INTERVAL),
            "9 µs after the last"
        );
        // The link stopped being batched (the node took the role, say):
        // its next read finds bytes with no interval.
        b.found_bytes(200, 0);
        assert_eq!(b.next(), NextRead::Waiting);
    }
}
