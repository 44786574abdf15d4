//! The Python client's test suite (clients/python/tests, pytest) against
//! this build's server, so that `cargo test` is the whole suite.
//!
//! The package is installed as a user installs it (`pip install
//! ./clients/python`) into a virtual environment under the target
//! directory, with pytest beside it; the environment is made once and the
//! package reinstalled on every run. Where no Python 3.9+ with `venv` exists
//! the harness reports the test as ignored ([`prerequisite`]); every other failure (pip cannot
//! reach its index, a Python test fails, no test is collected: pytest's exit
//! status 5) fails it.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workspace root (this package's manifest directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Python 3.9+ that can make virtual environments, or why there is none.
fn python() -> Result<String, String> {
    let probe = "import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 9) else 1)";
    for candidate in ["python3", "python"] {
        match Command::new(candidate).args(["-c", probe]).status() {
            Ok(s) if s.success() => return Ok(candidate.to_string()),
            Ok(_) => {}
            Err(_) => {}
        }
    }
    Err("no python3 (3.9+, with venv and ensurepip) on PATH".to_string())
}

/// The test's prerequisite: such a Python.
fn prerequisite() -> Result<(), String> {
    python().map(drop)
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// The virtual environment under target/, made with pytest the first time.
fn venv(python: &str) -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ringlock"));
    // target/<profile>/ringlock -> target/python-venv
    let target = exe
        .parent()
        .and_then(Path::parent)
        .expect("the binary lives in target/<profile>/");
    let dir = target.join("python-venv");
    let bin = dir.join("bin");
    if !bin.join("pytest").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        run(
            Command::new(python).arg("-m").arg("venv").arg(&dir),
            "python3 -m venv",
        );
        run(
            Command::new(bin.join("python")).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "pytest",
            ]),
            "pip install pytest",
        );
    }
    dir
}

fn python_client_suite() {
    let python = python().expect("the prerequisite was checked");
    let dir = venv(&python);
    let bin = dir.join("bin");
    let package = root().join("clients/python");
    run(
        // `python -m pip`, not the `pip` script: a script's first line names
        // the path the environment was made at, so in a copied target/ it
        // would install into the original's environment.
        Command::new(bin.join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&package),
        "pip install ./clients/python",
    );
    let status = Command::new(bin.join("python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(package.join("tests"))
        .env("RINGLOCK_BIN", env!("CARGO_BIN_EXE_ringlock"))
        // The installed package, not the source tree, is what is tested.
        .current_dir(&dir)
        .stdin(Stdio::null())
        .status()
        .expect("run pytest");
    match status.code() {
        Some(0) => {}
        Some(5) => panic!("pytest collected no tests in {}", package.display()),
        _ => panic!("the Python client's tests failed: pytest {status}"),
    }
}

fn main() -> std::process::ExitCode {
    common::harness::run(file!(), [tests![python_client_suite if prerequisite]])
}
