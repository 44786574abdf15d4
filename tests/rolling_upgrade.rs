//! A rolling upgrade from the release before (its commit is in
//! tests/upgrade/old-release; its `ringlock` binary is built here, once,
//! into `target/old-release/`) to this build, and back, done as
//! docs/operations.md "Rolling upgrade" says: three nodes on loopback, locks
//! held by `ringlock run` holders that renew and by a grant that is only
//! renewed now and then, one node at a time stopped with SIGTERM and started
//! on the other binary. After every step: exactly one active that every node
//! names (`ringlock status` exits 0), every lock still held by its holder
//! with its token (`ringlock locks`, a renewal with the token succeeds, an
//! `acquire --no-wait` by another client is refused), and a new grant's
//! token above every token before. The abrupt variants: kill -9 of an
//! active of one release with standbys of the other, both ways, and a
//! SIGTERM hand-off both ways; every grant the standbys had applied (the
//! replication window: the test waits for each standby's status token to
//! reach the newest grant's before it kills) is kept. Both io backends.
//!
//! Where git or the commit is missing (a checkout from a tarball, a shallow
//! clone) the tests are reported ignored with the reason; `.ci/run` fails
//! on that.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::harness::Test;
use common::{Cluster, StderrLog};

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [needing_old_release(on_both! {
            a_rolling_upgrade_and_its_rollback_keep_one_active_and_every_lock:
                a_rolling_upgrade_and_its_rollback_keep_one_active_and_every_lock_uring,
                a_rolling_upgrade_and_its_rollback_keep_one_active_and_every_lock_epoll;
            an_old_active_killed_or_stopped_hands_its_locks_to_new_standbys:
                an_old_active_killed_or_stopped_hands_its_locks_to_new_standbys_uring,
                an_old_active_killed_or_stopped_hands_its_locks_to_new_standbys_epoll;
            a_new_active_killed_or_stopped_hands_its_locks_to_old_standbys:
                a_new_active_killed_or_stopped_hands_its_locks_to_old_standbys_uring,
                a_new_active_killed_or_stopped_hands_its_locks_to_old_standbys_epoll;
        })],
    )
}

/// Each test, also requiring [`old_release`].
fn needing_old_release(tests: Vec<Test>) -> Vec<Test> {
    tests
        .into_iter()
        .map(|t| t.requires("old_release", old_release))
        .collect()
}

/// Bound for the waits that only need to end eventually.
const SETTLE: Duration = Duration::from_secs(15);

/// How long building the old release may take (dependencies included, on
/// a small, busy machine; measured: under 2 minutes on 2 cores).
const BUILD_LIMIT: Duration = Duration::from_secs(1800);

/// `ringlock`'s exit status when the lock is held (`--no-wait`).
const EXIT_HELD: i32 = 75;

/// The release before, as tests/upgrade/old-release names it: its tag and
/// its commit.
fn old_release_id() -> (String, String) {
    let file = root().join("tests/upgrade/old-release");
    let text = std::fs::read_to_string(&file).expect("tests/upgrade/old-release");
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .expect("a line `TAG COMMIT` in tests/upgrade/old-release");
    let mut fields = line.split_whitespace();
    let (tag, commit) = (fields.next().unwrap(), fields.next().expect("a commit id"));
    assert_eq!(commit.len(), 40, "a full commit id: {line}");
    (tag.to_string(), commit.to_string())
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The prerequisite: git, tar and cargo run, and the old release's commit
/// is in this checkout's history.
fn old_release() -> Result<(), String> {
    let (tag, commit) = old_release_id();
    for (tool, arg) in [
        ("git", "--version"),
        ("tar", "--version"),
        (cargo(), "--version"),
    ] {
        match Command::new(tool).arg(arg).output() {
            Ok(out) if out.status.success() => {}
            _ => {
                return Err(format!(
                    "{tool} does not run here (the old release is built with it)"
                ));
            }
        }
    }
    let found = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .stderr(Stdio::null())
        .status();
    match found {
        Ok(s) if s.success() => Ok(()),
        _ => Err(format!(
            "the commit of {tag} ({commit}, tests/upgrade/old-release) is not in this \
             checkout's git history (a tarball or a shallow clone: `git fetch --unshallow`)"
        )),
    }
}

/// The cargo that runs this test (cargo sets `CARGO`), else `cargo`.
fn cargo() -> &'static str {
    static CARGO: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CARGO.get_or_init(|| std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// `target/old-release/` beside this build's binary.
fn old_release_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_ringlock"));
    // target/debug/ringlock (or target/<triple>/debug/ringlock).
    let target = bin.parent().and_then(Path::parent).expect("a target dir");
    target.join("old-release")
}

/// The old release's `ringlock`, built from `git archive` of its commit
/// with `cargo build --locked --bin ringlock` (debug, no dev-dependencies)
/// in a target directory of its own, unless built before. Tests that run
/// at once may both build: the source tree and the binary are put in
/// place by a rename, and cargo locks its target directory.
fn old_binary() -> PathBuf {
    let (tag, commit) = old_release_id();
    let dir = old_release_dir();
    let bin = dir.join(format!("ringlock-{commit}"));
    if bin.is_file() {
        return bin;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(&commit);
    if !src.join("Cargo.toml").is_file() {
        let tmp = dir.join(format!("{commit}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let script = "git -C \"$1\" archive \"$2\" | tar -x -C \"$3\"";
        let status = Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(root())
            .arg(&commit)
            .arg(&tmp)
            .status()
            .unwrap();
        assert!(status.success(), "git archive {commit} | tar -x: {status}");
        if std::fs::rename(&tmp, &src).is_err() {
            // Another test put it there first.
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    let started = Instant::now();
    let mut cmd = Command::new(cargo());
    cmd.args(["build", "--locked", "--bin", "ringlock", "--manifest-path"])
        .arg(src.join("Cargo.toml"))
        .current_dir(&src)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // What cargo set for this test and its build (the package, its
    // binaries, the target directory, the jobserver), not for a build of
    // another tree; the user's own cargo settings stay.
    const SET_BY_CARGO: [&str; 12] = [
        "CARGO_PKG_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
        "CARGO_MANIFEST_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ];
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if SET_BY_CARGO.iter().any(|p| name.starts_with(p)) {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd.env("CARGO_TARGET_DIR", dir.join("target"));
    let out = common::wait_output(cmd.spawn().expect("run cargo"), BUILD_LIMIT);
    assert!(
        out.status.success(),
        "building {tag} ({commit}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("built {tag}'s ringlock in {:?}", started.elapsed());
    let tmp = dir.join(format!("ringlock-{commit}.tmp-{}", std::process::id()));
    std::fs::copy(dir.join("target/debug/ringlock"), &tmp).unwrap();
    std::fs::rename(&tmp, &bin).unwrap();
    bin
}

/// `BIN --version`'s line.
fn version_of(bin: &Path) -> String {
    let out = Command::new(bin).arg("--version").output().unwrap();
    assert!(out.status.success(), "{} --version: {out:?}", bin.display());
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The newest peer protocol version of the old release's source
/// (`pub const VERSION: u64 = N;` in its cluster wire module).
fn old_peer_version() -> u64 {
    let (_, commit) = old_release_id();
    let src = old_release_dir()
        .join(commit)
        .join("crates/core/src/cluster");
    // A file of its own, or (later releases) a directory's `mod.rs`.
    let text = std::fs::read_to_string(src.join("wire.rs"))
        .or_else(|_| std::fs::read_to_string(src.join("wire/mod.rs")))
        .expect("the old release's wire module");
    text.lines()
        .find_map(|l| l.strip_prefix("pub const VERSION: u64 = "))
        .and_then(|v| v.trim_end_matches(';').parse().ok())
        .expect("pub const VERSION in the old release's wire module")
}

/// The two binaries of a test: the old release's and this build's.
struct Bins {
    old: PathBuf,
    new: PathBuf,
}

impl Bins {
    /// Builds the old one if needed; checks that the two say different
    /// versions and that this build says its package's.
    fn get() -> Bins {
        let bins = Bins {
            old: old_binary(),
            new: PathBuf::from(env!("CARGO_BIN_EXE_ringlock")),
        };
        let (old, new) = (version_of(&bins.old), version_of(&bins.new));
        assert_eq!(new, format!("ringlock {}", env!("CARGO_PKG_VERSION")));
        assert_ne!(
            old, new,
            "the old release's binary says this build's version"
        );
        eprintln!(
            "old: {old} (peer protocol {}), new: {new} (peer protocol {})",
            old_peer_version(),
            ringlock_core::cluster::wire::VERSION
        );
        bins
    }
}

/// A three-node cluster whose nodes run either binary, each with its
/// metrics listener (for `/ready`) and its log collected.
struct Mixed {
    c: Cluster,
    /// Per node: the binary it runs (or ran last), its log, its metrics
    /// address.
    running: Vec<Option<(PathBuf, StderrLog, SocketAddr)>>,
}

impl Mixed {
    fn new(io: &str) -> Mixed {
        Mixed {
            c: Cluster::configure(3, io, &["--metrics-listen", "127.0.0.1:0"]),
            running: vec![None, None, None],
        }
    }

    fn list(&self) -> String {
        self.c.addr_strings().join(",")
    }

    /// Starts node `i` on `bin`.
    fn start(&mut self, i: usize, bin: &Path) {
        let args = self.c.node_args(i);
        let log = self.c.start_node_bin_args(i, bin, &args);
        let line = log.wait_for("metrics on http://", SETTLE);
        let metrics = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        self.running[i] = Some((bin.to_path_buf(), log, metrics));
    }

    /// Waits until node `i`'s `/ready` says 200: active, or a standby that
    /// follows the active and holds its snapshot.
    fn wait_ready(&self, i: usize) {
        let (_, _, metrics) = self.running[i].as_ref().expect("node running");
        common::poll_until(
            &format!("node {i} ready"),
            SETTLE,
            || http_get(*metrics, "/ready"),
            |r| r.as_ref().is_some_and(|(status, _)| *status == 200),
        );
    }

    /// Waits until node `i` has a connection from each of `clients`
    /// clients besides its four peer links (`ringlock_connections_open`):
    /// the official clients redial a node every 3 s, so a holder may have
    /// no connection yet to a node that is ready.
    fn wait_clients(&self, i: usize, clients: usize) {
        let (_, _, metrics) = self.running[i].as_ref().expect("node running");
        let open = || {
            let (_, body) = http_get(*metrics, "/metrics")?;
            body.lines()
                .find_map(|l| l.strip_prefix("ringlock_connections_open "))?
                .parse::<usize>()
                .ok()
        };
        common::poll_until(
            &format!("node {i} has its peers' and {clients} clients' connections"),
            SETTLE,
            open,
            |n| n.is_some_and(|n| n >= 4 + clients),
        );
    }

    /// Starts node `i` on `bin` and waits until it is ready (synced) and
    /// every holder has a connection to it again.
    fn restart(&mut self, i: usize, bin: &Path, locks: &Locks) {
        self.start(i, bin);
        self.wait_ready(i);
        self.wait_clients(i, locks.holders.len());
    }

    /// SIGTERM to node `i`, which must exit 0.
    fn sigterm(&mut self, i: usize) {
        let mut node = self.c.take_node(i);
        node.signal(libc::SIGTERM);
        let status = node
            .wait_timeout(SETTLE)
            .unwrap_or_else(|| panic!("node {i} did not exit after SIGTERM"));
        assert_eq!(status.code(), Some(0), "node {i} after SIGTERM: {status}");
    }
}

/// One HTTP GET: the status and the body, `None` if the listener cannot
/// be reached or does not answer within 2 s.
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// `ringlock ARGS --server LIST` (this build's command line): its output.
fn cli(list: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(args)
        .args(["--server", list])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A `ringlock run KEY --lease 2` holder, whose CMD writes its token to a
/// file and runs until a `go` file exists (at most 120 s), then exits 5.
struct Holder {
    key: String,
    token: u64,
    child: Child,
    dir: PathBuf,
}

impl Holder {
    fn start(list: &str, key: &str) -> Holder {
        let dir = common::harness::scratch_dir().join(key.replace('/', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, go) = (dir.join("token"), dir.join("go"));
        let script = format!(
            "echo $RINGLOCK_TOKEN > {f}.tmp && mv {f}.tmp {f}; i=0; \
             while [ ! -e {g} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; exit 5",
            f = file.display(),
            g = go.display()
        );
        let child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
            .args(["run", key, "--lease", "2", "--server", list])
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let token = common::read_line_file(&file, SETTLE).parse().unwrap();
        Holder {
            key: key.to_string(),
            token,
            child,
            dir,
        }
    }

    /// Lets CMD end: it held its lock throughout (CMD's own status, no
    /// `LOCK LOST`).
    fn finish(self) {
        std::fs::write(self.dir.join("go"), b"").unwrap();
        let out = common::wait_output(self.child, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("{}: exit {:?}; stderr: {err}", self.key, out.status.code());
        assert!(!err.contains("LOCK LOST"), "{}: {err}", self.key);
        assert!(!err.contains("had already ended"), "{}: {err}", self.key);
        assert_eq!(out.status.code(), Some(5), "{}'s CMD: {err}", self.key);
    }
}

/// What the cluster holds: the holders' grants, one grant renewed only by
/// the checks, and the highest token seen so far.
struct Locks {
    holders: Vec<Holder>,
    kept: (String, u64),
    highest: u64,
    steps: usize,
}

impl Locks {
    /// Two `ringlock run` holders and one `ringlock acquire` grant (lease
    /// 60 s, renewed at every check).
    fn take(list: &str) -> Locks {
        let holders: Vec<Holder> = ["up/a", "up/b"]
            .iter()
            .map(|k| Holder::start(list, k))
            .collect();
        let out = cli(list, &["acquire", "up/kept", "--lease", "60"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let kept: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let highest = holders.iter().map(|h| h.token).max().unwrap().max(kept);
        Locks {
            holders,
            kept: ("up/kept".to_string(), kept),
            highest,
            steps: 0,
        }
    }

    /// Every grant's key and token.
    fn grants(&self) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = self
            .holders
            .iter()
            .map(|h| (h.key.clone(), h.token))
            .collect();
        all.push(self.kept.clone());
        all
    }

    fn finish(self) {
        for h in self.holders {
            h.finish();
        }
    }
}

/// Waits until every standby has applied the newest grant (its status
/// token at or above it): from here on a kill of the active loses none.
fn replicated(m: &Mixed, locks: &Locks) {
    for i in 0..3 {
        if m.c.is_running(i) {
            let took = m.c.wait_token(i, locks.highest, SETTLE);
            eprintln!("node {i} has token {} after {took:?}", locks.highest);
        }
    }
}

/// After a step: node `active` is the one active node, every running node
/// names it and `ringlock status` exits 0; every grant is held with its
/// token, renews, and is refused to another client; a new grant's token is
/// above every token before, and so is the active's.
fn check(m: &Mixed, active: usize, locks: &mut Locks, step: &str) {
    let list = m.list();
    m.c.wait_settled(active, SETTLE);
    let status = cli(&list, &["status"]);
    assert_eq!(
        status.status.code(),
        Some(0),
        "{step}: ringlock status: {}",
        String::from_utf8_lossy(&status.stdout)
    );
    let listing = cli(&list, &["locks", "--prefix", "up/"]);
    assert_eq!(listing.status.code(), Some(0), "{step}: {listing:?}");
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let held: HashMap<&str, u64> = listing
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?.parse().ok()?))
        })
        .collect();
    for (key, token) in locks.grants() {
        assert_eq!(
            held.get(key.as_str()),
            Some(&token),
            "{step}: {key}:\n{listing}"
        );
        let out = cli(&list, &["acquire", &key, "--lease", "60", "--no-wait"]);
        assert_eq!(out.status.code(), Some(EXIT_HELD), "{step}: {key}: {out:?}");
    }
    let (key, token) = &locks.kept;
    let out = cli(&list, &["renew", key, &token.to_string(), "--lease", "60"]);
    assert_eq!(out.status.code(), Some(0), "{step}: renew {key}: {out:?}");
    locks.steps += 1;
    let probe = format!("up/probe-{}", locks.steps);
    let out = cli(&list, &["acquire", &probe, "--lease", "1", "--no-wait"]);
    assert_eq!(out.status.code(), Some(0), "{step}: {probe}: {out:?}");
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        token > locks.highest,
        "{step}: token {token} after {}",
        locks.highest
    );
    locks.highest = token;
    let s = m.c.status(active).expect("the active answers");
    assert!(
        s.token >= token,
        "{step}: the active's token {} < {token}",
        s.token
    );
    eprintln!("{step}: node {active} active, every lock held, token {token}");
}

/// The links between a node of this build and one of the old release
/// speak the older of their versions: where this build's is newer, its
/// `HELLO` is refused by the old node and it dials again with the old
/// one; where they are the same, nothing is refused.
fn check_link_versions(m: &Mixed, bins: &Bins) {
    let (old, new) = (old_peer_version(), ringlock_core::cluster::wire::VERSION);
    assert!(
        new >= old,
        "this build's peer protocol {new} is older than {old}"
    );
    for i in (0..3).filter(|&i| m.c.is_running(i)) {
        let (bin, log, _) = m.running[i].as_ref().unwrap();
        for j in (0..3).filter(|&j| j != i && m.c.is_running(j)) {
            let other = &m.running[j].as_ref().unwrap().0;
            if *bin != bins.new || *other != bins.old {
                continue;
            }
            let refused = format!("{} refused peer protocol version {new}", m.c.addr(j));
            if new > old {
                log.wait_for(&refused, SETTLE);
            } else {
                assert!(log.lines_with(&refused).is_empty(), "{}", log.text());
            }
        }
        assert!(
            log.lines_with("ERROR").is_empty(),
            "node {i}: {}",
            log.text()
        );
    }
}

/// One step of a rolling restart: SIGTERM of node `i`, a check (node
/// `meanwhile` active), node `i` started on `bin` and ready (synced), a
/// check (node 0 active: it has the role back if it was node 0).
fn replace(m: &mut Mixed, i: usize, bin: &Path, meanwhile: usize, locks: &mut Locks, step: &str) {
    m.sigterm(i);
    check(m, meanwhile, locks, &format!("{step}: node {i} stopped"));
    m.restart(i, bin, locks);
    check(m, 0, locks, &format!("{step}: node {i} back, ready"));
}

/// Starts node 0 on `first` and nodes 1 and 2 on `rest`, and takes the
/// locks once the cluster is settled and every node ready.
fn start_mixed(io: &str, first: &Path, rest: &Path) -> (Mixed, Locks) {
    let mut m = Mixed::new(io);
    m.start(0, first);
    m.start(1, rest);
    m.start(2, rest);
    m.c.wait_settled(0, SETTLE);
    for i in 0..3 {
        m.wait_ready(i);
    }
    let mut locks = Locks::take(&m.list());
    for i in 0..3 {
        m.wait_clients(i, locks.holders.len());
    }
    replicated(&m, &locks);
    check(&m, 0, &mut locks, "started");
    (m, locks)
}

/// All three nodes on the old release; upgraded as docs/operations.md
/// says (standbys first, each ready before the next; then the active, whose
/// SIGTERM hands the role, old to new, to node 1; node 0 back on the new
/// binary takes it back once synced); then rolled back the same way (the
/// active's SIGTERM hands the role new to old).
fn a_rolling_upgrade_and_its_rollback_keep_one_active_and_every_lock(io: &str) {
    let bins = Bins::get();
    let (mut m, mut locks) = start_mixed(io, &bins.old, &bins.old);
    for (to, name) in [(&bins.new, "upgrade"), (&bins.old, "rollback")] {
        replace(&mut m, 2, to, 0, &mut locks, name);
        replace(&mut m, 1, to, 0, &mut locks, name);
        check_link_versions(&m, &bins);
        replicated(&m, &locks);
        replace(&mut m, 0, to, 1, &mut locks, name);
        check_link_versions(&m, &bins);
    }
    locks.finish();
}

/// Node 0 on `first`, its standbys on `rest`: kill -9 of node 0, node 1
/// takes over with every applied grant; node 0 restarts on `first` and
/// gets the role back; then SIGTERM of node 0 hands the role to node 1
/// (from `first` to `rest`), and it comes back again.
fn kill_and_stop_the_active(io: &str, first: &Path, rest: &Path, bins: &Bins) {
    let (mut m, mut locks) = start_mixed(io, first, rest);
    check_link_versions(&m, bins);
    replicated(&m, &locks);
    m.c.kill9(0);
    check(&m, 1, &mut locks, "kill -9 of node 0");
    m.restart(0, first, &locks);
    check(&m, 0, &mut locks, "node 0 restarted");
    check_link_versions(&m, bins);
    replicated(&m, &locks);
    replace(&mut m, 0, first, 1, &mut locks, "SIGTERM of node 0");
    locks.finish();
}

fn an_old_active_killed_or_stopped_hands_its_locks_to_new_standbys(io: &str) {
    let bins = Bins::get();
    kill_and_stop_the_active(io, &bins.old, &bins.new, &bins);
}

fn a_new_active_killed_or_stopped_hands_its_locks_to_old_standbys(io: &str) {
    let bins = Bins::get();
    kill_and_stop_the_active(io, &bins.new, &bins.old, &bins);
}
