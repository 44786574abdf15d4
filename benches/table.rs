//! Benchmarks of the lock table alone (`ringlock::engine::table::Table`):
//! no parsing, no answers, no timers beyond the one each grant carries.
//!
//! - `acquire`: a free key becomes held (`find_or_insert` + holder set), in a
//!   table that already holds 10 000 other locks. Only the acquires are
//!   timed; the releases that reset the table between batches are not.
//! - `release`: the holder of a held key lets go (`find` + holder cleared +
//!   `remove_if_idle`), the reverse; only the releases are timed.
//! - `handoff`: one key, 64 queued waiters: the head waiter is answered and
//!   becomes the holder (`head` + `finish`), and the old holder queues again
//!   at the tail (`enqueue`), which is the table's part of a FIFO hand-off.
//!
//! Each sets its throughput, so criterion reports operations per second.
//! Set-up is small enough for the one-iteration run of `cargo test
//! --all-targets`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringlock::engine::ConnId;
use ringlock::engine::table::{Grant, Table};
use ringlock::engine::wheel::{TimerId, Wheel};

/// Keys acquired and released per timed batch.
const BATCH: usize = 1024;
/// Other live locks in the table.
const BACKGROUND: usize = 10_000;

fn keys(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}-{i:06}").into_bytes())
        .collect()
}

/// A grant: its timer id comes from a real wheel (the table only stores it).
fn grant(timer: TimerId, token: u64) -> Grant {
    Grant {
        token,
        expires_ms: 30_000,
        timer,
        holder: ringlock::engine::table::HolderId::NIL,
    }
}

/// A table holding `BACKGROUND` locks, and a timer id for grants.
fn table_with_background() -> (Table, TimerId) {
    let mut wheel: Wheel<u32> = Wheel::new(0);
    let timer = wheel.insert(30_000, 0);
    let mut table = Table::new();
    for (i, key) in keys("background", BACKGROUND).iter().enumerate() {
        let lock = table.find_or_insert(key);
        table.lock_mut(lock).holder = Some(grant(timer, i as u64 + 1));
    }
    (table, timer)
}

fn acquire(table: &mut Table, key: &[u8], timer: TimerId, token: u64) {
    let lock = table.find_or_insert(key);
    let l = table.lock_mut(lock);
    assert!(l.holder.is_none());
    l.holder = Some(grant(timer, token));
}

fn release(table: &mut Table, key: &[u8]) {
    let lock = table.find(key).expect("held");
    table.lock_mut(lock).holder = None;
    assert!(table.remove_if_idle(lock));
}

fn bench_acquire_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("table");
    group.throughput(Throughput::Elements(BATCH as u64));
    let batch = keys("bench", BATCH);

    group.bench_function("acquire", |b| {
        let (mut table, timer) = table_with_background();
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                for (i, key) in batch.iter().enumerate() {
                    acquire(&mut table, black_box(key), timer, i as u64);
                }
                timed += start.elapsed();
                for key in &batch {
                    release(&mut table, key);
                }
            }
            timed
        });
        assert_eq!(table.len(), BACKGROUND);
    });

    group.bench_function("release", |b| {
        let (mut table, timer) = table_with_background();
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                for (i, key) in batch.iter().enumerate() {
                    acquire(&mut table, key, timer, i as u64);
                }
                let start = Instant::now();
                for key in &batch {
                    release(&mut table, black_box(key));
                }
                timed += start.elapsed();
            }
            timed
        });
        assert_eq!(table.len(), BACKGROUND);
    });
    group.finish();
}

const WAITERS: u32 = 64;

fn bench_handoff(c: &mut Criterion) {
    let mut group = c.benchmark_group("table");
    group.throughput(Throughput::Elements(1));
    group.bench_function("handoff_64_waiters", |b| {
        let (mut table, timer) = table_with_background();
        let lock = table.find_or_insert(b"hot");
        table.lock_mut(lock).holder = Some(grant(timer, 1));
        let mut holder = ConnId::new(WAITERS); // connection 64 holds, 0..64 wait
        for conn in 0..WAITERS {
            table.enqueue(lock, ConnId::new(conn), 30_000, 0);
        }
        let mut token = 1;
        b.iter(|| {
            // The holder releases: the head waiter is granted...
            let w = table.head(lock).expect("a waiter");
            let waiter = table.finish(w);
            token += 1;
            table.lock_mut(lock).holder = Some(grant(timer, token));
            // ...and the old holder queues again at the tail.
            table.enqueue(lock, black_box(holder), 30_000, 0);
            holder = waiter.conn;
        });
        assert_eq!(table.waiter_count(), WAITERS as usize);
        table.check_invariants();
    });
    group.finish();
}

criterion_group!(benches, bench_acquire_release, bench_handoff);
criterion_main!(benches);
