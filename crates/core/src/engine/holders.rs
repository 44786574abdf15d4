//! Who holds grants: the interned holder entries that grants name by
//! index (address, owner label and identity).

use slab::Slab;

use super::ids::HolderId;

/// One holder: the address of the connection that acquired (as the server
/// saw it, or as the active replicated it) and its owner label (`O`).
struct HolderEntry {
    addr: Option<Box<[u8]>>,
    owner: Option<Box<[u8]>>,
    /// The identity of the connection's client certificate (with client
    /// certificates only): who may release and renew its grants.
    identity: Option<Box<[u8]>>,
    /// Found through [`Holders::shared`] (a replicated holder).
    shared: bool,
}

/// A replicated holder's `(addr, owner, identity)`.
type HolderKey = (Option<Box<[u8]>>, Option<Box<[u8]>>, Option<Box<[u8]>>);

/// Who holds grants, interned: a lock stores a [`HolderId`], not the
/// address and label. An open connection that was granted something has
/// one entry (made at its first grant, while it keeps its label); a
/// standby has one per distinct holder its active replicated. An entry goes
/// when its last reference does, so entries are bounded by connections
/// plus grants.
#[derive(Default)]
pub struct Holders {
    entries: Slab<HolderEntry>,
    /// By entry: grants that name it, plus one for the connection it
    /// belongs to (0: a free slot). Apart from the entries, so that a grant
    /// and a release touch one `u32` each.
    refs: Vec<u32>,
    /// Replicated holders by `(addr, owner, identity)`: each distinct one
    /// once.
    shared: std::collections::HashMap<HolderKey, HolderId>,
}

impl Holders {
    /// A new entry with one reference (its connection's).
    #[cold]
    pub fn insert(
        &mut self,
        addr: Option<Box<[u8]>>,
        owner: Option<&[u8]>,
        identity: Option<&[u8]>,
    ) -> HolderId {
        let i = self.entries.insert(HolderEntry {
            addr,
            owner: owner.map(Box::from),
            identity: identity.map(Box::from),
            shared: false,
        });
        self.counted(i)
    }

    /// Entry `i` was just made: it counts one reference.
    fn counted(&mut self, i: usize) -> HolderId {
        if self.refs.len() <= i {
            self.refs.resize(i + 1, 0);
        }
        debug_assert_eq!(self.refs[i], 0);
        self.refs[i] = 1;
        HolderId::from_index(i)
    }

    /// The entry of a replicated holder, with one more reference (made if
    /// new).
    pub fn intern(&mut self, holder: crate::proto::Holder<'_>) -> HolderId {
        if holder == crate::proto::Holder::default() {
            return HolderId::NIL;
        }
        let key = (
            holder.addr.map(Box::from),
            holder.owner.map(Box::from),
            holder.identity.map(Box::from),
        );
        if let Some(&i) = self.shared.get(&key) {
            self.add_ref(i);
            return i;
        }
        let i = self.entries.insert(HolderEntry {
            addr: key.0.clone(),
            owner: key.1.clone(),
            identity: key.2.clone(),
            shared: true,
        });
        let i = self.counted(i);
        self.shared.insert(key, i);
        i
    }

    /// One more reference to `holder` ([`HolderId::NIL`]: nothing).
    #[inline]
    pub fn add_ref(&mut self, holder: HolderId) {
        if let Some(refs) = self.refs.get_mut(holder.index()) {
            debug_assert!(*refs > 0, "a reference to free holder {holder}");
            *refs += 1;
        }
    }

    /// One reference fewer; the entry goes with its last.
    #[inline]
    pub fn unref(&mut self, holder: HolderId) {
        let Some(refs) = self.refs.get_mut(holder.index()) else {
            return;
        };
        debug_assert!(*refs > 0, "a reference to free holder {holder}");
        *refs -= 1;
        if *refs == 0 {
            self.remove(holder);
        }
    }

    #[cold]
    #[inline(never)]
    fn remove(&mut self, holder: HolderId) {
        let e = self.entries.remove(holder.index());
        if e.shared {
            self.shared.remove(&(e.addr, e.owner, e.identity));
        }
    }

    /// What the wire says of `holder` (both `-` for [`HolderId::NIL`]).
    pub fn get(&self, holder: HolderId) -> crate::proto::Holder<'_> {
        match self.entries.get(holder.index()) {
            Some(e) => crate::proto::Holder {
                addr: e.addr.as_deref(),
                owner: e.owner.as_deref(),
                identity: e.identity.as_deref(),
            },
            None => crate::proto::Holder::default(),
        }
    }

    /// Live entries (for tests and invariants).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// References each entry should have, against what it counts.
    pub fn check_refs(&self, expected: &std::collections::HashMap<HolderId, u32>) {
        for (i, refs) in self.refs.iter().enumerate() {
            let want = expected.get(&HolderId::from_index(i)).copied().unwrap_or(0);
            assert_eq!(
                *refs, want,
                "holder {i} counts {refs} references, {want} exist"
            );
            assert_eq!(self.entries.contains(i), want > 0, "holder {i}");
        }
        assert_eq!(
            self.shared.len(),
            self.entries.iter().filter(|(_, e)| e.shared).count()
        );
    }
}
