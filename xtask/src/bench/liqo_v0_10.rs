//! The bench's Liqo v0.10.3 baseline: its gateways' rules
//! ([`isthmus_lab::lab::liqo_v0_10_peer::iptables`]) installed for a count of peers, and the
//! removal that leaves a gateway with no netfilter hook at all.

use std::fs;

use anyhow::{Result, bail};
use isthmus_lab::{cmd::run, lab::liqo_v0_10_peer::iptables, netns, topology::Cluster};

/// Installs Liqo's rules on each cluster's gateway, with `count` peers:
/// `count - 1` synthetic ones, then the cluster's own.
pub fn install(clusters: &[&Cluster], count: usize) -> Result<()> {
    for cluster in clusters {
        iptables::install(cluster, count.saturating_sub(1))?;
    }
    Ok(())
}

/// Removes every netfilter table from `gateways`, iptables-nft's and
/// native nftables' alike, and the connections conntrack holds: NAT state
/// outlives its rules, and would translate the next setup's packets. With
/// no table, no netfilter hook, conntrack's included, is left; the bench
/// checks it with `nft list ruleset` and fails if one is.
pub fn remove_all(gateways: &[String]) -> Result<()> {
    for gw in gateways {
        run("ip", &["netns", "exec", gw, "nft", "flush", "ruleset"])?;
        // `conntrack -F` exits non-zero when the table was already empty.
        let _ = run("ip", &["netns", "exec", gw, "conntrack", "-F"]);
        let left = run("ip", &["netns", "exec", gw, "nft", "list", "ruleset"])?;
        if !left.trim().is_empty() {
            bail!("{gw} still has netfilter tables after flushing them:\n{left}");
        }
        let legacy = netns::run_in(gw, || {
            fs::read_to_string("/proc/thread-self/net/ip_tables_names").unwrap_or_default()
        })?;
        if !legacy.trim().is_empty() {
            bail!("{gw} has iptables-legacy tables, which hook netfilter: {legacy}");
        }
    }
    Ok(())
}
