//! The address book: where each connection comes from, for log lines and
//! for the holder of its grants.

use std::net::SocketAddr;

use super::Node;
use crate::engine::ConnId;

impl Node {
    /// Remembers where `conn` comes from, for the log lines about it and
    /// for the holder of its grants.
    pub fn set_remote(&mut self, conn: ConnId, remote: SocketAddr) {
        let i = conn.index();
        if self.remotes.len() <= i {
            self.remotes.resize(i + 1, None);
        }
        self.remotes[i] = Some(remote);
        // What `W` and `Q` name as the holder of its grants.
        self.engine.set_remote(conn, remote);
    }

    pub(super) fn remote(&self, conn: ConnId) -> String {
        match self.remotes.get(conn.index()).copied().flatten() {
            Some(addr) => addr.to_string(),
            None => format!("connection {conn}"),
        }
    }
}
