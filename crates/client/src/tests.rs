//! Unit tests against in-process fake servers: answer matching, `M`,
//! errors, local queueing, retries. (Tests against the real server are in
//! tests/client.rs.)

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::*;

const LONG: Duration = Duration::from_secs(10);

/// Runs a test body with a 60 s bound, so that a bug hangs nothing.
async fn bounded<F: std::future::Future<Output = ()>>(body: F) {
    timeout(Duration::from_secs(60), body)
        .await
        .expect("test did not finish within 60 s");
}

/// One accepted connection of a fake server, driven by the test.
struct FakeConn {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    wr: OwnedWriteHalf,
}

impl FakeConn {
    fn new(stream: TcpStream) -> FakeConn {
        let (rd, wr) = stream.into_split();
        FakeConn {
            lines: BufReader::new(rd).lines(),
            wr,
        }
    }

    /// The next request line; panics on EOF or after 10 s.
    async fn line(&mut self) -> String {
        timeout(LONG, self.lines.next_line())
            .await
            .expect("a request within 10 s")
            .expect("read")
            .expect("a request, not EOF")
    }

    /// True if nothing arrives within `within`.
    async fn quiet(&mut self, within: Duration) -> bool {
        timeout(within, self.lines.next_line()).await.is_err()
    }

    async fn send(&mut self, line: &str) {
        self.wr
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write answer");
    }
}

/// A listener whose connections the test drives by hand, once each has
/// answered the client's hello (`S`, which every new connection sends
/// before it serves).
async fn fake() -> (String, mpsc::UnboundedReceiver<FakeConn>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let mut conn = FakeConn::new(stream);
            match timeout(LONG, conn.lines.next_line()).await {
                Ok(Ok(Some(hello))) if hello == "S" => conn.send("S active - 0").await,
                _ => continue,
            }
            if tx.send(conn).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

/// A builder for `addr` whose liveness probes never come in these tests
/// (the fakes answer only what the test tells them to; probes are tested
/// in virtual time, in timer_tests.rs).
fn quiet_builder(addr: &str) -> ClientBuilder {
    Client::builder([addr]).probe_interval(Duration::from_secs(3600))
}

async fn accept(conns: &mut mpsc::UnboundedReceiver<FakeConn>) -> FakeConn {
    timeout(LONG, conns.recv())
        .await
        .expect("a connection within 10 s")
        .expect("listener alive")
}

/// A client built by `setup` against a fake server, with its two
/// connections accepted (clients open two per address), and the listener's
/// channel for any later ones.
async fn two_conns(
    setup: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> (
    Client,
    FakeConn,
    FakeConn,
    mpsc::UnboundedReceiver<FakeConn>,
) {
    let (addr, mut conns) = fake().await;
    let client = setup(quiet_builder(&addr)).connect().await.unwrap();
    let a = accept(&mut conns).await;
    let b = accept(&mut conns).await;
    (client, a, b, conns)
}

/// Reads the next request on either of two connections.
async fn line_on_either(a: &mut FakeConn, b: &mut FakeConn) -> (usize, String) {
    tokio::select! {
        l = a.line() => (0, l),
        l = b.line() => (1, l),
    }
}

/// A fake node that answers every request, but in an adversarial order that
/// the protocol allows: each batch of requests read together is answered
/// group by group ((op, key) groups, the newest group first), each group in
/// arrival order. The answers echo the request so that a mismatch shows:
/// `A k LEASE W` is granted with token = LEASE in ms, `R k T` and
/// `N k T L` answer `T % 2`.
async fn reordering_fake() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (rd, mut wr) = stream.into_split();
                let mut rd = BufReader::new(rd);
                loop {
                    let mut batch: Vec<String> = Vec::new();
                    let mut line = String::new();
                    if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    batch.push(line.trim_end().to_string());
                    // Whatever else arrives within a few ms joins the batch.
                    loop {
                        let mut line = String::new();
                        match timeout(Duration::from_millis(5), rd.read_line(&mut line)).await {
                            Ok(Ok(n)) if n > 0 => batch.push(line.trim_end().to_string()),
                            Ok(_) => return,
                            Err(_) => break,
                        }
                    }
                    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
                    for req in batch {
                        let f: Vec<&str> = req.split(' ').collect();
                        let answer = match f[0] {
                            "A" => {
                                let ms = ringlock_proto::parse_seconds(f[2].as_bytes()).unwrap();
                                format!("A {} {ms}", f[1])
                            }
                            "R" => format!("R {} {}", f[1], f[2].parse::<u64>().unwrap() % 2),
                            "N" => format!("N {} {}", f[1], f[2].parse::<u64>().unwrap() % 2),
                            "S" => "S active - 7".to_string(),
                            _ => panic!("bad request {req}"),
                        };
                        let group = format!("{} {}", f[0], f.get(1).unwrap_or(&""));
                        match groups.iter_mut().find(|(g, _)| *g == group) {
                            Some((_, answers)) => answers.push(answer),
                            None => groups.push((group, vec![answer])),
                        }
                    }
                    let mut out = String::new();
                    for (_, answers) in groups.iter().rev() {
                        for a in answers {
                            out.push_str(a);
                            out.push('\n');
                        }
                    }
                    if wr.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_answers_are_matched_by_op_and_key() {
    bounded(async move {
        let addr = reordering_fake().await;
        let client = Client::connect([addr]).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..400u64 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("k{}", i % 7);
                let lease = Duration::from_millis(1000 + i);
                match i % 3 {
                    0 => {
                        let grant = client.acquire(&key, lease, None).await.unwrap();
                        let grant = grant.into_grant().expect("granted");
                        assert_eq!(grant.token(), 1000 + i, "answer went to the wrong acquire");
                        assert_eq!(grant.key(), key.as_bytes());
                    }
                    1 => {
                        let held = client.release(&key, 1000 + i).await.unwrap();
                        assert_eq!(
                            held,
                            (1000 + i) % 2 == 1,
                            "answer went to the wrong release"
                        );
                    }
                    _ => {
                        let held = client.renew(&key, 1000 + i, lease).await.unwrap();
                        assert_eq!(held, (1000 + i) % 2 == 1, "answer went to the wrong renew");
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(client.pending_requests(), 0);
        client.sync().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn m_answers_the_oldest_request_of_its_key_and_is_followed() {
    bounded(async move {
        let (addr1, mut conns1) = fake().await;
        let (addr2, mut conns2) = fake().await;
        let client = quiet_builder(&addr1).connect().await.unwrap();
        let mut a = accept(&mut conns1).await;
        let b = accept(&mut conns1).await;
        // Keep only one connection to node 1, so that both requests share it.
        drop(b.wr);
        drop(b.lines);
        for _ in 0..500 {
            if client.connected() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(client.connected(), 1);

        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(5), None).await });
        assert_eq!(a.line().await, "A k 5 0");
        let c = client.clone();
        let release = tokio::spawn(async move { c.release("k", 9).await });
        assert_eq!(a.line().await, "R k 9");

        // The M answers the acquire (the oldest request of k), not the release.
        a.send(&format!("M k {addr2}")).await;
        a.send("R k 1").await;
        assert!(release.await.unwrap().unwrap());

        // The acquire went to node 2, which the client did not know.
        let mut n2 = accept(&mut conns2).await;
        assert_eq!(n2.line().await, "A k 5 0");
        n2.send("A k 77").await;
        let grant = acquire.await.unwrap().unwrap().into_grant().unwrap();
        assert_eq!(grant.token(), 77);
        assert_eq!(client.addresses(), vec![addr1, addr2]);

        // And the rotation moved: the next request goes to node 2 as well.
        let c = client.clone();
        let renew = tokio::spawn(async move { c.renew("k", 77, Duration::from_secs(5)).await });
        assert_eq!(n2.line().await, "N k 77 5");
        n2.send("N k 1").await;
        assert!(renew.await.unwrap().unwrap());
        assert!(a.quiet(Duration::from_millis(100)).await);
    })
    .await;
}

#[tokio::test]
async fn m_without_active_is_retried_then_gives_up() {
    bounded(async move {
        let no_active = Duration::from_millis(600);
        let (client, mut a, mut b, _conns) = two_conns(|b| b.no_active_timeout(no_active)).await;
        let c = client.clone();
        let started = std::time::Instant::now();
        let acquire = tokio::spawn(async move { c.acquire("k", Duration::from_secs(5), None).await });
        let mut asked = 0;
        loop {
            tokio::select! {
                l = a.line() => { assert_eq!(l, "A k 5 0"); a.send("M k -").await; }
                l = b.line() => { assert_eq!(l, "A k 5 0"); b.send("M k -").await; }
                r = async { while !acquire.is_finished() { tokio::time::sleep(Duration::from_millis(5)).await } } => {
                    let () = r;
                    break;
                }
            }
            asked += 1;
        }
        let result = acquire.await.unwrap();
        assert_eq!(result, Err(Error::NoActiveNode));
        assert!(asked >= 2, "retried after M k - ({asked} tries)");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(500), "gave up too early: {took:?}");
        assert!(took < Duration::from_secs(5), "gave up too late: {took:?}");
    })
    .await;
}

#[tokio::test]
async fn e_answer_and_malformed_lines_are_protocol_errors() {
    bounded(async move {
        for bad in ["E bad lease \"x\" in line 1", "A k zero", "Q what", "A k"] {
            let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
            let c = client.clone();
            let acquire =
                tokio::spawn(async move { c.acquire("k", Duration::from_secs(1), None).await });
            let (which, line) = line_on_either(&mut a, &mut b).await;
            assert_eq!(line, "A k 1 0");
            if which == 0 {
                a.send(bad).await
            } else {
                b.send(bad).await
            }
            let err = acquire.await.unwrap().unwrap_err();
            assert!(err.is_protocol(), "{bad:?} gave {err:?}");
        }
    })
    .await;
}

/// An `M` naming an address with bytes that are not printable ASCII is a
/// malformed answer (a protocol error); one that is printable but not
/// `host:port` is not followed: no slot is added for it, and the acquire
/// asks again where it can (as the Python client does).
#[tokio::test]
async fn junk_addresses_in_m_are_refused() {
    bounded(async move {
        for bad in [
            "M k a\u{1}b:1",
            "M k h\u{7f}:1",
            "M k h\u{e9}:1",
            "M k h\tx:1",
        ] {
            let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
            let c = client.clone();
            let acquire =
                tokio::spawn(async move { c.acquire("k", Duration::from_secs(1), None).await });
            let (which, line) = line_on_either(&mut a, &mut b).await;
            assert_eq!(line, "A k 1 0");
            let conn = if which == 0 { &mut a } else { &mut b };
            conn.send(bad).await;
            let err = acquire.await.unwrap().unwrap_err();
            assert!(err.is_protocol(), "{bad:?} gave {err:?}");
            assert_eq!(
                client.addresses().len(),
                1,
                "{bad:?}: {:?}",
                client.addresses()
            );
        }
        for junk in [
            "nonsense",
            "host:",
            ":80",
            "host:0",
            "host:65536",
            "host:8x",
            "h:+1",
        ] {
            let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
            let given = client.addresses();
            let c = client.clone();
            let acquire =
                tokio::spawn(async move { c.acquire("k", Duration::from_secs(1), None).await });
            let (which, line) = line_on_either(&mut a, &mut b).await;
            assert_eq!(line, "A k 1 0");
            let conn = if which == 0 { &mut a } else { &mut b };
            conn.send(&format!("M k {junk}")).await;
            // Not followed: asked again where the client can.
            let (which, line) = line_on_either(&mut a, &mut b).await;
            assert_eq!(line, "A k 1 0", "{junk}");
            let conn = if which == 0 { &mut a } else { &mut b };
            conn.send("A k 9").await;
            let grant = acquire.await.unwrap().unwrap().into_grant().unwrap();
            assert_eq!(grant.token(), 9);
            assert_eq!(client.addresses(), given, "{junk} was followed");
        }
    })
    .await;
}

#[tokio::test]
async fn an_answer_for_nothing_pending_is_a_protocol_error() {
    bounded(async move {
        let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
        let c = client.clone();
        let release = tokio::spawn(async move { c.release("k", 3).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "R k 3");
        // An N for a key with only an R pending matches nothing.
        let conn = if which == 0 { &mut a } else { &mut b };
        conn.send("N k 1").await;
        assert!(release.await.unwrap().unwrap_err().is_protocol());
    })
    .await;
}

#[tokio::test]
async fn bad_arguments_are_refused_before_sending() {
    bounded(async move {
        let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
        let lease = Duration::from_secs(1);
        let long_key = "x".repeat(251);
        for key in ["", "a b", "a\nb", long_key.as_str()] {
            let err = client.acquire(key, lease, None).await.unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{key:?}: {err:?}");
        }
        let err = client.acquire("k", Duration::ZERO, None).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let err = client
            .acquire("k", Duration::from_micros(999), None)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let err = client
            .acquire("k", Duration::from_secs(86_401), None)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let err = client
            .acquire("k", lease, Some(Duration::from_secs(86_401)))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        assert!(matches!(
            client.release("k", 0).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            client.renew("k", 1, Duration::ZERO).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(a.quiet(Duration::from_millis(50)).await);
        assert!(b.quiet(Duration::from_millis(1)).await);
    })
    .await;
}

#[tokio::test]
async fn binary_keys_and_sub_millisecond_waits() {
    bounded(async move {
        let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
        let c = client.clone();
        let acquire = tokio::spawn(async move {
            c.acquire(
                b"\x80k\xff",
                Duration::from_millis(1500),
                Some(Duration::from_micros(10)),
            )
            .await
        });
        // The line is not UTF-8: read raw bytes.
        let (mut la, mut lb) = (Vec::new(), Vec::new());
        let which = tokio::select! {
            r = a.lines.get_mut().read_until(b'\n', &mut la) => { r.unwrap(); 0 }
            r = b.lines.get_mut().read_until(b'\n', &mut lb) => { r.unwrap(); 1 }
        };
        let line = if which == 0 { la } else { lb };
        // A wait of 10 µs is sent as 1 ms, not as 0 ("no limit").
        assert_eq!(line, b"A \x80k\xff 1.5 0.001\n");
        let conn = if which == 0 { &mut a } else { &mut b };
        conn.wr.write_all(b"T \x80k\xff\n").await.unwrap();
        assert_eq!(acquire.await.unwrap(), Ok(Acquired::TimedOut));
    })
    .await;
}

#[tokio::test]
async fn connect_fails_fast_when_nothing_listens_and_not_when_one_node_is_down() {
    bounded(async move {
        // A port that was just free: nothing listens there.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let started = std::time::Instant::now();
        let err = Client::connect([dead.clone()]).await.unwrap_err();
        assert!(err.is_connection(), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(matches!(
            Client::connect(Vec::<String>::new()).await,
            Err(Error::InvalidArgument(_))
        ));

        let (addr, mut conns) = fake().await;
        let client = Client::builder([dead, addr])
            .probe_interval(Duration::from_secs(3600))
            .connect()
            .await
            .unwrap();
        assert_eq!(client.connections(), 2);
        let mut a = accept(&mut conns).await;
        // Every request goes to the live node.
        for i in 1..=4u64 {
            let c = client.clone();
            let release = tokio::spawn(async move { c.release("k", i).await });
            assert_eq!(a.line().await, format!("R k {i}"));
            a.send("R k 1").await;
            assert!(release.await.unwrap().unwrap());
        }
    })
    .await;
}

#[tokio::test]
async fn waiting_acquires_queue_locally_and_releases_do_not_wait_behind_them() {
    bounded(async move {
        let (client, mut a, mut b, _conns) = two_conns(|b| b.max_waiting_acquires(2)).await;
        let mut acquires = Vec::new();
        for _ in 0..7 {
            let c = client.clone();
            acquires.push(tokio::spawn(async move {
                c.acquire("k", Duration::from_secs(1), None).await
            }));
        }
        // Two per connection reach the server, the rest wait in the client.
        let mut on = [0, 0];
        for _ in 0..4 {
            let (which, line) = line_on_either(&mut a, &mut b).await;
            assert_eq!(line, "A k 1 0");
            on[which] += 1;
        }
        assert_eq!(on, [2, 2]);
        assert!(a.quiet(Duration::from_millis(100)).await);
        assert!(b.quiet(Duration::from_millis(1)).await);

        // A release goes out at once.
        let c = client.clone();
        let release = tokio::spawn(async move { c.release("other", 5).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "R other 5");
        let conn = if which == 0 { &mut a } else { &mut b };
        conn.send("R other 1").await;
        assert!(release.await.unwrap().unwrap());

        // Answering one acquire on a connection lets one more through there.
        a.send("T k").await;
        assert_eq!(a.line().await, "A k 1 0");
    })
    .await;
}

#[tokio::test]
async fn an_acquire_queued_in_the_client_still_keeps_to_its_wait() {
    bounded(async move {
        let (client, mut a, mut b, _conns) = two_conns(|b| b.max_waiting_acquires(1)).await;
        let mut waiting = Vec::new();
        for _ in 0..2 {
            let c = client.clone();
            waiting.push(tokio::spawn(async move {
                c.acquire("k", Duration::from_secs(1), None).await
            }));
        }
        let _ = line_on_either(&mut a, &mut b).await;
        let _ = line_on_either(&mut a, &mut b).await;
        // Both connections are full: this one waits in the client, and its
        // 300 ms wait still runs out on time.
        let started = std::time::Instant::now();
        let out = client
            .acquire(
                "k",
                Duration::from_secs(1),
                Some(Duration::from_millis(300)),
            )
            .await
            .unwrap();
        assert_eq!(out, Acquired::TimedOut);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(290), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(a.quiet(Duration::from_millis(50)).await);
        assert!(b.quiet(Duration::from_millis(1)).await);
    })
    .await;
}

#[tokio::test]
async fn a_grant_for_a_dropped_acquire_is_released() {
    bounded(async move {
        let (client, mut a, mut b, _conns) = two_conns(|b| b).await;
        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(3), None).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "A k 3 0");
        acquire.abort();
        let _ = acquire.await;
        let conn = if which == 0 { &mut a } else { &mut b };
        conn.send("A k 42").await;
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "R k 42");
        let conn = if which == 0 { &mut a } else { &mut b };
        conn.send("R k 1").await;
    })
    .await;
}

#[tokio::test]
async fn an_acquire_cut_off_is_sent_again_on_the_other_connection() {
    bounded(async move {
        let (addr, mut conns) = fake().await;
        let client = quiet_builder(&addr).connect().await.unwrap();
        let mut fakes = vec![accept(&mut conns).await, accept(&mut conns).await];
        let c = client.clone();
        let acquire = tokio::spawn(async move {
            c.acquire("k", Duration::from_secs(3), Some(Duration::from_secs(60)))
                .await
        });
        let (which, line) = {
            let (x, y) = fakes.split_at_mut(1);
            line_on_either(&mut x[0], &mut y[0]).await
        };
        assert_eq!(line, "A k 3 60");
        // Cut that connection: the acquire goes to the other one, with what is
        // left of its wait.
        drop(fakes.remove(which));
        let mut other = fakes.pop().unwrap();
        let line = other.line().await;
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(&f[..3], ["A", "k", "3"], "{line}");
        let wait = ringlock_proto::parse_seconds(f[3].as_bytes()).unwrap();
        assert!((50_000..=60_000).contains(&wait), "{line}");
        other.send("A k 5").await;
        let grant = acquire.await.unwrap().unwrap().into_grant().unwrap();
        assert_eq!(grant.token(), 5);

        // Both connections gone (and the node no longer accepting): the
        // acquire tries every connection it has, then errs.
        drop(conns);
        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(3), None).await });
        assert_eq!(other.line().await, "A k 3 0");
        drop(other);
        let err = acquire.await.unwrap().unwrap_err();
        assert!(err.is_connection(), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn status_and_sync() {
    bounded(async move {
        let (addr, mut conns) = fake().await;
        let client = quiet_builder(&addr).connect().await.unwrap();
        let mut a = accept(&mut conns).await;
        let mut b = accept(&mut conns).await;
        let c = client.clone();
        let sync = tokio::spawn(async move { c.sync().await });
        assert_eq!(a.line().await, "S");
        assert_eq!(b.line().await, "S");
        a.send("S standby 10.0.0.1:7171 12").await;
        assert!(!sync.is_finished());
        b.send("S active - 0").await;
        sync.await.unwrap().unwrap();

        let c = client.clone();
        let status = tokio::spawn(async move { c.status().await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "S");
        let conn = if which == 0 { &mut a } else { &mut b };
        conn.send("S standby 10.0.0.1:7171 12").await;
        let status = status.await.unwrap();
        assert_eq!(
            status,
            vec![AddrStatus {
                addr,
                status: Ok(NodeStatus {
                    role: Role::Standby,
                    active: Some("10.0.0.1:7171".into()),
                    token: 12,
                }),
            }]
        );
    })
    .await;
}

/// A fake node on a free port that answers the hello and then every
/// request line with `answer(line)`.
async fn answering(answer: impl Fn(&str) -> String + Clone + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut conn = FakeConn::new(stream);
                while let Ok(Ok(Some(line))) = timeout(LONG, conn.lines.next_line()).await {
                    let reply = if line == "S" {
                        "S active - 0".to_string()
                    } else {
                        answer(&line)
                    };
                    if conn
                        .wr
                        .write_all(format!("{reply}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Many requests on several threads meet `M` answers naming new nodes at
/// once (the same ones, and ever more of them): the client adds one slot
/// per node (one dial, not one per request), and however many new nodes
/// are named, at most 16.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ms_naming_new_nodes_add_one_slot_each_and_keep_the_cap() {
    bounded(async move {
        let mut targets = Vec::new();
        for _ in 0..24 {
            targets.push(
                answering(|line| {
                    let key = line.split(' ').nth(1).unwrap_or("-");
                    format!("R {key} 1")
                })
                .await,
            );
        }
        let targets = Arc::new(targets);
        let count = Arc::new(AtomicUsize::new(0));
        let (names, n) = (targets.clone(), count.clone());
        let a = answering(move |line| {
            let key = line.split(' ').nth(1).unwrap_or("-");
            let i = n.fetch_add(1, Ordering::Relaxed);
            format!("M {key} {}", names[(i / 3) % names.len()])
        })
        .await;
        for round in 0..100 {
            let client = quiet_builder(&a)
                .release_retries(Duration::from_millis(10), Duration::from_millis(200))
                .connect()
                .await
                .unwrap();
            while client.connected() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut releases = Vec::new();
            for i in 0..96 {
                let c = client.clone();
                releases.push(tokio::spawn(
                    async move { c.release(format!("k{i}"), 5).await },
                ));
            }
            for r in releases {
                let _ = r.await.unwrap();
            }
            let slots = read(&client.inner.slots);
            for target in targets.iter() {
                let mine = slots.iter().filter(|s| &s.addr == target).count();
                assert!(mine <= 1, "round {round}: {mine} slots for {target}");
            }
            let extra = slots.len() - 2;
            assert!(extra <= 16, "round {round}: {extra} slots added");
        }
    })
    .await;
}

/// A server older than owner labels answers `O` with `E` and closes: each
/// connection is dialled again at once without the label, and works.
#[tokio::test]
async fn an_owner_label_refused_by_an_older_server_is_dropped_for_that_address() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, mut conns) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut conn = FakeConn::new(stream);
                    let first = conn.line().await;
                    if first.starts_with("O ") {
                        assert_eq!(first, "O host-a/job-42");
                        assert_eq!(conn.line().await, "S", "the hello goes with the label");
                        conn.send("E unknown op \"O\" in line 1").await;
                        let _ = tx.send(first);
                        return; // dropped: closed
                    }
                    assert_eq!(first, "S");
                    conn.send("S active - 0").await;
                    let _ = tx.send(first);
                    // Answer acquires; keep the connection.
                    loop {
                        let a = conn.line().await;
                        assert_eq!(a, "A k 5 0");
                        conn.send("A k 7").await;
                    }
                });
            }
        });
        let client = quiet_builder(&addr)
            .owner("host-a/job-42")
            .connect()
            .await
            .unwrap();
        let mut firsts = Vec::new();
        for _ in 0..4 {
            firsts.push(timeout(LONG, conns.recv()).await.unwrap().unwrap());
        }
        firsts.sort();
        assert_eq!(firsts, ["O host-a/job-42", "O host-a/job-42", "S", "S"]);
        match client.acquire("k", Duration::from_secs(5), None).await {
            Ok(Acquired::Granted(grant)) => assert_eq!(grant.token(), 7),
            other => panic!("{other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn a_bad_owner_label_is_refused_before_any_connection() {
    for bad in ["", "-", "a b", "caf\u{e9}", &"x".repeat(129)] {
        let err = Client::builder(["127.0.0.1:1"]).owner(bad).connect().await;
        assert!(matches!(err, Err(Error::InvalidArgument(_))), "{bad:?}");
    }
}

/// `list_locks` asks with `V`; a server older than `V` answers `E`, and the
/// page is asked again with `W` (its locks without kinds); one older than
/// `W` too is asked with `L`, its locks without holders.
#[tokio::test]
async fn the_listing_falls_back_to_w_and_l_on_older_servers() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            // Older than `W`: V, W, L.
            for (op, refused) in [("V", true), ("W", true), ("L", false)] {
                let (s, _) = listener.accept().await.unwrap();
                let mut c = FakeConn::new(s);
                assert_eq!(c.line().await, format!("{op} 0 5 p/"));
                if refused {
                    c.send(&format!("E unknown op \"{op}\" in line 1")).await;
                } else {
                    c.send("K p/a 7 1500 2").await;
                    c.send("L 0").await;
                }
            }
            // Older than `V`: V, W.
            let (s, _) = listener.accept().await.unwrap();
            let mut v = FakeConn::new(s);
            assert_eq!(v.line().await, "V 0 5 p/");
            v.send("E unknown op \"V\" in line 1").await;
            drop(v);
            let (s, _) = listener.accept().await.unwrap();
            let mut w = FakeConn::new(s);
            assert_eq!(w.line().await, "W 0 5 p/");
            w.send("K p/a 7 1500 2 300 10.0.0.1:5 o/1").await;
            w.send("W 0").await;
            // Knows `V`.
            let (s, _) = listener.accept().await.unwrap();
            let mut v = FakeConn::new(s);
            assert_eq!(v.line().await, "V 3 5 p/");
            v.send("K p/a 7 1500 2 300 10.0.0.1:5 o/1 semaphore 4 2")
                .await;
            v.send("K p/b 8 900 0 20 10.0.0.1:6 - shared 0 3").await;
            v.send("V 0").await;
        });
        let (old, cursor) = list_locks(&addr, b"p/", 0, 5, LONG).await.unwrap();
        assert_eq!(cursor, 0);
        assert_eq!(
            old,
            [LockInfo {
                key: b"p/a".to_vec(),
                token: 7,
                lease_ms: 1500,
                waiters: 2,
                holder: None,
                kind: None,
            }]
        );
        let (who, _) = list_locks(&addr, b"p/", 0, 5, LONG).await.unwrap();
        let holder = HolderInfo {
            addr: Some("10.0.0.1:5".into()),
            owner: Some("o/1".into()),
            for_ms: 300,
        };
        assert_eq!(who[0].holder, Some(holder.clone()));
        assert_eq!(who[0].kind, None);
        let (kinds, _) = list_locks(&addr, b"p/", 3, 5, LONG).await.unwrap();
        assert_eq!(kinds.len(), 2);
        assert_eq!(kinds[0].holder, Some(holder));
        let kind = |held, limit, holders| {
            Some(KindInfo {
                held,
                limit,
                holders,
            })
        };
        assert_eq!(kinds[0].kind, kind(Held::Semaphore, 4, 2));
        assert_eq!(kinds[1].kind, kind(Held::Shared, 0, 3));
    })
    .await;
}
