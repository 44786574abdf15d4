//! What the engine counts: plain integers bumped inline by the loop's
//! thread (no atomics). The node publishes copies of them; the engine
//! does not know where they go.

/// Buckets of a [`Log2Histogram`]: bucket 0 holds the value 0, bucket `i`
/// (1 ≤ i < 31) the values `2^(i-1) ..= 2^i - 1`, bucket 31 the rest.
pub const LOG2_BUCKETS: usize = 32;

/// A histogram of integer values (milliseconds or microseconds) with
/// power-of-two buckets: recording one value is a count of leading zeros,
/// a `min` and two additions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Log2Histogram {
    pub buckets: [u64; LOG2_BUCKETS],
    pub sum: u64,
}

impl Default for Log2Histogram {
    fn default() -> Self {
        Log2Histogram {
            buckets: [0; LOG2_BUCKETS],
            sum: 0,
        }
    }
}

impl Log2Histogram {
    #[inline]
    pub fn record(&mut self, value: u64) {
        let i = ((u64::BITS - value.leading_zeros()) as usize).min(LOG2_BUCKETS - 1);
        self.buckets[i] += 1;
        self.sum = self.sum.wrapping_add(value);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The largest value bucket `i` holds (`None`: the last, unbounded).
    pub fn upper_bound(i: usize) -> Option<u64> {
        (i < LOG2_BUCKETS - 1).then(|| (1u64 << i) - 1)
    }
}

/// What the engine counts: requests by outcome, timers, and the time
/// from acquire to grant and from grant to release (ms).
///
/// What the request path pays is kept to the least: a grant at once is one
/// increment (it is not recorded in `wait_ms`, see
/// [`EngineStats::wait_all`]); a release with the right token is one
/// histogram record (its count is the count of releases); a hand-off to a
/// waiter is one histogram record (its count is the count of grants after
/// a wait).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// `A` answered with a grant at once.
    pub granted_now: u64,
    /// Shared grants (`G`) and permits (`C`), at once or after a wait.
    pub granted_shared: u64,
    pub granted_permits: u64,
    /// Permits a standby applied from its active beyond the semaphore's
    /// limit (the active is authoritative: a heal merged the other side's,
    /// or a release was lost); a promoted node grants no permit of the key
    /// until it is back under the limit.
    pub permits_over_limit: u64,
    /// Acquires refused for the key's kind: `G` or `C` answered
    /// `semaphore`/`lock`, `A` of a live semaphore.
    pub kind_refused: u64,
    /// The outcomes of shared acquires (`G`) and of semaphore acquires
    /// (`C`) that the totals ([`EngineStats::wait_ms`], `timed_out`,
    /// `withdrawn`, `kind_refused`) count with `A`'s: `A`'s own are the
    /// totals less these ([`EngineStats::exclusive`]).
    pub shared: KindStats,
    pub permits: KindStats,
    /// `A` answered `T`.
    pub timed_out: u64,
    /// `A`, `R` or `N` answered `M` (a standby).
    pub redirected: u64,
    /// `A` withdrawn unanswered: its connection closed while it waited.
    pub withdrawn: u64,
    /// `R` answered `R key 0`: no grant carries that token (any more).
    pub release_stale: u64,
    pub renewed: u64,
    pub renew_stale: u64,
    /// `R` and `N` with the right token from another identity than the
    /// grant's holder (with client certificates): answered `0`, nothing
    /// changed.
    pub release_not_holder: u64,
    pub renew_not_holder: u64,
    /// `S` and `H`.
    pub status: u64,
    /// Leases that ran out.
    pub lease_expiries: u64,
    /// From acquire to grant, ms, of the acquires that waited in a queue
    /// (a hand-off on a release or an expiry).
    pub wait_ms: Log2Histogram,
    /// From grant to release (renewals included) of the grants released
    /// with their token, in units of 2^[`HOLD_SHIFT`] ns (1.048576 ms),
    /// measured from the token: a token is the wall clock in ns when it
    /// was issued, unless the token clock had run ahead of the wall clock
    /// (then the hold reads shorter, at least 0). This costs the grant no
    /// field of its own. Leases that ran out are not in it.
    pub hold: Log2Histogram,
}

/// Outcomes of one kind of acquire (see [`EngineStats::shared`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Granted at once (the request found the key free enough).
    pub granted_at_once: u64,
    /// Granted after waiting in the queue.
    pub granted_after_wait: u64,
    /// The wait ran out (`T`, `G key 0`, `C key 0`).
    pub timed_out: u64,
    /// Refused for the key's kind.
    pub refused: u64,
    /// Withdrawn unanswered: its connection closed while it waited.
    pub withdrawn: u64,
}

/// Hold times are recorded in units of 2^20 ns.
pub const HOLD_SHIFT: u32 = 20;

impl EngineStats {
    /// `R` answered `R key 1`.
    pub fn released(&self) -> u64 {
        self.hold.count()
    }

    /// `A` granted after waiting in the queue.
    pub fn granted_after_wait(&self) -> u64 {
        self.wait_ms.count()
    }

    /// The counts of `kind`'s acquires.
    pub fn of_kind(&mut self, kind: crate::proto::Kind) -> &mut KindStats {
        match kind {
            crate::proto::Kind::Shared => &mut self.shared,
            crate::proto::Kind::Permit => &mut self.permits,
        }
    }

    /// The outcomes of exclusive acquires (`A`): the totals less those of
    /// the other kinds.
    pub fn exclusive(&self) -> KindStats {
        let others = |f: fn(&KindStats) -> u64| f(&self.shared) + f(&self.permits);
        KindStats {
            granted_at_once: self.granted_now,
            granted_after_wait: self
                .granted_after_wait()
                .saturating_sub(others(|k| k.granted_after_wait)),
            timed_out: self.timed_out.saturating_sub(others(|k| k.timed_out)),
            refused: self.kind_refused.saturating_sub(others(|k| k.refused)),
            withdrawn: self.withdrawn.saturating_sub(others(|k| k.withdrawn)),
        }
    }

    /// From acquire to grant, every grant: the grants at once are 0 ms.
    pub fn wait_all(&self) -> Log2Histogram {
        let mut all = self.wait_ms;
        all.buckets[0] += self.granted_now;
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_buckets_hold_what_their_bounds_say() {
        let mut h = Log2Histogram::default();
        for v in [0, 1, 2, 3, 4, 7, 8, 1000, u64::MAX] {
            h.record(v);
        }
        assert_eq!(h.buckets[0], 1); // 0
        assert_eq!(h.buckets[1], 1); // 1
        assert_eq!(h.buckets[2], 2); // 2, 3
        assert_eq!(h.buckets[3], 2); // 4, 7
        assert_eq!(h.buckets[4], 1); // 8
        assert_eq!(h.buckets[10], 1); // 512..=1023
        assert_eq!(h.buckets[LOG2_BUCKETS - 1], 1);
        assert_eq!(h.count(), 9);
        for i in 0..LOG2_BUCKETS - 1 {
            let top = Log2Histogram::upper_bound(i).unwrap();
            let mut one = Log2Histogram::default();
            one.record(top);
            assert_eq!(one.buckets[i], 1, "bucket {i}");
            one.record(top + 1);
            assert_eq!(one.buckets[i + 1], 1, "bucket {}", i + 1);
        }
        assert_eq!(Log2Histogram::upper_bound(LOG2_BUCKETS - 1), None);
    }
}
