#![deny(unsafe_code)]

use std::io::Write as _;
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
    /// Write a fresh cluster secret (256 random bits, as hex) to a new file
    /// readable by its owner only, for --cluster-secret-file. Copy the same
    /// file to every node of the cluster. Never overwrites a file.
    Keygen {
        /// Where to write it (must not exist).
        path: std::path::PathBuf,
    },
    #[command(flatten)]
    Client(ringlock::cli::ClientCommand),
}

fn main() -> ExitCode {
    let command = match Command::try_parse() {
        Ok(command) => command,
        Err(err) => return ringlock::cli::not_run(&err),
    };
    match command {
        Command::Serve(args) => {
            ringlock::log::init(args.log_format);
            match ringlock::server::run(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!(target: "ringlock::server", "{err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Keygen { path } => match ringlock::secret::generate(&path) {
            Ok(()) => {
                // (Not eprintln!: it panics if stderr cannot be written,
                // and the file is written either way.)
                let _ = writeln!(
                    std::io::stderr(),
                    "ringlock: wrote a new cluster secret to {} (mode 600); copy it to every \
                         node and start each with --cluster-secret-file {}",
                    path.display(),
                    path.display()
                );
                ExitCode::SUCCESS
            }
            Err(err) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "ringlock: cannot write {}: {err}",
                    path.display()
                );
                ExitCode::FAILURE
            }
        },
        Command::Client(cmd) => ringlock::cli::run(cmd),
    }
}
