//! Model checking the cluster: every interleaving at small scope of the
//! real nodes (tests/model/). Each test explores one scope breadth first
//! and fails with the shortest trace that breaks a property, printed step
//! by step with the line that replays it.
//!
//! # The properties, on every state
//!
//! - Each node's own invariant walker, and no panic in any node.
//! - At most one running active, unless the network cut two apart (a
//!   block either way) less than [`model::check::TOGETHER_MS`] ago: a hang,
//!   a crash, a restart or a hand-off never makes two.
//! - A standby that becomes active still holds every grant it had.
//! - Tokens a client receives for one key never go back, except across a
//!   state with two actives; then the fencing rule holds: a grant that
//!   overlaps a believed one, made at a later instant, has the higher token.
//! - The lock service's sequential specification (tests/model/check.rs),
//!   on every path with one active since a grant: no second holder while a
//!   lease is believed, `R` and `N` of a live lease answered 1 (no grant
//!   lost except across a crash that no running node's table survived).
//! - With the merge at a heal checked: once a split has healed, no new
//!   grant overlaps a believed one.
//! - No waiter is granted after it withdrew (its node read the close).
//! - Every request is answered within its wait (bounded liveness).
//! - Liveness over fair paths ([`model::fair_suffix`]): from every state
//!   found (every few in the larger scopes), with every block healed and
//!   no new fault, restart or request, deliveries, timers and time going
//!   on, every waiting request is answered (granted, timed out, redirected
//!   or its connection closed) and the cluster agrees on one active, every
//!   other running node following it, within [`model::FAIR_MS`]; a
//!   counterexample is the trace to the state, `fair`, and the
//!   continuation.
//!
//! # Running
//!
//! `cargo test --test model_check` runs the CI bounds. The deeper bounds:
//! `cargo test --test model_check deep -- --ignored --nocapture`.
//! `RINGLOCK_MODEL_FAIR_EVERY=<n>`: a fair continuation from every `n`th
//! state found (0: none) instead of the scope's own rate. A
//! counterexample prints `RINGLOCK_MODEL_TRACE='...'`, which the
//! `a_trace_replays_as_printed` test then replays, printing what each step
//! did (`RINGLOCK_MODEL_SCOPE`: the test the trace came from;
//! `RINGLOCK_MODEL_FAIR=1`: then a fair continuation from its end). The
//! same counterexample prints `RINGLOCK_SIM_TRACE='...'` too, which replays
//! it in the simulator (tests/cluster_sim.rs,
//! `a_trace_replays_in_the_simulator`).

mod model;

use model::{World, explore, parse_trace, replay, scope_of, show};

fn run(test: &str, max_states: usize) {
    let mut scope = scope_of(test);
    if let Ok(every) = std::env::var("RINGLOCK_MODEL_FAIR_EVERY") {
        scope.fair_every = every
            .parse()
            .expect("RINGLOCK_MODEL_FAIR_EVERY is a number");
    }
    let out = explore(&scope, max_states);
    eprintln!("{test}: {}", out.summary());
    if let Some((trace, why)) = &out.violation {
        panic!("{test}: {why}\n{}", show(&scope, trace, test));
    }
}

#[test]
fn two_nodes() {
    run("two_nodes", 6_000);
}

#[test]
fn three_nodes() {
    run("three_nodes", 8_000);
}

#[test]
#[ignore = "the deeper bounds: minutes"]
fn deep_two_nodes() {
    run("deep_two_nodes", 100_000);
}

#[test]
#[ignore = "the deeper bounds: minutes"]
fn deep_three_nodes() {
    run("deep_three_nodes", 30_000);
}

/// Two actives of a split each keep what they granted; at the heal the one
/// that steps down merges its grants into the one that stays, so no grant
/// a client believes in is lost or granted to another (before the merge,
/// this found the outranked side's grant lost and granted again).
#[test]
fn the_grants_of_a_split_survive_the_heal() {
    run("the_grants_of_a_split_survive_the_heal", 1_000_000);
}

/// A trace prints as a line that parses back into the same steps and
/// replays to the same state; with `RINGLOCK_MODEL_TRACE` that trace is
/// replayed, each step shown.
#[test]
fn a_trace_replays_as_printed() {
    let test = std::env::var("RINGLOCK_MODEL_SCOPE").unwrap_or_else(|_| "two_nodes".into());
    let scope = scope_of(&test);
    if let Ok(text) = std::env::var("RINGLOCK_MODEL_TRACE") {
        let mut trace = parse_trace(&text).expect("a trace as the checker prints it");
        let (mut w, result) = replay(&scope, &trace, true);
        if result.is_ok() && std::env::var_os("RINGLOCK_MODEL_FAIR").is_some() {
            // Then a fair continuation from where it ends.
            let suffix = match model::fair_suffix(&mut w) {
                Ok(suffix) | Err((suffix, _)) => suffix,
            };
            trace.extend(suffix);
        }
        println!("{}", show(&scope, &trace, &test));
        let (_, result) = replay(&scope, &trace, true);
        assert!(result.is_ok(), "the trace breaks a property: {result:?}");
        return;
    }
    // The cluster forms, a client asks the active for the key.
    let mut w = World::new(scope.clone());
    let mut trace = Vec::new();
    while !(w.now >= 1_080 && w.quiescent()) {
        let step = w.enabled()[0];
        w.apply(step).unwrap();
        trace.push(step);
    }
    let active = w.actives()[0] as u8;
    let ask = model::Step::Acquire(0, active, 0);
    w.apply(ask).unwrap();
    trace.push(ask);
    while !w.quiescent() {
        let step = w.enabled()[0];
        w.apply(step).unwrap();
        trace.push(step);
    }
    assert!(w.describe().contains("k0="), "granted: {}", w.describe());
    let printed = show(&scope, &trace, &test);
    let line = printed
        .lines()
        .find_map(|l| l.strip_prefix("replay: RINGLOCK_MODEL_TRACE='"))
        .and_then(|l| l.split('\'').next())
        .expect("the replay line");
    let parsed = parse_trace(line).unwrap();
    assert_eq!(parsed, trace);
    let (again, result) = replay(&scope, &parsed, true);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(again.fingerprint(), w.fingerprint());
}
