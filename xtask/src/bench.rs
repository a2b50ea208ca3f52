//! `cargo xtask bench`: this project against the peers named in the issues.

use anyhow::Result;
use clap::Subcommand;

/// Which benchmark to run.
#[derive(Subcommand)]
pub enum Which {
    /// 64-byte UDP packets per second through a gateway: no NAT, Isthmus, iptables NETMAP.
    Nat,
}

/// Runs one benchmark.
pub fn run(which: Which) -> Result<()> {
    match which {
        Which::Nat => anyhow::bail!("bench nat is not written yet"),
    }
}
