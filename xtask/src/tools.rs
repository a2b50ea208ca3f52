//! Tools the build installs outside the system: where they live.

use std::path::PathBuf;

/// kubernetes-validate (PyPI) release the manifests are checked with.
pub const KUBERNETES_VALIDATE: &str = "1.37.0";

/// The Python environment holding kubernetes-validate, made by the build.
pub fn python_env() -> PathBuf {
    cache_dir().join("pyenv")
}

/// The kubernetes-validate command.
pub fn kubernetes_validate() -> PathBuf {
    python_env().join("bin/kubernetes-validate")
}

/// Where the other WireGuard implementations `bench tunnel` measures are
/// installed, each in a directory named by its release.
pub fn peers_dir() -> PathBuf {
    cache_dir().join("peers")
}

fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/isthmus")
}
