//! The test harness of the test files that have prerequisites (io_uring,
//! promtool, Python, root with `ip` and `tc`, a toolchain): a test whose
//! prerequisite is missing is reported by cargo test itself as ignored,
//! with the reason, decided when the test would run:
//!
//! ```text
//! test basic_uring ... ignored (prerequisite missing: io_uring is unavailable: io_uring_setup is not permitted (EPERM ...))
//! ```
//!
//! The words `ignored (prerequisite missing: ` are fixed: `.ci/run` fails
//! when it finds them, since CI installs every prerequisite.
//!
//! # Putting a test file under this harness
//!
//! 1. In the package's Cargo.toml: `[[test]] name = "NAME"` with
//!    `harness = false` (cargo then runs the file's `main` instead of
//!    libtest's; it still passes the usual arguments, handled here by
//!    `libtest-mimic`: name filters, `--exact`, `--skip`, `--list`,
//!    `--ignored`, `--include-ignored`, `--nocapture`, `--test-threads`).
//! 2. Test functions are plain `fn name()` (no `#[test]`), panicking on
//!    failure as usual. A prerequisite is a `fn() -> Result<(), String>`
//!    whose `Err` says what is missing and how to get it.
//! 3. The file's `fn main` lists every test: `tests![a, b if prerequisite]`
//!    for plain ones, `on_both![scenario: scenario_uring, scenario_epoll;]`
//!    (tests/common) for a scenario under both backends, whose io_uring
//!    test requires io_uring; or [`Test::new`] with any name and closure
//!    (tests/docs.rs makes one per marked block), `.requires(name, check)`.
//!
//! A client's wrapper test (tests/go_client.rs, tests/node_client.rs: a
//! toolchain checked by `fn prerequisite() -> Result<(), String>`, then
//! the client's own suite run against this build's server) is the
//! simplest case:
//!
//! ```ignore
//! #[macro_use]
//! mod common;
//!
//! fn main() -> std::process::ExitCode {
//!     common::harness::run(file!(), [tests![go_client_suite if prerequisite]])
//! }
//! ```
//!
//! with `[[test]] name = "go_client" harness = false` in Cargo.toml, and
//! the toolchain installed by `.ci/run`.
//!
//! A test cannot be dropped silently: a test function the list forgets is
//! never used, a `dead_code` warning that `cargo clippy --all-targets -- -D
//! warnings` refuses; and a `#[test]` attribute, which a `harness = false`
//! file would silently never run, makes the binary fail at start (the
//! harness reads its own source file and says which line).
//!
//! # Output
//!
//! Each test runs in a child process (this binary, re-run for that one
//! test), its stdout and stderr captured and shown when it fails, as
//! libtest shows a failing test's output; `--nocapture` lets it through.
//! The server logs the tests drain therefore stay out of a passing run.
//! Prerequisites are checked in the parent, once each per run. Each test
//! has a directory of its own, removed after it ([`scratch_dir`]).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// What a test needs from the machine: `Err` says what is missing.
pub type Prerequisite = fn() -> Result<(), String>;

/// The argument that makes this binary run one test, in a child.
const CHILD: &str = "--ringlock-harness-child";

/// How long a finished test's output pipe may stay open (held by a process
/// it started and did not stop) before the harness stops reading it.
const LINGER: Duration = Duration::from_secs(10);

/// One test: a name, its function, and what it needs. The list may be
/// made at run time (tests/docs.rs makes one test per marked block): the
/// child that runs one test makes the same list and picks it by name.
#[derive(Clone)]
pub struct Test {
    pub name: String,
    pub run: Arc<dyn Fn() + Send + Sync>,
    /// Each with its name (for the once-per-run check).
    pub requires: Vec<(&'static str, Prerequisite)>,
}

impl Test {
    pub fn new(name: impl Into<String>, run: impl Fn() + Send + Sync + 'static) -> Test {
        Test {
            name: name.into(),
            run: Arc::new(run),
            requires: Vec::new(),
        }
    }

    /// Adds a prerequisite, named for its once-per-run check.
    pub fn requires(mut self, name: &'static str, check: Prerequisite) -> Test {
        self.requires.push((name, check));
        self
    }
}

/// A list of plain tests, each `name` or `name if prerequisite`:
/// `tests![a, b if promtool]` (a `Vec<Test>`).
macro_rules! tests {
    ($($name:ident $(if $pre:path)?),* $(,)?) => {
        vec![$(
            $crate::common::harness::Test::new(stringify!($name), $name)
                $(.requires(stringify!($pre), $pre))?
        ),*]
    };
}

/// Runs the tests of the file `source` (its `file!()`): the whole run in
/// the parent, or one test in a child. Returns the exit status.
pub fn run(source: &str, groups: impl IntoIterator<Item = Vec<Test>>) -> ExitCode {
    let tests: Vec<Test> = groups.into_iter().flatten().collect();
    let mut names: Vec<&str> = tests.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        eprintln!("{source}: the test {} is listed twice", w[0]);
        return ExitCode::from(101);
    }
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(CHILD) {
        let name = argv.get(2).map_or("", String::as_str);
        return match tests.iter().find(|t| t.name == name) {
            Some(test) => run_in_child(test),
            None => {
                eprintln!("{source}: no test named {name:?}");
                ExitCode::from(101)
            }
        };
    }
    if let Err(why) = no_libtest_attributes(source) {
        eprintln!("{why}");
        return ExitCode::from(101);
    }
    let (argv, filters) = filters(argv);
    let mut args = Arguments::from_iter(argv);
    if args.test_threads.is_none() {
        args.test_threads = std::env::var("RUST_TEST_THREADS")
            .ok()
            .and_then(|n| n.parse().ok());
    }
    let nocapture =
        args.nocapture || std::env::var_os("RUST_TEST_NOCAPTURE").is_some_and(|v| v != "0");
    let show_output = args.show_output;
    let exact = args.exact;
    let trials = tests
        .into_iter()
        .filter(|t| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        t.name == *f
                    } else {
                        t.name.contains(f.as_str())
                    }
                })
        })
        .map(|test| {
            Trial::ignorable_test(test.name.clone(), move || {
                run_in_parent(&test, nocapture, show_output)
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// libtest takes any number of name filters (a test runs if it matches
/// one), libtest-mimic one: more than one are taken out of the arguments
/// (returned second) and applied here.
fn filters(argv: Vec<String>) -> (Vec<String>, Vec<String>) {
    const WITH_VALUE: [&str; 6] = [
        "--test-threads",
        "--skip",
        "--color",
        "--format",
        "--logfile",
        "-Z",
    ];
    let mut positional = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let arg = &argv[i];
        if WITH_VALUE.contains(&arg.as_str()) {
            i += 1;
        } else if !arg.starts_with('-') {
            positional.push(i);
        }
        i += 1;
    }
    if positional.len() < 2 {
        return (argv, Vec::new());
    }
    let mut rest = Vec::new();
    let mut filters = Vec::new();
    for (i, arg) in argv.into_iter().enumerate() {
        if positional.contains(&i) {
            filters.push(arg);
        } else {
            rest.push(arg);
        }
    }
    (rest, filters)
}

/// Checks the prerequisites, then runs the test in a child process.
fn run_in_parent(test: &Test, nocapture: bool, show_output: bool) -> Result<Completion, Failed> {
    for (name, check) in &test.requires {
        if let Err(why) = checked(name, *check) {
            return Ok(Completion::ignored_with(format!(
                "prerequisite missing: {why}"
            )));
        }
    }
    let exe = std::env::current_exe().map_err(|e| format!("this test binary: {e}"))?;
    let scratch = Scratch::new()?;
    let mut cmd = Command::new(exe);
    cmd.arg(CHILD)
        .arg(&test.name)
        .env(SCRATCH, &scratch.0)
        .stdin(Stdio::null());
    if nocapture {
        let status = cmd
            .status()
            .map_err(|e| format!("run {} in a child: {e}", test.name))?;
        return match status.success() {
            true => Ok(Completion::Completed),
            false => Err(format!("the test's process ended with {status}").into()),
        };
    }
    let (reader, writer) = std::io::pipe().map_err(|e| format!("a pipe: {e}"))?;
    let writer2 = writer.try_clone().map_err(|e| format!("a pipe: {e}"))?;
    cmd.stdout(writer2).stderr(writer);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("run {} in a child: {e}", test.name))?;
    // The parent's copies of the pipe's write end go with `cmd`: the read
    // end sees its end when the child (and what it started) closes it.
    drop(cmd);
    let output = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let sink = Arc::clone(&output);
    std::thread::spawn(move || {
        let mut reader = reader;
        let mut buf = [0u8; 8192];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        let _ = done_tx.send(());
    });
    let status = child
        .wait()
        .map_err(|e| format!("wait for the test: {e}"))?;
    let lingered = done_rx.recv_timeout(LINGER).is_err();
    let mut text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    if lingered {
        text.push_str(&format!(
            "\n(the test ended but a process it started still held its output {LINGER:?} later)\n"
        ));
    }
    if !status.success() {
        return Err(format!("{text}\nthe test's process ended with {status}").into());
    }
    if lingered {
        return Err(text.into());
    }
    if show_output && !text.is_empty() {
        eprint!("---- {} output ----\n{text}", test.name);
    }
    Ok(Completion::Completed)
}

/// A directory of one test's own, removed when it is done: its path is in
/// the child's environment as `RINGLOCK_TEST_TMP` ([`scratch_dir`]).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ringlock-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SCRATCH: &str = "RINGLOCK_TEST_TMP";

/// Where a test keeps its files: its own directory, removed after it,
/// when it runs under this harness; the system's temporary directory
/// otherwise.
pub fn scratch_dir() -> PathBuf {
    std::env::var_os(SCRATCH).map_or_else(std::env::temp_dir, PathBuf::from)
}

/// A prerequisite's verdict, checked once per run.
fn checked(name: &'static str, check: Prerequisite) -> Result<(), String> {
    type Verdict = Arc<OnceLock<Result<(), String>>>;
    static SEEN: OnceLock<Mutex<HashMap<&'static str, Verdict>>> = OnceLock::new();
    let cell = {
        let mut seen = SEEN.get_or_init(Default::default).lock().unwrap();
        Arc::clone(seen.entry(name).or_default())
    };
    cell.get_or_init(check).clone()
}

/// In the child: runs the one test on a thread named after it (as libtest
/// does, so a panic names the test) and exits 101 if it panicked.
fn run_in_child(test: &Test) -> ExitCode {
    let run = Arc::clone(&test.run);
    let joined = std::thread::Builder::new()
        .name(test.name.clone())
        .spawn(move || run())
        .map(std::thread::JoinHandle::join);
    match joined {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(_)) => ExitCode::from(101),
        Err(e) => {
            eprintln!("cannot start the test's thread: {e}");
            ExitCode::from(101)
        }
    }
}

/// A `#[test]` in a `harness = false` file never runs: refuses to start
/// when `source` has one (outside comments).
fn no_libtest_attributes(source: &str) -> Result<(), String> {
    let Some(path) = find_source(source) else {
        return Ok(());
    };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
            return Err(format!(
                "{}:{}: a #[test] attribute in a file under tests/common/harness.rs: \
                 libtest does not run this file, so the test would never run; \
                 list it in the file's main instead",
                path.display(),
                i + 1
            ));
        }
    }
    Ok(())
}

/// `source` as `file!()` gives it (relative to the workspace root, or to
/// the package), found from the package's directory upwards.
fn find_source(source: &str) -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join(source))
        .find(|p| p.is_file())
}
