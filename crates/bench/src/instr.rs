//! The engine's hot paths, run a fixed number of times for callgrind
//! (`scripts/instructions.sh`).
//!
//! Each case prepares its input and warms the engine up (tables and slabs at
//! their steady-state size) outside the measured function, then calls one
//! `#[unsafe(no_mangle)]` function, `ringlock_instr_<case>`, which callgrind
//! is told to count alone (`--toggle-collect`). The count divided by the
//! iterations is the case's instructions per operation. Clocks and tokens
//! are fixed, so the only run-to-run variation left is the lock table's
//! randomly seeded hash (probe lengths), a few instructions at most.

mod cluster;

use std::hint::black_box;
use std::process::ExitCode;

use ringlock::engine::{ConnId, Engine, Now};
use ringlock::io::Session;
use ringlock::node::{Node, NodeConfig};
use ringlock::outbox::Outbox;
use ringlock_proto::{Request, parse_request};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Case {
    /// Request bytes in, answer bytes out: `A` + `R` through `Session::feed`
    /// (parse, engine, encode), 64 keys, 16 cycles per read. Per cycle.
    Cycle,
    /// `Engine::handle` of a parsed acquire and release (engine + encode,
    /// no parsing). Per cycle.
    EngineCycle,
    /// `engine-cycle` with shared acquires (`G`) for `A`. Per cycle.
    SharedCycle,
    /// `engine-cycle` with semaphore acquires (`C`, 8 permits) for `A`.
    /// Per cycle.
    PermitCycle,
    /// One key, 64 connections queued: release by the holder (which grants
    /// the head waiter) and its re-acquire (queued at the tail). Per hand-off.
    Handoff,
    /// `parse_request` of a mix of `A`, `R`, `N` and `S` lines. Per line.
    Parse,
    /// Leases running out in `Engine::tick`, 10 000 held locks. Per expiry.
    Expire,
    /// `cycle` on an active with two synced followers, plus the turn's
    /// `Node::take_dirty` that writes the replication to their links. Per
    /// cycle.
    Replicate,
    /// A follower applying the active's replication of `cycle`s (`P G` and
    /// `P X` lines through `Session::feed`). Per cycle.
    Apply,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct InstrArgs {
    #[arg(value_enum)]
    pub case: Case,
    /// Operations measured.
    #[arg(long, default_value_t = 20_000)]
    pub iters: u64,
}

const UNIX_NS: u64 = 1_700_000_000_000_000_000;
const KEYS: u64 = 64;

fn now(ms: u64) -> Now {
    Now {
        ms,
        us: ms * 1000,
        unix_ns: UNIX_NS,
    }
}

fn key(i: u64) -> String {
    format!("instr-key-{:04}", i % KEYS)
}

pub(crate) fn main(args: InstrArgs) -> crate::Result<ExitCode> {
    let n = args.iters;
    let ops = match args.case {
        Case::Cycle => cycle(n),
        Case::EngineCycle => engine_cycle(n),
        Case::SharedCycle => kind_cycle(n, false),
        Case::PermitCycle => kind_cycle(n, true),
        Case::Handoff => handoff(n),
        Case::Parse => parse(n),
        Case::Expire => expire(n),
        Case::Replicate => cluster::replicate(n),
        Case::Apply => cluster::apply(n),
    };
    println!("{ops}");
    Ok(ExitCode::SUCCESS)
}

/// Session input for `cycles` acquire/release cycles starting at `first`,
/// cut into reads of 16 cycles, releasing with the tokens the grants get
/// when the first one's is `first_token` and each takes the last one plus
/// `step` (a single node's first token is `UNIX_NS`, its step 1; node `i`
/// of a cluster of `n` steps by `n`, to the next token of its residue).
fn cycle_reads(first: u64, cycles: u64, first_token: u64, step: u64) -> Vec<Vec<u8>> {
    let mut reads = Vec::new();
    let mut i = first;
    while i < first + cycles {
        let mut read = Vec::new();
        let end = (i + 16).min(first + cycles);
        for j in i..end {
            read.extend_from_slice(format!("A {} 30 0\n", key(j)).as_bytes());
        }
        for j in i..end {
            let token = first_token + (j - first) * step;
            read.extend_from_slice(format!("R {} {token}\n", key(j)).as_bytes());
        }
        reads.push(read);
        i = end;
    }
    reads
}

/// The address of the cases' client connection, as a loop tells the node
/// of every TCP client: grants name it as their holder (and replicate it).
const CLIENT_ADDR: std::net::SocketAddr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::new(127, 0, 0, 1),
    50_001,
));

fn cycle(n: u64) -> u64 {
    let config = NodeConfig {
        advertise: "127.0.0.1:7171".into(),
        cluster: None,
        max_locks: ringlock::engine::DEFAULT_MAX_LOCKS,
    };
    let mut node = Node::new(now(1), config);
    node.open(ConnId::new(0));
    node.set_remote(ConnId::new(0), CLIENT_ADDR);
    let mut session = Session::new();
    let warm = 4 * KEYS;
    for read in cycle_reads(0, warm, UNIX_NS, 1) {
        session.feed(&mut node, now(1), ConnId::new(0), &read);
        let out = node.output_mut(ConnId::new(0));
        assert!(!out.windows(3).any(|w| w == b" 0\n"), "a release failed");
        out.clear();
    }
    let reads = cycle_reads(warm, n, UNIX_NS + warm, 1);
    ringlock_instr_cycle(&mut node, &mut session, &reads);
    assert_eq!(node.engine().lock_count(), 0);
    n
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_cycle(node: &mut Node, session: &mut Session, reads: &[Vec<u8>]) {
    for read in reads {
        session.feed(node, now(1), ConnId::new(0), black_box(read));
        let out = node.output_mut(ConnId::new(0));
        black_box(out.len());
        out.clear();
    }
}

fn engine_cycle(n: u64) -> u64 {
    let mut engine = Engine::new(now(1), "127.0.0.1:7171");
    let mut out = Outbox::new();
    engine.open(ConnId::new(0), &mut out);
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let warm = 4 * KEYS;
    ringlock_instr_engine_cycle(&mut engine, &mut out, &keys, 0, warm);
    ringlock_instr_engine_cycle(&mut engine, &mut out, &keys, warm, n);
    assert_eq!(engine.lock_count(), 0);
    n
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_engine_cycle(
    engine: &mut Engine,
    out: &mut Outbox,
    keys: &[String],
    first: u64,
    n: u64,
) {
    for i in first..first + n {
        let key = keys[(i % KEYS) as usize].as_bytes();
        let acquire = Request::Acquire {
            key,
            lease_ms: 30_000,
            wait_ms: 0,
        };
        let _ = engine.handle(now(1), ConnId::new(0), black_box(acquire), out);
        let release = Request::Release {
            key,
            token: UNIX_NS + i,
        };
        let _ = engine.handle(now(1), ConnId::new(0), black_box(release), out);
        if i % 16 == 15 {
            out.output_mut(ConnId::new(0)).clear();
        }
    }
    out.output_mut(ConnId::new(0)).clear();
}

/// `engine_cycle` with `G` (or `C key 8`, `permit`) for `A`: each grant is
/// a shared grant (permit) of its own, released with its token.
fn kind_cycle(n: u64, permit: bool) -> u64 {
    let mut engine = Engine::new(now(1), "127.0.0.1:7171");
    let mut out = Outbox::new();
    engine.open(ConnId::new(0), &mut out);
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let warm = 4 * KEYS;
    kind_cycles(&mut engine, &mut out, &keys, permit, 0, warm);
    let answers = out.output_mut(ConnId::new(0));
    assert!(
        !answers.is_empty() && !answers.windows(3).any(|w| w == b" 0\n"),
        "a release failed"
    );
    if permit {
        ringlock_instr_permit_cycle(&mut engine, &mut out, &keys, warm, n);
    } else {
        ringlock_instr_shared_cycle(&mut engine, &mut out, &keys, warm, n);
    }
    assert_eq!(engine.lock_count(), 0, "every grant was released");
    assert_eq!(engine.member_count(), 0);
    n
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_shared_cycle(
    engine: &mut Engine,
    out: &mut Outbox,
    keys: &[String],
    first: u64,
    n: u64,
) {
    kind_cycles(engine, out, keys, false, first, n);
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_permit_cycle(
    engine: &mut Engine,
    out: &mut Outbox,
    keys: &[String],
    first: u64,
    n: u64,
) {
    kind_cycles(engine, out, keys, true, first, n);
}

/// `n` cycles of `G` (`C key 8`: `permit`) and `R`, from `first` on.
#[inline(never)]
fn kind_cycles(
    engine: &mut Engine,
    out: &mut Outbox,
    keys: &[String],
    permit: bool,
    first: u64,
    n: u64,
) {
    for i in first..first + n {
        let key = keys[(i % KEYS) as usize].as_bytes();
        let acquire = if permit {
            Request::Permit {
                key,
                limit: 8,
                lease_ms: 30_000,
                wait_ms: 0,
            }
        } else {
            Request::Shared {
                key,
                lease_ms: 30_000,
                wait_ms: 0,
            }
        };
        let _ = engine.handle(now(1), ConnId::new(0), black_box(acquire), out);
        let release = Request::Release {
            key,
            token: UNIX_NS + i,
        };
        let _ = engine.handle(now(1), ConnId::new(0), black_box(release), out);
        if i % 16 == 15 && i + 1 < first + n {
            out.output_mut(ConnId::new(0)).clear();
        }
    }
}

const WAITERS: u32 = 64;

fn handoff(n: u64) -> u64 {
    let mut engine = Engine::new(now(1), "127.0.0.1:7171");
    let mut out = Outbox::new();
    let acquire = Request::Acquire {
        key: b"hot",
        lease_ms: 30_000,
        wait_ms: 0,
    };
    for conn in 0..WAITERS {
        engine.open(ConnId::new(conn), &mut out);
        engine
            .handle(now(1), ConnId::new(conn), acquire, &mut out)
            .expect("queued");
    }
    let mut dirty = Vec::new();
    let warm = 4 * u64::from(WAITERS);
    ringlock_instr_handoff(&mut engine, &mut out, &mut dirty, 0, warm);
    ringlock_instr_handoff(&mut engine, &mut out, &mut dirty, warm, n);
    // FIFO: grant i went to connection i % 64, so the holder now is n % 64.
    let answers = out.output_mut(ConnId::new(((warm + n) % u64::from(WAITERS)) as u32));
    assert!(answers.is_empty(), "outputs are cleared");
    n
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_handoff(
    engine: &mut Engine,
    out: &mut Outbox,
    dirty: &mut Vec<ConnId>,
    first: u64,
    n: u64,
) {
    let acquire = Request::Acquire {
        key: b"hot",
        lease_ms: 30_000,
        wait_ms: 0,
    };
    for i in first..first + n {
        // Grant i went to connection i % 64 (FIFO) with token UNIX_NS + i.
        let holder = (i % u64::from(WAITERS)) as u32;
        let release = Request::Release {
            key: b"hot",
            token: UNIX_NS + i,
        };
        let _ = engine.handle(now(1), ConnId::new(holder), black_box(release), out);
        let _ = engine.handle(now(1), ConnId::new(holder), black_box(acquire), out);
        out.take_dirty(dirty);
        for &c in dirty.iter() {
            out.output_mut(c).clear();
        }
    }
}

fn parse(n: u64) -> u64 {
    let mut buf = Vec::new();
    for i in 0..256u64 {
        let line = match i % 4 {
            0 => format!("A {} 30 0\n", key(i)),
            1 => format!("R {} {}\n", key(i), UNIX_NS + i),
            2 => format!("N {} {} 12.5\n", key(i), UNIX_NS + i),
            _ => "S\n".to_string(),
        };
        buf.extend_from_slice(line.as_bytes());
    }
    let rounds = n.div_ceil(256);
    black_box(ringlock_instr_parse(&buf, 4));
    black_box(ringlock_instr_parse(&buf, rounds));
    rounds * 256
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_parse(buf: &[u8], rounds: u64) -> u64 {
    let mut lines = 0;
    for _ in 0..rounds {
        let mut rest = black_box(buf);
        while let Ok(Some((request, used))) = parse_request(rest) {
            black_box(request);
            rest = &rest[used..];
            lines += 1;
        }
    }
    lines
}

fn expire(n: u64) -> u64 {
    let mut engine = Engine::new(now(1), "127.0.0.1:7171");
    let mut out = Outbox::new();
    engine.open(ConnId::new(0), &mut out);
    let locks = 10_000.min(n);
    let rounds = n.div_ceil(locks);
    let keys: Vec<String> = (0..locks).map(|i| format!("expire-key-{i:06}")).collect();
    let mut t = 1;
    // One warm-up round, then the measured ones; each holds `locks` leases
    // of 1 s, granted over 1 s, and ticks through their expiry in 1 ms steps.
    for round in 0..=rounds {
        for (i, k) in keys.iter().enumerate() {
            let ms = t + (i as u64 * 1000 / locks);
            let acquire = Request::Acquire {
                key: k.as_bytes(),
                lease_ms: 1_000,
                wait_ms: 0,
            };
            engine
                .handle(now(ms), ConnId::new(0), acquire, &mut out)
                .expect("granted");
        }
        out.output_mut(ConnId::new(0)).clear();
        t += 1000;
        if round == 0 {
            t = ringlock_instr_expire_warm(&mut engine, &mut out, t);
        } else {
            t = ringlock_instr_expire(&mut engine, &mut out, t);
        }
        assert_eq!(engine.lock_count(), 0);
    }
    rounds * locks
}

/// Ticks 1 ms at a time until every lease ran out; returns the clock.
fn tick_until_empty(engine: &mut Engine, out: &mut Outbox, mut t: u64) -> u64 {
    while engine.lock_count() > 0 {
        engine.tick(black_box(now(t)), out);
        t += 1;
    }
    t
}

#[inline(never)]
fn ringlock_instr_expire_warm(engine: &mut Engine, out: &mut Outbox, t: u64) -> u64 {
    tick_until_empty(engine, out, t)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub(crate) fn ringlock_instr_expire(engine: &mut Engine, out: &mut Outbox, t: u64) -> u64 {
    tick_until_empty(engine, out, t)
}
