//! Benchmarks of the hierarchical timing wheel (`ringlock::engine::wheel`).
//!
//! - `insert_cancel`: one insert and one cancel in a wheel that already holds
//!   100_000 timers spread over the next 60 s.
//! - `insert_expire`: 10_000 timers inserted up to 100 s ahead, then the clock
//!   advanced by 100 s in 100 ms ticks, polling each tick until all fired.
//! - `leases`: 10_000 live leases with TTLs of 5..15 s; each iteration ticks
//!   the clock 1 ms at a time until one lease expires, then renews it.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringlock::engine::wheel::Wheel;

/// A realistic clock value (ms since the epoch), not aligned to any level.
const START_MS: u64 = 1_700_000_000_123;

/// xorshift64*: a tiny seeded PRNG, so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

fn insert_cancel(c: &mut Criterion) {
    let mut rng = Rng(1);
    let mut wheel = Wheel::with_capacity(START_MS, 100_001);
    for i in 0..100_000u64 {
        wheel.insert(START_MS + rng.range(1, 60_000), i);
    }
    let mut group = c.benchmark_group("wheel");
    group.throughput(Throughput::Elements(1));
    group.bench_function("insert_cancel/100k_live", |b| {
        b.iter(|| {
            let id = wheel.insert(black_box(START_MS + rng.range(1, 60_000)), 0);
            black_box(wheel.cancel(id))
        })
    });
    group.finish();
}

fn insert_expire(c: &mut Criterion) {
    const TIMERS: u64 = 10_000;
    const TICK_MS: u64 = 100;
    const AHEAD_MS: u64 = 100_000;
    let mut rng = Rng(2);
    let mut now = START_MS;
    let mut wheel = Wheel::with_capacity(now, TIMERS as usize);
    let mut group = c.benchmark_group("wheel");
    group.throughput(Throughput::Elements(TIMERS));
    group.bench_function("insert_expire/10k_within_100s", |b| {
        b.iter(|| {
            for i in 0..TIMERS {
                wheel.insert(now + rng.range(1, AHEAD_MS), i);
            }
            for _ in 0..AHEAD_MS / TICK_MS {
                now += TICK_MS;
                while let Some(v) = wheel.poll(black_box(now)) {
                    black_box(v);
                }
            }
            assert!(wheel.is_empty());
        })
    });
    group.finish();
}

fn leases(c: &mut Criterion) {
    const LEASES: u64 = 10_000;
    let mut rng = Rng(3);
    let mut now = START_MS;
    let mut wheel = Wheel::with_capacity(now, LEASES as usize);
    for i in 0..LEASES {
        wheel.insert(now + rng.range(1, 15_000), i);
    }
    let mut group = c.benchmark_group("wheel");
    group.throughput(Throughput::Elements(1));
    group.bench_function("leases/10k_live_renew_one", |b| {
        b.iter(|| {
            let lease = loop {
                match wheel.poll(black_box(now)) {
                    Some(lease) => break lease,
                    None => now += 1,
                }
            };
            wheel.insert(now + rng.range(5_000, 15_000), black_box(lease));
        })
    });
    group.finish();
}

criterion_group!(benches, insert_cancel, insert_expire, leases);
criterion_main!(benches);
