//! `ringlock serve`: command line, startup, choice of backend.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::cluster::{
    ClusterConfig, DEFAULT_FAILBACK_DELAY_MS, DEFAULT_READ_BATCH_US, MAX_FAILBACK_DELAY_MS,
    MAX_READ_BATCH_US, READ_BATCHES_PER_PEER_TIMEOUT, wire,
};
use crate::engine::{DEFAULT_MAX_LOCKS, MAX_LOCKS_LIMIT};
use crate::io::{self, Clock, IoChoice, LoopConfig};
use crate::node::{Node, NodeConfig};
use crate::tls::{Tls, TlsFiles};

/// `ringlock serve` options (docs/protocol.md, "13. The server's command line").
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on, for clients and peers.
    #[arg(long, default_value = "127.0.0.1:7171")]
    pub listen: String,
    /// The cluster's nodes in priority order, first highest (same list on
    /// every node). Without it the node is a cluster of one.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// This node's address as listed in --peers (default: --listen).
    #[arg(long)]
    pub advertise: Option<String>,
    /// I/O backend: io_uring where the kernel allows it (auto), or forced.
    #[arg(long, value_enum, default_value_t = IoChoice::Auto)]
    pub io: IoChoice,
    /// Most client connections at once; one more is closed at once.
    #[arg(long, default_value_t = 10_000)]
    pub max_conns: usize,
    /// Most live locks (keys held, waited for, or with a held-back T); an
    /// acquire of one more key breaks its connection with E. Room for them
    /// is reserved at start (address space: about 130 bytes per lock).
    #[arg(long, default_value_t = DEFAULT_MAX_LOCKS)]
    pub max_locks: u32,
    /// Busy-poll for up to this many microseconds before sleeping in the
    /// kernel: trades a core for latency (0: off).
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
    /// Cluster: how often a node tells its peers it is alive (ms).
    #[arg(long, default_value_t = 50)]
    pub heartbeat_ms: u64,
    /// Cluster: silence after which a peer counts as dead (ms). This bounds
    /// failover after a hang; a crash is seen at once (its links close).
    #[arg(long, default_value_t = 500)]
    pub peer_timeout_ms: u64,
    /// Cluster: how long a returning node of higher priority must have
    /// held the active's snapshot, linked without a break, before the
    /// active hands the role back to it (ms; 0: at once; at most 600000).
    /// The default leaves clients time to connect to it first.
    #[arg(long, default_value_t = DEFAULT_FAILBACK_DELAY_MS)]
    pub failback_delay_ms: u64,
    /// Gone: standbys read replication in batches instead
    /// (--replication-batch-us). Accepted, with a warning, so that a node
    /// started with it still starts.
    #[arg(long, hide = true, value_name = "US")]
    pub replication_coalesce_us: Option<u64>,
    /// Cluster: while its active's replication keeps coming, a standby
    /// reads it at most this often instead of waking for every write (µs;
    /// 0: at every write; at most 2000, and at most a fiftieth of
    /// --peer-timeout-ms). What waits is in the standby's kernel already;
    /// it costs replication lag, up to this much.
    #[arg(long, default_value_t = DEFAULT_READ_BATCH_US)]
    pub replication_batch_us: u64,
    /// Cluster: a file holding the secret every node shares (required with
    /// --peers; make one with `ringlock keygen PATH` and copy it to every
    /// node). Peer links prove it both ways before anything else.
    #[arg(long, value_name = "PATH")]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at /metrics, and /health and /ready, over
    /// HTTP on this address (e.g. 127.0.0.1:9171). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Log lines as text or as JSON objects, one per line, on stderr;
    /// RUST_LOG filters them (default: info).
    #[arg(long, value_enum, default_value_t = crate::log::LogFormat::Text)]
    pub log_format: crate::log::LogFormat,
    /// TLS: this node's certificate chain (PEM). With --tls-key, the port
    /// speaks TLS only (clients and peers); without, plain text.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// TLS: the private key of --tls-cert (PEM).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// TLS: admit only clients whose certificate this CA (PEM) signed
    /// (mutual TLS). Also the peer CA unless --tls-peer-ca is given.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// TLS: the CA (PEM) that signs the nodes' certificates; peer links
    /// verify each other against it (default: --tls-client-ca).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_peer_ca: Option<std::path::PathBuf>,
    /// Who may lock what (with --tls-client-ca): one rule a line,
    /// `IDENTITY KEY-PREFIX RIGHTS` (docs/security.md). SIGHUP reloads it.
    /// Without it every client certificate may lock every key.
    #[arg(long, value_name = "PATH", requires = "tls_client_ca")]
    pub acl: Option<std::path::PathBuf>,
    /// TLS: a connection whose handshake is not done within this many
    /// milliseconds is closed.
    #[arg(long, default_value_t = 5_000, value_name = "MS")]
    pub tls_handshake_timeout_ms: u64,
}

/// Errors that stop the server from starting or running.
#[derive(Debug)]
pub enum ServeError {
    Config(String),
    Io(std::io::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(msg) => f.write_str(msg),
            ServeError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServeError {}

impl From<std::io::Error> for ServeError {
    fn from(e: std::io::Error) -> Self {
        ServeError::Io(e)
    }
}

/// Debug builds only: with this variable set, the server corrupts its own
/// lock table once a connection opens, so that the invariant walkers that
/// run after every loop turn stop it (`tests/invariants.rs`). Release
/// builds ignore it.
#[cfg(debug_assertions)]
pub const BREAK_INVARIANT_ENV: &str = "RINGLOCK_TEST_BREAK_INVARIANT";

/// Starts the node and serves until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<(), ServeError> {
    let listen = resolve(&args.listen)?;
    let metrics_listen = check_limits_and_metrics(&args)?;
    let listener = bind_with_retry(listen)
        .map_err(|e| ServeError::Config(format!("cannot listen on {listen}: {e}")))?;
    let bound = listener.local_addr()?;
    let advertise = args.advertise.clone().unwrap_or_else(|| bound.to_string());
    let cluster = cluster_config(&args, &advertise)?;
    let tls = tls_config(&args, cluster.is_some())?;
    // Before the engine's tables are made: see the function.
    io::disable_huge_pages();
    let fd_limit = io::raise_fd_limit();
    if let Some(limit) = fd_limit.filter(|&l| (l as usize) < args.max_conns + 64) {
        tracing::warn!(
            "open file limit {limit} is below --max-conns {} (+64); raise it with ulimit -n",
            args.max_conns
        );
    }

    let (signals, signal_writer) = UnixStream::pair()?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::low_level::pipe::register(sig, signal_writer.try_clone()?)?;
    }

    let backend = choose_backend(args.io)?;
    let clock = Clock::new();
    let node = Node::new(
        clock.now(),
        NodeConfig {
            advertise: advertise.clone(),
            cluster,
            max_locks: args.max_locks,
        },
    );
    let mut node = node;
    if tls.as_ref().is_some_and(|t| t.tls.acl().is_some()) {
        node.require_identities();
    }
    #[cfg(debug_assertions)]
    if std::env::var_os(BREAK_INVARIANT_ENV).is_some() {
        tracing::warn!(
            "{BREAK_INVARIANT_ENV} is set: the lock table is corrupted on purpose once a \
             connection opens (a test of the invariant checks)"
        );
        node.break_invariant_after_first_connection();
    }
    let published = metrics_listen
        .map(|addr| start_metrics(addr, &mut node))
        .transpose()?;
    let reserved = node.engine().reserved_locks();
    if reserved < args.max_locks as usize {
        tracing::warn!(
            "room for only {reserved} of --max-locks {} locks could be reserved; past that \
             the table stops the loop to copy itself as it grows",
            args.max_locks
        );
    }
    // Before the "listening on" line: from then on SIGHUP never ends the
    // node (its default action would), TLS or not.
    spawn_reloader(tls.as_ref().map(|t| t.tls.clone()))?;
    let config = LoopConfig {
        max_conns: args.max_conns,
        spin_us: args.spin_us,
        tls,
        metrics: published,
    };
    log_listening(bound, &backend, config.tls.as_ref());
    let turns = match backend {
        Backend::Uring => io::uring::run(listener, signals, node, clock, &config)?,
        Backend::Epoll { .. } => io::epoll::run(listener, signals, node, clock, &config)?,
    };
    tracing::info!(
        "stopped (longest loop turn {:.1} ms)",
        turns.longest().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Refuses limits out of range; the `--metrics-listen` address, if any.
fn check_limits_and_metrics(args: &ServeArgs) -> Result<Option<SocketAddr>, ServeError> {
    if args.max_conns == 0 {
        return Err(ServeError::Config("--max-conns must be at least 1".into()));
    }
    if !(1..=MAX_LOCKS_LIMIT).contains(&args.max_locks) {
        return Err(ServeError::Config(format!(
            "--max-locks must be between 1 and {MAX_LOCKS_LIMIT}"
        )));
    }
    args.metrics_listen
        .as_deref()
        .map(|addr| {
            resolve(addr).map_err(|_| {
                ServeError::Config(format!(
                    "bad --metrics-listen address {addr:?}: give HOST:PORT, e.g. 127.0.0.1:9171"
                ))
            })
        })
        .transpose()
}

/// Binds `--metrics-listen` and starts its threads; the node publishes
/// its snapshots from now on.
fn start_metrics(addr: SocketAddr, node: &mut Node) -> Result<crate::metrics::Shared, ServeError> {
    let metrics = crate::metrics::bind(addr).map_err(|e| {
        ServeError::Config(format!("cannot listen on {addr} (--metrics-listen): {e}"))
    })?;
    let bound = metrics.local_addr()?;
    let shared = crate::metrics::Shared::default();
    node.publish_metrics();
    crate::metrics::spawn(metrics, shared.clone())?;
    tracing::info!("metrics on http://{bound}/metrics (and /health, /ready)");
    Ok(shared)
}

/// The "listening on" line (which tests and operators wait for), and the
/// warning of a plain-text port beyond loopback.
fn log_listening(bound: SocketAddr, backend: &Backend, tls: Option<&io::LoopTls>) {
    let security = match tls {
        None => "plain text",
        Some(t) if t.tls.files().acl.is_some() => "TLS, client certificates required, --acl rules",
        Some(t) if t.tls.files().client_ca.is_some() => "TLS, client certificates required",
        Some(_) => "TLS",
    };
    if tls.is_none() && !bound.ip().is_loopback() {
        tracing::warn!(
            "listening on {bound} without TLS: anyone who reaches the port may take, renew \
             and release any lock (give --tls-cert, --tls-key and --tls-client-ca; see \
             docs/security.md)"
        );
    }
    match backend {
        Backend::Uring => tracing::info!("listening on {bound} (io: uring; {security})"),
        Backend::Epoll { why: None } => {
            tracing::info!("listening on {bound} (io: epoll; {security})")
        }
        Backend::Epoll { why: Some(why) } => tracing::info!(
            "listening on {bound} (io: epoll; io_uring unavailable: {why}; {security})"
        ),
    }
}

/// TLS from `--tls-*`: `None` without `--tls-cert` (plain text).
fn tls_config(args: &ServeArgs, cluster: bool) -> Result<Option<io::LoopTls>, ServeError> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    if args.tls_handshake_timeout_ms == 0 {
        return Err(ServeError::Config(
            "--tls-handshake-timeout-ms must be at least 1".into(),
        ));
    }
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: args.tls_client_ca.clone(),
        peer_ca: args.tls_peer_ca.clone(),
        acl: args.acl.clone(),
    };
    if cluster {
        // Each dialed peer's certificate is checked against the host of
        // its --peers entry: one TLS cannot check is refused now, not at
        // every dial.
        for peer in &args.peers {
            crate::tls::peer_server_name(peer).map_err(ServeError::Config)?;
        }
    }
    let tls = Tls::load(files, cluster).map_err(ServeError::Config)?;
    Ok(Some(io::LoopTls {
        tls: Arc::new(tls),
        handshake_ms: args.tls_handshake_timeout_ms,
    }))
}

/// Handles SIGHUP (`systemctl reload`), on a thread of its own (reading
/// files and parsing keys never stalls the loop): with TLS it reloads the
/// certificates (new connections use the new ones; a failed reload keeps
/// the old ones and says why); without TLS there is nothing to reload, and
/// it says so. Either way the node carries on.
fn spawn_reloader(tls: Option<Arc<Tls>>) -> Result<(), ServeError> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
    std::thread::Builder::new()
        .name("ringlock-reload".into())
        .spawn(move || {
            for _ in signals.forever() {
                let Some(tls) = &tls else {
                    tracing::info!(
                        "SIGHUP: nothing to reload (no --tls-cert; every other setting is read \
                         at start), carrying on"
                    );
                    continue;
                };
                match tls.reload() {
                    Ok(()) => tracing::info!(
                        "SIGHUP: TLS certificates reloaded; new connections use them"
                    ),
                    Err(e) => tracing::warn!(
                        "SIGHUP: TLS reload failed, keeping the certificates in use: {e}"
                    ),
                }
                match tls.reload_acl() {
                    Ok(None) => {}
                    Ok(Some(rules)) => tracing::info!(
                        "SIGHUP: --acl reloaded ({rules} rules); new connections use them"
                    ),
                    Err(e) => {
                        tracing::warn!("SIGHUP: --acl reload failed, keeping the rules in use: {e}")
                    }
                }
            }
        })?;
    Ok(())
}

/// The cluster this node belongs to, from `--peers`: `None` for a cluster
/// of one (no `--peers`, or only this node).
fn cluster_config(args: &ServeArgs, advertise: &str) -> Result<Option<ClusterConfig>, ServeError> {
    if args.peers.iter().all(|p| p == advertise) {
        return Ok(None);
    }
    let me = args.peers.iter().position(|p| p == advertise).ok_or_else(|| {
        ServeError::Config(format!(
            "this node's address {advertise} is not in --peers {}; set --advertise to its entry",
            args.peers.join(",")
        ))
    })?;
    if args.peers.len() > wire::MAX_PEERS {
        return Err(ServeError::Config(format!(
            "--peers lists {} nodes; a cluster has at most {}",
            args.peers.len(),
            wire::MAX_PEERS
        )));
    }
    for (i, peer) in args.peers.iter().enumerate() {
        if args.peers[..i].contains(peer) {
            return Err(ServeError::Config(format!(
                "{peer} is listed twice in --peers"
            )));
        }
        if !crate::proto::is_valid_key(peer.as_bytes()) || peer == "-" {
            return Err(ServeError::Config(format!(
                "bad peer address {peer:?} (1 to 250 printable characters, no spaces)"
            )));
        }
    }
    if args.heartbeat_ms == 0 || args.peer_timeout_ms <= args.heartbeat_ms {
        return Err(ServeError::Config(
            "--peer-timeout-ms must be greater than --heartbeat-ms, which must be at least 1"
                .into(),
        ));
    }
    if args.failback_delay_ms > MAX_FAILBACK_DELAY_MS {
        return Err(ServeError::Config(format!(
            "--failback-delay-ms must be at most {MAX_FAILBACK_DELAY_MS}"
        )));
    }
    let read_batch_us = read_batch_us(args)?;
    let Some(path) = &args.cluster_secret_file else {
        return Err(ServeError::Config(
            "--peers needs --cluster-secret-file PATH: the secret every node shares, so that \
             no stranger can pose as a peer. Make one with `ringlock keygen PATH` and copy it \
             to every node"
                .into(),
        ));
    };
    let (secret, warning) = crate::secret::load(path).map_err(ServeError::Config)?;
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
    let incarnation = crate::secret::random_u64()
        .map_err(|e| ServeError::Config(format!("no random numbers from the OS: {e}")))?;
    Ok(Some(ClusterConfig {
        peers: args.peers.clone(),
        me: crate::cluster::PeerId(me),
        heartbeat_ms: args.heartbeat_ms,
        peer_timeout_ms: args.peer_timeout_ms,
        failback_delay_ms: args.failback_delay_ms,
        incarnation,
        secret,
        read_batch_us,
    }))
}

/// `--replication-batch-us`, checked and fitted to the peer timeout.
fn read_batch_us(args: &ServeArgs) -> Result<u64, ServeError> {
    if args.replication_coalesce_us.is_some() {
        tracing::warn!(
            "--replication-coalesce-us is gone and ignored: standbys read replication in batches instead (--replication-batch-us)"
        );
    }
    if args.replication_batch_us > MAX_READ_BATCH_US {
        return Err(ServeError::Config(format!(
            "--replication-batch-us must be at most {MAX_READ_BATCH_US}"
        )));
    }
    let batch_limit = args.peer_timeout_ms.saturating_mul(1000) / READ_BATCHES_PER_PEER_TIMEOUT;
    let read_batch_us = args.replication_batch_us.min(batch_limit);
    if read_batch_us < args.replication_batch_us {
        tracing::info!(
            "replication is read in batches of at most {read_batch_us} µs: --peer-timeout-ms {} allows no more",
            args.peer_timeout_ms
        );
    }
    Ok(read_batch_us)
}

enum Backend {
    Uring,
    /// `why`: the reason io_uring was not used under `--io auto`.
    Epoll {
        why: Option<String>,
    },
}

fn choose_backend(choice: IoChoice) -> Result<Backend, ServeError> {
    match choice {
        IoChoice::Epoll => Ok(Backend::Epoll { why: None }),
        IoChoice::Uring => match io::uring::probe() {
            Ok(()) => Ok(Backend::Uring),
            Err(why) => Err(ServeError::Config(format!(
                "--io uring: io_uring is not available: {why}; use --io epoll or --io auto"
            ))),
        },
        IoChoice::Auto => match io::uring::probe() {
            Ok(()) => Ok(Backend::Uring),
            Err(why) => Ok(Backend::Epoll { why: Some(why) }),
        },
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, ServeError> {
    // Without a port (`0.0.0.0`, `[::1]`, `db1`) the resolver's own
    // "invalid socket address" would not say what is missing.
    let has_port = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !port.is_empty() && !host.ends_with(':') && !host.is_empty());
    if !has_port || addr.starts_with('[') && !addr.contains("]:") {
        return Err(ServeError::Config(format!(
            "bad --listen address {addr:?}: give HOST:PORT, e.g. 127.0.0.1:7171 or [::1]:7171"
        )));
    }
    addr.to_socket_addrs()
        .map_err(|e| {
            ServeError::Config(format!(
                "bad --listen address {addr:?}: {e} (give HOST:PORT, e.g. 127.0.0.1:7171)"
            ))
        })?
        .next()
        .ok_or_else(|| ServeError::Config(format!("--listen {addr:?} resolves to nothing")))
}

/// Binds the listener, retrying "address in use" for up to two seconds: a
/// node restarted right after a crash finds its port still held for a few
/// milliseconds while the kernel tears down the dead process's io_uring
/// (which still references the old listening socket).
fn bind_with_retry(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match io::bind_listener(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            result => return result,
        }
    }
}
