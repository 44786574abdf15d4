//! The command line for people: `acquire`, `release`, `renew`, `run`,
//! `status`, all built on [`crate::client`].
//!
//! Servers come from `--server ADDR,ADDR,...`, else from the environment
//! variable `RINGLOCK_SERVERS` (same form), else `127.0.0.1:7171`.
//! Durations are in the protocol's seconds form: `30`, `1.5`, `0.25` (at
//! most three decimals).
//!
//! Exit status:
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | done (acquired, released, renewed, status shown) |
//! | 1    | `release`/`renew`: no grant of KEY carries TOKEN (not held) |
//! | 2    | bad command line or argument (bad key, lease out of range, ...) |
//! | 69   | no server could be reached, or no active node |
//! | 70   | protocol error (the server sent `E` or a malformed line) |
//! | 75   | `acquire`/`run`: the wait ran out, nothing held (CMD not run) |
//! | 76   | `run`: the lock was lost while CMD ran; CMD was sent SIGTERM |
//! | 126, 127 | `run`: CMD could not be started (127: not found) |
//! | other | `run`: CMD's own status, 128+N if it was killed by signal N |

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use crate::client::{Acquired, Client, Error, check_key, node_problem, node_status};
use crate::proto::{MAX_DURATION_MS, parse_seconds};

/// Exit status: `release`/`renew` found no grant with that token.
pub const EXIT_NOT_HELD: u8 = 1;
/// Exit status: bad argument.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: no server reachable / no active node.
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Exit status: the server broke the protocol.
pub const EXIT_PROTOCOL: u8 = 70;
/// Exit status: the wait ran out (EX_TEMPFAIL).
pub const EXIT_TIMEOUT: u8 = 75;
/// Exit status: `run` lost the lock while the command ran.
pub const EXIT_LOST: u8 = 76;

const DEFAULT_SERVER: &str = "127.0.0.1:7171";
const SERVERS_ENV: &str = "RINGLOCK_SERVERS";

/// The client subcommands (`ringlock serve` is the server's).
#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Acquire KEY and print its fencing token.
    ///
    /// The lock stays held after this exits, until `ringlock release KEY
    /// TOKEN` or the lease runs out. Exits 75 if the wait runs out.
    Acquire(AcquireArgs),
    /// Release KEY's grant that carries TOKEN.
    ///
    /// Exits 1 if no grant of KEY carries TOKEN (released before, expired,
    /// never issued).
    Release(ReleaseArgs),
    /// Renew KEY's grant that carries TOKEN for LEASE from now.
    ///
    /// Exits 1 if no grant of KEY carries TOKEN (released, or its lease ran
    /// out).
    Renew(RenewArgs),
    /// Run CMD while holding KEY, like flock(1) for a whole fleet.
    ///
    /// Acquires KEY (exits 75 without running CMD if the wait runs out), runs
    /// CMD with RINGLOCK_TOKEN (the fencing token) and RINGLOCK_KEY in its
    /// environment, renews the lease every third of it while CMD runs,
    /// releases when CMD ends, and exits with CMD's status (128+N if killed
    /// by signal N). If a renewal finds the lock lost (or none succeeds
    /// before the lease runs out), it says so on stderr, sends SIGTERM to CMD
    /// (SIGKILL 10 s later), and exits 76. SIGTERM and SIGHUP sent to
    /// ringlock are passed on to CMD; SIGINT is not (from a terminal, CMD gets
    /// it directly); either way ringlock waits for CMD and then releases.
    Run(RunArgs),
    /// Show each node's role, the active node it names, its highest token.
    ///
    /// Unreachable nodes are shown as such. Exits 69 if no node answers.
    Status(StatusArgs),
}

#[derive(clap::Args)]
pub struct ServerArg {
    /// The cluster's addresses, comma-separated [default: $RINGLOCK_SERVERS,
    /// else 127.0.0.1:7171].
    #[arg(long = "server", short = 's', value_name = "ADDR,...")]
    pub server: Option<String>,
}

#[derive(clap::Args)]
pub struct AcquireArgs {
    /// The lock's name (1 to 250 bytes, no spaces or control characters).
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub key: OsString,
    /// Lease in seconds (`30`, `1.5`, `0.25`): the lock ends by itself after
    /// this unless renewed.
    #[arg(long, default_value = "30", value_parser = parse_lease, value_name = "SECONDS")]
    pub lease: u64,
    /// How long to wait in the queue, in seconds; 0 means no limit.
    #[arg(long, default_value = "0", value_parser = parse_wait, value_name = "SECONDS")]
    pub wait: u64,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// The lock's name.
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub key: OsString,
    /// The token that `acquire` printed.
    pub token: u64,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(clap::Args)]
pub struct RenewArgs {
    /// The lock's name.
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub key: OsString,
    /// The token that `acquire` printed.
    pub token: u64,
    /// The new lease, in seconds from now.
    #[arg(long, default_value = "30", value_parser = parse_lease, value_name = "SECONDS")]
    pub lease: u64,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The lock's name.
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub key: OsString,
    /// Lease in seconds; renewed every third of it while CMD runs.
    #[arg(long, default_value = "30", value_parser = parse_lease, value_name = "SECONDS")]
    pub lease: u64,
    /// How long to wait for the lock, in seconds; 0 means no limit.
    #[arg(long, default_value = "0", value_parser = parse_wait, value_name = "SECONDS")]
    pub wait: u64,
    #[command(flatten)]
    pub server: ServerArg,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD",
          value_parser = clap::value_parser!(OsString))]
    pub cmd: Vec<OsString>,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub server: ServerArg,
}

/// Runs a client subcommand and returns the process's exit status.
pub fn run(cmd: ClientCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringlock: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        match cmd {
            ClientCommand::Acquire(args) => acquire(args).await,
            ClientCommand::Release(args) => release(args).await,
            ClientCommand::Renew(args) => renew(args).await,
            ClientCommand::Run(args) => run_command(args).await,
            ClientCommand::Status(args) => status(args).await,
        }
    });
    // Do not wait for background tasks (a connection being redialled).
    runtime.shutdown_background();
    ExitCode::from(code)
}

/// A protocol duration in milliseconds.
fn parse_ms(s: &str) -> Result<u64, String> {
    parse_seconds(s.as_bytes())
        .ok_or_else(|| format!("{s:?} is not seconds in the form 30, 1.5 or 0.25"))
}

fn parse_lease(s: &str) -> Result<u64, String> {
    let ms = parse_ms(s)?;
    if ms == 0 || ms > MAX_DURATION_MS {
        return Err(format!("lease {s} is out of range (0.001 to 86400)"));
    }
    Ok(ms)
}

fn parse_wait(s: &str) -> Result<u64, String> {
    let ms = parse_ms(s)?;
    if ms > MAX_DURATION_MS {
        return Err(format!("wait {s} is out of range (0 to 86400)"));
    }
    Ok(ms)
}

/// The server list: `--server`, else `$RINGLOCK_SERVERS`, else the default.
fn servers(arg: &ServerArg) -> Vec<String> {
    let list = arg
        .server
        .clone()
        .or_else(|| {
            std::env::var(SERVERS_ENV)
                .ok()
                .filter(|s| !s.trim().is_empty())
        })
        .unwrap_or_else(|| DEFAULT_SERVER.to_string());
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn show_key(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// Prints an error and gives its exit status.
fn fail(err: &Error) -> u8 {
    eprintln!("ringlock: {err}");
    match err {
        Error::Timeout => EXIT_TIMEOUT,
        Error::InvalidArgument(_) => EXIT_USAGE,
        Error::Protocol(_) => EXIT_PROTOCOL,
        _ => EXIT_UNAVAILABLE,
    }
}

async fn connect(arg: &ServerArg) -> Result<Client, Error> {
    Client::connect(servers(arg)).await
}

fn key_bytes(key: OsString) -> Result<Vec<u8>, u8> {
    let key = key.into_vec();
    check_key(&key).map_err(|e| fail(&e))?;
    Ok(key)
}

/// What every single-key command starts with: the key checked (before any
/// connection is tried) and a client. `Err` is the exit code, the reason
/// already printed.
async fn key_and_client(key: OsString, server: &ServerArg) -> Result<(Vec<u8>, Client), u8> {
    let key = key_bytes(key)?;
    let client = connect(server).await.map_err(|e| fail(&e))?;
    Ok((key, client))
}

async fn acquire(args: AcquireArgs) -> u8 {
    let (key, client) = match key_and_client(args.key, &args.server).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let wait = (args.wait > 0).then(|| Duration::from_millis(args.wait));
    match client
        .acquire(&key, Duration::from_millis(args.lease), wait)
        .await
    {
        Ok(Acquired::Granted(grant)) => {
            println!("{}", grant.token());
            0
        }
        Ok(Acquired::TimedOut) => {
            eprintln!(
                "ringlock: timed out after {} s waiting for {}",
                seconds(args.wait),
                show_key(&key)
            );
            EXIT_TIMEOUT
        }
        Err(e) => fail(&e),
    }
}

async fn release(args: ReleaseArgs) -> u8 {
    let (key, client) = match key_and_client(args.key, &args.server).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    match client.release(&key, args.token).await {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!(
                "ringlock: no grant of {} carries token {} (released before, expired, or never issued)",
                show_key(&key),
                args.token
            );
            EXIT_NOT_HELD
        }
        Err(e) => fail(&e),
    }
}

async fn renew(args: RenewArgs) -> u8 {
    let (key, client) = match key_and_client(args.key, &args.server).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    match client
        .renew(&key, args.token, Duration::from_millis(args.lease))
        .await
    {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!(
                "ringlock: no grant of {} carries token {} (released, or its lease ran out)",
                show_key(&key),
                args.token
            );
            EXIT_NOT_HELD
        }
        Err(e) => fail(&e),
    }
}

/// Milliseconds in the protocol's seconds form, for messages.
fn seconds(ms: u64) -> String {
    let mut out = Vec::new();
    crate::proto::write_seconds(&mut out, ms);
    String::from_utf8_lossy(&out).into_owned()
}

type Renewal<'a> = Pin<Box<dyn Future<Output = Result<bool, Error>> + 'a>>;

async fn run_command(args: RunArgs) -> u8 {
    let (key, client) = match key_and_client(args.key, &args.server).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let lease = Duration::from_millis(args.lease);
    let wait = (args.wait > 0).then(|| Duration::from_millis(args.wait));
    // Signals are caught from here on, so that none can end ringlock
    // between the grant and the command's start; while waiting for the lock
    // they end the wait (closing the connection withdraws the request).
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sighup = signal(SignalKind::hangup()).ok();
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let acquired = tokio::select! {
        acquired = client.acquire(&key, lease, wait) => acquired,
        Some(_) = recv(&mut sigterm) => return 128 + libc::SIGTERM as u8,
        Some(_) = recv(&mut sighup) => return 128 + libc::SIGHUP as u8,
        Some(_) = recv(&mut sigint) => return 128 + libc::SIGINT as u8,
    };
    let grant = match acquired {
        Ok(Acquired::Granted(grant)) => grant,
        Ok(Acquired::TimedOut) => {
            eprintln!(
                "ringlock: timed out after {} s waiting for {}; not running the command",
                seconds(args.wait),
                show_key(&key)
            );
            return EXIT_TIMEOUT;
        }
        Err(e) => return fail(&e),
    };
    let token = grant.token();
    // The grant's deadline counts the lease from when the acquire was sent
    // (the server starts it later, at the grant). If the acquire waited in
    // the queue, that leaves too little to go on: renew once before starting
    // the command, which gives a deadline measured from the renew.
    let mut grant = grant;
    if grant.remaining() < lease * 2 / 3 {
        match client.renew_grant(&mut grant, lease).await {
            Ok(true) => {}
            Ok(false) => {
                eprintln!(
                    "ringlock: LOCK LOST: {} (token {token}) ended before the command could start",
                    show_key(&key)
                );
                return EXIT_LOST;
            }
            Err(e) => {
                let _ = client.release(&key, token).await;
                return fail(&e);
            }
        }
    }
    let mut deadline = grant.deadline();

    let program = &args.cmd[0];
    let mut command = tokio::process::Command::new(program);
    command
        .args(&args.cmd[1..])
        .env("RINGLOCK_TOKEN", token.to_string())
        .env("RINGLOCK_KEY", OsStr::from_bytes(&key));
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("ringlock: cannot run {}: {e}", program.to_string_lossy());
            let _ = client.release(&key, token).await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let pid = child.id().map(|p| p as libc::pid_t);
    let forward = |sig: libc::c_int| {
        if let Some(pid) = pid {
            // The child is not reaped before `child.wait()` returns, so the
            // pid is still its.
            if let (Some(pid), Some(sig)) = (
                rustix::process::Pid::from_raw(pid),
                rustix::process::Signal::from_named_raw(sig),
            ) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    };

    let every = (lease / 3).max(Duration::from_millis(1));
    let mut next_renew = tokio::time::Instant::now() + every;
    let mut renewal: Option<(Instant, Renewal<'_>)> = None;
    let lost: String = loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(status) => match (status.code(), status.signal()) {
                        (Some(code), _) => code as u8,
                        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
                        (None, None) => 1,
                    },
                    Err(e) => {
                        eprintln!("ringlock: waiting for the command: {e}");
                        1
                    }
                };
                drop(renewal.take());
                match client.release(&key, token).await {
                    Ok(true) => {}
                    Ok(false) => eprintln!(
                        "ringlock: warning: the lock on {} (token {token}) had already ended when the command finished",
                        show_key(&key)
                    ),
                    Err(e) => eprintln!(
                        "ringlock: warning: could not release {} (token {token}), it ends when its lease runs out: {e}",
                        show_key(&key)
                    ),
                }
                return code;
            }
            _ = tokio::time::sleep_until(next_renew), if renewal.is_none() => {
                let sent = Instant::now();
                renewal = Some((sent, Box::pin(client.renew(&key, token, lease))));
            }
            result = async { (&mut renewal.as_mut().unwrap().1).await }, if renewal.is_some() => {
                let (sent, _) = renewal.take().unwrap();
                match result {
                    Ok(true) => {
                        deadline = deadline.max(sent + lease);
                        next_renew = tokio::time::Instant::now() + every;
                    }
                    Ok(false) => break "the server no longer has the grant (its lease ran out, or it was released with the token)".to_string(),
                    Err(e) => {
                        eprintln!("ringlock: warning: renewing {} failed, retrying: {e}", show_key(&key));
                        next_renew = tokio::time::Instant::now() + (every / 4).max(Duration::from_millis(100));
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                break "no renewal succeeded before the lease ran out".to_string();
            }
            Some(_) = recv(&mut sigterm) => forward(libc::SIGTERM),
            Some(_) = recv(&mut sighup) => forward(libc::SIGHUP),
            Some(_) = recv(&mut sigint) => {}
        }
    };
    drop(renewal);
    eprintln!(
        "ringlock: LOCK LOST: {} (token {token}): {lost}. Stopping the command with SIGTERM.",
        show_key(&key)
    );
    forward(libc::SIGTERM);
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        eprintln!("ringlock: the command did not stop within 10 s of SIGTERM; sending SIGKILL");
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    EXIT_LOST
}

/// Receives from an optional signal stream (pending forever if none).
async fn recv(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

async fn status(args: StatusArgs) -> u8 {
    let addrs = servers(&args.server);
    let mut tasks = Vec::new();
    for addr in &addrs {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let limit = Duration::from_secs(3);
            let (status, problem) =
                tokio::join!(node_status(&addr, limit), node_problem(&addr, limit));
            status.map(|st| (st, problem.ok().flatten()))
        }));
    }
    let mut rows = vec![[
        "ADDRESS".to_string(),
        "ROLE".to_string(),
        "ACTIVE".to_string(),
        "TOKEN".to_string(),
    ]];
    let mut reachable = 0;
    let mut problems = Vec::new();
    for (addr, task) in addrs.iter().zip(tasks) {
        let result = task
            .await
            .unwrap_or_else(|e| Err(Error::Connection(e.to_string())));
        rows.push(match result {
            Ok((st, problem)) => {
                reachable += 1;
                if let Some(problem) = problem {
                    problems.push(format!("{addr}: {problem}"));
                }
                [
                    addr.clone(),
                    st.role.to_string(),
                    st.active.unwrap_or_else(|| "-".into()),
                    st.token.to_string(),
                ]
            }
            Err(e) => [
                addr.clone(),
                "unreachable".into(),
                "-".into(),
                format!("- ({e})"),
            ],
        });
    }
    let widths: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        println!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    for problem in &problems {
        println!("problem: {problem}");
    }
    if reachable == 0 { EXIT_UNAVAILABLE } else { 0 }
}
