//! What the bench crate's integration tests share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `ringlock` server binary, from the same workspace build. It belongs
/// to another package, so cargo gives no `CARGO_BIN_EXE_` for it; cargo
/// (re)builds it here for the profile of `beside` (a binary of this test's
/// build), which is instant when `cargo test` at the root already did.
pub(crate) fn server(beside: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(beside);
            let profile = match dir.parent().and_then(|d| d.file_name()) {
                Some(name) if name == "debug" => "dev".to_string(),
                Some(name) => name.to_string_lossy().into_owned(),
                None => "dev".to_string(),
            };
            let status = Command::new(env!("CARGO"))
                .args(["build", "--quiet", "--profile", &profile])
                .args(["-p", "ringlock", "--bin", "ringlock"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build for the ringlock server");
            assert!(status.success(), "cargo build --bin ringlock failed");
            let path = dir.with_file_name("ringlock");
            assert!(
                path.is_file(),
                "{} not found after the build",
                path.display()
            );
            path
        })
        .clone()
}

/// The harness of the test files with prerequisites, shared with the
/// workspace's root package (its top comment says how to use it).
#[path = "../../../../tests/common/harness.rs"]
#[macro_use]
#[allow(dead_code, unreachable_pub, unused_macros)]
pub(crate) mod harness;
