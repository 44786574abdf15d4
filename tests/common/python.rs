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

/// target/ (the binary lives in target/<profile>/).
fn target_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ringlock"));
    exe.parent()
        .and_then(Path::parent)
        .expect("the binary lives in target/<profile>/")
        .to_path_buf()
}

/// Held while the environment is made or the package installed into it:
/// the tests of a harness file run at once, each in a process of its own,
/// and two `venv` or `pip install` runs into one directory break each
/// other (`File exists`). Released when dropped.
fn exclusive() -> std::fs::File {
    let path = target_dir().join("python-venv.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.lock()
        .unwrap_or_else(|e| panic!("lock {}: {e}", path.display()));
    file
}

/// The virtual environment under target/, made with pytest the first time.
pub fn venv(python: &str) -> PathBuf {
    let _only_us = exclusive();
    let dir = target_dir().join("python-venv");
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
    let _only_us = exclusive();
    install(dir);
    let _ = std::fs::write(dir.join(STAMP), package_stamp());
}

/// Where the environment records which package sources it has installed.
const STAMP: &str = "ringlock-package-stamp";

/// A digest of this tree's Python package sources: a second test process
/// finds it in the environment and does not install over the files a
/// first one's Python is importing.
fn package_stamp() -> String {
    use std::hash::{Hash, Hasher};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("src/ringlock"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.push(root.join("pyproject.toml"));
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    format!("{:016x}\n", h.finish())
}

fn install(dir: &Path) {
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
        let _only_us = exclusive();
        let stamp = package_stamp();
        if std::fs::read_to_string(dir.join(STAMP)).ok().as_deref() != Some(stamp.as_str()) {
            install(&dir);
            let _ = std::fs::write(dir.join(STAMP), stamp);
        }
        dir
    })
    .join("bin/python")
}
