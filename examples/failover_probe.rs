//! Measures a ringlock cluster's failover with the real binary (it is
//! driven by `scripts/failover.sh`, which starts the nodes). Each mode does
//! one measurement and prints one JSON line on stdout.
//!
//! ```text
//! failover_probe settle  --addrs A,B,C --active I [--within-ms 10000]
//! failover_probe crash   --pid PID --successor ADDR
//! failover_probe handoff --pid PID --old ADDR --successor ADDR
//! failover_probe client  --pid PID --addrs A,B,C
//! failover_probe watch   --addrs A,B,C --ready FILE --stop FILE [--holders N]
//! ```
//!
//! - `settle`: waits until node I answers `S active` and every other node
//!   `S standby <node I>`; prints how long that took.
//! - `crash`: hammers the successor (a standby, answering `M`) with
//!   `A key 1 0.05`; sends SIGKILL to PID (the active) and times from the
//!   signal to the successor's first grant (`first_grant_ms`).
//! - `handoff`: one thread hammers the active with `A`/`R`, another the
//!   successor as above; sends SIGTERM to PID (the active). `gap_ms`: from
//!   the old active's last grant to the successor's first grant, the gap in
//!   service a client sees; also both times from the signal.
//! - `client`: the official client (`ringlock_client`) given every address
//!   acquires and releases in a loop (50 ms waits); SIGKILL to PID; times
//!   from the signal to the client's first grant, through its own reconnect
//!   and `M` handling.
//! - `watch`: the clients of a cluster through whatever the script does
//!   meanwhile (a kill, a stop, a SIGTERM, restarts): N (default 3) locks
//!   with lease 2 s renewed in the background (`RenewingGuard`, what
//!   `ringlock run --lease 2` uses), each on a client of its own, and one
//!   long-lived client doing acquire/release cycles (5 s waits) on a key of
//!   its own, which every tenth cycle also tries (`try_acquire`) one of the
//!   held keys. Creates the ready file once every lock is held, runs until
//!   the stop file exists (at most 120 s), then prints `worst_cycle_ms`
//!   (the longest acquire/release cycle), `holders_lost` (locks lost, with
//!   their reasons) and `double_grants` (a held key granted to the
//!   cycling client).
//!
//! Times are taken with one monotonic clock in this process, from just
//! before the signal is sent.

#![deny(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use serde_json::{Value, json};

/// Pause between two attempts on a node that answers `M`: short enough for
/// sub-millisecond resolution, long enough not to starve the servers on a
/// small machine.
const RETRY_PAUSE: Duration = Duration::from_micros(200);

/// No measurement may take longer than this.
const DEADLINE: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = args.first() else {
        usage("no mode given");
    };
    let opt = |name: &str| -> Option<String> {
        args.windows(2)
            .find(|w| w[0] == format!("--{name}"))
            .map(|w| w[1].clone())
    };
    let need = |name: &str| opt(name).unwrap_or_else(|| usage(&format!("--{name} is required")));
    let result = match mode.as_str() {
        "settle" => settle(
            &split(&need("addrs")),
            need("active")
                .parse()
                .unwrap_or_else(|_| usage("bad --active")),
            Duration::from_millis(
                opt("within-ms")
                    .map_or(Ok(10_000), |v| v.parse())
                    .unwrap_or_else(|_| usage("bad --within-ms")),
            ),
        ),
        "crash" => crash(pid(&need("pid")), &need("successor")),
        "handoff" => handoff(pid(&need("pid")), &need("old"), &need("successor")),
        "client" => client(pid(&need("pid")), split(&need("addrs"))),
        "watch" => watch(
            split(&need("addrs")),
            opt("holders")
                .map_or(Ok(3), |v| v.parse())
                .unwrap_or_else(|_| usage("bad --holders")),
            &need("ready"),
            &need("stop"),
        ),
        other => usage(&format!("unknown mode {other:?}")),
    };
    match result {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("failover_probe {mode}: {e}");
            std::process::exit(1);
        }
    }
}

fn usage(why: &str) -> ! {
    eprintln!(
        "failover_probe: {why}\nmodes: settle | crash | handoff | client | watch (see the source)"
    );
    std::process::exit(2);
}

fn split(list: &str) -> Vec<String> {
    list.split(',').map(str::to_string).collect()
}

fn pid(s: &str) -> i32 {
    s.parse().unwrap_or_else(|_| usage("bad --pid"))
}

fn send_signal(pid: i32, sig: Signal) -> Result<(), String> {
    let process = Pid::from_raw(pid).ok_or(format!("bad pid {pid}"))?;
    kill_process(process, sig).map_err(|e| format!("kill({pid}, {sig:?}): {e}"))
}

/// Milliseconds, to the microsecond.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1000.0
}

/// A raw protocol connection.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: &str) -> Result<Conn, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone().map_err(|e| e.to_string())?),
            writer: stream,
        })
    }

    /// Sends a line and reads one answer; `None` if the connection closed
    /// (or failed, or the answer did not come within the read timeout).
    fn call(&mut self, line: &str) -> Option<String> {
        self.writer.write_all(format!("{line}\n").as_bytes()).ok()?;
        let mut answer = String::new();
        match self.reader.read_line(&mut answer) {
            Ok(n) if n > 0 && answer.ends_with('\n') => {
                answer.pop();
                Some(answer)
            }
            _ => None,
        }
    }
}

/// `S` on a fresh connection: `(role, active)`.
fn status(addr: &str) -> Option<(String, String)> {
    let mut conn = Conn::open(addr).ok()?;
    let answer = conn.call("S")?;
    let f: Vec<&str> = answer.split(' ').collect();
    match f[..] {
        ["S", role, active, _] => Some((role.to_string(), active.to_string())),
        _ => None,
    }
}

fn settle(addrs: &[String], active: usize, within: Duration) -> Result<Value, String> {
    let started = Instant::now();
    let want = addrs.get(active).ok_or("--active is not in --addrs")?;
    loop {
        let st: Vec<Option<(String, String)>> = addrs.iter().map(|a| status(a)).collect();
        let ok = st.iter().enumerate().all(|(i, s)| match s {
            Some((role, named)) if i == active => role == "active" && named == want,
            Some((role, named)) => role == "standby" && named == want,
            None => false,
        });
        if ok {
            return Ok(json!({"mode": "settle", "active": active, "ms": ms(started.elapsed())}));
        }
        if started.elapsed() > within {
            return Err(format!("not settled on {want} within {within:?}: {st:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What one attempt on the successor got.
enum Attempt {
    Granted(u64),
    Moved,
    TimedOut,
    Closed,
}

/// `A key 1 0.05` on `conn`; a grant is released at once.
fn attempt(conn: &mut Conn, key: &str) -> Result<Attempt, String> {
    let Some(answer) = conn.call(&format!("A {key} 1 0.05")) else {
        return Ok(Attempt::Closed);
    };
    let f: Vec<&str> = answer.split(' ').collect();
    match f[..] {
        ["A", k, token] if k == key => {
            let token: u64 = token.parse().map_err(|_| format!("bad token: {answer}"))?;
            // Released right away (best effort: the node may be leaving).
            let _ = conn.call(&format!("R {key} {token}"));
            Ok(Attempt::Granted(token))
        }
        ["M", k, _] if k == key => Ok(Attempt::Moved),
        ["T", k] if k == key => Ok(Attempt::TimedOut),
        _ => Err(format!("unexpected answer {answer:?}")),
    }
}

fn crash(pid: i32, successor: &str) -> Result<Value, String> {
    let key = "failover/probe/crash";
    let mut conn = Conn::open(successor)?;
    // The successor must be a standby before the signal.
    match attempt(&mut conn, key)? {
        Attempt::Moved => {}
        _ => return Err(format!("{successor} is not a standby before the kill")),
    }
    let t0 = Instant::now();
    send_signal(pid, Signal::KILL)?;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        match attempt(&mut conn, key)? {
            Attempt::Granted(token) => {
                let took = t0.elapsed();
                return Ok(json!({
                    "mode": "crash",
                    "first_grant_ms": ms(took),
                    "attempts": attempts,
                    "token": token,
                }));
            }
            Attempt::Moved | Attempt::TimedOut => std::thread::sleep(RETRY_PAUSE),
            Attempt::Closed => return Err(format!("{successor} closed the connection")),
        }
        if t0.elapsed() > DEADLINE {
            return Err(format!("no grant from {successor} within {DEADLINE:?}"));
        }
    }
}

#[expect(clippy::too_many_lines)]
fn handoff(pid: i32, old: &str, successor: &str) -> Result<Value, String> {
    let base = Instant::now();
    let go = Arc::new(Barrier::new(3));
    let stop = Arc::new(AtomicBool::new(false));

    // The old active: A/R as fast as it answers; the last grant's time.
    let mut on_old = Conn::open(old)?;
    let (g, st) = (go.clone(), stop.clone());
    let old_loop =
        std::thread::spawn(move || -> Result<(Option<Duration>, u64, String), String> {
            let key = "failover/probe/old";
            let mut last = None;
            let mut grants = 0u64;
            // Warm up before the signal.
            for _ in 0..200 {
                if let Attempt::Granted(_) = attempt(&mut on_old, key)? {
                    grants += 1;
                }
            }
            g.wait();
            let end = loop {
                match attempt(&mut on_old, key)? {
                    Attempt::Granted(_) => {
                        last = Some(base.elapsed());
                        grants += 1;
                    }
                    Attempt::TimedOut => {}
                    Attempt::Moved => break "M",
                    Attempt::Closed => break "closed",
                }
                if st.load(Ordering::Relaxed) {
                    break "stopped";
                }
            };
            Ok((last, grants, end.to_string()))
        });

    // The successor: answers M until it is active.
    let mut on_new = Conn::open(successor)?;
    let (g, st) = (go.clone(), stop.clone());
    let new_loop = std::thread::spawn(move || -> Result<(Duration, u64), String> {
        let key = "failover/probe/new";
        match attempt(&mut on_new, key)? {
            Attempt::Moved => {}
            _ => return Err("the successor is not a standby before the signal".into()),
        }
        g.wait();
        let mut attempts = 0u64;
        loop {
            attempts += 1;
            match attempt(&mut on_new, key)? {
                Attempt::Granted(_) => return Ok((base.elapsed(), attempts)),
                Attempt::Moved | Attempt::TimedOut => std::thread::sleep(RETRY_PAUSE),
                Attempt::Closed => return Err("the successor closed the connection".into()),
            }
            if st.load(Ordering::Relaxed) {
                return Err(format!("no grant from the successor within {DEADLINE:?}"));
            }
        }
    });

    go.wait();
    // Let both loops run a moment, then signal.
    std::thread::sleep(Duration::from_millis(20));
    let signal_at = base.elapsed();
    send_signal(pid, Signal::TERM)?;
    let watchdog = {
        let st = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(DEADLINE);
            st.store(true, Ordering::Relaxed);
        })
    };
    let new = new_loop.join().map_err(|_| "successor loop panicked")?;
    stop.store(true, Ordering::Relaxed);
    let old = old_loop.join().map_err(|_| "old-active loop panicked")?;
    drop(watchdog);
    let (first_new, attempts) = new?;
    let (last_old, grants_old, old_end) = old?;
    let last_old = last_old.ok_or("the old active granted nothing after the warm-up")?;
    let gap = first_new.saturating_sub(last_old);
    Ok(json!({
        "mode": "handoff",
        "gap_ms": ms(gap),
        "signal_to_last_old_ms": ms(last_old.saturating_sub(signal_at)),
        "signal_to_first_new_ms": ms(first_new.saturating_sub(signal_at)),
        "old_grants": grants_old,
        "old_end": old_end,
        "new_attempts": attempts,
        // The successor granted before the old active's last grant.
        "overlap": first_new < last_old,
    }))
}

fn client(pid: i32, addrs: Vec<String>) -> Result<Value, String> {
    use ringlock_client::{Acquired, Client};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let key = "failover/probe/client";
        let lease = Duration::from_secs(1);
        let wait = Some(Duration::from_millis(50));
        let client = Client::connect(addrs)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        // Warm up: the client has found the active.
        for _ in 0..100 {
            match client.acquire(key, lease, wait).await {
                Ok(Acquired::Granted(g)) => {
                    let _ = client.release_grant(&g).await;
                }
                Ok(Acquired::TimedOut) => {}
                Err(e) => return Err(format!("before the kill: {e}")),
            }
        }
        let t0 = Instant::now();
        send_signal(pid, Signal::KILL)?;
        let mut errors = Vec::new();
        for attempt in 0u64.. {
            // A fresh key each time: the acquire in flight when the signal
            // lands may be granted and replicated with its answer lost, and
            // that grant holds its key for its lease (by design); this
            // measures when the cluster grants again, not that lease.
            let key = format!("{key}/{attempt}");
            match client.acquire(&key, lease, wait).await {
                Ok(Acquired::Granted(g)) => {
                    let took = t0.elapsed();
                    let _ = client.release_grant(&g).await;
                    errors.dedup();
                    return Ok(json!({
                        "mode": "client",
                        "first_grant_ms": ms(took),
                        "errors": errors,
                    }));
                }
                Ok(Acquired::TimedOut) => {}
                Err(e) => errors.push(e.to_string()),
            }
            if t0.elapsed() > DEADLINE {
                return Err(format!("no grant within {DEADLINE:?}: {errors:?}"));
            }
        }
        unreachable!()
    })
}

/// What the long-lived client of `watch` saw.
#[derive(Default)]
struct Cycles {
    n: u64,
    worst: Duration,
    errors: Vec<String>,
    double_grants: Vec<String>,
}

fn watch(addrs: Vec<String>, holders: usize, ready: &str, stop: &str) -> Result<Value, String> {
    use ringlock_client::Client;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let mut held = Vec::new();
        for i in 0..holders {
            let c = Client::connect(addrs.clone())
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let key = format!("failover/probe/held/{i}");
            let guard = c
                .lock_renewing(&key, Duration::from_secs(2), Some(Duration::from_secs(5)))
                .await
                .map_err(|e| format!("lock {key}: {e}"))?;
            held.push((c, key, guard));
        }
        let client = Client::connect(addrs)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let keys: Vec<String> = held.iter().map(|(_, k, _)| k.clone()).collect();
        std::fs::write(ready, b"").map_err(|e| format!("{ready}: {e}"))?;
        let cycles = cycle_until(&client, &keys, stop).await?;
        let mut lost = Vec::new();
        for (_, key, guard) in held {
            if guard.is_lost() {
                lost.push(format!("{key}: {}", guard.lost().await));
            } else {
                let _ = guard.release().await;
            }
        }
        let mut errors = cycles.errors;
        errors.dedup();
        Ok(json!({
            "mode": "watch",
            "cycles": cycles.n,
            "worst_cycle_ms": ms(cycles.worst),
            "cycle_errors": errors,
            "holders": holders,
            "holders_lost": lost.len(),
            "lost": lost,
            "double_grants": cycles.double_grants,
        }))
    })
}

/// The long-lived client's acquire/release cycles until `stop` exists.
async fn cycle_until(
    client: &ringlock_client::Client,
    held: &[String],
    stop: &str,
) -> Result<Cycles, String> {
    use ringlock_client::Acquired;
    let limit = Instant::now() + Duration::from_secs(120);
    let mut c = Cycles::default();
    while !std::path::Path::new(stop).exists() {
        if Instant::now() > limit {
            return Err(format!("{stop} not made within 120 s"));
        }
        let t = Instant::now();
        let wait = Some(Duration::from_secs(5));
        match client
            .acquire("failover/probe/cycle", Duration::from_secs(5), wait)
            .await
        {
            Ok(Acquired::Granted(g)) => {
                if let Err(e) = client.release_grant(&g).await {
                    c.errors.push(format!("release: {e}"));
                }
            }
            Ok(Acquired::TimedOut) => c.errors.push("acquire timed out".into()),
            Err(e) => c.errors.push(format!("acquire: {e}")),
        }
        c.worst = c.worst.max(t.elapsed());
        c.n += 1;
        if !held.is_empty() && c.n % 10 == 0 {
            let key = &held[(c.n / 10) as usize % held.len()];
            if let Ok(Acquired::Granted(g)) = client.try_acquire(key, Duration::from_secs(1)).await
            {
                c.double_grants.push(format!("{key}: token {}", g.token()));
                let _ = client.release_grant(&g).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(c)
}
