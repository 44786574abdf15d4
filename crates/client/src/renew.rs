//! A lock that renews itself for as long as its guard lives, and says when
//! it is lost.

use std::fmt;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Client, Error, Grant};

/// Why a lock held by a [`RenewingGuard`] was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockLost {
    /// A node answered a renewal with `N key 0`: no grant of the key carries
    /// the token any more (its lease ran out, someone released it with the
    /// token, or the grant was made in the old active's last moments and
    /// did not survive a failover).
    Refused,
    /// No renewal was confirmed before the lease could have run out: the
    /// cluster could not be reached (or did not answer) in time. The lock
    /// may or may not still be held on a node; treat it as lost.
    Expired {
        /// What went wrong with the last renewal attempt, if one failed.
        last_error: Option<String>,
    },
}

impl fmt::Display for LockLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockLost::Refused => f.write_str(
                "the server no longer has the grant (its lease ran out, or it was released with the token)",
            ),
            LockLost::Expired { last_error: None } => {
                f.write_str("no renewal was confirmed before the lease ran out")
            }
            LockLost::Expired {
                last_error: Some(why),
            } => write!(
                f,
                "no renewal was confirmed before the lease ran out (last attempt: {why})"
            ),
        }
    }
}

/// A snapshot of a [`RenewingGuard`]'s renewals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewalStatus {
    /// When the lease runs out at the latest unless renewed again, as far
    /// as this process can tell (see [`Grant::deadline`]).
    pub deadline: std::time::Instant,
    /// Renewals confirmed so far.
    pub renewals: u64,
    /// Renewal attempts that failed (connection trouble, no active node)
    /// so far; they are retried every 200 ms until the deadline.
    pub failed_attempts: u64,
    /// Why the last attempt failed, until a renewal is confirmed again.
    pub last_error: Option<String>,
    /// Set once the lock is lost; the guard then renews no more.
    pub lost: Option<LockLost>,
}

#[derive(Debug, Clone)]
struct State {
    deadline: Instant,
    renewals: u64,
    failed_attempts: u64,
    last_error: Option<String>,
    lost: Option<LockLost>,
}

impl State {
    fn snapshot(&self) -> RenewalStatus {
        RenewalStatus {
            deadline: self.deadline.into_std(),
            renewals: self.renewals,
            failed_attempts: self.failed_attempts,
            last_error: self.last_error.clone(),
            lost: self.lost.clone(),
        }
    }
}

/// A view of a [`RenewingGuard`]'s state for another task: `Clone + Send`,
/// it does not keep the lock.
#[derive(Clone)]
pub struct RenewalWatch {
    rx: watch::Receiver<State>,
}

impl RenewalWatch {
    /// The renewals so far.
    pub fn status(&self) -> RenewalStatus {
        self.rx.borrow().snapshot()
    }

    /// True once the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.rx.borrow().lost.is_some()
    }

    /// Resolves when the lock is lost, with why; `None` if the guard ended
    /// first (released, dropped, or turned back into a grant) without the
    /// lock being lost. Cancel-safe.
    pub async fn lost(&self) -> Option<LockLost> {
        let mut rx = self.rx.clone();
        match rx.wait_for(|s| s.lost.is_some()).await {
            Ok(state) => state.lost.clone(),
            Err(_) => None,
        }
    }

    /// Resolves at the next change of the status (a renewal confirmed, an
    /// attempt failed, the lock lost). False once the guard has ended.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

impl fmt::Debug for RenewalWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenewalWatch")
            .field("status", &self.status())
            .finish()
    }
}

/// A held lock that renews itself for as long as the guard lives, and says
/// when it is lost, like an etcd session's lease or a Curator lock's
/// connection-state listener.
///
/// A background task renews the lease (`N key token lease`, the lease the
/// lock was taken with) a third of a lease after the last confirmed
/// renewal. An attempt that fails for connection reasons is retried every
/// 200 ms (each attempt bounded, dead connections noticed by the client's
/// liveness probes) until the lease could have run out. The lock is lost,
/// and the guard stops renewing, when a node answers that the grant is gone
/// (`N key 0`: [`LockLost::Refused`]), or when no renewal was confirmed
/// before the deadline ([`LockLost::Expired`]): the deadline is counted from
/// when the last confirmed renewal was *sent*, so the guard says "lost" no
/// later than the server can have let the lease run out. A grant that
/// waited in the queue (its deadline already near or past when it is
/// wrapped) is renewed at once, and that first renewal has a request
/// timeout, or a third of the lease if that is shorter, to be confirmed.
///
/// Await [`RenewingGuard::lost`] next to your work (`tokio::select!`), or
/// poll [`RenewingGuard::is_lost`]; [`RenewingGuard::watch`] gives a handle
/// for another task. Dropping the guard stops the renewals and releases the
/// lock in the background; [`RenewingGuard::release`] does it in the open.
/// As always, the fencing token, not the guard, is what keeps a protected
/// resource safe: a process paused past its lease cannot notice in time.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct RenewingGuard {
    client: Client,
    grant: Grant,
    rx: watch::Receiver<State>,
    task: Option<JoinHandle<()>>,
    armed: bool,
}

impl RenewingGuard {
    /// Starts renewing `grant` (a lock held with `client`) at a third of its
    /// lease. Must be called within a tokio runtime.
    pub fn new(client: &Client, grant: Grant) -> RenewingGuard {
        let every = (grant.lease / 3).max(Duration::from_millis(1));
        RenewingGuard::with_period(client, grant, every)
    }

    /// Like [`RenewingGuard::new`], renewing `every` (at least 1 ms, at
    /// most the lease) after the last confirmed renewal.
    pub fn with_period(client: &Client, grant: Grant, every: Duration) -> RenewingGuard {
        let every = every.clamp(Duration::from_millis(1), grant.lease);
        let (tx, rx) = watch::channel(State {
            deadline: grant.deadline,
            renewals: 0,
            failed_attempts: 0,
            last_error: None,
            lost: None,
        });
        let task = tokio::spawn(renew_loop(client.clone(), grant.clone(), every, tx));
        RenewingGuard {
            client: client.clone(),
            grant,
            rx,
            task: Some(task),
            armed: true,
        }
    }

    /// The fencing token (see [`Grant::token`]).
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.grant.key
    }

    /// The lease each renewal asks for.
    pub fn lease(&self) -> Duration {
        self.grant.lease
    }

    /// The deadline of the last confirmed renewal (see [`Grant::deadline`]).
    pub fn deadline(&self) -> std::time::Instant {
        self.rx.borrow().deadline.into_std()
    }

    /// The renewals so far.
    pub fn status(&self) -> RenewalStatus {
        self.rx.borrow().snapshot()
    }

    /// True once the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.rx.borrow().lost.is_some()
    }

    /// Resolves when the lock is lost, with why. Cancel-safe: made for
    /// `tokio::select!` next to the work the lock protects.
    pub async fn lost(&self) -> LockLost {
        let watch = self.watch();
        watch.lost().await.unwrap_or(LockLost::Expired {
            last_error: Some("the renewal task ended".into()),
        })
    }

    /// A handle on the renewals for another task.
    pub fn watch(&self) -> RenewalWatch {
        RenewalWatch {
            rx: self.rx.clone(),
        }
    }

    fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Stops renewing and releases the lock now (with the usual retries:
    /// every 200 ms for 5 s). `Ok(true)`: it was held and is released;
    /// `Ok(false)`: it had already ended.
    ///
    /// A lock already known lost returns `Ok(false)` at once, without
    /// waiting on a cluster that could not confirm a renewal:
    /// [`LockLost::Refused`] sends nothing (no grant carries the token);
    /// [`LockLost::Expired`] sends the release in the background on the
    /// current runtime (the grant may still be held on a node that could
    /// not be reached; the usual retries bound it).
    pub async fn release(mut self) -> Result<bool, Error> {
        self.armed = false;
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let lost = self.rx.borrow().lost.clone();
        match lost {
            None => self.client.release_grant(&self.grant).await,
            Some(LockLost::Refused) => Ok(false),
            Some(LockLost::Expired { .. }) => {
                super::release_with_client(&self.client, self.grant.key.clone(), self.grant.token);
                Ok(false)
            }
        }
    }

    /// Stops renewing without releasing: the lock stays held until released
    /// with its token or its lease runs out. The grant has the deadline of
    /// the last confirmed renewal.
    pub fn into_grant(mut self) -> Grant {
        self.armed = false;
        self.stop();
        let mut grant = self.grant.clone();
        grant.deadline = self.rx.borrow().deadline;
        grant
    }
}

impl Drop for RenewingGuard {
    fn drop(&mut self) {
        self.stop();
        let refused = matches!(self.rx.borrow().lost, Some(LockLost::Refused));
        if self.armed && !refused {
            self.armed = false;
            super::release_with_client(&self.client, self.grant.key.clone(), self.grant.token);
        }
    }
}

impl fmt::Debug for RenewingGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenewingGuard")
            .field("grant", &self.grant)
            .field("status", &self.status())
            .finish()
    }
}

/// How one round of renewal ended.
enum Round {
    Renewed(Instant),
    Refused,
    Expired,
}

/// The renewal task: renews `every` after the last confirmed renewal, each
/// round retried until the deadline; ends when the lock is lost.
async fn renew_loop(client: Client, grant: Grant, every: Duration, tx: watch::Sender<State>) {
    let lease = grant.lease;
    let timing = client.timing().clone();
    let mut deadline = grant.deadline;
    let mut first = true;
    loop {
        // A third of a lease after the last confirmed renewal was sent.
        let next = deadline
            .checked_sub(lease.saturating_sub(every))
            .unwrap_or_else(Instant::now);
        tokio::time::sleep_until(next).await;
        // A grant that waited in the queue may come with a deadline already
        // past (counted from the acquire's sending): its first renewal gets
        // a request timeout, at most a third of the lease, to be confirmed.
        // A grant made at once keeps its deadline, so a short lease is not
        // stretched.
        let loss_at = if first {
            deadline.max(Instant::now() + timing.request_timeout.min(every))
        } else {
            deadline
        };
        first = false;
        let round = loop {
            let now = Instant::now();
            if now >= loss_at {
                break Round::Expired;
            }
            let mut trouble = |why: &str| {
                tx.send_modify(|s| {
                    s.failed_attempts += 1;
                    s.last_error = Some(why.to_string());
                });
            };
            let attempt = client.renew_until(&grant.key, grant.token, lease, loss_at, &mut trouble);
            match tokio::time::timeout_at(loss_at, attempt).await {
                Err(_) => break Round::Expired,
                Ok(Ok((true, sent))) => break Round::Renewed(sent),
                Ok(Ok((false, _))) => break Round::Refused,
                Ok(Err(e)) => {
                    // A protocol error, or the retries gave up: try again
                    // (another connection may do) until the deadline.
                    trouble(&e.to_string());
                    let left = loss_at.saturating_duration_since(Instant::now());
                    tokio::time::sleep(timing.retry_every.min(left)).await;
                }
            }
        };
        match round {
            Round::Renewed(sent) => {
                deadline = deadline.max(sent + lease);
                tx.send_modify(|s| {
                    s.deadline = deadline;
                    s.renewals += 1;
                    s.last_error = None;
                });
            }
            Round::Refused => {
                tx.send_modify(|s| s.lost = Some(LockLost::Refused));
                return;
            }
            Round::Expired => {
                tx.send_modify(|s| {
                    let last_error = s
                        .last_error
                        .clone()
                        .or_else(|| Some("the last attempt was not answered in time".to_string()));
                    s.lost = Some(LockLost::Expired { last_error });
                });
                return;
            }
        }
    }
}
