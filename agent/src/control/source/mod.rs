//! Where objects come from. Every source sends the same events, and one
//! reconciler applies them: the directory source keys them by file, the
//! Kubernetes source by object.

mod dir;
mod kube;

pub use dir::{DirError, read_dir, watch_dir};
pub use kube::{
    ElectionLease, KubeSource, api_resource, api_resource_of, origin, read as read_watched,
    watch_kube,
};

use std::path::PathBuf;

use thiserror::Error;

use crate::model::object::{DocumentError, Object};

/// One change seen by a source.
#[derive(Debug)]
pub enum SourceEvent {
    /// An origin (a file) now holds these documents.
    Origin {
        /// The file.
        origin: String,
        /// Its documents, parsed.
        documents: Vec<Result<Object, DocumentError>>,
    },
    /// An origin is gone.
    Removed {
        /// The file.
        origin: String,
    },
    /// Every object that existed at start has been sent.
    Synced,
}

/// Where to read objects from, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSpec {
    /// `dir:PATH`: YAML files in a directory.
    Dir(PathBuf),
    /// `kube`: the Kubernetes API.
    Kube,
}

/// A `--source` value that does not parse.
#[derive(Debug, Error)]
#[error("--source {0:?}: expected dir:PATH or kube")]
pub struct BadSourceSpec(String);

impl std::str::FromStr for SourceSpec {
    type Err = BadSourceSpec;
    fn from_str(s: &str) -> Result<Self, BadSourceSpec> {
        match s.split_once(':') {
            Some(("dir", path)) if !path.is_empty() => Ok(Self::Dir(path.into())),
            None if s == "kube" => Ok(Self::Kube),
            _ => Err(BadSourceSpec(s.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_source_specs() {
        assert_eq!(
            "dir:/etc/x".parse::<SourceSpec>().unwrap(),
            SourceSpec::Dir("/etc/x".into())
        );
        assert_eq!("kube".parse::<SourceSpec>().unwrap(), SourceSpec::Kube);
        assert!("dir:".parse::<SourceSpec>().is_err());
        assert!("file:/x".parse::<SourceSpec>().is_err());
    }
}
