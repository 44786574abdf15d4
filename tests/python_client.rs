//! The Python client's test suite (clients/python/tests, pytest) against
//! this build's server, so that `cargo test` is the whole suite.
//!
//! The package is installed as a user installs it (`pip install
//! ./clients/python`) into a virtual environment under the target
//! directory, with pytest beside it; the environment is made once and the
//! package reinstalled on every run. Where no Python 3.9+ with `venv` exists
//! the harness reports the test as ignored ([`python::prerequisite`]); every other failure (pip cannot
//! reach its index, a Python test fails, no test is collected: pytest's exit
//! status 5) fails it.

#[macro_use]
mod common;

use common::python;

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The workspace root (this package's manifest directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python_client_suite() {
    let python = python::python().expect("the prerequisite was checked");
    let dir = python::venv(&python);
    let bin = dir.join("bin");
    let package = root().join("clients/python");
    python::install_package(&dir);
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
    common::harness::run(
        file!(),
        [tests![python_client_suite if python::prerequisite]],
    )
}
