//! The commands README.md and docs/*.md show work as written: every marked
//! block runs, and a block that fails fails this test.
//!
//! # How a block is marked
//!
//! An HTML comment on the line right before a fenced block (markdown
//! renders none of it, so a reader sees the block as it is):
//!
//! ```text
//! <!-- tested -->
//! <!-- tested in the checkout -->
//! <!-- tested, serves 127.0.0.1:7171 -->
//! <!-- tested after: ringlock serve & wait_for_ringlock -->
//! ```
//!
//! `tested` comes first; clauses follow, separated by commas, `after:`
//! last (its text runs to the end of the comment):
//!
//! - `in the checkout`: the block runs in the repository's root, as a
//!   reader runs it from a clone (`cargo build --release`,
//!   `target/release/ringlock`); what it creates at the top of the checkout
//!   is removed afterwards. Without it the block runs in a fresh temporary
//!   directory (certificates and secrets it writes go there).
//! - `serves ADDR`: the block runs a server in the foreground (README's
//!   first command): it passes when a ringlock node on ADDR answers (the
//!   block is then stopped), and fails if the block ends first.
//! - `transcript`: the block shows commands, each on a line that starts
//!   with `$ `, and after each what it prints. Each command runs (it must
//!   succeed) and prints what is shown, compared with every number as `N`
//!   (tokens, times, ports) and runs of spaces as one.
//! - `after: SHELL`: setup the reader is told in the surrounding prose (a
//!   running node, a script to run under a lock), run before the block.
//!
//! Unmarked blocks are not run: output, illustrations with example hosts
//! (`10.0.0.1`, `node1.example`), commands that need what a test machine
//! has not (Docker, a fleet). A comment that starts `<!-- tested` but does
//! not parse fails [`the_marks_parse`].
//!
//! # What the test does with a block
//!
//! Each marked block is one test, `FILE_N` (README.md's second marked
//! block: `readme_2`). Its text runs as a bash script (`set -euo
//! pipefail`) in a network namespace of its own (`unshare --net`, with
//! only loopback up), so 127.0.0.1:7171 and the other documented ports are
//! free and the commands run exactly as written, beside any other server
//! on this machine. `ringlock` on PATH is this build's binary (the one
//! `cargo test` built; the docs' commands assume it installed); a
//! `cargo install` goes into a scratch directory that comes first on PATH.
//! The namespace has no network: cargo runs offline (`CARGO_NET_OFFLINE`),
//! from what the build of this suite fetched.
//! The script has `wait_for_ringlock [ADDR]` (default 127.0.0.1:7171):
//! waits until a node answers there, and `wait_until COMMAND...`: until
//! the command succeeds; each for 10 s at most. The block must exit
//! with status 0 within [`LIMIT`] (the first release build included);
//! every process it started is then ended (its process group). Blocks that
//! use `openssl` or `nc` require them (ignored, with the reason, where they
//! are missing); all need root and `unshare`.
//!
//! Besides the blocks: README's `cargo test` command is the one `.ci/run`
//! runs (it is not run here: that would be this very suite).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::harness::{Prerequisite, Test};

/// How long one block may run: the first `cargo build --release` of a
/// fresh checkout takes minutes on a small machine.
const LIMIT: Duration = Duration::from_secs(900);

/// The documents whose blocks are looked at, relative to the root.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![PathBuf::from("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| Path::new("docs").join(p.file_name().unwrap()))
        .collect();
    more.sort();
    docs.append(&mut more);
    docs
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A marked block.
#[derive(Clone, Debug)]
struct Block {
    /// The document, relative to the root, and the block's first line.
    doc: PathBuf,
    line: usize,
    text: String,
    in_checkout: bool,
    serves: Option<String>,
    transcript: bool,
    after: Option<String>,
}

/// The marked blocks of `text` (the document `doc`), and the marks that do
/// not parse.
fn marked_blocks(doc: &Path, text: &str) -> (Vec<Block>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        i += 1;
        let Some(mark) = line.strip_prefix("<!-- tested") else {
            continue;
        };
        let at = format!("{}:{i}", doc.display());
        let Some(mark) = mark.strip_suffix("-->") else {
            errors.push(format!("{at}: the mark must be one line ending with -->"));
            continue;
        };
        let fence = lines.get(i).map(|l| l.trim_start()).unwrap_or("");
        if !fence.starts_with("```") {
            errors.push(format!("{at}: a mark must be right before a ``` fence"));
            continue;
        }
        let mut block = Block {
            doc: doc.to_path_buf(),
            line: i + 2,
            text: String::new(),
            in_checkout: false,
            serves: None,
            transcript: false,
            after: None,
        };
        if let Err(e) = parse_clauses(mark, &mut block) {
            errors.push(format!("{at}: {e}"));
        }
        i += 1;
        let mut closed = false;
        while i < lines.len() {
            let body = lines[i];
            i += 1;
            if body.trim_start().starts_with("```") {
                closed = true;
                break;
            }
            block.text.push_str(body);
            block.text.push('\n');
        }
        if !closed {
            errors.push(format!("{at}: the block never ends"));
        }
        blocks.push(block);
    }
    (blocks, errors)
}

/// `, in the checkout, serves ADDR, after: SHELL` into `block`.
fn parse_clauses(mark: &str, block: &mut Block) -> Result<(), String> {
    let (clauses, after) = match mark.split_once("after:") {
        Some((c, a)) => (c, Some(a.trim())),
        None => (mark, None),
    };
    if let Some(after) = after {
        if after.is_empty() {
            return Err("`after:` with nothing after it".into());
        }
        block.after = Some(after.to_string());
    }
    for clause in clauses.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        if clause == "in the checkout" {
            block.in_checkout = true;
        } else if clause == "transcript" {
            block.transcript = true;
        } else if let Some(addr) = clause.strip_prefix("serves ") {
            addr.trim()
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("serves {addr}: {e}"))?;
            block.serves = Some(addr.trim().to_string());
        } else {
            return Err(format!(
                "unknown clause {clause:?} (known: in the checkout, serves ADDR, transcript, after: SHELL)"
            ));
        }
    }
    Ok(())
}

/// Every marked block of every document, and the marks that do not parse.
fn all_blocks() -> (Vec<Block>, Vec<String>) {
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(root().join(&doc))
            .unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let (mut b, mut e) = marked_blocks(&doc, &text);
        blocks.append(&mut b);
        errors.append(&mut e);
    }
    (blocks, errors)
}

/// `README.md` -> `readme`, `docs/cluster.md` -> `cluster`.
fn stem(doc: &Path) -> String {
    doc.file_stem()
        .map(|s| s.to_string_lossy().to_lowercase().replace(['-', '.'], "_"))
        .unwrap_or_default()
}

/// The tools a block may use that a machine may lack, each a prerequisite.
const TOOLS: [(&str, Prerequisite); 2] = [("openssl", openssl), ("nc", nc)];

fn tool(name: &str, version_arg: &str) -> Result<(), String> {
    let ok = Command::new(name)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match ok {
        true => Ok(()),
        false => Err(format!("{name} is not installed")),
    }
}

fn openssl() -> Result<(), String> {
    tool("openssl", "version")
}

/// `nc -h` exits 1 in some implementations: found on PATH is enough.
fn nc() -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    match std::env::split_paths(&path).any(|dir| dir.join("nc").is_file()) {
        true => Ok(()),
        false => Err("nc is not installed (Debian: apt-get install netcat-openbsd)".into()),
    }
}

/// Every block's prerequisite: a network namespace of its own.
fn namespaces() -> Result<(), String> {
    let out = Command::new("unshare")
        .args(["--net", "true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run unshare (util-linux): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "unshare --net fails (needs root): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    tool("ip", "-V").map_err(|e| format!("{e} (Debian: apt-get install iproute2)"))
}

/// Whether `word` is used as a command in `text` (at a line's or a
/// pipeline's start, or after `$(`).
fn uses(text: &str, word: &str) -> bool {
    text.lines().any(|line| {
        line.split(['|', ';', '&', '('])
            .any(|part| part.split_whitespace().next() == Some(word))
    })
}

fn main() -> std::process::ExitCode {
    let mut tests = tests![the_marks_parse, readme_test_command_is_what_ci_runs];
    let mut seen: Vec<(String, usize)> = Vec::new();
    for block in all_blocks().0 {
        let stem = stem(&block.doc);
        let n = match seen.iter_mut().find(|(s, _)| *s == stem) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                seen.push((stem.clone(), 1));
                1
            }
        };
        let all = format!("{}\n{}", block.after.as_deref().unwrap_or(""), block.text);
        let mut test = Test::new(format!("{stem}_{n}"), move || run_block(&block))
            .requires("namespaces", namespaces);
        for (name, check) in TOOLS {
            if uses(&all, name) {
                test = test.requires(name, check);
            }
        }
        tests.push(test);
    }
    common::harness::run(file!(), [tests])
}

/// Every `<!-- tested` comment parses and comes right before a block.
fn the_marks_parse() {
    let errors = all_blocks().1;
    assert!(
        errors.is_empty(),
        "marks that do not parse:\n{}",
        errors.join("\n")
    );
}

/// README's `cargo test` command (not run here: it is this suite) is the
/// one `.ci/run` runs.
fn readme_test_command_is_what_ci_runs() {
    let ci = std::fs::read_to_string(root().join(".ci/run")).expect("read .ci/run");
    let ci_command = ci
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("cargo test "))
        .expect(".ci/run runs cargo test")
        .split(" 2>&1")
        .next()
        .unwrap()
        .trim()
        .to_string();
    let readme = std::fs::read_to_string(root().join("README.md")).expect("read README.md");
    let shown: Vec<String> = readme
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .filter(|l| l.starts_with("cargo test"))
        .collect();
    assert!(!shown.is_empty(), "README.md shows no cargo test command");
    for command in shown {
        assert_eq!(
            command, ci_command,
            "README.md's test command is not .ci/run's"
        );
    }
}

/// The script a block runs as: the prelude, the setup, the block.
fn script(block: &Block, scratch: &Path) -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_ringlock"))
        .parent()
        .expect("the binary's directory")
        .display()
        .to_string();
    let install = scratch.join("install");
    let install = install.display();
    let mut s = format!(
        "set -euo pipefail\n\
         ip link set lo up\n\
         export CARGO_INSTALL_ROOT={install} CARGO_NET_OFFLINE=true\n\
         export PATH={install}/bin:{bin}:\"$PATH\"\n\
         wait_for_ringlock() {{\n\
         \x20 local addr=${{1:-127.0.0.1:7171}} i\n\
         \x20 for i in $(seq 100); do\n\
         \x20   ringlock status --server \"$addr\" --timeout 1 >/dev/null 2>&1 && return 0\n\
         \x20   sleep 0.1\n\
         \x20 done\n\
         \x20 echo \"no ringlock node answers on $addr\" >&2\n\
         \x20 return 1\n\
         }}\n\
         wait_until() {{\n\
         \x20 local i\n\
         \x20 for i in $(seq 100); do\n\
         \x20   \"$@\" >/dev/null 2>&1 && return 0\n\
         \x20   sleep 0.1\n\
         \x20 done\n\
         \x20 echo \"not within 10 s: $*\" >&2\n\
         \x20 return 1\n\
         }}\n"
    );
    if let Some(after) = &block.after {
        s.push_str(&format!("# setup (the mark's after:)\n{after}\n"));
    }
    s.push_str(&format!("# {}:{}\n", block.doc.display(), block.line));
    match &block.serves {
        None if block.transcript => {
            for (i, (command, _)) in transcript(&block.text).iter().enumerate() {
                let out = scratch.join(format!("out.{i}"));
                s.push_str(&format!("{{ {command}\n}} >{} 2>&1\n", out.display()));
            }
        }
        None => s.push_str(&block.text),
        Some(addr) => s.push_str(&format!(
            "(\n{}) &\n\
             block=$!\n\
             until ringlock status --server {addr} --timeout 1 >/dev/null 2>&1; do\n\
             \x20 if ! kill -0 \"$block\" 2>/dev/null; then\n\
             \x20   wait \"$block\" && status=0 || status=$?\n\
             \x20   echo \"the block ended (status $status) before a node answered on {addr}\" >&2\n\
             \x20   exit 1\n\
             \x20 fi\n\
             \x20 sleep 0.2\n\
             done\n\
             echo \"a node answers on {addr}\" >&2\n",
            block.text
        )),
    }
    s
}

/// Runs one marked block (see the top of this file).
fn run_block(block: &Block) {
    let scratch = std::env::temp_dir().join(format!(
        "ringlock-docs-{}-{}",
        stem(&block.doc),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("work")).expect("make a scratch directory");
    let script_path = scratch.join("block.sh");
    std::fs::write(&script_path, script(block, &scratch)).expect("write the script");
    // Blocks that run in the checkout take turns: each removes what it
    // created there, which must not be another block's.
    let lock = block.in_checkout.then(|| {
        let path = Path::new(env!("CARGO_BIN_EXE_ringlock")).with_file_name("docs-checkout.lock");
        let file = std::fs::File::create(path).expect("the checkout's lock file");
        file.lock().expect("lock the checkout");
        file
    });
    let cwd = match block.in_checkout {
        true => root(),
        false => scratch.join("work"),
    };
    let before = entries(&cwd);
    eprintln!(
        "{}:{}: running in {} ({})",
        block.doc.display(),
        block.line,
        cwd.display(),
        script_path.display()
    );
    let outcome = run_script(&script_path, &cwd).and_then(|()| match block.transcript {
        true => compare_transcript(&block.text, &scratch),
        false => Ok(()),
    });
    if block.in_checkout {
        for created in entries(&cwd).into_iter().filter(|e| !before.contains(e)) {
            let path = cwd.join(&created);
            eprintln!("removing {}, which the block created", path.display());
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
    drop(lock);
    let _ = std::fs::remove_dir_all(&scratch);
    if let Err(why) = outcome {
        panic!(
            "{}:{}: the block failed: {why}\n{}",
            block.doc.display(),
            block.line,
            block.text
        );
    }
}

/// A transcript's commands (`$ ` lines) and the output shown after each.
fn transcript(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            out.push((command.to_string(), String::new()));
        } else if let Some((_, shown)) = out.last_mut() {
            shown.push_str(line);
            shown.push('\n');
        }
    }
    out
}

/// Output as compared: every number is `N` (tokens, times and ports
/// differ from run to run), runs of spaces are one, no blank lines at the
/// end.
fn normalized(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars.next_if(|c| c.is_ascii_digit() || *c == '.').is_some() {}
            out.push('N');
        } else if c == ' ' {
            while chars.next_if_eq(&' ').is_some() {}
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

/// Each command's output (written by the script) is what the block shows.
fn compare_transcript(text: &str, scratch: &Path) -> Result<(), String> {
    for (i, (command, shown)) in transcript(text).iter().enumerate() {
        let path = scratch.join(format!("out.{i}"));
        let got = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if normalized(&got) != normalized(shown) {
            return Err(format!(
                "`{command}` printed\n{got}\nwhere the block shows\n{shown}\n\
                 (compared with every number as N and runs of spaces as one)"
            ));
        }
    }
    Ok(())
}

/// The names in `dir`.
fn entries(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
        .unwrap_or_default()
}

/// Runs `bash SCRIPT` in a network namespace of its own, in its own
/// process group, ended (with all it started) when it exits or runs out of
/// time.
fn run_script(script: &Path, cwd: &Path) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("unshare")
        .args(["--net", "--", "bash"])
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    let group = rustix::process::Pid::from_child(&child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    end_group(group);
    let _ = child.wait();
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("it ended with {s}")),
        None => Err(format!("it did not end within {LIMIT:?}")),
    }
}

/// Ends every process of the group: SIGTERM, then SIGKILL to what is left
/// after 5 s.
fn end_group(group: rustix::process::Pid) {
    use rustix::process::{Signal, kill_process_group, test_kill_process_group};
    let _ = kill_process_group(group, Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while test_kill_process_group(group).is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill_process_group(group, Signal::KILL);
}
