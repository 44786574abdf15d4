//! The report's cluster rows: each `<label>-cluster` (an active with two
//! standbys, a primary with two replicas) beside `<label>` (the single
//! node) measured in the same rounds, the replication lag the active
//! reported per follower, and the goals for replication's cost.

use std::fmt::Write as _;

use crate::report::{CLUSTER, CONNS50, Group, REDIS, Results, TargetCheck};
use crate::stats::RunResult;

/// A cluster row's own figures: each standby's CPU, and per follower (in
/// the order of their addresses) the replication the active reported.
pub(crate) fn figures(run: &RunResult, f: &mut Vec<(String, f64)>) {
    for (i, cpu) in run.follower_cpu.iter().enumerate() {
        f.push((
            format!("standby{}_cpu_per_cycle_us", i + 1),
            cpu.us_per_cycle,
        ));
        f.push((format!("standby{}_util", i + 1), cpu.util));
    }
    for (i, r) in run.replication.iter().enumerate() {
        let n = i + 1;
        f.push((format!("lag{n}_probes"), r.probes as f64));
        for (name, v) in [
            ("p50", r.lag_p50_us),
            ("p99", r.lag_p99_us),
            ("max", r.lag_max_us),
            ("mean", r.lag_mean_us),
        ] {
            if let Some(v) = v {
                f.push((format!("lag{n}_{name}_us"), v));
            }
        }
        f.push((format!("repl{n}_probes_lost"), r.probes_lost as f64));
        if r.writes > 0 {
            f.push((
                format!("repl{n}_events_per_write"),
                r.events as f64 / r.writes as f64,
            ));
        }
        if r.events > 0 {
            f.push((
                format!("repl{n}_bytes_per_event"),
                r.bytes as f64 / r.events as f64,
            ));
        }
        if run.cycles > 0 {
            f.push((
                format!("repl{n}_writes_per_cycle"),
                r.writes as f64 / run.cycles as f64,
            ));
        }
    }
}

/// Every cluster group with the single node of its scenario, scenarios in
/// the run's order.
fn rows(r: &Results) -> Vec<(&Group, Option<&Group>)> {
    r.groups
        .iter()
        .filter_map(|g| {
            let single = g.label.strip_suffix(CLUSTER)?;
            Some((g, r.group(&g.scenario, single)))
        })
        .collect()
}

/// A figure's largest value over the rounds.
fn worst(g: &Group, figure: &str) -> Option<f64> {
    g.figures.get(figure).map(|s| s.max)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b).filter(|(_, b)| *b != 0.0).map(|(a, b)| a / b)
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2}"))
}

fn fmt_rate(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 1e3 => format!("{:.1}k", v / 1e3),
        Some(v) => format!("{v:.0}"),
        None => "-".into(),
    }
}

fn fmt_us(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 1000.0 => format!("{:.2} ms", v / 1000.0),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

/// A lag figure: the upper bound of its power-of-two bucket.
fn fmt_bound(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 1000.0 => format!("≤ {:.2} ms", v / 1000.0),
        Some(v) => format!("≤ {v:.0} µs"),
        None => "-".into(),
    }
}

/// One goal of a cluster row: `a / b` against `limit`.
struct Goal<'a> {
    target: String,
    goal: &'a str,
    a: Option<f64>,
    b: Option<f64>,
    limit: f64,
    at_most: bool,
    fmt: fn(Option<f64>) -> String,
}

impl Goal<'_> {
    fn check(self, label: &str) -> TargetCheck {
        let x = ratio(self.a, self.b);
        let verdict = match x {
            None => "not measured",
            Some(x) if (self.at_most && x <= self.limit) || (!self.at_most && x >= self.limit) => {
                "met"
            }
            Some(_) => "missed",
        };
        TargetCheck {
            target: self.target,
            label: label.into(),
            goal: self.goal.into(),
            measured: match (self.a, self.b) {
                (Some(_), Some(_)) => format!("{} vs {}", (self.fmt)(self.a), (self.fmt)(self.b)),
                _ => "-".into(),
            },
            ratio: x,
            limit: self.limit,
            verdict: verdict.into(),
        }
    }
}

/// The cluster rows' goals: the active's CPU per cycle against the single
/// node's, and at 50 connections against Redis with two replicas; the
/// replication lag p99.
pub(crate) fn targets(r: &Results) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    let redis = |figure: &str| {
        r.group(CONNS50, &format!("{REDIS}{CLUSTER}"))
            .and_then(|g| g.get(figure))
    };
    for (g, single) in rows(r) {
        if g.target == REDIS {
            continue;
        }
        let cpu = g.get("server_cpu_per_cycle_us");
        let mut goals = vec![Goal {
            target: format!("{}, 2 standbys", g.scenario),
            goal: "active CPU per cycle <= 1.2 x the single node's",
            a: cpu,
            b: single.and_then(|s| s.get("server_cpu_per_cycle_us")),
            limit: 1.2,
            at_most: true,
            fmt: fmt_us,
        }];
        if g.scenario == CONNS50 && !g.label.contains("-tls") {
            let vs_redis = format!("{CONNS50}, 2 standbys vs Redis + 2 replicas");
            goals.push(Goal {
                target: vs_redis.clone(),
                goal: "active CPU per cycle <= 0.7 x the Redis primary's",
                a: cpu,
                b: redis("server_cpu_per_cycle_us"),
                limit: 0.7,
                at_most: true,
                fmt: fmt_us,
            });
            goals.push(Goal {
                target: vs_redis,
                goal: "cycles/s >= 1.3 x Redis's",
                a: g.get("cycles_per_s"),
                b: redis("cycles_per_s"),
                limit: 1.3,
                at_most: false,
                fmt: fmt_rate,
            });
        }
        if g.scenario == CONNS50 {
            // The worst follower's p99 in its worst round (each is the
            // bound of its bucket).
            let p99 = (1..=2)
                .filter_map(|n| worst(g, &format!("lag{n}_p99_us")))
                .reduce(f64::max);
            goals.push(Goal {
                target: format!("{CONNS50}, 2 standbys"),
                goal: "replication lag p99 (bucket bound, worst follower and round) < 1 ms",
                a: p99,
                b: p99.map(|_| 1000.0),
                limit: 1.0,
                at_most: true,
                fmt: fmt_bound,
            });
        }
        checks.extend(goals.into_iter().map(|goal| goal.check(&g.label)));
    }
    checks
}

/// The "Replication" section of the report (nothing without cluster rows).
pub(crate) fn markdown(r: &Results, md: &mut String) {
    let rows = rows(r);
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Replication: an active and two standbys beside the single node\n"
    );
    let _ = writeln!(
        md,
        "Each `-cluster` row is the server of its name as an active (Redis: a primary) \
         with two standbys (replicas) on the load generator's core, beside the single \
         node in the same rounds (targets alternated). CPU in µs per cycle: the active's \
         (primary's), its ratio to the single node's, and each standby's (replica's). \
         Throughput and the cycle p50 and p99 as cluster / single.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | cluster | active CPU/cycle | single | ratio | standbys' CPU/cycle | cycles/s | single | ratio | cycle p50 | single | cycle p99 | single |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (g, single) in &rows {
        let s = |f: &str| single.and_then(|s| s.get(f));
        let standbys: Vec<String> = (1..=2)
            .filter_map(|n| g.get(&format!("standby{n}_cpu_per_cycle_us")))
            .map(|v| format!("{v:.2}"))
            .collect();
        let cpu = g.get("server_cpu_per_cycle_us");
        let cps = g.get("cycles_per_s");
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            g.scenario,
            g.label,
            fmt_us(cpu),
            fmt_us(s("server_cpu_per_cycle_us")),
            fmt_ratio(ratio(cpu, s("server_cpu_per_cycle_us"))),
            if standbys.is_empty() {
                "-".into()
            } else {
                standbys.join(" / ")
            },
            fmt_rate(cps),
            fmt_rate(s("cycles_per_s")),
            fmt_ratio(ratio(cps, s("cycles_per_s"))),
            fmt_us(g.get("cycle_p50_us")),
            fmt_us(s("cycle_p50_us")),
            fmt_us(g.get("cycle_p99_us")),
            fmt_us(s("cycle_p99_us")),
        );
    }
    let _ = writeln!(md);
    lag_table(r, &rows, md);
}

fn lag_table(r: &Results, rows: &[(&Group, Option<&Group>)], md: &mut String) {
    let _ = writeln!(
        md,
        "Replication lag per follower, as the active measures it (probes behind its \
         deltas, answered once the follower has applied them; the way back included), \
         read from its /metrics before and after each run: p50, p99 and max are the \
         upper bounds of the histogram's power-of-two buckets that hold them, in the \
         worst round (a median of two bounds would be no bound); the probes, the mean \
         (exact) and the other columns are medians over the rounds. Changes are the grants, renewals, \
         releases and expiries sent as deltas (two per cycle). Redis: lag not measured \
         (its replicas were checked to be in sync before the runs only).\n"
    );
    let _ = writeln!(
        md,
        "| scenario | cluster | follower | probes | lag p50 | p99 | max | mean | changes per write | bytes per change | writes per cycle | probes lost |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut any = false;
    for (g, _) in rows {
        let run = r
            .runs
            .iter()
            .find(|run| run.scenario == g.scenario && run.label == g.label);
        for n in 1..=run.map_or(0, |run| run.replication.len()) {
            any = true;
            let fig = |f: &str| g.get(f);
            let addr = run.map_or("?", |run| run.replication[n - 1].follower.as_str());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                g.scenario,
                g.label,
                addr,
                fig(&format!("lag{n}_probes")).map_or("-".into(), |v| format!("{v:.0}")),
                fmt_bound(worst(g, &format!("lag{n}_p50_us"))),
                fmt_bound(worst(g, &format!("lag{n}_p99_us"))),
                fmt_bound(worst(g, &format!("lag{n}_max_us"))),
                fig(&format!("lag{n}_mean_us")).map_or("-".into(), |v| format!("{v:.0} µs")),
                fig(&format!("repl{n}_events_per_write")).map_or("-".into(), |v| format!("{v:.1}")),
                fig(&format!("repl{n}_bytes_per_event")).map_or("-".into(), |v| format!("{v:.1}")),
                fig(&format!("repl{n}_writes_per_cycle")).map_or("-".into(), |v| format!("{v:.3}")),
                fig(&format!("repl{n}_probes_lost")).map_or("-".into(), |v| format!("{v:.0}")),
            );
        }
    }
    if !any {
        let _ = writeln!(
            md,
            "| - | - | the servers publish no replication lag | | | | | | | | | |"
        );
    }
    let _ = writeln!(md);
}
