//! What the engine tells the peers that follow it: each change of the lock
//! table as a typed event, in the order the table changed.
//!
//! The engine only records events (`ReplicationLog`); it knows nothing of
//! peers or of how events travel. The cluster takes the log once per loop
//! turn (`super::Engine::take_replication`) and turns each event into its
//! peer line. A log is reused turn after turn: recording an event copies its
//! key into one shared byte buffer and appends a fixed-size record, so a
//! turn allocates nothing once the buffers have grown to the turn's size.

/// One change of the lock table, borrowing its key from the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication<'a> {
    /// `key` is held with `token` for `remaining_ms` more: a grant, a
    /// hand-off to a waiter or a renewal. It replaces whatever the follower
    /// had for `key`.
    Granted {
        key: &'a [u8],
        token: u64,
        remaining_ms: u64,
        /// Who holds it (both `None`: not known).
        holder: crate::proto::Holder<'a>,
    },
    /// `key`'s grant with `token` ended: released by its holder, or its
    /// lease ran out.
    Released { key: &'a [u8], token: u64 },
    /// `key` is held beside its grant by `token` for `remaining_ms` more:
    /// a grant merged at the heal of a split brain, or its renewal (see
    /// [`super::merge`]). It ends with a [`Replication::Released`].
    Believed {
        key: &'a [u8],
        token: u64,
        remaining_ms: u64,
        holder: crate::proto::Holder<'a>,
    },
    /// `key` is held by a shared grant (`limit` 0) or a permit of a
    /// semaphore of `limit` with `token` for `remaining_ms` more: a grant,
    /// a hand-off or a renewal of one member of the key (see the
    /// engine's `multi` module). It ends with a [`Replication::Released`]
    /// of its token.
    Member {
        key: &'a [u8],
        token: u64,
        remaining_ms: u64,
        holder: crate::proto::Holder<'a>,
        limit: u32,
    },
}

/// [`Record::class`] of a [`Replication::Granted`] (or a release).
const GRANTED: u32 = u32::MAX;
/// [`Record::class`] of a [`Replication::Believed`].
const BELIEVED: u32 = u32::MAX - 1;
const _: () = assert!(crate::proto::MAX_PERMITS < BELIEVED);

/// A recorded event: its key is `keys[previous end..key_end]`, then a
/// grant's holder address, owner and identity up to `addr_end`,
/// `owner_end` and `identity_end`
/// (`None`: not known).
#[derive(Debug, Clone, Copy)]
struct Record {
    key_end: usize,
    addr_end: Option<usize>,
    owner_end: Option<usize>,
    identity_end: Option<usize>,
    token: u64,
    /// `None` for a release.
    remaining_ms: Option<u64>,
    /// [`GRANTED`], [`BELIEVED`], or a [`Replication::Member`]'s limit.
    class: u32,
}

/// Replication events in order, with their keys in one buffer. Cleared and
/// refilled, never shrunk: see the module docs.
///
/// While every follower reads one form of line (the cluster knows), the
/// cluster gives the log its encoder ([`ReplicationLog::set_encoder`]) and
/// an event is written at once as that line, into `lines`: the key and the
/// holder are then copied from the table once, not into a record, out of
/// it and into the line.
#[derive(Debug, Default)]
pub(crate) struct ReplicationLog {
    records: Vec<Record>,
    keys: Vec<u8>,
    encoder: Option<LineEncoder>,
    /// The events' lines, from `encoder`.
    lines: Vec<u8>,
    /// How many events `lines` holds.
    lined: usize,
}

/// How the cluster writes an event's line (its wire form): a grant's and
/// a release's, the events of every cycle, called directly; `any` for
/// every event (the others).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LineEncoder {
    pub(crate) grant: fn(&mut Vec<u8>, &[u8], u64, u64, crate::proto::Holder<'_>),
    pub(crate) release: fn(&mut Vec<u8>, &[u8], u64),
    pub(crate) any: fn(&mut Vec<u8>, Replication<'_>),
}

impl ReplicationLog {
    pub(crate) fn new() -> ReplicationLog {
        ReplicationLog::default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of events recorded.
    pub(crate) fn len(&self) -> usize {
        self.records.len() + self.lined
    }

    /// Forgets every event and keeps the room.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.keys.clear();
        self.lines.clear();
        self.lined = 0;
    }

    /// From the next event on, records events as lines written by
    /// `encoder`, or (`None`) as events. The log must be empty: it holds
    /// events or lines, not both.
    pub(crate) fn set_encoder(&mut self, encoder: Option<LineEncoder>) {
        assert!(self.is_empty(), "the form of a log changes between turns");
        self.encoder = encoder;
    }

    pub(crate) fn encoder(&self) -> Option<LineEncoder> {
        self.encoder
    }

    /// Every event's line, if the log holds lines
    /// ([`ReplicationLog::set_encoder`]); `None` if it holds events.
    pub(crate) fn lines(&self) -> Option<&[u8]> {
        debug_assert!(self.encoder.is_some() || self.lined == 0);
        debug_assert!(self.encoder.is_none() || self.records.is_empty());
        self.encoder.is_some().then_some(&self.lines[..])
    }

    /// The events in the order they were recorded: none if the log holds
    /// lines ([`ReplicationLog::lines`]).
    pub(crate) fn iter(&self) -> impl Iterator<Item = Replication<'_>> {
        debug_assert!(self.lined == 0, "iterating a log of lines");
        let mut start = 0;
        self.records.iter().map(move |r| {
            let key = self.keys.get(start..r.key_end).unwrap_or_default();
            let mut end = r.key_end;
            let event = match r.remaining_ms {
                // A release has no holder: nothing follows its key.
                None => Replication::Released {
                    key,
                    token: r.token,
                },
                Some(remaining_ms) => {
                    let mut field = |until: Option<usize>| {
                        let until = until?;
                        let bytes = self.keys.get(end..until).unwrap_or_default();
                        end = until;
                        Some(bytes)
                    };
                    let holder = crate::proto::Holder {
                        addr: field(r.addr_end),
                        owner: field(r.owner_end),
                        identity: field(r.identity_end),
                    };
                    match r.class {
                        GRANTED => Replication::Granted {
                            key,
                            token: r.token,
                            remaining_ms,
                            holder,
                        },
                        BELIEVED => Replication::Believed {
                            key,
                            token: r.token,
                            remaining_ms,
                            holder,
                        },
                        limit => Replication::Member {
                            key,
                            token: r.token,
                            remaining_ms,
                            holder,
                            limit,
                        },
                    }
                }
            };
            start = end;
            event
        })
    }

    /// Appends an event (its key is copied). Inlined into each of its
    /// callers, which each push one kind: a release's record then skips
    /// the holder's fields, a grant's the match.
    #[inline(always)]
    pub(crate) fn push(&mut self, event: Replication<'_>) {
        if let Some(encode) = self.encoder {
            match event {
                Replication::Granted {
                    key,
                    token,
                    remaining_ms,
                    holder,
                } => (encode.grant)(&mut self.lines, key, token, remaining_ms, holder),
                Replication::Released { key, token } => {
                    (encode.release)(&mut self.lines, key, token)
                }
                other => (encode.any)(&mut self.lines, other),
            }
            self.lined += 1;
            return;
        }
        let (key, token, remaining_ms, holder, class) = match event {
            Replication::Granted {
                key,
                token,
                remaining_ms,
                holder,
            } => (key, token, Some(remaining_ms), holder, GRANTED),
            Replication::Believed {
                key,
                token,
                remaining_ms,
                holder,
            } => (key, token, Some(remaining_ms), holder, BELIEVED),
            Replication::Member {
                key,
                token,
                remaining_ms,
                holder,
                limit,
            } => {
                debug_assert!(limit <= crate::proto::MAX_PERMITS);
                (key, token, Some(remaining_ms), holder, limit)
            }
            Replication::Released { key, token } => {
                (key, token, None, crate::proto::Holder::default(), GRANTED)
            }
        };
        debug_assert!(
            remaining_ms.is_some() || holder == crate::proto::Holder::default(),
            "a release with a holder"
        );
        self.keys.extend_from_slice(key);
        let key_end = self.keys.len();
        let mut field = |bytes: Option<&[u8]>| {
            self.keys.extend_from_slice(bytes?);
            Some(self.keys.len())
        };
        let addr_end = field(holder.addr);
        let owner_end = field(holder.owner);
        let identity_end = field(holder.identity);
        self.records.push(Record {
            key_end,
            addr_end,
            owner_end,
            identity_end,
            token,
            remaining_ms,
            class,
        });
    }
}
