//! The dual-stack lab's IPv6 addresses and reachability rows
//! (docs/design.md#dual-stack): every IPv4 address keeps its role, and
//! each gets the IPv6 address of the same role. A pod's host part is
//! kept: `.5` is `::5`, and `.133`, on the gateway node, is
//! `:8000::133`, in the upper half of the /64.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::Ipv6Net;
use serde_json::{Value, json};

use super::{A, B, C, Cluster, HubMapping, NAT_MAPPING, Peering, Reach};
use crate::objects::TunnelEndpoint;

/// Host part of the pod on the worker node (lower /65).
const POD1_HOST: u128 = 5;
/// Host part of the pod on the gateway node (upper /65).
const POD2_HOST: u128 = (0x8000 << 48) | 0x133;

impl Cluster {
    /// The cluster's Node objects as a dual-stack cluster's are: each with
    /// an IPv6 `InternalIP` after its IPv4 one, and its half of the IPv6
    /// PodCIDR after its IPv4 half, as Kubernetes lists both families.
    pub fn dual_stack_node_objects(&self) -> [Value; 2] {
        let mut nodes = self.node_objects();
        let ipv6 = [(self.lan_gw6(), 2), (self.lan_node6(), 1)];
        for (node, (address, half)) in nodes.iter_mut().zip(ipv6) {
            let internal = json!({"type": "InternalIP", "address": address.to_string()});
            if let Some(addresses) = node["status"]["addresses"].as_array_mut() {
                addresses.push(internal);
            }
            if let Some(cidrs) = node["spec"]["podCIDRs"].as_array_mut() {
                cidrs.push(json!(self.pod_half6(half).to_string()));
            }
        }
        nodes
    }

    /// The gateway's uplink IPv6 address, `2001:db8:ffff::N`.
    pub fn wan_addr6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, self.index.into())
    }
    /// The gateway's LAN IPv6 address, `fd00:172:16:N::1`.
    pub fn lan_gw6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x172, 0x16, self.index.into(), 0, 0, 0, 1)
    }
    /// The worker's LAN IPv6 address, `fd00:172:16:N::2`.
    pub fn lan_node6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x172, 0x16, self.index.into(), 0, 0, 0, 2)
    }
    /// The IPv6 PodCIDR as a network.
    pub fn pods6(&self) -> Ipv6Net {
        self.pod_cidr6.parse().expect("valid IPv6 PodCIDR")
    }
    /// IPv6 address of pod `i` (1 on the worker, 2 on the gateway).
    pub fn pod_addr6(&self, i: u8) -> Ipv6Addr {
        let host = if i == 1 { POD1_HOST } else { POD2_HOST };
        Ipv6Addr::from(u128::from(self.pods6().network()) | host)
    }
    /// The IPv6 address its gateway masquerades flows to when their source
    /// is none of the cluster's: the last but one of its PodCIDR, as for
    /// IPv4.
    pub fn masquerade_addr6(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.pods6().broadcast()) - 1)
    }
    /// The half of the IPv6 PodCIDR whose pods live on the worker (1) or
    /// the gateway (2).
    pub fn pod_half6(&self, i: u8) -> Ipv6Net {
        let pods = self.pods6();
        let halves = pods.subnets(pods.prefix_len() + 1).expect("splittable");
        halves
            .into_iter()
            .nth(usize::from(i - 1))
            .expect("two halves")
    }
}

impl Peering {
    /// Whether the tunnel of this peering runs over the WAN's IPv6
    /// addresses: a–b's does, b–c's runs over IPv4.
    pub fn over_ipv6_wan(&self) -> bool {
        let ends = [self.local.name, self.remote.name];
        ends.contains(&"a") && ends.contains(&"b")
    }

    /// The IPv6 networks the local cluster routes towards the peer: its
    /// Pod and External CIDRs as we see them.
    pub fn remote_views6(&self) -> [Ipv6Net; 2] {
        [
            self.nat6[0].unwrap_or(self.remote.pod_cidr6),
            self.nat6[2].unwrap_or(self.remote.external_cidr6),
        ]
        .map(|n| n.parse().expect("valid IPv6 CIDR"))
    }

    /// Our IPv6 ExternalCIDR as the peer sees it: where the peer reaches
    /// what our NatMapping's IPv6 entries expose.
    pub fn local_external_view6(&self) -> Ipv6Net {
        self.nat6[3]
            .unwrap_or(self.local.external_cidr6)
            .parse()
            .expect("valid IPv6 CIDR")
    }

    /// The TunnelEndpoint of the dual-stack lab: the IPv4 one's, with the
    /// IPv6 networks of both sides, and the peer's gateway at `endpoint`
    /// where the object gives an address rather than a name.
    pub fn dual_stack_tunnel_endpoint(
        &self,
        remote_public_key: Option<&str>,
        endpoint: IpAddr,
    ) -> TunnelEndpoint {
        let [ours, theirs] = self.ipv6_views();
        let tep = self.tunnel_endpoint(remote_public_key).ipv6(ours, theirs);
        match self.endpoint_name {
            Some(_) => tep,
            None => tep.endpoint(endpoint),
        }
    }
}

impl HubMapping {
    /// The lab's IPv6 entry (endpoint, externalIP): c-pod1 at
    /// `fd00:10:0:1::45`, in a's view of b's IPv6 ExternalCIDR.
    pub fn entry6(&self) -> (Ipv6Addr, Ipv6Addr) {
        let view = self.peering().local_external_view6();
        let external = Ipv6Addr::from(u128::from(view.network()) | 0x45);
        (C.pod_addr6(1), external)
    }

    /// The NatMapping of [`HubMapping::yaml`], with `spec.ipv6` holding
    /// `entries6` (endpoint, externalIP): Isthmus's superset for a
    /// dual-stack peering.
    pub fn dual_stack_yaml(
        &self,
        entries: &[(std::net::Ipv4Addr, std::net::Ipv4Addr)],
        entries6: &[(Ipv6Addr, Ipv6Addr)],
    ) -> String {
        let peering = self.peering();
        let mut yaml = self.yaml(entries);
        yaml.push_str(&format!(
            "  ipv6:\n    podCIDR: {}\n    externalCIDR: {}\n    clusterMappings:\n",
            peering.remote_views6()[0],
            peering.local_external_view6(),
        ));
        for (endpoint, external) in entries6 {
            yaml.push_str(&format!("      '{endpoint}': '{external}'\n"));
        }
        yaml
    }
}

/// The IPv6 rows of docs/design.md#dual-stack: a–b both ways through the
/// double NAT, b to c, and a to c through b's NatMapping and masquerade.
pub fn reachability6() -> Vec<Reach<Ipv6Addr>> {
    let addr = |text: &str| text.parse::<Ipv6Addr>().expect("an IPv6 address");
    let row = |row, from: String, target: &str, answered_by: String, seen: &str| Reach {
        row,
        from,
        target: addr(target),
        answered_by,
        client_seen_as: addr(seen),
    };
    vec![
        row(1, A.pod(1), "fd00:10::5", B.pod(1), "fd00:10:0:40::5"),
        row(
            2,
            A.pod(2),
            "fd00:10::8000:0:0:133",
            B.pod(2),
            "fd00:10:0:40:8000::133",
        ),
        row(3, B.pod(1), "fd00:10:0:40::5", A.pod(1), "fd00:10::5"),
        row(4, B.pod(1), "fd00:10:1::5", C.pod(1), "fd00:10:244::5"),
        Reach {
            row: 5,
            from: A.pod(1),
            target: NAT_MAPPING.entry6().1,
            answered_by: C.pod(1),
            client_seen_as: B.masquerade_addr6(),
        },
    ]
}

/// The IPv6 networks of synthetic peer `i` of the benchmarks, in the order
/// of `synthetic_peer_views`: ours as it sees them (Pod, External), then
/// its own as we see them.
pub fn synthetic_peer_views6(i: usize) -> [Ipv6Net; 4] {
    [0x130, 0x131, 0x128, 0x129].map(|second| {
        let net = Ipv6Addr::new(0xfd00, second, i as u16, 0, 0, 0, 0, 0);
        Ipv6Net::new(net, 64).expect("a /64")
    })
}
