//! The directory source: reads YAML (and JSON) files and watches the
//! directory, sending one event per file that changed.
//!
//! Whoever can write the directory is an object author, not the agent's
//! equal: only regular files inside it are read (a link may lead to one,
//! as a ConfigMap volume's do, but not out of the directory), at most
//! [`MAX_FILE_BYTES`] of each, and opening never waits on a FIFO or a
//! device. Anything else is an unreadable origin, named.

use std::{
    collections::BTreeSet,
    fs, io,
    io::Read,
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use notify::{
    EventKind, RecursiveMode, Watcher,
    event::{AccessKind, AccessMode, ModifyKind},
};
use thiserror::Error;
use tokio::sync::mpsc;
use tracing::warn;

use super::SourceEvent;
use crate::model::object::{DocumentError, parse_documents};

/// A directory that cannot be watched.
#[derive(Debug, Error)]
pub enum DirError {
    /// Reading the directory failed.
    #[error("{0}: {1}")]
    Read(PathBuf, io::Error),
    /// inotify refused the watch.
    #[error("{0}: cannot watch: {1}")]
    Watch(PathBuf, notify::Error),
}

/// Reads every YAML file in `dir`, then follows changes. Events stop when
/// the receiver is dropped.
pub fn watch_dir(dir: &Path) -> Result<mpsc::Receiver<SourceEvent>, DirError> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<PathBuf>();
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) if completes(event.kind) => {
                event.paths.into_iter().for_each(|p| drop(raw_tx.send(p)));
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "directory watch error"),
        })
        .map_err(|e| DirError::Watch(dir.into(), e))?;
    // Watch before the first scan, so no change falls between the two.
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|e| DirError::Watch(dir.into(), e))?;
    let initial = yaml_files(dir)?;
    let dir = dir.to_path_buf();

    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let _watcher = watcher;
        for path in initial {
            if tx.send(read_off_runtime(&dir, path).await).await.is_err() {
                return;
            }
        }
        if tx.send(SourceEvent::Synced).await.is_err() {
            return;
        }
        while let Some(first) = raw_rx.recv().await {
            // Whatever else is already queued is read once, in the same pass.
            let mut changed = BTreeSet::from([first]);
            while let Ok(path) = raw_rx.try_recv() {
                changed.insert(path);
            }
            for path in changed.into_iter().filter(|p| is_yaml(p)) {
                if tx.send(read_off_runtime(&dir, path).await).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// Whether an event leaves a file complete, so it can be read now: closed
/// after writing, renamed in or out, or removed. Creating and writing come
/// before the close, and reading then could see half a file.
/// Every object file of `dir` once, as `watch_dir` first sends them.
pub fn read_dir(dir: &Path) -> Result<Vec<SourceEvent>, DirError> {
    Ok(yaml_files(dir)?
        .iter()
        .map(|path| read(dir, path))
        .collect())
}

fn completes(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Remove(_)
    )
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, DirError> {
    let entries = fs::read_dir(dir).map_err(|e| DirError::Read(dir.into(), e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_yaml(p))
        .collect();
    files.sort();
    Ok(files)
}

/// YAML (and JSON) files count; hidden files (editor swap and temporary
/// files) do not.
fn is_yaml(path: &Path) -> bool {
    let visible = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| !n.starts_with('.'));
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    );
    visible && yaml
}

/// The most of one file that is read: a larger one is refused, not cut.
pub const MAX_FILE_BYTES: u64 = 32 << 20;

/// [`read`] on a thread of its own: a slow file system holds up no task.
async fn read_off_runtime(dir: &Path, path: PathBuf) -> SourceEvent {
    let dir = dir.to_path_buf();
    let origin = path.display().to_string();
    tokio::task::spawn_blocking(move || read(&dir, &path))
        .await
        .unwrap_or_else(|e| unreadable(origin, e.to_string()))
}

/// The objects of `path`, a file of `dir`; Removed when it is gone.
fn read(dir: &Path, path: &Path) -> SourceEvent {
    let origin = path.display().to_string();
    match read_regular(dir, path) {
        Ok(text) => SourceEvent::Origin {
            documents: parse_documents(path, &text),
            origin,
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => SourceEvent::Removed { origin },
        Err(e) => unreadable(origin, e.to_string()),
    }
}

fn unreadable(origin: String, reason: String) -> SourceEvent {
    SourceEvent::Origin {
        documents: vec![Err(DocumentError::Unreadable {
            file: origin.clone(),
            reason,
        })],
        origin,
    }
}

/// The text of `path` if it is, or links to, a regular file inside `dir`
/// of at most [`MAX_FILE_BYTES`].
fn read_regular(dir: &Path, path: &Path) -> io::Result<String> {
    let target = fs::canonicalize(path)?;
    if !target.starts_with(fs::canonicalize(dir)?) {
        return Err(io::Error::other(format!(
            "a link to {}, outside {}; not read",
            target.display(),
            dir.display()
        )));
    }
    // Non-blocking: opening a FIFO would otherwise wait for a writer.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&target)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(format!(
            "a {}, not a regular file; not read",
            file_kind(meta.file_type())
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let mut text = String::new();
    // The file may grow after the check: read no more than the cap allows.
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(text)
}

fn too_large() -> io::Error {
    io::Error::other(format!(
        "larger than {} MiB; not read",
        MAX_FILE_BYTES >> 20
    ))
}

fn file_kind(kind: fs::FileType) -> &'static str {
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_visible_yaml_files_count() {
        assert!(is_yaml(Path::new("/d/peer-b.yaml")));
        assert!(is_yaml(Path::new("/d/peer-b.yml")));
        assert!(is_yaml(Path::new("/d/natmapping-a.json")));
        assert!(!is_yaml(Path::new("/d/.peer-b.yaml.swp")));
        assert!(!is_yaml(Path::new("/d/.tmp.yaml")));
        assert!(!is_yaml(Path::new("/d/README.md")));
    }

    /// The reason `read` gives for `name` in `dir`, or None when it reads.
    fn refusal(dir: &Path, name: &str) -> Option<String> {
        match read(dir, &dir.join(name)) {
            SourceEvent::Origin { documents, .. } => match &documents[..] {
                [Err(DocumentError::Unreadable { reason, .. })] => Some(reason.clone()),
                _ => None,
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_regular_files_inside_the_directory_of_bounded_size_are_read() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.yaml");
        fs::write(&secret, "apiVersion: v1\nkind: X\nmetadata: {name: x}\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(
            d.join("ok.yaml"),
            "apiVersion: v1\nkind: X\nmetadata: {name: x}\n",
        )
        .unwrap();
        // A ConfigMap volume's shape: a link to a file in a hidden directory.
        fs::create_dir(d.join("..data")).unwrap();
        fs::write(d.join("..data/cm.yaml"), "{}").unwrap();
        std::os::unix::fs::symlink(d.join("..data/cm.yaml"), d.join("cm.yaml")).unwrap();
        std::os::unix::fs::symlink(&secret, d.join("out.yaml")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::create_dir(d.join("dir.yaml")).unwrap();
        let big = fs::File::create(d.join("big.yaml")).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert_eq!(refusal(d, "ok.yaml"), None);
        assert_eq!(refusal(d, "cm.yaml"), None);
        assert!(
            refusal(d, "out.yaml").unwrap().contains("outside"),
            "{:?}",
            refusal(d, "out.yaml")
        );
        assert_eq!(
            refusal(d, "fifo.yaml").as_deref(),
            Some("a FIFO, not a regular file; not read")
        );
        assert_eq!(
            refusal(d, "dir.yaml").as_deref(),
            Some("a directory, not a regular file; not read")
        );
        assert_eq!(
            refusal(d, "big.yaml").as_deref(),
            Some("larger than 32 MiB; not read")
        );
        // The directory listing offers every one of them, each with its verdict.
        assert_eq!(read_dir(d).unwrap().len(), 6);
    }

    #[tokio::test]
    async fn sends_initial_files_then_synced_then_changes() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: X\nmetadata: {name: x}\n",
        )
        .unwrap();
        let mut rx = watch_dir(dir.path()).unwrap();
        assert!(matches!(rx.recv().await, Some(SourceEvent::Origin { .. })));
        assert!(matches!(rx.recv().await, Some(SourceEvent::Synced)));
        fs::remove_file(dir.path().join("a.yaml")).unwrap();
        match rx.recv().await {
            Some(SourceEvent::Removed { origin }) => assert!(origin.ends_with("a.yaml")),
            other => panic!("{other:?}"),
        }
    }
}
