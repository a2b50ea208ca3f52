//! The reference lab of docs/design.md#the-reference-lab: names, addresses, peerings and the
//! reachability every test and the demo check. Nothing here touches the
//! system; `lab` builds it.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::{Value, json};

use crate::objects::{Layout, TunnelEndpoint};

/// Netns holding the WAN bridge.
pub const WAN_NS: &str = "ist-wan";
/// The WAN's router, on the WAN bridge: every gateway's default route, as
/// a real gateway has one to the internet. It forwards nothing.
pub const WAN_ROUTER: &str = "203.0.113.254";
/// WireGuard port on every gateway.
pub const TUNNEL_PORT: u16 = 5871;
/// Metrics port of every agent.
pub const METRICS_PORT: u16 = 9873;
/// The namespace a kube-sourced agent runs in, where its key Secret lives.
pub const AGENT_NS: &str = "isthmus-system";
/// The label of a gateway node (the agent's default `--gateway-label`).
pub const GATEWAY_LABEL: &str = "net.liqo.io/gateway";
/// The label an administrator gives a gateway node for the base
/// DaemonSets (their `ISTHMUS_GATEWAY_LABEL`), which a kubelet may not set.
pub const RESTRICTED_GATEWAY_LABEL: &str = "node-restriction.kubernetes.io/isthmus-gateway";
/// The VNI of the overlay between a cluster's nodes (the agent's default).
pub const OVERLAY_VNI: u32 = 18952;
/// The UDP port of the overlay (the agent's default).
pub const OVERLAY_PORT: u16 = 4879;

/// One simulated cluster.
#[derive(Debug, PartialEq, Eq)]
pub struct Cluster {
    /// `a`, `b` or `c`.
    pub name: &'static str,
    /// N in its addresses (203.0.113.N, 172.16.N.0/24).
    pub index: u8,
    /// Its PodCIDR.
    pub pod_cidr: &'static str,
    /// Its ExternalCIDR.
    pub external_cidr: &'static str,
    /// Its IPv6 PodCIDR, in the dual-stack lab (docs/design.md#dual-stack).
    pub pod_cidr6: &'static str,
    /// Its IPv6 ExternalCIDR, in the dual-stack lab.
    pub external_cidr6: &'static str,
}

/// Cluster a.
pub const A: Cluster = Cluster {
    name: "a",
    index: 1,
    pod_cidr: "10.244.0.0/24",
    external_cidr: "192.168.0.0/24",
    pod_cidr6: "fd00:10:244::/64",
    external_cidr6: "fd00:192:168::/64",
};
/// Cluster b: overlaps a on both networks on purpose.
pub const B: Cluster = Cluster {
    name: "b",
    index: 2,
    pod_cidr: "10.244.0.0/24",
    external_cidr: "192.168.0.0/24",
    pod_cidr6: "fd00:10:244::/64",
    external_cidr6: "fd00:192:168::/64",
};

/// Cluster c: peered with b only, reached from a through b.
pub const C: Cluster = Cluster {
    name: "c",
    index: 3,
    pod_cidr: "10.1.0.0/24",
    external_cidr: "192.168.2.0/24",
    pod_cidr6: "fd00:10:1::/64",
    external_cidr6: "fd00:192:168:2::/64",
};

/// The `--ha` lab's second gateway node of cluster a.
pub const GW2: &str = "a-gw2";
/// a-gw2's LAN address.
pub const GW2_LAN: Ipv4Addr = Ipv4Addr::new(172, 16, 1, 3);
/// a-gw2's own uplink address.
pub const GW2_WAN: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);
/// a-gw's own uplink address in the `--ha` lab, where cluster a's endpoint
/// address (203.0.113.1) floats between its gateway nodes.
pub const GW1_WAN: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// The pod on a-gw2.
pub const POD3: &str = "a-pod3";
/// a-pod3's address.
pub const POD3_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 134);

/// The LAN address of lab node `node` (a gateway or worker netns).
pub fn node_addr(node: &str) -> Option<Ipv4Addr> {
    CLUSTERS
        .iter()
        .flat_map(|c| c.node_addrs())
        .chain([(GW2.to_owned(), GW2_LAN)])
        .find_map(|(name, addr)| (name == node).then_some(addr))
}

/// The clusters the lab builds.
pub const CLUSTERS: [&Cluster; 3] = [&A, &B, &C];

/// Host part of the pod on the worker node (lower /25).
const POD1_HOST: u32 = 5;
/// Host part of the pod on the gateway node (upper /25).
const POD2_HOST: u32 = 133;

impl Cluster {
    /// Its peerings, seen from its side.
    pub fn peerings(&self) -> impl Iterator<Item = &'static Peering> + use<'_> {
        PEERINGS.iter().filter(|p| p.local.name == self.name)
    }
    /// The cluster ID its peers' TunnelEndpoints carry.
    pub fn cluster_id(&self) -> String {
        format!("cluster-{}", self.name)
    }
    /// Its gateway node's netns.
    pub fn gw(&self) -> String {
        format!("{}-gw", self.name)
    }
    /// Its worker node's netns.
    pub fn node(&self) -> String {
        format!("{}-node", self.name)
    }
    /// Its LAN bridge's netns.
    pub fn lan(&self) -> String {
        format!("{}-lan", self.name)
    }
    /// Netns of pod `i` (1 on the worker, 2 on the gateway).
    pub fn pod(&self, i: u8) -> String {
        format!("{}-pod{i}", self.name)
    }
    /// The gateway's uplink address.
    pub fn wan_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(203, 0, 113, self.index)
    }
    /// The gateway's LAN address.
    pub fn lan_gw(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 16, self.index, 1)
    }
    /// The worker's LAN address.
    pub fn lan_node(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 16, self.index, 2)
    }
    /// PodCIDR as a network.
    pub fn pods(&self) -> Ipv4Net {
        self.pod_cidr.parse().expect("valid PodCIDR")
    }
    /// Address of pod `i`.
    pub fn pod_addr(&self, i: u8) -> Ipv4Addr {
        let host = if i == 1 { POD1_HOST } else { POD2_HOST };
        Ipv4Addr::from(u32::from(self.pods().network()) + host)
    }
    /// The half of the PodCIDR whose pods live on the worker (1) or the gateway (2).
    pub fn pod_half(&self, i: u8) -> Ipv4Net {
        let halves = self
            .pods()
            .subnets(self.pods().prefix_len() + 1)
            .expect("splittable");
        halves
            .into_iter()
            .nth(usize::from(i - 1))
            .expect("two halves")
    }
    /// The address its gateway masquerades flows to when their source is
    /// none of the cluster's (node traffic, transit): the last of its
    /// PodCIDR, which no pod of the lab holds.
    pub fn masquerade_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.pods().broadcast()) - 1)
    }
    /// The cluster's `v1` Node objects, as the agents read them for the
    /// overlay: each node's half of the PodCIDR, its LAN address, and the
    /// gateway label on the gateway; in the `dual_stack` lab, those of
    /// IPv6 too.
    pub fn nodes_yaml(&self, dual_stack: bool) -> String {
        let nodes = match dual_stack {
            true => self.dual_stack_node_objects(),
            false => self.node_objects(),
        };
        nodes
            .iter()
            .map(|node| serde_yaml_ng::to_string(node).expect("a JSON value serialises"))
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// The cluster's Node objects: the gateway's, labelled, and the
    /// worker's, each with its half of the PodCIDR.
    pub fn node_objects(&self) -> [Value; 2] {
        [
            (self.gw(), 2, self.lan_gw(), true),
            (self.node(), 1, self.lan_node(), false),
        ]
        .map(|(name, half, address, gateway)| {
            let pod_cidr = self.pod_half(half).to_string();
            node(&name, address, Some(&pod_cidr), gateway)
        })
    }

    /// Every node netns of the cluster with its LAN address.
    pub fn node_addrs(&self) -> [(String, Ipv4Addr); 2] {
        [(self.gw(), self.lan_gw()), (self.node(), self.lan_node())]
    }

    /// Every node netns of the cluster with its role.
    pub fn nodes(&self) -> [(String, &'static str); 2] {
        [(self.gw(), "gateway"), (self.node(), "worker")]
    }
}

/// One cluster's view of one peering (a row of docs/design.md#peerings).
#[derive(Debug)]
pub struct Peering {
    /// The cluster holding the TunnelEndpoint.
    pub local: &'static Cluster,
    /// The peer.
    pub remote: &'static Cluster,
    /// How we see the peer's PodCIDR (None: as it is).
    pub remote_nat_pod: Option<&'static str>,
    /// How the peer sees our PodCIDR.
    pub local_nat_pod: Option<&'static str>,
    /// How we see the peer's ExternalCIDR.
    pub remote_nat_external: Option<&'static str>,
    /// How the peer sees our ExternalCIDR.
    pub local_nat_external: Option<&'static str>,
    /// Which layout the lab writes the object in: both are exercised.
    pub layout: Layout,
    /// A host name the object gives as `endpointIP` instead of the peer's
    /// address, as Liqo copies a LoadBalancer's; the local gateway's
    /// `/etc/hosts` resolves it.
    pub endpoint_name: Option<&'static str>,
    /// The IPv6 remappings of the dual-stack lab, in the order of the
    /// IPv4 ones: the peer's PodCIDR, ours, the peer's ExternalCIDR, ours.
    pub nat6: [Option<&'static str>; 4],
}

/// The first address of `net`, as Liqo's `GetFirstIP`: where a peer's
/// conncheck answers in Liqo v0.10, and what its SNAT rules give.
pub fn first_ip(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()) + 1)
}

/// Every peering, from each side.
pub const PEERINGS: [Peering; 4] = [
    Peering {
        local: &A,
        remote: &B,
        remote_nat_pod: Some("10.0.0.0/24"),
        local_nat_pod: Some("10.0.40.0/24"),
        remote_nat_external: Some("10.0.1.0/24"),
        local_nat_external: Some("10.0.41.0/24"),
        layout: Layout::Spec,
        endpoint_name: Some("b-gw.wan.isthmus.test"),
        nat6: [
            Some("fd00:10::/64"),
            Some("fd00:10:0:40::/64"),
            Some("fd00:10:0:1::/64"),
            Some("fd00:10:0:41::/64"),
        ],
    },
    Peering {
        local: &B,
        remote: &A,
        remote_nat_pod: Some("10.0.40.0/24"),
        local_nat_pod: Some("10.0.0.0/24"),
        remote_nat_external: Some("10.0.41.0/24"),
        local_nat_external: Some("10.0.1.0/24"),
        layout: Layout::Legacy,
        endpoint_name: None,
        nat6: [
            Some("fd00:10:0:40::/64"),
            Some("fd00:10::/64"),
            Some("fd00:10:0:41::/64"),
            Some("fd00:10:0:1::/64"),
        ],
    },
    Peering {
        local: &B,
        remote: &C,
        remote_nat_pod: None,
        local_nat_pod: None,
        remote_nat_external: None,
        local_nat_external: None,
        layout: Layout::Spec,
        endpoint_name: None,
        nat6: [None; 4],
    },
    Peering {
        local: &C,
        remote: &B,
        remote_nat_pod: None,
        local_nat_pod: None,
        remote_nat_external: None,
        local_nat_external: None,
        layout: Layout::Legacy,
        endpoint_name: None,
        nat6: [None; 4],
    },
];

/// docs/design.md#peerings: the entry of the NatMapping cluster b holds for cluster a
/// that exposes c-pod1, at 10.0.1.45 in a's view of b's ExternalCIDR.
pub const NAT_MAPPING: HubMapping = HubMapping {
    hub: &B,
    client: &A,
    endpoint: Ipv4Addr::new(10, 1, 0, 5),
    external: Ipv4Addr::new(10, 0, 1, 45),
};

/// The networks of the benches' synthetic peer `i` (1 to 255): our
/// PodCIDR and ExternalCIDR as it remaps them (10.130.i.0/24,
/// 10.131.i.0/24), then its own as we see them (10.128.i.0/24,
/// 10.129.i.0/24).
pub fn synthetic_peer_views(i: usize) -> [Ipv4Net; 4] {
    [130, 131, 128, 129].map(|second| {
        format!("10.{second}.{i}.0/24")
            .parse()
            .expect("a synthetic peer's index fits an octet")
    })
}

/// The address a Liqo gateway's conncheck answers on, behind the first
/// host of every NatMapping's ExternalCIDR (`reference/liqo.md`).
pub const CONNCHECK_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 1);

/// A NatMapping entry held by a hub for one client cluster.
#[derive(Debug)]
pub struct HubMapping {
    /// The cluster holding the object.
    pub hub: &'static Cluster,
    /// The cluster whose traffic it translates.
    pub client: &'static Cluster,
    /// The endpoint exposed (behind the hub).
    pub endpoint: Ipv4Addr,
    /// Its externalIP, in the client's view of the hub's ExternalCIDR.
    pub external: Ipv4Addr,
}

impl HubMapping {
    /// The hub's peering with the client.
    pub fn peering(&self) -> &'static Peering {
        PEERINGS
            .iter()
            .find(|p| self.is_for(p))
            .expect("the hub is peered with its client")
    }

    /// Whether `p` is the hub's peering with the client.
    pub fn is_for(&self, p: &Peering) -> bool {
        p.local.name == self.hub.name && p.remote.name == self.client.name
    }

    /// The NatMapping as Liqo writes it, with `entries` (endpoint,
    /// externalIP) besides the conncheck's; the lab's own entry is
    /// [`HubMapping::entry`].
    pub fn yaml(&self, entries: &[(Ipv4Addr, Ipv4Addr)]) -> String {
        self.peering().nat_mapping_yaml(entries)
    }

    /// The lab's entry.
    pub fn entry(&self) -> (Ipv4Addr, Ipv4Addr) {
        (self.endpoint, self.external)
    }

    /// The externalIP as the hub's kernel keys it: the real address of
    /// the hub's ExternalCIDR with the same host bits.
    pub fn real_external(&self) -> Ipv4Addr {
        let net: Ipv4Net = self.hub.external_cidr.parse().expect("valid CIDR");
        let host = u32::from(self.external) & u32::from(net.hostmask());
        Ipv4Addr::from(u32::from(net.network()) | host)
    }

    /// The file name of the object in the hub's nodes' object directories.
    pub fn file_name(&self) -> String {
        self.peering().nat_mapping_file()
    }
}

fn or_none(v: Option<&str>) -> &str {
    v.unwrap_or("None")
}

impl Peering {
    /// The local cluster's ExternalCIDR as the peer sees it.
    pub fn local_external_view(&self) -> Ipv4Net {
        self.local_nat_external
            .unwrap_or(self.local.external_cidr)
            .parse()
            .expect("valid CIDR")
    }

    /// Where the peer's conncheck reaches the local gateway: the first host
    /// of [`Peering::local_external_view`].
    pub fn conncheck_external(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.local_external_view().network()) + 1)
    }

    /// The NatMapping the local cluster holds for the peer, as Liqo v0.10's
    /// IPAM writes it: values in the peer's view of our ExternalCIDR, the
    /// conncheck's entry, and `entries` (endpoint, externalIP).
    pub fn nat_mapping_yaml(&self, entries: &[(Ipv4Addr, Ipv4Addr)]) -> String {
        let mut yaml = format!(
            "apiVersion: net.liqo.io/v1alpha1
kind: NatMapping
metadata:
  name: natmapping-{remote}
  generateName: natmapping-
  labels:
    net.liqo.io/natmapping: \"true\"
    clusterID: cluster-{remote}
spec:
  clusterID: cluster-{remote}
  podCIDR: {pod}
  externalCIDR: {external}
  clusterMappings:
",
            remote = self.remote.name,
            pod = self.remote_views()[0],
            external = self.local_external_view(),
        );
        let conncheck = (CONNCHECK_ADDR, self.conncheck_external());
        for (endpoint, external) in entries.iter().chain([&conncheck]) {
            yaml.push_str(&format!("    {endpoint}: {external}\n"));
        }
        yaml
    }

    /// The file name of its NatMapping in the local nodes' directories.
    pub fn nat_mapping_file(&self) -> String {
        format!("natmapping-{}.yaml", self.remote.name)
    }

    /// The networks the local cluster routes towards the peer.
    pub fn remote_views(&self) -> [Ipv4Net; 2] {
        [
            self.remote_nat_pod.unwrap_or(self.remote.pod_cidr),
            self.remote_nat_external
                .unwrap_or(self.remote.external_cidr),
        ]
        .map(|n| n.parse().expect("valid CIDR"))
    }

    /// The IPv6 networks of both sides, ours then the peer's, as
    /// [`TunnelEndpoint::ipv6`] takes them.
    pub fn ipv6_views(&self) -> [[&'static str; 4]; 2] {
        let [remote_pod, local_pod, remote_ext, local_ext] = self.nat6.map(or_none);
        let (ours, theirs) = (self.local, self.remote);
        [
            [ours.pod_cidr6, local_pod, ours.external_cidr6, local_ext],
            [
                theirs.pod_cidr6,
                remote_pod,
                theirs.external_cidr6,
                remote_ext,
            ],
        ]
    }

    /// The TunnelEndpoint the local cluster holds, as Liqo writes it, with
    /// the remote gateway's WireGuard public key if there is one.
    pub fn tunnel_endpoint_yaml(&self, remote_public_key: Option<&str>) -> String {
        self.tunnel_endpoint(remote_public_key).to_string()
    }

    /// The TunnelEndpoint of [`Peering::tunnel_endpoint_yaml`], to build on.
    fn tunnel_endpoint(&self, remote_public_key: Option<&str>) -> TunnelEndpoint {
        let remote = self.remote.name;
        let tep = TunnelEndpoint::new(&format!("tep-{remote}"), &format!("liqo-tenant-{remote}"))
            .local([
                self.local.pod_cidr,
                or_none(self.local_nat_pod),
                self.local.external_cidr,
                or_none(self.local_nat_external),
            ])
            .remote([
                self.remote.pod_cidr,
                or_none(self.remote_nat_pod),
                self.remote.external_cidr,
                or_none(self.remote_nat_external),
            ])
            .endpoint(
                self.endpoint_name
                    .map_or_else(|| self.remote.wan_addr().to_string(), str::to_owned),
            )
            .port(TUNNEL_PORT);
        let tep = match remote_public_key {
            Some(key) => tep.public_key(key),
            None => tep,
        };
        // Before v0.6 the peer's identity was a bare `clusterID`.
        let tep = match self.layout {
            Layout::Spec => tep.cluster_identity(&self.remote.cluster_id(), remote),
            Layout::Legacy => tep.cluster_id(&self.remote.cluster_id()),
        };
        tep.layout(self.layout)
    }
}

/// One row of docs/design.md#expected-reachability, in addresses `A` of
/// one family.
#[derive(Debug, Clone)]
pub struct Reach<A = Ipv4Addr> {
    /// Row number in docs/design.md#expected-reachability.
    pub row: u8,
    /// Client pod netns.
    pub from: String,
    /// Address the client connects to.
    pub target: A,
    /// Server pod netns that must answer.
    pub answered_by: String,
    /// Address the server must see the client as.
    pub client_seen_as: A,
}

impl<A> Reach<A> {
    /// The clusters whose gateways the row's traffic crosses: both ends,
    /// and a hub between them when they are not peered.
    pub fn clusters_crossed(&self) -> Vec<&'static Cluster> {
        let of = |ns: &str| {
            *CLUSTERS
                .iter()
                .find(|c| ns.starts_with(&format!("{}-", c.name)))
                .expect("a pod of a lab cluster")
        };
        let (from, to) = (of(&self.from), of(&self.answered_by));
        let peered = |x: &Cluster, y: &Cluster| {
            PEERINGS
                .iter()
                .any(|p| p.local.name == x.name && p.remote.name == y.name)
        };
        let mut crossed = vec![from, to];
        if !peered(from, to) {
            crossed.extend(
                CLUSTERS
                    .iter()
                    .copied()
                    .filter(|hub| peered(from, hub) && peered(hub, to)),
            );
        }
        crossed
    }
}

/// Rows 1–5: the a–b double NAT, b–c, and a to c through the hub b.
pub fn reachability() -> Vec<Reach> {
    let row = |row, from: String, target: [u8; 4], answered_by: String, seen: [u8; 4]| Reach {
        row,
        from,
        target: target.into(),
        answered_by,
        client_seen_as: seen.into(),
    };
    vec![
        row(1, A.pod(1), [10, 0, 0, 5], B.pod(1), [10, 0, 40, 5]),
        row(2, A.pod(2), [10, 0, 0, 133], B.pod(2), [10, 0, 40, 133]),
        row(3, B.pod(1), [10, 0, 40, 5], A.pod(1), [10, 0, 0, 5]),
        row(4, B.pod(1), [10, 1, 0, 5], C.pod(1), [10, 244, 0, 5]),
        row(
            5,
            A.pod(1),
            [10, 0, 1, 45],
            C.pod(1),
            B.masquerade_addr().octets(),
        ),
    ]
}

/// A Node as the API server holds it: its InternalIP `address`, its
/// PodCIDR if it has one, and if it is a gateway, both gateway labels: as
/// Liqo marks it, and as an administrator labels it for the base
/// DaemonSets.
pub fn node(name: &str, address: Ipv4Addr, pod_cidr: Option<&str>, gateway: bool) -> Value {
    let labels = match gateway {
        true => json!({GATEWAY_LABEL: "true", RESTRICTED_GATEWAY_LABEL: "true"}),
        false => json!({}),
    };
    let mut node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"addresses": [{"type": "InternalIP", "address": address.to_string()}]},
    });
    if let Some(cidr) = pod_cidr {
        node["spec"] = json!({"podCIDR": cidr, "podCIDRs": [cidr]});
    }
    node
}

mod dual_stack;
pub use dual_stack::{reachability6, synthetic_peer_views6};

#[cfg(test)]
mod tests;
