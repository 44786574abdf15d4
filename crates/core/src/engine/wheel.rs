//! Hierarchical timing wheel with millisecond resolution, O(1) insert and cancel.
//!
//! The wheel has six levels of 64 slots. A slot of level `L` is `64^L` ms wide,
//! so each level covers 64 slots of the level below it:
//!
//! | level | slot width                    | range (64 slots)                |
//! |-------|-------------------------------|---------------------------------|
//! | 0     | 1 ms                          | 64 ms                           |
//! | 1     | 64 ms                         | 4_096 ms (~4.1 s)               |
//! | 2     | 4_096 ms (~4.1 s)             | 262_144 ms (~4.4 min)           |
//! | 3     | 262_144 ms (~4.4 min)         | 16_777_216 ms (~4.66 h)         |
//! | 4     | 16_777_216 ms (~4.66 h)       | 1_073_741_824 ms (~12.4 days)   |
//! | 5     | 1_073_741_824 ms (~12.4 days) | 68_719_476_736 ms (~2.18 years) |
//!
//! A timer is stored in the lowest level whose slot still tells it apart from
//! the wheel's clock (`elapsed`): the level is given by the highest bit in which
//! `elapsed` and the deadline differ (tokio's rule). A timer of level `L < 5`
//! therefore lies in the same level-`L + 1` slot as `elapsed`, strictly after
//! `elapsed`'s own level-`L` slot. Two consequences keep `poll` simple:
//!
//! - the next slot to expire is always in the lowest non-empty level, so no
//!   level needs to compare its slots with another level's;
//! - when a slot of level `L` is reached, its timers are "cascaded": each one is
//!   placed again relative to the new clock, which puts it in a lower level (or
//!   in the due list once its deadline is reached). A timer moves down at most
//!   five times in its life, so `poll` is O(1) amortised per timer.
//!
//! The top level wraps around: a deadline up to [`MAX_AHEAD_MS`] ahead may fall
//! in the slot `elapsed` is in, one turn later. That is why slots are searched
//! starting *after* the current slot, the current one coming last.
//!
//! A deadline further ahead than that is accepted too, so that no value can
//! make `insert` fail: it is *parked* in the top-level slot its deadline
//! falls in, reached one turn (or less) later, and placed again from there,
//! once per turn of the top level (2.18 years), until it is within range.
//! The engine never sets one (its leases and waits are at most a day), so
//! this costs nothing but the absence of a check.
//!
//! Timers live in a [`Slab`]; every slot (and the due list) is the head of an
//! intrusive doubly-linked list of slab keys, so insert and cancel are O(1)
//! and allocate nothing once the slab has grown to the peak number of timers.
//! Each level keeps a `u64` bitmask of its non-empty slots, so finding the next
//! slot is a rotate and a `trailing_zeros`.

use slab::Slab;

const LEVELS: usize = 6;
const SLOT_BITS: usize = 6;
const SLOTS: usize = 1 << SLOT_BITS;
/// List index of the due list; lists `0..DUE` are the slots, `level * 64 + slot`.
const DUE: usize = LEVELS * SLOTS;
/// "No entry" marker in the linked lists.
const NIL: u32 = u32::MAX;

/// How far past the wheel's current time a deadline is placed directly: 2^36
/// ms (~2.18 years), the range of the top level. Deadlines beyond it are
/// parked (see the module docs).
pub(crate) const MAX_AHEAD_MS: u64 = 1 << (SLOT_BITS * LEVELS);

/// Handle to a live timer. Valid from `insert` until the timer is returned by
/// `poll` or `cancel`led; using it after that is a programmer error (it may
/// panic, or name a newer timer that reused the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerId(u32);

/// One timer, linked into exactly one list (a slot or the due list).
struct Entry<T> {
    deadline: u64,
    value: T,
    prev: u32,
    next: u32,
    /// Index of the list the entry is in (`level * 64 + slot`, or `DUE`).
    list: u16,
}

/// Head and tail of an intrusive list. Lists are FIFO, so timers with the same
/// deadline fire in the order they were inserted.
#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

/// A hierarchical timing wheel holding values of type `T`; see the module docs.
pub struct Wheel<T: Copy> {
    /// The wheel's clock. Invariant: every timer in a slot has its slot start
    /// (and so its deadline) strictly after `elapsed`; every timer in the due
    /// list has its deadline at or before `elapsed`.
    elapsed: u64,
    entries: Slab<Entry<T>>,
    lists: [List; DUE + 1],
    /// Bit `s` of `occupied[L]` is set iff slot `s` of level `L` is non-empty.
    occupied: [u64; LEVELS],
    /// A lower bound of the deadlines in the due list (`u64::MAX` when empty).
    /// Cancels do not raise it; `next_deadline` may be early, never late.
    due_min: u64,
}

/// Width in ms of one slot of `level`.
fn slot_width(level: usize) -> u64 {
    1 << (SLOT_BITS * level)
}

/// Width in ms of all 64 slots of `level`.
fn level_range(level: usize) -> u64 {
    slot_width(level + 1)
}

/// The slot of `level` that time `t` falls in.
fn slot_of(t: u64, level: usize) -> usize {
    ((t >> (SLOT_BITS * level)) as usize) & (SLOTS - 1)
}

/// The level for `deadline` (> `elapsed`): the highest differing bit decides.
/// Differences beyond the top level only happen when the deadline is in the
/// top level's next turn; they stay in the top level.
fn level_for(elapsed: u64, deadline: u64) -> usize {
    let masked = (elapsed ^ deadline) | (SLOTS as u64 - 1);
    let significant = 63 - masked.leading_zeros() as usize;
    (significant / SLOT_BITS).min(LEVELS - 1)
}

fn slot_list(level: usize, slot: usize) -> usize {
    level * SLOTS + slot
}

impl<T: Copy> Wheel<T> {
    /// A wheel whose clock starts at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self::with_capacity(now_ms, 0)
    }

    /// Same, with room for `capacity` timers reserved up front: address
    /// space, as much as the system grants (see `engine::reservable`);
    /// memory is taken as timers come. Past its room the wheel's storage
    /// grows by doubling, which copies it.
    pub fn with_capacity(now_ms: u64, capacity: usize) -> Self {
        Wheel {
            elapsed: now_ms,
            entries: Slab::with_capacity(super::reservable::<Entry<T>>(capacity)),
            lists: [EMPTY; DUE + 1],
            occupied: [0; LEVELS],
            due_min: u64::MAX,
        }
    }

    /// Schedules `value` to fire at `deadline_ms`. A deadline at or before the
    /// wheel's current time fires at the next `poll`. Any deadline is taken:
    /// one more than [`MAX_AHEAD_MS`] past the wheel's current time (the last
    /// `now` given to `poll`, or the start time) is parked until it is in
    /// range (see the module docs).
    pub fn insert(&mut self, deadline_ms: u64, value: T) -> TimerId {
        let key = self.entries.insert(Entry {
            deadline: deadline_ms,
            value,
            prev: NIL,
            next: NIL,
            list: DUE as u16,
        });
        let idx = u32::try_from(key).ok().filter(|&i| i != NIL);
        let idx = idx.expect("too many timers for u32 ids");
        self.place(idx);
        TimerId(idx)
    }

    /// Removes a live timer and returns its value. O(1).
    pub fn cancel(&mut self, id: TimerId) -> T {
        debug_assert!(self.entries.contains(id.0 as usize), "stale {id:?}");
        self.remove(id.0)
    }

    /// Returns one timer whose deadline is <= `now_ms`, removing it; `None`
    /// when no more are due. Call repeatedly until `None`. A `now_ms` smaller
    /// than before is treated as the current time.
    ///
    /// Timers come out in deadline order, except that timers inserted with a
    /// deadline already past come out first, in insertion order.
    pub fn poll(&mut self, now_ms: u64) -> Option<T> {
        let now = now_ms.max(self.elapsed);
        loop {
            if self.lists[DUE].head != NIL {
                return Some(self.remove(self.lists[DUE].head));
            }
            match self.next_expiration() {
                Some((level, slot, start)) if start <= now => self.cascade(level, slot, start),
                _ => {
                    // No slot starts at or before `now`, so moving the clock
                    // there keeps the invariant on `elapsed`.
                    self.elapsed = now;
                    return None;
                }
            }
        }
    }

    /// The earliest time at which `poll` may return something: never later
    /// than the earliest deadline, but possibly earlier (the start of a higher
    /// level's slot, where its timers are cascaded, or a past time if a timer
    /// is already due). `None` if there are no timers.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.lists[DUE].head != NIL {
            return Some(self.due_min);
        }
        self.next_expiration().map(|(_, _, start)| start)
    }

    /// Number of live timers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The latest deadline `insert` places without parking: [`MAX_AHEAD_MS`]
    /// past `elapsed`, rounded up to the end of a top-level slot. Anything
    /// later lands in a top-level slot whose next start is more than a whole
    /// slot before its deadline.
    #[cfg(test)]
    fn max_deadline(&self) -> u64 {
        let top_slot_end = self.elapsed | (slot_width(LEVELS - 1) - 1);
        top_slot_end.saturating_add(MAX_AHEAD_MS)
    }

    /// Links entry `idx` into the list its deadline belongs to, relative to
    /// the current `elapsed`.
    fn place(&mut self, idx: u32) {
        let deadline = self.entries[idx as usize].deadline;
        if deadline <= self.elapsed {
            self.due_min = self.due_min.min(deadline);
            self.push_back(DUE, idx);
        } else {
            let level = level_for(self.elapsed, deadline);
            self.push_back(slot_list(level, slot_of(deadline, level)), idx);
        }
    }

    /// Unlinks entry `idx` and frees it, returning its value.
    fn remove(&mut self, idx: u32) -> T {
        self.unlink(idx);
        if self.lists[DUE].head == NIL {
            self.due_min = u64::MAX;
        }
        self.entries.remove(idx as usize).value
    }

    /// The next slot to expire: the lowest non-empty level's first occupied
    /// slot after `elapsed`'s own, as `(level, slot, start time)`.
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        (0..LEVELS).find_map(|level| self.next_in_level(level))
    }

    fn next_in_level(&self, level: usize) -> Option<(usize, usize, u64)> {
        let occupied = self.occupied[level];
        if occupied == 0 {
            return None;
        }
        // Rotate so that bit 0 is the slot after the current one: the current
        // slot is searched last, as it can only hold top-level timers one turn
        // ahead.
        let after = slot_of(self.elapsed, level) + 1;
        let distance = occupied.rotate_right(after as u32).trailing_zeros() as usize;
        let slot = (after + distance) % SLOTS;
        let level_start = self.elapsed & !(level_range(level) - 1);
        let mut start = level_start + slot as u64 * slot_width(level);
        if start <= self.elapsed {
            debug_assert_eq!(level, LEVELS - 1, "only the top level wraps around");
            start += level_range(level);
        }
        Some((level, slot, start))
    }

    /// Moves the clock to `start`, the start of the non-empty `slot` of
    /// `level`, and places that slot's timers again: each goes to a lower level
    /// or, if its deadline is `start`, to the due list.
    fn cascade(&mut self, level: usize, slot: usize, start: u64) {
        debug_assert!(start > self.elapsed, "clock would pass a slot");
        self.elapsed = start;
        let mut idx = self.take(slot_list(level, slot));
        while idx != NIL {
            let entry = &self.entries[idx as usize];
            let next = entry.next;
            debug_assert!(
                entry.deadline - start < slot_width(level) || level == LEVELS - 1,
                "only the top level holds timers beyond their slot (parked)"
            );
            self.place(idx);
            idx = next;
        }
    }

    fn push_back(&mut self, list: usize, idx: u32) {
        let tail = self.lists[list].tail;
        let entry = &mut self.entries[idx as usize];
        entry.prev = tail;
        entry.next = NIL;
        entry.list = list as u16;
        match tail {
            NIL => self.lists[list].head = idx,
            tail => self.entries[tail as usize].next = idx,
        }
        self.lists[list].tail = idx;
        if list != DUE {
            self.occupied[list / SLOTS] |= 1 << (list % SLOTS);
        }
    }

    fn unlink(&mut self, idx: u32) {
        let entry = &self.entries[idx as usize];
        let (prev, next, list) = (entry.prev, entry.next, entry.list as usize);
        match prev {
            NIL => {
                debug_assert_eq!(self.lists[list].head, idx, "entry not in its list");
                self.lists[list].head = next;
            }
            prev => self.entries[prev as usize].next = next,
        }
        match next {
            NIL => {
                debug_assert_eq!(self.lists[list].tail, idx, "entry not in its list");
                self.lists[list].tail = prev;
            }
            next => self.entries[next as usize].prev = prev,
        }
        if self.lists[list].head == NIL && list != DUE {
            self.occupied[list / SLOTS] &= !(1 << (list % SLOTS));
        }
    }

    /// Empties slot list `list`, returning its old head; the entries stay
    /// chained through `next` until they are placed again.
    fn take(&mut self, list: usize) -> u32 {
        debug_assert!(list < DUE);
        let head = self.lists[list].head;
        self.lists[list] = EMPTY;
        self.occupied[list / SLOTS] &= !(1 << (list % SLOTS));
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    impl<T: Copy> Wheel<T> {
        /// Walks every list and checks the wheel's invariants.
        fn check_invariants(&self) {
            let mut count = 0;
            for list in 0..=DUE {
                count += self.check_list(list);
            }
            assert_eq!(count, self.len(), "entries missing from the lists");
        }

        /// Checks one list's links and entries; returns its length.
        fn check_list(&self, list: usize) -> usize {
            let (mut prev, mut idx, mut count) = (NIL, self.lists[list].head, 0);
            while idx != NIL {
                let entry = &self.entries[idx as usize];
                assert_eq!((entry.list as usize, entry.prev), (list, prev));
                self.check_position(list, entry.deadline);
                (prev, idx, count) = (idx, entry.next, count + 1);
            }
            assert_eq!(self.lists[list].tail, prev);
            if list < DUE {
                let bit = self.occupied[list / SLOTS] >> (list % SLOTS) & 1;
                assert_eq!(bit == 1, count > 0, "occupancy bit of list {list}");
            }
            count
        }

        /// Checks that a timer with `deadline` belongs in `list`.
        fn check_position(&self, list: usize, deadline: u64) {
            if list == DUE {
                assert!(deadline <= self.elapsed && deadline >= self.due_min);
                return;
            }
            let (level, slot) = (list / SLOTS, list % SLOTS);
            assert_eq!(slot_of(deadline, level), slot);
            let start = self.slot_start(level, slot);
            assert!(start > self.elapsed, "clock passed an occupied slot");
            let own_start = deadline & !(slot_width(level) - 1);
            if level == LEVELS - 1 {
                // Parked timers are whole turns of the top level early.
                assert!(start <= own_start);
                assert_eq!((own_start - start) % level_range(level), 0);
            } else {
                assert_eq!(start, own_start);
            }
        }

        fn slot_start(&self, level: usize, slot: usize) -> u64 {
            let level_start = self.elapsed & !(level_range(level) - 1);
            let start = level_start + slot as u64 * slot_width(level);
            if start <= self.elapsed {
                start + level_range(level)
            } else {
                start
            }
        }
    }

    /// xorshift64* — a tiny seeded PRNG, good enough for tests and benches.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// Uniform-ish in `0..n` (n > 0).
        fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }
    }

    /// Drains everything due at `now`.
    fn drain(wheel: &mut Wheel<u64>, now: u64) -> Vec<u64> {
        std::iter::from_fn(|| wheel.poll(now)).collect()
    }

    const BOUNDARIES: &[u64] = &[
        1,
        2,
        63,
        64,
        65,
        127,
        128,
        4095,
        4096,
        4097,
        262_143,
        262_144,
        262_145,
        16_777_215,
        16_777_216,
        16_777_217,
        86_400_000 + 1,
        (1 << 30) - 1,
        1 << 30,
        (1 << 30) + 1,
        (1 << 34) + 12_345,
    ];

    /// Inserts one timer `delta` after `start`, polls at a few coarse times
    /// and then at every ms around the deadline: it must fire exactly once, at
    /// the first poll with `now >= deadline`.
    fn check_fires_exactly_at(start: u64, delta: u64) {
        let deadline = start + delta;
        let mut wheel = Wheel::new(start);
        wheel.insert(deadline, deadline);
        for k in 1..8 {
            let now = start + delta * k / 8;
            if now + 3 < deadline {
                assert_eq!(wheel.poll(now), None, "early at {now}, {start}+{delta}");
                assert!(wheel.next_deadline().unwrap() <= deadline);
                wheel.check_invariants();
            }
        }
        for now in deadline.saturating_sub(3).max(start)..=deadline + 3 {
            let expected = (now == deadline).then_some(deadline);
            assert_eq!(wheel.poll(now), expected, "at {now}, {start}+{delta}");
            assert_eq!(wheel.poll(now), None);
        }
        assert!(wheel.is_empty() && wheel.next_deadline().is_none());
    }

    #[test]
    fn fires_at_first_poll_at_or_after_deadline_in_every_level() {
        let starts = [0, 1, 63, 4_000, 1_700_000_000_123, (1 << 36) - 5];
        for &start in &starts {
            for &delta in BOUNDARIES {
                check_fires_exactly_at(start, delta);
            }
        }
        // Absolute level boundaries too, from a clock that is not at zero.
        for &deadline in BOUNDARIES.iter().filter(|&&d| d > 10) {
            check_fires_exactly_at(7, deadline - 7);
        }
    }

    #[test]
    fn polling_every_ms_fires_each_timer_on_time() {
        let mut wheel = Wheel::new(0);
        for deadline in (1..10_000).step_by(7) {
            wheel.insert(deadline, deadline);
        }
        for now in 0..10_010 {
            for fired in drain(&mut wheel, now) {
                assert_eq!(fired, now);
            }
        }
        assert!(wheel.is_empty());
    }

    #[test]
    fn fires_in_deadline_order_across_levels() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut wheel = Wheel::new(1_000);
        let mut deadlines: Vec<u64> = BOUNDARIES.iter().map(|d| d + 1_000).collect();
        deadlines.extend((0..500).map(|_| 1_000 + rng.below(1 << 33)));
        for &d in &deadlines {
            wheel.insert(d, d);
        }
        wheel.check_invariants();
        let fired = drain(&mut wheel, u64::MAX >> 8);
        deadlines.sort_unstable();
        assert_eq!(fired, deadlines);
    }

    #[test]
    fn equal_deadlines_fire_in_insertion_order() {
        let mut wheel = Wheel::new(0);
        for (i, now) in [0, 100, 5_000, 9_990].into_iter().enumerate() {
            assert_eq!(wheel.poll(now), None);
            wheel.insert(10_000, i as u64);
        }
        assert_eq!(drain(&mut wheel, 10_000), [0, 1, 2, 3]);
    }

    #[test]
    fn cancel_from_every_level() {
        for (level, &delta) in [5, 100, 5_000, 300_000, 20_000_000, 2_000_000_000]
            .iter()
            .enumerate()
        {
            let mut wheel = Wheel::new(0);
            let id = wheel.insert(delta, delta);
            assert_eq!(wheel.entries[id.0 as usize].list as usize / SLOTS, level);
            assert_eq!(wheel.cancel(id), delta);
            assert_eq!(wheel.occupied, [0; LEVELS]);
            assert!(wheel.is_empty() && wheel.next_deadline().is_none());
            assert_eq!(wheel.poll(delta * 2), None);
            wheel.check_invariants();
        }
    }

    #[test]
    fn cancel_of_only_timer_in_slot_clears_occupancy() {
        let mut wheel = Wheel::new(0);
        let a = wheel.insert(5_000, 1); // level 2, slot 1 (starts at 4_096)
        let b = wheel.insert(10_000, 2); // level 2, slot 2 (starts at 8_192)
        let c = wheel.insert(10_001, 3); // same slot as `b`
        assert_eq!(wheel.next_deadline(), Some(4_096));
        assert_eq!(wheel.cancel(a), 1);
        assert_eq!(wheel.occupied[2], 1 << 2);
        assert_eq!(wheel.next_deadline(), Some(8_192));
        assert_eq!(wheel.cancel(c), 3);
        assert_eq!(wheel.occupied[2], 1 << 2, "slot still holds `b`");
        assert_eq!(wheel.cancel(b), 2);
        assert_eq!(wheel.occupied, [0; LEVELS]);
        assert_eq!(wheel.next_deadline(), None);
    }

    #[test]
    fn cancel_from_due_list() {
        let mut wheel = Wheel::new(100);
        let a = wheel.insert(50, 1);
        wheel.insert(100, 2);
        assert_eq!(wheel.next_deadline(), Some(50));
        assert_eq!(wheel.cancel(a), 1);
        assert_eq!(wheel.poll(100), Some(2));
        assert_eq!(wheel.next_deadline(), None);
    }

    #[test]
    fn far_future_deadline_fires_after_big_jumps() {
        for start in [0, 1_700_000_000_123] {
            let deadline = start + (1 << 35);
            let mut wheel = Wheel::new(start);
            wheel.insert(deadline, 7);
            for step in [1 << 33, 1 << 34, (1 << 35) - 1] {
                assert_eq!(wheel.poll(start + step), None);
                assert!(wheel.next_deadline().unwrap() <= deadline);
                wheel.check_invariants();
            }
            assert_eq!(wheel.poll(deadline), Some(7));
            assert!(wheel.is_empty());
        }
    }

    #[test]
    fn top_level_wraps_around() {
        // The clock is in the middle of top-level slot 0; the farthest timer
        // lands in that same slot, one turn later, and must fire last.
        let start = 1 << 29;
        let mut wheel = Wheel::new(start);
        let far = start + MAX_AHEAD_MS;
        let near = start + (1 << 30);
        wheel.insert(far, far);
        wheel.insert(near, near);
        wheel.check_invariants();
        assert_eq!(wheel.next_deadline(), Some(1 << 30));
        assert_eq!(drain(&mut wheel, far - 1), [near]);
        wheel.check_invariants();
        assert_eq!(drain(&mut wheel, far), [far]);
    }

    #[test]
    fn accepts_deadlines_up_to_max_ahead() {
        let mut wheel = Wheel::new(12_345);
        wheel.insert(12_345 + MAX_AHEAD_MS, 1);
        wheel.insert(wheel.max_deadline(), 2);
        assert_eq!(drain(&mut wheel, u64::MAX >> 4), [1, 2]);
    }

    #[test]
    fn parks_deadlines_beyond_range_until_they_are_in_it() {
        for start in [0, 1, 1_700_000_000_123] {
            let wheel: Wheel<u64> = Wheel::new(start);
            let just_beyond = wheel.max_deadline() + 1 - start;
            for delta in [just_beyond, 3 * MAX_AHEAD_MS + 12_345, 1 << 40] {
                check_fires_exactly_at(start, delta);
            }
        }
    }

    #[test]
    fn parked_and_placed_timers_fire_in_deadline_order() {
        let mut wheel = Wheel::new(5);
        let deadlines = [
            (1 << 40) + 7,
            MAX_AHEAD_MS + 3,
            100,
            5 * MAX_AHEAD_MS,
            MAX_AHEAD_MS - 1,
            (1 << 40) + 6,
        ];
        for d in deadlines {
            wheel.insert(d, d);
        }
        wheel.check_invariants();
        let mut fired = Vec::new();
        for now in [MAX_AHEAD_MS, 3 * MAX_AHEAD_MS, 1 << 39, 1 << 41] {
            fired.extend(drain(&mut wheel, now));
            wheel.check_invariants();
        }
        let mut sorted = deadlines.to_vec();
        sorted.sort_unstable();
        assert_eq!(fired, sorted);
    }

    #[test]
    fn the_latest_deadline_is_taken_too() {
        let mut wheel = Wheel::new(0);
        let id = wheel.insert(u64::MAX, 1);
        wheel.insert(10, 2);
        wheel.check_invariants();
        assert_eq!(drain(&mut wheel, 10), [2]);
        assert!(wheel.next_deadline().is_some_and(|d| d < u64::MAX));
        assert_eq!(wheel.cancel(id), 1);
        assert!(wheel.is_empty());
    }

    #[test]
    fn past_deadline_fires_at_next_poll() {
        let mut wheel = Wheel::new(1_000);
        wheel.insert(10, 1);
        wheel.insert(1_000, 2);
        wheel.insert(1_001, 3);
        assert!(wheel.next_deadline().unwrap() <= 10);
        assert_eq!(drain(&mut wheel, 1_000), [1, 2]);
        assert_eq!(wheel.next_deadline(), Some(1_001));
    }

    #[test]
    fn time_going_backwards_is_harmless() {
        let mut wheel = Wheel::new(0);
        wheel.insert(500, 1);
        wheel.insert(2_000, 2);
        assert_eq!(drain(&mut wheel, 1_000), [1]);
        assert_eq!(wheel.poll(10), None);
        wheel.insert(900, 3); // in the past of the wheel's clock (1_000)
        assert_eq!(drain(&mut wheel, 5), [3]);
        assert_eq!(wheel.poll(1_999), None);
        assert_eq!(wheel.poll(0), None);
        assert_eq!(wheel.poll(2_000), Some(2));
        wheel.check_invariants();
    }

    #[test]
    fn no_allocation_growth_after_warm_up() {
        let mut rng = Rng(42);
        let mut wheel = Wheel::with_capacity(0, 1_000);
        let mut ids = Vec::with_capacity(1_000);
        let mut capacity = None;
        for round in 0..50 {
            ids.extend((0..1_000).map(|i| wheel.insert(rng.below(1 << 30), i)));
            while !ids.is_empty() {
                let i = rng.below(ids.len() as u64) as usize;
                wheel.cancel(ids.swap_remove(i));
            }
            assert_eq!(wheel.occupied, [0; LEVELS]);
            let cap = *capacity.get_or_insert(wheel.entries.capacity());
            assert_eq!(wheel.entries.capacity(), cap, "grew in round {round}");
        }
    }

    /// The reference model: live timers by `(deadline, value)`, plus their ids.
    #[derive(Default)]
    struct Model {
        live: BTreeSet<(u64, u64)>,
        ids: Vec<(TimerId, u64, u64)>,
    }

    /// A random delay with a mix of scales, so every level gets traffic,
    /// and now and then one beyond the range (parked).
    fn random_delay(rng: &mut Rng) -> u64 {
        match rng.below(100) {
            0..50 => rng.below(100),
            50..80 => rng.below(10_000),
            80..95 => rng.below(1 << 24),
            95..99 => rng.below(1 << 34),
            _ => rng.below(FAR),
        }
    }

    /// The longest delay `random_delay` gives: four turns of the top level.
    const FAR: u64 = 4 * MAX_AHEAD_MS;

    #[test]
    fn random_operations_match_reference_model() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut now = 1_700_000_000_000;
        let mut wheel = Wheel::new(now);
        let mut model = Model::default();
        for step in 0..10_000u64 {
            match rng.below(10) {
                0..5 => model_insert(&mut rng, &mut wheel, &mut model, now, step),
                5..7 => model_cancel(&mut rng, &mut wheel, &mut model),
                _ => {
                    now += random_delay(&mut rng) / 4;
                    model_poll(&mut wheel, &mut model, now);
                }
            }
            check_against_model(&wheel, &model);
            if step % 100 == 0 {
                wheel.check_invariants();
            }
        }
        model_poll(&mut wheel, &mut model, now + FAR);
        assert!(wheel.is_empty());
    }

    fn model_insert(rng: &mut Rng, wheel: &mut Wheel<u64>, model: &mut Model, now: u64, v: u64) {
        // One insert in ten is in the past.
        let deadline = match rng.below(10) {
            0 => now - rng.below(1_000),
            _ => now + random_delay(rng),
        };
        let id = wheel.insert(deadline, v);
        model.live.insert((deadline, v));
        model.ids.push((id, deadline, v));
    }

    fn model_cancel(rng: &mut Rng, wheel: &mut Wheel<u64>, model: &mut Model) {
        if model.ids.is_empty() {
            return;
        }
        let i = rng.below(model.ids.len() as u64) as usize;
        let (id, deadline, v) = model.ids.swap_remove(i);
        assert_eq!(wheel.cancel(id), v);
        assert!(model.live.remove(&(deadline, v)));
    }

    /// Polls until `None` and checks that exactly the timers due at `now`
    /// fired, in deadline order apart from the ones inserted already due.
    fn model_poll(wheel: &mut Wheel<u64>, model: &mut Model, now: u64) {
        let before = wheel.elapsed;
        let fired = drain(wheel, now);
        let mut expected: Vec<(u64, u64)> = model.live.range(..(now + 1, 0)).copied().collect();
        model.live.retain(|&(d, _)| d > now);
        model.ids.retain(|&(_, d, _)| d > now);
        let deadline_of = |v: &u64| expected.iter().find(|e| e.1 == *v).unwrap().0;
        let on_time: Vec<u64> = fired
            .iter()
            .map(deadline_of)
            .filter(|&d| d > before)
            .collect();
        assert!(on_time.is_sorted(), "out of order at {now}");
        let mut fired: Vec<(u64, u64)> = fired.iter().map(|v| (deadline_of(v), *v)).collect();
        fired.sort_unstable();
        expected.sort_unstable();
        assert_eq!(fired, expected, "wrong set fired at {now}");
    }

    fn check_against_model(wheel: &Wheel<u64>, model: &Model) {
        assert_eq!(wheel.len(), model.live.len());
        let earliest = model.live.first().map(|&(d, _)| d);
        match (wheel.next_deadline(), earliest) {
            (Some(next), Some(earliest)) => assert!(next <= earliest, "{next} > {earliest}"),
            (next, earliest) => assert_eq!(next, earliest),
        }
    }
}
