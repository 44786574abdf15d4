//! The reference model of the three kinds (exclusive, shared, permits),
//! and random requests checked against it.

use super::*;
use crate::outbox::cid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind3 {
    Excl,
    Shared,
    Permit(u32),
}

impl Kind3 {
    fn op(self) -> &'static str {
        match self {
            Kind3::Excl => "A",
            Kind3::Shared => "G",
            Kind3::Permit(_) => "C",
        }
    }

    fn timeout(self, key: &str) -> String {
        match self {
            Kind3::Excl => format!("T {key}"),
            k => format!("{} {key} 0", k.op()),
        }
    }
}

#[derive(Debug, Clone)]
struct MHolder {
    token: u64,
    conn: ConnId,
    kind: Kind3,
    deadline: u64,
}

#[derive(Debug, Clone)]
struct MWaiter {
    conn: ConnId,
    kind: Kind3,
    lease_ms: u64,
    deadline: Option<u64>,
}

#[derive(Debug, Default)]
struct MKey {
    holders: Vec<MHolder>,
    queue: Vec<MWaiter>,
    limit: u32,
}

/// What the engine should do, step by step: the expected answers of each
/// connection, by key, with `*` for a token the engine picks.
#[derive(Default)]
struct Model {
    keys: BTreeMap<String, MKey>,
    expected: HashMap<(ConnId, String), Vec<String>>,
    /// New holders of this step whose token the engine tells.
    untold: Vec<(String, ConnId)>,
    /// Every deadline set: two at the same ms would fire in an order the
    /// model does not know, so such a run stops there.
    deadlines: BTreeSet<u64>,
    clash: bool,
}

impl Model {
    fn expect(&mut self, conn: ConnId, key: &str, line: String) {
        self.expected
            .entry((conn, key.to_string()))
            .or_default()
            .push(line);
    }

    fn deadline(&mut self, at: u64) -> u64 {
        if !self.deadlines.insert(at) {
            self.clash = true;
        }
        at
    }

    fn grantable(key: &MKey, kind: Kind3) -> bool {
        match kind {
            Kind3::Excl => key.holders.is_empty(),
            Kind3::Shared => key.holders.iter().all(|h| h.kind == Kind3::Shared),
            Kind3::Permit(_) => (key.holders.len() as u32) < key.limit,
        }
    }

    fn grant(&mut self, now: u64, name: &str, conn: ConnId, kind: Kind3, lease_ms: u64) {
        let deadline = self.deadline(now + lease_ms + 1);
        let key = self.keys.get_mut(name).unwrap();
        if key.holders.is_empty() {
            key.limit = match kind {
                Kind3::Permit(n) => n,
                _ => 0,
            };
        }
        key.holders.push(MHolder {
            token: 0,
            conn,
            kind,
            deadline,
        });
        self.untold.push((name.to_string(), conn));
        self.expect(conn, name, format!("{} {name} *", kind.op()));
    }

    fn pass_on(&mut self, now: u64, name: &str) {
        loop {
            let key = &self.keys[name];
            let Some(head) = key.queue.first().cloned() else {
                break;
            };
            if !Model::grantable(key, head.kind) {
                break;
            }
            self.keys.get_mut(name).unwrap().queue.remove(0);
            self.grant(now, name, head.conn, head.kind, head.lease_ms);
            if head.kind == Kind3::Excl {
                break;
            }
        }
        let key = self.keys.get_mut(name).unwrap();
        if key.holders.is_empty() {
            key.limit = 0;
        }
        if key.holders.is_empty() && key.queue.is_empty() {
            self.keys.remove(name);
        }
    }

    /// An acquire; `Err` when the engine must break the connection.
    fn acquire(
        &mut self,
        now: u64,
        conn: ConnId,
        name: &str,
        kind: Kind3,
        lease_ms: u64,
        wait_ms: u64,
    ) -> Result<(), Refusal> {
        let key = self.keys.entry(name.to_string()).or_default();
        let live = if key.holders.is_empty() { 0 } else { key.limit };
        let is_lock = !key.holders.is_empty() && live == 0;
        let refusal = match kind {
            Kind3::Excl if live > 0 => return Err(Refusal::Semaphore),
            Kind3::Shared if live > 0 => Some(format!("G {name} semaphore {live}")),
            Kind3::Permit(_) if is_lock => Some(format!("C {name} lock")),
            Kind3::Permit(n) if live > 0 && live != n => Some(format!("C {name} semaphore {live}")),
            _ => None,
        };
        let idle = key.holders.is_empty() && key.queue.is_empty();
        let now_grantable = key.queue.is_empty()
            && match kind {
                Kind3::Permit(n) => (key.holders.len() as u32) < n,
                _ => Model::grantable(key, kind),
            };
        if let Some(line) = refusal {
            if idle {
                self.keys.remove(name);
            }
            self.expect(conn, name, line);
            return Ok(());
        }
        if now_grantable {
            self.grant(now, name, conn, kind, lease_ms);
            return Ok(());
        }
        let deadline = (wait_ms > 0).then(|| self.deadline(now + wait_ms + 1));
        self.keys.get_mut(name).unwrap().queue.push(MWaiter {
            conn,
            kind,
            lease_ms,
            deadline,
        });
        Ok(())
    }

    fn release(&mut self, now: u64, conn: ConnId, name: &str, token: u64, renew: Option<u64>) {
        let op = if renew.is_some() { "N" } else { "R" };
        let found = self
            .keys
            .get(name)
            .and_then(|k| k.holders.iter().position(|h| h.token == token));
        let Some(i) = found else {
            self.expect(conn, name, format!("{op} {name} 0"));
            return;
        };
        match renew {
            Some(lease_ms) => {
                let d = self.deadline(now + lease_ms + 1);
                self.keys.get_mut(name).unwrap().holders[i].deadline = d;
            }
            None => {
                // A hand-off to the same connection is answered first.
                self.keys.get_mut(name).unwrap().holders.remove(i);
                self.pass_on(now, name);
            }
        }
        self.expect(conn, name, format!("{op} {name} 1"));
    }

    /// The clock reads `now`: what is due fires.
    fn tick(&mut self, now: u64) {
        let names: Vec<String> = self.keys.keys().cloned().collect();
        for name in names {
            let Some(key) = self.keys.get_mut(&name) else {
                continue;
            };
            if let Some(i) = key.holders.iter().position(|h| h.deadline <= now) {
                key.holders.remove(i);
                self.pass_on(now, &name);
            }
            let Some(key) = self.keys.get_mut(&name) else {
                continue;
            };
            if let Some(i) = key
                .queue
                .iter()
                .position(|w| w.deadline.is_some_and(|d| d <= now))
            {
                let w = key.queue.remove(i);
                self.expect(w.conn, &name, w.kind.timeout(&name));
                self.pass_on(now, &name);
            }
        }
    }

    fn close(&mut self, now: u64, conn: ConnId) {
        let names: Vec<String> = self.keys.keys().cloned().collect();
        for name in names {
            self.keys
                .get_mut(&name)
                .unwrap()
                .queue
                .retain(|w| w.conn != conn);
            self.pass_on(now, &name);
        }
    }

    fn pending(&self, conn: ConnId, name: &str) -> bool {
        self.keys
            .get(name)
            .is_some_and(|k| k.queue.iter().any(|w| w.conn == conn))
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One random acquire of any kind, sent to the engine and to the model.
fn random_acquire(
    rng: &mut Rng,
    h: &mut Harness,
    model: &mut Model,
    conn: ConnId,
    name: &str,
    what: &str,
) {
    let kind = match rng.below(3) {
        0 => Kind3::Excl,
        1 => Kind3::Shared,
        _ => Kind3::Permit(1 + rng.below(3) as u32),
    };
    let lease_ms = 20 + rng.below(2000);
    let wait_ms = [0, 0, 10 + rng.below(1500)][rng.below(3) as usize];
    let (lease, wait) = (lease_ms as f64 / 1e3, wait_ms as f64 / 1e3);
    let line = match kind {
        Kind3::Permit(n) => format!("C {name} {n} {lease:.3} {wait:.3}"),
        k => format!("{} {name} {lease:.3} {wait:.3}", k.op()),
    };
    let now = h.now.ms;
    let want = model.acquire(now, conn, name, kind, lease_ms, wait_ms);
    let got = h.send(conn, &line);
    assert_eq!(got, want, "{what}: {line}");
    if got.is_err() {
        model.close(now, conn);
        h.reopen(conn);
    }
}

/// Compares the answers of one step with the model's, per connection and
/// key (the order the protocol promises), and gives the new holders their
/// tokens. Every token of the step is above every earlier one.
fn compare_step(h: &mut Harness, model: &mut Model, conns: u32, last_token: &mut u64, what: &str) {
    let mut got: HashMap<(ConnId, String), Vec<String>> = HashMap::new();
    for c in 0..conns {
        for line in h.answers(cid(c)) {
            let key = line.split(' ').nth(1).unwrap().to_string();
            got.entry((cid(c), key)).or_default().push(line);
        }
    }
    let expected = std::mem::take(&mut model.expected);
    let mut step_max = *last_token;
    for (at, want) in &expected {
        let have = got.remove(at).unwrap_or_default();
        assert_eq!(
            have.len(),
            want.len(),
            "{what}: {at:?}: {have:?} vs {want:?}"
        );
        for (line, pattern) in have.iter().zip(want) {
            match pattern.strip_suffix('*') {
                Some(prefix) => {
                    assert!(line.starts_with(prefix), "{what}: {line:?} vs {pattern:?}");
                    let t = token(line);
                    assert!(t > *last_token, "{what}: token {t} not above {last_token}");
                    step_max = step_max.max(t);
                    let holder = model.keys.get_mut(&at.1).and_then(|k| {
                        k.holders
                            .iter_mut()
                            .find(|x| x.conn == at.0 && x.token == 0)
                    });
                    if let Some(x) = holder {
                        x.token = t;
                    }
                }
                None => assert_eq!(line, pattern, "{what}: {at:?}"),
            }
        }
    }
    assert!(got.is_empty(), "{what}: unexpected answers {got:?}");
    model.untold.clear();
    *last_token = step_max;
}

/// `V` on connection `conn` (which sends nothing else) against the model:
/// each key with a holder or a waiter is listed once with the model's
/// kind, limit, number of holders, waiters and newest token; any other
/// listed key is held by nobody.
fn compare_listing(h: &mut Harness, model: &Model, conn: ConnId, what: &str) {
    h.send(conn, "V 0 1000").unwrap();
    let mut lines = h.answers(conn);
    assert_eq!(lines.pop().as_deref(), Some("V 0"), "{what}");
    let mut listed: HashMap<String, Vec<String>> = HashMap::new();
    for line in lines {
        let f: Vec<String> = line.split(' ').map(str::to_owned).collect();
        assert_eq!((f.len(), f[0].as_str()), (11, "K"), "{what}: {line}");
        assert!(listed.insert(f[1].clone(), f).is_none(), "{what}: twice");
    }
    for (name, key) in &model.keys {
        if key.holders.is_empty() && key.queue.is_empty() {
            continue;
        }
        let f = listed
            .remove(name)
            .unwrap_or_else(|| panic!("{what}: {name} not listed"));
        let (kind, limit) = match key.holders.first().map(|x| x.kind) {
            None => ("-", 0),
            Some(Kind3::Excl) => ("exclusive", 0),
            Some(Kind3::Shared) => ("shared", 0),
            Some(Kind3::Permit(_)) => ("semaphore", key.limit),
        };
        let newest = key.holders.iter().map(|x| x.token).max().unwrap_or(0);
        let want = [
            newest.to_string(),
            key.queue.len().to_string(),
            kind.to_string(),
            limit.to_string(),
            key.holders.len().to_string(),
        ];
        let got = [&f[2], &f[4], &f[8], &f[9], &f[10]];
        assert_eq!(got, want.each_ref(), "{what}: {name}: {f:?}");
    }
    for (name, f) in listed {
        assert_eq!([&*f[2], &*f[8], &*f[10]], ["0", "-", "0"], "{what}: {name}");
    }
}

/// Random acquires of the three kinds, releases and renewals by token
/// (live and dead), waits running out, leases running out and connections
/// closing, over three keys: every answer is the model's, in order per key
/// and connection; FIFO, batching and limits as the model keeps them; the
/// engine's invariants after every step.
#[test]
fn random_requests_match_the_reference_model() {
    let conns = 5;
    let mut runs = 0;
    let mut steps_checked = 0;
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        // One connection more, for the listings.
        let mut h = Harness::new(conns + 1);
        let mut model = Model::default();
        let mut tokens: Vec<(String, u64)> = Vec::new();
        let mut last_token = 0;
        for step in 0..1500 {
            let conn = cid(rng.below(u64::from(conns)) as u32);
            let name = ["a", "b", "c"][rng.below(3) as usize].to_string();
            let now = h.now.ms;
            let what = format!("seed {seed} step {step}");
            match rng.below(12) {
                0..=4 => {
                    if model.pending(conn, &name) {
                        continue;
                    }
                    random_acquire(&mut rng, &mut h, &mut model, conn, &name, &what);
                }
                5..=7 => {
                    let Some((k, t)) = tokens.get(rng.below(tokens.len() as u64 + 1) as usize)
                    else {
                        continue;
                    };
                    let (k, t) = (k.clone(), *t);
                    let renew = (rng.below(3) == 0).then(|| 20 + rng.below(2000));
                    model.release(now, conn, &k, t, renew);
                    let line = match renew {
                        Some(ms) => format!("N {k} {t} {:.3}", ms as f64 / 1e3),
                        None => format!("R {k} {t}"),
                    };
                    h.send(conn, &line).unwrap();
                }
                8..=10 => {
                    for _ in 0..rng.below(120) {
                        h.now.ms += 1;
                        h.now.unix_ns += 1_000_000;
                        h.engine.tick(h.now, &mut h.out);
                        model.tick(h.now.ms);
                    }
                    h.check();
                }
                _ => {
                    model.close(now, conn);
                    h.reopen(conn);
                }
            }
            if model.clash {
                break;
            }
            compare_step(&mut h, &mut model, conns, &mut last_token, &what);
            if step % 5 == 0 {
                compare_listing(&mut h, &model, cid(conns), &what);
            }
            steps_checked += 1;
            for (name, key) in &model.keys {
                for x in &key.holders {
                    if !tokens.contains(&(name.clone(), x.token)) {
                        tokens.push((name.clone(), x.token));
                    }
                }
            }
            if tokens.len() > 64 {
                tokens.drain(..32);
            }
        }
        runs += 1;
    }
    assert_eq!(runs, 60);
    // Runs stop at two deadlines on one ms; most of the steps are checked.
    assert!(steps_checked > 30_000, "only {steps_checked} steps checked");
    eprintln!("{steps_checked} steps checked");
}
