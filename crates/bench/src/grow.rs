//! `--mode grow`: does the server stall while its lock table grows?
//!
//! `--conns` connections fill the table: each pipelines `--pipeline`
//! acquires of distinct keys (`--key-len` bytes, lease `--lease`) and
//! sends the next as each grant comes back, until `--locks` locks are held
//! between them or `--duration` seconds have passed. Meanwhile one more
//! connection, the *probe*, runs acquire/release cycles on a key of its
//! own, one request at a time: its latencies (acquire, release, cycle,
//! round trip) are those of a client that happens to use the server while
//! the table grows, and a loop turn stalled by the growth shows in them.
//!
//! With `--stop-server-log FILE` (and `--server-pid`), the server is sent
//! SIGTERM once the fill is done, and its longest loop turn is read from
//! the line it prints when it stops (`stopped (longest loop turn
//! X ms)`), which FILE (its stderr) must receive.
//!
//! One thread, one mio loop, like the rest of the generator: send times are
//! taken just before the `write`, receive times just after the wait that
//! reported the answer. The generator's core is busy with the fill, so a
//! probe answer may wait for the generator's own turn: the probe's latency
//! is an upper bound of the server's part, the server's longest turn its
//! own measure.

use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::load::RunArgs;
use crate::stats::{Growth, Hists, RunResult};

/// Receive buffer per connection.
const RBUF: usize = 64 * 1024;
/// How long the server may take to stop and print its longest turn.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    rlen: usize,
    out: Vec<u8>,
    out_pos: usize,
    /// Filler: the next key index to acquire and the end of its range.
    next: u64,
    end: u64,
    /// Filler: acquires in flight.
    in_flight: u32,
}

/// The probe's state: what it waits for, since when.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    Acquiring { first: u64, sent: u64 },
    Releasing { first: u64, sent: u64 },
    Done,
}

#[expect(clippy::too_many_lines)]
pub(crate) fn run(args: &RunArgs) -> crate::Result<RunResult> {
    if args.conns == 0 || args.pipeline == 0 {
        return Err("--conns and --pipeline must be at least 1".into());
    }
    if !(args.lease > 0.0 && args.lease <= 86_400.0) {
        return Err("--lease must be in (0, 86400]".into());
    }
    if args.target != crate::load::Target::Ringlock {
        return Err("--mode grow loads ringlock only".into());
    }
    if args.stop_server_log.is_some() && args.server_pid.is_none() {
        return Err("--stop-server-log needs --server-pid".into());
    }
    let addr = crate::load::resolve_addr(&args.addr)?;
    let prefix = crate::load::run_prefix();
    let digits = args.locks.saturating_sub(1).to_string().len();
    if args.key_len < prefix.len() + digits || args.key_len > ringlock_proto::MAX_KEY {
        return Err(format!(
            "{} locks do not fit in {}-byte keys",
            args.locks, args.key_len
        )
        .into());
    }
    let pad = args.key_len - prefix.len();
    let lease = seconds(args.lease);
    let key = |out: &mut Vec<u8>, idx: u64| {
        out.extend_from_slice(&prefix);
        let digits = idx.to_string();
        out.extend(std::iter::repeat_n(b'0', pad.saturating_sub(digits.len())));
        out.extend_from_slice(digits.as_bytes());
    };
    let mut probe_key = prefix.clone();
    probe_key.extend_from_slice(b"probe");

    let mut poll = Poll::new()?;
    let n = u64::from(args.conns);
    let mut conns = Vec::new();
    for c in 0..=args.conns {
        let stream =
            std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(stream);
        poll.registry().register(
            &mut stream,
            Token(c as usize),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let c = u64::from(c);
        conns.push(Conn {
            stream,
            rbuf: vec![0; RBUF],
            rlen: 0,
            out: Vec::with_capacity(RBUF),
            out_pos: 0,
            next: args.locks * c / n,
            end: if c < n { args.locks * (c + 1) / n } else { 0 },
            in_flight: 0,
        });
    }
    let probe_conn = args.conns as usize;
    let rss_before = args.server_pid.and_then(crate::proc::rss_kib).map(|r| r.0);
    let cpu_before = (
        args.server_pid
            .and_then(|p| crate::proc::cpu_seconds(Some(p))),
        crate::proc::cpu_seconds(None),
        crate::proc::machine_busy_seconds(),
    );
    let preempted_before = args.server_pid.and_then(crate::proc::preemptions);

    let base = Instant::now();
    let now = || base.elapsed().as_nanos() as u64;
    let limit = (args.duration * 1e9) as u64;
    let mut hists = Hists::new();
    let (mut granted, mut cycles, mut errors) = (0u64, 0u64, 0u64);
    let mut done_at: Option<u64> = None;
    let mut fail: Option<String> = None;

    // Start: every filler's pipeline, and the probe's first acquire.
    for conn in conns.iter_mut().take(probe_conn) {
        while conn.in_flight < args.pipeline && conn.next < conn.end {
            acquire(&mut conn.out, &lease, |o| key(o, conn.next));
            conn.next += 1;
            conn.in_flight += 1;
        }
    }
    acquire(&mut conns[probe_conn].out, &lease, |o| {
        o.extend_from_slice(&probe_key)
    });
    let t = now();
    let mut probe = Probe::Acquiring { first: t, sent: t };
    for conn in conns.iter_mut() {
        flush(conn)?;
    }

    let mut events = Events::with_capacity(1024);
    let mut last_print = 0u64;
    let mut last_granted = 0u64;
    loop {
        let fill_done = conns[..probe_conn]
            .iter()
            .all(|c| c.next >= c.end && c.in_flight == 0);
        if fill_done && done_at.is_none() {
            done_at = Some(now());
        }
        if (fill_done && probe == Probe::Done) || fail.is_some() || now() >= limit {
            break;
        }
        let timeout = Duration::from_nanos(limit.saturating_sub(now()).min(100_000_000));
        if let Err(e) = poll.poll(&mut events, Some(timeout))
            && e.kind() != io::ErrorKind::Interrupted
        {
            return Err(e.into());
        }
        let t = now();
        for event in events.iter() {
            let c = event.token().0;
            let Some(conn) = conns.get_mut(c) else {
                continue;
            };
            if !(event.is_readable() || event.is_read_closed() || event.is_error()) {
                continue;
            }
            if let Err(msg) = read(conn) {
                fail = Some(format!("connection {c}: {msg}"));
                break;
            }
            let mut pos = 0;
            while let Some(nl) = memchr::memchr(b'\n', &conn.rbuf[pos..conn.rlen]) {
                let line = &conn.rbuf[pos..pos + nl];
                pos += nl + 1;
                if c == probe_conn {
                    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
                    match (probe, &fields[..]) {
                        (Probe::Acquiring { first, sent }, [b"A", k, token])
                            if *k == &probe_key[..] =>
                        {
                            hists.acquire.record(t - sent);
                            hists.round_trip.record(t - sent);
                            conn.out.extend_from_slice(b"R ");
                            conn.out.extend_from_slice(&probe_key);
                            conn.out.push(b' ');
                            conn.out.extend_from_slice(token);
                            conn.out.push(b'\n');
                            probe = Probe::Releasing { first, sent: t };
                        }
                        (Probe::Releasing { first, sent }, [b"R", k, ok])
                            if *k == &probe_key[..] =>
                        {
                            if *ok != b"1" {
                                errors += 1;
                            }
                            hists.release.record(t - sent);
                            hists.round_trip.record(t - sent);
                            hists.cycle.record(t - first);
                            cycles += 1;
                            probe = if done_at.is_some() {
                                Probe::Done
                            } else {
                                acquire(&mut conn.out, &lease, |o| o.extend_from_slice(&probe_key));
                                Probe::Acquiring { first: t, sent: t }
                            };
                        }
                        _ => {
                            fail = Some(format!(
                                "probe: unexpected answer {:?}",
                                String::from_utf8_lossy(line)
                            ));
                            break;
                        }
                    }
                } else {
                    if !line.starts_with(b"A ") {
                        fail = Some(format!(
                            "filler {c}: unexpected answer {:?}",
                            String::from_utf8_lossy(line)
                        ));
                        break;
                    }
                    granted += 1;
                    conn.in_flight -= 1;
                    if conn.next < conn.end {
                        acquire(&mut conn.out, &lease, |o| key(o, conn.next));
                        conn.next += 1;
                        conn.in_flight += 1;
                    }
                }
            }
            conn.rbuf.copy_within(pos..conn.rlen, 0);
            conn.rlen -= pos;
        }
        // Stamp the probe's request with its send time, then write.
        let t = now();
        match &mut probe {
            Probe::Acquiring { sent, .. } | Probe::Releasing { sent, .. }
                if conns[probe_conn].out_pos < conns[probe_conn].out.len() =>
            {
                *sent = (*sent).max(t);
            }
            _ => {}
        }
        for conn in conns.iter_mut() {
            flush(conn)?;
        }
        if !args.quiet && t >= last_print + 1_000_000_000 {
            eprintln!(
                "ringlock-bench: {:>5.1} s granted {granted}/{} ({:.0}/s), probe cycles {cycles}",
                t as f64 / 1e9,
                args.locks,
                (granted - last_granted) as f64 / ((t - last_print) as f64 / 1e9),
            );
            (last_print, last_granted) = (t, granted);
        }
    }
    if let Some(msg) = fail {
        return Err(msg.into());
    }
    let seconds_used = done_at.unwrap_or_else(now) as f64 / 1e9;
    if granted < args.locks {
        errors += 1;
    }
    let (rss_after, hwm) = args
        .server_pid
        .and_then(crate::proc::rss_kib)
        .unwrap_or((0, 0));
    let cpu_after = (
        args.server_pid
            .and_then(|p| crate::proc::cpu_seconds(Some(p))),
        crate::proc::cpu_seconds(None),
        crate::proc::machine_busy_seconds(),
    );
    let preempted = args
        .server_pid
        .and_then(crate::proc::preemptions)
        .zip(preempted_before)
        .map(|(after, before)| after.saturating_sub(before));
    drop(conns);
    let longest_turn_ms = match (&args.stop_server_log, args.server_pid) {
        (Some(log), Some(pid)) => stop_server(pid, log)?,
        _ => None,
    };
    let cpu = |a: Option<f64>, b: Option<f64>| -> Option<crate::stats::CpuUse> {
        let cpu_s = b? - a?;
        Some(crate::stats::CpuUse {
            cpu_s,
            util: cpu_s / seconds_used,
            us_per_cycle: 0.0,
        })
    };
    let server_cpu = cpu(cpu_before.0, cpu_after.0);
    let client_cpu = cpu(cpu_before.1, cpu_after.1).unwrap_or_default();
    // Everything else the machine did meanwhile, in cores.
    let other_cpu = cpu_before.2.zip(cpu_after.2).map(|(a, b)| {
        let rest = (b - a) - client_cpu.cpu_s - server_cpu.as_ref().map_or(0.0, |s| s.cpu_s);
        (rest / seconds_used).max(0.0)
    });
    Ok(RunResult {
        scenario: args.scenario.clone(),
        label: if args.label.is_empty() {
            "ringlock".into()
        } else {
            args.label.clone()
        },
        round: args.round,
        target: "ringlock".into(),
        mode: "grow".into(),
        addr: addr.to_string(),
        conns: args.conns,
        pipeline: args.pipeline,
        keys: 1,
        threads: 1,
        spin_us: 0,
        lease_s: args.lease,
        warmup_s: 0.0,
        duration_s: args.duration,
        window_s: seconds_used,
        cycles,
        cycles_per_s: cycles as f64 / seconds_used,
        round_trips_per_s: 2.0 * cycles as f64 / seconds_used,
        latency_us: hists.summary(),
        errors,
        attempts_per_grant: 1.0,
        fairness: None,
        server_pid: args.server_pid,
        server_cpu,
        follower_cpu: Vec::new(),
        replication: Vec::new(),
        client_cpu,
        other_cpu,
        drained: false,
        memory: None,
        growth: Some(Growth {
            locks: args.locks,
            key_len: args.key_len,
            granted,
            seconds: seconds_used,
            acquires_per_s: granted as f64 / seconds_used,
            rss_before_kib: rss_before.unwrap_or(0),
            rss_after_kib: rss_after,
            hwm_kib: hwm,
            longest_turn_ms,
            server_preempted: preempted,
        }),
    })
}

pub(crate) fn main(args: &RunArgs) -> crate::Result<ExitCode> {
    let result = run(args)?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        result.print();
    }
    Ok(if result.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// `A <key> <lease> 0\n`.
fn acquire(out: &mut Vec<u8>, lease: &[u8], key: impl FnOnce(&mut Vec<u8>)) {
    out.extend_from_slice(b"A ");
    key(out);
    out.push(b' ');
    out.extend_from_slice(lease);
    out.extend_from_slice(b" 0\n");
}

/// A lease in the protocol's seconds form.
fn seconds(s: f64) -> Vec<u8> {
    let mut out = Vec::new();
    ringlock_proto::write_seconds(&mut out, (s * 1000.0).round() as u64);
    out
}

/// Reads what the socket has (until it would block or the buffer is full).
fn read(conn: &mut Conn) -> Result<(), String> {
    loop {
        if conn.rlen == conn.rbuf.len() {
            return Ok(()); // handled, then read again next turn
        }
        match conn.stream.read(&mut conn.rbuf[conn.rlen..]) {
            Ok(0) => return Err("closed by the server".into()),
            Ok(n) => conn.rlen += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Writes what `conn` has queued, as far as the socket takes it.
fn flush(conn: &mut Conn) -> io::Result<()> {
    while conn.out_pos < conn.out.len() {
        match conn.stream.write(&conn.out[conn.out_pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => conn.out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    conn.out.clear();
    conn.out_pos = 0;
    Ok(())
}

/// SIGTERM to the server, then its longest loop turn (ms) from the line it
/// prints when it stops, which `log` receives: `None` if the line has no
/// such figure (a server from before it printed one).
fn stop_server(pid: u32, log: &std::path::Path) -> crate::Result<Option<f64>> {
    let pid_t = rustix::process::Pid::from_raw(pid as i32).ok_or("bad --server-pid")?;
    rustix::process::kill_process(pid_t, rustix::process::Signal::TERM)
        .map_err(|e| format!("SIGTERM to {pid}: {e}"))?;
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .find(|l| l.contains("stopped (longest loop turn"))
        {
            let turn = line
                .split("longest loop turn ")
                .nth(1)
                .and_then(|rest| rest.split(" ms").next())
                .and_then(|ms| ms.parse().ok());
            return Ok(turn);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the server did not print its stop line to {} within {STOP_TIMEOUT:?}",
                log.display()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
