//! The fencing token clock.
//!
//! Every grant takes `token = max(last + 1, unix_time_in_nanoseconds)`. The
//! `last + 1` half makes tokens strictly increasing on one node whatever the
//! clock does; the wall-clock half makes a node restarted without any stored
//! state start above every token it issued before, provided its clock was not
//! stepped back by more than the time it was down. A node that learns of a
//! token from elsewhere (a peer, a replicated grant) [`observe`]s it, so that
//! its next token is above that one too.
//!
//! [`observe`]: TokenClock::observe

/// The highest token a node issues or accepts from a peer: 2^63 - 1, the
/// Unix time in nanoseconds of the year 2262, and far from `u64::MAX`.
pub const MAX_TOKEN: u64 = (1 << 63) - 1;

/// Issues fencing tokens; see the module docs for the rule.
#[derive(Debug, Default, Clone)]
pub struct TokenClock {
    /// The highest token issued or observed; 0 if none.
    last: u64,
}

impl TokenClock {
    pub fn new() -> Self {
        TokenClock { last: 0 }
    }

    /// Issues the next token: above every token issued or observed before,
    /// and at least `unix_ns`.
    ///
    /// Panics if the token space is exhausted (`u64::MAX` issued): that is
    /// year 2554 by the wall clock, or a peer that reported a corrupt token.
    pub fn next(&mut self, unix_ns: u64) -> u64 {
        let after_last = self
            .last
            .checked_add(1)
            .expect("fencing token space exhausted");
        let token = after_last.max(unix_ns);
        debug_assert!(token > self.last);
        self.last = token;
        token
    }

    /// Records a token seen elsewhere, so that every later token is above it.
    pub fn observe(&mut self, token: u64) {
        self.last = self.last.max(token);
    }

    /// The highest token issued or observed (0 if none): what `S` reports.
    pub fn highest(&self) -> u64 {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_wall_clock_when_it_is_ahead() {
        let mut clock = TokenClock::new();
        assert_eq!(clock.highest(), 0);
        assert_eq!(clock.next(1_000), 1_000);
        assert_eq!(clock.next(5_000), 5_000);
        assert_eq!(clock.highest(), 5_000);
    }

    #[test]
    fn strictly_increases_when_the_clock_stalls_or_steps_back() {
        let mut clock = TokenClock::new();
        let first = clock.next(1_000_000);
        let same_ns = clock.next(1_000_000);
        let stepped_back = clock.next(10);
        assert!(first < same_ns && same_ns < stepped_back);
        assert_eq!(stepped_back, 1_000_002);
    }

    #[test]
    fn a_restart_without_state_starts_above_the_old_tokens() {
        let mut before = TokenClock::new();
        let old: Vec<u64> = (0..100).map(|i| before.next(1_000_000 + i)).collect();
        // A new process, later by the wall clock, knows nothing of `before`.
        let mut after = TokenClock::new();
        let new = after.next(1_000_000 + 200);
        assert!(old.iter().all(|&t| t < new));
    }

    #[test]
    fn observed_tokens_are_exceeded() {
        let mut clock = TokenClock::new();
        clock.observe(u64::MAX / 2);
        clock.observe(7);
        assert_eq!(clock.highest(), u64::MAX / 2);
        assert_eq!(clock.next(1), u64::MAX / 2 + 1);
    }

    #[test]
    #[should_panic(expected = "exhausted")]
    fn exhaustion_is_loud() {
        let mut clock = TokenClock::new();
        clock.observe(u64::MAX);
        clock.next(0);
    }
}
