//! A model checker over the real cluster: every interleaving, at small
//! scope, of message deliveries (any order across links, in order within
//! one), timer firings, time, crashes, restarts, hangs, partitions (one way
//! and both ways), heals, SIGTERM hand-offs and client requests, on the
//! same [`ringlock::node::Node`] the servers run (see docs/cluster.md, "How
//! it is tested", for why an explorer of its own and not a framework).
//!
//! A node cannot be cloned, so a state is kept as the trace that reaches
//! it (a parent and a step) and rebuilt by replaying that trace from the
//! start; what the explorer remembers of a state, to explore it once, is a
//! fingerprint of what can be observed of it ([`World::fingerprint`]).
//! The search is breadth first: the first counterexample is a shortest one.

#![allow(dead_code, unreachable_pub)]

pub mod check;
pub mod world;

use std::cell::Cell;
use std::collections::{HashSet, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

pub use world::{Scope, Step, World};

/// What a search found.
#[derive(Debug)]
pub struct Outcome {
    /// Distinct states (by fingerprint) reached, and steps taken.
    pub states: usize,
    pub edges: usize,
    pub depth: usize,
    /// Steps of the one-order formation before the search (`formed`).
    pub prefix: usize,
    /// Every state within the scope was explored (no limit was hit).
    pub complete: bool,
    pub elapsed: Duration,
    /// Fair continuations run, and the most model time one took (ms).
    pub fair_runs: usize,
    pub fair_ms: u64,
    /// The first violation: the trace that reaches it and what it broke.
    pub violation: Option<(Vec<Step>, String)>,
}

impl Outcome {
    pub fn summary(&self) -> String {
        format!(
            "{} states, {} steps, depth {} after {} steps of formation, \
             {} fair continuations (the longest {} ms), {:.1} s{}",
            self.states,
            self.edges,
            self.depth,
            self.prefix,
            self.fair_runs,
            self.fair_ms,
            self.elapsed.as_secs_f64(),
            if self.complete {
                ""
            } else {
                " (stopped at a limit)"
            }
        )
    }
}

thread_local! {
    /// Inside a call into a node ([`world::catch`]).
    pub static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// A node's panic is a counterexample, reported with its trace: the
/// default hook's message for each is noise.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                default(info);
            }
        }));
    });
}

/// Rebuilds the world a trace reaches. `Err`: the step at which a
/// property broke, and how.
pub fn replay(
    scope: &Scope,
    trace: &[Step],
    checked: bool,
) -> (World, Result<(), (usize, String)>) {
    let mut w = World::new(scope.clone());
    for (i, &step) in trace.iter().enumerate() {
        if checked && step != Step::Fair && !w.enabled().contains(&step) {
            return (w, Err((i, format!("step {step} is not possible here"))));
        }
        let r = if checked {
            w.apply(step)
        } else {
            w.reapply(step)
        };
        if let Err(e) = r {
            return (w, Err((i, e)));
        }
    }
    (w, Ok(()))
}

fn trace_of(root: &[Step], tree: &[(u32, Step)], mut i: usize) -> Vec<Step> {
    let mut out = Vec::new();
    while i != 0 {
        let (parent, step) = tree[i];
        out.push(step);
        i = parent as usize;
    }
    out.extend(root.iter().rev());
    out.reverse();
    out
}

/// Breadth-first search of every state within `scope`, up to `max_states`
/// distinct states (then every state nearer the start than the last one
/// reached was explored; the order is fixed, so a bound gives the same
/// states on every run).
pub fn explore(scope: &Scope, max_states: usize) -> Outcome {
    quiet_panics();
    let start = Instant::now();
    // State 0 is the start; each other is (parent, step).
    let mut tree: Vec<(u32, Step)> = vec![(0, Step::Advance)];
    let mut seen: HashSet<u64> = HashSet::new();
    let mut queue: VecDeque<(usize, usize)> = VecDeque::from([(0, 0)]);
    let mut out = Outcome {
        states: 1,
        edges: 0,
        depth: 0,
        prefix: 0,
        complete: true,
        elapsed: Duration::ZERO,
        fair_runs: 0,
        fair_ms: 0,
        violation: None,
    };
    // With `formed`, the search starts where the cluster has formed.
    let root = if scope.formed {
        World::formation(scope)
    } else {
        Vec::new()
    };
    seen.insert(replay(scope, &root, false).0.fingerprint());
    out.prefix = root.len();
    while let Some((i, depth)) = queue.pop_front() {
        if out.states >= max_states {
            out.complete = false;
            break;
        }
        let trace = trace_of(&root, &tree, i);
        let mut base = Some(replay(scope, &trace, false).0);
        let steps = base.as_ref().map(World::enabled).unwrap_or_default();
        for step in steps {
            let mut w = match base.take() {
                Some(w) => w,
                None => replay(scope, &trace, false).0,
            };
            out.edges += 1;
            if let Err(e) = w.apply(step) {
                let mut t = trace.clone();
                t.push(step);
                out.violation = Some((t, e));
                out.elapsed = start.elapsed();
                return out;
            }
            if seen.insert(w.fingerprint()) {
                if scope.fair_every > 0 && out.states.is_multiple_of(scope.fair_every) {
                    out.fair_runs += 1;
                    let from = w.now;
                    let r = fair_suffix(&mut w);
                    out.fair_ms = out.fair_ms.max(w.now - from);
                    if let Err((suffix, e)) = r {
                        let mut t = trace.clone();
                        t.push(step);
                        t.extend(suffix);
                        out.violation = Some((t, e));
                        out.elapsed = start.elapsed();
                        return out;
                    }
                }
                tree.push((i as u32, step));
                queue.push_back((tree.len() - 1, depth + 1));
                out.states += 1;
                out.depth = out.depth.max(depth + 1);
                if out.states.is_multiple_of(5_000) {
                    eprintln!(
                        "  {} states, depth {}, {:.1} s",
                        out.states,
                        out.depth,
                        start.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }
    out.elapsed = start.elapsed();
    out
}

/// How long a fair continuation may take to answer every request and
/// agree on one active, in model time.
pub const FAIR_MS: u64 = 1_000;

/// Liveness over fair paths: from `w`, every block heals and no new
/// fault, restart or request comes (a node that is down stays down); every segment is delivered in order, every due timer fires,
/// every dial resolves, and time moves to the next deadline once nothing
/// else can happen. Within [`FAIR_MS`] every waiting request must be
/// answered (granted, timed out, redirected, or its connection closed) and
/// the cluster must agree on one active ([`World::converged`]), every
/// property holding on the way. `Err`: the steps of the continuation and
/// what broke; `Ok`: the steps.
pub fn fair_suffix(w: &mut World) -> Result<Vec<Step>, (Vec<Step>, String)> {
    let mut steps = vec![Step::Fair];
    w.apply(Step::Fair).map_err(|e| (steps.clone(), e))?;
    let from = w.now;
    loop {
        if w.quiescent() && w.converged().is_ok() {
            return Ok(steps);
        }
        let next = w.enabled().into_iter().find(|s| {
            matches!(s, Step::Tick(_) | Step::Deliver(..) | Step::Dial(..))
                || (*s == Step::Advance && w.next_time().is_some_and(|t| t <= from + FAIR_MS))
        });
        let Some(step) = next.filter(|_| steps.len() < 100_000) else {
            let why = w
                .converged()
                .err()
                .unwrap_or_else(|| "it never rests".into());
            return Err((
                steps,
                format!("liveness: {FAIR_MS} ms into a fair continuation from {from} ms, {why}"),
            ));
        };
        steps.push(step);
        w.apply(step).map_err(|e| (steps.clone(), e))?;
    }
}

/// The trace, one step a line with what it did and the nodes after it,
/// and the line that replays it.
pub fn show(scope: &Scope, trace: &[Step], test: &str) -> String {
    let mut out = String::new();
    let mut w = World::new(scope.clone());
    w.narrate = true;
    let mut sim = vec![w.sim_header()];
    for (i, &step) in trace.iter().enumerate() {
        sim.push(w.sim_step(step));
        let r = w.apply(step);
        let _ = writeln!(out, "{i:>3}. t={} {step}", w.now);
        for line in w.story.drain(..) {
            let _ = writeln!(out, "{line}");
        }
        if let Err(e) = r {
            let _ = writeln!(out, "     => {}", w.describe());
            let _ = writeln!(out, "VIOLATION: {e}");
            break;
        }
        if !matches!(step, Step::Deliver(..)) {
            let _ = writeln!(out, "     => {}", w.describe());
        }
    }
    let line: Vec<String> = trace.iter().map(Step::to_string).collect();
    let _ = writeln!(
        out,
        "replay: RINGLOCK_MODEL_TRACE='{}' RINGLOCK_MODEL_SCOPE={test} cargo test --test model_check a_trace_replays_as_printed -- --nocapture",
        line.join(" ")
    );
    let _ = writeln!(
        out,
        "in the simulator: RINGLOCK_SIM_TRACE='{}' cargo test --test cluster_sim a_trace_replays_in_the_simulator -- --nocapture",
        sim.join(", ")
    );
    out
}

// ---------------------------------------------------------------------------
// The scopes the tests explore

/// The scope of 2 or 3 nodes, 2 clients, 1 key, one fault of any kind
/// (crash and restart, SIGTERM, hang, one-way block, split and heal) and
/// `ops` requests along each path, until `horizon_ms`.
pub fn scope(nodes: usize, ops: u32, horizon_ms: u64) -> Scope {
    Scope {
        nodes,
        clients: 2,
        keys: 1,
        horizon_ms,
        faults: 1,
        crash: true,
        restart: true,
        leave: true,
        hang: true,
        one_way: true,
        split: true,
        ops,
        release: true,
        quiet_until_ms: 80,
        grid_ms: 40,
        formed: nodes > 2,
        by_node: nodes > 2,
        script: Vec::new(),
        heal_merge: false,
        fair_every: 2,
    }
}

/// Two nodes split at 80 ms, each active by 160 ms, when a client gets the
/// key from the one that steps down at the heal; from 200 ms, every heal
/// and every request of the other client.
pub fn heal_scope() -> Scope {
    use Step::{Acquire, Split};
    Scope {
        crash: false,
        restart: false,
        leave: false,
        hang: false,
        one_way: false,
        release: false,
        quiet_until_ms: 200,
        formed: true,
        script: vec![(80, Split(0, 1)), (160, Acquire(0, 1, 0))],
        heal_merge: true,
        fair_every: 200,
        ..scope(2, 2, 480)
    }
}

/// Three nodes formed, a client holding the key from the active since
/// 80 ms; from 120 ms, one fault of any kind and every request of the
/// other client.
pub fn three_scope() -> Scope {
    Scope {
        release: false,
        quiet_until_ms: 120,
        script: vec![(80, Step::Acquire(0, 0, 0))],
        fair_every: 32,
        ..scope(3, 2, 280)
    }
}

/// The scope a test explores, by its name.
pub fn scope_of(test: &str) -> Scope {
    match test {
        "two_nodes" => scope(2, 2, 200),
        "three_nodes" => three_scope(),
        // (No fair continuations: RINGLOCK_MODEL_FAIR_EVERY adds them.)
        "deep_two_nodes" => Scope {
            fair_every: 0,
            ..scope(2, 3, 280)
        },
        "deep_three_nodes" => Scope {
            fair_every: 0,
            ..scope(3, 2, 240)
        },
        "the_grants_of_a_split_survive_the_heal" => heal_scope(),
        other => panic!("no scope {other:?}"),
    }
}

/// Parses a trace as [`show`] prints it.
pub fn parse_trace(s: &str) -> Result<Vec<Step>, String> {
    s.split_whitespace().map(str::parse).collect()
}
