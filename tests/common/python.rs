//! A Python for the tests that run the Python client (clients/python): a
//! virtual environment under the target directory, made once with pytest
//! in it, with the package installed as a user installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A Python 3.9+ that can make virtual environments, or why there is none.
pub fn python() -> Result<String, String> {
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

/// The prerequisite of a test that runs the Python client: such a Python.
pub fn prerequisite() -> Result<(), String> {
    python().map(drop)
}

pub fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// The virtual environment under target/, made with pytest the first time.
pub fn venv(python: &str) -> PathBuf {
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

/// Installs this tree's clients/python into the environment `dir`
/// (again, over what an earlier run installed).
pub fn install_package(dir: &Path) {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python");
    run(
        // `python -m pip`, not the `pip` script: a script's first line names
        // the path the environment was made at, so in a copied target/ it
        // would install into the original's environment.
        Command::new(dir.join("bin/python"))
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
}

/// The environment's `python`, with this tree's package installed (once per
/// test process: the tests of a file share it).
pub fn with_package() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let python = python().expect("the prerequisite was checked");
        let dir = venv(&python);
        install_package(&dir);
        dir
    })
    .join("bin/python")
}
