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
//! The top level wraps around: a deadline up to `MAX_AHEAD_MS` ahead may fall
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
    /// one more than `MAX_AHEAD_MS` past the wheel's current time (the last
    /// `now` given to `poll`, or the start time) is parked until it is in
    /// range (see the module docs).
    #[inline]
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
    #[inline]
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

    /// The latest deadline `insert` places without parking: `MAX_AHEAD_MS`
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
    #[inline]
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
    #[inline]
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

    #[inline]
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
#[path = "wheel_tests.rs"]
mod tests;
