//! `--rate`: cycles started at a fixed rate instead of as fast as answers
//! come back.
//!
//! The closed loop measures what a server does at the most load the
//! generator can give it, and how full each of its turns is then depends on
//! how fast the generator runs: an active with standbys on the generator's
//! core gets fewer requests per turn than a single node, and pays its fixed
//! costs per turn over fewer cycles. At a rate both can sustain, each is
//! offered the same requests at the same moments, and the CPU per cycle
//! compares the work per cycle alone.
//!
//! Each slot of a connection starts a cycle every `interval` (the slots
//! times the rate's period), the slots' first starts spread evenly over one
//! interval. A slot whose cycle took longer than its interval starts the
//! next one at once; one that falls more than [`CATCH_UP`] intervals
//! behind (the server cannot sustain the rate) gives up the cycles it
//! missed, so the offered rate is at most the one asked for.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// How many intervals a slot may fall behind before it forgets the cycles
/// it missed.
pub(crate) const CATCH_UP: u64 = 8;

/// When each slot starts its next cycle (ns on the generator's clock).
pub(crate) struct Pacer {
    interval: u64,
    next: Vec<u64>,
    due: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Pacer {
    /// `slots` slots from `start` on, at `rate` cycles per second in all
    /// over `all_slots` slots (this pacer's and other threads').
    pub(crate) fn new(rate: u64, slots: u32, all_slots: u64, start: u64) -> Pacer {
        assert!(rate > 0 && slots > 0 && all_slots >= u64::from(slots));
        let interval = (all_slots.saturating_mul(1_000_000_000) / rate).max(1);
        let mut pacer = Pacer {
            interval,
            next: Vec::with_capacity(slots as usize),
            due: BinaryHeap::with_capacity(slots as usize),
        };
        for s in 0..slots {
            let first = start + interval * u64::from(s) / u64::from(slots);
            pacer.next.push(first);
            pacer.due.push(Reverse((first, s)));
        }
        pacer
    }

    /// Slot `s` finished its cycle at `now`: it starts its next at its
    /// next start (at once if that has passed).
    pub(crate) fn finished(&mut self, s: u32, now: u64) {
        let next = &mut self.next[s as usize];
        *next += self.interval;
        if next.saturating_add(CATCH_UP * self.interval) < now {
            *next = now;
        }
        self.due.push(Reverse((*next, s)));
    }

    /// The next slot whose start is at or before `now`, if any.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<u32> {
        let &Reverse((at, s)) = self.due.peek()?;
        (at <= now).then(|| {
            self.due.pop();
            s
        })
    }

    /// When the next slot starts, if one waits.
    pub(crate) fn next_start(&self) -> Option<u64> {
        self.due.peek().map(|&Reverse((at, _))| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `slots` slots whose cycles each take `cycle_ns`, from 0 to
    /// `until`, waking only when a start is due: how many cycles started.
    fn started(rate: u64, slots: u32, cycle_ns: u64, until: u64) -> u64 {
        let mut p = Pacer::new(rate, slots, u64::from(slots), 0);
        // (end of the running cycle, slot)
        let mut running: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
        let mut n = 0;
        let mut now = 0;
        while now < until {
            while let Some(s) = p.pop_due(now) {
                n += 1;
                running.push(Reverse((now + cycle_ns, s)));
            }
            while let Some(&Reverse((end, s))) = running.peek() {
                if end > now {
                    break;
                }
                running.pop();
                p.finished(s, end);
            }
            let wake = [p.next_start(), running.peek().map(|r| r.0.0)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(until);
            now = wake.max(now + 1);
        }
        n
    }

    #[test]
    fn a_sustainable_rate_is_kept_whatever_the_slots() {
        // 1000 cycles/s for 2 s, cycles of 0.1 ms: 2000 starts.
        for slots in [1, 4, 50] {
            let n = started(1000, slots, 100_000, 2_000_000_000);
            assert!((1995..=2000).contains(&n), "{slots} slots: {n}");
        }
    }

    #[test]
    fn an_unsustainable_rate_runs_closed_loop_and_no_faster() {
        // 1000 cycles/s asked of one slot whose cycles take 2 ms: at most
        // 500 per second, never a burst to make up for the rest.
        let n = started(1000, 1, 2_000_000, 1_000_000_000);
        assert!((499..=501).contains(&n), "{n}");
    }

    #[test]
    fn a_short_delay_is_made_up_a_long_one_is_not() {
        let mut p = Pacer::new(1000, 1, 1, 0);
        assert_eq!(p.pop_due(0), Some(0));
        // Finished 3 ms late: the next start is still at 1 ms (made up).
        p.finished(0, 4_000_000);
        assert_eq!(p.next_start(), Some(1_000_000));
        assert_eq!(p.pop_due(4_000_000), Some(0));
        // Finished 100 ms late: the missed starts are given up.
        p.finished(0, 102_000_000);
        assert_eq!(p.next_start(), Some(102_000_000));
    }

    #[test]
    fn first_starts_spread_over_one_interval() {
        let mut p = Pacer::new(1000, 4, 4, 10);
        // 4 slots at 1000/s: each every 4 ms, first starts 1 ms apart.
        let mut starts = Vec::new();
        while let Some(at) = p.next_start() {
            let s = p.pop_due(at).unwrap();
            starts.push((at, s));
        }
        assert_eq!(
            starts,
            [(10, 0), (1_000_010, 1), (2_000_010, 2), (3_000_010, 3)]
        );
    }
}
