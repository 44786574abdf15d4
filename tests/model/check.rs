//! The properties, checked on every state the explorer reaches, and the
//! lock service's sequential specification the clients' histories are
//! compared with.
//!
//! The specification, per key: free, or held by one client with one token
//! until its lease ends (`A` grants a free key with a token above every
//! earlier one; `R` with the holder's token frees it and answers 1; `N`
//! with it moves the lease's end; the lease's end frees it). A client's
//! belief is the spec's holder as that client saw it. Along a path on which
//! no two nodes were ever active at once since a belief began, and whose
//! granting node did not crash meanwhile, the history must fit the spec:
//! no second holder, `R` and `N` of a live lease answered 1. Across two
//! actives, the fencing rule must hold instead (a later overlapping grant
//! has the higher token); once the split has healed, with the merge of
//! grants at a heal checked, no new grant may overlap a believed one.

use std::collections::{BTreeMap, BTreeSet};

use super::world::{
    HEARTBEAT_MS, LEASE_MS, PEER_TIMEOUT_MS, Scope, WAIT_MS, World, client_addr, key_name,
};

/// Two running active nodes are a violation unless the network cut them
/// apart (a block either way) less than this long ago: a peer timeout to
/// notice each other after a heal, a redial of a link that broke meanwhile,
/// a heartbeat. A hang, a crash, a restart or a hand-off never makes two
/// actives: a stalled active steps down before it serves, a stalled or
/// restarted standby hears the active before it decides.
pub const TOGETHER_MS: u64 = 2 * PEER_TIMEOUT_MS + 2 * 100 + HEARTBEAT_MS;

#[derive(Debug, Clone, Hash)]
struct Belief {
    client: usize,
    key: usize,
    token: u64,
    node: usize,
    start: u64,
    end: u64,
    released: bool,
    /// A crash (or a leave with no successor) took it: no running node
    /// held it then.
    excused: bool,
    /// Two nodes were active at once since it began.
    split: bool,
}

impl Belief {
    fn live(&self, now: u64) -> bool {
        !self.released && !self.excused && self.end > now
    }
}

#[derive(Debug, Clone, Default, Hash)]
pub struct Checker {
    heal_merge: bool,
    beliefs: Vec<Belief>,
    /// Per key: the last token a client received, and whether two actives
    /// existed since.
    last_token: BTreeMap<usize, (u64, bool)>,
    /// When the way between two nodes was last unblocked (`u64::MAX`:
    /// blocked now; none: never blocked).
    together: BTreeMap<(usize, usize), u64>,
    /// Acquires withdrawn (the client closed while waiting): client, key,
    /// the highest token any node knew then.
    withdrawn: Vec<(usize, usize, u64)>,
    /// Two actives were seen on this path.
    pub ever_split: bool,
    /// When a fair continuation began (see [`Checker::fair`]).
    fair_since: Option<u64>,
    failure: Option<String>,
}

impl Checker {
    pub fn new(scope: &Scope) -> Checker {
        Checker {
            heal_merge: scope.heal_merge,
            ..Checker::default()
        }
    }

    /// A fair continuation begins: every block heals, and two actives
    /// are allowed for [`TOGETHER_MS`] from now, as after a heal. (Not only
    /// after a block: at the model's timers a node that resumes from a
    /// hang, or restarts, with every link to its peer closed waits one
    /// peer timeout, 50 ms, to hear who is active, while its peer redials
    /// it only after the cluster's fixed redial delay, 100 ms; so it takes
    /// the role beside the active until they meet. The search within the
    /// horizon keeps the strict rule.)
    pub fn fair(&mut self, now: u64) {
        self.fair_since = Some(now);
    }

    pub fn fail(&mut self, what: String) {
        self.failure.get_or_insert(what);
    }

    /// Every state: the failure noted during the step, then the
    /// properties of the state itself.
    pub fn on_state(&mut self, w: &World) -> Result<(), String> {
        if let Some(f) = self.failure.take() {
            return Err(f);
        }
        let actives = w.actives();
        if actives.len() >= 2 {
            self.ever_split = true;
            for b in &mut self.beliefs {
                b.split = true;
            }
            for v in self.last_token.values_mut() {
                v.1 = true;
            }
        }
        self.check_together(w, &actives)?;
        self.check_withdrawn(w)?;
        self.check_answered(w)
    }

    /// At most one active among nodes that hear each other: two only
    /// after a block between them.
    fn check_together(&mut self, w: &World, actives: &[usize]) -> Result<(), String> {
        let n = w.scope.nodes;
        for a in 0..n {
            for b in a + 1..n {
                if !w.reachable(a, b) {
                    self.together.insert((a, b), u64::MAX);
                    continue;
                }
                // Never blocked: since the start.
                let since = self.together.entry((a, b)).or_insert(0);
                if *since == u64::MAX {
                    *since = w.now;
                }
                let since = (*since).max(self.fair_since.unwrap_or(0));
                if actives.contains(&a) && actives.contains(&b) && w.now >= since + TOGETHER_MS {
                    let why = if self.fair_since == Some(since) {
                        format!("the fair continuation began at {since} ms")
                    } else if since == 0 {
                        "nothing ever blocked the way between them".to_string()
                    } else {
                        format!("the way between them was unblocked at {since} ms")
                    };
                    return Err(format!("n{a} and n{b} are both active, and {why}"));
                }
            }
        }
        Ok(())
    }

    /// No waiter is granted after it withdrew.
    fn check_withdrawn(&self, w: &World) -> Result<(), String> {
        for &(c, k, highest) in &self.withdrawn {
            let key = key_name(k);
            for x in 0..w.scope.nodes {
                let Some(node) = w.node(x) else { continue };
                let Some((token, _)) = node.engine().holder(key.as_bytes()) else {
                    continue;
                };
                let holder = node
                    .engine()
                    .holder_of(key.as_bytes())
                    .and_then(|h| h.addr.map(<[u8]>::to_vec));
                if token > highest
                    && holder.as_deref() == Some(client_addr(c).to_string().as_bytes())
                {
                    return Err(format!(
                        "n{x} holds {key} for c{c} with token {token}, issued after c{c} \
                         withdrew its acquire"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every acquire is answered within its wait (bounded liveness: time
    /// moves only once every delivery and timer of the instant is done).
    fn check_answered(&self, w: &World) -> Result<(), String> {
        for (c, client) in w.clients.iter().enumerate() {
            if let Some(wait) = &client.waiting
                && w.runs(wait.node)
                && w.now > wait.sent_ms + WAIT_MS + HEARTBEAT_MS
            {
                return Err(format!(
                    "c{c}'s request to n{} of {} ms has no answer",
                    wait.node, wait.sent_ms
                ));
            }
        }
        Ok(())
    }

    /// A node crashed: the grants that no running node holds now
    /// (`survivors`: key, token) went with it, and are excused from now on
    /// ("every grant a standby acknowledged survives a failover").
    pub fn crashed(&mut self, survivors: &BTreeSet<(Vec<u8>, u64)>) {
        for b in &mut self.beliefs {
            if !survivors.contains(&(key_name(b.key).into_bytes(), b.token)) {
                b.excused = true;
            }
        }
    }

    pub fn acquiring(&mut self, c: usize, k: usize) {
        self.withdrawn.retain(|&(wc, wk, _)| (wc, wk) != (c, k));
    }

    pub fn withdrew(&mut self, c: usize, k: usize, highest: u64) {
        self.withdrawn.push((c, k, highest));
    }

    /// Client `c` reads `A key token` from `node`.
    pub fn granted(&mut self, w: &World, c: usize, k: usize, token: u64, node: usize) {
        let now = w.now;
        let key = key_name(k);
        if let Some(&(last, split)) = self.last_token.get(&k)
            && token <= last
            && !split
        {
            self.fail(format!(
                "c{c} got {key} with token {token} after {last} was granted, with never two actives between"
            ));
        }
        let last = self.last_token.get(&k).map_or(0, |v| v.0);
        self.last_token.insert(k, (last.max(token), false));
        let healed = w.actives().len() <= 1 && w.blocked.is_empty();
        let mut found = None;
        for b in self.beliefs.iter().filter(|b| b.key == k && b.live(now)) {
            let held = format!(
                "c{} holds {key} with token {} from n{} since {} ms",
                b.client, b.token, b.node, b.start
            );
            if !b.split {
                found = Some(format!(
                    "mutual exclusion: {held} (one active all along), and n{node} grants it to c{c} with token {token}"
                ));
            } else if token <= b.token && b.start < now {
                // Two actives granting in the same instant order their
                // tokens by their clocks alone; a later one is above.
                found = Some(format!(
                    "fencing: {held}, and n{node} grants it to c{c} with the lower token {token}"
                ));
            } else if self.heal_merge && healed && self.ever_split {
                found = Some(format!(
                    "after the heal: {held}, and n{node} grants it to c{c} with token {token}"
                ));
            }
            if found.is_some() {
                break;
            }
        }
        if let Some(f) = found {
            self.fail(f);
        }
        self.beliefs.push(Belief {
            client: c,
            key: k,
            token,
            node,
            start: now,
            end: now + LEASE_MS,
            released: false,
            excused: false,
            split: false,
        });
    }

    /// The client sent `R`: it no longer believes it holds the key.
    pub fn released(&mut self, c: usize, k: usize, token: u64) {
        for b in &mut self.beliefs {
            if (b.client, b.key, b.token) == (c, k, token) {
                b.released = true;
            }
        }
    }

    /// `R` (or `N`) answered: 0 for a lease that is live by the spec, on a
    /// path with one active and no crash of its node, is a lost grant.
    pub fn release_answer(&mut self, c: usize, k: usize, token: u64, ok: bool, now: u64) {
        if ok {
            return;
        }
        let lost = self.beliefs.iter().any(|b| {
            (b.client, b.key, b.token) == (c, k, token) && !b.excused && !b.split && b.end > now
        });
        if lost {
            self.fail(format!(
                "grant lost: c{c}'s lease of {} with token {token} is live, and its node answers 0",
                key_name(k)
            ));
        }
    }

    pub fn renewed(&mut self, c: usize, k: usize, token: u64, now: u64) {
        for b in &mut self.beliefs {
            if (b.client, b.key, b.token) == (c, k, token) && !b.released {
                b.end = now + LEASE_MS;
            }
        }
    }
}
