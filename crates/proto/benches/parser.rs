//! Wire-format benchmarks: parsing pipelined requests, encoding answers.
//!
//! `cargo bench --bench parser` (or `-- --quick`; `-- --test` runs each
//! routine once as a smoke test).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringlock_proto::{Answer, parse_request};

const BUF_SIZE: usize = 64 * 1024;
const ANSWERS: usize = 1024;

/// A 16-byte key: `key-` and 12 digits.
fn key(i: usize) -> String {
    format!("key-{:012}", i % 100_000)
}

/// About 64 KiB of whole request lines, mixed A/R/N/S, 16-byte keys, the
/// numbers in the forms clients send. Returns the buffer and its line count.
fn pipelined_requests() -> (Vec<u8>, u64) {
    let mut buf = Vec::with_capacity(BUF_SIZE);
    let mut lines = 0;
    for i in 0.. {
        let token = 1_790_000_000_000_000_000u64 + i as u64 * 7_919;
        let line = match i % 8 {
            0 | 4 => format!("A {} 30 0\n", key(i)),
            1 => format!("A {} 2.5 10.125\r\n", key(i)),
            2 | 5 => format!("R {} {token}\n", key(i)),
            3 | 6 => format!("N {} {token} 30\n", key(i)),
            _ => "S\n".to_string(),
        };
        if buf.len() + line.len() > BUF_SIZE {
            break;
        }
        buf.extend_from_slice(line.as_bytes());
        lines += 1;
    }
    (buf, lines)
}

/// Parses every line of `buf`, as a connection's read loop does.
fn parse_all(buf: &[u8]) -> u64 {
    let mut rest = buf;
    let mut n = 0;
    while let Ok(Some((req, used))) = parse_request(rest) {
        black_box(req);
        rest = &rest[used..];
        n += 1;
    }
    n
}

fn parse(c: &mut Criterion) {
    let (buf, lines) = pipelined_requests();
    assert_eq!(
        parse_all(&buf),
        lines,
        "every line of the bench input parses"
    );
    let mut group = c.benchmark_group("parse");
    group.throughput(Throughput::Bytes(buf.len() as u64));
    group.bench_function("pipelined_64KiB/bytes", |b| {
        b.iter(|| parse_all(black_box(&buf)))
    });
    group.throughput(Throughput::Elements(lines));
    group.bench_function("pipelined_64KiB/requests", |b| {
        b.iter(|| parse_all(black_box(&buf)))
    });
    group.finish();
}

fn encode(c: &mut Criterion) {
    let keys: Vec<String> = (0..ANSWERS).map(key).collect();
    let granted: Vec<Answer<'_>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| Answer::Granted {
            key: k.as_bytes(),
            // 19 digits, like a nanosecond-clock fencing token.
            token: 1_790_000_000_000_000_000 + i as u64 * 7_919,
        })
        .collect();
    let released: Vec<Answer<'_>> = keys
        .iter()
        .map(|k| Answer::Released {
            key: k.as_bytes(),
            ok: true,
        })
        .collect();

    let mut group = c.benchmark_group("encode");
    for (name, answers) in [
        ("granted_19_digit_token", &granted),
        ("released", &released),
    ] {
        let mut out = Vec::with_capacity(64 * ANSWERS);
        for a in answers.iter() {
            a.encode(&mut out);
        }
        let bytes = out.len() as u64;
        // Into a reused buffer, like a connection's output buffer.
        let run = |out: &mut Vec<u8>| {
            out.clear();
            for a in black_box(answers.as_slice()) {
                a.encode(out);
            }
            black_box(out.len())
        };
        group.throughput(Throughput::Elements(ANSWERS as u64));
        group.bench_function(format!("{name}/answers"), |b| b.iter(|| run(&mut out)));
        group.throughput(Throughput::Bytes(bytes));
        group.bench_function(format!("{name}/bytes"), |b| b.iter(|| run(&mut out)));
    }
    group.finish();
}

criterion_group!(benches, parse, encode);
criterion_main!(benches);
