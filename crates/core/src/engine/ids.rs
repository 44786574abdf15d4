//! The indices by which the engine's slabs point at each other: a lock
//! ([`LockId`]), a waiter ([`WaiterId`]), a holder entry ([`HolderId`])
//! and a shared grant or permit ([`MemberId`]). Each is a `u32` the compiler tells apart from the
//! others and from a count; each costs what the `u32` costs.
//!
//! A list or a grant that stores "no index" stores the type's `NIL`
//! (`u32::MAX`) rather than an `Option`, so that the structs holding them
//! keep their size.

/// Defines one index type of visibility `$vis`: `$name` indexes a slab
/// whose insert returns a `usize`, and `$over` is the message of a slab
/// grown past `u32::MAX`.
/// With `nil`, the type has a "no index" value.
macro_rules! slab_index {
    ($(#[$attr:meta])* $vis:vis $name:ident, $over:literal) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        $vis struct $name(u32);

        impl $name {
            /// The index of slab slot `index`. The engine keeps its slabs
            /// far below `u32::MAX` entries: more is a bug.
            #[inline]
            pub(crate) fn from_index(index: usize) -> $name {
                $name(u32::try_from(index).expect($over))
            }

            /// The slab slot this index names.
            #[inline]
            pub(crate) const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
    ($(#[$attr:meta])* $vis:vis $name:ident, $over:literal, nil) => {
        slab_index!($(#[$attr])* $vis $name, $over);

        impl $name {
            /// "No index": the end of a list, or nothing named. It is
            /// also slot `u32::MAX`'s number, which a slab never reaches
            /// (the table's and the holders' stay far below it).
            pub const NIL: $name = $name(u32::MAX);

            /// True for [`Self::NIL`].
            #[inline]
            pub(crate) const fn is_nil(self) -> bool {
                self.0 == u32::MAX
            }
        }
    };
}

slab_index!(
    /// A lock: a slot of the table's lock slab, valid while the lock is
    /// live. Printed as the bare number. Ordered as its number (the
    /// members of a key are kept in order of their lock).
    #[derive(PartialOrd, Ord)]
    pub LockId,
    "lock table over u32::MAX entries"
);

slab_index!(
    /// A waiting acquire: a slot of the table's waiter slab, valid until
    /// [`super::table::Table::finish`]. Printed as the bare number.
    pub WaiterId,
    "over u32::MAX waiters",
    nil
);

slab_index!(
    /// A holder entry of [`super::holders::Holders`], which a grant (or a
    /// connection) counts a reference to. [`HolderId::NIL`] in a grant:
    /// its holder is not known. Printed as the bare number.
    pub HolderId,
    "over u32::MAX holders",
    nil
);

slab_index!(
    /// A shared grant or a permit: a slot of the members' slab (see the
    /// engine's `multi` module), valid until it ends; its lease timer
    /// names it. Printed as the bare number.
    pub(crate) MemberId,
    "over u32::MAX members"
);

impl MemberId {
    /// The index the members' slab's next insert will take (its
    /// `vacant_key`), for the lease timer that must name it before the
    /// insert. Not checked here: that insert checks it
    /// ([`MemberId::from_index`]), and the two must be equal.
    #[inline]
    pub(crate) fn next_slot(index: usize) -> MemberId {
        debug_assert!(u32::try_from(index).is_ok());
        MemberId(index as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_is_its_slot_and_nil_is_none_of_them() {
        assert_eq!(LockId::from_index(7).index(), 7);
        assert_eq!(LockId::from_index(7).to_string(), "7");
        let waiter = WaiterId::from_index(0);
        assert!(!waiter.is_nil() && WaiterId::NIL.is_nil());
        assert_eq!(WaiterId::NIL.index(), u32::MAX as usize);
        assert!(HolderId::NIL.is_nil() && !HolderId::from_index(3).is_nil());
        assert_eq!(std::mem::size_of::<LockId>(), 4);
        assert_eq!(MemberId::next_slot(5), MemberId::from_index(5));
    }

    #[test]
    #[should_panic(expected = "over u32::MAX waiters")]
    fn a_slot_past_u32_is_a_bug() {
        WaiterId::from_index(usize::try_from(u64::from(u32::MAX) + 1).unwrap_or(usize::MAX));
    }
}
