//! The partition/chaos harness: a three-node ringlock cluster in network
//! namespaces, clients contending on a few keys through the real protocol,
//! faults from a seeded schedule, and checks over what the clients saw.
//!
//! Used by `examples/chaos/main.rs` (driven by `scripts/chaos.sh`) and by
//! `tests/partition.rs`. Times are taken with one monotonic clock in this
//! process; a fault's start and heal are the moments the command that makes
//! or undoes it (`tc`, `ip`, a signal, a spawn; for kill -9, the reaping of
//! the process) has returned, except SIGTERM: the moment it is sent.
// Shared by several test binaries, each using a part of it: `pub` is this
// module's interface, and what one binary leaves unused is not dead.
#![allow(dead_code, unreachable_pub)]

pub mod check;
pub mod clients;
pub mod net;
pub mod nodes;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clients::{ClientCfg, ClientStats, GrantRec, Sample, us};
use net::Net;
use nodes::{HandBack, Nodes};

/// splitmix64: small, seedable, good enough for schedules and clients.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Silent loss both ways between two nodes.
    LossPair { a: usize, b: usize },
    /// Silent loss from one node to another only.
    LossOneWay { from: usize, to: usize },
    /// Silent loss between a node and every other node, both ways
    /// (clients still reach it).
    Isolate { node: usize },
    /// The node's bridge port down: cut off from peers and clients.
    LinkDown { node: usize },
    /// SIGKILL; started again at the heal.
    Kill9 { node: usize },
    /// SIGSTOP; SIGCONT at the heal.
    Stop { node: usize },
    /// SIGTERM (graceful leave); started again at the heal.
    Term { node: usize },
}

impl Kind {
    pub fn name(&self) -> &'static str {
        match self {
            Kind::LossPair { .. } => "loss-pair",
            Kind::LossOneWay { .. } => "loss-oneway",
            Kind::Isolate { .. } => "isolate",
            Kind::LinkDown { .. } => "link-down",
            Kind::Kill9 { .. } => "kill9-restart",
            Kind::Stop { .. } => "stop-cont",
            Kind::Term { .. } => "term-restart",
        }
    }

    /// The nodes the fault touches.
    pub fn nodes(&self) -> Vec<usize> {
        match *self {
            Kind::LossPair { a, b } => vec![a, b],
            Kind::LossOneWay { from, to } => vec![from, to],
            Kind::Isolate { node }
            | Kind::LinkDown { node }
            | Kind::Kill9 { node }
            | Kind::Stop { node }
            | Kind::Term { node } => vec![node],
        }
    }

    pub fn is_network(&self) -> bool {
        matches!(
            self,
            Kind::LossPair { .. }
                | Kind::LossOneWay { .. }
                | Kind::Isolate { .. }
                | Kind::LinkDown { .. }
        )
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Kind::LossPair { a, b } => write!(f, "loss-pair {a}<->{b}"),
            Kind::LossOneWay { from, to } => write!(f, "loss-oneway {from}->{to}"),
            Kind::Isolate { node } => write!(f, "isolate {node}"),
            Kind::LinkDown { node } => write!(f, "link-down {node}"),
            Kind::Kill9 { node } => write!(f, "kill9-restart {node}"),
            Kind::Stop { node } => write!(f, "stop-cont {node}"),
            Kind::Term { node } => write!(f, "term-restart {node}"),
        }
    }
}

/// Packets from one node to another: `(from, to)`.
type Path = (usize, usize);

/// One planned fault. Times in ms from the schedule's origin (when the
/// clients start).
#[derive(Debug, Clone)]
pub struct Fault {
    pub id: usize,
    pub kind: Kind,
    pub start_ms: u64,
    /// From the start to the (first) heal.
    pub len_ms: u64,
    /// 0: everything heals at once. Otherwise one direction heals at
    /// `start + len` and the other `stagger_ms` later.
    pub stagger_ms: u64,
    /// For a staggered heal: the direction out of `a` (loss-pair) or out of
    /// the isolated node heals first; else the one into it.
    pub out_first: bool,
}

impl Fault {
    pub fn end_ms(&self) -> u64 {
        self.start_ms + self.len_ms + self.stagger_ms
    }

    pub fn describe(&self) -> String {
        let mut s = format!("{} for {:.1} s", self.kind, self.len_ms as f64 / 1000.0);
        if self.stagger_ms > 0 {
            let first = match (self.kind, self.out_first) {
                (Kind::LossPair { a, b }, true) => format!("{a}->{b}"),
                (Kind::LossPair { a, b }, false) => format!("{b}->{a}"),
                (Kind::Isolate { node }, true) => format!("out of {node}"),
                (Kind::Isolate { node }, false) => format!("into {node}"),
                _ => "?".into(),
            };
            s += &format!(
                ", staggered heal: {first} first, the rest {:.1} s later",
                self.stagger_ms as f64 / 1000.0
            );
        }
        s
    }

    /// The drop paths of a network-loss fault: `(first, second)` heal
    /// groups (for an unstaggered fault, everything is in `first`).
    fn paths(&self, n: usize) -> (Vec<Path>, Vec<Path>) {
        let (out, inn): (Vec<_>, Vec<_>) = match self.kind {
            Kind::LossPair { a, b } => (vec![(a, b)], vec![(b, a)]),
            Kind::LossOneWay { from, to } => (vec![(from, to)], vec![]),
            Kind::Isolate { node } => (
                (0..n).filter(|&j| j != node).map(|j| (node, j)).collect(),
                (0..n).filter(|&j| j != node).map(|j| (j, node)).collect(),
            ),
            _ => (vec![], vec![]),
        };
        if self.stagger_ms == 0 {
            let mut all = out;
            all.extend(inn);
            (all, vec![])
        } else if self.out_first {
            (out, inn)
        } else {
            (inn, out)
        }
    }
}

/// What happened to one fault: the planned fault and its actual times
/// (µs on the harness clock).
#[derive(Debug, Clone)]
pub struct FaultRun {
    pub fault: Fault,
    pub t_start: u64,
    /// The first heal (the only one unless staggered).
    pub t_heal_first: u64,
    /// The last heal: the fault is over.
    pub t_heal: u64,
    pub notes: Vec<String>,
}

/// A seeded chaos schedule over `total_ms`: episodes of one fault, a
/// quarter of them with a second, network fault overlapping, each followed
/// by a quiet gap of 4-7 s; the last `quiet_ms` stay quiet.
pub fn chaos_schedule(seed: u64, total_ms: u64, nodes: usize, quiet_ms: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let mut faults: Vec<Fault> = Vec::new();
    let mut t = 2000;
    let pick_node = |rng: &mut Rng| -> usize {
        if rng.below(2) == 0 {
            0
        } else {
            1 + rng.below(nodes as u64 - 1) as usize
        }
    };
    let other = |rng: &mut Rng, x: usize| -> usize {
        (x + 1 + rng.below(nodes as u64 - 1) as usize) % nodes
    };
    let network = |rng: &mut Rng| -> Kind {
        let a = pick_node(rng);
        let b = other(rng, a);
        match rng.below(3) {
            0 => Kind::LossPair { a, b },
            1 => Kind::LossOneWay { from: a, to: b },
            _ => Kind::Isolate { node: a },
        }
    };
    loop {
        // Weights: loss-pair 3, one-way 2, isolate 3, link-down 1,
        // kill 2, stop 2, term 1.
        let roll = rng.below(14);
        let a = pick_node(&mut rng);
        let b = other(&mut rng, a);
        let kind = match roll {
            0..=2 => Kind::LossPair { a, b },
            3..=4 => Kind::LossOneWay { from: a, to: b },
            5..=7 => Kind::Isolate { node: a },
            8 => Kind::LinkDown { node: a },
            9..=10 => Kind::Kill9 { node: a },
            11..=12 => Kind::Stop { node: a },
            _ => Kind::Term { node: a },
        };
        let len_ms = if rng.below(20) == 0 {
            14_000
        } else {
            rng.pick(&[1000, 2000, 4000, 7000])
        };
        let staggerable = matches!(kind, Kind::LossPair { .. } | Kind::Isolate { .. });
        let stagger_ms = if staggerable && rng.below(2) == 0 {
            rng.pick(&[1000, 2000, 3000])
        } else {
            0
        };
        let out_first = rng.below(2) == 0;
        let first = Fault {
            id: faults.len(),
            kind,
            start_ms: t,
            len_ms,
            stagger_ms,
            out_first,
        };
        let mut end = first.end_ms();
        if end + quiet_ms > total_ms {
            break;
        }
        faults.push(first);
        if rng.below(4) == 0 {
            let second = Fault {
                id: faults.len(),
                kind: network(&mut rng),
                start_ms: t + rng.below(len_ms),
                len_ms: rng.pick(&[1000, 2000, 4000]),
                stagger_ms: 0,
                out_first: false,
            };
            if second.end_ms() + quiet_ms <= total_ms {
                end = end.max(second.end_ms());
                faults.push(second);
            }
        }
        t = end + 4000 + rng.below(3001);
    }
    faults
}

/// The measurement schedule: for each length, the active (node 0) is
/// isolated from its peers, then a standby (node 2) is, each followed by
/// `gap_ms` of quiet; `reps` times over.
pub fn measure_schedule(lengths_ms: &[u64], reps: usize, gap_ms: u64) -> Vec<Fault> {
    let mut faults = Vec::new();
    let mut t = 2000;
    for _ in 0..reps {
        for &len in lengths_ms {
            for node in [0, 2] {
                faults.push(Fault {
                    id: faults.len(),
                    kind: Kind::Isolate { node },
                    start_ms: t,
                    len_ms: len,
                    stagger_ms: 0,
                    out_first: false,
                });
                t += len + gap_ms;
            }
        }
    }
    faults
}

/// The run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `ringlock` binary.
    pub bin: PathBuf,
    pub io: String,
    /// Where node logs and records go.
    pub out: PathBuf,
    /// Namespace name prefix (unique per run).
    pub prefix: String,
    pub seed: u64,
    pub nodes: usize,
    pub clients: usize,
    pub keys: usize,
    pub heartbeat_ms: u64,
    pub peer_timeout_ms: u64,
    pub lease_min_ms: u64,
    pub lease_max_ms: u64,
    pub wait_ms: u64,
    /// After a fault's last heal, how long its window extends for the
    /// safety checks.
    pub settle_ms: u64,
    pub poll_ms: u64,
    pub faults: Vec<Fault>,
    /// From the schedule's origin to the end of the run.
    pub total_ms: u64,
    /// Progress lines on stderr.
    pub verbose: bool,
    /// Appended to every node's `ringlock serve` arguments.
    pub serve_args: Vec<String>,
}

impl Config {
    /// Defaults for everything but the binary, out dir, prefix and faults.
    pub fn new(bin: PathBuf, io: &str, out: PathBuf, prefix: &str) -> Config {
        let lease_max_ms = 2000;
        Config {
            bin,
            io: io.to_string(),
            out,
            prefix: prefix.to_string(),
            seed: 1,
            nodes: 3,
            clients: 8,
            keys: 4,
            heartbeat_ms: 50,
            peer_timeout_ms: 500,
            lease_min_ms: 300,
            lease_max_ms,
            wait_ms: 1000,
            serve_args: Vec::new(),
            // The longest lease plus 0.5 s: a grant made by a node that
            // is then demoted may be held by its client for a whole lease
            // after the heal.
            settle_ms: lease_max_ms + 500,
            poll_ms: 20,
            faults: Vec::new(),
            total_ms: 30_000,
            verbose: true,
        }
    }

    /// The bound the checks hold "back to one active" to: one peer
    /// timeout, one heartbeat and 1 s of slack.
    pub fn one_active_bound_ms(&self) -> u64 {
        self.peer_timeout_ms + self.heartbeat_ms + 1000
    }
}

/// Everything recorded in a run.
pub struct Record {
    pub faults: Vec<FaultRun>,
    pub grants: Vec<GrantRec>,
    pub stats: Vec<ClientStats>,
    pub samples: Vec<Sample>,
    /// Harness clock (µs) when the clients started: the schedule's origin.
    pub origin: u64,
    /// When the clients and pollers were told to stop: the end of the
    /// observation.
    pub end: u64,
    /// Nodes that exited without being told to.
    pub crashes: Vec<String>,
    /// The planned hand-backs of the role the nodes logged.
    pub hand_backs: Vec<HandBack>,
}

/// The lab: stops and joins its threads, kills its nodes and removes its
/// namespaces when dropped, also when a panic unwinds through it.
struct Lab {
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<(Vec<GrantRec>, ClientStats)>>,
    pollers: Vec<JoinHandle<Vec<Sample>>>,
    // Dropped in this order: the nodes, then the network.
    nodes: Option<Nodes>,
    net: Net,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.clients.drain(..) {
            let _ = h.join();
        }
        for h in self.pollers.drain(..) {
            let _ = h.join();
        }
    }
}

fn say(cfg: &Config, t0: Instant, what: &str) {
    if cfg.verbose {
        eprintln!("chaos [{:7.3}] {what}", t0.elapsed().as_secs_f64());
    }
}

/// `S` on node `i` from the client namespace (a one-off thread there).
fn wait_settled(net: &Net, nodes: usize, within: Duration) -> Result<(), String> {
    let ns = net.client_ns();
    std::thread::spawn(move || -> Result<(), String> {
        net::enter(&ns)?;
        let started = Instant::now();
        let mut last = Vec::new();
        while started.elapsed() < within {
            last = (0..nodes)
                .map(|i| status_once(i, Duration::from_millis(200)))
                .collect::<Vec<_>>();
            let ok = last.iter().enumerate().all(|(i, s)| match s {
                Some((active, named)) if i == 0 => *active && *named == Some(0),
                Some((active, named)) => !*active && *named == Some(0),
                None => false,
            });
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "the cluster did not settle on node 0 within {within:?}: {last:?}"
        ))
    })
    .join()
    .map_err(|_| "settle thread panicked".to_string())?
}

/// One `S` on a fresh connection: `(active, named node)`.
fn status_once(i: usize, timeout: Duration) -> Option<(bool, Option<usize>)> {
    use std::io::{BufRead, BufReader, Write};
    let addr: std::net::SocketAddr = net::node_addr(i).parse().ok()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(b"S\n").ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    let f: Vec<&str> = line.trim_end().split(' ').collect();
    match f[..] {
        ["S", role, addr, _] => Some((
            role == "active",
            (0..16).find(|&j| net::node_addr(j) == addr),
        )),
        _ => None,
    }
}

/// Builds the lab, runs the schedule with clients and pollers, tears
/// everything down and returns what was recorded.
#[expect(clippy::too_many_lines)]
pub fn run(cfg: &Config) -> Result<Record, String> {
    let t0 = Instant::now();
    std::fs::create_dir_all(&cfg.out).map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    say(cfg, t0, &format!("creating namespaces {}-*", cfg.prefix));
    let net = Net::create(&cfg.prefix, cfg.nodes)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut lab = Lab {
        stop: stop.clone(),
        clients: Vec::new(),
        pollers: Vec::new(),
        nodes: None,
        net,
    };
    let nodes = Nodes::new(
        &cfg.bin,
        &lab.net,
        &cfg.out,
        &cfg.io,
        cfg.heartbeat_ms,
        cfg.peer_timeout_ms,
        t0,
    )?;
    let nodes = lab.nodes.insert(nodes);
    nodes.extend_args(&cfg.serve_args);
    for i in 0..cfg.nodes {
        nodes.start(i)?;
    }
    wait_settled(&lab.net, cfg.nodes, Duration::from_secs(15))?;
    say(
        cfg,
        t0,
        "cluster settled on node 0; starting pollers and clients",
    );
    for i in 0..cfg.nodes {
        let (ns, stop) = (lab.net.client_ns(), stop.clone());
        let period = Duration::from_millis(cfg.poll_ms);
        lab.pollers.push(std::thread::spawn(move || {
            clients::run_poller(ns, i, period, t0, stop)
        }));
    }
    for id in 0..=cfg.clients {
        let ccfg = ClientCfg {
            id,
            seed: cfg.seed,
            nodes: cfg.nodes,
            keys: cfg.keys,
            lease_min_ms: cfg.lease_min_ms,
            lease_max_ms: cfg.lease_max_ms,
            wait_ms: cfg.wait_ms,
            // One more than asked: the failover probe.
            probe: id == cfg.clients,
        };
        let (ns, stop) = (lab.net.client_ns(), stop.clone());
        lab.clients.push(std::thread::spawn(move || {
            clients::run_client(ns, ccfg, t0, stop)
        }));
    }
    let origin = us(t0);

    // The actions: (time ms from origin, fault index, 0 apply / 1 first
    // heal / 2 second heal).
    let mut actions: Vec<(u64, usize, u8)> = Vec::new();
    for (k, f) in cfg.faults.iter().enumerate() {
        actions.push((f.start_ms, k, 0));
        actions.push((f.start_ms + f.len_ms, k, 1));
        if f.stagger_ms > 0 {
            actions.push((f.end_ms(), k, 2));
        }
    }
    actions.sort();
    let mut runs: Vec<FaultRun> = cfg
        .faults
        .iter()
        .map(|f| FaultRun {
            fault: f.clone(),
            t_start: 0,
            t_heal_first: 0,
            t_heal: 0,
            notes: Vec::new(),
        })
        .collect();
    let mut crashes = Vec::new();
    let mut events = String::new();
    for (at, k, step) in actions {
        let due = origin + at * 1000;
        watch_until(&mut lab, t0, origin, due, &mut runs, &mut crashes);
        let f = &cfg.faults[k];
        let nodes = lab.nodes.as_mut().expect("started");
        let before = us(t0);
        apply(&mut lab.net, nodes, f, step, cfg.nodes)?;
        // The fault is on once the command has returned; a SIGTERM once
        // it is sent (the node then takes up to 2 s to leave).
        let now = match (f.kind, step) {
            (Kind::Term { .. }, 0) => before,
            _ => us(t0),
        };
        let run = &mut runs[k];
        match step {
            0 => run.t_start = now,
            1 => {
                run.t_heal_first = now;
                run.t_heal = now;
            }
            _ => run.t_heal = now,
        }
        let what = match step {
            0 => format!("fault {k}: {}", f.describe()),
            1 if f.stagger_ms > 0 => format!("fault {k}: first heal"),
            _ => format!("fault {k}: healed"),
        };
        events += &format!("{:10.3} {what}\n", (now - origin) as f64 / 1e6);
        say(cfg, t0, &what);
    }
    let end_due = origin + cfg.total_ms * 1000;
    watch_until(&mut lab, t0, origin, end_due, &mut runs, &mut crashes);
    say(cfg, t0, "stopping clients");
    // The observation ends here: the pollers stop with the clients.
    let end = us(t0);
    stop.store(true, Ordering::Relaxed);
    let mut grants = Vec::new();
    let mut stats = Vec::new();
    for h in lab.clients.drain(..) {
        let (g, s) = h.join().map_err(|_| "a client thread panicked")?;
        grants.extend(g);
        stats.push(s);
    }
    let mut samples = Vec::new();
    for h in lab.pollers.drain(..) {
        samples.extend(h.join().map_err(|_| "a poller thread panicked")?);
    }
    let _ = std::fs::write(cfg.out.join("events.log"), events);
    let hand_backs = lab.nodes.as_ref().map_or_else(Vec::new, Nodes::hand_backs);
    drop(lab);
    say(cfg, t0, "namespaces removed");
    Ok(Record {
        faults: runs,
        grants,
        stats,
        samples,
        origin,
        end,
        crashes,
        hand_backs,
    })
}

/// Waits until `due` (µs), watching the nodes meanwhile: one that exits
/// by itself is a crash; one that leaves after SIGTERM is noted on its
/// fault.
fn watch_until(
    lab: &mut Lab,
    t0: Instant,
    origin: u64,
    due: u64,
    runs: &mut [FaultRun],
    crashes: &mut Vec<String>,
) {
    loop {
        let nodes = lab.nodes.as_mut().expect("started");
        for i in 0..nodes.len() {
            if let Some(status) = nodes.exited(i) {
                crashes.push(format!(
                    "node {i} exited by itself at {:.3} s: {status}",
                    (us(t0) - origin) as f64 / 1e6
                ));
            }
        }
        for (i, what) in nodes.reap() {
            let term = runs
                .iter_mut()
                .rev()
                .find(|r| r.t_start > 0 && r.fault.kind == Kind::Term { node: i });
            if let Some(r) = term {
                r.notes.push(what);
            }
        }
        let now = us(t0);
        if now >= due {
            return;
        }
        std::thread::sleep(Duration::from_micros((due - now).min(20_000)));
    }
}

/// Applies step `step` of fault `f` (0: start; 1: first heal; 2: second).
fn apply(net: &mut Net, nodes: &mut Nodes, f: &Fault, step: u8, n: usize) -> Result<(), String> {
    let (first, second) = f.paths(n);
    match (f.kind, step) {
        (Kind::LossPair { .. } | Kind::LossOneWay { .. } | Kind::Isolate { .. }, 0) => {
            for &(a, b) in first.iter().chain(&second) {
                net.drop_path(a, b)?;
            }
        }
        (Kind::LossPair { .. } | Kind::LossOneWay { .. } | Kind::Isolate { .. }, _) => {
            let group = if step == 1 { &first } else { &second };
            for &(a, b) in group {
                net.heal_path(a, b)?;
            }
        }
        (Kind::LinkDown { node }, 0) => net.link_down(node)?,
        (Kind::LinkDown { node }, _) => net.link_up(node)?,
        (Kind::Kill9 { node }, 0) => nodes.kill9(node)?,
        (Kind::Stop { node }, 0) => nodes.stop(node)?,
        (Kind::Stop { node }, _) => nodes.cont(node)?,
        (Kind::Term { node }, 0) => nodes.term(node)?,
        (Kind::Kill9 { node } | Kind::Term { node }, _) => {
            if nodes.pid(node).is_none() {
                nodes.start(node)?;
            }
        }
    }
    Ok(())
}
