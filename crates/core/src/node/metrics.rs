//! Publishing the node's counters and gauges to the metrics listener.

use super::Node;
use crate::cluster::Role;
use crate::engine::Now;
use crate::stats::{Follower, PUBLISH_EVERY_MS, Snapshot};

/// Publishing the counters to the metrics listener's thread.
pub(super) struct Publish {
    next_ms: u64,
    /// [`Node::activity`] when last published: nothing to publish while it
    /// has not moved (a cluster publishes every time: its heartbeats wake
    /// the loop anyway, and its gauges move without requests).
    activity: u64,
    published: bool,
}

impl Node {
    /// Publishes the counters from now on, at most every
    /// [`PUBLISH_EVERY_MS`] and only when something moved: a snapshot for
    /// the loop to hand to the metrics listener ([`Node::take_snapshot`]).
    pub fn publish_metrics(&mut self) {
        self.publish = Some(Publish {
            next_ms: 0,
            activity: 0,
            published: false,
        });
    }

    /// A sum that moves whenever a published number may have: requests,
    /// timers, connections.
    fn activity(&self) -> u64 {
        let e = self.engine.stats();
        let n = &self.stats;
        e.granted_now
            .wrapping_add(e.wait_ms.count())
            .wrapping_add(e.timed_out)
            .wrapping_add(e.redirected)
            .wrapping_add(e.withdrawn)
            .wrapping_add(e.hold.count())
            .wrapping_add(e.release_stale)
            .wrapping_add(e.renewed)
            .wrapping_add(e.renew_stale)
            .wrapping_add(e.release_not_holder)
            .wrapping_add(e.renew_not_holder)
            .wrapping_add(e.status)
            .wrapping_add(e.lease_expiries)
            .wrapping_add(n.conns_opened)
            .wrapping_add(n.conns_closed)
            .wrapping_add(n.conns_refused)
            .wrapping_add(n.conns_failed)
            .wrapping_add(n.requests_refused)
            .wrapping_add(n.protocol_errors)
    }

    /// Whether a publish is owed: something moved since the last one.
    pub(super) fn publish_owed(&self) -> Option<u64> {
        let p = self.publish.as_ref()?;
        let owed = !p.published || self.cluster.is_some() || p.activity != self.activity();
        owed.then_some(p.next_ms)
    }

    /// The snapshot published since the last call, if any: the loop hands
    /// it to the metrics listener at the end of its turn.
    pub fn take_snapshot(&mut self) -> Option<Snapshot> {
        self.snapshot.take()
    }

    /// The numbers of the moment, as the metrics listener serves them.
    pub fn snapshot(&self) -> Snapshot {
        let engine = &self.engine;
        let cluster = self.cluster.as_ref();
        let followers = cluster
            .map(|c| {
                c.followers()
                    .map(|(addr, conn, stats)| Follower {
                        addr: addr.to_string(),
                        queued_bytes: self.outbox.len(conn) as u64,
                        stats: *stats,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let active = self.role() == Role::Active;
        Snapshot {
            published: true,
            engine: *engine.stats(),
            node: self.stats,
            cluster: cluster.map(|c| *c.stats()).unwrap_or_default(),
            clustered: cluster.is_some(),
            active,
            ready: match cluster {
                Some(c) => c.is_ready(),
                None => active,
            },
            leaving: cluster.is_some_and(|c| c.is_leaving()) || (cluster.is_none() && !active),
            published_at: None,
            // A clustered loop turns at least every heartbeat and publishes
            // every turn (at most every PUBLISH_EVERY_MS): silence past two
            // peer timeouts means it stopped, and its peers took over.
            stale_after: cluster.map(|c| {
                std::time::Duration::from_millis(2 * c.handshake_timeout_ms() + PUBLISH_EVERY_MS)
            }),
            highest_token: engine.highest_token(),
            locks: engine.lock_count() as u64,
            waiters: engine.waiter_count() as u64,
            shared_held: engine.shared_count() as u64,
            permits_held: engine.permit_count() as u64,
            peers_up: cluster.map_or(0, |c| c.peers_up() as u64),
            followers,
        }
    }

    pub(super) fn publish(&mut self, now: Now) {
        let snapshot = self.snapshot();
        let activity = self.activity();
        if let Some(p) = &mut self.publish {
            self.snapshot = Some(snapshot);
            p.next_ms = now.ms + PUBLISH_EVERY_MS;
            p.activity = activity;
            p.published = true;
        }
    }
}
