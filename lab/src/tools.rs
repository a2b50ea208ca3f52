//! Tools the build installs outside the system: where they live.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Result, bail};

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

/// `cargo install --locked` of `krate` at `version` (into `root`, or
/// cargo's own bin directory), its progress shown.
pub fn cargo_install(krate: &str, version: &str, root: Option<&Path>) -> Result<()> {
    let mut command = Command::new("cargo");
    command.args(["install", "--locked", "--version", version]);
    if let Some(root) = root {
        command.arg("--root").arg(root);
    }
    let status = command.arg(krate).status()?;
    if !status.success() {
        bail!("cargo install {krate} {version} failed ({status})");
    }
    Ok(())
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
