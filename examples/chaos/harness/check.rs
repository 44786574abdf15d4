//! The checks over a run's record, and the report.
//!
//! - **Windows.** Each fault's window is `[start, last heal + settle]`
//!   (`Config::settle_ms`, by default the longest lease plus 0.5 s: a grant
//!   made by a node that is then demoted may be held a whole lease after
//!   the heal). "Outside windows" means outside every fault's window.
//! - **Holders.** A grant is held from the moment the client read it to the
//!   earliest of: the lease's end counted from the acquire's send (the
//!   server's lease started at the grant, later), the release's first send,
//!   and a renewal answered `N key 0`. A renewal answered `N key 1` moves
//!   the end to its send plus its lease. This never makes a correct server
//!   look wrong: two grants of a key may overlap only if the server let them.
//! - **(a) overlap**: two grants of one key held at once; outside windows
//!   if the overlap touches no window.
//! - **(b) token order**: per key, in the order the grants were read, each
//!   token above the one before; a reversal is outside windows if the later
//!   grant was read outside every window.
//! - **(c) lost grant**: `R key 0` (or `N key 0`) whose whole round trip
//!   ended before the lease could have run out; outside windows if the span
//!   from the acquire to that answer touches no window. An answer `0` that
//!   came after the earliest possible end is "ambiguous" and only counted.
//! - **(d) one active after a heal**: from the pollers' `S` answers (every
//!   `poll_ms` on each node), on a 10 ms grid, each node as its last poll
//!   found it: a poll with no answer within 150 ms makes it unreachable; a
//!   gap in the samples (the harness itself not running, on a busy
//!   machine) changes nothing, and is reported. "One active" = exactly one
//!   node says active and every other node that answers names it. Measured
//!   from the fault's last heal to the start of the run of "one active"
//!   that lasts until the next fault starts (or the run ends); also the
//!   last moment two nodes said active ("split brain after heal"). Heals
//!   that happen while another fault is still on are not measured (the
//!   episode's last heal is).
//!   A planned hand-back is not a split brain: a lower-priority active
//!   gives the role to the higher-priority node that has held its
//!   snapshot for the failback delay (the node logs "handing the active
//!   role back to ..."; [`super::nodes::HandBack`]). Its window runs from
//!   100 ms before the line was read (the harness reads node logs a little
//!   late) to the first moment the node it went to is the one active all
//!   agree on, if that comes within the bound; inside it, a moment with
//!   only those two nodes active, no active, or a disagreement is the
//!   hand-back's, not (d)'s, and is measured on its own ("hand-backs").
//!   A hand-back that does not end in one agreed active within the bound,
//!   or with a third node active inside it, excuses nothing: (d) counts
//!   those moments as it counts any other.
//! - **(e) failover**: from the fault's start, the first `S` in which
//!   another node than the one active before says active ("promotion"), and
//!   the first grant a client read from such a node.
//! - **(f) overlap after agreement**: an overlap inside a network fault's
//!   window (loss, isolation, link down) whose later grant was asked for
//!   after the cluster agreed on one active again, with no crash, stop or
//!   SIGTERM between the two grants: the node that gave way merged its
//!   grants into the one that stayed, so none may happen. Agreed here is
//!   stricter than (d)'s one active: every node answers and names it. A
//!   node that does not answer may still be active on its own side of a
//!   network that has not finished healing for it, granting to a client
//!   whose request reaches it before its peers do; until it is heard
//!   giving way, its grants are a split brain's, not a heal's.
//! - **(g) lost grant outside crash windows**: a (c) loss inside a network
//!   fault's window whose request was sent after the cluster agreed on one
//!   active again (as (f) counts it), touching no crash, stop or SIGTERM
//!   window: a heal loses nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::clients::{ClientStats, GrantRec, Sample};
use super::nodes::HandBack;
use super::{Config, Record};

const GRID_US: u64 = 10_000;
/// A gap between two polls of one node longer than this is reported.
const POLL_GAP_US: u64 = 100_000;
/// A fault's notes say when every node answered and agreed if that came
/// this much later than (d)'s one active.
const ALL_AGREE_NOTE_MS: f64 = 100.0;
/// A hand-back's window opens this long before its log line was read.
const HAND_BACK_SLACK_US: u64 = 100_000;

/// The cluster's state at one grid point, as the pollers saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Exactly one active, every other answering node names it.
    One(usize),
    /// One active, some answering node names another or none.
    Disagree(usize),
    /// Two or more nodes say active.
    Split,
    NoActive,
}

#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub t: u64,
    pub class: Class,
    /// Bit i: node i says active.
    pub actives: u32,
    /// Bit i: node i's last poll was answered.
    pub answered: u32,
}

impl Point {
    /// One active, and every one of `nodes` nodes answers and names it: a
    /// node that was active on its own side has been heard giving way.
    fn all_agree(&self, nodes: usize) -> bool {
        matches!(self.class, Class::One(_)) && self.answered.count_ones() as usize == nodes
    }
}

pub fn timeline(samples: &[Sample], nodes: usize, from: u64, to: u64) -> Vec<Point> {
    let mut per: Vec<Vec<&Sample>> = vec![Vec::new(); nodes];
    for s in samples {
        if s.node < nodes {
            per[s.node].push(s);
        }
    }
    for v in &mut per {
        v.sort_by_key(|s| s.t);
    }
    let mut idx = vec![0usize; nodes];
    let mut points = Vec::new();
    let mut t = from;
    while t <= to {
        let (mut actives, mut answered) = (0u32, 0u32);
        let mut answering: Vec<(usize, bool, Option<usize>)> = Vec::new();
        for i in 0..nodes {
            while idx[i] < per[i].len() && per[i][idx[i]].t <= t {
                idx[i] += 1;
            }
            if idx[i] == 0 {
                continue;
            }
            let s = per[i][idx[i] - 1];
            if let Some((active, named, _)) = s.status {
                if active {
                    actives |= 1 << i;
                }
                answered |= 1 << i;
                answering.push((i, active, named));
            }
        }
        let class = match actives.count_ones() {
            0 => Class::NoActive,
            1 => {
                let a = actives.trailing_zeros() as usize;
                if answering
                    .iter()
                    .all(|&(i, _, named)| i == a || named == Some(a))
                {
                    Class::One(a)
                } else {
                    Class::Disagree(a)
                }
            }
            _ => Class::Split,
        };
        points.push(Point {
            t,
            class,
            actives,
            answered,
        });
        t += GRID_US;
    }
    points
}

/// Gaps of more than [`POLL_GAP_US`] between two answered polls of one
/// node: the node answered late, or the harness (a shared machine) did
/// not run. `(count, longest µs, when)`.
pub fn poll_gaps(samples: &[Sample], nodes: usize) -> (usize, u64, u64) {
    let (mut count, mut longest, mut at) = (0, 0, 0);
    for i in 0..nodes {
        let mut mine: Vec<&Sample> = samples.iter().filter(|s| s.node == i).collect();
        mine.sort_by_key(|s| s.t);
        for w in mine.windows(2) {
            let gap = w[1].t - w[0].t;
            if w[0].status.is_some() && w[1].status.is_some() && gap > POLL_GAP_US {
                count += 1;
                if gap > longest {
                    (longest, at) = (gap, w[0].t);
                }
            }
        }
    }
    (count, longest, at)
}

#[derive(Debug, Clone)]
pub struct FaultResult {
    pub id: usize,
    pub label: String,
    pub group: String,
    pub kind: &'static str,
    pub len_ms: u64,
    pub stagger_ms: u64,
    pub start_s: f64,
    pub active_before: Option<usize>,
    pub hits_active: bool,
    pub promotion_ms: Option<f64>,
    pub first_grant_new_ms: Option<f64>,
    /// Measured only at a clean heal (no other fault on).
    pub measured: bool,
    pub split_after_heal_ms: Option<f64>,
    pub one_active_ms: Option<f64>,
    /// From the heal to the start of the run in which every node answers
    /// and names the one active ((f) and (g) count from there).
    pub all_agree_ms: Option<f64>,
    pub one_active_from_first_heal_ms: Option<f64>,
    pub within_bound: bool,
    pub notes: Vec<String>,
}

/// A planned hand-back of the role, as the pollers saw it.
#[derive(Debug, Clone)]
pub struct HandBackResult {
    pub from: usize,
    pub to: usize,
    /// Seconds since the origin when its log line was read.
    pub at_s: f64,
    /// From the line to the first moment the node it went to is the one
    /// active all agree on; `None`: not within the bound.
    pub done_ms: Option<f64>,
    /// Inside its window: both nodes said active (ms on the 10 ms grid).
    pub two_serving_ms: f64,
    /// Inside its window: no node said active.
    pub no_active_ms: f64,
    /// Inside its window: one active that not every node named.
    pub disagree_ms: f64,
    /// Nodes other than the two that said active inside its window.
    pub third_active: Vec<usize>,
    /// Its window `[from, to)` on the harness clock, if it excuses (d)'s
    /// moments (done within the bound, no third active).
    pub window: Option<(u64, u64)>,
}

/// Each planned hand-back's window and figures (see the module docs).
pub fn hand_backs(
    points: &[Point],
    hbs: &[HandBack],
    origin: u64,
    bound_us: u64,
) -> Vec<HandBackResult> {
    hbs.iter()
        .map(|hb| {
            let open = hb.t.saturating_sub(HAND_BACK_SLACK_US);
            let done = points
                .iter()
                .filter(|p| p.t >= hb.t && p.t <= hb.t + bound_us)
                .find(|p| p.class == Class::One(hb.to))
                .map(|p| p.t);
            let close = done.unwrap_or(hb.t + bound_us);
            let (mut two, mut none, mut dis) = (0u64, 0u64, 0u64);
            let mut third = Vec::new();
            let pair = (1u32 << hb.from) | (1u32 << hb.to);
            for p in points.iter().filter(|p| p.t >= open && p.t < close) {
                match p.class {
                    Class::Split if p.actives == pair => two += GRID_US,
                    Class::NoActive => none += GRID_US,
                    Class::Disagree(_) => dis += GRID_US,
                    _ => {}
                }
                let others = p.actives & !pair;
                for i in 0..32 {
                    if others & (1 << i) != 0 && !third.contains(&i) {
                        third.push(i);
                    }
                }
            }
            third.sort_unstable();
            HandBackResult {
                from: hb.from,
                to: hb.to,
                at_s: secs(hb.t, origin),
                done_ms: done.map(|t| ms(t.saturating_sub(hb.t))),
                two_serving_ms: ms(two),
                no_active_ms: ms(none),
                disagree_ms: ms(dis),
                window: (done.is_some() && third.is_empty()).then_some((open, close)),
                third_active: third,
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
pub struct Overlap {
    pub key: usize,
    pub a: usize,
    pub b: usize,
    pub from: u64,
    pub to: u64,
    pub outside: bool,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub faults: Vec<FaultResult>,
    pub hand_backs: Vec<HandBackResult>,
    pub overlaps: Vec<Overlap>,
    pub overlaps_outside: usize,
    pub reversals_inside: usize,
    pub reversals_outside: Vec<String>,
    pub lost_inside: usize,
    pub lost_outside: Vec<String>,
    pub lost_ambiguous: usize,
    /// (f): indexes into `overlaps`.
    pub overlaps_agreed: Vec<usize>,
    /// (g)
    pub lost_after_agreement: Vec<String>,
    pub failures: Vec<String>,
    pub text: String,
    pub json: Value,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

fn ms(us: u64) -> f64 {
    (us as f64 / 1000.0 * 10.0).round() / 10.0
}

fn secs(us: u64, origin: u64) -> f64 {
    us.saturating_sub(origin) as f64 / 1e6
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.0}"))
}

/// Median / max of the values present, and how many are missing.
fn stat(values: &[Option<f64>]) -> String {
    let mut have: Vec<f64> = values.iter().flatten().copied().collect();
    let missing = values.len() - have.len();
    let max = have.iter().copied().fold(f64::NAN, f64::max);
    let med = median(&mut have);
    let mut s = match med {
        Some(m) => format!("{m:.0} / {max:.0}"),
        None => "-".into(),
    };
    if missing > 0 && !have.is_empty() {
        s += &format!(" ({missing} n/a)");
    }
    s
}

#[expect(clippy::too_many_lines)]
pub fn analyse(cfg: &Config, rec: &Record) -> Report {
    let settle = cfg.settle_ms * 1000;
    let windows: Vec<(u64, u64)> = rec
        .faults
        .iter()
        .map(|f| (f.t_start, f.t_heal + settle))
        .collect();
    let touches = |a: u64, b: u64| windows.iter().any(|&(s, e)| a <= e && b >= s);
    let points = timeline(&rec.samples, cfg.nodes, rec.origin, rec.end);
    let at = |t: u64| -> usize { (t.saturating_sub(rec.origin) / GRID_US) as usize };
    let mut failures = Vec::new();
    let hbs = hand_backs(
        &points,
        &rec.hand_backs,
        rec.origin,
        cfg.one_active_bound_ms() * 1000,
    );
    // A moment inside a planned hand-back's window is the hand-back's.
    let excused = |p: &Point| {
        hbs.iter()
            .filter_map(|h| h.window)
            .any(|(s, e)| p.t >= s && p.t < e)
    };

    // (d), (e): per fault.
    let mut results = Vec::new();
    for (k, f) in rec.faults.iter().enumerate() {
        let before = at(f.t_start)
            .saturating_sub(1)
            .min(points.len().saturating_sub(1));
        let active_before = points.get(before).and_then(|p| match p.class {
            Class::One(a) | Class::Disagree(a) => Some(a),
            _ => None,
        });
        let hits_active = active_before.is_some_and(|a| f.fault.kind.nodes().contains(&a));
        let horizon = rec
            .faults
            .iter()
            .filter(|g| g.t_start > f.t_heal)
            .map(|g| g.t_start)
            .min()
            .unwrap_or(rec.end);
        let promotion_ms = active_before.and_then(|a| {
            points[at(f.t_start).min(points.len())..]
                .iter()
                .take_while(|p| p.t < horizon)
                .find(|p| p.actives & !(1 << a) != 0)
                .map(|p| ms(p.t.saturating_sub(f.t_start)))
        });
        let first_grant_new_ms = active_before.and_then(|a| {
            rec.grants
                .iter()
                .filter(|g| g.t_recv >= f.t_start && g.t_recv < horizon && g.node != a)
                .map(|g| g.t_recv)
                .min()
                .map(|t| ms(t - f.t_start))
        });
        let overlapped = rec
            .faults
            .iter()
            .enumerate()
            .any(|(j, g)| j != k && g.t_start <= f.t_heal && f.t_heal < g.t_heal);
        let measured = !overlapped;
        let mut notes = f.notes.clone();
        let during: Vec<String> = rec
            .faults
            .iter()
            .enumerate()
            .filter(|&(j, g)| j != k && g.t_start <= f.t_heal && f.t_start <= g.t_heal)
            .map(|(j, _)| j.to_string())
            .collect();
        if !during.is_empty() {
            notes.insert(0, format!("overlaps fault {}", during.join(", ")));
        }
        for (h, hb) in hbs.iter().enumerate() {
            let t = rec.hand_backs[h].t;
            if t >= f.t_heal && t < horizon {
                notes.push(format!(
                    "hand-back {} {}->{} {:.0} ms after the heal ({})",
                    h,
                    hb.from,
                    hb.to,
                    ms(t - f.t_heal),
                    hb.done_ms
                        .map_or("not done within the bound".into(), |d| format!(
                            "one active again in {d:.0} ms"
                        ))
                ));
            }
        }
        let after: Vec<&Point> = points
            .iter()
            .filter(|p| p.t >= f.t_heal && p.t < horizon)
            .collect();
        let (mut split_after_heal_ms, mut one_active_ms, mut all_agree_ms) = (None, None, None);
        // From the heal to the start of the run, lasting to the horizon, in
        // which every point (not a hand-back's) satisfies `ok`.
        let run_from_heal =
            |ok: &dyn Fn(&Point) -> bool| match after.iter().rposition(|p| !ok(p) && !excused(p)) {
                None => Some(ms(after[0].t - f.t_heal)),
                Some(i) if i + 1 < after.len() => Some(ms(after[i + 1].t - f.t_heal)),
                Some(_) => None,
            };
        if measured && !after.is_empty() {
            let last_split = after
                .iter()
                .rposition(|p| p.class == Class::Split && !excused(p));
            split_after_heal_ms = Some(match last_split {
                Some(i) => ms(after[i].t + GRID_US - f.t_heal),
                None => 0.0,
            });
            one_active_ms = run_from_heal(&|p| matches!(p.class, Class::One(_)));
            all_agree_ms = run_from_heal(&|p| p.all_agree(cfg.nodes));
            match (one_active_ms, all_agree_ms) {
                (Some(one), Some(all)) if all >= one + ALL_AGREE_NOTE_MS => notes.push(format!(
                    "every node answering and naming it {all:.0} ms after the heal"
                )),
                (Some(_), None) => notes.push(
                    "not every node answered and named it before the next fault: (f) and (g) \
                     do not apply"
                        .into(),
                ),
                _ => {}
            }
        }
        let one_active_from_first_heal_ms = (f.fault.stagger_ms > 0)
            .then(|| one_active_ms.map(|v| v + ms(f.t_heal - f.t_heal_first)))
            .flatten();
        let bound = cfg.one_active_bound_ms() as f64;
        let within_bound = !measured || one_active_ms.is_some_and(|v| v <= bound);
        if !within_bound {
            failures.push(format!(
                "(d) fault {k} ({}): one active {} after the heal, bound {bound:.0} ms",
                f.fault.describe(),
                one_active_ms.map_or("never (before the next fault)".into(), |v| format!(
                    "{v:.0} ms"
                ))
            ));
        }
        let stag = if f.fault.stagger_ms > 0 {
            " staggered"
        } else {
            ""
        };
        let role = if hits_active { "active" } else { "standby" };
        results.push(FaultResult {
            id: k,
            label: f.fault.describe(),
            group: format!("{}{stag} [{role}]", f.fault.kind.name()),
            kind: f.fault.kind.name(),
            len_ms: f.fault.len_ms,
            stagger_ms: f.fault.stagger_ms,
            start_s: secs(f.t_start, rec.origin),
            active_before,
            hits_active,
            promotion_ms,
            first_grant_new_ms,
            measured,
            split_after_heal_ms,
            one_active_ms,
            all_agree_ms,
            one_active_from_first_heal_ms,
            within_bound,
            notes,
        });
    }

    // The moment each network fault healed into one active every node
    // answers and names ((f), (g)), and the
    // windows of the faults that may lose grants (a process gone or stopped).
    let crash_kind = |k: &str| matches!(k, "kill9-restart" | "stop-cont" | "term-restart");
    let agreed: Vec<Option<(u64, u64)>> = rec
        .faults
        .iter()
        .zip(&results)
        .map(|(f, r)| {
            let t = r
                .all_agree_ms
                .filter(|_| r.measured && !crash_kind(r.kind))?;
            Some((f.t_start, f.t_heal + (t * 1000.0) as u64))
        })
        .collect();
    let crash_windows: Vec<(u64, u64)> = rec
        .faults
        .iter()
        .zip(&windows)
        .filter(|(f, _)| crash_kind(f.fault.kind.name()))
        .map(|(_, &w)| w)
        .collect();
    let crash_touches = |a: u64, b: u64| crash_windows.iter().any(|&(s, e)| a <= e && b >= s);
    // After agreement: `t` is after some network fault's agreed moment and
    // inside its window, and no crash window touches `from..t`.
    let after_agreement = |from: u64, t: u64| {
        !crash_touches(from, t)
            && agreed
                .iter()
                .zip(&windows)
                .any(|(a, &(_, end))| a.is_some_and(|(_, at)| at <= t && t <= end))
    };

    // (a) overlaps.
    let mut by_key: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, g) in rec.grants.iter().enumerate() {
        by_key.entry(g.key).or_default().push(i);
    }
    let mut overlaps = Vec::new();
    for (&key, idx) in &by_key {
        let mut v = idx.clone();
        v.sort_by_key(|&i| rec.grants[i].held());
        for (n, &i) in v.iter().enumerate() {
            let (s1, e1) = rec.grants[i].held();
            for &j in &v[n + 1..] {
                let (s2, e2) = rec.grants[j].held();
                if s2 >= e1 {
                    break;
                }
                let (from, to) = (s2.max(s1), e1.min(e2));
                if to > from {
                    overlaps.push(Overlap {
                        key,
                        a: i,
                        b: j,
                        from,
                        to,
                        outside: !touches(from, to),
                    });
                }
            }
        }
    }
    let overlaps_outside = overlaps.iter().filter(|o| o.outside).count();
    if overlaps_outside > 0 {
        failures.push(format!(
            "(a) {overlaps_outside} overlapping holders outside fault windows"
        ));
    }
    let overlaps_agreed: Vec<usize> = overlaps
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            let (x, y) = (&rec.grants[o.a], &rec.grants[o.b]);
            let (older, later) = if x.t_sent <= y.t_sent { (x, y) } else { (y, x) };
            !o.outside && after_agreement(older.t_sent, later.t_sent)
        })
        .map(|(i, _)| i)
        .collect();
    if !overlaps_agreed.is_empty() {
        failures.push(format!(
            "(f) {} overlapping holders whose later grant came after every node named one active",
            overlaps_agreed.len()
        ));
    }

    // (b) token order per key.
    let (mut reversals_inside, mut reversals_outside) = (0, Vec::new());
    for (&key, idx) in &by_key {
        let mut v = idx.clone();
        v.sort_by_key(|&i| rec.grants[i].t_recv);
        for w in v.windows(2) {
            let (p, q) = (&rec.grants[w[0]], &rec.grants[w[1]]);
            if q.token <= p.token {
                if touches(q.t_recv, q.t_recv) {
                    reversals_inside += 1;
                } else {
                    reversals_outside.push(format!(
                        "key {key}: token {} (node {}, read at {:.3} s) after {} (node {}, {:.3} s)",
                        q.token,
                        q.node,
                        secs(q.t_recv, rec.origin),
                        p.token,
                        p.node,
                        secs(p.t_recv, rec.origin)
                    ));
                }
            }
        }
    }
    if !reversals_outside.is_empty() {
        failures.push(format!(
            "(b) {} token reversals outside fault windows",
            reversals_outside.len()
        ));
    }

    // (c) lost grants.
    let (mut lost_inside, mut lost_outside, mut lost_ambiguous) = (0, Vec::new(), 0);
    let mut lost_after_agreement = Vec::new();
    for g in &rec.grants {
        let first_end = g.t_sent + g.lease_ms * 1000;
        let checks = [
            (g.renew.as_ref(), first_end, "N"),
            (g.release.as_ref(), g.lease_end(), "R"),
        ];
        for (op, end, what) in checks {
            let Some(op) = op else { continue };
            let (Some(false), Some(t_recv)) = (op.ok, op.t_recv) else {
                continue;
            };
            if t_recv >= end {
                if op.t_sent < end {
                    lost_ambiguous += 1;
                }
                continue;
            }
            if touches(g.t_sent, t_recv) {
                lost_inside += 1;
                if after_agreement(g.t_sent, op.t_sent) {
                    lost_after_agreement.push(format!(
                        "key {} token {} granted by node {} at {:.3} s: {what} sent at {:.3} s answered 0 by node {}",
                        g.key,
                        g.token,
                        g.node,
                        secs(g.t_recv, rec.origin),
                        secs(op.t_sent, rec.origin),
                        op.node.map_or("?".into(), |n| n.to_string()),
                    ));
                }
            } else {
                lost_outside.push(format!(
                    "key {} token {} granted by node {} at {:.3} s (lease {} ms): {what} answered 0 by node {} at {:.3} s, {:.0} ms before the lease could end",
                    g.key,
                    g.token,
                    g.node,
                    secs(g.t_recv, rec.origin),
                    g.lease_ms,
                    op.node.map_or("?".into(), |n| n.to_string()),
                    secs(t_recv, rec.origin),
                    ms(end - t_recv)
                ));
            }
        }
    }
    if !lost_outside.is_empty() {
        failures.push(format!(
            "(c) {} grants lost outside fault windows",
            lost_outside.len()
        ));
    }
    if !lost_after_agreement.is_empty() {
        failures.push(format!(
            "(g) {} grants lost outside crash windows, asked after every node named one active",
            lost_after_agreement.len()
        ));
    }
    for c in &rec.crashes {
        failures.push(format!("a node exited by itself: {c}"));
    }
    let errors: Vec<&String> = rec.stats.iter().flat_map(|s| &s.errors).collect();
    if !errors.is_empty() {
        failures.push(format!(
            "{} unexpected answers or client errors (first: {})",
            errors.len(),
            errors[0]
        ));
    }

    let mut report = Report {
        faults: results,
        hand_backs: hbs,
        overlaps,
        overlaps_outside,
        reversals_inside,
        reversals_outside,
        lost_inside,
        lost_outside,
        lost_ambiguous,
        overlaps_agreed,
        lost_after_agreement,
        failures,
        text: String::new(),
        json: Value::Null,
    };
    report.text = render(cfg, rec, &report);
    report.json = to_json(cfg, rec, &report);
    report
}

fn totals(stats: &[ClientStats]) -> ClientStats {
    let mut t = ClientStats::default();
    for s in stats {
        t.acquires += s.acquires;
        t.granted += s.granted;
        t.timed_out += s.timed_out;
        t.moved += s.moved;
        t.moved_none += s.moved_none;
        t.conn_failures += s.conn_failures;
        t.gave_up += s.gave_up;
        t.errors.extend(s.errors.iter().cloned());
    }
    t
}

fn describe_grant(g: &GrantRec, origin: u64) -> String {
    let (s, e) = g.held();
    format!(
        "client {} token {} from node {} held {:.3}-{:.3} s",
        g.client,
        g.token,
        g.node,
        secs(s, origin),
        secs(e, origin)
    )
}

#[expect(clippy::too_many_lines)]
fn render(cfg: &Config, rec: &Record, r: &Report) -> String {
    let mut o = String::new();
    let span = secs(rec.end, rec.origin);
    let _ = writeln!(
        o,
        "{} nodes (--io {}, --heartbeat-ms {}, --peer-timeout-ms {}), {} clients on {} keys, leases {}-{} ms, waits {} ms; {} faults over {span:.0} s; settle margin after each heal {} ms; one-active bound {} ms.\n",
        cfg.nodes,
        cfg.io,
        cfg.heartbeat_ms,
        cfg.peer_timeout_ms,
        cfg.clients,
        cfg.keys,
        cfg.lease_min_ms,
        cfg.lease_max_ms,
        cfg.wait_ms,
        rec.faults.len(),
        cfg.settle_ms,
        cfg.one_active_bound_ms()
    );
    let _ = writeln!(o, "### Faults\n");
    let _ = writeln!(
        o,
        "Times in ms. promotion: fault start -> another node says active; first grant: -> first grant read from such a node; split after heal: last heal -> two actives no longer seen; one active: last heal -> one active that all agree on, for good.\n"
    );
    let _ = writeln!(
        o,
        "| # | start s | fault | active before | promotion | first grant by new | split after heal | one active | notes |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
    for f in &r.faults {
        let mut notes = f.notes.join("; ");
        if !f.measured {
            notes = format!("heal during another fault: not measured. {notes}");
        } else if !f.within_bound {
            notes = format!("**over the bound**. {notes}");
        }
        if let Some(v) = f.one_active_from_first_heal_ms {
            notes = format!("{v:.0} ms from the first heal. {notes}");
        }
        let _ = writeln!(
            o,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
            f.id,
            f.start_s,
            f.label,
            f.active_before.map_or("-".into(), |a| a.to_string()),
            fmt_opt(f.promotion_ms),
            fmt_opt(f.first_grant_new_ms),
            fmt_opt(f.split_after_heal_ms),
            f.one_active_ms.map_or(
                if f.measured {
                    "never".into()
                } else {
                    "-".into()
                },
                |v| format!("{v:.0}")
            ),
            notes.trim()
        );
    }
    render_hand_backs(&mut o, cfg, r);
    type GroupBy = Box<dyn Fn(&FaultResult) -> String>;
    let groups: Vec<(&str, GroupBy)> = vec![
        (
            "fault kind [whose role it hit]",
            Box::new(|f: &FaultResult| f.group.clone()),
        ),
        (
            "fault kind, length and role hit",
            Box::new(|f: &FaultResult| {
                let role = if f.hits_active { "active" } else { "standby" };
                format!("{} {:>4.1} s [{role}]", f.kind, f.len_ms as f64 / 1000.0)
            }),
        ),
    ];
    for (title, key) in groups {
        let _ = writeln!(o, "\n### By {title}\n");
        let _ = writeln!(
            o,
            "median / max in ms | n | promotion | first grant by new | split after heal | one active |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|");
        let mut map: BTreeMap<String, Vec<&FaultResult>> = BTreeMap::new();
        for f in &r.faults {
            map.entry(key(f)).or_default().push(f);
        }
        for (g, fs) in map {
            let col = |get: &dyn Fn(&FaultResult) -> Option<f64>| -> String {
                stat(&fs.iter().map(|f| get(f)).collect::<Vec<_>>())
            };
            let _ = writeln!(
                o,
                "| {g} | {} | {} | {} | {} | {} |",
                fs.len(),
                col(&|f| f.promotion_ms),
                col(&|f| f.first_grant_new_ms),
                col(&|f| if f.measured {
                    f.split_after_heal_ms
                } else {
                    None
                }),
                col(&|f| if f.measured { f.one_active_ms } else { None }),
            );
        }
    }

    let t = totals(&rec.stats);
    let released: Vec<_> = rec
        .grants
        .iter()
        .filter_map(|g| g.release.as_ref())
        .collect();
    let rel_ok = released.iter().filter(|r| r.ok == Some(true)).count();
    let rel_zero = released.iter().filter(|r| r.ok == Some(false)).count();
    let rel_none = released.iter().filter(|r| r.ok.is_none()).count();
    let mut per_node = vec![0usize; cfg.nodes];
    for g in &rec.grants {
        per_node[g.node] += 1;
    }
    let _ = writeln!(o, "\n### Clients\n");
    let _ = writeln!(
        o,
        "{} acquires: {} granted ({} per node: {:?}), {} timed out, {} given up; {} M followed, {} M - (or M loops) backed off, {} connection failures; releases: {} answered 1, {} answered 0, {} unanswered.",
        t.acquires,
        t.granted,
        rec.grants.len(),
        per_node,
        t.timed_out,
        t.gave_up,
        t.moved,
        t.moved_none,
        t.conn_failures,
        rel_ok,
        rel_zero,
        rel_none
    );

    let _ = writeln!(o, "\n### Safety checks\n");
    let inside = r.overlaps.len() - r.overlaps_outside;
    let max_inside = r
        .overlaps
        .iter()
        .filter(|x| !x.outside)
        .map(|x| x.to - x.from)
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        o,
        "- (a) overlapping holders outside fault windows: **{}** (target 0); inside windows: {inside} (longest {:.0} ms)",
        r.overlaps_outside,
        ms(max_inside)
    );
    for x in r.overlaps.iter().filter(|x| x.outside).take(10) {
        let _ = writeln!(
            o,
            "  - key {}: {:.3}-{:.3} s: {} / {}",
            x.key,
            secs(x.from, rec.origin),
            secs(x.to, rec.origin),
            describe_grant(&rec.grants[x.a], rec.origin),
            describe_grant(&rec.grants[x.b], rec.origin)
        );
    }
    let _ = writeln!(
        o,
        "- (b) token reversals per key outside fault windows: **{}**; inside windows: {}",
        r.reversals_outside.len(),
        r.reversals_inside
    );
    for x in r.reversals_outside.iter().take(10) {
        let _ = writeln!(o, "  - {x}");
    }
    let _ = writeln!(
        o,
        "- (c) grants lost (R/N answered 0 before the lease could end) outside fault windows: **{}**; inside windows: {}; ambiguous (0 answered after the earliest lease end): {}",
        r.lost_outside.len(),
        r.lost_inside,
        r.lost_ambiguous
    );
    for x in r.lost_outside.iter().take(10) {
        let _ = writeln!(o, "  - {x}");
    }
    let _ = writeln!(
        o,
        "- (f) overlapping holders whose later grant was asked for after every node answered naming one active (no crash, stop or SIGTERM between): **{}** (target 0)",
        r.overlaps_agreed.len()
    );
    for &i in r.overlaps_agreed.iter().take(10) {
        let x = &r.overlaps[i];
        let _ = writeln!(
            o,
            "  - key {}: {:.3}-{:.3} s: {} / {}",
            x.key,
            secs(x.from, rec.origin),
            secs(x.to, rec.origin),
            describe_grant(&rec.grants[x.a], rec.origin),
            describe_grant(&rec.grants[x.b], rec.origin)
        );
    }
    let _ = writeln!(
        o,
        "- (g) grants lost outside crash windows (R/N answered 0, asked after every node answered naming one active): **{}** (target 0)",
        r.lost_after_agreement.len()
    );
    for x in r.lost_after_agreement.iter().take(10) {
        let _ = writeln!(o, "  - {x}");
    }
    let measured: Vec<&FaultResult> = r.faults.iter().filter(|f| f.measured).collect();
    let over = measured.iter().filter(|f| !f.within_bound).count();
    let _ = writeln!(
        o,
        "- (d) heals back to one active within {} ms: {} of {} measured; planned hand-backs (not split brains, measured apart above): {}, of which {} excused",
        cfg.one_active_bound_ms(),
        measured.len() - over,
        measured.len(),
        r.hand_backs.len(),
        r.hand_backs.iter().filter(|h| h.window.is_some()).count()
    );
    let (gaps, longest, when) = poll_gaps(&rec.samples, cfg.nodes);
    let _ = writeln!(
        o,
        "- status polls answered more than {} ms apart (a slow node, or the harness not running on a busy machine): {gaps}{}",
        POLL_GAP_US / 1000,
        if gaps > 0 {
            format!(
                ", longest {:.0} ms at {:.3} s",
                ms(longest),
                secs(when, rec.origin)
            )
        } else {
            String::new()
        }
    );
    if !rec.crashes.is_empty() {
        let _ = writeln!(o, "- nodes that exited by themselves: {:?}", rec.crashes);
    }
    if !t.errors.is_empty() {
        let _ = writeln!(
            o,
            "- unexpected answers: {:?}",
            &t.errors[..t.errors.len().min(5)]
        );
    }
    let _ = writeln!(
        o,
        "\n**{}**",
        if r.failures.is_empty() {
            "PASS".to_string()
        } else {
            format!("FAIL: {}", r.failures.join("; "))
        }
    );
    o
}

/// The planned hand-backs: a table, and their figures in one line.
fn render_hand_backs(o: &mut String, cfg: &Config, r: &Report) {
    let _ = writeln!(o, "\n### Planned hand-backs\n");
    if r.hand_backs.is_empty() {
        let _ = writeln!(o, "None.");
        return;
    }
    let _ = writeln!(
        o,
        "A lower-priority active handing the role back to the higher-priority node after the failback delay (its log line). Times in ms, from 100 ms before the line was read to the first moment the node it went to is the one active all agree on (done: from the line); two serving / no active / disagree: time inside that window with both nodes active, none, or one not every node names. A hand-back counts for (d) as \"one active\" only if it is done within {} ms with no third node active.\n",
        cfg.one_active_bound_ms()
    );
    let _ = writeln!(
        o,
        "| # | at s | from -> to | done | two serving | no active | disagree | notes |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|");
    for (i, h) in r.hand_backs.iter().enumerate() {
        let mut notes = Vec::new();
        if h.done_ms.is_none() {
            notes.push("**no one active within the bound**: counted by (d)".to_string());
        }
        if !h.third_active.is_empty() {
            notes.push(format!(
                "**node {:?} active inside it**: counted by (d)",
                h.third_active
            ));
        }
        let _ = writeln!(
            o,
            "| {i} | {:.1} | {} -> {} | {} | {:.0} | {:.0} | {:.0} | {} |",
            h.at_s,
            h.from,
            h.to,
            fmt_opt(h.done_ms),
            h.two_serving_ms,
            h.no_active_ms,
            h.disagree_ms,
            notes.join("; ")
        );
    }
    let col = |get: &dyn Fn(&HandBackResult) -> Option<f64>| -> String {
        stat(&r.hand_backs.iter().map(get).collect::<Vec<_>>())
    };
    let _ = writeln!(
        o,
        "\nmedian / max of {}: done {} ms; two serving {} ms; no active {} ms; disagree {} ms.",
        r.hand_backs.len(),
        col(&|h| h.done_ms),
        col(&|h| Some(h.two_serving_ms)),
        col(&|h| Some(h.no_active_ms)),
        col(&|h| Some(h.disagree_ms)),
    );
}

fn to_json(cfg: &Config, rec: &Record, r: &Report) -> Value {
    let faults: Vec<Value> = r
        .faults
        .iter()
        .map(|f| {
            json!({
                "id": f.id, "fault": f.label, "group": f.group, "kind": f.kind,
                "len_ms": f.len_ms, "stagger_ms": f.stagger_ms, "start_s": f.start_s,
                "active_before": f.active_before, "hits_active": f.hits_active,
                "promotion_ms": f.promotion_ms, "first_grant_new_ms": f.first_grant_new_ms,
                "measured": f.measured, "split_after_heal_ms": f.split_after_heal_ms,
                "one_active_ms": f.one_active_ms,
                "all_agree_ms": f.all_agree_ms,
                "one_active_from_first_heal_ms": f.one_active_from_first_heal_ms,
                "within_bound": f.within_bound, "notes": f.notes,
            })
        })
        .collect();
    let hand_backs: Vec<Value> = r
        .hand_backs
        .iter()
        .map(|h| {
            json!({
                "from": h.from, "to": h.to, "at_s": h.at_s, "done_ms": h.done_ms,
                "two_serving_ms": h.two_serving_ms, "no_active_ms": h.no_active_ms,
                "disagree_ms": h.disagree_ms, "third_active": h.third_active,
                "excused": h.window.is_some(),
            })
        })
        .collect();
    let t = totals(&rec.stats);
    let (count, longest, at) = poll_gaps(&rec.samples, cfg.nodes);
    let gaps = json!({"count": count, "longest_ms": ms(longest), "at_s": secs(at, rec.origin)});
    json!({
        "config": {
            "io": cfg.io, "seed": cfg.seed, "nodes": cfg.nodes, "clients": cfg.clients,
            "keys": cfg.keys, "heartbeat_ms": cfg.heartbeat_ms,
            "peer_timeout_ms": cfg.peer_timeout_ms, "lease_ms": [cfg.lease_min_ms, cfg.lease_max_ms],
            "wait_ms": cfg.wait_ms, "settle_ms": cfg.settle_ms,
            "one_active_bound_ms": cfg.one_active_bound_ms(), "total_ms": cfg.total_ms,
        },
        "faults": faults,
        "hand_backs": hand_backs,
        "overlaps_outside": r.overlaps_outside,
        "overlaps_inside": r.overlaps.len() - r.overlaps_outside,
        "reversals_outside": r.reversals_outside,
        "reversals_inside": r.reversals_inside,
        "lost_outside": r.lost_outside,
        "lost_inside": r.lost_inside,
        "lost_ambiguous": r.lost_ambiguous,
        "overlaps_after_agreement": r.overlaps_agreed.len(),
        "lost_after_agreement": r.lost_after_agreement,
        "clients": {
            "acquires": t.acquires, "granted": t.granted, "timed_out": t.timed_out,
            "gave_up": t.gave_up, "moved": t.moved, "moved_none": t.moved_none,
            "conn_failures": t.conn_failures, "errors": t.errors,
        },
        "poll_gaps": gaps,
        "crashes": rec.crashes,
        "failures": r.failures,
        "passed": r.failures.is_empty(),
    })
}

/// Writes the raw records (grants and status samples) as CSV into `dir`.
pub fn write_raw(dir: &std::path::Path, rec: &Record) -> std::io::Result<()> {
    let mut g = String::from(
        "client,key,token,node,t_sent_s,t_recv_s,lease_ms,held_from_s,held_to_s,renew_ok,renew_lease_ms,release_node,release_ok,release_sent_s,release_recv_s\n",
    );
    let o = rec.origin;
    let opt_s = |t: Option<u64>| t.map_or(String::new(), |t| format!("{:.6}", secs(t, o)));
    for x in &rec.grants {
        let (hf, ht) = x.held();
        let (rn_ok, rn_lease) = match &x.renew {
            Some(r) => (format!("{:?}", r.ok), r.lease_ms.to_string()),
            None => (String::new(), String::new()),
        };
        let (rl_node, rl_ok, rl_sent, rl_recv) = match &x.release {
            Some(r) => (
                r.node.map_or(String::new(), |n| n.to_string()),
                format!("{:?}", r.ok),
                format!("{:.6}", secs(r.t_sent, o)),
                opt_s(r.t_recv),
            ),
            None => Default::default(),
        };
        let _ = writeln!(
            g,
            "{},{},{},{},{:.6},{:.6},{},{:.6},{:.6},{rn_ok},{rn_lease},{rl_node},{rl_ok},{rl_sent},{rl_recv}",
            x.client,
            x.key,
            x.token,
            x.node,
            secs(x.t_sent, o),
            secs(x.t_recv, o),
            x.lease_ms,
            secs(hf, o),
            secs(ht, o)
        );
    }
    std::fs::write(dir.join("grants.csv"), g)?;
    let mut s = String::from("t_s,node,answered,active,names,token\n");
    let mut samples: Vec<&Sample> = rec.samples.iter().collect();
    samples.sort_by_key(|x| x.t);
    for x in samples {
        match x.status {
            Some((active, named, token)) => {
                let _ = writeln!(
                    s,
                    "{:.6},{},1,{},{},{token}",
                    secs(x.t, o),
                    x.node,
                    active as u8,
                    named.map_or("-".into(), |n| n.to_string())
                );
            }
            None => {
                let _ = writeln!(s, "{:.6},{},0,,,", secs(x.t, o), x.node);
            }
        }
    }
    std::fs::write(dir.join("status.csv"), s)
}
