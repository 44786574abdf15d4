//! The Node.js client's test suite (clients/node/test, `node --test`)
//! against this build's server, so that `cargo test` is the whole suite.
//!
//! The dev dependencies (typescript, @types/node) are installed with
//! `npm ci` from the committed lockfile into clients/node/node_modules; a
//! run whose lockfile has not changed since the last install reuses them
//! (no network needed). Then the package is built (`npm run build`: tsc
//! into dist/ and build/) and `node --test build/test/*.test.js` runs against
//! RINGLOCK_BIN, this build's server. Where Node.js 20+ or npm is missing
//! the test says so on one line and skips (see `prerequisite`); every other
//! failure (npm cannot reach its registry, tsc fails, a test fails) fails it.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The package's directory.
fn package() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/node")
}

/// Node.js 20 or later and npm on PATH, or why not.
fn prerequisite() -> Result<(), String> {
    common::node_20()
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// `npm ci`, unless node_modules was installed from this very lockfile.
fn install(dir: &Path) {
    let lock =
        std::fs::read(dir.join("package-lock.json")).expect("clients/node/package-lock.json");
    let stamp = dir.join("node_modules/.installed-from-package-lock.json");
    let typescript = dir.join("node_modules/typescript/bin/tsc");
    if typescript.exists() && std::fs::read(&stamp).ok().as_deref() == Some(lock.as_slice()) {
        return;
    }
    run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(dir),
        "npm ci (clients/node)",
    );
    std::fs::write(&stamp, &lock).expect("write the install stamp");
}

fn node_client_suite() {
    let dir = package();
    install(&dir);
    run(
        Command::new("node")
            .arg("scripts/build.mjs")
            .current_dir(&dir),
        "npm run build (clients/node)",
    );
    // The test files by name: given a directory, node 20 runs every .js
    // file in it as a test, helpers too.
    let mut files: Vec<String> = std::fs::read_dir(dir.join("build/test"))
        .expect("build/test")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".test.js"))
        .map(|n| format!("build/test/{n}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no build/test/*.test.js");
    let out = Command::new("node")
        .arg("--test")
        .args(&files)
        .env("RINGLOCK_BIN", env!("CARGO_BIN_EXE_ringlock"))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run node --test");
    let report = String::from_utf8_lossy(&out.stdout);
    println!("{report}");
    assert!(
        out.status.success(),
        "the Node.js client's tests failed: node --test {}",
        out.status
    );
    let ran = report
        .lines()
        .find_map(|l| l.strip_prefix("# tests "))
        .and_then(|n| n.trim().parse::<u32>().ok());
    assert!(
        ran.is_some_and(|n| n > 0),
        "node --test ran no test in {}",
        dir.display()
    );
}

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [tests![node_client_suite if prerequisite]])
}
