//! The Go client's test suite (clients/go: `go vet`, `gofmt -l`, `go test
//! -race ./...`) against this build's server, so that `cargo test` is the
//! whole suite.
//!
//! Go is the one on PATH, else Debian's golang-1.23-go at
//! /usr/lib/go-1.23/bin/go (scripts/install-go.sh installs it; .ci/run
//! calls that). The build cache and GOPATH live under the target directory,
//! so a clean checkout builds from scratch, and no module proxy is used:
//! the client needs the standard library only. Where no Go 1.23+ exists the
//! test says so on one line and skips; every other failure fails it.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workspace root (this package's manifest directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The target directory: target/<profile>/ringlock -> target.
fn target() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringlock"))
        .parent()
        .and_then(Path::parent)
        .expect("the binary lives in target/<profile>/")
        .to_path_buf()
}

/// True for `go1.23` and later (`go1.23.5`, `go1.24rc1`, `go2...`).
fn recent_enough(version: &str) -> bool {
    let Some(v) = version.trim().strip_prefix("go") else {
        return false;
    };
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    major > 1 || (major == 1 && minor >= 23)
}

/// Where Go is looked for: PATH, then Debian's golang-1.23-go.
const CANDIDATES: [&str; 2] = ["go", "/usr/lib/go-1.23/bin/go"];

/// A Go 1.23+ toolchain, or why there is none.
fn go() -> Result<PathBuf, String> {
    go_among(&CANDIDATES)
}

/// The first of `candidates` that is a Go 1.23+, or why none is.
fn go_among(candidates: &[&str]) -> Result<PathBuf, String> {
    let mut seen = Vec::new();
    for &candidate in candidates {
        let out = Command::new(candidate)
            .args(["env", "GOVERSION"])
            .env("GOTOOLCHAIN", "local")
            .output();
        if let Ok(out) = out {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && recent_enough(&version) {
                return Ok(PathBuf::from(candidate));
            }
            seen.push(format!("{candidate} is {version:?}"));
        }
    }
    if seen.is_empty() {
        return Err("no Go toolchain (go on PATH or /usr/lib/go-1.23/bin/go; scripts/install-go.sh installs Go 1.23)".into());
    }
    Err(format!("no Go 1.23 or later ({})", seen.join(", ")))
}

/// Whether the Go tests can run here: a Go 1.23+ toolchain.
fn prerequisite() -> Result<(), String> {
    go().map(|_| ())
}

/// `go SUBCOMMAND ...` in clients/go with the environment of these tests.
fn go_cmd(go: &Path, args: &[&str]) -> Command {
    let target = target();
    let mut cmd = Command::new(go);
    cmd.args(args)
        .current_dir(root().join("clients/go"))
        .env("GOCACHE", target.join("go/cache"))
        .env("GOPATH", target.join("go/path"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("RINGLOCK_BIN", env!("CARGO_BIN_EXE_ringlock"))
        .stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

fn go_client_suite() {
    let go = go().expect("checked by prerequisite");
    run(&mut go_cmd(&go, &["vet", "./..."]), "go vet ./...");
    // gofmt sits next to go.
    let gofmt = go
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("gofmt"), |dir| dir.join("gofmt"));
    let out = Command::new(&gofmt)
        .args(["-l", "."])
        .current_dir(root().join("clients/go"))
        .output()
        .expect("run gofmt");
    assert!(out.status.success(), "gofmt -l failed");
    let unformatted = String::from_utf8_lossy(&out.stdout);
    assert!(
        unformatted.trim().is_empty(),
        "not gofmt-formatted:\n{unformatted}"
    );
    run(
        &mut go_cmd(
            &go,
            &["test", "-race", "-count=1", "-timeout", "10m", "./..."],
        ),
        "go test -race ./... (clients/go)",
    );
}

fn go_versions_are_read_right() {
    assert!(recent_enough("go1.23.5"));
    assert!(recent_enough("go1.24rc1"));
    assert!(recent_enough("go2.0"));
    assert!(!recent_enough("go1.19.8"));
    assert!(!recent_enough("devel"));
}

fn no_go_is_a_reason_to_skip() {
    let why = go_among(&["/nonexistent/bin/go"]).expect_err("no Go there");
    assert!(why.contains("no Go toolchain"), "{why}");
    // `true` runs but is no Go: named with what it said.
    let why = go_among(&["true"]).expect_err("true is not Go");
    assert!(why.contains("true is \"\""), "{why}");
}

fn main() -> std::process::ExitCode {
    common::harness::run(
        file!(),
        [
            tests![go_client_suite if prerequisite, go_versions_are_read_right, no_go_is_a_reason_to_skip],
        ],
    )
}
