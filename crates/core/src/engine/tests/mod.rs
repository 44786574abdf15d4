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
use crate::outbox::Outbox;
use crate::outbox::cid;
use crate::proto::Holder;

/// The clock every harness starts at.
const START: Now = Now {
    ms: 1_000,
    us: 1_000_000,
    unix_ns: 1_700_000_000_000_000_000,
};

/// An engine with a hand-driven clock, the outbox it answers into (the
/// node's, in a server) and a few connections.
struct Harness {
    engine: Engine,
    out: Outbox,
    now: Now,
}

impl Harness {
    /// An active engine with connections `0..conns` open.
    fn new(conns: u32) -> Harness {
        Harness::with_engine(Engine::new(START, "127.0.0.1:7171"), conns)
    }

    /// Around `engine` (made at [`START`], with no connection open yet),
    /// with connections `0..conns` open.
    fn with_engine(engine: Engine, conns: u32) -> Harness {
        let mut h = Harness {
            engine,
            out: Outbox::new(),
            now: START,
        };
        for c in 0..conns {
            h.engine.open(cid(c), &mut h.out);
        }
        h
    }

    /// The engine's invariants, and that its outbox agrees with it on
    /// which connections are open (as the node checks).
    fn check(&self) {
        self.engine.check_invariants();
        crate::node::check_outbox(&self.engine, &self.out);
    }

    /// Sends one request line (without `\n`).
    fn send(&mut self, conn: ConnId, line: &str) -> Result<(), Refusal> {
        let wire = format!("{line}\n");
        let (request, _) = crate::proto::parse_request(wire.as_bytes())
            .expect("valid request")
            .expect("whole line");
        let result = self.engine.handle(self.now, conn, request, &mut self.out);
        self.check();
        result
    }

    /// Moves the clock forward and runs the timers.
    fn advance(&mut self, ms: u64) {
        self.now.ms += ms;
        self.now.unix_ns += ms * 1_000_000;
        self.engine.tick(self.now, &mut self.out);
        self.check();
    }

    /// The same one ms at a time, ticking each, so that timers fire in
    /// deadline order.
    fn advance_each_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now.ms += 1;
            self.now.unix_ns += 1_000_000;
            self.engine.tick(self.now, &mut self.out);
        }
        self.check();
    }

    /// Takes the answers written to `conn` so far, one string per line.
    fn answers(&mut self, conn: ConnId) -> Vec<String> {
        let out = std::mem::take(self.out.output_mut(conn));
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

    /// Sends `line` (`A`, `G` or `C`), which must be granted at once;
    /// returns its token.
    fn granted(&mut self, conn: ConnId, line: &str) -> u64 {
        self.send(conn, line).unwrap();
        let answers = self.answers(conn);
        assert_eq!(answers.len(), 1, "{line}: {answers:?}");
        multi::token(&answers[0])
    }

    /// Closes `conn` as the node does (then settles), and opens the id
    /// again.
    fn reopen(&mut self, conn: ConnId) {
        self.engine.close(conn, &mut self.out);
        self.engine.settle(self.now, &mut self.out);
        self.check();
        self.engine.open(conn, &mut self.out);
    }
}

fn token_of(answer: &str, key: &str) -> u64 {
    let rest = answer
        .strip_prefix(&format!("A {key} "))
        .unwrap_or_else(|| panic!("not a grant of {key}: {answer:?}"));
    rest.parse().unwrap()
}
