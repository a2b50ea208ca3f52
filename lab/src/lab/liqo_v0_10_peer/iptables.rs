//! The iptables rules Liqo v0.10.3's gateway installs for its peers: the
//! nat and filter tables of the Liqo-peer lab and of the benches' Liqo
//! baseline, from one generator.
//!
//! Derived from `pkg/liqonet/iptables/iptables.go` at tag v0.10.3 (line
//! numbers below are that file's) and from
//! `internal/liqonet/tunnel-operator/tunnel-operator.go`, whose
//! `EnsureIPTablesRulesPerCluster` (lines 392-427) creates each peer's
//! chains, then its rules in LIQO-POSTROUTING, LIQO-PREROUTING and
//! LIQO-FORWARD, its forward-ext DROP, its postrouting NAT and its
//! prerouting NAT, appending each to its chain, peer after peer. Each
//! NatMapping entry is a DNAT in the peer's `LIQO-PRRT-MAP-CLS-` chain
//! (`getPreRoutingRulesPerNatMapping`, lines 828-846). Liqo installs them in
//! its gateway's netns `liqo-netns`, a veth hop from the host; the lab
//! installs them on the gateway itself, which spares Liqo that hop.

use std::{fmt::Write as _, fs, net::Ipv4Addr};

use anyhow::Result;
use ipnet::Ipv4Net;

use super::super::paths;
use crate::topology::{
    CONNCHECK_ADDR, Cluster, NAT_MAPPING, PEERINGS, Peering, first_ip, synthetic_peer_views,
};

/// Installs [`rules`] on `local`'s gateway with `iptables-restore`,
/// keeping them in the lab's state directory for whoever debugs a run.
pub fn install(local: &Cluster, synthetic: usize) -> Result<()> {
    let path = paths::state(&format!("liqo-v0.10.3-{}.rules", local.name));
    let rules = rules(local, synthetic);
    fs::write(&path, &rules)?;
    crate::cmd::iptables_restore(&local.gw(), &rules, false, false)
}

/// The chains, rules and order Liqo v0.10.3 gives `local`'s gateway:
/// `synthetic` peers of the benches first, then each of the lab's
/// peerings of `local`, as peers that joined last are.
pub fn rules(local: &Cluster, synthetic: usize) -> String {
    let peers: Vec<Peer> = (1..=synthetic)
        .map(|i| Peer::synthetic(local, i))
        .chain(
            PEERINGS
                .iter()
                .filter(|p| p.local.name == local.name)
                .map(Peer::of),
        )
        .collect();
    let mut out = String::from("*nat\n:LIQO-POSTROUTING - [0:0]\n:LIQO-PREROUTING - [0:0]\n");
    for q in &peers {
        for prefix in ["LIQO-PSTRT-CLS-", "LIQO-PRRT-CLS-", "LIQO-PRRT-MAP-CLS-"] {
            let _ = writeln!(out, ":{prefix}{} - [0:0]", q.id);
        }
    }
    // Init (lines 213-218) inserts each jump first in its builtin chain.
    out.push_str("-I PREROUTING 1 -j LIQO-PREROUTING\n-I POSTROUTING 1 -j LIQO-POSTROUTING\n");
    for q in &peers {
        q.nat_dispatch(&mut out);
    }
    for q in &peers {
        q.nat(&mut out);
    }
    out.push_str("COMMIT\n*filter\n:LIQO-FORWARD - [0:0]\n");
    for q in &peers {
        for prefix in ["LIQO-FRWD-EXT-CLS-", "LIQO-FRWD-CLS-"] {
            let _ = writeln!(out, ":{prefix}{} - [0:0]", q.id);
        }
    }
    out.push_str("-I FORWARD 1 -j LIQO-FORWARD\n");
    for q in &peers {
        q.filter(&mut out);
    }
    out.push_str("COMMIT\n");
    out
}

/// One peer as a TunnelEndpoint and a NatMapping describe it.
struct Peer {
    /// Liqo names chains by the first dash-segment of the cluster ID
    /// (lines 1148-1170); the lab's IDs share theirs, so it is the name.
    id: String,
    local_pod: Ipv4Net,
    /// Our PodCIDR as the peer remapped it, if it did.
    local_nat_pod: Option<Ipv4Net>,
    /// Our ExternalCIDR as the peer sees it.
    local_external_view: Ipv4Net,
    /// The peer's PodCIDR and ExternalCIDR as we see them.
    pod: Ipv4Net,
    ext: Ipv4Net,
    /// The NatMapping's entries: endpoint, and the address the peer
    /// reaches it at.
    mappings: Vec<(Ipv4Addr, Ipv4Addr)>,
}

impl Peer {
    fn of(p: &Peering) -> Peer {
        let [pod, ext] = p.remote_views();
        let hub = NAT_MAPPING.is_for(p).then(|| NAT_MAPPING.entry());
        Peer {
            id: p.remote.name.to_uppercase(),
            local_pod: p.local.pods(),
            local_nat_pod: p.local_nat_pod.map(|n| n.parse().expect("valid CIDR")),
            local_external_view: p.local_external_view(),
            pod,
            ext,
            mappings: hub
                .into_iter()
                .chain([(CONNCHECK_ADDR, p.conncheck_external())])
                .collect(),
        }
    }

    /// The benches' synthetic peer `i`, as they give it to Isthmus.
    fn synthetic(local: &Cluster, i: usize) -> Peer {
        let [local_nat_pod, local_external_view, pod, ext] = synthetic_peer_views(i);
        Peer {
            id: format!("BENCH{i}"),
            local_pod: local.pods(),
            local_nat_pod: Some(local_nat_pod),
            local_external_view,
            pod,
            ext,
            mappings: vec![(CONNCHECK_ADDR, first_ip(local_external_view))],
        }
    }

    /// getChainRulesPerCluster: the peer's dispatch rules, into
    /// LIQO-POSTROUTING (lines 1096-1104) and LIQO-PREROUTING (lines
    /// 1127-1132, then 1138-1143 if our PodCIDR is remapped).
    fn nat_dispatch(&self, out: &mut String) {
        let Peer { id, pod, ext, .. } = self;
        let nat_ext = self.local_external_view;
        let _ = write!(
            out,
            "-A LIQO-POSTROUTING -d {pod} -m comment --comment \"SNAT local traffic for '{id}' PodCIDR\" -j LIQO-PSTRT-CLS-{id}
-A LIQO-POSTROUTING -d {ext} -m comment --comment \"SNAT local traffic for '{id}' ExternalCIDR\" -j LIQO-PSTRT-CLS-{id}
-A LIQO-PREROUTING -s {pod} -d {nat_ext} -m comment --comment \"DNAT '{id}' traffic for local ExternalCIDR\" -j LIQO-PRRT-MAP-CLS-{id}
"
        );
        if let Some(nat_pod) = self.local_nat_pod {
            let _ = writeln!(
                out,
                "-A LIQO-PREROUTING -s {pod} -d {nat_pod} -m comment --comment \"DNAT '{id}' traffic for local PodCIDR\" -j LIQO-PRRT-CLS-{id}"
            );
        }
    }

    /// getPostroutingRules (lines 1041-1075: NETMAP and SNAT if our
    /// PodCIDR is remapped, SNAT only if not),
    /// getPreRoutingRulesPerTunnelEndpoint (lines 797-815) and the
    /// NatMapping's DNATs.
    fn nat(&self, out: &mut String) {
        let Peer {
            id,
            local_pod,
            pod,
            ext,
            ..
        } = self;
        let snat_to = first_ip(self.local_nat_pod.unwrap_or(*local_pod));
        for view in [pod, ext] {
            if let Some(nat_pod) = self.local_nat_pod {
                let _ = writeln!(
                    out,
                    "-A LIQO-PSTRT-CLS-{id} -s {local_pod} -d {view} -j NETMAP --to {nat_pod}"
                );
            }
        }
        for view in [pod, ext] {
            let _ = writeln!(
                out,
                "-A LIQO-PSTRT-CLS-{id} ! -s {local_pod} -d {view} -j SNAT --to-source {snat_to}"
            );
        }
        if let Some(nat_pod) = self.local_nat_pod {
            let _ = writeln!(
                out,
                "-A LIQO-PRRT-CLS-{id} -s {pod} -d {nat_pod} -j NETMAP --to {local_pod}"
            );
        }
        for (endpoint, external) in &self.mappings {
            let _ = writeln!(
                out,
                "-A LIQO-PRRT-MAP-CLS-{id} -d {external} -j DNAT --to-destination {endpoint}"
            );
        }
    }

    /// getChainRulesPerCluster's LIQO-FORWARD rules (lines 1106-1125),
    /// with the conntrack match every forwarded packet meets once per peer
    /// until one accepts it, and getClusterForwardExtRules (lines
    /// 1019-1029). The per-peer LIQO-FRWD-CLS- chain stays empty outside
    /// IntraClusterTrafficSegregation (tunnel-operator.go lines 408-414).
    fn filter(&self, out: &mut String) {
        let Peer { id, pod, .. } = self;
        let nat_ext = self.local_external_view;
        let _ = write!(
            out,
            "-A LIQO-FORWARD -s {pod} -d {nat_ext} -j LIQO-FRWD-EXT-CLS-{id}
-A LIQO-FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A LIQO-FORWARD -s {pod} -m comment --comment \"Contains rules allowing traffic segregation with '{id}' cluster\" -j LIQO-FRWD-CLS-{id}
-A LIQO-FRWD-EXT-CLS-{id} -m comment --comment \"Avoid forwarding '{id}' remapped ExternalCIDR to liqo.gateway\" -j DROP
"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{A, B, C};

    #[test]
    fn b_netmaps_snats_and_dnats_its_natmapping_as_liqo_does() {
        let rules = rules(&B, 0);
        for rule in [
            "-A LIQO-PSTRT-CLS-A -s 10.244.0.0/24 -d 10.0.40.0/24 -j NETMAP --to 10.0.0.0/24",
            "-A LIQO-PSTRT-CLS-A ! -s 10.244.0.0/24 -d 10.0.41.0/24 -j SNAT --to-source 10.0.0.1",
            "-A LIQO-PRRT-CLS-A -s 10.0.40.0/24 -d 10.0.0.0/24 -j NETMAP --to 10.244.0.0/24",
            "-A LIQO-PRRT-MAP-CLS-A -d 10.0.1.45 -j DNAT --to-destination 10.1.0.5",
            "-A LIQO-PRRT-MAP-CLS-A -d 10.0.1.1 -j DNAT --to-destination 169.254.0.1",
            "-A LIQO-PRRT-MAP-CLS-C -d 192.168.0.1 -j DNAT --to-destination 169.254.0.1",
            // c does not remap b: the hub's masquerade towards c is SNAT to
            // the first address of b's own PodCIDR, and nothing NETMAPs.
            "-A LIQO-PSTRT-CLS-C ! -s 10.244.0.0/24 -d 10.1.0.0/24 -j SNAT --to-source 10.244.0.1",
        ] {
            assert!(rules.contains(rule), "no {rule:?} in:\n{rules}");
        }
        let dispatch = rules
            .lines()
            .find(|l| l.starts_with("-A LIQO-PREROUTING -s 10.0.40.0/24 -d 10.0.1.0/24"))
            .expect("a's traffic for b's ExternalCIDR goes to its mapping chain");
        assert!(dispatch.ends_with("-j LIQO-PRRT-MAP-CLS-A"), "{dispatch}");
        assert!(!rules.contains("LIQO-PSTRT-CLS-C -s"), "c remaps nothing");
        assert!(!rules.contains("-A LIQO-PRRT-CLS-C "), "c remaps nothing");
        assert!(!rules.contains("-A LIQO-PREROUTING -s 10.1.0.0/24 -d 10.244.0.0/24"));
    }

    #[test]
    fn each_peer_gets_liqos_chains_and_rules_with_the_real_peers_last() {
        let rules = rules(&A, 2);
        let forward: Vec<&str> = rules
            .lines()
            .filter(|l| l.starts_with("-A LIQO-FORWARD "))
            .collect();
        assert_eq!(forward.len(), 9, "three LIQO-FORWARD rules a peer");
        assert!(forward[7].contains("--ctstate ESTABLISHED,RELATED -j ACCEPT"));
        assert!(forward[8].ends_with("-j LIQO-FRWD-CLS-B"), "{}", forward[8]);
        let snat = rules.lines().filter(|l| l.contains(" -j SNAT ")).count();
        assert_eq!(snat, 6, "two SNAT rules a peer:\n{rules}");
        let last_netmap = rules.lines().rfind(|l| l.contains("NETMAP")).unwrap();
        assert!(
            last_netmap.starts_with("-A LIQO-PRRT-CLS-B "),
            "{last_netmap}"
        );
        assert_eq!(rules.matches("COMMIT").count(), 2);
        let c = super::rules(&C, 0);
        assert_eq!(c.matches("-j LIQO-PSTRT-CLS-B").count(), 2, "{c}");
    }
}
