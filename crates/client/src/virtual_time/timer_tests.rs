//! The client's timer logic in virtual time (tokio's paused clock):
//! liveness probes, acquire deadlines, release retries, renewals. The fake
//! nodes sit on in-memory streams, so the clock moves only when every task
//! waits on a timer: these tests take milliseconds, and their timings are
//! exact (to the millisecond of tokio's timer) instead of flaky.
//! They need tokio's `test-util` feature, enabled for tests only (Cargo.toml's
//! dev-dependencies).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::Mutex as StdMutex;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};

use crate::conn::{ReadHalf as ClientRead, WriteHalf as ClientWrite};
use crate::*;

/// What a fake node does with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Answers the hello, then hands the connection to the test.
    Serve,
    /// Accepts and never answers (a stopped process: the kernel accepts).
    Hung,
    /// Refuses the connection.
    Refuse,
    /// Never completes the connect (a black hole: SYNs dropped).
    BlackHole,
}

#[derive(Default)]
struct NetState {
    modes: HashMap<String, Mode>,
    peers: HashMap<String, mpsc::UnboundedSender<Peer>>,
    /// Far ends of hung connections, kept so that they stay open.
    hung: Vec<DuplexStream>,
    /// Every dial: when, and to what.
    dials: Vec<(Instant, String)>,
}

/// A fake network of fake nodes, reached through the client's dialer.
#[derive(Clone, Default)]
pub(super) struct Net(Arc<StdMutex<NetState>>);

impl Net {
    /// A node at `addr` in mode `Serve`; its accepted connections come out
    /// of the returned channel.
    pub(super) fn node(&self, addr: &str) -> mpsc::UnboundedReceiver<Peer> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.0.lock().unwrap();
        st.modes.insert(addr.to_string(), Mode::Serve);
        st.peers.insert(addr.to_string(), tx);
        rx
    }

    pub(super) fn set_mode(&self, addr: &str, mode: Mode) {
        self.0.lock().unwrap().modes.insert(addr.to_string(), mode);
    }

    pub(super) fn dials(&self, addr: &str) -> Vec<Instant> {
        let st = self.0.lock().unwrap();
        st.dials
            .iter()
            .filter(|(_, a)| a == addr)
            .map(|(t, _)| *t)
            .collect()
    }

    fn dialer(&self) -> Dialer {
        let net = self.clone();
        Arc::new(move |addr: &str| {
            let net = net.clone();
            let addr = addr.to_string();
            Box::pin(async move {
                let (mode, peers) = {
                    let mut st = net.0.lock().unwrap();
                    st.dials.push((Instant::now(), addr.clone()));
                    (st.modes.get(&addr).copied(), st.peers.get(&addr).cloned())
                };
                let (Some(mode), Some(peers)) = (mode, peers) else {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "no such node",
                    ));
                };
                if mode == Mode::Refuse {
                    return Err(io::Error::new(io::ErrorKind::ConnectionRefused, "refused"));
                }
                if mode == Mode::BlackHole {
                    return std::future::pending().await;
                }
                let (near, far) = tokio::io::duplex(64 * 1024);
                match mode {
                    Mode::Hung => net.0.lock().unwrap().hung.push(far),
                    _ => {
                        tokio::spawn(async move {
                            let mut peer = Peer::new(&addr, far);
                            if peer.next().await.as_deref() == Some("S") {
                                peer.send("S active - 0").await;
                                let _ = peers.send(peer);
                            }
                        });
                    }
                }
                let (rd, wr) = tokio::io::split(near);
                Ok((Box::new(rd) as ClientRead, Box::new(wr) as ClientWrite))
            })
        })
    }

    /// A client of `addrs` on this network.
    pub(super) async fn client(
        &self,
        addrs: &[&str],
        setup: impl FnOnce(ClientBuilder) -> ClientBuilder,
    ) -> Client {
        setup(Client::builder(addrs.iter().copied()).dialer(self.dialer()))
            .connect()
            .await
            .expect("the client connects")
    }
}

/// The far end of one connection, driven by the test.
pub(super) struct Peer {
    addr: String,
    rd: BufReader<ReadHalf<DuplexStream>>,
    wr: WriteHalf<DuplexStream>,
}

impl Peer {
    fn new(addr: &str, stream: DuplexStream) -> Peer {
        let (rd, wr) = tokio::io::split(stream);
        Peer {
            addr: addr.to_string(),
            rd: BufReader::new(rd),
            wr,
        }
    }

    /// The next request line, `None` at end of file.
    pub(super) async fn next(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.rd.read_line(&mut line).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end_matches('\n').to_string()),
        }
    }

    /// The next request line; panics at end of file, or if none comes
    /// within an hour of virtual time (a bug must fail a test, not spin it
    /// through virtual time for ever).
    pub(super) async fn line(&mut self) -> String {
        let addr = self.addr.clone();
        timeout(HOUR, self.next())
            .await
            .unwrap_or_else(|_| panic!("{addr}: no request within an hour"))
            .unwrap_or_else(|| panic!("{addr}: closed, a request was expected"))
    }

    pub(super) async fn send(&mut self, line: &str) {
        let _ = self.wr.write_all(format!("{line}\n").as_bytes()).await;
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.wr.write_all(bytes).await;
    }

    /// Answers every request with `answer(line)` (nothing for `None`) until
    /// the client closes; each request is logged with its time.
    pub(super) fn serve(
        mut self,
        log: Arc<StdMutex<Vec<(Instant, String)>>>,
        mut answer: impl FnMut(&str) -> Option<String> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(line) = self.next().await {
                log.lock().unwrap().push((Instant::now(), line.clone()));
                if let Some(a) = answer(&line) {
                    self.send(&a).await;
                }
            }
        })
    }
}

pub(super) type Log = Arc<StdMutex<Vec<(Instant, String)>>>;

pub(super) fn lines_of(log: &Log, prefix: &str) -> Vec<(Instant, String)> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(_, l)| l.starts_with(prefix))
        .cloned()
        .collect()
}

pub(super) async fn accept(rx: &mut mpsc::UnboundedReceiver<Peer>) -> Peer {
    timeout(HOUR, rx.recv())
        .await
        .expect("a connection")
        .expect("the network is alive")
}

/// Reads the next line on either peer: (which, line).
async fn line_on_either(a: &mut Peer, b: &mut Peer) -> (usize, String) {
    tokio::select! {
        l = a.line() => (0, l),
        l = b.line() => (1, l),
    }
}

/// `d` is within `[at, at + 3 ms]`: tokio's timers fire on whole
/// milliseconds, never early.
pub(super) fn about(d: Duration, at: Duration) -> bool {
    d >= at && d <= at + Duration::from_millis(3)
}

pub(super) const MS: Duration = Duration::from_millis(1);

/// Runs a test body with a bound of an hour of virtual time, so that a bug
/// fails the test instead of spinning it through virtual time for ever.
pub(super) async fn bounded<F: Future<Output = ()>>(body: F) {
    timeout(HOUR, body)
        .await
        .expect("the test did not finish within an hour of virtual time");
}
const HOUR: Duration = Duration::from_secs(3600);

// ------------------------------------------------------------------ liveness

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_probed_then_closed_and_its_acquire_moves_on() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let mut a = accept(&mut conns).await;
        let mut b = accept(&mut conns).await;

        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(5), None).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "A k 5 0");
        let t0 = Instant::now();
        let (mut hung, mut other) = if which == 0 { (a, b) } else { (b, a) };
        // Nothing comes back: after the probe interval, a probe.
        assert_eq!(hung.line().await, "S");
        assert!(
            about(t0.elapsed(), 500 * MS),
            "probed after {:?}",
            t0.elapsed()
        );
        // Still nothing: after the probe timeout the connection is closed...
        assert_eq!(hung.next().await, None);
        assert!(
            about(t0.elapsed(), 1000 * MS),
            "closed after {:?}",
            t0.elapsed()
        );
        // ... and the acquire is sent again on the other one.
        assert_eq!(other.line().await, "A k 5 0");
        assert!(
            about(t0.elapsed(), 1000 * MS),
            "moved after {:?}",
            t0.elapsed()
        );
        other.send("A k 7").await;
        let grant = acquire.await.unwrap().unwrap().into_grant().unwrap();
        assert_eq!(grant.token(), 7);
        assert_eq!(client.connected(), 1);

        // The dead connection is redialled as any dropped one: 3 s after its
        // previous dial.
        let redial = accept(&mut conns).await;
        let dials = net.dials("n:1");
        assert_eq!(dials.len(), 3, "{dials:?}");
        assert!(
            about(dials[2] - dials[0], 3000 * MS),
            "redialled {:?} after the first dial",
            dials[2] - dials[0]
        );
        drop(redial);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_request_on_a_quiet_connection_goes_out_with_a_probe() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let mut a = accept(&mut conns).await;
        let mut b = accept(&mut conns).await;
        // (Redials are not answered: only these two connections serve.)
        net.set_mode("n:1", Mode::Hung);
        // Quiet for a while: the node may have hung meanwhile.
        sleep(Duration::from_secs(10)).await;
        let c = client.clone();
        let release = tokio::spawn(async move { c.release("k", 9).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "R k 9");
        let t0 = Instant::now();
        let (mut hung, mut other) = if which == 0 { (a, b) } else { (b, a) };
        // The probe goes right behind the request...
        assert_eq!(hung.line().await, "S");
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // ... so a hung node is found out after the probe timeout alone.
        assert_eq!(hung.next().await, None);
        assert!(about(t0.elapsed(), 500 * MS), "{:?}", t0.elapsed());
        // The release is retried 200 ms later on the other connection
        // (quiet too: probed along with it, and answered).
        assert_eq!(other.line().await, "R k 9");
        assert!(about(t0.elapsed(), 700 * MS), "{:?}", t0.elapsed());
        other.send("R k 1").await;
        assert_eq!(other.line().await, "S");
        other.send("S active - 0").await;
        assert!(release.await.unwrap().unwrap());
        // A busy connection is not probed while answers flow.
        for i in 0..10 {
            let c = client.clone();
            let release = tokio::spawn(async move { c.release("k", 10 + i).await });
            assert_eq!(other.line().await, format!("R k {}", 10 + i));
            other.send("R k 0").await;
            assert!(!release.await.unwrap().unwrap());
            sleep(100 * MS).await;
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_node_that_answers_probes_keeps_an_acquire_waiting_for_ever() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let log: Log = Arc::default();
        for _ in 0..2 {
            // A live node with the key held: probes are answered, the acquire
            // waits.
            accept(&mut conns).await.serve(log.clone(), |line| {
                (line == "S").then(|| "S active - 0".to_string())
            });
        }
        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(5), None).await });
        sleep(Duration::from_secs(600)).await;
        assert!(
            !acquire.is_finished(),
            "gave up on a live node: {:?}",
            acquire.await
        );
        assert_eq!(lines_of(&log, "A ").len(), 1, "sent once, never moved");
        let probes = lines_of(&log, "S").len();
        // One probe per 500 ms of silence on the one busy connection.
        assert!((1190..=1201).contains(&probes), "{probes} probes in 600 s");
        assert_eq!(client.connected(), 2);
        assert_eq!(client.pending_requests(), 1, "probes are not counted");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn answers_of_any_kind_keep_a_busy_connection_alive() {
    bounded(async move {
        // One live connection (the second node refuses), so that every request
        // goes over it.
        let net = Net::default();
        let mut conns = net.node("n:1");
        let _m = net.node("m:1");
        net.set_mode("m:1", Mode::Refuse);
        let client = net.client(&["n:1", "m:1"], |b| b).await;
        let mut busy = accept(&mut conns).await;
        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("slow", Duration::from_secs(5), None).await });
        assert_eq!(busy.line().await, "A slow 5 0");
        // Every 400 ms the node answers something else (a release of another
        // key): never 500 ms of silence, so never a probe.
        for i in 1..=20u64 {
            sleep(400 * MS).await;
            let c = client.clone();
            let release = tokio::spawn(async move { c.release("other", i).await });
            assert_eq!(
                busy.line().await,
                format!("R other {i}"),
                "no probe expected"
            );
            busy.send("R other 0").await;
            assert!(!release.await.unwrap().unwrap());
        }
        assert!(!acquire.is_finished());
        // Then silence: probed 500 ms after the last answer.
        let quiet_from = Instant::now();
        assert_eq!(busy.line().await, "S");
        assert!(
            about(quiet_from.elapsed(), 500 * MS),
            "{:?}",
            quiet_from.elapsed()
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_node_that_accepts_but_does_not_answer_never_serves() {
    bounded(async move {
        let net = Net::default();
        let _conns = net.node("hung:1");
        net.set_mode("hung:1", Mode::Hung);
        let started = Instant::now();
        let err = Client::builder(["hung:1"])
            .dialer(net.dialer())
            .connect()
            .await
            .unwrap_err();
        assert!(
            about(started.elapsed(), 500 * MS),
            "{:?}",
            started.elapsed()
        );
        assert!(err.is_connection(), "{err:?}");
        assert!(
            err.to_string()
                .contains("hung:1 accepted the connection but did not answer S"),
            "{err}"
        );

        // With a live node next to it, everything goes to the live one.
        let mut live = net.node("live:1");
        let client = net.client(&["hung:1", "live:1"], |b| b).await;
        let log: Log = Arc::default();
        accept(&mut live).await.serve(log.clone(), |line| {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "A" => Some(format!("A {} 9", f[1])),
                "R" => Some(format!("R {} 1", f[1])),
                _ => Some("S active live:1 0".into()),
            }
        });
        for _ in 0..5 {
            let guard = client
                .lock("k", Duration::from_secs(5), Some(Duration::from_secs(1)))
                .await
                .unwrap();
            assert!(guard.release().await.unwrap());
        }
        assert_eq!(client.connected(), 1);
        assert_eq!(lines_of(&log, "A k").len(), 5);
    })
    .await;
}

// ------------------------------------------------------------------ deadlines

/// A client of one node whose two connections answered the hello and then
/// hang (a node stopped after the client connected).
async fn hung_after_connect(
    setup: impl FnOnce(ClientBuilder) -> ClientBuilder,
) -> (Net, Client, Vec<Peer>) {
    let net = Net::default();
    let mut conns = net.node("n:1");
    let client = net.client(&["n:1"], setup).await;
    let peers = vec![accept(&mut conns).await, accept(&mut conns).await];
    net.set_mode("n:1", Mode::Hung);
    (net, client, peers)
}

#[tokio::test(start_paused = true)]
async fn an_acquire_on_a_hung_node_ends_within_its_wait_with_an_error_naming_it() {
    bounded(async move {
        let (_net, client, _peers) = hung_after_connect(|b| b).await;
        let started = Instant::now();
        let err = client
            .lock("k", Duration::from_secs(5), Some(Duration::from_secs(2)))
            .await
            .unwrap_err();
        // The first connection dies by its probe 1 s after the acquire was
        // sent (500 ms of silence, 500 ms without an answer); the second,
        // quiet for longer than the probe interval by then, is probed along
        // with the acquire and dies 500 ms later.
        assert!(
            about(started.elapsed(), 1500 * MS),
            "{:?}",
            started.elapsed()
        );
        assert!(err.is_connection(), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("n:1 stopped answering"), "{text}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_acquire_without_a_wait_still_fails_over_and_then_errs() {
    bounded(async move {
        let (_net, client, _peers) = hung_after_connect(|b| b).await;
        let started = Instant::now();
        let err = client
            .acquire("k", Duration::from_secs(5), None)
            .await
            .unwrap_err();
        assert!(
            about(started.elapsed(), 1500 * MS),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.to_string().contains("2 connection(s) in a row"),
            "{err}"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_acquire_ends_by_its_wait_plus_grace_even_without_liveness() {
    bounded(async move {
        // Probes off: the deadline alone ends the call.
        let (_net, client, _peers) =
            hung_after_connect(|b| b.probe_interval(Duration::from_secs(3600))).await;
        let started = Instant::now();
        let err = client
            .acquire("k", Duration::from_secs(5), Some(Duration::from_secs(2)))
            .await
            .unwrap_err();
        assert!(
            about(started.elapsed(), 3000 * MS),
            "{:?}",
            started.elapsed()
        );
        let text = err.to_string();
        assert!(
            text.contains("n:1 did not answer the acquire of k within 3s"),
            "{text}"
        );

        // Tunable.
        let (_net, client, _peers) = hung_after_connect(|b| {
            b.probe_interval(Duration::from_secs(3600))
                .acquire_grace(Duration::from_millis(250))
        })
        .await;
        let started = Instant::now();
        let _ = client
            .acquire(
                "k",
                Duration::from_secs(5),
                Some(Duration::from_millis(100)),
            )
            .await
            .unwrap_err();
        assert!(
            about(started.elapsed(), 350 * MS),
            "{:?}",
            started.elapsed()
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_runs_out_between_attempts_says_why() {
    bounded(async move {
        // The node answers M k - (no active node) for ever: a 300 ms acquire
        // keeps asking through its grace (room for one failover) and ends
        // by its wait plus the grace with NoActiveNode, not with a TimedOut
        // nobody said.
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let log: Log = Arc::default();
        for _ in 0..2 {
            accept(&mut conns).await.serve(log.clone(), |line| {
                let f: Vec<&str> = line.split(' ').collect();
                Some(match f[0] {
                    "S" => "S standby - 0".into(),
                    _ => format!("M {} -", f[1]),
                })
            });
        }
        let started = Instant::now();
        let out = client
            .acquire("k", Duration::from_secs(5), Some(300 * MS))
            .await;
        assert_eq!(out, Err(Error::NoActiveNode));
        assert!(
            started.elapsed() <= 1300 * MS + 10 * MS,
            "{:?}",
            started.elapsed()
        );
        assert!(
            lines_of(&log, "A k 5 ")
                .iter()
                .any(|(at, _)| *at >= started + 300 * MS),
            "no attempt after the wait ran out: a redirect decided nothing"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_release_on_a_hung_node_retries_for_5_s_then_errs() {
    bounded(async move {
        let (net, client, _peers) = hung_after_connect(|b| b).await;
        let started = Instant::now();
        let err = client.release("k", 42).await.unwrap_err();
        let took = started.elapsed();
        // The contract's 5 s of retries, every 200 ms: never more.
        assert!(took >= 4800 * MS && took <= 5000 * MS, "{took:?}");
        assert!(err.is_connection(), "{err:?}");
        assert!(err.to_string().contains("release gave up"), "{err}");
        // Redials meanwhile, every 3 s at most per connection.
        let dials = net.dials("n:1");
        assert!(dials.len() <= 4, "{dials:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn each_release_attempt_is_bounded_and_retried_elsewhere() {
    bounded(async move {
        // One connection swallows requests but answers probes (a node that is
        // alive but loses this request): the attempt ends after the request
        // timeout and the retry, 200 ms later, lands on the other connection.
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net
            .client(&["n:1"], |b| b.request_timeout(Duration::from_millis(700)))
            .await;
        let mut a = accept(&mut conns).await;
        let mut b = accept(&mut conns).await;
        let c = client.clone();
        let started = Instant::now();
        let release = tokio::spawn(async move { c.release("k", 5).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "R k 5");
        let (mut deaf, mut good) = if which == 0 { (a, b) } else { (b, a) };
        tokio::spawn(async move {
            while let Some(line) = deaf.next().await {
                if line == "S" {
                    deaf.send("S active - 0").await;
                }
            }
        });
        assert_eq!(good.line().await, "R k 5");
        assert!(
            about(started.elapsed(), 900 * MS),
            "{:?}",
            started.elapsed()
        );
        good.send("R k 1").await;
        assert!(release.await.unwrap().unwrap());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn sync_and_status_are_bounded() {
    bounded(async move {
        let (_net, client, _peers) =
            hung_after_connect(|b| b.probe_interval(Duration::from_secs(3600))).await;
        let started = Instant::now();
        let err = client.sync().await.unwrap_err();
        assert!(
            about(started.elapsed(), 2000 * MS),
            "{:?}",
            started.elapsed()
        );
        assert!(err.to_string().contains("did not answer S within"), "{err}");
        let started = Instant::now();
        let status = client.status().await;
        assert!(
            about(started.elapsed(), 2000 * MS),
            "{:?}",
            started.elapsed()
        );
        assert!(status[0].status.is_err(), "{status:?}");
    })
    .await;
}

// ------------------------------------------------------------------ renewals

/// A node that grants `A k ...` with token 5 and answers renewals with the
/// next of `renewals` (nothing once they run out), logging every request.
async fn renewing_node(renewals: Vec<&'static str>) -> (Net, Client, Log) {
    let net = Net::default();
    let mut conns = net.node("n:1");
    let client = net.client(&["n:1"], |b| b).await;
    let log: Log = Arc::default();
    let renewals = Arc::new(StdMutex::new(VecDeque::from(renewals)));
    for _ in 0..2 {
        let renewals = renewals.clone();
        accept(&mut conns).await.serve(log.clone(), move |line| {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "A" => Some(format!("A {} 5", f[1])),
                "N" => renewals.lock().unwrap().pop_front().map(str::to_string),
                "R" => Some(format!("R {} 1", f[1])),
                _ => Some("S active n:1 0".into()),
            }
        });
    }
    (net, client, log)
}

use std::collections::VecDeque;

#[tokio::test(start_paused = true)]
async fn a_renewing_guard_renews_at_a_third_of_the_lease_until_refused() {
    bounded(async move {
        let (_net, client, log) = renewing_node(vec!["N k 1", "N k 1", "N k 0"]).await;
        let t0 = Instant::now();
        let guard = client
            .lock_renewing("k", Duration::from_secs(3), None)
            .await
            .unwrap();
        assert!(!guard.is_lost());
        let lost = guard.lost().await;
        assert_eq!(lost, LockLost::Refused);
        assert!(about(t0.elapsed(), 3000 * MS), "{:?}", t0.elapsed());
        let renewals = lines_of(&log, "N k 5 3");
        let at: Vec<Duration> = renewals.iter().map(|(t, _)| *t - t0).collect();
        assert_eq!(at.len(), 3, "{at:?}");
        for (i, t) in at.iter().enumerate() {
            assert!(
                about(*t, (i as u32 + 1) * 1000 * MS),
                "renewal {i} at {t:?}"
            );
        }
        let status = guard.status();
        assert_eq!(status.renewals, 2);
        assert!(guard.is_lost());
        // Nothing more is sent once lost.
        sleep(Duration::from_secs(10)).await;
        assert_eq!(lines_of(&log, "N ").len(), 3);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_renewing_guard_is_lost_within_one_lease_when_nothing_answers() {
    bounded(async move {
        // Renewals are confirmed twice, then the node hangs: no more answers,
        // and new connections are not answered either.
        let (net, client, log) = renewing_node(vec!["N k 1", "N k 1"]).await;
        let guard = client
            .lock_renewing("k", Duration::from_secs(3), None)
            .await
            .unwrap();
        let watch = guard.watch();
        let waiter = tokio::spawn(async move { watch.lost().await });
        sleep(Duration::from_millis(2500)).await;
        net.set_mode("n:1", Mode::Hung);
        let last_confirmed = lines_of(&log, "N k 5 3")[1].0;
        let lost = guard.lost().await;
        let after = last_confirmed.elapsed();
        // The deadline counts from when the last confirmed renewal was sent.
        assert!(
            about(after, 3000 * MS),
            "lost {after:?} after the last confirmed renewal"
        );
        match &lost {
            LockLost::Expired { last_error } => {
                assert!(last_error.is_some(), "{lost:?}");
            }
            other => panic!("expected Expired, got {other:?}"),
        }
        assert_eq!(waiter.await.unwrap(), Some(lost));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_short_lease_is_lost_when_it_runs_out_not_a_request_timeout_later() {
    bounded(async move {
        // A 1.2 s lease, shorter than the request timeout (2 s) plus a third
        // of the lease: the first renewal (at 400 ms) is never answered, and
        // the loss is signalled when the lease could have run out, 1.2 s
        // after the acquire was sent, not 2 s after the renewal.
        let (_net, client, log) = renewing_node(vec![]).await;
        let t0 = Instant::now();
        let guard = client
            .lock_renewing("k", Duration::from_millis(1200), None)
            .await
            .unwrap();
        let lost = guard.lost().await;
        let sent = lines_of(&log, "A k ")[0].0;
        assert!(
            about(sent - t0, Duration::ZERO),
            "the acquire went out at {:?}",
            sent - t0
        );
        assert!(
            about(sent.elapsed(), 1200 * MS),
            "lost {:?} after the acquire was sent",
            sent.elapsed()
        );
        assert!(matches!(lost, LockLost::Expired { .. }), "{lost:?}");
        let renewals = lines_of(&log, "N k 5 ");
        assert!(!renewals.is_empty(), "no renewal was sent");
        assert!(
            about(renewals[0].0 - sent, 400 * MS),
            "first renewal at {:?}",
            renewals[0].0 - sent
        );
    })
    .await;
}

/// A node whose two connections answer the acquire `A k 5` after `delay`
/// (a grant that waited in the queue) and never answer renewals; the guard
/// and the log of what the node received.
async fn queued_grant_then_silence(lease: Duration, delay: Duration) -> (RenewingGuard, Log) {
    let net = Net::default();
    let mut conns = net.node("n:1");
    let client = net.client(&["n:1"], |b| b).await;
    let mut a = accept(&mut conns).await;
    let mut b = accept(&mut conns).await;
    let c = client.clone();
    let lock = tokio::spawn(async move { c.lock_renewing("k", lease, None).await });
    let (which, line) = line_on_either(&mut a, &mut b).await;
    let log: Log = Arc::default();
    log.lock().unwrap().push((Instant::now(), line));
    let peer = if which == 0 { &mut a } else { &mut b };
    // The node answers probes while the acquire waits, as a live node does.
    let until = Instant::now() + delay;
    while let Ok(line) = tokio::time::timeout_at(until, peer.line()).await {
        assert_eq!(line, "S", "only probes while the acquire waits");
        peer.send("S active n:1 0").await;
    }
    peer.send("A k 5").await;
    let guard = lock.await.unwrap().unwrap();
    for peer in [a, b] {
        peer.serve(log.clone(), |line| {
            (line == "S").then(|| "S active n:1 0".to_string())
        });
    }
    (guard, log)
}

#[tokio::test(start_paused = true)]
async fn a_queued_grant_of_a_short_lease_gets_a_third_of_it_for_its_first_renewal() {
    bounded(async move {
        // Granted 5 s after the acquire was sent: its deadline (counted
        // from the sending) is long past. It is renewed at once, and that
        // renewal has a third of the 1.2 s lease (shorter than the request
        // timeout) to be confirmed.
        let (guard, log) =
            queued_grant_then_silence(Duration::from_millis(1200), Duration::from_secs(5)).await;
        let granted = Instant::now();
        let lost = guard.lost().await;
        assert!(
            about(granted.elapsed(), 400 * MS),
            "lost {:?} after the grant",
            granted.elapsed()
        );
        assert!(matches!(lost, LockLost::Expired { .. }), "{lost:?}");
        let renewals = lines_of(&log, "N k 5 ");
        assert!(about(renewals[0].0 - granted, Duration::ZERO));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_grant_of_a_long_lease_gets_a_request_timeout_for_its_first_renewal() {
    bounded(async move {
        // Granted 20 s after the acquire was sent, with a 9 s lease: renewed
        // at once, and that renewal has the request timeout (2 s, shorter
        // than a third of the lease) to be confirmed.
        let (guard, _log) =
            queued_grant_then_silence(Duration::from_secs(9), Duration::from_secs(20)).await;
        let granted = Instant::now();
        let lost = guard.lost().await;
        assert!(
            about(granted.elapsed(), 2000 * MS),
            "lost {:?} after the grant",
            granted.elapsed()
        );
        assert!(matches!(lost, LockLost::Expired { .. }), "{lost:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_renewing_guard_moves_to_another_connection_when_one_drops() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let mut a = accept(&mut conns).await;
        let mut b = accept(&mut conns).await;
        let c = client.clone();
        let lock =
            tokio::spawn(async move { c.lock_renewing("k", Duration::from_secs(3), None).await });
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "A k 3 0");
        if which == 0 {
            a.send("A k 5").await
        } else {
            b.send("A k 5").await
        }
        let guard = lock.await.unwrap().unwrap();
        let (which, line) = line_on_either(&mut a, &mut b).await;
        assert_eq!(line, "N k 5 3");
        // The connection that carried the renewal drops: it is sent again.
        let mut other = if which == 0 {
            drop(a);
            b
        } else {
            drop(b);
            a
        };
        assert_eq!(other.line().await, "N k 5 3");
        other.send("N k 1").await;
        sleep(Duration::from_millis(10)).await;
        let status = guard.status();
        assert_eq!(status.renewals, 1);
        assert!(!guard.is_lost());
        assert!(status.failed_attempts >= 1);
        assert_eq!(status.last_error, None, "cleared by the confirmed renewal");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn dropping_a_renewing_guard_stops_renewing_and_releases() {
    bounded(async move {
        let (_net, client, log) = renewing_node(vec!["N k 1"; 100]).await;
        let guard = client
            .lock_renewing("k", Duration::from_secs(3), None)
            .await
            .unwrap();
        sleep(Duration::from_millis(1500)).await;
        drop(guard);
        sleep(Duration::from_secs(10)).await;
        assert_eq!(lines_of(&log, "N ").len(), 1);
        assert_eq!(lines_of(&log, "R k 5").len(), 1);
    })
    .await;
}

// ------------------------------------------------------------------ try-lock

#[tokio::test(start_paused = true)]
async fn try_lock_asks_once_with_the_shortest_wait() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let log: Log = Arc::default();
        for _ in 0..2 {
            accept(&mut conns).await.serve(log.clone(), |line| {
                let f: Vec<&str> = line.split(' ').collect();
                Some(match f[0] {
                    "A" if f[1] == "free" => "A free 3".into(),
                    "A" => format!("T {}", f[1]),
                    _ => "S active - 0".into(),
                })
            });
        }
        assert!(
            client
                .try_lock("held", Duration::from_secs(5))
                .await
                .unwrap()
                .is_none()
        );
        let guard = client
            .try_lock("free", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(guard.map(|g| g.into_grant().token()), Some(3));
        let sent: Vec<String> = lines_of(&log, "A ").into_iter().map(|(_, l)| l).collect();
        assert_eq!(sent, ["A held 5 0.001", "A free 5 0.001"]);
    })
    .await;
}

/// A try-lock's wait (1 ms) is the server's to count, not the client's:
/// when finding a live connection takes longer than that (every connection
/// dropped and is being redialled), the one attempt still goes out, so a
/// free key is granted instead of being reported held.
#[tokio::test(start_paused = true)]
async fn try_lock_asks_even_when_finding_a_connection_took_longer_than_its_wait() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net
            .client(&["n:1"], |b| b.redial_interval(Duration::from_millis(100)))
            .await;
        // Both connections drop; the next ones come up by a redial, at
        // least 100 ms later.
        drop(accept(&mut conns).await);
        drop(accept(&mut conns).await);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(client.connected(), 0);
        let log: Log = Arc::default();
        let served = log.clone();
        tokio::spawn(async move {
            while let Some(peer) = conns.recv().await {
                peer.serve(served.clone(), |line| {
                    let f: Vec<&str> = line.split(' ').collect();
                    Some(match f[0] {
                        "A" => format!("A {} 7", f[1]),
                        _ => "S active - 0".into(),
                    })
                });
            }
        });
        let started = Instant::now();
        let guard = client
            .try_lock("free", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(guard.map(|g| g.into_grant().token()), Some(7));
        let sent: Vec<String> = lines_of(&log, "A ").into_iter().map(|(_, l)| l).collect();
        assert_eq!(sent, ["A free 5 0.001"]);
    })
    .await;
}

// ------------------------------------------------------------------ hostile nodes

#[tokio::test(start_paused = true)]
async fn hostile_answers_are_errors_never_panics() {
    bounded(async move {
        let bad: Vec<&[u8]> = vec![
            b"A k 0\n",
            b"A k 18446744073709551616\n",
            b"A k -1\n",
            b"A k 1 2\n",
            b"A other 5\n",
            b"T\n",
            b"M k\n",
            b"M  k\n",
            b"S active\n",
            b"S weird - 1\n",
            b"S active - x\n",
            b"R k 2\n",
            b"H ok\n",
            b"H \xff\xfe\n",
            b"\xff\xfe\xfd\n",
            b"\n",
            b" \n",
            b"\r\n",
            b"Z\n",
            b"E \n",
            b"E \xff server on fire\n",
        ];
        for answer in bad {
            let net = Net::default();
            let mut conns = net.node("n:1");
            let client = net.client(&["n:1"], |b| b).await;
            let mut a = accept(&mut conns).await;
            let mut b = accept(&mut conns).await;
            let c = client.clone();
            let acquire = tokio::spawn(async move {
                c.acquire("k", Duration::from_secs(5), Some(Duration::from_secs(1)))
                    .await
            });
            let (which, _) = line_on_either(&mut a, &mut b).await;
            let peer = if which == 0 { &mut a } else { &mut b };
            peer.send_raw(answer).await;
            let out = acquire.await.expect("no panic");
            assert!(
                matches!(out, Err(Error::Protocol(_))),
                "{:?} gave {out:?}",
                String::from_utf8_lossy(answer)
            );
        }

        // An answer line without end: cut at 4096 bytes.
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net.client(&["n:1"], |b| b).await;
        let mut a = accept(&mut conns).await;
        let mut b = accept(&mut conns).await;
        let c = client.clone();
        let acquire =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(5), None).await });
        let (which, _) = line_on_either(&mut a, &mut b).await;
        let peer = if which == 0 { &mut a } else { &mut b };
        peer.send_raw(&vec![b'A'; 1 << 20]).await;
        let out = acquire.await.expect("no panic");
        assert!(
            matches!(&out, Err(Error::Protocol(why)) if why.contains("longer than 4096")),
            "{out:?}"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_m_naming_a_new_node_is_followed_at_once_and_a_repeated_one_backs_off() {
    bounded(async move {
        // A failover: b (the old active) is gone; a and c are standbys that
        // name b until, at 1 s, c takes over (then a names c, c grants).
        let net = Net::default();
        let mut a_conns = net.node("a:1");
        let _b = net.node("b:1");
        net.set_mode("b:1", Mode::Refuse);
        let mut c_conns = net.node("c:1");
        let client = net.client(&["a:1", "b:1", "c:1"], |b| b).await;
        let t0 = Instant::now();
        let log: Log = Arc::default();
        accept(&mut a_conns).await.serve(log.clone(), move |line| {
            let f: Vec<&str> = line.split(' ').collect();
            let after = t0.elapsed() >= Duration::from_secs(1);
            Some(match f[0] {
                "S" => "S standby b:1 0".into(),
                _ if after => format!("M {} c:1", f[1]),
                _ => format!("M {} b:1", f[1]),
            })
        });
        accept(&mut c_conns).await.serve(log.clone(), move |line| {
            let f: Vec<&str> = line.split(' ').collect();
            let after = t0.elapsed() >= Duration::from_secs(1);
            Some(match f[0] {
                "S" => "S standby b:1 0".into(),
                "A" if after => format!("A {} 8", f[1]),
                _ => format!("M {} b:1", f[1]),
            })
        });
        let grant = client
            .acquire("k", Duration::from_secs(5), None)
            .await
            .unwrap()
            .into_grant()
            .unwrap();
        assert_eq!(grant.token(), 8);
        let at = t0.elapsed();
        // The first M (b, news but down) is followed at once; the repeats
        // back off 50, 100, 200, 400, 800 ms; the try at 1550 ms meets the
        // new active, or an M naming it, which is followed at once.
        let tries: Vec<Duration> = lines_of(&log, "A k").iter().map(|(t, _)| *t - t0).collect();
        let want = [0u32, 0, 50, 150, 350, 750, 1550];
        assert!(tries.len() >= want.len(), "{tries:?}");
        for (got, want) in tries.iter().zip(want) {
            assert!(about(*got, want * MS), "tries at {tries:?}");
        }
        assert!(
            about(at, 1550 * MS),
            "granted at {at:?}, tries at {tries:?}"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_node_naming_ever_new_active_nodes_is_not_followed_for_ever() {
    bounded(async move {
        let net = Net::default();
        let mut conns = net.node("n:1");
        let client = net
            .client(&["n:1"], |b| {
                b.connect_timeout(MS)
                    .no_active_timeout(Duration::from_secs(120))
            })
            .await;
        let log: Log = Arc::default();
        let next = Arc::new(StdMutex::new(0u32));
        for _ in 0..2 {
            let next = next.clone();
            accept(&mut conns).await.serve(log.clone(), move |line| {
                let f: Vec<&str> = line.split(' ').collect();
                Some(match f[0] {
                    "S" => "S standby - 0".into(),
                    _ => {
                        let mut next = next.lock().unwrap();
                        *next += 1;
                        format!("M {} nowhere{}:1", f[1], *next)
                    }
                })
            });
        }
        let out = client.acquire("k", Duration::from_secs(5), None).await;
        assert_eq!(out, Err(Error::NoActiveNode));
        let redirects = *next.lock().unwrap();
        assert!(
            redirects > 50,
            "only {redirects} redirects: the cap was not reached"
        );
        let addrs = client.addresses();
        assert_eq!(addrs.len(), 1 + 16, "{addrs:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_acquire_whose_wait_runs_out_while_redirected_to_an_unreachable_node_names_it() {
    bounded(async move {
        // A standby names an active that refuses connections: the acquire
        // is redirected until its wait (1 s) runs out. No node said the wait
        // ran out, so it is not `TimedOut`: the error names the node it was
        // sent to.
        let net = Net::default();
        let mut conns = net.node("s:1");
        let _a = net.node("a:1");
        net.set_mode("a:1", Mode::Refuse);
        let client = net.client(&["s:1"], |b| b).await;
        let log: Log = Arc::default();
        for _ in 0..2 {
            accept(&mut conns).await.serve(log.clone(), move |line| {
                let f: Vec<&str> = line.split(' ').collect();
                Some(match f[0] {
                    "S" => "S standby a:1 0".into(),
                    _ => format!("M {} a:1", f[1]),
                })
            });
        }
        let t0 = Instant::now();
        let out = client
            .acquire("k", Duration::from_secs(5), Some(Duration::from_secs(1)))
            .await;
        assert!(
            matches!(&out, Err(Error::Connection(why)) if why.contains("redirected to a:1")),
            "{out:?}"
        );
        assert!(t0.elapsed() <= Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(
            lines_of(&log, "A k 5 ").len() >= 2,
            "{:?}",
            log.lock().unwrap()
        );
        assert!(!net.dials("a:1").is_empty(), "the named node was dialled");
    })
    .await;
}
