//! Partition and chaos runs of a three-node ringlock cluster in network
//! namespaces (root only). Driven by `scripts/chaos.sh`, which builds the
//! binaries and cleans up after a hard stop; see `harness/` for what is
//! measured and checked.
//!
//! ```text
//! chaos run     --bin RINGLOCK --seed N --duration S [options]
//! chaos measure --bin RINGLOCK [--lengths 1,2,4,7,14] [--reps 3] [--gap 5] [options]
//! chaos schedule --seed N --duration S      (prints the schedule only)
//!
//! options: --io uring|epoll (uring)  --out DIR (chaos-out)  --prefix NAME
//!   --serve-args "ARGS" (appended to every node's `ringlock serve`)
//!          --clients N (8)  --keys N (4)  --heartbeat-ms MS (50)
//!          --peer-timeout-ms MS (500)  --quiet
//! ```
//!
//! `run`: faults from a schedule seeded by `--seed` (the same seed and
//! duration give the same schedule). `measure`: the active (node 0) is
//! isolated from its peers for each length, then a standby (node 2) is,
//! each followed by `--gap` seconds of quiet, `--reps` times.
//!
//! Writes into `--out`: `report.md`, `report.json`, `schedule.txt`,
//! `events.log`, `grants.csv`, `status.csv` and each node's stderr
//! (`node<i>.log`, lines stamped with seconds since the run began). Prints
//! the report; exits 1 if a check fails, 2 if the run could not be made.

#![deny(unsafe_code)]

mod harness;

use std::path::PathBuf;

use harness::{Config, check};

fn usage(why: &str) -> ! {
    eprintln!("chaos: {why}\nusage: chaos run|measure|schedule [options] (see the source)");
    std::process::exit(2);
}

#[expect(clippy::too_many_lines)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = args.first().cloned() else {
        usage("no mode given");
    };
    let opt = |name: &str| -> Option<String> {
        args.windows(2)
            .find(|w| w[0] == format!("--{name}"))
            .map(|w| w[1].clone())
    };
    let num = |name: &str, default: u64| -> u64 {
        opt(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("bad --{name} {v:?}")))
        })
    };
    let flag = |name: &str| args.iter().any(|a| *a == format!("--{name}"));
    let seed = num("seed", 1);
    let duration_s = num("duration", 120);
    let nodes = 3;
    let bin = PathBuf::from(opt("bin").unwrap_or_else(|| "target/release/ringlock".into()));
    let io = opt("io").unwrap_or_else(|| "uring".into());
    let out = PathBuf::from(opt("out").unwrap_or_else(|| "chaos-out".into()));
    let prefix = opt("prefix").unwrap_or_else(|| format!("rlc{}", std::process::id()));
    let mut cfg = Config::new(bin, &io, out, &prefix);
    cfg.seed = seed;
    cfg.nodes = nodes;
    cfg.clients = num("clients", 8) as usize;
    cfg.keys = num("keys", 4) as usize;
    cfg.heartbeat_ms = num("heartbeat-ms", 50);
    cfg.peer_timeout_ms = num("peer-timeout-ms", 500);
    cfg.verbose = !flag("quiet");
    cfg.serve_args = opt("serve-args")
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    // The run ends with at least this much quiet after the last heal.
    let quiet_ms = cfg.settle_ms.max(3000) + 2000;
    match mode.as_str() {
        "run" | "schedule" => {
            cfg.total_ms = duration_s * 1000;
            cfg.faults = harness::chaos_schedule(seed, cfg.total_ms, nodes, quiet_ms);
        }
        "measure" => {
            let lengths: Vec<u64> = opt("lengths")
                .unwrap_or_else(|| "1,2,4,7,14".into())
                .split(',')
                .map(|s| {
                    let secs: f64 = s.parse().unwrap_or_else(|_| usage("bad --lengths"));
                    (secs * 1000.0) as u64
                })
                .collect();
            let reps = num("reps", 3) as usize;
            let gap_ms = num("gap", 5) * 1000;
            cfg.faults = harness::measure_schedule(&lengths, reps, gap_ms);
            cfg.total_ms = cfg.faults.iter().map(|f| f.end_ms()).max().unwrap_or(0) + gap_ms;
        }
        other => usage(&format!("unknown mode {other:?}")),
    }
    let mut schedule = format!(
        "# {} faults over {} s (seed {seed}, mode {mode})\n",
        cfg.faults.len(),
        cfg.total_ms / 1000
    );
    for f in &cfg.faults {
        schedule += &format!(
            "{:3} at {:7.3} s: {}\n",
            f.id,
            f.start_ms as f64 / 1000.0,
            f.describe()
        );
    }
    if mode == "schedule" {
        print!("{schedule}");
        return;
    }
    if let Err(e) = harness::net::available() {
        usage(&format!("cannot make network namespaces here: {e}"));
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.out) {
        usage(&format!("{}: {e}", cfg.out.display()));
    }
    let _ = std::fs::write(cfg.out.join("schedule.txt"), &schedule);
    if cfg.verbose {
        eprint!("{schedule}");
    }
    let record = match harness::run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chaos: the run failed: {e}");
            std::process::exit(2);
        }
    };
    let report = check::analyse(&cfg, &record);
    if let Err(e) = check::write_raw(&cfg.out, &record) {
        eprintln!("chaos: writing raw records: {e}");
    }
    let _ = std::fs::write(cfg.out.join("report.md"), &report.text);
    let _ = std::fs::write(
        cfg.out.join("report.json"),
        serde_json::to_string_pretty(&report.json).unwrap_or_default() + "\n",
    );
    print!("{}", report.text);
    std::process::exit(if report.passed() { 0 } else { 1 });
}
