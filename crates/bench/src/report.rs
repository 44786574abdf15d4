//! From the runs of one `scripts/bench.sh` run to its results: the JSON
//! figures (median and range over rounds), the performance targets, a markdown
//! table and the plots; and `compare` of two such results.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use crate::stats::RunResult;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ReportArgs {
    /// The runs, one JSON object per line (`ringlock-bench --json` output).
    #[arg(long)]
    pub runs: PathBuf,
    /// A JSON object describing the run (date, commit, machine...), copied.
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// Output prefix: writes PREFIX.json, PREFIX.md, PREFIX-throughput.png
    /// and PREFIX-latency.png.
    #[arg(long)]
    pub out: PathBuf,
    /// A TrueType font for the plots (default: DejaVu Sans where Debian puts
    /// it).
    #[arg(long)]
    pub font: Option<PathBuf>,
    /// Skip the plots.
    #[arg(long)]
    pub no_plots: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CompareArgs {
    pub old: PathBuf,
    pub new: PathBuf,
    /// Smallest change flagged, whatever the noise (fraction).
    #[arg(long, default_value_t = 0.03)]
    pub floor: f64,
}

/// One figure over the rounds of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Stat {
    fn of(mut samples: Vec<f64>) -> Option<Stat> {
        samples.retain(|v| v.is_finite());
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            samples,
        })
    }

    /// The run's own noise for this figure: the range of its rounds relative
    /// to their median (0 with a single round: unknown).
    pub(crate) fn spread(&self) -> f64 {
        if self.samples.len() < 2 || self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median.abs()
        }
    }
}

/// One scenario as one target saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Group {
    pub scenario: String,
    pub label: String,
    pub target: String,
    pub mode: String,
    pub conns: u32,
    pub pipeline: u32,
    pub keys: u32,
    /// The generator's `--spin-us`.
    #[serde(default)]
    pub client_spin_us: u64,
    pub rounds: usize,
    pub figures: BTreeMap<String, Stat>,
}

impl Group {
    pub(crate) fn get(&self, figure: &str) -> Option<f64> {
        self.figures.get(figure).map(|s| s.median)
    }
}

/// A performance target, checked against this run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct TargetCheck {
    pub target: String,
    pub label: String,
    pub goal: String,
    pub measured: String,
    /// Measured ratio, and the limit it must not pass.
    pub ratio: Option<f64>,
    pub limit: f64,
    /// "met", "missed" or "not measured".
    pub verdict: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Results {
    pub meta: serde_json::Value,
    pub groups: Vec<Group>,
    pub targets: Vec<TargetCheck>,
    pub runs: Vec<RunResult>,
}

impl Results {
    pub(crate) fn group(&self, scenario: &str, label: &str) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.scenario == scenario && g.label == label)
    }
}

/// Whether bigger is better for a figure (`None`: not a performance figure).
pub(crate) fn higher_is_better(figure: &str) -> Option<bool> {
    if figure.ends_with("_per_s") {
        Some(true)
    } else if figure.ends_with("_us")
        || figure.ends_with("_ms")
        || figure.ends_with("_mib")
        || figure == "bytes_per_lock"
    {
        Some(false)
    } else {
        None
    }
}

fn figures_of(run: &RunResult) -> Vec<(String, f64)> {
    let mut f = Vec::new();
    if let Some(g) = &run.growth {
        f.push(("locks".into(), g.granted as f64));
        f.push(("fill_s".into(), g.seconds));
        f.push(("acquires_per_s".into(), g.acquires_per_s));
        f.push(("rss_peak_mib".into(), g.hwm_kib as f64 / 1024.0));
        if let Some(ms) = g.longest_turn_ms {
            f.push(("longest_turn_ms".into(), ms));
        }
        if let Some(n) = g.server_preempted {
            f.push(("server_preempted".into(), n as f64));
        }
        if let Some(other) = run.other_cpu {
            f.push(("other_util".into(), other));
        }
        f.push(("probe_cycles".into(), run.cycles as f64));
        if let Some(h) = &run.latency_us.cycle {
            f.push(("probe_cycle_p50_us".into(), h.p50));
            f.push(("probe_cycle_p99_us".into(), h.p99));
            f.push(("probe_cycle_p999_us".into(), h.p999));
            f.push(("probe_cycle_max_us".into(), h.max));
        }
        if let Some(h) = &run.latency_us.round_trip {
            f.push(("probe_rt_p999_us".into(), h.p999));
            f.push(("probe_rt_max_us".into(), h.max));
        }
        f.push(("errors".into(), run.errors as f64));
        return f;
    }
    if let Some(m) = &run.memory {
        f.push(("locks".into(), m.granted as f64));
        f.push(("rss_mib".into(), m.rss_after_kib as f64 / 1024.0));
        f.push(("rss_peak_mib".into(), m.hwm_kib as f64 / 1024.0));
        f.push(("bytes_per_lock".into(), m.bytes_per_lock));
        f.push(("acquires_per_s".into(), m.acquires_per_s));
        return f;
    }
    f.push(("cycles_per_s".into(), run.cycles_per_s));
    f.push(("round_trips_per_s".into(), run.round_trips_per_s));
    let l = &run.latency_us;
    for (name, h) in [
        ("cycle", &l.cycle),
        ("acquire", &l.acquire),
        ("release", &l.release),
        ("rt", &l.round_trip),
        ("handoff", &l.handoff),
    ] {
        if let Some(h) = h {
            f.push((format!("{name}_p50_us"), h.p50));
            f.push((format!("{name}_p90_us"), h.p90));
            f.push((format!("{name}_p99_us"), h.p99));
            f.push((format!("{name}_p999_us"), h.p999));
            f.push((format!("{name}_max_us"), h.max));
        }
    }
    if let Some(cpu) = &run.server_cpu {
        f.push(("server_cpu_per_cycle_us".into(), cpu.us_per_cycle));
        f.push(("server_util".into(), cpu.util));
    }
    crate::cluster_report::figures(run, &mut f);
    f.push(("client_util".into(), run.client_cpu.util));
    if let Some(other) = run.other_cpu {
        f.push(("other_util".into(), other));
    }
    f.push(("attempts_per_grant".into(), run.attempts_per_grant));
    if let Some(fair) = &run.fairness {
        f.push(("min_grants".into(), fair.min_grants as f64));
        f.push(("max_grants".into(), fair.max_grants as f64));
    }
    f.push(("errors".into(), run.errors as f64));
    f
}

pub(crate) fn aggregate(runs: &[RunResult]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut samples: Vec<BTreeMap<String, Vec<f64>>> = Vec::new();
    for run in runs {
        let i = match groups
            .iter()
            .position(|g| g.scenario == run.scenario && g.label == run.label)
        {
            Some(i) => i,
            None => {
                groups.push(Group {
                    scenario: run.scenario.clone(),
                    label: run.label.clone(),
                    target: run.target.clone(),
                    mode: run.mode.clone(),
                    conns: run.conns,
                    pipeline: run.pipeline,
                    keys: run.keys,
                    client_spin_us: run.spin_us,
                    ..Group::default()
                });
                samples.push(BTreeMap::new());
                groups.len() - 1
            }
        };
        groups[i].rounds += 1;
        for (name, value) in figures_of(run) {
            samples[i].entry(name).or_default().push(value);
        }
    }
    for (g, s) in groups.iter_mut().zip(samples) {
        g.figures = s
            .into_iter()
            .filter_map(|(k, v)| Stat::of(v).map(|s| (k, s)))
            .collect();
    }
    groups
}

/// The ringlock labels of a run (every label whose target is ringlock).
fn ringlock_labels(groups: &[Group]) -> Vec<String> {
    let mut labels: Vec<String> = Vec::new();
    for g in groups {
        if g.target == "ringlock" && !labels.contains(&g.label) {
            labels.push(g.label.clone());
        }
    }
    labels
}

/// Scenario names bench.sh uses.
pub(crate) const PINGPONG: &str = "conns-1";
/// Ping-pong with the generator spinning too (`--spin-us`): what is left
/// of a round trip is the server's side.
pub(crate) const PINGPONG_SPINNING_CLIENT: &str = "spinning-client";
pub(crate) const CONNS50: &str = "conns-50";
pub(crate) const PIPELINED: &str = "pipelined";
pub(crate) const CONTENDED: &str = "contended";
pub(crate) const MEMORY: &str = "memory";
pub(crate) const GROWTH: &str = "growth";
pub(crate) const ECHO: &str = "echo";
pub(crate) const REDIS: &str = "redis";
/// The suffix of a cluster row's label: `<label>-cluster` is `<label>` as
/// an active (primary) with two standbys (replicas).
pub(crate) const CLUSTER: &str = "-cluster";

#[expect(clippy::too_many_lines)]
pub(crate) fn check_targets(r: &Results) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    let fig = |scenario: &str, label: &str, figure: &str| -> Option<f64> {
        r.group(scenario, label)?.get(figure)
    };
    let echo_rt_p50 = fig(PINGPONG, ECHO, "rt_p50_us");
    let echo_rt_p99 = fig(PINGPONG, ECHO, "rt_p99_us");
    let echo50_rts = fig(CONNS50, ECHO, "round_trips_per_s");
    let redis50 = fig(CONNS50, REDIS, "cycles_per_s");
    let redis50_cpu = fig(CONNS50, REDIS, "server_cpu_per_cycle_us");
    let redis_pipe = fig(PIPELINED, REDIS, "cycles_per_s");
    let labels = ringlock_labels(&r.groups);
    // The TLS variants have a table of their own (their cost against the
    // same server in plain text, see `tls_costs`), not the plain targets.
    // So do the clusters (`cluster_targets`).
    for label in labels
        .iter()
        .filter(|l| !l.ends_with("-spin") && !l.ends_with("-tls") && !l.ends_with(CLUSTER))
    {
        let mut push = |target: &str,
                        goal: &str,
                        measured: String,
                        ratio: Option<f64>,
                        limit: f64,
                        at_most: bool| {
            let verdict = match ratio {
                None => "not measured",
                Some(x) if (at_most && x <= limit) || (!at_most && x >= limit) => "met",
                Some(_) => "missed",
            };
            checks.push(TargetCheck {
                target: target.into(),
                label: label.clone(),
                goal: goal.into(),
                measured,
                ratio,
                limit,
                verdict: verdict.into(),
            });
        };
        // 1. Ping-pong cycle p50 within 1.1 x two echo round trips.
        let p50 = fig(PINGPONG, label, "cycle_p50_us");
        let ratio = p50.zip(echo_rt_p50).map(|(a, e)| a / (2.0 * e));
        push(
            "1 conn ping-pong",
            "cycle p50 <= 1.1 x 2 echo round trips (p50)",
            match (p50, echo_rt_p50) {
                (Some(a), Some(e)) => format!("{a:.1} µs vs 2 x {e:.1} µs"),
                _ => "-".into(),
            },
            ratio,
            1.1,
            true,
        );
        // 1b. With --spin-us: at most 0.4 x the cycle p50 without it.
        let spin = fig(PINGPONG, &format!("{label}-spin"), "cycle_p50_us");
        push(
            "1 conn ping-pong, --spin-us",
            "cycle p50 <= 0.4 x without spin",
            match (spin, p50) {
                (Some(s), Some(a)) => format!("{s:.1} µs vs {a:.1} µs"),
                _ => "server has no --spin-us yet".into(),
            },
            spin.zip(p50).map(|(s, a)| s / a),
            0.4,
            true,
        );
        // 1c. The same with the generator spinning as well: the client's
        // wake-up, which no server can save, is out of the round trip.
        let client_spin = |l: &str| fig(PINGPONG_SPINNING_CLIENT, l, "cycle_p50_us");
        let (without, with) = (client_spin(label), client_spin(&format!("{label}-spin")));
        push(
            "1 conn ping-pong, --spin-us, spinning client",
            "cycle p50 <= 0.4 x without spin (generator --spin-us too)",
            match (with, without) {
                (Some(s), Some(a)) => format!("{s:.1} µs vs {a:.1} µs"),
                _ => "-".into(),
            },
            with.zip(without).map(|(s, a)| s / a),
            0.4,
            true,
        );
        // 2. 50 connections.
        let c50 = fig(CONNS50, label, "cycles_per_s");
        push(
            "50 conns vs echo",
            "cycles/s >= 0.9 x echo round trips/s / 2",
            match (c50, echo50_rts) {
                (Some(c), Some(e)) => format!("{c:.0}/s vs {:.0}/s", e / 2.0),
                _ => "-".into(),
            },
            c50.zip(echo50_rts).map(|(c, e)| c / (e / 2.0)),
            0.9,
            false,
        );
        push(
            "50 conns vs Redis",
            "cycles/s >= 1.15 x Redis",
            match (c50, redis50) {
                (Some(c), Some(x)) => format!("{c:.0}/s vs {x:.0}/s"),
                _ => "-".into(),
            },
            c50.zip(redis50).map(|(c, x)| c / x),
            1.15,
            false,
        );
        let cpu = fig(CONNS50, label, "server_cpu_per_cycle_us");
        push(
            "50 conns server CPU",
            "server CPU per cycle <= 0.5 x Redis",
            match (cpu, redis50_cpu) {
                (Some(c), Some(x)) => format!("{c:.2} µs vs {x:.2} µs"),
                _ => "-".into(),
            },
            cpu.zip(redis50_cpu).map(|(c, x)| c / x),
            0.5,
            true,
        );
        // 3. Pipelined.
        let pipe = fig(PIPELINED, label, "cycles_per_s");
        push(
            "4 conns x 32 pipelined",
            "cycles/s >= 3 x Redis",
            match (pipe, redis_pipe) {
                (Some(c), Some(x)) => format!("{c:.0}/s vs {x:.0}/s"),
                _ => "-".into(),
            },
            pipe.zip(redis_pipe).map(|(c, x)| c / x),
            3.0,
            false,
        );
        // 4. Contended.
        let h99 = fig(CONTENDED, label, "handoff_p99_us");
        push(
            "64 clients, 1 key",
            "hand-off p99 <= 2 x echo round trip p99",
            match (h99, echo_rt_p99) {
                (Some(h), Some(e)) => format!("{h:.1} µs vs 2 x {e:.1} µs"),
                _ => "-".into(),
            },
            h99.zip(echo_rt_p99).map(|(h, e)| h / (2.0 * e)),
            1.0,
            true,
        );
        // 5. Memory.
        // Peak RSS: the RSS right after the fill depends on whether the
        // allocator has purged the buffers that growth freed; the peak not.
        // Only a fill of 1M locks or more can meet or miss it: a quick
        // run's smaller fill is shown for what it is, not judged.
        let rss = fig(MEMORY, label, "rss_peak_mib");
        let after = fig(MEMORY, label, "rss_mib");
        let locks = fig(MEMORY, label, "locks");
        let full = locks.is_some_and(|n| n >= TARGET_LOCKS);
        push(
            "1M locks memory",
            "peak RSS < 256 MiB with 1M held locks (16-byte keys)",
            memory_measured(rss, after, locks),
            rss.filter(|_| full).map(|m| m / 256.0),
            1.0,
            true,
        );
    }
    checks
}

/// The fill the memory target is stated for.
const TARGET_LOCKS: f64 = 1_000_000.0;

/// What the memory target's row says was measured: the peaks and how many
/// locks were held, and when that is fewer than the target's million,
/// that it cannot be judged.
fn memory_measured(rss: Option<f64>, after: Option<f64>, locks: Option<f64>) -> String {
    match (rss, after, locks) {
        (Some(m), Some(a), Some(n)) => {
            let what = format!("peak {m:.1} MiB, {a:.1} MiB after a fill of {n:.0} locks");
            if n >= TARGET_LOCKS {
                what
            } else {
                format!("{what} (fewer than 1M: not judged)")
            }
        }
        _ => "-".into(),
    }
}

pub(crate) fn main_report(args: ReportArgs) -> crate::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.runs)?;
    let mut runs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let run: RunResult = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: {e}", args.runs.display(), i + 1))?;
        runs.push(run);
    }
    let meta = match &args.meta {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => serde_json::Value::Null,
    };
    let mut results = Results {
        meta,
        groups: aggregate(&runs),
        targets: Vec::new(),
        runs,
    };
    results.targets = check_targets(&results);
    results
        .targets
        .extend(crate::cluster_report::targets(&results));
    let stem = args.out.clone();
    let with_ext = |ext: &str| {
        let mut p = stem.clone().into_os_string();
        p.push(ext);
        PathBuf::from(p)
    };
    std::fs::write(
        with_ext(".json"),
        serde_json::to_string_pretty(&results)? + "\n",
    )?;
    let mut plots = Vec::new();
    if !args.no_plots {
        let font = crate::plot::load_font(args.font.as_deref())?;
        let throughput = with_ext("-throughput.png");
        crate::plot::throughput(&results, &throughput, font)?;
        let latency = with_ext("-latency.png");
        crate::plot::latency(&results, &latency, font)?;
        plots.push(throughput);
        plots.push(latency);
    }
    let md = markdown(&results, &plots);
    std::fs::write(with_ext(".md"), &md)?;
    print!("{md}");
    Ok(ExitCode::SUCCESS)
}

fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn fmt_us(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 1000.0 => format!("{:.2} ms", v / 1000.0),
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

fn range(g: &Group, figure: &str, fmt: fn(f64) -> String) -> String {
    match g.figures.get(figure) {
        Some(s) if s.samples.len() > 1 => {
            format!("{} ({}–{})", fmt(s.median), fmt(s.min), fmt(s.max))
        }
        Some(s) => fmt(s.median),
        None => "-".into(),
    }
}

/// One row of the TLS cost table.
#[derive(Debug)]
pub(crate) struct TlsCost {
    pub scenario: String,
    pub label: String,
    pub tls_cps: Option<f64>,
    pub plain_cps: Option<f64>,
    pub tls_p50: Option<f64>,
    pub plain_p50: Option<f64>,
    /// The server's CPU per cycle (µs): the cost least moved by what else
    /// runs on the machine.
    pub tls_cpu: Option<f64>,
    pub plain_cpu: Option<f64>,
}

/// Every `<label>-tls` group beside the `<label>` group of its scenario.
pub(crate) fn tls_costs(r: &Results) -> Vec<TlsCost> {
    let mut rows = Vec::new();
    for g in &r.groups {
        let Some(plain) = g.label.strip_suffix("-tls") else {
            continue;
        };
        let p = r.group(&g.scenario, plain);
        rows.push(TlsCost {
            scenario: g.scenario.clone(),
            label: g.label.clone(),
            tls_cps: g.get("cycles_per_s"),
            plain_cps: p.and_then(|p| p.get("cycles_per_s")),
            tls_p50: g.get("cycle_p50_us"),
            plain_p50: p.and_then(|p| p.get("cycle_p50_us")),
            tls_cpu: g.get("server_cpu_per_cycle_us"),
            plain_cpu: p.and_then(|p| p.get("server_cpu_per_cycle_us")),
        });
    }
    rows
}

#[expect(clippy::too_many_lines)]
pub(crate) fn markdown(r: &Results, plots: &[PathBuf]) -> String {
    let mut md = String::new();
    let meta = &r.meta;
    let m = |k: &str| {
        meta.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string()
    };
    let _ = writeln!(
        md,
        "# ringlock benchmark, {} ({})\n",
        m("date"),
        m("commit")
    );
    let _ = writeln!(
        md,
        "Machine: {} ({} cores), kernel {}; load average before/after: {} / {}.  ",
        m("cpu"),
        m("nproc"),
        m("kernel"),
        m("load_before"),
        m("load_after")
    );
    if r.groups.iter().all(|g| g.scenario == GROWTH) {
        let _ = writeln!(
            md,
            "Servers pinned to core {}, load generator to core {} (`taskset`); {} rounds, \
             backends alternated, each run on a freshly started server.  ",
            m("server_core"),
            m("client_core"),
            m("rounds"),
        );
    } else {
        let _ = writeln!(
            md,
            "Servers pinned to core {}, load generator to core {} (`taskset`); {} rounds, \
             targets alternated within each round; {} s warm-up + {} s measured per run. \
             Redis: {}.  ",
            m("server_core"),
            m("client_core"),
            m("rounds"),
            m("warmup"),
            m("duration"),
            m("redis_version")
        );
    }
    let _ = writeln!(md, "Command: `{}`\n", m("command"));
    let _ = writeln!(
        md,
        "Figures are medians over the rounds, (min–max) when there were several. \
         Latencies in µs. A cycle is one acquire and its release; `echo` bounces the \
         same two lines, so its cycle is two bare round trips. CPU columns are \
         % of one core over the measured window; *rest of machine* is what everything \
         else used meanwhile (other processes, interrupt time charged to neither \
         process): a run with a high one was disturbed.\n"
    );

    if r.targets.iter().any(|t| t.verdict != "not measured") {
        let _ = writeln!(md, "## Performance targets\n");
        let _ = writeln!(
            md,
            "| target | server | goal | measured | ratio (limit) | verdict |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | **{}** |",
                t.target,
                t.label,
                t.goal,
                t.measured,
                t.ratio
                    .map_or("-".into(), |x| format!("{x:.2} ({:.2})", t.limit)),
                t.verdict
            );
        }
        let _ = writeln!(md);
    }

    let costs = tls_costs(r);
    if !costs.is_empty() {
        let _ = writeln!(
            md,
            "## The cost of TLS
"
        );
        let _ = writeln!(
            md,
            "Each `-tls` server against the same server in plain text, measured in the same \
             rounds (targets alternated): the server's CPU per cycle (µs; the ratio above 1 \
             is the cost, and the figure least moved by what else runs on the machine), \
             throughput (TLS / plain, below 1 is a cost) and the cycle p50 (above 1 is a \
             cost). TLS 1.3, the handshake done before the clock starts.\n"
        );
        let _ = writeln!(
            md,
            "| scenario | server | server CPU/cycle TLS | plain | ratio | cycles/s TLS | plain | ratio | cycle p50 TLS | plain | ratio |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
        for c in &costs {
            let ratio = |a: Option<f64>, b: Option<f64>| {
                a.zip(b)
                    .map_or("-".into(), |(a, b)| format!("{:.2}", a / b))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.scenario,
                c.label,
                fmt_us(c.tls_cpu),
                fmt_us(c.plain_cpu),
                ratio(c.tls_cpu, c.plain_cpu),
                c.tls_cps.map_or("-".into(), fmt_rate),
                c.plain_cps.map_or("-".into(), fmt_rate),
                ratio(c.tls_cps, c.plain_cps),
                fmt_us(c.tls_p50),
                fmt_us(c.plain_p50),
                ratio(c.tls_p50, c.plain_p50),
            );
        }
        let _ = writeln!(md);
    }

    crate::cluster_report::markdown(r, &mut md);

    let mut scenarios: Vec<&str> = Vec::new();
    for g in &r.groups {
        if !scenarios.contains(&g.scenario.as_str()) {
            scenarios.push(&g.scenario);
        }
    }
    for scenario in scenarios {
        let groups: Vec<&Group> = r.groups.iter().filter(|g| g.scenario == scenario).collect();
        let first = groups[0];
        if scenario == GROWTH {
            let _ = writeln!(
                md,
                "## {scenario}: fill a fresh server with {} locks ({} conns x {} acquires in \
                 flight, long lease) while a probe connection runs acquire/release cycles\n",
                fmt_rate(first.get("locks").unwrap_or(0.0)),
                first.conns,
                first.pipeline
            );
            let _ = writeln!(
                md,
                "| server | locks | fill (s) | acquires/s | longest loop turn (ms) | probe cycles | probe cycle p50 | p99 | p99.9 | max | probe round trip p99.9 | max | peak RSS (MiB) | server preempted | rest of machine |"
            );
            let _ = writeln!(
                md,
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            );
            for g in &groups {
                let ms = |f: &str| g.get(f).map_or("-".into(), |v| format!("{v:.1}"));
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    g.label,
                    fmt_rate(g.get("locks").unwrap_or(0.0)),
                    ms("fill_s"),
                    range(g, "acquires_per_s", fmt_rate),
                    range(g, "longest_turn_ms", |v| format!("{v:.1}")),
                    g.get("probe_cycles")
                        .map_or("-".into(), |v| format!("{v:.0}")),
                    fmt_us(g.get("probe_cycle_p50_us")),
                    fmt_us(g.get("probe_cycle_p99_us")),
                    fmt_us(g.get("probe_cycle_p999_us")),
                    fmt_us(g.get("probe_cycle_max_us")),
                    fmt_us(g.get("probe_rt_p999_us")),
                    fmt_us(g.get("probe_rt_max_us")),
                    ms("rss_peak_mib"),
                    range(g, "server_preempted", |v| format!("{v:.0}")),
                    g.get("other_util")
                        .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
                );
            }
            let _ = writeln!(md);
            // Run by run: a long turn next to a busy rest of machine.
            let _ = writeln!(
                md,
                "| round | server | longest loop turn (ms) | probe cycle max | server preempted | rest of machine |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|");
            for run in r.runs.iter().filter(|run| run.scenario == scenario) {
                let Some(growth) = &run.growth else {
                    continue;
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    run.round,
                    run.label,
                    growth
                        .longest_turn_ms
                        .map_or("-".into(), |v| format!("{v:.1}")),
                    fmt_us(run.latency_us.cycle.as_ref().map(|c| c.max)),
                    growth
                        .server_preempted
                        .map_or("-".into(), |v| v.to_string()),
                    run.other_cpu
                        .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
                );
            }
            let _ = writeln!(md);
            continue;
        }
        if scenario == MEMORY {
            let _ = writeln!(
                md,
                "## {scenario}: hold {} locks, 16-byte keys, long lease, no release\n",
                fmt_rate(first.get("locks").unwrap_or(0.0)),
            );
            let _ = writeln!(
                md,
                "| server | RSS after (MiB) | peak RSS (MiB) | bytes per lock | acquires/s |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|");
            for g in &groups {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} |",
                    g.label,
                    range(g, "rss_mib", |v| format!("{v:.1}")),
                    range(g, "rss_peak_mib", |v| format!("{v:.1}")),
                    range(g, "bytes_per_lock", |v| format!("{v:.0}")),
                    range(g, "acquires_per_s", fmt_rate),
                );
            }
            let _ = writeln!(md);
            continue;
        }
        let spinning = if first.client_spin_us > 0 {
            format!(", generator spinning {} µs", first.client_spin_us)
        } else {
            String::new()
        };
        let _ = writeln!(
            md,
            "## {scenario}: {} conns x {} in flight, {} ({} keys{spinning})\n",
            first.conns, first.pipeline, first.mode, first.keys
        );
        let contended = first.mode == "contended";
        if contended {
            let _ = writeln!(
                md,
                "| server | cycles/s | hand-off p50 | p90 | p99 | p99.9 | acquire p50 | acquire p99 | grants per client min/max | SET attempts per grant | server CPU µs/cycle | server CPU | generator CPU | rest of machine |"
            );
            let _ = writeln!(
                md,
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            );
        } else {
            let _ = writeln!(
                md,
                "| server | cycles/s | round trips/s | cycle p50 | p90 | p99 | p99.9 | max | server CPU µs/cycle | server CPU | generator CPU | rest of machine |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        }
        for g in &groups {
            let pct = |f: &str| {
                g.get(f)
                    .map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
            };
            if contended {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} | {} | {} | {} | {} |",
                    g.label,
                    range(g, "cycles_per_s", fmt_rate),
                    fmt_us(g.get("handoff_p50_us")),
                    fmt_us(g.get("handoff_p90_us")),
                    range(g, "handoff_p99_us", |v| fmt_us(Some(v))),
                    fmt_us(g.get("handoff_p999_us")),
                    fmt_us(g.get("acquire_p50_us")),
                    fmt_us(g.get("acquire_p99_us")),
                    g.get("min_grants")
                        .map_or("-".into(), |v| format!("{v:.0}")),
                    g.get("max_grants")
                        .map_or("-".into(), |v| format!("{v:.0}")),
                    g.get("attempts_per_grant")
                        .map_or("-".into(), |v| format!("{v:.2}")),
                    fmt_us(
                        g.get("server_cpu_per_cycle_us")
                            .map(|v| (v * 100.0).round() / 100.0)
                    ),
                    pct("server_util"),
                    pct("client_util"),
                    pct("other_util"),
                );
            } else {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    g.label,
                    range(g, "cycles_per_s", fmt_rate),
                    fmt_rate(g.get("round_trips_per_s").unwrap_or(0.0)),
                    range(g, "cycle_p50_us", |v| fmt_us(Some(v))),
                    fmt_us(g.get("cycle_p90_us")),
                    range(g, "cycle_p99_us", |v| fmt_us(Some(v))),
                    fmt_us(g.get("cycle_p999_us")),
                    fmt_us(g.get("cycle_max_us")),
                    g.get("server_cpu_per_cycle_us")
                        .map_or("-".into(), |v| format!("{v:.2}")),
                    pct("server_util"),
                    pct("client_util"),
                    pct("other_util"),
                );
            }
        }
        let _ = writeln!(md);
    }
    for plot in plots {
        let name = plot
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(md, "![{name}]({name})\n");
    }
    md
}

pub(crate) fn main_compare(args: CompareArgs) -> crate::Result<ExitCode> {
    let load = |p: &PathBuf| -> crate::Result<Results> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?)
    };
    let old = load(&args.old)?;
    let new = load(&args.new)?;
    let (report, regressions) = compare(&old, &new, args.floor);
    print!("{report}");
    Ok(if regressions > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The main figures compared (others are in the JSON for people).
const COMPARED: &[&str] = &[
    "cycles_per_s",
    "cycle_p50_us",
    "cycle_p99_us",
    "handoff_p50_us",
    "handoff_p99_us",
    "server_cpu_per_cycle_us",
    "rss_mib",
];

/// Per-figure ratios new/old. A change in the worse direction is flagged
/// when it is larger than both the floor and the noise, the noise being the
/// larger of the two runs' own spreads (range of the rounds over their
/// median) for that figure. With one round (`--quick`) there is no spread:
/// the floor is then tripled.
pub(crate) fn compare(old: &Results, new: &Results, floor: f64) -> (String, usize) {
    let mut out = String::new();
    let mut regressions = 0;
    let m = |r: &Results, k: &str| {
        r.meta
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string()
    };
    let _ = writeln!(
        out,
        "old: {} ({})   new: {} ({})",
        m(old, "date"),
        m(old, "commit"),
        m(new, "date"),
        m(new, "commit")
    );
    let _ = writeln!(
        out,
        "{:<12} {:<22} {:<24} {:>12} {:>12} {:>7} {:>7}  verdict",
        "scenario", "server", "figure", "old", "new", "ratio", "noise"
    );
    for g in &new.groups {
        let Some(o) = old.group(&g.scenario, &g.label) else {
            continue;
        };
        for &figure in COMPARED {
            let (Some(a), Some(b)) = (o.figures.get(figure), g.figures.get(figure)) else {
                continue;
            };
            let Some(higher) = higher_is_better(figure) else {
                continue;
            };
            if a.median == 0.0 {
                continue;
            }
            let ratio = b.median / a.median;
            let single = a.samples.len() < 2 || b.samples.len() < 2;
            let noise = a.spread().max(b.spread());
            let threshold = noise.max(if single { 3.0 * floor } else { floor });
            let worse = if higher { 1.0 - ratio } else { ratio - 1.0 };
            let verdict = if worse > threshold {
                regressions += 1;
                "REGRESSION"
            } else if -worse > threshold {
                "better"
            } else {
                "same"
            };
            let _ = writeln!(
                out,
                "{:<12} {:<22} {:<24} {:>12.2} {:>12.2} {:>7.3} {:>6.1}%  {}",
                g.scenario,
                g.label,
                figure,
                a.median,
                b.median,
                ratio,
                threshold * 100.0,
                verdict
            );
        }
    }
    let _ = writeln!(
        out,
        "{regressions} regression(s) beyond noise (noise: larger relative range of the rounds \
         of either run, at least {:.0}%; {:.0}% when a run has one round)",
        floor * 100.0,
        floor * 300.0
    );
    (out, regressions)
}

#[cfg(test)]
mod tests {
    use super::memory_measured;

    #[test]
    fn a_fill_smaller_than_the_target_is_labelled_and_not_judged() {
        assert_eq!(
            memory_measured(Some(20.5), Some(18.0), Some(100_000.0)),
            "peak 20.5 MiB, 18.0 MiB after a fill of 100000 locks (fewer than 1M: not judged)"
        );
        assert_eq!(
            memory_measured(Some(140.0), Some(130.0), Some(1_000_000.0)),
            "peak 140.0 MiB, 130.0 MiB after a fill of 1000000 locks"
        );
        assert_eq!(memory_measured(None, None, None), "-");
    }
}
