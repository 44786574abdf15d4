//! The cluster's secret file (`--cluster-secret-file`, `ringlock keygen`)
//! and the OS's random numbers: the I/O around the core's
//! [`Secret`], which only ever sees bytes.

use crate::cluster::auth::{self, Secret};

/// Random bytes in a secret written by `ringlock keygen`.
pub const SECRET_BYTES: usize = 32;

/// The fewest characters a secret file must hold (after trimming white
/// space): 32, i.e. 128 bits of hex. `ringlock keygen` writes 64.
pub const MIN_SECRET_CHARS: usize = 32;

/// Reads a secret file: its contents, trailing white space trimmed, are
/// the secret. Refuses a file with fewer than [`MIN_SECRET_CHARS`]
/// characters. Returns a warning too if others than the owner may read
/// the file.
pub fn load(path: &std::path::Path) -> Result<(Secret, Option<String>), String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read --cluster-secret-file {shown}: {e} (make one with `ringlock keygen {shown}`)"
        )
    })?;
    let trimmed = bytes.trim_ascii();
    if trimmed.len() < MIN_SECRET_CHARS {
        return Err(format!(
            "--cluster-secret-file {shown} holds {} characters; a secret needs at least \
             {MIN_SECRET_CHARS} (make one with `ringlock keygen PATH`)",
            trimmed.len()
        ));
    }
    let mode = std::fs::metadata(path).map(|m| m.mode()).unwrap_or(0);
    let warning = (mode & 0o077 != 0).then(|| {
        format!(
            "--cluster-secret-file {shown} may be read by others (mode {:o}); chmod 600 it",
            mode & 0o777
        )
    });
    Ok((Secret::from_bytes(trimmed), warning))
}

/// Writes a fresh secret ([`SECRET_BYTES`] random bytes, as hex) to a
/// new file readable by its owner only. Refuses to overwrite a file.
pub fn generate(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut text = auth::hex(&bytes);
    text.push('\n');
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// A random 64-bit number from the OS (incarnations).
pub fn random_u64() -> std::io::Result<u64> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_are_written_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ringlock-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        let _ = std::fs::remove_file(&path);
        generate(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (secret, warning) = load(&path).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        let written = written.trim_end();
        assert_eq!(written.len(), 2 * SECRET_BYTES);
        // What was loaded is what was written (the same MACs).
        let same = Secret::from_bytes(written.as_bytes());
        assert_eq!(secret.nonce(1, 2), same.nonce(1, 2));
        assert!(warning.is_none());
        // Never overwritten.
        assert!(generate(&path).is_err());
        // Too short.
        std::fs::write(dir.join("short"), "abc\n").unwrap();
        let err = load(&dir.join("short")).unwrap_err();
        assert!(err.contains("at least 32"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
