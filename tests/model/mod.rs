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
    /// The first violation: the trace that reaches it and what it broke.
    pub violation: Option<(Vec<Step>, String)>,
}

impl Outcome {
    pub fn summary(&self) -> String {
        format!(
            "{} states, {} steps, depth {} after {} steps of formation, {:.1} s{}",
            self.states,
            self.edges,
            self.depth,
            self.prefix,
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
        if checked && !w.enabled().contains(&step) {
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

/// The trace, one step a line with what it did and the nodes after it,
/// and the line that replays it.
pub fn show(scope: &Scope, trace: &[Step], test: &str) -> String {
    let mut out = String::new();
    let mut w = World::new(scope.clone());
    w.narrate = true;
    for (i, &step) in trace.iter().enumerate() {
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
    out
}

/// Parses a trace as [`show`] prints it.
pub fn parse_trace(s: &str) -> Result<Vec<Step>, String> {
    s.split_whitespace().map(str::parse).collect()
}
