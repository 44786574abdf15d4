//! Takes a lock on a ringlock cluster and works under it while it renews
//! itself, stopping if it is lost. Start a node (`cargo run -- serve`), then
//! `cargo run -p ringlock-client --example lock -- 127.0.0.1:7171` (give
//! every address of the cluster's peer list). docs/client.md shows this file
//! as it is.

use std::time::Duration;

use ringlock_client::{Acquired, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut addrs: Vec<String> = std::env::args().skip(1).collect();
    if addrs.is_empty() {
        addrs.push("127.0.0.1:7171".into());
    }
    // Every timeout has a default (see "Timeouts"); two spelled out here.
    let client = Client::builder(addrs)
        .probe_timeout(Duration::from_millis(500))
        .acquire_grace(Duration::from_secs(1))
        .connect()
        .await?;

    // One attempt, like flock -n: None if someone else holds the lock.
    match client
        .try_lock("example/report", Duration::from_secs(10))
        .await?
    {
        Some(guard) => {
            println!("free at once, token {}", guard.token());
            guard.release().await?;
        }
        None => println!("example/report is busy"),
    }

    // Wait at most 5 s in the queue (Err(Error::Timeout) if that runs
    // out); then the lock renews itself every third of its 6 s lease for as
    // long as the guard lives, and says if it is lost.
    let guard = client
        .lock_renewing(
            "example/report",
            Duration::from_secs(6),
            Some(Duration::from_secs(5)),
        )
        .await?;
    // The fencing token: hand it to the storage you write to, which refuses
    // tokens older than the newest it has seen.
    let token = guard.token();
    tokio::select! {
        () = work(token) => println!("released: {}", guard.release().await?),
        lost = guard.lost() => eprintln!("lock lost, work stopped: {lost}"),
    }

    // Without a guard: an explicit outcome, and an explicit release.
    match client
        .acquire("example/counter", Duration::from_secs(5), None)
        .await?
    {
        Acquired::Granted(grant) => {
            println!("counter token {}", grant.token());
            client.release_grant(&grant).await?;
        }
        Acquired::TimedOut => unreachable!("no wait limit"),
    }
    Ok(())
}

/// Longer than the lease: the guard keeps the lock meanwhile.
async fn work(token: u64) {
    for step in 1..=3 {
        println!("step {step} under token {token}");
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}
