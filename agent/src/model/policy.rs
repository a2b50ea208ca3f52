//! What a TunnelEndpoint may ask of this node beyond being well formed.
//!
//! A peer's views become routes into the tunnel and keys of the kernel's
//! peer table, so an object author could otherwise send the node's LAN, the
//! WireGuard traffic itself or the cluster's own networks into a tunnel.
//! The checks here need no other object; those that compare peers with
//! each other live with the reconciler's arbitration.

use std::{collections::HashSet, net::Ipv4Addr};

use ipnet::Ipv4Net;

use crate::{
    model::isolation::SecurityMode,
    model::node::Node,
    model::peer::{LiqoApi, Peer, Problem},
};

/// Networks no field of any TunnelEndpoint may touch, and why.
const RESERVED: [(&str, &str); 5] = [
    ("0.0.0.0/8", "\"this network\" 0.0.0.0/8"),
    ("127.0.0.0/8", "loopback 127.0.0.0/8"),
    ("169.254.0.0/16", "link-local 169.254.0.0/16"),
    ("224.0.0.0/4", "multicast 224.0.0.0/4"),
    ("240.0.0.0/4", "reserved 240.0.0.0/4"),
];

/// Liqo's tenant namespaces, where its network manager writes TunnelEndpoints.
pub const LIQO_TENANT_NAMESPACES: &str = "liqo-tenant-*";

/// The shortest view a peer may have by default: a /8.
pub const DEFAULT_MIN_PREFIX: u8 = 8;

/// A network of this node or cluster that no peer may be seen under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protected {
    /// The network.
    pub net: Ipv4Net,
    /// What it is, for the rejection message.
    pub what: String,
}

/// An address of a node of this cluster, which no peer may reach: neither
/// through a NatMapping entry nor through one of our networks that a
/// TunnelEndpoint names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    /// The address.
    pub addr: Ipv4Addr,
    /// What it is, for the rejection message.
    pub what: String,
}

/// An address of this host, as its device holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAddress {
    /// The device.
    pub device: String,
    /// The address with its prefix length.
    pub net: Ipv4Net,
}

impl HostAddress {
    /// The network it lies in, which no view may overlap.
    pub fn network(&self) -> Protected {
        Protected {
            net: self.net.trunc(),
            what: format!("the network of {} ({})", self.device, self.net),
        }
    }

    /// The address itself, which no peer may reach.
    pub fn address(&self) -> NodeAddress {
        NodeAddress {
            addr: self.net.addr(),
            what: format!("an address of this node ({})", self.device),
        }
    }
}

/// The rules every TunnelEndpoint must follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Namespaces a TunnelEndpoint may live in: names, or prefixes ending in `*`.
    pub namespaces: Vec<String>,
    /// The shortest prefix of any network of a TunnelEndpoint.
    pub min_prefix: u8,
    /// Networks no view may overlap: the node's own, the cluster's Pod and
    /// Service networks.
    pub protected: Vec<Protected>,
    /// This node's own addresses, which no NatMapping may expose.
    pub host_addresses: Vec<NodeAddress>,
    /// The API server's address, which no peer may reach.
    pub api_server: Option<NodeAddress>,
    /// The security mode of a peer whose TunnelEndpoint asks for none.
    pub security_mode: SecurityMode,
    /// The Liqo API the cluster runs: peers of the other are refused.
    pub liqo_api: LiqoApi,
}

impl Default for Policy {
    /// Liqo's namespaces, views of a /8 or longer, nothing else protected.
    fn default() -> Self {
        Self {
            namespaces: vec![LIQO_TENANT_NAMESPACES.into()],
            min_prefix: DEFAULT_MIN_PREFIX,
            protected: Vec::new(),
            host_addresses: Vec::new(),
            api_server: None,
            security_mode: SecurityMode::default(),
            liqo_api: LiqoApi::V0_10,
        }
    }
}

impl Policy {
    /// What is wrong with `peer` on its own, if anything. `nodes` are the
    /// cluster's nodes as of now: their PodCIDRs are protected too.
    pub fn check(&self, peer: &Peer, nodes: &[Node]) -> Result<(), Problem> {
        let api = peer.remaps().api();
        if api != self.liqo_api {
            return Err(Problem::OtherApi {
                api: api.as_str(),
                served: self.liqo_api.as_str(),
            });
        }
        if !self.namespace_allowed(&peer.key.namespace) {
            return Err(Problem::Namespace {
                namespace: peer.key.namespace.clone(),
                allowed: self.namespaces.join(","),
            });
        }
        for (field, net) in peer.networks() {
            if net.prefix_len() < self.min_prefix {
                let min = self.min_prefix;
                return Err(Problem::TooWide { field, net, min });
            }
            if let Some(what) = reserved(net) {
                return Err(Problem::Forbidden { field, net, what });
            }
        }
        for (field, net) in peer.views() {
            let what = self
                .protected
                .iter()
                .find(|p| overlaps(net, p.net))
                .map(|p| p.what.clone())
                .or_else(|| node_pod_cidr(nodes, net));
            if let Some(what) = what {
                return Err(Problem::Forbidden { field, net, what });
            }
        }
        // Our real networks are where the peer's packets go once
        // translated: none may hold another node, or the API server. This
        // node's own addresses may lie in them (a CNI's bridge, the
        // masquerade address), and the kernel refuses those as nodes'.
        for (field, net) in peer.local_networks() {
            if let Some(node) = self.cluster_node_in(nodes, |addr| net.contains(&addr)) {
                let what = format!("{} {}", node.what, node.addr);
                return Err(Problem::Forbidden { field, net, what });
            }
        }
        Ok(())
    }

    /// The first address of a node of the cluster (`nodes`, this node's
    /// own, the API server's) that `matches`, named: named only once found,
    /// as every pass checks every peer and NatMapping entry.
    pub fn node_address_in(
        &self,
        nodes: &[Node],
        matches: impl Fn(Ipv4Addr) -> bool,
    ) -> Option<NodeAddress> {
        self.cluster_node_in(nodes, &matches).or_else(|| {
            self.host_addresses
                .iter()
                .find(|node| matches(node.addr))
                .cloned()
        })
    }

    /// Every address [`Self::node_address_in`] names: to test many
    /// addresses against them at the cost of one lookup each.
    pub fn node_addresses(&self, nodes: &[Node]) -> HashSet<Ipv4Addr> {
        nodes
            .iter()
            .map(|n| n.address)
            .chain(self.api_server.iter().map(|a| a.addr))
            .chain(self.host_addresses.iter().map(|a| a.addr))
            .collect()
    }

    /// The first Node object's or the API server's address that
    /// `matches`, named.
    fn cluster_node_in(
        &self,
        nodes: &[Node],
        matches: impl Fn(Ipv4Addr) -> bool,
    ) -> Option<NodeAddress> {
        let node = nodes
            .iter()
            .find(|n| matches(n.address))
            .map(|n| NodeAddress {
                addr: n.address,
                what: format!("the address of node {}", n.name),
            });
        node.or_else(|| self.api_server.clone().filter(|a| matches(a.addr)))
    }

    fn namespace_allowed(&self, namespace: &str) -> bool {
        self.namespaces
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => namespace.starts_with(prefix),
                None => namespace == pattern,
            })
    }
}

/// The node PodCIDR `net` touches, named: formatted only when one does, as
/// every pass checks every peer against every node.
fn node_pod_cidr(nodes: &[Node], net: Ipv4Net) -> Option<String> {
    nodes.iter().find_map(|n| {
        let cidr = n.pod_cidrs.iter().find(|c| overlaps(net, **c))?;
        Some(format!("the PodCIDR {cidr} of node {}", n.name))
    })
}

/// The reserved range `net` touches, named.
fn reserved(net: Ipv4Net) -> Option<String> {
    RESERVED.iter().find_map(|(range, what)| {
        let range: Ipv4Net = range.parse().expect("a valid CIDR");
        overlaps(net, range).then(|| (*what).to_owned())
    })
}

/// Whether two networks share an address.
pub fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// This host's own addresses, each with its device: a view over one of
/// their networks would route the node's own LAN into a tunnel, and a peer
/// must reach none of them.
pub fn host_addresses() -> std::io::Result<Vec<HostAddress>> {
    let mut addresses = Vec::new();
    for address in nix::ifaddrs::getifaddrs()? {
        let (Some(addr), Some(mask)) = (
            address.address.as_ref().and_then(|a| a.as_sockaddr_in()),
            address.netmask.as_ref().and_then(|m| m.as_sockaddr_in()),
        ) else {
            continue;
        };
        let len = u32::from(mask.ip()).leading_ones() as u8;
        let Ok(net) = Ipv4Net::new(addr.ip(), len) else {
            continue;
        };
        addresses.push(HostAddress {
            device: address.interface_name,
            net,
        });
    }
    Ok(addresses)
}

/// This cluster's networks given on the command line, named after the flag.
pub fn cluster_networks(pods: &[Ipv4Net], services: &[Ipv4Net]) -> Vec<Protected> {
    let named = |nets: &[Ipv4Net], flag: &str| -> Vec<Protected> {
        nets.iter()
            .map(|net| Protected {
                net: net.trunc(),
                what: format!("this cluster's {net} ({flag})"),
            })
            .collect()
    };
    [named(pods, "--pod-cidr"), named(services, "--service-cidr")].concat()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use isthmus_lab::objects::TunnelEndpoint;

    use super::*;
    use crate::model::object::{Object, parse_documents};

    /// A peer in `namespace` whose remote networks are `remote` (pod and
    /// external, each real then as we see it).
    fn peer(namespace: &str, remote: [&str; 4]) -> Peer {
        read(TunnelEndpoint::new("tep", namespace).remote(remote))
    }

    /// `tep`, with a tunnel, as the agent reads it.
    fn read(tep: TunnelEndpoint) -> Peer {
        let yaml = tep
            .endpoint("203.0.113.2")
            .public_key("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
            .to_string();
        let docs = parse_documents(Path::new("t.yaml"), &yaml);
        let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
            panic!("{docs:?}")
        };
        Peer::from_raw(raw, "t.yaml").unwrap()
    }

    const ORDINARY: [&str; 4] = ["10.1.0.0/24", "None", "192.168.2.0/24", "None"];

    fn lan() -> Policy {
        Policy {
            protected: vec![Protected {
                net: "172.16.1.0/24".parse().unwrap(),
                what: "the network of lan0 (172.16.1.1/24)".into(),
            }],
            ..Policy::default()
        }
    }

    fn problem(policy: &Policy, peer: &Peer) -> String {
        policy.check(peer, &[]).unwrap_err().to_string()
    }

    #[test]
    fn an_ordinary_peer_passes() {
        let p = peer("liqo-tenant-b", ORDINARY);
        assert_eq!(lan().check(&p, &[]), Ok(()));
    }

    #[test]
    fn views_over_everything_are_refused_naming_the_field() {
        let p = peer(
            "liqo-tenant-b",
            ["0.0.0.0/1", "None", "128.0.0.0/1", "None"],
        );
        assert_eq!(
            problem(&lan(), &p),
            "field remotePodCIDR: 0.0.0.0/1 is wider than /8 (--min-view-prefix)"
        );
        let p = peer(
            "liqo-tenant-b",
            ["10.1.0.0/24", "0.0.0.0/24", "192.168.2.0/24", "None"],
        );
        assert_eq!(
            problem(&lan(), &p),
            "field remoteNATPodCIDR: 0.0.0.0/24 touches \"this network\" 0.0.0.0/8; no peer may use it"
        );
    }

    #[test]
    fn views_over_the_nodes_networks_or_the_clusters_are_refused() {
        let over_lan = ["10.1.0.0/24", "172.16.1.0/24", "192.168.2.0/24", "None"];
        assert_eq!(
            problem(&lan(), &peer("liqo-tenant-b", over_lan)),
            "field remoteNATPodCIDR: 172.16.1.0/24 touches the network of lan0 (172.16.1.1/24); no peer may use it"
        );
        let over_services = ["10.96.0.0/24", "None", "192.168.2.0/24", "None"];
        let mut policy = lan();
        policy
            .protected
            .extend(cluster_networks(&[], &["10.96.0.0/12".parse().unwrap()]));
        let p = peer("liqo-tenant-b", over_services);
        assert_eq!(
            policy.check(&p, &[]).unwrap_err().to_string(),
            "field remotePodCIDR: 10.96.0.0/24 touches this cluster's 10.96.0.0/12 (--service-cidr); no peer may use it"
        );
        let link_local = ["10.1.0.0/24", "None", "169.254.0.0/24", "None"];
        let p = peer("liqo-tenant-b", link_local);
        assert!(problem(&lan(), &p).contains("link-local 169.254.0.0/16"));
    }

    #[test]
    fn a_real_network_may_overlap_ours_but_not_be_reserved() {
        // Double NAT: the peer's real PodCIDR is ours too, seen remapped.
        let remapped = ["172.16.1.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"];
        assert_eq!(lan().check(&peer("liqo-tenant-b", remapped), &[]), Ok(()));
        let loopback = ["127.0.0.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"];
        assert!(
            problem(&lan(), &peer("liqo-tenant-b", loopback))
                .starts_with("field remotePodCIDR: 127.0.0.0/24 touches loopback")
        );
    }

    #[test]
    fn only_allowed_namespaces_pass() {
        let p = peer("default", ORDINARY);
        assert_eq!(
            problem(&lan(), &p),
            "field metadata.namespace: \"default\" is not one where TunnelEndpoints are accepted (liqo-tenant-*; see --tunnelendpoint-namespaces)"
        );
        let more = Policy {
            namespaces: vec![LIQO_TENANT_NAMESPACES.into(), "default".into()],
            ..lan()
        };
        assert_eq!(more.check(&p, &[]), Ok(()));
    }

    #[test]
    fn host_addresses_include_loopback() {
        let addresses = host_addresses().unwrap();
        let lo = addresses
            .iter()
            .find(|a| a.net == "127.0.0.1/8".parse().unwrap())
            .unwrap_or_else(|| panic!("{addresses:?}"));
        assert_eq!(lo.network().net, "127.0.0.0/8".parse().unwrap());
        assert!(lo.network().what.contains("lo"), "{lo:?}");
        assert_eq!(lo.address().addr, Ipv4Addr::LOCALHOST);
    }

    #[test]
    fn our_networks_may_hold_no_node() {
        let node = Node {
            name: "b-node".into(),
            pod_cidrs: Vec::new(),
            address: Ipv4Addr::new(172, 16, 2, 2),
            external_address: None,
            labels: std::collections::BTreeMap::default(),
        };
        let p = read(
            TunnelEndpoint::new("tep", "liqo-tenant-b")
                .local([
                    "10.244.0.0/24",
                    "10.0.40.0/24",
                    "172.16.2.0/24",
                    "10.0.41.0/24",
                ])
                .remote(ORDINARY),
        );
        assert_eq!(
            Policy::default()
                .check(&p, &[node])
                .unwrap_err()
                .to_string(),
            "field localExternalCIDR: 172.16.2.0/24 touches the address of node b-node 172.16.2.2; no peer may use it"
        );
        let api_server = Policy {
            api_server: Some(NodeAddress {
                addr: Ipv4Addr::new(172, 16, 2, 9),
                what: "the API server's address".into(),
            }),
            ..Policy::default()
        };
        // This node's own addresses may lie in our networks (a CNI's
        // bridge, the masquerade address).
        let own = Policy {
            host_addresses: vec![NodeAddress {
                addr: Ipv4Addr::new(172, 16, 2, 1),
                what: "an address of this node (lan0)".into(),
            }],
            ..Policy::default()
        };
        assert_eq!(own.check(&p, &[]), Ok(()));
        assert!(
            api_server
                .check(&p, &[])
                .unwrap_err()
                .to_string()
                .contains("the API server's address 172.16.2.9")
        );
        assert_eq!(Policy::default().check(&p, &[]), Ok(()));
    }
}
