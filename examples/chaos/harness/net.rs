//! The lab network: one namespace per node, one for the clients, all
//! joined by veth pairs to a bridge in a namespace of its own. Every
//! address (10.77.0.0/24) exists only inside these namespaces; nothing is
//! routed to the host.
//!
//! Faults are made on the bridge's side, so that neither end of a link can
//! tell a drop from a silent network:
//!
//! - loss `i -> j`: a u32 filter on the ingress of node i's bridge port
//!   matching IPv4 packets to node j's address redirects them to `sink`, a
//!   veth that is down, where the kernel drops them (this kernel has no
//!   `act_gact`, so no `action drop`; a redirect to a down device is a drop).
//!   ARP is not IPv4 and still passes, as it would on a real switch.
//! - link down: node i's bridge port is set down (the node sees no carrier;
//!   its clients are cut off too).
//!
//! Both are reference-counted, so that two overlapping faults that want the
//! same drop do not heal each other.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

/// The lab's private subnet (inside the namespaces only).
pub const SUBNET: &str = "10.77.0";
/// The port every node listens on.
pub const PORT: u16 = 7171;

/// Node `i`'s address.
pub fn node_ip(i: usize) -> String {
    format!("{SUBNET}.{}", 10 + i)
}

/// Node `i`'s `host:port`, as `--peers` lists it.
pub fn node_addr(i: usize) -> String {
    format!("{}:{PORT}", node_ip(i))
}

pub const CLIENT_IP: &str = "10.77.0.100";

/// Runs `cmd args...`; `Err` with its stderr if it fails.
pub fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// Whether network namespaces can be made here: root, `ip` and `tc`
/// present, and `ip netns add` works. `Err` says why not.
pub fn available() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not root".into());
    }
    for tool in ["ip", "tc"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(format!("no `{tool}` command"));
        }
    }
    // A name of its own per call: tests probe from parallel threads.
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("rlprobe-{}-{n}", std::process::id());
    sh("ip", &["netns", "add", &probe]).map_err(|e| format!("ip netns add fails: {e}"))?;
    let _ = sh("ip", &["netns", "del", &probe]);
    Ok(())
}

/// Moves the calling thread into namespace `ns` (its sockets are made
/// there from now on). Threads that do this never move back.
pub fn enter(ns: &str) -> Result<(), String> {
    let file =
        File::open(format!("/run/netns/{ns}")).map_err(|e| format!("open netns {ns}: {e}"))?;
    // Affects this thread only.
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| format!("setns {ns}: {e}"))
}

/// The namespaces, links and fault rules of one lab. Dropping it removes
/// every namespace it made (processes still inside are killed first).
pub struct Net {
    pub prefix: String,
    pub nodes: usize,
    /// Namespaces made so far (removed on drop).
    made: Vec<String>,
    /// Active drop rules `(from, to)` and how many faults want each.
    drops: HashMap<(usize, usize), u32>,
    /// Link-down counts per node.
    down: Vec<u32>,
}

impl Net {
    pub fn bridge_ns(&self) -> String {
        format!("{}-br", self.prefix)
    }

    pub fn node_ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    pub fn client_ns(&self) -> String {
        format!("{}-cl", self.prefix)
    }

    /// Builds the lab. On error, what was made is removed again.
    pub fn create(prefix: &str, nodes: usize) -> Result<Net, String> {
        let mut net = Net {
            prefix: prefix.to_string(),
            nodes,
            made: Vec::new(),
            drops: HashMap::new(),
            down: vec![0; nodes],
        };
        net.build()?;
        Ok(net)
    }

    fn add_ns(&mut self, name: String) -> Result<(), String> {
        sh("ip", &["netns", "add", &name])?;
        self.made.push(name.clone());
        sh("ip", &["-n", &name, "link", "set", "lo", "up"])
    }

    fn build(&mut self) -> Result<(), String> {
        let br = self.bridge_ns();
        self.add_ns(br.clone())?;
        sh("ip", &["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        sh("ip", &["-n", &br, "link", "set", "br0", "up"])?;
        // The sink: a veth pair left down; packets redirected to it are
        // dropped by the kernel.
        sh(
            "ip",
            &[
                "-n", &br, "link", "add", "sink", "type", "veth", "peer", "name", "sinkp",
            ],
        )?;
        let mut ends: Vec<(String, String, String)> = (0..self.nodes)
            .map(|i| {
                (
                    self.node_ns(i),
                    format!("p{i}"),
                    format!("{}/24", node_ip(i)),
                )
            })
            .collect();
        ends.push((self.client_ns(), "pc".into(), format!("{CLIENT_IP}/24")));
        for (ns, port, cidr) in ends {
            self.add_ns(ns.clone())?;
            // Both ends are made directly in their namespaces.
            sh(
                "ip",
                &[
                    "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                    "netns", &br,
                ],
            )?;
            sh("ip", &["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            sh("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            sh("ip", &["-n", &br, "link", "set", &port, "master", "br0"])?;
            sh("ip", &["-n", &br, "link", "set", &port, "up"])?;
            sh("tc", &["-n", &br, "qdisc", "add", "dev", &port, "clsact"])?;
        }
        Ok(())
    }

    /// Starts dropping IPv4 packets from node `from` to node `to`.
    pub fn drop_path(&mut self, from: usize, to: usize) -> Result<(), String> {
        let n = self.drops.entry((from, to)).or_insert(0);
        *n += 1;
        if *n > 1 {
            return Ok(());
        }
        let (br, port, prio, dst) = (
            self.bridge_ns(),
            format!("p{from}"),
            (10 + to).to_string(),
            format!("{}/32", node_ip(to)),
        );
        sh(
            "tc",
            &[
                "-n", &br, "filter", "add", "dev", &port, "ingress", "protocol", "ip", "prio",
                &prio, "u32", "match", "ip", "dst", &dst, "action", "mirred", "egress", "redirect",
                "dev", "sink",
            ],
        )
    }

    /// Stops dropping from `from` to `to` (when no other fault wants it).
    pub fn heal_path(&mut self, from: usize, to: usize) -> Result<(), String> {
        let Some(n) = self.drops.get_mut(&(from, to)) else {
            return Ok(());
        };
        *n -= 1;
        if *n > 0 {
            return Ok(());
        }
        self.drops.remove(&(from, to));
        let (br, port, prio) = (self.bridge_ns(), format!("p{from}"), (10 + to).to_string());
        sh(
            "tc",
            &[
                "-n", &br, "filter", "del", "dev", &port, "ingress", "protocol", "ip", "prio",
                &prio,
            ],
        )
    }

    /// Sets node `i`'s bridge port down (counted).
    pub fn link_down(&mut self, i: usize) -> Result<(), String> {
        self.down[i] += 1;
        if self.down[i] > 1 {
            return Ok(());
        }
        sh(
            "ip",
            &[
                "-n",
                &self.bridge_ns(),
                "link",
                "set",
                &format!("p{i}"),
                "down",
            ],
        )
    }

    pub fn link_up(&mut self, i: usize) -> Result<(), String> {
        if self.down[i] == 0 {
            return Ok(());
        }
        self.down[i] -= 1;
        if self.down[i] > 0 {
            return Ok(());
        }
        sh(
            "ip",
            &[
                "-n",
                &self.bridge_ns(),
                "link",
                "set",
                &format!("p{i}"),
                "up",
            ],
        )
    }
}

/// Kills (SIGKILL, after SIGCONT) every process inside namespace `ns`:
/// only processes of this lab can be there.
fn kill_inside(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter_map(rustix::process::Pid::from_raw)
    {
        use rustix::process::{Signal, kill_process};
        let _ = kill_process(pid, Signal::CONT);
        let _ = kill_process(pid, Signal::KILL);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            kill_inside(ns);
        }
        for ns in self.made.iter().rev() {
            if let Err(e) = sh("ip", &["netns", "del", ns]) {
                eprintln!("chaos: cleanup: {e}");
            }
        }
    }
}
