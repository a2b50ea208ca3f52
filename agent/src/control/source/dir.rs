//! The directory source: reads YAML (and JSON) files and watches the
//! directory, sending one event per file that changed.

use std::{
    collections::BTreeSet,
    fs, io,
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
            Ok(event) if completes(&event.kind) => {
                event.paths.into_iter().for_each(|p| drop(raw_tx.send(p)))
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

    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let _watcher = watcher;
        for path in initial {
            if tx.send(read(&path)).await.is_err() {
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
                if tx.send(read(&path)).await.is_err() {
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
    Ok(yaml_files(dir)?.iter().map(|path| read(path)).collect())
}

fn completes(kind: &EventKind) -> bool {
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
        .filter(|p| is_yaml(p) && p.is_file())
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

fn read(path: &Path) -> SourceEvent {
    let origin = path.display().to_string();
    match fs::read_to_string(path) {
        Ok(text) => SourceEvent::Origin {
            documents: parse_documents(path, &text),
            origin,
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => SourceEvent::Removed { origin },
        Err(e) => SourceEvent::Origin {
            documents: vec![Err(DocumentError::Unreadable {
                file: origin.clone(),
                reason: e.to_string(),
            })],
            origin,
        },
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
