//! The engine's invariants, checked by tests, the simulator, the fuzzer and
//! every loop turn of a debug build.

use super::{ConnId, Engine};

impl Engine {
    /// What [`Engine::check_invariants`] visits: locks, waiters and
    /// connection slots.
    #[cfg(debug_assertions)]
    pub(crate) fn walk_len(&self) -> usize {
        self.table.len() + self.table.waiter_count() + self.conns.len()
    }

    /// Corrupts the table on purpose: a free lock left in it, which
    /// [`Engine::check_invariants`] finds ("idle lock ... kept"). Only for
    /// the test that proves the walkers run in a server process.
    #[cfg(debug_assertions)]
    pub(crate) fn break_invariant(&mut self) {
        self.table.find_or_insert(b"broken-on-purpose");
    }

    /// Checks the table's lists and the engine's bookkeeping: tests, the
    /// simulator, the fuzzer, and every loop turn of a debug build (the
    /// node runs it after each turn, sampled for a large table).
    pub fn check_invariants(&self) {
        self.table.check_invariants();
        let mut refs = std::collections::HashMap::new();
        for (c, conn) in self.conns.iter().enumerate() {
            if !conn.open {
                assert_eq!(self.table.conn_len(ConnId::from_index(c)), 0);
                assert!(conn.holder.is_none() && conn.owner.is_none() && conn.addr.is_none());
                assert!(
                    self.access.get(c).is_none_or(Option::is_none),
                    "a closed connection kept its identity"
                );
            }
            if let Some(h) = conn.holder {
                *refs.entry(h).or_insert(0) += 1;
            }
        }
        for lock in self.table.locks() {
            if let Some(g) = lock.holder.filter(|g| !g.holder.is_nil()) {
                *refs.entry(g.holder).or_insert(0) += 1;
            }
        }
        self.check_believed(&mut refs);
        self.check_members(&mut refs);
        self.holders.check_refs(&refs);
    }
}
