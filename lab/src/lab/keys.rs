//! The gateways' WireGuard keys in the lab: each gateway's private key
//! file, and its public key as the agent derives it.

use std::path::PathBuf;

use anyhow::Result;

use super::paths::{agent_binary, state};
use crate::cmd::run;

/// The WireGuard key file of gateway `node`.
pub fn key_file(node: &str) -> PathBuf {
    state("keys").join(format!("{node}.key"))
}

/// The public key of gateway `node`, creating its key file if needed.
pub fn public_key(node: &str) -> Result<String> {
    let key = key_file(node).to_string_lossy().into_owned();
    let out = run(
        &agent_binary().to_string_lossy(),
        &["pubkey", "--private-key-file", &key],
    )?;
    Ok(out.trim().to_owned())
}
