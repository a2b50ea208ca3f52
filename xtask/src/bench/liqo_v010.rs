//! The iptables rules Liqo v0.10.3's gateway installs for its peers, the
//! NAT bench's baseline, and the removal that leaves a gateway with no
//! netfilter hook at all.
//!
//! Derived from `pkg/liqonet/iptables/iptables.go` at tag v0.10.3 (line
//! numbers below are that file's) and from
//! `internal/liqonet/tunnel-operator/tunnel-operator.go`, whose
//! `EnsureIPTablesRulesPerCluster` (lines 392-427) creates each peer's
//! chains, then its rules in LIQO-POSTROUTING, LIQO-PREROUTING and
//! LIQO-FORWARD, its forward-ext DROP, its postrouting NAT and its
//! prerouting NAT, appending each to its chain, peer after peer. Liqo
//! installs them in its gateway's netns `liqo-netns`, a veth hop from the
//! host; the bench installs them on the gateway itself, which spares
//! Liqo that hop. NatMapping DNAT rules (line 828) go in each peer's
//! `LIQO-PRRT-MAP-CLS-` chain, which the bench's flow never enters.

use std::{fmt::Write as _, fs, process::Command};

use anyhow::{Result, bail};
use xtask::{cmd::run, lab, netns, topology::Peering};

/// The chains, rules and order Liqo v0.10.3 gives `p`'s gateway with
/// `count` peers: `count - 1` synthetic ones, then `p`'s real one, last
/// in every chain, as a peer that joined last is.
pub fn rules(p: &Peering, count: usize) -> String {
    let mut peers: Vec<Peer> = (1..count)
        .map(|i| Peer {
            id: format!("bench{i}"),
            local_pod: p.local.pod_cidr.into(),
            local_nat_pod: format!("10.130.{i}.0/24"),
            local_nat_ext: format!("10.131.{i}.0/24"),
            pod: format!("10.128.{i}.0/24"),
            ext: format!("10.129.{i}.0/24"),
        })
        .collect();
    let [pod, ext] = p.remote_views().map(|n| n.to_string());
    peers.push(Peer {
        id: p.remote.name.into(),
        local_pod: p.local.pod_cidr.into(),
        local_nat_pod: p.local_nat_pod.expect("lab peers remap").into(),
        local_nat_ext: p.local_nat_external.expect("lab peers remap").into(),
        pod,
        ext,
    });
    let mut out = String::from("*nat\n:LIQO-POSTROUTING - [0:0]\n:LIQO-PREROUTING - [0:0]\n");
    for q in &peers {
        for prefix in ["LIQO-PSTRT-CLS-", "LIQO-PRRT-CLS-", "LIQO-PRRT-MAP-CLS-"] {
            let _ = writeln!(out, ":{prefix}{} - [0:0]", q.id);
        }
    }
    // Init (lines 213-218) inserts each jump first in its builtin chain.
    out.push_str("-I PREROUTING 1 -j LIQO-PREROUTING\n-I POSTROUTING 1 -j LIQO-POSTROUTING\n");
    peers.iter().for_each(|q| q.nat_dispatch(&mut out));
    peers.iter().for_each(|q| q.nat(&mut out));
    out.push_str("COMMIT\n*filter\n:LIQO-FORWARD - [0:0]\n");
    for q in &peers {
        for prefix in ["LIQO-FRWD-EXT-CLS-", "LIQO-FRWD-CLS-"] {
            let _ = writeln!(out, ":{prefix}{} - [0:0]", q.id);
        }
    }
    out.push_str("-I FORWARD 1 -j LIQO-FORWARD\n");
    peers.iter().for_each(|q| q.filter(&mut out));
    out.push_str("COMMIT\n");
    out
}

/// One peer, named by the first dash-segment of its cluster ID (lines
/// 1148-1170), with the networks its rules match.
struct Peer {
    id: String,
    local_pod: String,
    /// Our PodCIDR and ExternalCIDR as the peer remapped them.
    local_nat_pod: String,
    local_nat_ext: String,
    /// The peer's PodCIDR and ExternalCIDR as we see them.
    pod: String,
    ext: String,
}

impl Peer {
    /// getChainRulesPerCluster: the peer's dispatch rules, into
    /// LIQO-POSTROUTING (lines 1096-1104) and LIQO-PREROUTING (lines
    /// 1127-1132, then 1138-1143, as our PodCIDR is remapped).
    fn nat_dispatch(&self, out: &mut String) {
        let Peer { id, pod, ext, .. } = self;
        let (nat_pod, nat_ext) = (&self.local_nat_pod, &self.local_nat_ext);
        let _ = write!(
            out,
            "-A LIQO-POSTROUTING -d {pod} -m comment --comment \"SNAT local traffic for '{id}' PodCIDR\" -j LIQO-PSTRT-CLS-{id}
-A LIQO-POSTROUTING -d {ext} -m comment --comment \"SNAT local traffic for '{id}' ExternalCIDR\" -j LIQO-PSTRT-CLS-{id}
-A LIQO-PREROUTING -s {pod} -d {nat_ext} -m comment --comment \"DNAT '{id}' traffic for local ExternalCIDR\" -j LIQO-PRRT-MAP-CLS-{id}
-A LIQO-PREROUTING -s {pod} -d {nat_pod} -m comment --comment \"DNAT '{id}' traffic for local PodCIDR\" -j LIQO-PRRT-CLS-{id}
"
        );
    }

    /// getPostroutingRules (lines 1058-1061) and
    /// getPreRoutingRulesPerTunnelEndpoint (line 810).
    fn nat(&self, out: &mut String) {
        let Peer {
            id,
            local_pod,
            local_nat_pod,
            pod,
            ext,
            ..
        } = self;
        let first_ip = local_nat_pod.replace(".0/24", ".1");
        let _ = write!(
            out,
            "-A LIQO-PSTRT-CLS-{id} -s {local_pod} -d {pod} -j NETMAP --to {local_nat_pod}
-A LIQO-PSTRT-CLS-{id} -s {local_pod} -d {ext} -j NETMAP --to {local_nat_pod}
-A LIQO-PSTRT-CLS-{id} ! -s {local_pod} -d {pod} -j SNAT --to-source {first_ip}
-A LIQO-PSTRT-CLS-{id} ! -s {local_pod} -d {ext} -j SNAT --to-source {first_ip}
-A LIQO-PRRT-CLS-{id} -s {pod} -d {local_nat_pod} -j NETMAP --to {local_pod}
"
        );
    }

    /// getChainRulesPerCluster's LIQO-FORWARD rules (lines 1106-1125),
    /// with the conntrack match every forwarded packet meets once per peer
    /// until one accepts it, and getClusterForwardExtRules (lines
    /// 1019-1029). The per-peer LIQO-FRWD-CLS- chain stays empty outside
    /// IntraClusterTrafficSegregation (tunnel-operator.go lines 408-414).
    fn filter(&self, out: &mut String) {
        let Peer {
            id,
            pod,
            local_nat_ext,
            ..
        } = self;
        let _ = write!(
            out,
            "-A LIQO-FORWARD -s {pod} -d {local_nat_ext} -j LIQO-FRWD-EXT-CLS-{id}
-A LIQO-FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A LIQO-FORWARD -s {pod} -m comment --comment \"Contains rules allowing traffic segregation with '{id}' cluster\" -j LIQO-FRWD-CLS-{id}
-A LIQO-FRWD-EXT-CLS-{id} -m comment --comment \"Avoid forwarding '{id}' remapped ExternalCIDR to liqo.gateway\" -j DROP
"
        );
    }
}

/// Installs Liqo's rules for `count` peers on both gateways of `peerings`.
pub fn install<'a>(peerings: impl Iterator<Item = &'a Peering>, count: usize) -> Result<()> {
    for p in peerings {
        let path = format!("{}/liqo-v0.10.3-{}.rules", lab::STATE_DIR, p.local.name);
        fs::write(&path, rules(p, count))?;
        let status = Command::new("ip")
            .args(["netns", "exec", &p.local.gw(), "iptables-restore"])
            .stdin(fs::File::open(&path)?)
            .status()?;
        if !status.success() {
            bail!(
                "iptables-restore in {} failed ({status}); rules in {path}",
                p.local.gw()
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use xtask::topology::PEERINGS;

    #[test]
    fn each_peer_gets_liqos_chains_and_rules_with_the_real_peer_last() {
        let p = PEERINGS
            .iter()
            .find(|p| p.local.name == "a" && p.remote.name == "b")
            .unwrap();
        let rules = rules(p, 3);
        let forward: Vec<&str> = rules
            .lines()
            .filter(|l| l.starts_with("-A LIQO-FORWARD "))
            .collect();
        assert_eq!(forward.len(), 9, "three LIQO-FORWARD rules a peer");
        assert!(forward[7].contains("--ctstate ESTABLISHED,RELATED -j ACCEPT"));
        assert!(forward[8].ends_with("-j LIQO-FRWD-CLS-b"), "{}", forward[8]);
        let snat = rules.lines().filter(|l| l.contains(" -j SNAT ")).count();
        assert_eq!(snat, 6, "two SNAT rules a peer:\n{rules}");
        let last_netmap = rules.lines().rfind(|l| l.contains("NETMAP")).unwrap();
        assert!(
            last_netmap.starts_with("-A LIQO-PRRT-CLS-b "),
            "{last_netmap}"
        );
        assert_eq!(rules.matches("COMMIT").count(), 2);
    }
}
