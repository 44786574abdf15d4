//! Who holds grants: the interned holder entries that grants name by
//! index (address, owner label and identity).

use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;
use slab::Slab;

use super::ids::HolderId;
use crate::proto::Holder;

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

impl HolderEntry {
    /// What the wire says of it.
    fn holder(&self) -> Holder<'_> {
        Holder {
            addr: self.addr.as_deref(),
            owner: self.owner.as_deref(),
            identity: self.identity.as_deref(),
        }
    }
}

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
    /// Replicated holders by `(addr, owner, identity)`, each distinct one
    /// once: the index of its entry, found by the hash of the three fields
    /// as the wire gives them (so that finding one copies nothing) and a
    /// comparison with the entry's. The hash is seeded at random, as the
    /// lock table's is: the fields come from the network.
    shared: HashTable<HolderId>,
    hasher: foldhash::fast::RandomState,
}

/// The hash a replicated holder is found by: its fields' bytes, then
/// their lengths in one word (each one more than the field's length, 0
/// for none: no two holders give the same bytes and word). Most holders
/// have an address only: one pass over its bytes, one folded word.
#[inline]
fn hash_of(hasher: &foldhash::fast::RandomState, h: Holder<'_>) -> u64 {
    let mut state = hasher.build_hasher();
    let mut lengths = 0u64;
    for (i, field) in [h.addr, h.owner, h.identity].into_iter().enumerate() {
        if let Some(bytes) = field {
            state.write(bytes);
            // Each field is shorter than a line (512 bytes): 16 bits.
            lengths |= (bytes.len() as u64 + 1) << (16 * i);
        }
    }
    state.write_u64(lengths);
    state.finish()
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
    /// new). Finding an existing one allocates nothing.
    pub fn intern(&mut self, holder: Holder<'_>) -> HolderId {
        if holder == Holder::default() {
            return HolderId::NIL;
        }
        let hash = hash_of(&self.hasher, holder);
        let entries = &self.entries;
        let found = self
            .shared
            .find(hash, |&i| entries[i.index()].holder() == holder);
        if let Some(&i) = found {
            self.add_ref(i);
            return i;
        }
        self.insert_shared(hash, holder)
    }

    /// A new entry for a replicated holder not seen before.
    #[cold]
    #[inline(never)]
    fn insert_shared(&mut self, hash: u64, holder: Holder<'_>) -> HolderId {
        let i = self.entries.insert(HolderEntry {
            addr: holder.addr.map(Box::from),
            owner: holder.owner.map(Box::from),
            identity: holder.identity.map(Box::from),
            shared: true,
        });
        let i = self.counted(i);
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.shared
            .insert_unique(hash, i, |&j| hash_of(hasher, entries[j.index()].holder()));
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
            let hash = hash_of(&self.hasher, e.holder());
            match self.shared.find_entry(hash, |&i| i == holder) {
                Ok(found) => {
                    found.remove();
                }
                Err(_) => debug_assert!(false, "replicated holder {holder} not in the index"),
            }
        }
    }

    /// What the wire says of `holder` (both `-` for [`HolderId::NIL`]).
    pub fn get(&self, holder: HolderId) -> Holder<'_> {
        match self.entries.get(holder.index()) {
            Some(e) => e.holder(),
            None => Holder::default(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn h<'a>(
        addr: Option<&'a [u8]>,
        owner: Option<&'a [u8]>,
        identity: Option<&'a [u8]>,
    ) -> Holder<'a> {
        Holder {
            addr,
            owner,
            identity,
        }
    }

    #[test]
    fn each_distinct_replicated_holder_has_one_entry() {
        // Holders that differ only in where their bytes fall between the
        // fields, or in which field is absent.
        let distinct = [
            h(Some(b"ab"), Some(b"c"), None),
            h(Some(b"a"), Some(b"bc"), None),
            h(Some(b"abc"), None, None),
            h(None, Some(b"abc"), None),
            h(None, None, Some(b"abc")),
            h(Some(b"abc"), Some(b"abc"), Some(b"abc")),
            h(Some(b"abc"), Some(b"abc"), None),
        ];
        let mut holders = Holders::default();
        let ids: Vec<HolderId> = distinct.iter().map(|&x| holders.intern(x)).collect();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(holders.get(id), distinct[i]);
            assert!(ids[..i].iter().all(|&other| other != id), "{i}");
        }
        assert_eq!(holders.len(), distinct.len());
        // Each again: the same entry, one more reference; nothing new.
        for (i, &x) in distinct.iter().enumerate() {
            assert_eq!(holders.intern(x), ids[i]);
        }
        assert_eq!(holders.len(), distinct.len());
        assert_eq!(holders.intern(Holder::default()), HolderId::NIL);
        // An entry goes with its last reference, and only then.
        let mut expected = std::collections::HashMap::new();
        for &id in &ids {
            holders.unref(id);
            expected.insert(id, 1);
        }
        holders.check_refs(&expected);
        for (i, &id) in ids.iter().enumerate() {
            holders.unref(id);
            expected.remove(&id);
            holders.check_refs(&expected);
            assert_eq!(holders.len(), distinct.len() - i - 1);
        }
        // And comes back as a new entry.
        let again = holders.intern(distinct[0]);
        assert_eq!(holders.get(again), distinct[0]);
        assert_eq!(holders.len(), 1);
    }
}
