//! Takes a lock on a ringlock cluster, uses its fencing token, renews it,
//! and releases it; then lets a few tasks share one client.
//!
//! Start a node (`cargo run -- serve`), then:
//!
//! ```text
//! cargo run --example lock -- 127.0.0.1:7171
//! ```
//!
//! Give every address of the cluster's peer list, in any order.

use std::time::Duration;

use ringlock::client::{Acquired, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut addrs: Vec<String> = std::env::args().skip(1).collect();
    if addrs.is_empty() {
        addrs.push("127.0.0.1:7171".into());
    }
    let client = Client::connect(addrs).await?;

    // Wait at most 5 s for the lock; hold it for 10 s unless renewed.
    let mut guard = client
        .lock(
            "example/report",
            Duration::from_secs(10),
            Some(Duration::from_secs(5)),
        )
        .await?;
    println!(
        "holding example/report, fencing token {} (pass it to the storage you write to)",
        guard.token()
    );

    // Long work: renew before the lease runs out.
    if guard.renew(Duration::from_secs(10)).await? {
        println!(
            "renewed; at least {} ms left",
            guard.grant().remaining().as_millis()
        );
    }
    println!("released: {}", guard.release().await?);

    // One client, many tasks: requests are pipelined on shared connections,
    // and the server grants the waiters of a key in arrival order.
    let mut tasks = Vec::new();
    for i in 0..5 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let lease = Duration::from_secs(5);
            match client
                .acquire("example/counter", lease, Some(Duration::from_secs(3)))
                .await?
            {
                Acquired::Granted(grant) => {
                    println!("task {i}: token {}", grant.token());
                    client.release_grant(&grant).await?;
                }
                Acquired::TimedOut => println!("task {i}: gave up after 3 s"),
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await.expect("task panicked")?;
    }
    Ok(())
}
