//! The fencing token clock.
//!
//! Every grant takes `token = max(last + 1, unix_time_in_nanoseconds)`. The
//! `last + 1` half makes tokens strictly increasing on one node whatever the
//! clock does; the wall-clock half makes a node restarted without any stored
//! state start above every token it issued before, provided its clock was not
//! stepped back by more than the time it was down. A node that learns of a
//! token from elsewhere (a peer, a replicated grant) `observe`s it, so that
//! its next token is above that one too.
//!
//! In a cluster, no two nodes ever issue the same token: node `i` of `n`
//! issues only tokens that leave `i` when divided by `n` (the rule above,
//! rounded up to the next such number). Two actives of a split brain can
//! both grant a key with clocks that read the same nanosecond (or with
//! counters that ran on from the same observed token); when the partition
//! heals, the merge must tell their grants apart by token, and a token
//! names one grant of one node.
//!
//! Tokens are bounded by [`MAX_TOKEN`], far below `u64::MAX`: a token that
//! could reach `u64::MAX` (a peer reporting it, a clock set absurdly far
//! ahead) would leave no room for the next one. When the clock has issued or
//! observed [`MAX_TOKEN`], [`next`] says so with `None`, and the engine
//! refuses the grant instead of panicking.
//!
//! [`next`]: TokenClock::next

/// The highest token this node issues or accepts from a peer: 2^63 - 1.
/// As a wall clock in Unix nanoseconds that is April 2262; the rule above
/// reaches it only by a clock set centuries ahead or by tokens observed
/// from a peer that has gone wrong. Peers' tokens above it are refused at
/// the cluster's wire parser; the engine clamps what it observes to it.
pub const MAX_TOKEN: u64 = (1 << 63) - 1;

/// Issues fencing tokens; see the module docs for the rule.
#[derive(Debug, Clone)]
pub struct TokenClock {
    /// The highest token issued or observed; 0 if none. Never above
    /// [`MAX_TOKEN`].
    last: u64,
    /// Every token issued is `residue` modulo `stride` (1 and 0 for a
    /// node alone: any number).
    stride: u64,
    residue: u64,
    /// The highest token this clock may issue: [`MAX_TOKEN`] rounded down
    /// to its residue.
    top: u64,
}

impl Default for TokenClock {
    fn default() -> Self {
        TokenClock::new()
    }
}

impl TokenClock {
    pub fn new() -> Self {
        TokenClock {
            last: 0,
            stride: 1,
            residue: 0,
            top: MAX_TOKEN,
        }
    }

    /// From now on, issues only tokens that are `index` modulo `nodes`:
    /// node `index` of a cluster of `nodes` (see the module docs).
    pub(crate) fn share(&mut self, index: usize, nodes: usize) {
        assert!(index < nodes, "node {index} of a cluster of {nodes}");
        self.stride = nodes as u64;
        self.residue = index as u64;
        self.top = MAX_TOKEN - (MAX_TOKEN - self.residue) % self.stride;
    }

    /// Issues the next token: above every token issued or observed before,
    /// at least `unix_ns` (a wall clock beyond [`MAX_TOKEN`] counts as
    /// [`MAX_TOKEN`]), and of this node's residue ([`TokenClock::share`]).
    /// `None` once the highest such token up to [`MAX_TOKEN`] has been
    /// issued or passed by one observed: the token space is exhausted, and
    /// nothing may be granted.
    #[must_use]
    pub fn next(&mut self, unix_ns: u64) -> Option<u64> {
        let top = self.top;
        if self.last >= top {
            return None;
        }
        // At most `top`, which has the residue: rounding up stays there.
        let mut token = (self.last + 1).max(unix_ns.min(top));
        if self.stride > 1 {
            let residue = token % self.stride;
            token += if residue <= self.residue {
                self.residue - residue
            } else {
                self.residue + self.stride - residue
            };
        }
        debug_assert!(token > self.last && token <= top);
        debug_assert_eq!(token % self.stride, self.residue);
        self.last = token;
        Some(token)
    }

    /// Records a token seen elsewhere, so that every later token is above
    /// it. The caller refuses tokens above [`MAX_TOKEN`] (a peer's are
    /// checked where its lines are parsed); one that gets here anyway is
    /// clamped to it, which exhausts the clock rather than wrapping it.
    pub(crate) fn observe(&mut self, token: u64) {
        debug_assert!(
            token <= MAX_TOKEN,
            "token {token} above MAX_TOKEN reached the token clock"
        );
        self.last = self.last.max(token.min(MAX_TOKEN));
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
        assert_eq!(clock.next(1_000), Some(1_000));
        assert_eq!(clock.next(5_000), Some(5_000));
        assert_eq!(clock.highest(), 5_000);
    }

    #[test]
    fn strictly_increases_when_the_clock_stalls_or_steps_back() {
        let mut clock = TokenClock::new();
        let first = clock.next(1_000_000).unwrap();
        let same_ns = clock.next(1_000_000).unwrap();
        let stepped_back = clock.next(10).unwrap();
        assert!(first < same_ns && same_ns < stepped_back);
        assert_eq!(stepped_back, 1_000_002);
    }

    #[test]
    fn a_restart_without_state_starts_above_the_old_tokens() {
        let mut before = TokenClock::new();
        let old: Vec<u64> = (0..100)
            .map(|i| before.next(1_000_000 + i).unwrap())
            .collect();
        // A new process, later by the wall clock, knows nothing of `before`.
        let mut after = TokenClock::new();
        let new = after.next(1_000_000 + 200).unwrap();
        assert!(old.iter().all(|&t| t < new));
    }

    #[test]
    fn observed_tokens_are_exceeded() {
        let mut clock = TokenClock::new();
        clock.observe(u64::MAX / 4);
        clock.observe(7);
        assert_eq!(clock.highest(), u64::MAX / 4);
        assert_eq!(clock.next(1), Some(u64::MAX / 4 + 1));
    }

    #[test]
    fn max_token_is_issued_once_then_the_clock_is_exhausted() {
        let mut clock = TokenClock::new();
        clock.observe(MAX_TOKEN - 2);
        assert_eq!(clock.next(0), Some(MAX_TOKEN - 1));
        assert_eq!(clock.next(0), Some(MAX_TOKEN));
        assert_eq!(clock.next(0), None);
        assert_eq!(clock.next(u64::MAX), None);
        assert_eq!(clock.highest(), MAX_TOKEN, "exhaustion changes nothing");
    }

    #[test]
    fn a_wall_clock_beyond_max_token_clamps_to_it() {
        let mut clock = TokenClock::new();
        assert_eq!(clock.next(u64::MAX), Some(MAX_TOKEN));
        assert_eq!(clock.next(u64::MAX), None);
        assert_eq!(clock.highest(), MAX_TOKEN);
    }

    #[test]
    fn observing_max_token_exhausts_the_clock() {
        let mut clock = TokenClock::new();
        assert_eq!(clock.next(1_000), Some(1_000));
        clock.observe(MAX_TOKEN);
        assert_eq!(clock.next(2_000), None);
        assert_eq!(clock.highest(), MAX_TOKEN);
    }

    /// Release builds clamp what the caller failed to bound (debug builds
    /// stop at the `debug_assert`, which is the caller's bug).
    #[test]
    #[cfg(not(debug_assertions))]
    fn an_unbounded_observed_token_is_clamped() {
        let mut clock = TokenClock::new();
        clock.observe(u64::MAX);
        assert_eq!(clock.highest(), MAX_TOKEN);
        assert_eq!(clock.next(0), None);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "above MAX_TOKEN")]
    fn an_unbounded_observed_token_is_a_callers_bug() {
        TokenClock::new().observe(MAX_TOKEN + 1);
    }

    #[test]
    fn nodes_of_a_cluster_never_issue_the_same_token() {
        // Three actives of a split brain: the same clock readings, and all
        // saw the same token before the split (so each counts up from it).
        let mut clocks: Vec<TokenClock> = (0..3)
            .map(|i| {
                let mut clock = TokenClock::new();
                clock.share(i, 3);
                clock.observe(5_000);
                clock
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for unix_ns in [1_000, 1_000, 1_000, 9_000, 9_000, 9_001, 2] {
            for (i, clock) in clocks.iter_mut().enumerate() {
                let token = clock.next(unix_ns).unwrap();
                assert_eq!(token % 3, i as u64, "node {i}'s residue");
                assert!(token >= unix_ns.min(MAX_TOKEN));
                assert!(seen.insert(token), "token {token} issued twice");
            }
        }
        // Each still increases by the least step its residue allows.
        let mut node1 = TokenClock::new();
        node1.share(1, 3);
        assert_eq!(node1.next(6), Some(7));
        assert_eq!(node1.next(6), Some(10));
        assert_eq!(node1.next(13), Some(13));
        assert_eq!(node1.next(14), Some(16));
    }

    #[test]
    fn a_shared_clock_is_exhausted_at_its_highest_token() {
        for (index, nodes) in [(0, 3), (1, 3), (2, 3), (15, 16), (0, 1)] {
            let mut clock = TokenClock::new();
            clock.share(index, nodes);
            let top = clock.top;
            assert_eq!(top % nodes as u64, index as u64);
            assert!(top <= MAX_TOKEN && MAX_TOKEN - top < nodes as u64);
            // A wall clock beyond MAX_TOKEN gives the highest token once.
            assert_eq!(clock.next(u64::MAX), Some(top));
            assert_eq!(clock.next(u64::MAX), None);
            let mut observed = TokenClock::new();
            observed.share(index, nodes);
            observed.observe(top);
            assert_eq!(observed.next(0), None, "nothing above {top}");
        }
    }
}
