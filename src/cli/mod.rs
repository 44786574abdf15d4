//! The command line for people: `acquire`, `release`, `renew`, `run`,
//! `status`, `locks`, all built on [`ringlock_client`].
//!
//! Servers come from `--server ADDR,ADDR,...`, else from the environment
//! variable `RINGLOCK_SERVERS` (same form), else `127.0.0.1:7171`. TLS is
//! on with `--tls-ca PATH` (else `RINGLOCK_TLS_CA`), with a client
//! certificate from `--tls-cert`/`--tls-key` (else `RINGLOCK_TLS_CERT`,
//! `RINGLOCK_TLS_KEY`) and a name override `--tls-server-name` (else
//! `RINGLOCK_TLS_SERVER_NAME`).
//! Durations are in the protocol's seconds form: `30`, `1.5`, `0.25` (at
//! most three decimals).
//!
//! Every command ends in bounded time: the client's deadlines (see
//! docs/client.md, "Timeouts") apply, so a node that is hung but still
//! accepts connections costs a bounded wait, never a hang.
//!
//! Exit status:
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | done (acquired, released, renewed; `status`: the cluster is healthy) |
//! | 1    | `release`/`renew`: no grant of KEY carries TOKEN (not held); `status`: the cluster is unhealthy (no active node, several, or nodes disagreeing on which) |
//! | 2    | bad command line or argument (bad key, lease out of range, ...); `acquire`/`run` of the key a surrounding `ringlock run` holds (`$RINGLOCK_KEY`) |
//! | 69   | no server could be reached or answered, or no active node |
//! | 70   | protocol error (the server sent `E` or a malformed line) |
//! | 75   | `acquire`/`run`: the wait ran out (or `--no-wait` and the lock is held), nothing held (CMD not run) |
//! | 76   | `run`: the lock was lost while CMD ran; CMD was sent SIGTERM |
//! | 74   | standard output could not be written (a full disk, ...): one line on stderr says why; `acquire` released what it could not print |
//! | 126, 127 | `run`: CMD could not be started (127: not found) |
//! | 141  | standard output is a pipe whose reader closed early (`ringlock locks \| head`): ends quietly, as `ls` does (128 + SIGPIPE); `acquire` released what it could not print |
//! | other | `run`: CMD's own status, 128+N if it was killed by signal N |

use std::ffi::{OsStr, OsString};
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::proto::{MAX_DURATION_MS, parse_seconds};
use ringlock_client::{
    Acquired, Client, Error, HolderInfo, LockInfo, LockKind, LockLost, NodeStatus, QueueInfo,
    RenewingGuard, Role, TRY_WAIT, TlsConfig, check_key, list_locks, list_locks_tls, lock_queue,
    lock_queue_tls, node_problem, node_problem_tls, node_status, node_status_tls,
};

/// std's `eprintln!` panics when standard error cannot be written (a full
/// disk, a closed pipe): a panic would end the command with 101 instead of
/// its status, and `run` before it stopped CMD on a lost lock. Here a
/// message that cannot be written is dropped.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Exit status: `release`/`renew` found no grant with that token.
pub const EXIT_NOT_HELD: u8 = 1;
/// Exit status: `status` found the cluster unhealthy.
pub const EXIT_UNHEALTHY: u8 = 1;
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
/// Exit status: the node refused the request for this client's identity
/// (`E not allowed: ...`; EX_NOPERM). Not retried.
pub const EXIT_NOT_ALLOWED: u8 = 77;
/// Exit status: standard output could not be written (EX_IOERR).
pub const EXIT_OUTPUT: u8 = 74;
/// Exit status: standard output is a pipe that its reader closed: what a
/// shell reports for a tool that SIGPIPE ended (128 + 13), as `ls | head`.
/// (SIGPIPE itself is ignored, as in every Rust program: the sockets to
/// the servers must not raise it.)
pub const EXIT_BROKEN_PIPE: u8 = 128 + 13;

const DEFAULT_SERVER: &str = "127.0.0.1:7171";
const SERVERS_ENV: &str = "RINGLOCK_SERVERS";
/// How long a waiting `acquire`/`run` stays silent before saying, on
/// stderr, what it waits for.
const WAITING_NOTICE_AFTER: Duration = Duration::from_secs(1);
/// How long the waiting notice may take to learn who holds the lock.
const WAITING_QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// `--owner`'s environment variable.
const OWNER_ENV: &str = "RINGLOCK_OWNER";
/// What `run` tells CMD: the key it holds (and its token).
const KEY_ENV: &str = "RINGLOCK_KEY";
const TOKEN_ENV: &str = "RINGLOCK_TOKEN";

/// The client subcommands (`ringlock serve` is the server's).
#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Acquire KEY and print its fencing token.
    ///
    /// The lock stays held after this exits, until `ringlock release KEY
    /// TOKEN` or the lease runs out. Exits 75 if the wait runs out (at once
    /// with --no-wait if the lock is held). Ends by the wait plus 1 s even
    /// if a node hangs (then exits 69, naming it). After a second of
    /// waiting it says on stderr who holds KEY and how many wait ahead.
    /// Inside `ringlock run KEY` (RINGLOCK_KEY is KEY) it refuses at once
    /// and exits 2: locks are not reentrant, it would wait for itself.
    Acquire(AcquireArgs),
    /// Release KEY's grant that carries TOKEN (or, with --force, whoever's
    /// grant KEY has).
    ///
    /// Exits 1 if no grant of KEY carries TOKEN (released before, expired,
    /// never issued; with --force: KEY is not held, or its grant is
    /// another identity's and this client's certificate is not an admin's).
    /// Retries for 5 s on connection trouble, then exits 69.
    Release(ReleaseArgs),
    /// Renew KEY's grant that carries TOKEN for LEASE from now.
    ///
    /// Exits 1 if no grant of KEY carries TOKEN (released, or its lease ran
    /// out). Retries for 5 s on connection trouble, then exits 69.
    Renew(RenewArgs),
    /// Run CMD while holding KEY, like flock(1) for a whole fleet.
    ///
    /// Acquires KEY (exits 75 without running CMD if the wait runs out, or
    /// at once with --no-wait if the lock is held), runs CMD with
    /// RINGLOCK_TOKEN (the fencing token) and RINGLOCK_KEY in its
    /// environment, renews the lease every third of it while CMD runs,
    /// releases when CMD ends, and exits with CMD's status (128+N if killed
    /// by signal N). If a renewal finds the lock lost (or none is confirmed
    /// before the lease runs out), it says so on stderr, sends SIGTERM to
    /// CMD (SIGKILL 10 s later), and exits 76. SIGTERM and SIGHUP sent to
    /// ringlock are passed on to CMD; SIGINT is not (from a terminal, CMD
    /// gets it directly); either way ringlock waits for CMD and then
    /// releases (warning if that cannot be done within 5 s). After a second
    /// of waiting it says on stderr who holds KEY and how many wait ahead.
    /// Inside `ringlock run KEY` (RINGLOCK_KEY is KEY) it refuses at once
    /// and exits 2: locks are not reentrant, it would wait for its parent.
    Run(RunArgs),
    /// Show each node's role, the active node it names, its highest token,
    /// and whether the cluster is healthy.
    ///
    /// Exits 0 only when exactly one node is active and every node that
    /// answered names it; 1 when not (no active node, several, or nodes
    /// disagreeing), 69 if no node answers. The last line says which.
    Status(StatusArgs),
    /// List the locks of the active node: key, holder's token, lease
    /// left, acquires waiting, kind, holders, how long the holder has held
    /// it, its address and its owner label.
    ///
    /// KIND is exclusive, shared or semaphore; HOLDERS how many hold the
    /// key (a semaphore's as `held/limit`). For a key held shared or as a
    /// semaphore, the token, lease and holder are those of its newest
    /// grant.
    ///
    /// Asks the active node (the first of --server that says it is; any
    /// node that answers otherwise: a standby lists the grants it holds
    /// replicated, without waiters) page by page with the `V` request (`W`
    /// from a server older than `V`: the kind columns then say `?`, and a
    /// line says the kinds are not shown; `L` from one older than `W`: the
    /// holder columns say `?` too).
    /// Stops after --max locks. Exits 69 if no node answers, 70 if the node
    /// knows neither request.
    Locks(LocksArgs),
}

#[derive(clap::Args)]
pub struct LocksArgs {
    /// Only keys that start with this.
    #[arg(long, default_value = "", value_parser = clap::value_parser!(OsString))]
    pub prefix: OsString,
    /// Show at most this many locks.
    #[arg(long, default_value_t = 10_000)]
    pub max: u64,
    /// Locks asked for per request (1 to 1000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub page: u32,
    #[command(flatten)]
    pub server: ServerArg,
    /// How long each request has to be answered, in seconds.
    #[arg(long, default_value = "5", value_parser = parse_lease, value_name = "SECONDS")]
    pub timeout: u64,
}

#[derive(clap::Args)]
pub struct ServerArg {
    /// The cluster's addresses, comma-separated [default: $RINGLOCK_SERVERS,
    /// else 127.0.0.1:7171].
    #[arg(long = "server", short = 's', value_name = "ADDR,...")]
    pub server: Option<String>,
    /// TLS: speak TLS, trusting the servers' certificates signed by this CA
    /// (PEM) [default: $RINGLOCK_TLS_CA; without either, plain text].
    #[arg(long, value_name = "PATH")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// TLS: the client certificate (PEM) for servers that require one
    /// [default: $RINGLOCK_TLS_CERT].
    #[arg(long, value_name = "PATH")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// TLS: the private key of --tls-cert (PEM) [default: $RINGLOCK_TLS_KEY].
    #[arg(long, value_name = "PATH")]
    pub tls_key: Option<std::path::PathBuf>,
    /// TLS: the name the servers' certificates must carry, instead of the
    /// host of each address [default: $RINGLOCK_TLS_SERVER_NAME].
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

const TLS_CA_ENV: &str = "RINGLOCK_TLS_CA";
const TLS_CERT_ENV: &str = "RINGLOCK_TLS_CERT";
const TLS_KEY_ENV: &str = "RINGLOCK_TLS_KEY";
const TLS_SERVER_NAME_ENV: &str = "RINGLOCK_TLS_SERVER_NAME";

/// A flag, else its environment variable (unset or empty: none).
fn flag_or_env(flag: &Option<std::path::PathBuf>, env: &str) -> Option<std::path::PathBuf> {
    flag.clone().or_else(|| {
        std::env::var_os(env)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    })
}

/// TLS from the flags and the environment: `None` for plain text (no CA).
fn tls_of(arg: &ServerArg) -> Result<Option<TlsConfig>, Error> {
    let ca = flag_or_env(&arg.tls_ca, TLS_CA_ENV);
    let cert = flag_or_env(&arg.tls_cert, TLS_CERT_ENV);
    let key = flag_or_env(&arg.tls_key, TLS_KEY_ENV);
    let name = arg.tls_server_name.clone().or_else(|| {
        std::env::var(TLS_SERVER_NAME_ENV)
            .ok()
            .filter(|s| !s.is_empty())
    });
    let Some(ca) = ca else {
        if cert.is_some() || key.is_some() || name.is_some() {
            return Err(Error::InvalidArgument(format!(
                "TLS needs --tls-ca (or ${TLS_CA_ENV}): the CA that signs the servers' \
                 certificates"
            )));
        }
        return Ok(None);
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(Error::InvalidArgument(
                "--tls-cert and --tls-key go together".into(),
            ));
        }
    };
    let tls = TlsConfig::from_pem_files(ca, client)?;
    Ok(Some(match name {
        Some(name) => tls.server_name(name),
        None => tls,
    }))
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
    /// Do not wait: one attempt, exit 75 at once if the lock is held (like
    /// flock -n).
    #[arg(long, short = 'n', conflicts_with = "wait")]
    pub no_wait: bool,
    #[command(flatten)]
    pub kind: KindArg,
    #[command(flatten)]
    pub owner: OwnerArg,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(clap::Args)]
pub struct KindArg {
    /// A shared (read) lock: held beside other shared holders, never
    /// beside an exclusive one; it waits behind a waiting exclusive acquire.
    #[arg(long, conflicts_with = "permits")]
    pub shared: bool,
    /// One of at most N permits of KEY, a counting semaphore (1 to 65536;
    /// every holder of KEY must ask with the same N).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub permits: Option<u32>,
}

impl KindArg {
    fn kind(&self) -> LockKind {
        match (self.shared, self.permits) {
            (_, Some(n)) => LockKind::Permits(n),
            (true, None) => LockKind::Shared,
            (false, None) => LockKind::Exclusive,
        }
    }
}

#[derive(clap::Args)]
pub struct OwnerArg {
    /// The owner label `ringlock locks` shows for this grant (1 to 128
    /// bytes of printable ASCII, no spaces) [default: $RINGLOCK_OWNER, else
    /// HOSTNAME/PID].
    #[arg(long, value_name = "LABEL")]
    pub owner: Option<String>,
}

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// The lock's name.
    #[arg(value_parser = clap::value_parser!(OsString))]
    pub key: OsString,
    /// The token that `acquire` printed.
    #[arg(required_unless_present = "force")]
    pub token: Option<u64>,
    /// An operator's release of whoever holds KEY: looks its token up (as
    /// `ringlock locks` does) and releases that grant. With client
    /// certificates and --acl on the node, only an identity with the admin
    /// right may release another identity's grant.
    #[arg(long, conflicts_with = "token")]
    pub force: bool,
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
    /// Do not wait: one attempt, exit 75 at once without running CMD if the
    /// lock is held (like flock -n).
    #[arg(long, short = 'n', conflicts_with = "wait")]
    pub no_wait: bool,
    #[command(flatten)]
    pub kind: KindArg,
    #[command(flatten)]
    pub owner: OwnerArg,
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
    /// How long each node has to answer, in seconds.
    #[arg(long, default_value = "3", value_parser = parse_lease, value_name = "SECONDS")]
    pub timeout: u64,
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
            ClientCommand::Locks(args) => locks(args).await,
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
        return Err(format!("{s} is out of range (0.001 to 86400)"));
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

/// Writes `text` to standard output, whole. `Err` is the exit status: a
/// reader that closed the pipe ends the command quietly
/// ([`EXIT_BROKEN_PIPE`]); any other error is said on stderr
/// ([`EXIT_OUTPUT`]).
fn emit(text: &str) -> Result<(), u8> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(EXIT_BROKEN_PIPE),
        Err(e) => {
            eprintln!("ringlock: cannot write to standard output: {e}");
            Err(EXIT_OUTPUT)
        }
    }
}

/// A command line that names nothing to run: `--help`, `--version`, or an
/// error. Help and version texts go to standard output like every other
/// output (a closed pipe: 141; another write error: one line and 74), on a
/// terminal as clap prints them (in its colours); errors go to stderr as
/// clap prints them (exit 2).
pub fn not_run(err: &clap::Error) -> ExitCode {
    if err.use_stderr() || std::io::stdout().is_terminal() {
        err.exit()
    }
    ExitCode::from(emitted(&err.render().to_string(), 0))
}

/// The exit status of a command whose last act is [`emit`].
fn emitted(text: &str, done: u8) -> u8 {
    emit(text).err().unwrap_or(done)
}

/// An error as the command line shows it: where the client library says
/// what to do in Rust terms, the command line names its own flag.
fn said(err: &Error) -> String {
    err.to_string().replace(
        ringlock_client::SERVER_NAME_HINT,
        "if it holds another name, give that one with --tls-server-name NAME or \
         RINGLOCK_TLS_SERVER_NAME",
    )
}

/// Prints an error and gives its exit status.
fn fail(err: &Error) -> u8 {
    eprintln!("ringlock: {}", said(err));
    match err {
        Error::Timeout => EXIT_TIMEOUT,
        Error::InvalidArgument(_) => EXIT_USAGE,
        Error::Protocol(_) => EXIT_PROTOCOL,
        Error::NotAllowed(_) => EXIT_NOT_ALLOWED,
        Error::WrongKind(_) => EXIT_USAGE,
        _ => EXIT_UNAVAILABLE,
    }
}

async fn connect(arg: &ServerArg, owner: Option<&str>) -> Result<Client, Error> {
    let builder = Client::builder(servers(arg));
    let builder = match owner {
        Some(owner) => builder.owner(owner),
        None => builder,
    };
    let builder = match tls_of(arg)? {
        Some(tls) => builder.tls(tls),
        None => builder,
    };
    builder.connect().await
}

fn key_bytes(key: OsString) -> Result<Vec<u8>, u8> {
    let key = key.into_vec();
    check_key(&key).map_err(|e| fail(&e))?;
    Ok(key)
}

/// What every single-key command starts with: the key checked (before any
/// connection is tried) and a client. `Err` is the exit code, the reason
/// already printed.
async fn key_and_client(
    key: OsString,
    server: &ServerArg,
    owner: Option<&str>,
) -> Result<(Vec<u8>, Client), u8> {
    let key = key_bytes(key)?;
    let client = connect(server, owner).await.map_err(|e| fail(&e))?;
    Ok((key, client))
}

/// The owner label of `acquire` and `run`: `--owner`, else
/// `$RINGLOCK_OWNER`, else `HOSTNAME/PID` (bytes a label may not hold
/// become `_`, and the host name is cut to fit).
fn owner_of(arg: &OwnerArg) -> String {
    if let Some(owner) = arg
        .owner
        .clone()
        .or_else(|| std::env::var(OWNER_ENV).ok().filter(|s| !s.is_empty()))
    {
        return owner;
    }
    let pid = std::process::id().to_string();
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let mut host: String = host
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    host.truncate(ringlock_client::MAX_OWNER - 1 - pid.len());
    if host.is_empty() {
        host.push('-');
    }
    format!("{host}/{pid}")
}

/// `acquire`/`run` of the key that a surrounding `ringlock run` holds
/// (`$RINGLOCK_KEY` is KEY): it would wait for the lock its own parent
/// holds, for as long as its parent waits for it. Refused at once
/// (`Err`: the exit status, the reason printed).
fn refuse_nested(key: &[u8]) -> Result<(), u8> {
    let Some(held) = std::env::var_os(KEY_ENV) else {
        return Ok(());
    };
    if held.as_bytes() != key {
        return Ok(());
    }
    let token = std::env::var(TOKEN_ENV).unwrap_or_else(|_| "?".into());
    eprintln!(
        "ringlock: {} is already held by the `ringlock run` this runs under (${KEY_ENV}, token \
         {token}): locks are not reentrant, so this would wait for its own parent. Use the \
         lock you hold, or another key (to queue behind it anyway: env -u {KEY_ENV} ringlock ...)",
        show_key(key)
    );
    Err(EXIT_USAGE)
}

/// The wait to ask for: `--no-wait` is the shortest the protocol allows,
/// `--wait 0` no limit.
fn wait_of(wait_ms: u64, no_wait: bool) -> Option<Duration> {
    if no_wait {
        Some(TRY_WAIT)
    } else {
        (wait_ms > 0).then(|| Duration::from_millis(wait_ms))
    }
}

/// After a second of waiting, says once on stderr (a terminal or not)
/// what the command waits for: who holds the lock, for how long, and how
/// many wait ahead (asked of the active node with `Q`); never resolves.
async fn waiting_notice(key: &[u8], wait_ms: u64, no_wait: bool, server: &ServerArg, owner: &str) {
    if !no_wait {
        tokio::time::sleep(WAITING_NOTICE_AFTER).await;
        let limit = if wait_ms == 0 {
            "no time limit; Ctrl-C to give up".to_string()
        } else {
            format!("for up to {} s in all", seconds(wait_ms))
        };
        let queue = tokio::time::timeout(WAITING_QUERY_TIMEOUT, queue_of(key, server))
            .await
            .ok()
            .flatten();
        eprintln!(
            "ringlock: waiting for the lock on {}: {} ({limit})...",
            show_key(key),
            waiting_for(queue.as_ref(), owner)
        );
    }
    std::future::pending::<()>().await
}

/// Who holds `key` and who waits, from the active node (`None`: no node
/// told).
async fn queue_of(key: &[u8], server: &ServerArg) -> Option<QueueInfo> {
    let addrs = servers(server);
    let tls = tls_of(server).ok()?;
    let addr = node_to_list(&addrs, WAITING_QUERY_TIMEOUT, tls.as_ref()).await?;
    match &tls {
        None => lock_queue(&addr, key, WAITING_QUERY_TIMEOUT).await,
        Some(tls) => lock_queue_tls(&addr, key, WAITING_QUERY_TIMEOUT, tls).await,
    }
    .ok()
}

/// The waiting notice's middle: `held by ADDR (owner LABEL) for 3.2 s; 2
/// ahead in the queue`, as far as it is known.
fn waiting_for(queue: Option<&QueueInfo>, owner: &str) -> String {
    let Some(queue) = queue else {
        return "held by another holder (who, the server did not say)".into();
    };
    let holder = match queue.lock.as_ref().and_then(|l| l.holder.as_ref()) {
        Some(h) if queue.lock.as_ref().is_some_and(|l| l.token != 0) => {
            format!("held by {} for {} s", who(h), seconds(h.for_ms))
        }
        _ => "no longer held (it is being handed over)".into(),
    };
    let ours = queue
        .waiters
        .iter()
        .position(|w| w.owner.as_deref() == Some(owner));
    let queue_note = match ours {
        Some(0) => "first in the queue".to_string(),
        Some(ahead) => format!("{ahead} ahead in the queue"),
        None if queue.waiting > 0 => format!("{} waiting", queue.waiting),
        None => "nobody else waiting".into(),
    };
    format!("{holder}; {queue_note}")
}

/// `ADDR (owner LABEL)`, as far as known.
fn who(h: &HolderInfo) -> String {
    let addr = h.addr.as_deref().unwrap_or("an unknown address");
    match &h.owner {
        Some(owner) => format!("{addr} (owner {owner})"),
        None => addr.to_string(),
    }
}

/// The message for an acquire whose wait ran out.
fn timed_out(key: &[u8], wait_ms: u64, no_wait: bool) -> String {
    if no_wait {
        format!(
            "ringlock: {} is held by someone else (--no-wait)",
            show_key(key)
        )
    } else {
        format!(
            "ringlock: timed out after {} s waiting for {}",
            seconds(wait_ms),
            show_key(key)
        )
    }
}

async fn acquire(args: AcquireArgs) -> u8 {
    let key = args.key.as_bytes().to_vec();
    if let Err(code) = check_key(&key)
        .map_err(|e| fail(&e))
        .and_then(|()| refuse_nested(&key))
    {
        return code;
    }
    let owner = owner_of(&args.owner);
    let (key, client) = match key_and_client(args.key, &args.server, Some(&owner)).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let wait = wait_of(args.wait, args.no_wait);
    let acquired = tokio::select! {
        acquired = client.acquire_kind(&key, args.kind.kind(), Duration::from_millis(args.lease), wait) => acquired,
        () = waiting_notice(&key, args.wait, args.no_wait, &args.server, &owner) => {
            unreachable!("never resolves")
        }
    };
    match acquired {
        Ok(Acquired::Granted(grant)) => match emit(&format!("{}\n", grant.token())) {
            Ok(()) => 0,
            Err(code) => {
                // Nobody was told the token, so nobody could release it:
                // give the lock back rather than leave it to its lease.
                let _ = client.release_grant(&grant).await;
                code
            }
        },
        Ok(Acquired::TimedOut) => {
            eprintln!("{}", timed_out(&key, args.wait, args.no_wait));
            EXIT_TIMEOUT
        }
        Err(e) => fail(&e),
    }
}

async fn release(args: ReleaseArgs) -> u8 {
    let (key, client) = match key_and_client(args.key, &args.server, None).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let token = match args.token {
        Some(token) => token,
        None => match holder_token(&key, &args.server).await {
            Ok(Some(token)) => token,
            Ok(None) => {
                eprintln!("ringlock: nobody holds {}", show_key(&key));
                return EXIT_NOT_HELD;
            }
            Err(code) => return code,
        },
    };
    match client.release(&key, token).await {
        Ok(true) => {
            if args.force {
                eprintln!("ringlock: released {} (token {token})", show_key(&key));
            }
            0
        }
        Ok(false) if args.force => {
            eprintln!(
                "ringlock: the grant of {} with token {token} was not released: it ended \
                 meanwhile, or it is another identity's and this certificate's identity is \
                 not an admin",
                show_key(&key)
            );
            EXIT_NOT_HELD
        }
        Ok(false) => {
            eprintln!(
                "ringlock: no grant of {} carries token {token} (released before, expired, or never issued)",
                show_key(&key)
            );
            EXIT_NOT_HELD
        }
        Err(e) => fail(&e),
    }
}

/// `release --force`: the token of `key`'s grant, as the active node lists
/// it (`None`: not held). `Err` is the exit status, the reason printed.
async fn holder_token(key: &[u8], server: &ServerArg) -> Result<Option<u64>, u8> {
    let limit = Duration::from_secs(5);
    let addrs = servers(server);
    let tls = tls_of(server).map_err(|e| fail(&e))?;
    let Some(addr) = node_to_list(&addrs, limit, tls.as_ref()).await else {
        eprintln!("ringlock: no node of {} answered", addrs.join(","));
        return Err(EXIT_UNAVAILABLE);
    };
    // Keys that start with `key` come in table order: page until it shows.
    let mut cursor = 0;
    let started = std::time::Instant::now();
    loop {
        let answer = match &tls {
            None => list_locks(&addr, key, cursor, 1000, limit).await,
            Some(tls) => list_locks_tls(&addr, key, cursor, 1000, limit, tls).await,
        };
        let (locks, next) = answer.map_err(|e| fail(&e))?;
        if let Some(lock) = locks.iter().find(|l| l.key == key) {
            return Ok(Some(lock.token).filter(|&t| t != 0));
        }
        if next == 0 {
            return Ok(None);
        }
        if started.elapsed() > limit {
            eprintln!(
                "ringlock: {addr} did not list {} within {limit:?}",
                show_key(key)
            );
            return Err(EXIT_UNAVAILABLE);
        }
        cursor = next;
    }
}

async fn renew(args: RenewArgs) -> u8 {
    let (key, client) = match key_and_client(args.key, &args.server, None).await {
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

async fn run_command(args: RunArgs) -> u8 {
    let key = args.key.as_bytes().to_vec();
    if let Err(code) = check_key(&key)
        .map_err(|e| fail(&e))
        .and_then(|()| refuse_nested(&key))
    {
        return code;
    }
    let owner = owner_of(&args.owner);
    let (key, client) = match key_and_client(args.key, &args.server, Some(&owner)).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let lease = Duration::from_millis(args.lease);
    let wait = wait_of(args.wait, args.no_wait);
    // Signals are caught from here on, so that none can end ringlock
    // between the grant and the command's start; while waiting for the lock
    // they end the wait (closing the connection withdraws the request).
    let mut signals = Signals::catch();
    let acquired = tokio::select! {
        acquired = client.acquire_kind(&key, args.kind.kind(), lease, wait) => acquired,
        () = waiting_notice(&key, args.wait, args.no_wait, &args.server, &owner) => {
            unreachable!("never resolves")
        }
        Some(_) = recv(&mut signals.term) => return 128 + libc::SIGTERM as u8,
        Some(_) = recv(&mut signals.hup) => return 128 + libc::SIGHUP as u8,
        Some(_) = recv(&mut signals.int) => return 128 + libc::SIGINT as u8,
    };
    let mut grant = match acquired {
        Ok(Acquired::Granted(grant)) => grant,
        Ok(Acquired::TimedOut) => {
            eprintln!(
                "{}; not running the command",
                timed_out(&key, args.wait, args.no_wait)
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
    if grant.remaining() < lease * 2 / 3
        && let Err(code) = renew_before_start(&client, &mut grant, lease).await
    {
        return code;
    }
    // From here on the lock renews itself every third of the lease and says
    // when it is lost.
    let guard = RenewingGuard::new(&client, grant);

    let program = &args.cmd[0];
    let mut command = tokio::process::Command::new(program);
    command
        .args(&args.cmd[1..])
        .env(TOKEN_ENV, token.to_string())
        .env(KEY_ENV, OsStr::from_bytes(&key));
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("ringlock: cannot run {}: {e}", program.to_string_lossy());
            let _ = guard.release().await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    supervise(&client, guard, child, &key, &mut signals).await
}

/// Runs until the command ends (its exit code, the lock released) or the
/// lock is lost (the command stopped, `EXIT_LOST`); forwards SIGTERM and
/// SIGHUP to it and says when renewing fails and works again.
async fn supervise(
    client: &Client,
    guard: RenewingGuard,
    mut child: tokio::process::Child,
    key: &[u8],
    signals: &mut Signals,
) -> u8 {
    let token = guard.token();
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

    let lost_signal = guard.watch();
    let mut updates = guard.watch();
    let mut updating = true;
    let mut failing = false;
    let lost: LockLost = loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                let code = exit_code(status);
                match release_at_exit(client, guard).await {
                    Ok(true) => {}
                    Ok(false) => eprintln!(
                        "ringlock: warning: the lock on {} (token {token}) had already ended when the command finished",
                        show_key(key)
                    ),
                    Err(e) => eprintln!(
                        "ringlock: warning: could not release {} (token {token}), it ends when its lease runs out: {e}",
                        show_key(key)
                    ),
                }
                return code;
            }
            lost = lost_signal.lost() => {
                break lost.unwrap_or(LockLost::Expired { last_error: None });
            }
            alive = updates.changed(), if updating => {
                updating = alive;
                let st = updates.status();
                if st.lost.is_some() {
                    continue;
                }
                match st.last_error {
                    Some(e) if !failing => {
                        failing = true;
                        eprintln!(
                            "ringlock: warning: renewing {} failed, retrying until the lease runs out: {e}",
                            show_key(key)
                        );
                    }
                    None if failing => {
                        failing = false;
                        eprintln!("ringlock: renewed {} again", show_key(key));
                    }
                    _ => {}
                }
            }
            Some(_) = recv(&mut signals.term) => forward(libc::SIGTERM),
            Some(_) = recv(&mut signals.hup) => forward(libc::SIGHUP),
            Some(_) = recv(&mut signals.int) => {}
        }
    };
    eprintln!(
        "ringlock: LOCK LOST: {} (token {token}): {lost}. Stopping the command with SIGTERM.",
        show_key(key)
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
    let _ = release_at_exit(client, guard).await;
    EXIT_LOST
}

/// The signals `ringlock run` catches from before its acquire on.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn catch() -> Signals {
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }
}

/// Renews `grant` once before the command starts (its acquire waited in
/// the queue, and the deadline counted from the acquire leaves too little);
/// the exit code if the lock ended meanwhile or the renewal failed.
async fn renew_before_start(
    client: &Client,
    grant: &mut ringlock_client::Grant,
    lease: Duration,
) -> Result<(), u8> {
    let token = grant.token();
    match client.renew_grant(grant, lease).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            eprintln!(
                "ringlock: LOCK LOST: {} (token {token}) ended before the command could start",
                show_key(grant.key())
            );
            Err(EXIT_LOST)
        }
        Err(e) => {
            let _ = client.release(grant.key(), token).await;
            Err(fail(&e))
        }
    }
}

/// `ringlock run`'s exit code for the command's end: its own, or 128 plus
/// the signal that ended it.
fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> u8 {
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
            (None, None) => 1,
        },
        Err(e) => {
            eprintln!("ringlock: waiting for the command: {e}");
            1
        }
    }
}

/// Releases the lock as `ringlock` exits, in the open (a release left to
/// the background would end with this process). A lock already known lost
/// does not hold the exit up: after `N key 0` nothing is sent; after no
/// renewal could be confirmed for a whole lease, one short try (the lock
/// may still be held on a node that could not be reached).
async fn release_at_exit(client: &Client, guard: RenewingGuard) -> Result<bool, Error> {
    let watch = guard.watch();
    let grant = guard.into_grant();
    match watch.status().lost {
        None => client.release_grant(&grant).await,
        Some(LockLost::Refused) => Ok(false),
        Some(LockLost::Expired { .. }) => {
            tokio::time::timeout(Duration::from_secs(1), client.release_grant(&grant))
                .await
                .unwrap_or(Ok(false))
        }
    }
}

/// Receives from an optional signal stream (pending forever if none).
async fn recv(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// What `status` concludes from the nodes' answers: the exit status and the
/// line that says why.
fn verdict(nodes: &[(String, Option<NodeStatus>)]) -> (u8, String) {
    let reachable: Vec<(&str, &NodeStatus)> = nodes
        .iter()
        .filter_map(|(addr, st)| st.as_ref().map(|st| (addr.as_str(), st)))
        .collect();
    let unreachable: Vec<&str> = nodes
        .iter()
        .filter(|(_, st)| st.is_none())
        .map(|(addr, _)| addr.as_str())
        .collect();
    let unreachable_note = if unreachable.is_empty() {
        String::new()
    } else {
        format!("; unreachable: {}", unreachable.join(", "))
    };
    if reachable.is_empty() {
        return (
            EXIT_UNAVAILABLE,
            format!("unhealthy: no node answered{unreachable_note}"),
        );
    }
    let actives: Vec<&str> = reachable
        .iter()
        .filter(|(_, st)| st.role == Role::Active)
        .map(|(addr, _)| *addr)
        .collect();
    let named = |st: &NodeStatus| st.active.clone().unwrap_or_else(|| "-".into());
    let names: Vec<String> = reachable
        .iter()
        .map(|(addr, st)| format!("{addr} names {}", named(st)))
        .collect();
    if actives.is_empty() {
        return (
            EXIT_UNHEALTHY,
            format!(
                "unhealthy: no active node ({}){unreachable_note}",
                names.join(", ")
            ),
        );
    }
    if actives.len() > 1 {
        return (
            EXIT_UNHEALTHY,
            format!(
                "unhealthy: {} active nodes: {}{unreachable_note}",
                actives.len(),
                actives.join(", ")
            ),
        );
    }
    let first = named(reachable[0].1);
    if reachable.iter().any(|(_, st)| named(st) != first) {
        return (
            EXIT_UNHEALTHY,
            format!(
                "unhealthy: the nodes disagree on the active node ({}){unreachable_note}",
                names.join(", ")
            ),
        );
    }
    let agree = if reachable.len() == 1 {
        "the one node that answered".to_string()
    } else {
        format!("all {} nodes that answered agree", reachable.len())
    };
    if unreachable.is_empty() {
        (0, format!("healthy: {first} is active; {agree}"))
    } else {
        (
            0,
            format!(
                "healthy: {first} is active; {agree}; unreachable: {}",
                unreachable.join(", ")
            ),
        )
    }
}

/// The longest a whole `ringlock locks` listing may take (each request has
/// `--timeout` besides).
const LISTING_DEADLINE: Duration = Duration::from_secs(60);

async fn locks(args: LocksArgs) -> u8 {
    let prefix = args.prefix.as_bytes();
    if !prefix.is_empty()
        && let Err(e) = check_key(prefix)
    {
        return fail(&e);
    }
    let limit = Duration::from_millis(args.timeout);
    let addrs = servers(&args.server);
    let tls = match tls_of(&args.server) {
        Ok(tls) => tls,
        Err(e) => return fail(&e),
    };
    let Some(addr) = node_to_list(&addrs, limit, tls.as_ref()).await else {
        eprintln!("ringlock: no node of {} answered", addrs.join(","));
        return EXIT_UNAVAILABLE;
    };
    let mut rows = vec![LOCKS_HEADER.map(str::to_string)];
    let mut cursor = 0;
    let mut shown = 0u64;
    let mut kinds_unknown = false;
    let started = std::time::Instant::now();
    let more = loop {
        let page = args
            .page
            .min(u32::try_from(args.max - shown).unwrap_or(u32::MAX));
        if page == 0 {
            break cursor != 0;
        }
        let answer = match &tls {
            None => list_locks(&addr, prefix, cursor, page, limit).await,
            Some(tls) => list_locks_tls(&addr, prefix, cursor, page, limit, tls).await,
        };
        let (locks, next) = match answer {
            Ok(answer) => answer,
            Err(e) => return fail(&e),
        };
        for lock in locks {
            shown += 1;
            kinds_unknown |= lock.kind.is_none();
            rows.push(lock_row(&lock));
        }
        if next == 0 {
            break false;
        }
        // Cursors only grow (docs/protocol.md), and the whole listing has a
        // deadline: a server that never ends a listing cannot keep this
        // command running.
        if next <= cursor {
            return fail(&Error::Protocol(format!(
                "{addr} answered L {cursor} with cursor {next}, which does not move on"
            )));
        }
        if started.elapsed() > LISTING_DEADLINE {
            return fail(&Error::Connection(format!(
                "{addr}: the listing took longer than {LISTING_DEADLINE:?}"
            )));
        }
        cursor = next;
    };
    let mut text: String = lock_lines(&rows).into_iter().map(|l| l + "\n").collect();
    if kinds_unknown {
        text.push_str(&format!(
            "kinds not shown: {addr} is older than the V request\n"
        ));
    }
    let more = if more { " (more not shown: --max)" } else { "" };
    text.push_str(&format!("{shown} locks on {addr}{more}\n"));
    emitted(&text, 0)
}

/// The columns of `ringlock locks`.
const LOCKS_HEADER: [&str; LOCKS_COLUMNS] = [
    "KEY",
    "TOKEN",
    "LEASE LEFT",
    "WAITING",
    "KIND",
    "HOLDERS",
    "HELD FOR",
    "HOLDER",
    "OWNER",
];
const LOCKS_COLUMNS: usize = 9;

/// One row of `ringlock locks`: `-` for what the lock has not (no holder,
/// no label), `?` for what the node did not say (older than `V`, `W`).
fn lock_row(lock: &LockInfo) -> [String; LOCKS_COLUMNS] {
    let held = lock.token != 0;
    let dash = || "-".to_string();
    let (held_for, addr, owner) = match &lock.holder {
        None => ("?".into(), "?".into(), "?".into()),
        Some(_) if !held => (dash(), dash(), dash()),
        Some(h) => (
            format!("{:.1} s", h.for_ms as f64 / 1000.0),
            h.addr.clone().unwrap_or_else(dash),
            h.owner.clone().unwrap_or_else(dash),
        ),
    };
    // A semaphore's holders are shown of its limit: `2/4`.
    let (kind, holders) = match lock.kind {
        None => ("?".into(), "?".into()),
        Some(k) if k.held == ringlock_client::Held::Semaphore => {
            (k.held.to_string(), format!("{}/{}", k.holders, k.limit))
        }
        Some(k) => (k.held.to_string(), k.holders.to_string()),
    };
    [
        show_key(&lock.key),
        if held { lock.token.to_string() } else { dash() },
        format!("{:.3} s", lock.lease_ms as f64 / 1000.0),
        lock.waiters.to_string(),
        kind,
        holders,
        held_for,
        addr,
        owner,
    ]
}

/// The rows as lines: the key and the kind left aligned, the numbers
/// right aligned, the holder and its label left aligned (the last one
/// unpadded).
fn lock_lines(rows: &[[String; LOCKS_COLUMNS]]) -> Vec<String> {
    let widths: Vec<usize> = (0..LOCKS_COLUMNS)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let left = [true, false, false, false, true, false, false, true, true];
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[c] - cell.len());
                match (left[c], c + 1 == LOCKS_COLUMNS) {
                    // The last column unpadded.
                    (_, true) => line.push_str(cell),
                    (true, false) => line.push_str(&format!("{cell}{pad}")),
                    (false, false) => line.push_str(&format!("{pad}{cell}")),
                }
            }
            line
        })
        .collect()
}

/// The node whose table `ringlock locks` shows: the active one, which has
/// the waiters; without one, any node that answers.
async fn node_to_list(
    addrs: &[String],
    limit: Duration,
    tls: Option<&TlsConfig>,
) -> Option<String> {
    let mut chosen = None;
    for addr in addrs {
        let status = match tls {
            None => node_status(addr, limit).await,
            Some(tls) => node_status_tls(addr, limit, tls).await,
        };
        match status {
            Ok(st) if st.role == Role::Active => return Some(addr.clone()),
            Ok(_) if chosen.is_none() => chosen = Some(addr.clone()),
            _ => {}
        }
    }
    chosen
}

/// Four columns, each as wide as its widest cell: the first left aligned,
/// the others right aligned (`numbers`) or left aligned (the last one then
/// unpadded). One line per row.
fn table(rows: &[[String; 4]], numbers: bool) -> String {
    use std::fmt::Write as _;
    let widths: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in rows {
        let [a, b, c, d] = row;
        let (w0, w1, w2, w3) = (widths[0], widths[1], widths[2], widths[3]);
        // Writing to a String cannot fail.
        let _ = if numbers {
            writeln!(text, "{a:<w0$}  {b:>w1$}  {c:>w2$}  {d:>w3$}")
        } else {
            writeln!(text, "{a:<w0$}  {b:<w1$}  {c:<w2$}  {d}")
        };
    }
    text
}

async fn status(args: StatusArgs) -> u8 {
    let addrs = servers(&args.server);
    let limit = Duration::from_millis(args.timeout);
    let tls = match tls_of(&args.server) {
        Ok(tls) => tls,
        Err(e) => return fail(&e),
    };
    let mut tasks = Vec::new();
    for addr in &addrs {
        let addr = addr.clone();
        let tls = tls.clone();
        tasks.push(tokio::spawn(async move {
            let (status, problem) = match &tls {
                None => tokio::join!(node_status(&addr, limit), node_problem(&addr, limit)),
                Some(tls) => tokio::join!(
                    node_status_tls(&addr, limit, tls),
                    node_problem_tls(&addr, limit, tls)
                ),
            };
            status.map(|st| (st, problem.ok().flatten()))
        }));
    }
    let mut rows = vec![[
        "ADDRESS".to_string(),
        "ROLE".to_string(),
        "ACTIVE".to_string(),
        "TOKEN".to_string(),
    ]];
    let mut seen = Vec::new();
    let mut problems = Vec::new();
    for (addr, task) in addrs.iter().zip(tasks) {
        let result = task
            .await
            .unwrap_or_else(|e| Err(Error::Connection(e.to_string())));
        rows.push(match result {
            Ok((st, problem)) => {
                if let Some(problem) = problem {
                    problems.push(format!("{addr}: {problem}"));
                }
                let row = [
                    addr.clone(),
                    st.role.to_string(),
                    st.active.clone().unwrap_or_else(|| "-".into()),
                    st.token.to_string(),
                ];
                seen.push((addr.clone(), Some(st)));
                row
            }
            Err(e) => {
                seen.push((addr.clone(), None));
                [
                    addr.clone(),
                    "unreachable".into(),
                    "-".into(),
                    format!("- ({})", said(&e)),
                ]
            }
        });
    }
    let mut text = table(&rows, false);
    for problem in &problems {
        text.push_str(&format!("problem: {problem}\n"));
    }
    let (code, line) = verdict(&seen);
    text.push_str(&format!("{line}\n"));
    emitted(&text, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(role: Role, active: Option<&str>) -> Option<NodeStatus> {
        Some(NodeStatus {
            role,
            active: active.map(str::to_string),
            token: 1,
        })
    }

    type Seen = Vec<(String, Option<NodeStatus>)>;

    fn nodes(list: &[(&str, Option<NodeStatus>)]) -> Seen {
        list.iter()
            .map(|(a, s)| (a.to_string(), s.clone()))
            .collect()
    }

    #[test]
    fn status_verdicts() {
        use Role::{Active, Standby};
        let cases: Vec<(Seen, u8, &str)> = vec![
            (
                nodes(&[
                    ("a", node(Active, Some("a"))),
                    ("b", node(Standby, Some("a"))),
                    ("c", node(Standby, Some("a"))),
                ]),
                0,
                "healthy: a is active; all 3 nodes that answered agree",
            ),
            (
                nodes(&[
                    ("a", None),
                    ("b", node(Active, Some("b"))),
                    ("c", node(Standby, Some("b"))),
                ]),
                0,
                "healthy: b is active; all 2 nodes that answered agree; unreachable: a",
            ),
            (
                nodes(&[("a", None), ("b", None)]),
                69,
                "unhealthy: no node answered; unreachable: a, b",
            ),
            (
                nodes(&[("a", node(Standby, None)), ("b", node(Standby, None))]),
                1,
                "unhealthy: no active node (a names -, b names -)",
            ),
            (
                nodes(&[
                    ("a", node(Active, Some("a"))),
                    ("b", node(Active, Some("b"))),
                ]),
                1,
                "unhealthy: 2 active nodes: a, b",
            ),
            (
                nodes(&[
                    ("a", node(Active, Some("a"))),
                    ("b", node(Standby, Some("a"))),
                    ("c", node(Standby, None)),
                    ("d", None),
                ]),
                1,
                "unhealthy: the nodes disagree on the active node (a names a, b names a, c names -); unreachable: d",
            ),
        ];
        for (seen, code, line) in cases {
            assert_eq!(verdict(&seen), (code, line.to_string()), "{seen:?}");
        }
    }
}
