//! The gateway's WireGuard private key, kept in a file only root can read.

use std::{
    fs,
    io::{self, Read, Write},
    os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use boringtun::x25519::{PublicKey, StaticSecret};
use thiserror::Error;

use crate::model::key_text::{decode, encode};

/// Where a gateway keeps its WireGuard private key, without Kubernetes.
pub const DEFAULT_KEY_FILE: &str = "/var/lib/isthmus/private.key";

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
    /// The path is a symbolic link, a directory, a device or a FIFO.
    #[error("{path}: {what}, not a regular file; the key is read only from a regular file")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// Someone else owns the file, and could have written a key of theirs.
    #[error("{path}: owned by uid {owner}, not by this agent (uid {us}); chown it")]
    NotOurs {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The agent's effective uid.
        us: u32,
    },
    /// The file does not hold a base64 32-byte key.
    #[error("{0}: not a base64-encoded 32-byte WireGuard private key")]
    Malformed(PathBuf),
    /// No randomness for a new key.
    #[error("generating a key: {0}")]
    Random(getrandom::Error),
}

#[derive(Clone)]
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

/// Loads the key in `path`, or generates one there (mode 0600) if the file
/// does not exist. The file is opened without following a symbolic link,
/// and the descriptor itself is checked: a regular file, ours, that group
/// and others cannot read.
pub fn load_or_generate(path: &Path) -> Result<KeyPair, KeyError> {
    let io_err = |e| KeyError::Io(path.to_owned(), e);
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let private = match opened {
        Ok(mut file) => {
            let meta = file.metadata().map_err(io_err)?;
            usable(path, &meta, nix::unistd::geteuid().as_raw())?;
            let mut text = String::new();
            file.read_to_string(&mut text).map_err(io_err)?;
            decode(&text).ok_or_else(|| KeyError::Malformed(path.to_owned()))?
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => create(path)?,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(KeyError::NotRegular {
                path: path.to_owned(),
                what: "a symbolic link",
            });
        }
        Err(e) => return Err(io_err(e)),
    };
    Ok(KeyPair::from_private(private))
}

/// Refuses what `meta` says is no place for a private key: anything but a
/// regular file, a file owned by another user than `us`, or one that group
/// or others can read.
fn usable(path: &Path, meta: &fs::Metadata, us: u32) -> Result<(), KeyError> {
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = match () {
            () if kind.is_dir() => "a directory",
            () if kind.is_fifo() => "a FIFO",
            () if kind.is_socket() => "a socket",
            () => "a device",
        };
        return Err(KeyError::NotRegular {
            path: path.to_owned(),
            what,
        });
    }
    if meta.uid() != us {
        return Err(KeyError::NotOurs {
            path: path.to_owned(),
            owner: meta.uid(),
            us,
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Writes a new key to `path`: to a temporary file beside it first,
/// synced, then linked into place, which fails rather than replace a file
/// that appeared meanwhile. A crash leaves no half-written key.
fn create(path: &Path) -> Result<[u8; 32], KeyError> {
    let io_err = |e| KeyError::Io(path.to_owned(), e);
    let bytes = generate()?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)?;
        writeln!(file, "{}", encode(&bytes))?;
        file.sync_all()?;
        fs::hard_link(&temporary, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    let _ = fs::remove_file(&temporary);
    written.map_err(io_err)?;
    Ok(bytes)
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
    fn refuses_a_link_a_directory_and_another_users_file() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        load_or_generate(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = load_or_generate(&link).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "a symbolic link, not a regular file; the key is read only from a regular file"
            ),
            "{err}"
        );
        let err = load_or_generate(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a directory, not a regular file"), "{err}");
        // Ownership, judged from the descriptor's metadata.
        let meta = fs::metadata(&real).unwrap();
        let err = usable(&real, &meta, meta.uid() + 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("owned by uid {}, not by this agent", meta.uid())),
            "{err}"
        );
        assert!(usable(&real, &meta, meta.uid()).is_ok());
    }

    #[test]
    fn a_new_key_leaves_no_temporary_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        load_or_generate(&dir.path().join("key")).unwrap();
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["key"]);
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
