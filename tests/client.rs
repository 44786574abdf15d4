//! The official client against the real server binary on loopback: FIFO
//! through one client, connection cuts (through a TCP proxy in the test),
//! release retries, redial timing, `M` redirects (through a fake node that
//! points at the real one).

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringlock_client::{Acquired, Client, Error, LockLost, Role};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tokio::time::timeout;

/// The server's io backend: epoll, or `RINGLOCK_TEST_IO` (e.g. `uring`).
fn backend() -> String {
    std::env::var("RINGLOCK_TEST_IO").unwrap_or_else(|_| "epoll".into())
}

/// Runs a test body with a bound, so that a bug fails instead of hanging.
async fn bounded<F: Future<Output = ()>>(body: F) {
    timeout(Duration::from_secs(90), body)
        .await
        .expect("test did not finish within 90 s");
}

/// Polls `cond` every 10 ms until it holds; panics after `within`.
async fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

// ---------------------------------------------------------------- the proxy

/// A TCP proxy in front of the server: each accepted connection gets its own
/// upstream connection. The test can cut a connection (both sides closed),
/// make the proxy refuse new ones (accept and close at once), and make a
/// connection swallow what the client sends (so a request never arrives).
struct Proxy {
    addr: String,
    state: Arc<Mutex<ProxyState>>,
}

#[derive(Default)]
struct ProxyState {
    conns: Vec<ProxyConn>,
    refuse: bool,
    refused: Vec<Instant>,
    swallow: bool,
}

struct ProxyConn {
    pumps: Vec<AbortHandle>,
    cut: bool,
    /// Lines the client sent on this connection (forwarded or swallowed).
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if st.lock().unwrap().refuse {
                    st.lock().unwrap().refused.push(Instant::now());
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut crd, mut cwr) = client.into_split();
                let (mut srd, mut swr) = server.into_split();
                let lines = Arc::new(Mutex::new(Vec::new()));
                let (lines_up, st_up) = (lines.clone(), st.clone());
                let up = tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut partial = Vec::new();
                    loop {
                        let n = match crd.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        partial.extend_from_slice(&buf[..n]);
                        while let Some(at) = partial.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = partial.drain(..=at).collect();
                            let line = String::from_utf8_lossy(&line[..at]).into_owned();
                            lines_up.lock().unwrap().push(line);
                        }
                        if st_up.lock().unwrap().swallow {
                            continue;
                        }
                        if swr.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let down = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut srd, &mut cwr).await;
                });
                st.lock().unwrap().conns.push(ProxyConn {
                    pumps: vec![up.abort_handle(), down.abort_handle()],
                    cut: false,
                    lines,
                });
            }
        });
        Proxy { addr, state }
    }

    /// Connections accepted, cut or not.
    fn accepted(&self) -> usize {
        self.state.lock().unwrap().conns.len()
    }

    /// Connections accepted and not cut by the test.
    fn open(&self) -> Vec<usize> {
        let st = self.state.lock().unwrap();
        (0..st.conns.len()).filter(|&i| !st.conns[i].cut).collect()
    }

    /// Closes connection `i` on both sides.
    fn cut(&self, i: usize) {
        let mut st = self.state.lock().unwrap();
        st.conns[i].cut = true;
        for pump in &st.conns[i].pumps {
            pump.abort();
        }
    }

    fn cut_all(&self) {
        for i in self.open() {
            self.cut(i);
        }
    }

    fn refuse(&self, on: bool) {
        self.state.lock().unwrap().refuse = on;
    }

    fn refused(&self) -> Vec<Instant> {
        self.state.lock().unwrap().refused.clone()
    }

    fn swallow(&self, on: bool) {
        self.state.lock().unwrap().swallow = on;
    }

    fn lines(&self, i: usize) -> Vec<String> {
        self.state.lock().unwrap().conns[i]
            .lines
            .lock()
            .unwrap()
            .clone()
    }

    /// The connection that carried a line starting with `prefix`, if any.
    fn carried(&self, prefix: &str) -> Option<usize> {
        let n = self.accepted();
        (0..n).find(|&i| self.lines(i).iter().any(|l| l.starts_with(prefix)))
    }
}

/// Connects a client through `proxy` and waits for both of its connections.
async fn client_via(proxy: &Proxy) -> Client {
    let client = Client::connect([proxy.addr.clone()]).await.unwrap();
    eventually("two connections", Duration::from_secs(10), || {
        client.connected() == 2 && proxy.open().len() == 2
    })
    .await;
    client
}

fn raw(server: &common::Server) -> common::Conn {
    server.connect()
}

// ---------------------------------------------------------------- FIFO

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_tasks_of_one_client_are_granted_in_fifo_order() {
    bounded(async {
        let server = common::Server::start(&backend());
        let client = Client::connect([server.addr.to_string()]).await.unwrap();
        eventually("two connections", Duration::from_secs(10), || {
            client.connected() == 2
        })
        .await;
        let lease = Duration::from_secs(30);
        let first = client
            .lock("fifo", lease, None)
            .await
            .expect("the first acquire is granted at once");

        const N: usize = 40;
        let order = Arc::new(Mutex::new(Vec::new()));
        let holding = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for i in 0..N {
            let (client2, order, holding) = (client.clone(), order.clone(), holding.clone());
            tasks.push(tokio::spawn(async move {
                let grant = client2
                    .acquire("fifo", lease, None)
                    .await
                    .unwrap()
                    .into_grant()
                    .expect("no wait limit: granted");
                assert!(!holding.swap(true, Ordering::SeqCst), "two holders at once");
                order.lock().unwrap().push((i, grant.token()));
                holding.store(false, Ordering::SeqCst);
                assert!(client2.release_grant(&grant).await.unwrap());
            }));
            // Task i's acquire has been handed to a connection, and (sync) the
            // server has read it, before task i+1 starts: arrival order is i.
            eventually("the acquire is sent", Duration::from_secs(10), || {
                client.pending_requests() == i + 1
            })
            .await;
            client.sync().await.unwrap();
        }
        let first_token = first.token();
        assert!(first.release().await.unwrap());
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let indices: Vec<usize> = order.iter().map(|&(i, _)| i).collect();
        assert_eq!(
            indices,
            (0..N).collect::<Vec<_>>(),
            "grants not in arrival order"
        );
        let mut last = first_token;
        for &(i, token) in &order {
            assert!(
                token > last,
                "token of waiter {i} ({token}) not above {last}"
            );
            last = token;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pipelined_tasks_keep_mutual_exclusion_and_increasing_tokens() {
    bounded(async {
        let server = common::Server::start(&backend());
        let client = Client::connect([server.addr.to_string()]).await.unwrap();
        const KEYS: usize = 5;
        const TASKS: usize = 60;
        const ROUNDS: usize = 5;
        let held: Arc<Vec<AtomicBool>> =
            Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
        let last: Arc<Mutex<HashMap<usize, u64>>> = Arc::default();
        let grants = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (client, held, last, grants) =
                (client.clone(), held.clone(), last.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..ROUNDS {
                    let k = (t + r) % KEYS;
                    let key = format!("pipe/{k}");
                    let guard = client
                        .lock(&key, Duration::from_secs(30), None)
                        .await
                        .unwrap();
                    assert!(!held[k].swap(true, Ordering::SeqCst), "{key}: two holders");
                    {
                        let mut last = last.lock().unwrap();
                        let prev = last.insert(k, guard.token()).unwrap_or(0);
                        assert!(
                            guard.token() > prev,
                            "{key}: token {} after {prev}",
                            guard.token()
                        );
                    }
                    grants.fetch_add(1, Ordering::Relaxed);
                    held[k].store(false, Ordering::SeqCst);
                    assert!(guard.release().await.unwrap());
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(grants.load(Ordering::Relaxed), TASKS * ROUNDS);
        assert_eq!(client.pending_requests(), 0);
    })
    .await;
}

// ---------------------------------------------------------------- basics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_renew_timeout_and_guard_drop() {
    bounded(async {
        let server = common::Server::start(&backend());
        let client = Client::connect([server.addr.to_string()]).await.unwrap();
        let mut other = raw(&server);

        let mut grant = client
            .acquire("basic", Duration::from_secs(2), None)
            .await
            .unwrap()
            .into_grant()
            .unwrap();
        assert!(grant.deadline() <= Instant::now() + Duration::from_secs(2));
        assert_eq!(other.call("A basic 1 0.1"), "T basic");

        // The wait runs out: TimedOut from acquire, Error::Timeout from lock.
        let started = Instant::now();
        let out = client
            .acquire(
                "basic",
                Duration::from_secs(1),
                Some(Duration::from_millis(200)),
            )
            .await
            .unwrap();
        assert_eq!(out, Acquired::TimedOut);
        assert!(
            started.elapsed() >= Duration::from_millis(190),
            "{:?}",
            started.elapsed()
        );
        let err = client
            .lock(
                "basic",
                Duration::from_secs(1),
                Some(Duration::from_millis(50)),
            )
            .await
            .unwrap_err();
        assert_eq!(err, Error::Timeout);

        // Renew outlives the first lease (2 s).
        assert!(
            client
                .renew_grant(&mut grant, Duration::from_secs(30))
                .await
                .unwrap()
        );
        assert!(grant.remaining() > Duration::from_secs(20));
        assert!(
            !client
                .renew("basic", grant.token() + 1, Duration::from_secs(1))
                .await
                .unwrap()
        );
        assert!(!client.release("basic", grant.token() + 1).await.unwrap());
        assert!(client.release_grant(&grant).await.unwrap());
        assert!(!client.release_grant(&grant).await.unwrap());

        // A guard releases when dropped.
        let guard = client
            .lock("basic", Duration::from_secs(30), None)
            .await
            .unwrap();
        let token = guard.token();
        assert!(token > grant.token());
        drop(guard);
        let answer = other.call("A basic 1 5");
        assert!(common::Conn::token_of(&answer) > token, "{answer}");

        // Status of the single node.
        let status = client.status().await;
        assert_eq!(status.len(), 1);
        let node = status[0].status.as_ref().unwrap();
        assert_eq!(node.role, Role::Active);
        assert!(node.token >= token);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_4096_waiting_acquires_per_connection_queue_in_the_client() {
    bounded(async {
        let server = common::Server::start(&backend());
        let mut holder = raw(&server);
        common::Conn::token_of(&holder.call("A crowd 30 0"));
        let client = Client::connect([server.addr.to_string()]).await.unwrap();
        eventually("two connections", Duration::from_secs(10), || {
            client.connected() == 2
        })
        .await;

        // 9000 waiters on two connections: 4096 wait on each, the rest in
        // the client. One more on a connection would break it (E).
        const N: usize = 9000;
        let mut tasks = Vec::with_capacity(N);
        for _ in 0..N {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                client
                    .acquire(
                        "crowd",
                        Duration::from_secs(5),
                        Some(Duration::from_secs(3)),
                    )
                    .await
            }));
        }
        eventually(
            "4096 acquires sent on each connection",
            Duration::from_secs(20),
            || client.pending_requests() == 2 * 4096,
        )
        .await;
        // The client's own release is not stuck behind its waiters.
        let started = Instant::now();
        assert!(!client.release("crowd", 1).await.unwrap());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(client.connected(), 2, "a connection was broken");
        assert_eq!(client.pending_requests(), 2 * 4096);

        let mut timed_out = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(Acquired::TimedOut) => timed_out += 1,
                other => panic!("expected TimedOut, got {other:?}"),
            }
        }
        assert_eq!(timed_out, N);
        assert_eq!(client.connected(), 2);
    })
    .await;
}

// ---------------------------------------------------------------- connection cuts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_keep_succeeding_on_the_other_connection_when_one_is_cut() {
    bounded(async {
        let server = common::Server::start(&backend());
        let proxy = Proxy::start(server.addr.to_string()).await;
        let client = client_via(&proxy).await;
        proxy.refuse(true);
        proxy.cut(0);
        let mut tokens = Vec::new();
        for i in 0..40 {
            let guard = client
                .lock("cut", Duration::from_secs(10), Some(Duration::from_secs(5)))
                .await
                .unwrap_or_else(|e| panic!("acquire {i} after the cut: {e}"));
            tokens.push(guard.token());
            assert!(guard.release().await.unwrap());
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(client.connected(), 1);
        // Everything after the cut went over connection 1.
        let on_1 = proxy
            .lines(1)
            .iter()
            .filter(|l| l.starts_with("A cut "))
            .count();
        assert!(on_1 >= 40, "{on_1} acquires on the surviving connection");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_whose_connection_is_cut_is_retried_on_the_next() {
    bounded(async {
        let server = common::Server::start(&backend());
        let mut holder = raw(&server);
        let held = common::Conn::token_of(&holder.call("A wait 30 0"));
        let proxy = Proxy::start(server.addr.to_string()).await;
        let client = client_via(&proxy).await;

        let c = client.clone();
        let acquire = tokio::spawn(async move {
            c.acquire(
                "wait",
                Duration::from_secs(30),
                Some(Duration::from_secs(60)),
            )
            .await
        });
        let mut first = None;
        eventually(
            "the acquire reaches the proxy",
            Duration::from_secs(10),
            || {
                first = proxy.carried("A wait ");
                first.is_some()
            },
        )
        .await;
        let first = first.unwrap();
        client.sync().await.unwrap();
        proxy.refuse(true);
        proxy.cut(first);
        let other = 1 - first;
        eventually(
            "the acquire is sent again on the other connection",
            Duration::from_secs(10),
            || {
                proxy
                    .lines(other)
                    .iter()
                    .any(|l| l.starts_with("A wait 30 "))
            },
        )
        .await;
        assert!(!acquire.is_finished());
        // The retried request waits at the server; the cut one was withdrawn,
        // so the release hands the lock to the retry.
        client.sync().await.unwrap();
        assert_eq!(holder.call(&format!("R wait {held}")), "R wait 1");
        let grant = timeout(Duration::from_secs(5), acquire)
            .await
            .expect("granted soon after the release")
            .unwrap()
            .unwrap()
            .into_grant()
            .expect("granted, not timed out");
        assert!(grant.token() > held);
        assert_eq!(holder.call("A wait 1 0.1"), "T wait");
        assert!(client.release_grant(&grant).await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_connection_fails_is_retried_and_lands() {
    bounded(async {
        let server = common::Server::start(&backend());
        let proxy = Proxy::start(server.addr.to_string()).await;
        let client = client_via(&proxy).await;
        let grant = client
            .acquire("rel", Duration::from_secs(60), None)
            .await
            .unwrap()
            .into_grant()
            .unwrap();
        let mut probe = raw(&server);
        assert_eq!(probe.call("A rel 1 0.1"), "T rel");

        // The release is swallowed by the proxy (it never reaches the
        // server), then every connection is cut and new ones are refused.
        proxy.swallow(true);
        proxy.refuse(true);
        let c = client.clone();
        let g = grant.clone();
        let started = Instant::now();
        let release = tokio::spawn(async move { c.release_grant(&g).await });
        let mut carried = None;
        eventually(
            "the release reaches the proxy",
            Duration::from_secs(5),
            || {
                carried = proxy.carried(&format!("R rel {}", grant.token()));
                carried.is_some()
            },
        )
        .await;
        proxy.cut_all();
        eventually(
            "the client sees both connections gone",
            Duration::from_secs(5),
            || client.connected() == 0,
        )
        .await;
        assert_eq!(
            probe.call("A rel 1 0.1"),
            "T rel",
            "the lost release did not land"
        );
        // The node is reachable again a moment later; the release, retried
        // every 200 ms, lands on a redialled connection.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!release.is_finished(), "gave up at once");
        proxy.swallow(false);
        proxy.refuse(false);
        let held = release.await.unwrap().expect("the retried release lands");
        let took = started.elapsed();
        assert!(held, "the release found the grant");
        assert!(
            took < Duration::from_secs(5) + Duration::from_millis(500),
            "{took:?}"
        );
        let answer = probe.call("A rel 1 1");
        assert!(common::Conn::token_of(&answer) > grant.token(), "{answer}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_are_redialled_within_about_3_s() {
    bounded(async {
        let server = common::Server::start(&backend());
        let proxy = Proxy::start(server.addr.to_string()).await;
        let client = client_via(&proxy).await;

        // While the node refuses, the client keeps redialling, but not in a
        // tight loop.
        proxy.refuse(true);
        proxy.cut_all();
        eventually("both connections seen gone", Duration::from_secs(5), || {
            client.connected() == 0
        })
        .await;
        eventually("both redialled", Duration::from_secs(8), || {
            proxy.refused().len() >= 2
        })
        .await;
        let window = Instant::now();
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let refused = proxy.refused();
        let in_window = refused.iter().filter(|&&t| t >= window).count();
        assert!(
            (1..=4).contains(&in_window),
            "{in_window} redials by 2 connections in 3.5 s (expected one or two each)"
        );

        // Accepting again: both connections are back within the 3 s period
        // (with slack for a loaded machine).
        proxy.refuse(false);
        let took = eventually("both connections back", Duration::from_secs(10), || {
            client.connected() == 2
        })
        .await;
        assert!(took < Duration::from_secs(6), "reconnected after {took:?}");
        let guard = client
            .lock("redial", Duration::from_secs(5), None)
            .await
            .unwrap();
        assert!(guard.release().await.unwrap());
    })
    .await;
}

// ---------------------------------------------------------------- M

/// A fake standby: answers every request with `M key <active>` (and `S`
/// with `S standby <active> 0`), and counts the requests with a key it got
/// (not the `S` every new client connection starts with).
async fn fake_standby(active: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (active, seen) = (active.clone(), seen.clone());
            tokio::spawn(async move {
                let (rd, mut wr) = stream.into_split();
                let mut lines = BufReader::new(rd).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let f: Vec<&str> = line.split(' ').collect();
                    if f[0] != "S" {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    let answer = match f[0] {
                        "S" => format!("S standby {active} 0\n"),
                        _ => format!("M {} {active}\n", f[1]),
                    };
                    if wr.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_m_answer_is_followed_to_the_active_node() {
    bounded(async {
        let server = common::Server::start(&backend());
        let active = server.addr.to_string();
        let (standby, asked) = fake_standby(active.clone()).await;
        let client = Client::connect([standby.clone()]).await.unwrap();

        let grant = client
            .acquire("moved", Duration::from_secs(30), None)
            .await
            .unwrap()
            .into_grant()
            .unwrap();
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "the standby saw the acquire"
        );
        let mut probe = raw(&server);
        assert_eq!(
            probe.call("A moved 1 0.1"),
            "T moved",
            "granted by the real node"
        );
        assert_eq!(client.addresses(), vec![standby.clone(), active.clone()]);

        // The rotation moved: the next requests go straight to the active.
        assert!(
            client
                .renew_grant(&mut grant.clone(), Duration::from_secs(30))
                .await
                .unwrap()
        );
        assert!(client.release_grant(&grant).await.unwrap());
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "later requests went to the standby"
        );

        let status = client.status().await;
        let roles: Vec<(String, Role)> = status
            .iter()
            .map(|s| (s.addr.clone(), s.status.as_ref().unwrap().role))
            .collect();
        assert_eq!(
            roles,
            vec![(standby, Role::Standby), (active.clone(), Role::Active)]
        );
        assert_eq!(
            status[0].status.as_ref().unwrap().active.as_deref(),
            Some(active.as_str())
        );
    })
    .await;
}

/// A free loopback port (bound and released: another process could take it
/// in between, which is unlikely on a test machine).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_the_cluster_through_a_failover() {
    bounded(async {
        let (a, b) = (free_addr(), free_addr());
        let peers = format!("{a},{b}");
        let io = backend();
        let mut first = common::Server::start_with(&[
            "--listen",
            &a,
            "--peers",
            &peers,
            "--io",
            &io,
            "--cluster-secret-file",
            common::secret_file(),
        ]);
        let _second = common::Server::start_with(&[
            "--listen",
            &b,
            "--peers",
            &peers,
            "--io",
            &io,
            "--cluster-secret-file",
            common::secret_file(),
        ]);
        // The standby first: the client is sent to the active by M.
        let client = Client::connect([b.clone(), a.clone()]).await.unwrap();
        let grant = client
            .acquire("fo/held", Duration::from_secs(60), None)
            .await
            .unwrap()
            .into_grant()
            .unwrap();
        let status = client.status().await;
        let roles: Vec<Role> = status
            .iter()
            .map(|s| s.status.as_ref().unwrap().role)
            .collect();
        assert_eq!(roles, [Role::Standby, Role::Active], "{status:?}");

        // The active dies. The standby takes over with the replicated grant;
        // the client finds it (M key -, then its own answers) by itself.
        first.kill9();
        let started = Instant::now();
        let out = client
            .acquire(
                "fo/held",
                Duration::from_secs(5),
                Some(Duration::from_millis(500)),
            )
            .await
            .unwrap();
        assert_eq!(out, Acquired::TimedOut, "the grant survived the failover");
        let guard = client
            .lock(
                "fo/new",
                Duration::from_secs(5),
                Some(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        assert!(
            guard.token() > grant.token(),
            "tokens keep increasing across the failover"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert!(guard.release().await.unwrap());
        assert!(client.release_grant(&grant).await.unwrap());
    })
    .await;
}

// ---------------------------------------------------------------- hung nodes
//
// A node that is stopped (SIGSTOP) still accepts connections (the kernel
// completes the handshake and queues what is sent), but answers nothing.
// The client must notice (its hello, its liveness probes, its deadlines)
// and never wait without limit.

/// True if `err` is a connection error whose text names `addr`.
fn names(err: &Error, addr: &str) -> bool {
    err.is_connection() && err.to_string().contains(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_ends_an_acquire_by_its_wait_and_a_release_after_5_s() {
    bounded(async {
        let server = common::Server::start(&backend());
        let addr = server.addr.to_string();
        let client = Client::connect([addr.clone()]).await.unwrap();
        eventually("two connections", Duration::from_secs(10), || {
            client.connected() == 2
        })
        .await;
        let held = client
            .acquire("hang/held", Duration::from_secs(60), None)
            .await
            .unwrap()
            .into_grant()
            .unwrap();

        server.signal(libc::SIGSTOP);
        // lock(key, 5 s, wait 2 s): both connections are found dead by
        // their probes (about 1 s each), well within wait + grace (3 s).
        let started = Instant::now();
        let err = client
            .lock(
                "hang/k",
                Duration::from_secs(5),
                Some(Duration::from_secs(2)),
            )
            .await
            .unwrap_err();
        let took = started.elapsed();
        eprintln!("lock on a stopped node: {took:?}: {err}");
        assert!(names(&err, &addr), "{err:?}");
        assert!(took < Duration::from_millis(3500), "{took:?}");

        // A release keeps the contract's 5 s of retries, then errs.
        let started = Instant::now();
        let err = client.release_grant(&held).await.unwrap_err();
        let took = started.elapsed();
        eprintln!("release on a stopped node: {took:?}: {err}");
        assert!(err.is_connection(), "{err:?}");
        assert!(
            took >= Duration::from_millis(4700) && took < Duration::from_millis(6000),
            "{took:?}"
        );
        // An acquire without a wait does not hang either: it tries the
        // connections it has (none live now) and errs.
        let started = Instant::now();
        let err = client
            .acquire("hang/k", Duration::from_secs(5), None)
            .await
            .unwrap_err();
        assert!(err.is_connection(), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );

        // Once the node runs again, the client is back by itself (redial
        // every 3 s), and the grant made before the stop is still there.
        server.signal(libc::SIGCONT);
        let guard = client
            .lock(
                "hang/after",
                Duration::from_secs(5),
                Some(Duration::from_secs(8)),
            )
            .await
            .unwrap();
        assert!(guard.token() > held.token());
        assert!(client.release_grant(&held).await.unwrap());
        assert!(guard.release().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_accepts_and_never_answers_is_no_server() {
    bounded(async {
        // Bound and listening, never accepted: the kernel accepts for it.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let started = Instant::now();
        let err = Client::connect([addr.clone()]).await.unwrap_err();
        let took = started.elapsed();
        eprintln!("connect to a silent listener: {took:?}: {err}");
        assert!(names(&err, &addr), "{err:?}");
        assert!(err.to_string().contains("did not answer"), "{err}");
        assert!(took < Duration::from_secs(2), "{took:?}");

        // Next to a real node, it is simply never used.
        let server = common::Server::start(&backend());
        let client = Client::connect([addr.clone(), server.addr.to_string()])
            .await
            .unwrap();
        for _ in 0..10 {
            let started = Instant::now();
            let guard = client
                .lock(
                    "silent/k",
                    Duration::from_secs(5),
                    Some(Duration::from_secs(1)),
                )
                .await
                .unwrap();
            assert!(started.elapsed() < Duration::from_millis(500));
            assert!(guard.release().await.unwrap());
        }
        assert_eq!(client.connected(), 1);
        drop(silent);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_active_costs_an_acquire_the_failover_plus_the_probe_timeout() {
    bounded(async {
        let c = common::Cluster::start(3, &backend());
        let addrs = c.addr_strings();
        let client = Client::connect(addrs.clone()).await.unwrap();
        eventually("three connections", Duration::from_secs(10), || {
            client.connected() == 3
        })
        .await;
        // A first lock: the client now prefers the active (node 0).
        let first = client
            .lock(
                "stop/k",
                Duration::from_secs(10),
                Some(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        let first_token = first.token();
        assert!(first.release().await.unwrap());
        let mut n0 = c.connect(0);
        let mark = common::Conn::token_of(&n0.call("A stop/mark 60 0"));
        c.wait_token(1, mark, Duration::from_secs(5));

        // The active hangs. An acquire sent to it right away is moved on
        // once its connection is found dead, and granted by the new active.
        c.node(0).signal(libc::SIGSTOP);
        let started = Instant::now();
        let guard = client
            .lock(
                "stop/k",
                Duration::from_secs(10),
                Some(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        let took = started.elapsed();
        eprintln!(
            "{}: SIGSTOP of the active -> grant through the client in {took:?}",
            c.io
        );
        let failover = Duration::from_millis(common::Cluster::PEER_TIMEOUT_MS);
        let bound = failover + conn_probe_timeout() + Duration::from_secs(1);
        assert!(took < bound, "{took:?}, bound {bound:?}");
        assert!(guard.token() > first_token);
        assert!(
            c.status(1).is_some_and(|s| s.is_active()),
            "node 1 took over: {:?}",
            c.status(1)
        );
        assert!(guard.release().await.unwrap());
        // And the following ones do not pay again.
        for _ in 0..5 {
            let started = Instant::now();
            let guard = client
                .lock(
                    "stop/k",
                    Duration::from_secs(10),
                    Some(Duration::from_secs(5)),
                )
                .await
                .unwrap();
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "{:?}",
                started.elapsed()
            );
            assert!(guard.release().await.unwrap());
        }
    })
    .await;
}

/// The client's default probe timeout.
fn conn_probe_timeout() -> Duration {
    ringlock_client::DEFAULT_PROBE_TIMEOUT
}

// ---------------------------------------------------------------- renewing guard

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_guard_is_lost_within_one_lease_when_the_cluster_is_cut_off() {
    bounded(async {
        let c = common::Cluster::start(3, &backend());
        let client = Client::connect(c.addr_strings()).await.unwrap();
        let lease = Duration::from_secs(2);
        let guard = client.lock_renewing("cut/k", lease, None).await.unwrap();
        // A few renewals go through.
        eventually("two renewals", Duration::from_secs(10), || {
            guard.status().renewals >= 2
        })
        .await;
        assert!(!guard.is_lost());
        // Every node stops: nothing can confirm a renewal any more.
        for i in 0..3 {
            c.node(i).signal(libc::SIGSTOP);
        }
        let stopped = Instant::now();
        let lost = timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("the loss is signalled");
        let took = stopped.elapsed();
        eprintln!(
            "{}: cluster stopped -> lock lost signalled in {took:?}: {lost}",
            c.io
        );
        assert!(matches!(lost, LockLost::Expired { .. }), "{lost:?}");
        assert!(guard.is_lost());
        // Within one lease of the stop (the deadline counts from the last
        // confirmed renewal's sending), with a little scheduling slack.
        assert!(took <= lease + Duration::from_millis(300), "{took:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_guard_keeps_its_lock_through_a_handoff_and_a_kill9_failover() {
    bounded(async {
        let mut c = common::Cluster::start(3, &backend());
        let client = Client::connect(c.addr_strings()).await.unwrap();
        let lease = Duration::from_secs(2);
        let guard = client.lock_renewing("keep/k", lease, None).await.unwrap();
        let token = guard.token();
        c.wait_token(1, token, Duration::from_secs(5));
        c.wait_token(2, token, Duration::from_secs(5));

        // Graceful hand-off: SIGTERM of the active.
        let mut n0 = c.take_node(0);
        n0.signal(libc::SIGTERM);
        assert_eq!(
            n0.wait_timeout(Duration::from_secs(10)).map(|s| s.code()),
            Some(Some(0))
        );
        c.wait_settled(1, Duration::from_secs(10));
        // Three leases later the lock is still ours, on node 1.
        tokio::time::sleep(lease * 3).await;
        assert!(!guard.is_lost(), "{:?}", guard.status());
        let mut n1 = c.connect(1);
        assert_eq!(
            n1.call("A keep/k 1 0.1"),
            "T keep/k",
            "still held on node 1"
        );
        let renewals = guard.status().renewals;

        // kill -9 of the new active: node 2 takes over with the grant.
        c.kill9(1);
        c.wait_settled(2, Duration::from_secs(10));
        tokio::time::sleep(lease * 3).await;
        assert!(!guard.is_lost(), "{:?}", guard.status());
        assert!(
            guard.status().renewals >= renewals + 4,
            "{:?}",
            guard.status()
        );
        let mut n2 = c.connect(2);
        assert_eq!(
            n2.call("A keep/k 1 0.1"),
            "T keep/k",
            "still held on node 2"
        );
        assert!(guard.release().await.unwrap());
        let answer = n2.call("A keep/k 1 1");
        assert!(common::Conn::token_of(&answer) > token, "{answer}");
    })
    .await;
}
