//! The gateway's WireGuard private key, kept in a file only root can read.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use base64::{Engine, engine::general_purpose::STANDARD};
use boringtun::x25519::{PublicKey, StaticSecret};
use thiserror::Error;

/// A key file that cannot be used. The messages never include key material.
#[derive(Debug, Error)]
pub enum KeyError {
    /// Reading or writing the file failed.
    #[error("{0}: {1}")]
    Io(PathBuf, io::Error),
    /// Group or others may read the file.
    #[error("{path}: mode {mode:o} lets group or others read the private key; chmod 600 it")]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file does not hold a base64 32-byte key.
    #[error("{0}: not a base64-encoded 32-byte WireGuard private key")]
    Malformed(PathBuf),
    /// No randomness for a new key.
    #[error("generating a key: {0}")]
    Random(getrandom::Error),
}

/// A WireGuard static key pair.
pub struct KeyPair {
    /// The private half.
    pub private: StaticSecret,
    /// The public half, shared with peers.
    pub public: PublicKey,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key must never reach a log line.
        write!(
            f,
            "KeyPair {{ public: {} }}",
            encode(self.public.as_bytes())
        )
    }
}

/// Base64, as WireGuard tools print keys.
pub fn encode(bytes: &[u8; 32]) -> String {
    STANDARD.encode(bytes)
}

/// Parses a base64 32-byte key.
pub fn decode(text: &str) -> Option<[u8; 32]> {
    STANDARD.decode(text.trim()).ok()?.try_into().ok()
}

/// Loads the key in `path`, or generates one there (mode 0600) if the file
/// does not exist. Refuses a file that group or others can read.
pub fn load_or_generate(path: &Path) -> Result<KeyPair, KeyError> {
    let io_err = |e| KeyError::Io(path.to_owned(), e);
    let private = match fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::TooOpen {
                    path: path.to_owned(),
                    mode,
                });
            }
            let text = fs::read_to_string(path).map_err(io_err)?;
            decode(&text).ok_or_else(|| KeyError::Malformed(path.to_owned()))?
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let bytes = generate()?;
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io_err)?;
            writeln!(file, "{}", encode(&bytes)).map_err(io_err)?;
            bytes
        }
        Err(e) => return Err(io_err(e)),
    };
    Ok(KeyPair::from_private(private))
}

/// A new random private key.
pub fn generate() -> Result<[u8; 32], KeyError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(KeyError::Random)?;
    Ok(bytes)
}

impl KeyPair {
    /// The pair of a private key.
    pub fn from_private(private: [u8; 32]) -> Self {
        let private = StaticSecret::from(private);
        let public = PublicKey::from(&private);
        Self { private, public }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_with_mode_0600_then_reloads_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let first = load_or_generate(&path).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let again = load_or_generate(&path).unwrap();
        assert_eq!(first.public.as_bytes(), again.public.as_bytes());
    }

    #[test]
    fn refuses_a_key_others_can_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        load_or_generate(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_or_generate(&path).unwrap_err().to_string();
        assert!(
            err.contains("mode 644") && err.contains("chmod 600"),
            "{err}"
        );
    }

    #[test]
    fn rejects_garbage_without_echoing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        fs::write(&path, "c2VjcmV0LWJ1dC1zaG9ydA==\n").unwrap();
        let err = load_or_generate(&path).unwrap_err().to_string();
        assert!(err.contains("not a base64-encoded 32-byte"), "{err}");
        assert!(
            !err.contains("c2VjcmV0"),
            "the error echoed the file: {err}"
        );
    }

    #[test]
    fn debug_shows_only_the_public_key() {
        let dir = tempfile::tempdir().unwrap();
        let pair = load_or_generate(&dir.path().join("key")).unwrap();
        let private = encode(&pair.private.to_bytes());
        let shown = format!("{pair:?}");
        assert!(!shown.contains(&private));
        assert!(shown.contains(&encode(pair.public.as_bytes())));
    }
}
