//! A node: the engine plus, with peers, the cluster state machine. This is
//! what the I/O loops drive; it is sans-I/O like both of its parts.
//!
//! Driving order, once per loop turn: [`Node::tick`]; then for each
//! connection's input [`crate::io::Session::feed`] (which calls
//! [`Node::handle_request`] and [`Node::handle_peer_line`]); then
//! [`Node::take_dirty`] and [`Node::output_mut`] to send; then
//! [`Node::take_dials`] to start dials; then sleep until
//! [`Node::next_deadline`].

use crate::cluster::{Cluster, ClusterConfig, Role, wire};
use crate::engine::{ConnId, Engine, Now, Refusal};
use crate::proto::Request;

/// How the node was configured at start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The address clients and peers know this node by.
    pub advertise: String,
    /// With other nodes: the cluster. `None`: a cluster of one.
    pub cluster: Option<ClusterConfig>,
    /// `--max-locks`: the most live locks the engine holds.
    pub max_locks: u32,
}

pub struct Node {
    engine: Engine,
    cluster: Option<Cluster>,
}

impl Node {
    pub fn new(now: Now, config: NodeConfig) -> Node {
        let mut engine = Engine::with_max_locks(now, &config.advertise, config.max_locks);
        let cluster = config
            .cluster
            .map(|cfg| Cluster::new(cfg, now, &mut engine));
        Node { engine, cluster }
    }

    /// The engine, for inspection (tests, status).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        match &self.cluster {
            Some(c) => c.role(),
            None if self.engine.is_active() => Role::Active,
            None => Role::Standby { following: None },
        }
    }

    pub fn open(&mut self, conn: ConnId) {
        self.engine.open(conn);
    }

    /// Forgets a connection (client or peer link).
    pub fn close(&mut self, now: Now, conn: ConnId) {
        self.engine.close(conn);
        if let Some(cluster) = &mut self.cluster {
            cluster.on_close(now, conn, &mut self.engine);
        }
    }

    pub fn tick(&mut self, now: Now) {
        self.engine.tick(now);
        if let Some(cluster) = &mut self.cluster {
            cluster.tick(now, &mut self.engine);
        }
    }

    /// A client request. On a peer link it breaks the link.
    pub fn handle_request(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
    ) -> Result<(), Refusal> {
        self.engine.handle(now, conn, request)
    }

    /// A peer line (`P ...`). `Err` breaks the connection with that reason.
    pub fn handle_peer_line(&mut self, now: Now, conn: ConnId, line: &[u8]) -> Result<(), String> {
        let Some(cluster) = &mut self.cluster else {
            return Err("peer message to a node started without --peers".into());
        };
        let result =
            wire::parse(line).and_then(|msg| cluster.on_message(now, conn, msg, &mut self.engine));
        if let Err(reason) = &result {
            // Loud: between nodes this means a misconfigured cluster.
            eprintln!("ringlock: peer link broken: {reason}");
        }
        result
    }

    /// Collects the connections with output. With peers, this turn's
    /// replication is written first, so that it goes out in the same send.
    pub fn take_dirty(&mut self, now: Now, into: &mut Vec<ConnId>) {
        if let Some(cluster) = &mut self.cluster {
            cluster.flush_replication(now, &mut self.engine);
        }
        self.engine.take_dirty(into);
    }

    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        self.engine.output_mut(conn)
    }

    pub fn next_deadline(&self) -> Option<u64> {
        let engine = self.engine.next_deadline();
        let cluster = self.cluster.as_ref().map(Cluster::next_deadline);
        engine.into_iter().chain(cluster).min()
    }

    /// Peers to dial now, `(index, address)`.
    pub fn take_dials(&mut self, now: Now, into: &mut Vec<(usize, String)>) {
        if let Some(cluster) = &mut self.cluster {
            cluster.take_dials(now, into);
        }
    }

    pub fn dial_failed(&mut self, now: Now, peer: usize) {
        if let Some(cluster) = &mut self.cluster {
            cluster.dial_failed(peer, now);
        }
    }

    /// A dial to `peer` succeeded as connection `conn` (not yet opened).
    pub fn outbound_open(&mut self, conn: ConnId, peer: usize) {
        self.engine.open(conn);
        if let Some(cluster) = &mut self.cluster {
            cluster.outbound_open(conn, peer, &mut self.engine);
        }
    }

    /// SIGINT/SIGTERM: an active node with a live peer hands over to it;
    /// then every waiting acquire is answered `M` naming the successor (`-`
    /// without one). Returns the successor's address, if any.
    pub fn leave(&mut self, now: Now) -> Option<String> {
        let successor = self.cluster.as_mut().and_then(|c| {
            let to = c.leave(now, &mut self.engine)?;
            Some(c.peer_addr(to).to_string())
        });
        self.engine.step_down(successor.as_deref());
        if let Some(cluster) = &mut self.cluster {
            // The hand-off and the last deltas go out with this turn's sends.
            cluster.flush_replication(now, &mut self.engine);
        }
        successor
    }
}
