//! Tests of [`super`] (wheel.rs), kept apart so that the module reads on its own.

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
