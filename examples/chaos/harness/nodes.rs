//! The `ringlock serve` processes, one per node namespace. Each node's
//! stderr goes to `<out>/node<i>.log`, every line stamped with the
//! harness's clock (seconds since the run began), so that the logs line up
//! with the fault schedule and the client records. The lines that start a
//! planned hand-back ("handing the active role back to ...") are also
//! recorded as [`HandBack`]s, on the harness's clock, for the checks.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use super::clients::us;
use super::net::{self, Net};

/// What a node's log line starts the planned hand-back of the role with:
/// a lower-priority active gives it to the higher-priority node that has
/// held its snapshot for the failback delay.
pub const HAND_BACK_LINE: &str = "handing the active role back to ";

/// A planned hand-back, as the handing node logged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandBack {
    /// Harness clock (µs) when the harness read the line.
    pub t: u64,
    pub from: usize,
    pub to: usize,
}

/// The node a hand-back line of node `from` names, if it is one.
pub fn parse_hand_back(line: &str, from: usize, nodes: usize) -> Option<usize> {
    let rest = &line[line.find(HAND_BACK_LINE)? + HAND_BACK_LINE.len()..];
    let addr = rest.split([' ', ',']).next()?;
    let addr = addr.strip_suffix(':').unwrap_or(addr);
    (0..nodes).find(|&i| i != from && net::node_addr(i) == addr)
}

pub struct Nodes {
    bin: PathBuf,
    secret: PathBuf,
    args: Vec<Vec<String>>,
    /// Each node's namespace, by name.
    ns: Vec<String>,
    logs: Vec<Arc<Mutex<File>>>,
    children: Vec<Option<Child>>,
    /// Nodes sent SIGTERM and not yet gone: `(node, process, when)`.
    leaving: Vec<(usize, Child, Instant)>,
    readers: Vec<JoinHandle<()>>,
    hand_backs: Arc<Mutex<Vec<HandBack>>>,
    t0: Instant,
}

/// Seconds since `t0`, for log stamps.
fn stamp(t0: Instant) -> String {
    format!("[{:9.3}]", t0.elapsed().as_secs_f64())
}

impl Nodes {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        bin: &Path,
        net: &Net,
        out: &Path,
        io: &str,
        heartbeat_ms: u64,
        peer_timeout_ms: u64,
        t0: Instant,
    ) -> Result<Nodes, String> {
        let secret = out.join("cluster.secret");
        let _ = std::fs::remove_file(&secret);
        let status = Command::new(bin)
            .arg("keygen")
            .arg(&secret)
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        if !status.success() {
            return Err(format!("{} keygen failed", bin.display()));
        }
        let peers: Vec<String> = (0..net.nodes).map(net::node_addr).collect();
        let peers = peers.join(",");
        let mut args = Vec::new();
        let mut ns = Vec::new();
        let mut logs = Vec::new();
        for i in 0..net.nodes {
            args.push(vec![
                "serve".to_string(),
                "--listen".into(),
                net::node_addr(i),
                "--peers".into(),
                peers.clone(),
                "--io".into(),
                io.into(),
                "--heartbeat-ms".into(),
                heartbeat_ms.to_string(),
                "--peer-timeout-ms".into(),
                peer_timeout_ms.to_string(),
                "--cluster-secret-file".into(),
                secret.to_string_lossy().into_owned(),
            ]);
            ns.push(net.node_ns(i).to_string());
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(out.join(format!("node{i}.log")))
                .map_err(|e| format!("node{i}.log: {e}"))?;
            logs.push(Arc::new(Mutex::new(log)));
        }
        Ok(Nodes {
            bin: bin.to_path_buf(),
            secret,
            children: (0..net.nodes).map(|_| None).collect(),
            leaving: Vec::new(),
            args,
            ns,
            logs,
            readers: Vec::new(),
            hand_backs: Arc::default(),
            t0,
        })
    }

    /// Appends these to every node's `serve` arguments (before any start).
    pub fn extend_args(&mut self, extra: &[String]) {
        for args in &mut self.args {
            args.extend_from_slice(extra);
        }
    }

    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// A line of the harness's own in node `i`'s log.
    pub fn note(&self, i: usize, what: &str) {
        let mut log = self.logs[i].lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(log, "{} ## chaos: {what}", stamp(self.t0));
    }

    pub fn pid(&self, i: usize) -> Option<i32> {
        self.children[i].as_ref().map(|c| c.id() as i32)
    }

    /// Starts node `i` inside its namespace.
    pub fn start(&mut self, i: usize) -> Result<(), String> {
        if self.children[i].is_some() {
            return Err(format!("node {i} is running already"));
        }
        // A leaving process of this node must be gone first (its port).
        if let Some(k) = self.leaving.iter().position(|l| l.0 == i) {
            let (_, mut child, since) = self.leaving.swap_remove(k);
            let deadline = Instant::now() + Duration::from_secs(4);
            let status = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    break format!("{status}");
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break "still running at the restart: killed".to_string();
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            self.note(
                i,
                &format!(
                    "exited after SIGTERM ({status}, {:.0} ms after it)",
                    since.elapsed().as_secs_f64() * 1000.0
                ),
            );
        }
        // `ip netns exec` enters the namespace and execs the node: the
        // child is the node's own process.
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[i]])
            .arg(&self.bin)
            .args(&self.args[i])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("start node {i}: {e}"))?;
        self.note(i, &format!("started, pid {}", child.id()));
        let stderr = child.stderr.take().expect("piped");
        let log = self.logs[i].clone();
        let (t0, nodes) = (self.t0, self.children.len());
        let hand_backs = self.hand_backs.clone();
        self.readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(to) = parse_hand_back(&line, i, nodes) {
                    let hb = HandBack {
                        t: us(t0),
                        from: i,
                        to,
                    };
                    hand_backs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(hb);
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                let _ = writeln!(log, "{} {line}", stamp(t0));
            }
        }));
        self.children[i] = Some(child);
        Ok(())
    }

    fn signal(&self, i: usize, sig: Signal) -> Result<(), String> {
        let pid = self.pid(i).ok_or(format!("node {i} is not running"))?;
        let process = Pid::from_raw(pid).ok_or(format!("node {i}: pid {pid}"))?;
        kill_process(process, sig).map_err(|e| format!("kill({pid}, {sig:?}): {e}"))
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill9(&mut self, i: usize) -> Result<(), String> {
        let _ = self.signal(i, Signal::CONT);
        self.signal(i, Signal::KILL)?;
        if let Some(mut c) = self.children[i].take() {
            let status = c.wait().map_err(|e| e.to_string())?;
            self.note(i, &format!("killed with SIGKILL ({status})"));
        }
        Ok(())
    }

    pub fn stop(&mut self, i: usize) -> Result<(), String> {
        self.note(i, "SIGSTOP");
        self.signal(i, Signal::STOP)
    }

    pub fn cont(&mut self, i: usize) -> Result<(), String> {
        self.note(i, "SIGCONT");
        self.signal(i, Signal::CONT)
    }

    /// SIGTERM; the process is reaped by [`Nodes::reap`] or at the next
    /// start of the node.
    pub fn term(&mut self, i: usize) -> Result<(), String> {
        self.note(i, "SIGTERM");
        self.signal(i, Signal::TERM)?;
        let child = self.children[i].take().expect("signalled, so running");
        self.leaving.push((i, child, Instant::now()));
        Ok(())
    }

    /// Nodes that exited after SIGTERM since the last call: `(node, status
    /// and how long it took)`.
    pub fn reap(&mut self) -> Vec<(usize, String)> {
        let mut done = Vec::new();
        let mut k = 0;
        while k < self.leaving.len() {
            if let Ok(Some(status)) = self.leaving[k].1.try_wait() {
                let (i, _, since) = self.leaving.swap_remove(k);
                let what = format!(
                    "exited after SIGTERM ({status}, {:.0} ms after it)",
                    since.elapsed().as_secs_f64() * 1000.0
                );
                self.note(i, &what);
                done.push((i, what));
            } else {
                k += 1;
            }
        }
        done
    }

    /// Node `i` exited by itself (crashed)? Returns its status if so.
    pub fn exited(&mut self, i: usize) -> Option<String> {
        let child = self.children[i].as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.children[i] = None;
                let s = format!("{status}");
                self.note(i, &format!("exited by itself ({s})"));
                Some(s)
            }
            _ => None,
        }
    }

    /// The planned hand-backs the nodes logged so far, in order.
    pub fn hand_backs(&self) -> Vec<HandBack> {
        let mut v = self
            .hand_backs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        v.sort_by_key(|h| h.t);
        v
    }

    pub fn secret(&self) -> &Path {
        &self.secret
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            if self.children[i].is_some() {
                let _ = self.kill9(i);
            }
        }
        for (_, mut child, _) in self.leaving.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}
