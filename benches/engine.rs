//! In-process engine benchmarks: whole request lines through the session
//! (parse + engine + encode), no sockets.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringlock::engine::{ConnId, Now};
use ringlock::io::Session;
use ringlock::node::{Node, NodeConfig};

const KEYS: usize = 1024;

fn now() -> Now {
    Now {
        ms: 1,
        us: 1_000,
        unix_ns: 1_700_000_000_000_000_000,
    }
}

fn node() -> Node {
    Node::new(
        now(),
        NodeConfig {
            advertise: "127.0.0.1:7171".into(),
            cluster: None,
            max_locks: ringlock::engine::DEFAULT_MAX_LOCKS,
        },
    )
}

/// One acquire + release cycle per key, uncontended: the request lines are
/// prepared up front, tokens are read back from the engine's answers.
fn uncontended_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(KEYS as u64));
    let keys: Vec<String> = (0..KEYS).map(|i| format!("bench-key-{i:06}")).collect();
    let acquires: Vec<u8> = keys
        .iter()
        .flat_map(|k| format!("A {k} 30 0\n").into_bytes())
        .collect();
    group.bench_function("acquire_release_cycle", |b| {
        let mut engine = node();
        engine.open(ConnId::new(0));
        let mut session = Session::new();
        let mut releases = Vec::with_capacity(acquires.len() * 2);
        b.iter(|| {
            session.feed(&mut engine, now(), ConnId::new(0), black_box(&acquires));
            // Turn "A key token\n" answers into "R key token\n" requests.
            let out = engine.output_mut(ConnId::new(0));
            releases.clear();
            releases.extend_from_slice(out);
            out.clear();
            for line in releases.split_mut(|&b| b == b'\n') {
                if let Some(op) = line.first_mut() {
                    *op = b'R';
                }
            }
            session.feed(&mut engine, now(), ConnId::new(0), &releases);
            let out = engine.output_mut(ConnId::new(0));
            black_box(out.len());
            out.clear();
        });
        assert_eq!(engine.engine().lock_count(), 0);
    });
    group.finish();
}

/// FIFO hand-off: one key, 64 connections waiting; each release grants the
/// next waiter, who re-queues.
fn contended_handoff(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(1));
    group.bench_function("handoff_64_waiters", |b| {
        let mut engine = node();
        let mut sessions: Vec<Session> = (0..64).map(|_| Session::new()).collect();
        for conn in 0..64u32 {
            engine.open(ConnId::new(conn));
            sessions[conn as usize].feed(&mut engine, now(), ConnId::new(conn), b"A hot 30 0\n");
        }
        let mut holder = ConnId::new(0);
        let mut dirty = Vec::new();
        let mut line = Vec::with_capacity(64);
        b.iter(|| {
            // The holder's grant is the last line of its output.
            let out = engine.output_mut(holder);
            let start = out[..out.len() - 1]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            line.clear();
            line.extend_from_slice(&out[start..]);
            out.clear();
            line[0] = b'R';
            line.extend_from_slice(b"A hot 30 0\n");
            sessions[holder.index()].feed(&mut engine, now(), holder, &line);
            engine.output_mut(holder).clear();
            engine.take_dirty(now(), &mut dirty);
            holder = dirty
                .iter()
                .copied()
                .find(|&c| engine.output_mut(c).starts_with(b"A "))
                .expect("someone was granted");
            black_box(holder);
        });
    });
    group.finish();
}

criterion_group!(benches, uncontended_cycle, contended_handoff);
criterion_main!(benches);
