//! Failback as clients live through it, in virtual time (see
//! `timer_tests`, whose fake network these tests use): an `M` naming a node
//! the client has no connection to is dialled at once, not at the next
//! redial tick; `M` storms do not become dial storms; a renewing guard
//! keeps its lock when the role moves to a node that just started; and a
//! lock already known lost does not hold up its release.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::{Instant, sleep};

use super::timer_tests::{Log, MS, Mode, Net, Peer, about, bounded, lines_of};
use crate::*;

/// Answers every request of a standby that names `active` (`M key active`,
/// and `S standby active 0`).
fn standby_naming(
    active: &'static str,
) -> impl FnMut(&str) -> Option<String> + Clone + Send + 'static {
    move |line| {
        let f: Vec<&str> = line.split(' ').collect();
        Some(match f[0] {
            "S" => format!("S standby {active} 0"),
            _ => format!("M {} {active}", f[1]),
        })
    }
}

/// Answers as an active node: grants with token 9, renews and releases.
fn active_node(me: &'static str) -> impl FnMut(&str) -> Option<String> + Clone + Send + 'static {
    move |line| {
        let f: Vec<&str> = line.split(' ').collect();
        Some(match f[0] {
            "A" => format!("A {} 9", f[1]),
            "N" => format!("N {} 1", f[1]),
            "R" => format!("R {} 1", f[1]),
            _ => format!("S active {me} 0"),
        })
    }
}

/// Serves every connection `addr` accepts from now on with `answer`.
fn serve_all(
    net: &Net,
    addr: &str,
    log: Log,
    answer: impl FnMut(&str) -> Option<String> + Clone + Send + 'static,
) {
    let mut conns = net.node(addr);
    tokio::spawn(async move {
        while let Some(peer) = conns.recv().await {
            let peer: Peer = peer;
            peer.serve(log.clone(), answer.clone());
        }
    });
}

#[tokio::test(start_paused = true)]
async fn an_m_naming_a_known_node_without_a_connection_dials_it_at_once() {
    bounded(async move {
        // b is down when the client starts; a is a standby naming b.
        let net = Net::default();
        let a_log: Log = Arc::default();
        serve_all(&net, "a:1", a_log.clone(), standby_naming("b:1"));
        let _b = net.node("b:1");
        net.set_mode("b:1", Mode::Refuse);
        let client = net.client(&["a:1", "b:1"], |b| b).await;
        let t0 = Instant::now();
        // b comes back 1 s later, 2 s before its slot's next redial, as the
        // active node.
        sleep(Duration::from_secs(1)).await;
        let b_log: Log = Arc::default();
        serve_all(&net, "b:1", b_log.clone(), active_node("b:1"));
        let asked = Instant::now();
        let grant = client
            .acquire("k", Duration::from_secs(5), Some(Duration::from_secs(1)))
            .await
            .unwrap()
            .into_grant()
            .unwrap();
        assert_eq!(grant.token(), 9);
        // Granted by b at once: one M, one dial, one hello, one A.
        assert!(
            about(asked.elapsed(), Duration::ZERO),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(lines_of(&a_log, "A k").len(), 1);
        assert_eq!(lines_of(&b_log, "A k").len(), 1);
        let dials = net.dials("b:1");
        assert_eq!(dials.len(), 2, "{dials:?}");
        assert!(about(dials[1] - t0, 1000 * MS), "{dials:?}");
        // b is now the preferred node: the release goes straight there.
        assert!(client.release_grant(&grant).await.unwrap());
        assert_eq!(lines_of(&a_log, "R ").len(), 0);
        assert_eq!(lines_of(&b_log, "R k 9").len(), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_release_that_meets_m_completes_at_the_named_node() {
    bounded(async move {
        let net = Net::default();
        let a_log: Log = Arc::default();
        serve_all(&net, "a:1", a_log.clone(), standby_naming("b:1"));
        let _b = net.node("b:1");
        net.set_mode("b:1", Mode::Refuse);
        let client = net.client(&["a:1", "b:1"], |b| b).await;
        sleep(Duration::from_millis(1500)).await;
        let b_log: Log = Arc::default();
        serve_all(&net, "b:1", b_log.clone(), active_node("b:1"));
        let asked = Instant::now();
        assert!(client.release("k", 7).await.unwrap());
        assert!(
            about(asked.elapsed(), Duration::ZERO),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(lines_of(&a_log, "R k 7").len(), 1);
        assert_eq!(lines_of(&b_log, "R k 7").len(), 1);
        // So does a renew.
        let asked = Instant::now();
        assert!(client.renew("k", 7, Duration::from_secs(2)).await.unwrap());
        assert!(
            about(asked.elapsed(), Duration::ZERO),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(lines_of(&b_log, "N k 7 2").len(), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_m_storm_naming_an_unreachable_node_is_not_a_dial_storm() {
    bounded(async move {
        // a names b for every request; b accepts but never answers the
        // hello (hung), then refuses connections.
        let net = Net::default();
        let a_log: Log = Arc::default();
        serve_all(&net, "a:1", a_log.clone(), standby_naming("b:1"));
        let _b = net.node("b:1");
        net.set_mode("b:1", Mode::Hung);
        let client = net.client(&["a:1", "b:1"], |b| b).await;
        // b's first dial (hung) has ended: its next redial is 3 s after it.
        sleep(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        let mut releases = Vec::new();
        for i in 0..200 {
            let c = client.clone();
            releases.push(tokio::spawn(
                async move { c.release(format!("k{i}"), 5).await },
            ));
        }
        sleep(Duration::from_millis(200)).await;
        // 200 requests met M b: one dial is under way, the others wait for
        // it (its hello is not answered: no request is written to it).
        assert_eq!(net.dials("b:1").len(), 2, "{:?}", net.dials("b:1"));
        net.set_mode("b:1", Mode::Refuse);
        for r in releases {
            let err = r.await.unwrap().unwrap_err();
            assert!(err.is_connection(), "{err:?}");
        }
        let ms = lines_of(&a_log, "R k").len();
        assert!(ms >= 200 * 20, "only {ms} M answers");
        // Redirect dials after a failed one wait 50 ms, doubling up to 1 s.
        let dials: Vec<Duration> = net.dials("b:1")[1..].iter().map(|t| *t - t1).collect();
        assert!(about(dials[0], Duration::ZERO), "{dials:?}");
        // The requests that waited for the hung dial share its failure (the
        // hello timed out at 500 ms) and retry 200 ms later: no dial of b
        // right behind it.
        assert!(about(dials[1], 700 * MS), "{dials:?}");
        assert!(dials.len() <= 12, "{} dials: {dials:?}", dials.len());
        for pair in dials.windows(2) {
            assert!(pair[1] - pair[0] >= 50 * MS, "{dials:?}");
        }
        let gaps: Vec<Duration> = dials.windows(2).map(|p| p[1] - p[0]).collect();
        assert!(gaps.last().is_some_and(|g| *g >= 800 * MS), "{gaps:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_renewing_guard_keeps_its_lock_when_a_freshly_started_node_takes_the_role() {
    bounded(async move {
        // b (the preferred node) is down; a is active. At 3.2 s, just after
        // the client's redial of b failed, b comes back and takes the role
        // back at once: a answers M b from then on.
        let net = Net::default();
        let handed_back = Arc::new(AtomicBool::new(false));
        let a_log: Log = Arc::default();
        let back = handed_back.clone();
        let mut a_active = active_node("a:1");
        let mut a_standby = standby_naming("b:1");
        let a = move |line: &str| {
            if back.load(Ordering::Relaxed) {
                a_standby(line)
            } else {
                a_active(line)
            }
        };
        let a = Arc::new(std::sync::Mutex::new(a));
        serve_all(&net, "a:1", a_log.clone(), move |line| {
            (a.lock().unwrap())(line)
        });
        let _b = net.node("b:1");
        net.set_mode("b:1", Mode::Refuse);
        let client = net.client(&["b:1", "a:1"], |b| b).await;
        let t0 = Instant::now();
        let guard = client
            .lock_renewing("k", Duration::from_secs(2), None)
            .await
            .unwrap();
        assert_eq!(guard.token(), 9);
        sleep(Duration::from_millis(3200)).await;
        assert_eq!(net.dials("b:1").len(), 2, "redialled at 3 s");
        let b_log: Log = Arc::default();
        serve_all(&net, "b:1", b_log.clone(), active_node("b:1"));
        handed_back.store(true, Ordering::Relaxed);
        sleep(Duration::from_secs(6)).await;
        assert!(!guard.is_lost(), "{:?}", guard.status());
        // The first renewal after the hand-back met M at a and was
        // confirmed by b at once; every later one went to b.
        let moved = lines_of(&a_log, "N k 9 2");
        let at_b = lines_of(&b_log, "N k 9 2");
        let first_m = moved
            .iter()
            .find(|(t, _)| *t - t0 >= 3200 * MS)
            .expect("a renewal met M")
            .0;
        assert!(
            about(at_b[0].0 - first_m, Duration::ZERO),
            "{moved:?} {at_b:?}"
        );
        assert_eq!(moved.iter().filter(|(t, _)| *t >= first_m).count(), 1);
        assert!(at_b.len() >= 8, "{at_b:?}");
        assert_eq!(guard.status().failed_attempts, 0);
        assert!(guard.release().await.unwrap());
        assert_eq!(lines_of(&b_log, "R k 9").len(), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn releasing_a_lock_known_lost_returns_at_once() {
    bounded(async move {
        // Refused: nothing to release, nothing sent.
        let net = Net::default();
        let log: Log = Arc::default();
        let renewals = Arc::new(std::sync::Mutex::new(vec!["N k 0"]));
        serve_all(&net, "n:1", log.clone(), move |line| {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "A" => Some("A k 5".into()),
                "N" => renewals.lock().unwrap().pop().map(str::to_string),
                "R" => Some("R k 1".into()),
                _ => Some("S active n:1 0".into()),
            }
        });
        let client = net.client(&["n:1"], |b| b).await;
        let guard = client
            .lock_renewing("k", Duration::from_secs(3), None)
            .await
            .unwrap();
        assert_eq!(guard.lost().await, LockLost::Refused);
        let t = Instant::now();
        assert!(!guard.release().await.unwrap());
        assert_eq!(t.elapsed(), Duration::ZERO);
        sleep(Duration::from_secs(10)).await;
        assert_eq!(lines_of(&log, "R ").len(), 0);

        // Expired (no renewal answered, though the node is alive): the
        // release returns at once and is sent in the background.
        let guard = client
            .lock_renewing("k", Duration::from_secs(3), None)
            .await
            .unwrap();
        assert!(matches!(guard.lost().await, LockLost::Expired { .. }));
        let t = Instant::now();
        assert!(!guard.release().await.unwrap());
        assert_eq!(t.elapsed(), Duration::ZERO);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(lines_of(&log, "R k 5").len(), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_named_node_that_drops_every_connection_is_not_dialled_per_m() {
    bounded(async move {
        // b answers the hello, then drops the connection at once.
        let net = Net::default();
        let a_log: Log = Arc::default();
        serve_all(&net, "a:1", a_log.clone(), standby_naming("b:1"));
        let mut b_conns = net.node("b:1");
        tokio::spawn(async move { while b_conns.recv().await.is_some() {} });
        let client = net.client(&["a:1", "b:1"], |b| b).await;
        sleep(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        let mut releases = Vec::new();
        for i in 0..50 {
            let c = client.clone();
            releases.push(tokio::spawn(
                async move { c.release(format!("k{i}"), 5).await },
            ));
        }
        for r in releases {
            assert!(r.await.unwrap().is_err());
        }
        // Connections that a redirect made and that dropped at once count as
        // failed redirect dials: spaced 50 ms, doubling up to 1 s.
        let dials: Vec<Duration> = net
            .dials("b:1")
            .iter()
            .filter(|t| **t >= t1)
            .map(|t| *t - t1)
            .collect();
        assert!(dials.len() <= 12, "{} dials: {dials:?}", dials.len());
        let gaps: Vec<Duration> = dials.windows(2).map(|p| p[1] - p[0]).collect();
        assert!(gaps.last().is_some_and(|g| *g >= 800 * MS), "{gaps:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_m_naming_a_black_hole_keeps_every_deadline() {
    bounded(async move {
        // a names b for every request; dials to b never complete (its SYNs
        // are dropped), neither for the address given nor for a new one.
        let net = Net::default();
        let a_log: Log = Arc::default();
        serve_all(&net, "a:1", a_log.clone(), standby_naming("b:1"));
        let _b = net.node("b:1");
        net.set_mode("b:1", Mode::BlackHole);
        let client = net.client(&["a:1", "b:1"], |b| b).await;
        for _ in 0..2 {
            // An acquire ends by its wait plus the grace, a release and a
            // renew by their 5 s of retries; many at once keep one dial of b
            // under way, never more.
            let t = Instant::now();
            let mut calls = Vec::new();
            for i in 0..20 {
                let c = client.clone();
                calls.push(tokio::spawn(async move {
                    let k = format!("k{i}");
                    let t = Instant::now();
                    let acquired = c
                        .acquire(&k, Duration::from_secs(5), Some(Duration::from_millis(500)))
                        .await;
                    // Not TimedOut: no node said the wait ran out.
                    match &acquired {
                        Err(Error::Connection(why)) => assert!(why.contains("b:1"), "{why}"),
                        other => panic!("{other:?}"),
                    }
                    assert!(t.elapsed() <= 1503 * MS, "acquire took {:?}", t.elapsed());
                    let t = Instant::now();
                    assert!(c.release(&k, 5).await.is_err());
                    assert!(t.elapsed() <= 5003 * MS, "release took {:?}", t.elapsed());
                    let t = Instant::now();
                    assert!(c.renew(&k, 5, Duration::from_secs(5)).await.is_err());
                    assert!(t.elapsed() <= 5003 * MS, "renew took {:?}", t.elapsed());
                }));
            }
            for call in calls {
                call.await.unwrap();
            }
            assert!(t.elapsed() <= 11_510 * MS, "{:?}", t.elapsed());
            let dials = net.dials("b:1");
            for pair in dials.windows(2) {
                // Each dial lasts the connect timeout (3 s): the next starts
                // when it has ended.
                assert!(pair[1] - pair[0] >= 3000 * MS, "{dials:?}");
            }
        }
        // A new address that is a black hole: the same bounds.
        let t = Instant::now();
        let out = client.release("k", 5).await;
        assert!(out.is_err());
        assert!(t.elapsed() <= 5003 * MS, "{:?}", t.elapsed());
        assert_eq!(client.connections(), 2);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_client_during_a_redirect_dial_to_a_black_hole_ends_every_task() {
    bounded(async move {
        let net = Net::default();
        let a_log: Log = Arc::default();
        serve_all(&net, "a:1", a_log.clone(), standby_naming("c:1"));
        let _c = net.node("c:1");
        net.set_mode("c:1", Mode::BlackHole);
        let client = net.client(&["a:1"], |b| b).await;
        let shared = Arc::downgrade(&client.inner.shared);
        let c = client.clone();
        let release = tokio::spawn(async move { c.release("k", 5).await });
        sleep(Duration::from_millis(100)).await;
        // The dial of c (an address only the M named) is under way.
        assert_eq!(net.dials("c:1").len(), 1);
        assert_eq!(client.connections(), 3);
        release.abort();
        let _ = release.await;
        drop(client);
        // Every slot task (the one dialling c too) ends at once: nothing
        // holds what they share any more.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            shared.upgrade().is_none(),
            "a slot task outlived the client"
        );
        assert_eq!(net.dials("c:1").len(), 1);
    })
    .await;
}
