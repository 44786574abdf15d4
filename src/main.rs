use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// ringlock: a distributed lock server with FIFO fairness and fencing tokens.
#[derive(Parser)]
#[command(version, about)]
enum Command {
    /// Run a ringlock node.
    Serve(ringlock::server::ServeArgs),
    #[command(flatten)]
    Client(ringlock::cli::ClientCommand),
}

fn main() -> ExitCode {
    match Command::parse() {
        Command::Serve(args) => match ringlock::server::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("ringlock: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Client(cmd) => ringlock::cli::run(cmd),
    }
}
