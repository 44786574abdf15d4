//! Rules of the code base that the compiler alone does not check.
//!
//! Function length: clippy's `too_many_lines` (threshold in `clippy.toml`)
//! is an error in every crate of the workspace. The functions that were
//! longer when the limit came in carry `#[expect(clippy::too_many_lines)]`
//! and are listed in `tests/long-functions.txt`. That list may only shrink:
//! a function over the limit is split, not added. `expect` (not `allow`)
//! makes the compiler fail when a listed function gets short enough, so its
//! exception is removed with it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// How many exceptions there were when the limit came in. Lower it when an
/// exception goes; never raise it.
const MOST_EXCEPTIONS: usize = 30;

const EXPECT: &str = "#[expect(clippy::too_many_lines";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != "corpus" && name != "artifacts" {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `path::function` for every function that carries the expectation.
fn exceptions_in_tree() -> BTreeSet<String> {
    let root = root();
    let mut files = Vec::new();
    for dir in [
        "src",
        "crates",
        "tests",
        "examples",
        "benches",
        "fuzz/fuzz_targets",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut found = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let rel = file
            .strip_prefix(&root)
            .expect("under the root")
            .display()
            .to_string();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with(EXPECT) {
                continue;
            }
            // The function the attribute belongs to: the next `fn NAME`.
            let name = lines[i + 1..]
                .iter()
                .find_map(|l| {
                    let at = l.find("fn ")?;
                    let rest = &l[at + 3..];
                    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
                    Some(rest[..end].to_string())
                })
                .unwrap_or_else(|| panic!("{rel}:{}: no fn after the expectation", i + 1));
            found.insert(format!("{rel}::{name}"));
        }
    }
    found
}

fn listed() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("tests/long-functions.txt"))
        .expect("tests/long-functions.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn long_functions_are_the_listed_exceptions_only() {
    let found = exceptions_in_tree();
    let listed = listed();
    let new: Vec<_> = found.difference(&listed).collect();
    assert!(
        new.is_empty(),
        "functions over clippy's too_many_lines limit that are not in tests/long-functions.txt \
         (split them instead of adding them): {new:?}"
    );
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "tests/long-functions.txt lists functions that no longer carry the exception \
         (remove them, and lower MOST_EXCEPTIONS): {gone:?}"
    );
    assert!(
        listed.len() <= MOST_EXCEPTIONS,
        "the list of long functions grew to {} (at most {MOST_EXCEPTIONS})",
        listed.len()
    );
}

/// A bare `cargo run` at the root (README's first command) runs the
/// server. Cargo picks the binary only when exactly one of the packages it
/// selects (the workspace's default members) names a `default-run`; with
/// two, or none while several binaries exist, it refuses to choose.
#[test]
fn bare_cargo_run_runs_the_server() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find(|l| l.starts_with("default-members = ["))
        .expect("a one-line default-members in Cargo.toml");
    let members: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
    assert!(members.contains(&"."), "{line}");
    let runs: Vec<(String, String)> = members
        .iter()
        .filter_map(|m| {
            let toml = std::fs::read_to_string(root().join(m).join("Cargo.toml")).unwrap();
            toml.lines()
                .find_map(|l| l.strip_prefix("default-run = "))
                .map(|r| (m.to_string(), r.trim_matches('"').to_string()))
        })
        .collect();
    assert_eq!(
        runs,
        [(".".to_string(), "ringlock".to_string())],
        "default-run among the default members {members:?}"
    );
}

/// Longest a source file of the core crate may be. A file that grows past
/// it is split by topic: a reader should find one subject per file.
const CORE_FILE_LINES: usize = 800;

fn core_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("crates/core/src"), &mut files);
    assert!(files.len() > 10, "the core crate's sources were not found");
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            (
                rel,
                std::fs::read_to_string(&f).expect("read a source file"),
            )
        })
        .collect()
}

/// The core crate (sans-I/O: the engine, the cluster, the node, the
/// driver) stays readable and safe: no file over [`CORE_FILE_LINES`]
/// lines, no `unsafe` (its `lib.rs` forbids it; this catches an attribute
/// removed with it), and errors typed across layers, never
/// `Result<_, String>`.
#[test]
fn the_core_crate_keeps_its_rules() {
    let mut broken = Vec::new();
    for (rel, text) in core_files() {
        let lines = text.lines().count();
        if lines > CORE_FILE_LINES {
            broken.push(format!("{rel}: {lines} lines (at most {CORE_FILE_LINES})"));
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("unsafe ") || code.contains("unsafe{") {
                broken.push(format!("{rel}:{}: unsafe", i + 1));
            }
            let squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
            if squeezed.contains(",String>") && squeezed.contains("Result<") {
                broken.push(format!("{rel}:{}: Result<_, String>", i + 1));
            }
        }
    }
    let lib = std::fs::read_to_string(root().join("crates/core/src/lib.rs")).unwrap();
    if !lib.contains("#![forbid(unsafe_code)]") {
        broken.push("crates/core/src/lib.rs: no #![forbid(unsafe_code)]".into());
    }
    assert!(
        broken.is_empty(),
        "the core crate breaks its rules:\n{}",
        broken.join("\n")
    );
}
