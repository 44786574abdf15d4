//! Engine tests with a fake clock: every answer the engine writes is checked.

mod basics;
mod exhaustion;
mod holders;
mod identities;
mod max_locks;
mod merge;
mod multi;
mod output;
mod replicated;

use super::*;
use crate::proto::Holder;

/// An engine with a hand-driven clock and a few connections.
struct Harness {
    engine: Engine,
    now: Now,
}

impl Harness {
    fn new(conns: u32) -> Harness {
        let now = Now {
            ms: 1_000,
            us: 1_000_000,
            unix_ns: 1_700_000_000_000_000_000,
        };
        let mut engine = Engine::new(now, "127.0.0.1:7171");
        for c in 0..conns {
            engine.open(c);
        }
        Harness { engine, now }
    }

    /// Sends one request line (without `\n`).
    fn send(&mut self, conn: ConnId, line: &str) -> Result<(), Refusal> {
        let wire = format!("{line}\n");
        let (request, _) = crate::proto::parse_request(wire.as_bytes())
            .expect("valid request")
            .expect("whole line");
        let result = self.engine.handle(self.now, conn, request);
        self.engine.check_invariants();
        result
    }

    /// Moves the clock forward and runs the timers.
    fn advance(&mut self, ms: u64) {
        self.now.ms += ms;
        self.now.unix_ns += ms * 1_000_000;
        self.engine.tick(self.now);
        self.engine.check_invariants();
    }

    /// Takes the answers written to `conn` so far, one string per line.
    fn answers(&mut self, conn: ConnId) -> Vec<String> {
        let out = std::mem::take(self.engine.output_mut(conn));
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Sends an acquire that must be granted at once; returns its token.
    fn grant(&mut self, conn: ConnId, key: &str, lease: &str) -> u64 {
        self.send(conn, &format!("A {key} {lease} 0")).unwrap();
        let answers = self.answers(conn);
        assert_eq!(answers.len(), 1, "{answers:?}");
        token_of(&answers[0], key)
    }
}

fn token_of(answer: &str, key: &str) -> u64 {
    let rest = answer
        .strip_prefix(&format!("A {key} "))
        .unwrap_or_else(|| panic!("not a grant of {key}: {answer:?}"));
    rest.parse().unwrap()
}
