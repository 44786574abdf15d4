//! `ringlock-bench`: the load generator, the loopback echo floor, and the
//! tools that turn runs into results (report, plots, compare) and count the
//! engine's instructions for the CI gate.
//!
//! ```text
//! ringlock-bench [--target ringlock|redis|echo] [--addr ADDR] [--conns N]
//!                [--pipeline P] [--keys K] [--mode uncontended|contended|memory|grow]
//!                [--warmup S] [--duration S] [--server-pid PID] [--json]
//! ringlock-bench echo-server --listen ADDR [--spin-us N]
//! ringlock-bench report --runs RUNS.jsonl --meta META.json --out PREFIX
//! ringlock-bench compare OLD.json NEW.json
//! ringlock-bench instr CASE [--iters N]      (run under callgrind by scripts/instructions.sh)
//! ringlock-bench free-port
//! ```
//!
//! See docs/performance.md for what is measured and why it is measured this
//! way.

#![deny(unsafe_code)]

mod cluster_report;
mod echo;
mod grow;
// The only unsafe code here is `#[unsafe(no_mangle)]`, which callgrind
// needs to find each case's function by name. It is sound while no other
// symbol in the binary has the same name: every one is
// `ringlock_instr_<case>`, defined once.
#[allow(unsafe_code)]
mod instr;
mod load;
mod pace;
mod plot;
mod proc;
mod replication;
mod report;
mod stats;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generator and benchmark tools for ringlock (docs/performance.md).
#[derive(Parser)]
#[command(
    name = "ringlock-bench",
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: load::RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// A trivial line echo server: the loopback floor.
    EchoServer(echo::EchoArgs),
    /// Aggregates the runs of one bench.sh run into JSON, markdown and PNGs.
    Report(report::ReportArgs),
    /// Per-figure ratios of two result files; flags regressions beyond noise.
    Compare(report::CompareArgs),
    /// One engine hot path, N times, for callgrind (scripts/instructions.sh).
    Instr(instr::InstrArgs),
    /// Prints a free loopback TCP port.
    FreePort,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        None => load::main(cli.run),
        Some(Cmd::EchoServer(args)) => echo::main(args),
        Some(Cmd::Report(args)) => report::main_report(args),
        Some(Cmd::Compare(args)) => report::main_compare(args),
        Some(Cmd::Instr(args)) => instr::main(args),
        Some(Cmd::FreePort) => free_port(),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("ringlock-bench: {err}");
            ExitCode::FAILURE
        }
    }
}

/// What every subcommand returns: an exit code, or an error to print.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn free_port() -> Result<ExitCode> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    Ok(ExitCode::SUCCESS)
}
