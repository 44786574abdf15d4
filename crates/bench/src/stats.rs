//! Latency histograms and the result of one run, as printed and as JSON.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Nanosecond latencies from 1 ns to 60 s, 3 significant digits.
pub(crate) struct Hist(Histogram<u64>);

impl Hist {
    pub(crate) fn new() -> Hist {
        Hist(Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"))
    }

    #[inline]
    pub(crate) fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.max(1));
    }

    pub(crate) fn add(&mut self, other: &Hist) {
        self.0.add(&other.0).expect("histograms of the same bounds");
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Percentiles in microseconds.
    pub(crate) fn summary(&self) -> Latency {
        let h = &self.0;
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// The histograms a run keeps.
pub(crate) struct Hists {
    /// Acquire request sent (first attempt) to grant received.
    pub acquire: Hist,
    /// Release request sent to its answer received.
    pub release: Hist,
    /// Acquire sent (first attempt) to release answered.
    pub cycle: Hist,
    /// Every single request/answer pair that does not wait for another
    /// client (releases, and acquires of uncontended runs).
    pub round_trip: Hist,
    /// Release sent to the next grant of the same key received by a client
    /// that was already waiting (contended runs).
    pub handoff: Hist,
}

impl Hists {
    pub(crate) fn new() -> Hists {
        Hists {
            acquire: Hist::new(),
            release: Hist::new(),
            cycle: Hist::new(),
            round_trip: Hist::new(),
            handoff: Hist::new(),
        }
    }

    pub(crate) fn add(&mut self, other: &Hists) {
        self.acquire.add(&other.acquire);
        self.release.add(&other.release);
        self.cycle.add(&other.cycle);
        self.round_trip.add(&other.round_trip);
        self.handoff.add(&other.handoff);
    }

    pub(crate) fn summary(&self) -> Latencies {
        let opt = |h: &Hist| (!h.is_empty()).then(|| h.summary());
        Latencies {
            acquire: opt(&self.acquire),
            release: opt(&self.release),
            cycle: opt(&self.cycle),
            round_trip: opt(&self.round_trip),
            handoff: opt(&self.handoff),
        }
    }
}

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Latency {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Latencies {
    pub acquire: Option<Latency>,
    pub release: Option<Latency>,
    pub cycle: Option<Latency>,
    pub round_trip: Option<Latency>,
    pub handoff: Option<Latency>,
}

/// CPU used by a process during the measured window.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CpuUse {
    /// User + system seconds (from /proc/<pid>/stat, clock-tick resolution).
    pub cpu_s: f64,
    /// `cpu_s` / window: 1.0 is one core busy all the time.
    pub util: f64,
    /// `cpu_s` per completed cycle, in microseconds.
    pub us_per_cycle: f64,
}

/// Grants per client in the window (contended runs): how evenly the lock was
/// shared.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Fairness {
    pub clients: u64,
    pub min_grants: u64,
    pub max_grants: u64,
}

/// The memory mode's result.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Memory {
    pub locks: u64,
    pub key_len: usize,
    pub granted: u64,
    pub seconds: f64,
    pub acquires_per_s: f64,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub hwm_kib: u64,
    /// (rss_after - rss_before) / granted.
    pub bytes_per_lock: f64,
}

/// The grow mode's result (the probe's latencies are the run's).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Growth {
    pub locks: u64,
    pub key_len: usize,
    pub granted: u64,
    /// Seconds the fill took.
    pub seconds: f64,
    pub acquires_per_s: f64,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub hwm_kib: u64,
    /// The server's longest loop turn, from its stop line
    /// (`--stop-server-log`).
    pub longest_turn_ms: Option<f64>,
    /// Times the server was preempted during the fill (involuntary context
    /// switches): a long turn in a run with some may be another process's.
    #[serde(default)]
    pub server_preempted: Option<u64>,
}

/// One run of the load generator.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RunResult {
    /// Set by the caller (`--scenario`, `--label`, `--round`), for reports.
    pub scenario: String,
    pub label: String,
    pub round: u32,
    pub target: String,
    pub mode: String,
    pub addr: String,
    pub conns: u32,
    pub pipeline: u32,
    pub keys: u32,
    pub threads: u32,
    /// `--spin-us` of the generator (0: it sleeps in every wait).
    #[serde(default)]
    pub spin_us: u64,
    pub lease_s: f64,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// The measured window as it really was, in seconds.
    pub window_s: f64,
    /// Cycles completed inside the window (acquire + release; for `echo`,
    /// two round trips of the same lines).
    pub cycles: u64,
    pub cycles_per_s: f64,
    /// Request/answer pairs per second: 2 per cycle, plus failed Redis
    /// `SET NX` attempts.
    pub round_trips_per_s: f64,
    pub latency_us: Latencies,
    /// Releases answered "not held" and other unexpected answers.
    pub errors: u64,
    /// Redis: `SET NX` attempts per grant (1.0 when nobody had to retry).
    pub attempts_per_grant: f64,
    pub fairness: Option<Fairness>,
    pub server_pid: Option<u32>,
    pub server_cpu: Option<CpuUse>,
    /// Cluster rows: each follower's (standby's, replica's) CPU over the
    /// window, in the order of `--follower-pid`.
    #[serde(default)]
    pub follower_cpu: Vec<CpuUse>,
    /// Cluster rows with `--metrics-addr`: the active's replication figures
    /// per follower over the window (none when the server publishes no
    /// replication lag).
    #[serde(default)]
    pub replication: Vec<crate::replication::FollowerReplication>,
    /// The load generator's own CPU: near 1.0 per thread means the generator,
    /// not the server, may be the bottleneck.
    pub client_cpu: CpuUse,
    /// Cores' worth of CPU the rest of the machine used during the window
    /// (other processes, and interrupt time charged to neither process):
    /// how disturbed the run was. Without `--server-pid` it includes the
    /// server.
    #[serde(default)]
    pub other_cpu: Option<f64>,
    /// All slots were idle (every grant released) when the run ended.
    pub drained: bool,
    pub memory: Option<Memory>,
    #[serde(default)]
    pub growth: Option<Growth>,
}

impl RunResult {
    fn print_latencies(&self) {
        println!(
            "  {:<11} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}   (µs)",
            "", "count", "p50", "p90", "p99", "p99.9", "max"
        );
        let l = &self.latency_us;
        for (name, h) in [
            ("acquire", &l.acquire),
            ("release", &l.release),
            ("cycle", &l.cycle),
            ("round trip", &l.round_trip),
            ("hand-off", &l.handoff),
        ] {
            if let Some(h) = h {
                println!(
                    "  {:<11} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                    name, h.count, h.p50, h.p90, h.p99, h.p999, h.max
                );
            }
        }
    }

    /// Cluster rows: each follower's CPU, and the replication the active
    /// reported per follower.
    fn print_followers(&self) {
        for (i, cpu) in self.follower_cpu.iter().enumerate() {
            println!(
                "  follower {} CPU {:.2} s ({:.0}% of a core), {:.2} µs per cycle",
                i + 1,
                cpu.cpu_s,
                cpu.util * 100.0,
                cpu.us_per_cycle
            );
        }
        let bound = |v: Option<f64>| v.map_or("-".into(), |v| format!("<= {v:.0} µs"));
        for r in &self.replication {
            println!(
                "  replication to {}: {} probes, lag p50 {} p99 {} max {} (mean {}), \
                 {} events in {} writes, {} bytes, {} probes lost",
                r.follower,
                r.probes,
                bound(r.lag_p50_us),
                bound(r.lag_p99_us),
                bound(r.lag_max_us),
                r.lag_mean_us.map_or("-".into(), |v| format!("{v:.0} µs")),
                r.events,
                r.writes,
                r.bytes,
                r.probes_lost
            );
        }
    }

    /// What ran: the label with the target and mode, the target named once
    /// when the label is the target's own name (`ringlock (uncontended)`,
    /// `ringlock-epoll (ringlock, uncontended)`).
    pub(crate) fn heading(&self) -> String {
        if self.label == self.target {
            format!("{} ({})", self.target, self.mode)
        } else {
            format!("{} ({}, {})", self.label, self.target, self.mode)
        }
    }

    /// A human-readable summary.
    #[expect(clippy::too_many_lines)]
    pub(crate) fn print(&self) {
        println!(
            "{}: {} conns x {} in flight, {} keys, {:.1} s measured",
            self.heading(),
            self.conns,
            self.pipeline,
            self.keys,
            self.window_s
        );
        if let Some(g) = &self.growth {
            println!(
                "  {} of {} locks granted in {:.2} s ({:.0}/s); server RSS {:.1} MiB -> {:.1} MiB \
                 (peak {:.1} MiB); longest loop turn {}",
                g.granted,
                g.locks,
                g.seconds,
                g.acquires_per_s,
                g.rss_before_kib as f64 / 1024.0,
                g.rss_after_kib as f64 / 1024.0,
                g.hwm_kib as f64 / 1024.0,
                g.longest_turn_ms
                    .map_or("not reported".into(), |ms| format!("{ms:.1} ms")),
            );
            if let Some(n) = g.server_preempted {
                println!("  server preempted {n} times during the fill");
            }
            if let Some(other) = self.other_cpu {
                println!("  rest of the machine {:.0}% of a core", other * 100.0);
            }
            println!(
                "  probe: {} acquire/release cycles, {} errors",
                self.cycles, self.errors
            );
            self.print_latencies();
            return;
        }
        if let Some(m) = &self.memory {
            println!(
                "  {} of {} locks granted in {:.2} s ({:.0}/s); server RSS {:.1} MiB -> {:.1} MiB \
                 (peak {:.1} MiB), {:.0} bytes per lock",
                m.granted,
                m.locks,
                m.seconds,
                m.acquires_per_s,
                m.rss_before_kib as f64 / 1024.0,
                m.rss_after_kib as f64 / 1024.0,
                m.hwm_kib as f64 / 1024.0,
                m.bytes_per_lock
            );
            return;
        }
        println!(
            "  {:.0} cycles/s, {:.0} round trips/s, {} errors{}",
            self.cycles_per_s,
            self.round_trips_per_s,
            self.errors,
            if self.attempts_per_grant > 1.0 {
                format!(", {:.2} SET attempts per grant", self.attempts_per_grant)
            } else {
                String::new()
            }
        );
        self.print_latencies();
        if let Some(f) = &self.fairness {
            println!(
                "  grants per client: min {} max {} ({} clients)",
                f.min_grants, f.max_grants, f.clients
            );
        }
        if let Some(cpu) = &self.server_cpu {
            println!(
                "  server CPU {:.2} s ({:.0}% of a core), {:.2} µs per cycle",
                cpu.cpu_s,
                cpu.util * 100.0,
                cpu.us_per_cycle
            );
        }
        self.print_followers();
        if let Some(other) = self.other_cpu {
            println!("  rest of the machine {:.0}% of a core", other * 100.0);
        }
        println!(
            "  load generator CPU {:.0}% of a core{}",
            self.client_cpu.util * 100.0,
            if self.drained {
                ""
            } else {
                " (not drained: some grants left to their lease)"
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::RunResult;

    #[test]
    fn the_heading_names_the_target_once() {
        let mut run = RunResult {
            target: "ringlock".into(),
            label: "ringlock".into(),
            mode: "uncontended".into(),
            ..RunResult::default()
        };
        assert_eq!(run.heading(), "ringlock (uncontended)");
        run.label = "ringlock-epoll".into();
        assert_eq!(run.heading(), "ringlock-epoll (ringlock, uncontended)");
    }
}
