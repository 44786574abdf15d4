//! What a client call gives back: grants, the lock guard, node status.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::{Client, Error, RenewingGuard};
use ringlock_proto::Role;

/// A lock held: the key, its fencing token, and a conservative deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub(crate) key: Vec<u8>,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    pub(crate) deadline: Instant,
}

impl Grant {
    /// Builds a grant by hand, e.g. for a token that another process
    /// acquired (`ringlock acquire` printed it). `deadline` is yours to state.
    pub fn new(
        key: impl AsRef<[u8]>,
        token: u64,
        lease: Duration,
        deadline: std::time::Instant,
    ) -> Grant {
        Grant {
            key: key.as_ref().to_vec(),
            token,
            lease,
            deadline: Instant::from_std(deadline),
        }
    }

    /// The key, as bytes.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The fencing token: greater than every token the cluster issued before
    /// it, for any key. Pass it to the resource you protect and have that
    /// resource refuse anything older than the newest token it has seen.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease asked for (or given by the last renew).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// When the lease runs out at the latest, as far as this process can
    /// tell: the moment the request (the acquire, or the last successful
    /// renew) was handed to a connection, plus the lease. The server starts
    /// the lease later than that (when it grants), so the real expiry is
    /// never earlier. For an acquire that waited in the queue this is
    /// pessimistic (possibly already past); a renew right after the grant
    /// gives a tight deadline again.
    pub fn deadline(&self) -> std::time::Instant {
        self.deadline.into_std()
    }

    /// Time left before [`Grant::deadline`] (zero if it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// The outcome of [`Client::acquire`]: granted, or the wait ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Acquired {
    /// The lock is yours until you release it or its lease runs out.
    Granted(Grant),
    /// `wait` ran out: nothing was granted and nothing is held.
    TimedOut,
}

impl Acquired {
    /// The grant, or `None` if the wait ran out.
    pub fn into_grant(self) -> Option<Grant> {
        match self {
            Acquired::Granted(grant) => Some(grant),
            Acquired::TimedOut => None,
        }
    }

    /// True if granted.
    pub fn is_granted(&self) -> bool {
        matches!(self, Acquired::Granted(_))
    }
}

/// A held lock that is released when dropped.
///
/// Dropping the guard spawns the release on the current tokio runtime (with
/// the usual retries: every 200 ms for 5 s on connection trouble). A runtime
/// that is shutting down may never run that task, so at the end of `main`
/// prefer the explicit [`LockGuard::release`]. Without a runtime at all the
/// lock is simply left to its lease.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    pub(crate) client: Client,
    pub(crate) grant: Grant,
    pub(crate) armed: bool,
}

impl LockGuard {
    /// The fencing token (see [`Grant::token`]).
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.grant.key
    }

    /// The conservative deadline (see [`Grant::deadline`]).
    pub fn deadline(&self) -> std::time::Instant {
        self.grant.deadline.into_std()
    }

    /// The grant behind the guard.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Renews the lease to `lease` from now. `Ok(false)`: the grant was gone
    /// (expired, or released by someone with the token); the guard then no
    /// longer releases anything when dropped.
    pub async fn renew(&mut self, lease: Duration) -> Result<bool, Error> {
        let held = self.client.renew_grant(&mut self.grant, lease).await?;
        if !held {
            self.armed = false;
        }
        Ok(held)
    }

    /// Releases the lock now. `Ok(true)`: it was held and is released;
    /// `Ok(false)`: it had already ended (lease ran out, or released by
    /// someone with the token; after a retry, possibly by the lost attempt).
    pub async fn release(mut self) -> Result<bool, Error> {
        self.armed = false;
        self.client.release_grant(&self.grant).await
    }

    /// Gives up the guard without releasing: the lock stays held until it is
    /// released with its token or its lease runs out.
    pub fn into_grant(mut self) -> Grant {
        self.armed = false;
        self.grant.clone()
    }

    /// Turns the guard into one that renews the lock in the background at a
    /// third of its lease for as long as it lives, and says when the lock
    /// is lost (see [`RenewingGuard`]). Must be called within a tokio
    /// runtime.
    pub fn keep_renewed(mut self) -> RenewingGuard {
        self.armed = false;
        RenewingGuard::new(&self.client, self.grant.clone())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            super::release_with_client(&self.client, self.grant.key.clone(), self.grant.token);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("grant", &self.grant)
            .field("armed", &self.armed)
            .finish()
    }
}

/// What one node said to `S`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// `active` or `standby`.
    pub role: Role,
    /// The active node this node names (`None` for `-`: it knows none).
    pub active: Option<String>,
    /// The highest token this node has issued or seen (0 if none).
    pub token: u64,
}

/// One address's line of [`Client::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrStatus {
    pub addr: String,
    /// The node's answer, or why it could not be had.
    pub status: Result<NodeStatus, Error>,
}
