//! What a TunnelEndpoint may ask of this node beyond being well formed.
//!
//! A peer's views become routes into the tunnel and keys of the kernel's
//! peer table, so an object author could otherwise send the node's LAN, the
//! WireGuard traffic itself or the cluster's own networks into a tunnel.
//! The checks here need no other object; those that compare peers with
//! each other live with the reconciler's arbitration.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::{
    model::isolation::SecurityMode,
    model::node::Node,
    model::peer::{LiqoApi, Peer, Problem},
};

/// Networks no field of any TunnelEndpoint may touch, and why. IPv6's
/// link-local and multicast networks are where neighbour discovery and
/// router advertisements live: none may cross a tunnel.
const RESERVED: [(&str, &str); 10] = [
    ("0.0.0.0/8", "\"this network\" 0.0.0.0/8"),
    ("127.0.0.0/8", "loopback 127.0.0.0/8"),
    ("169.254.0.0/16", "link-local 169.254.0.0/16"),
    ("224.0.0.0/4", "multicast 224.0.0.0/4"),
    ("240.0.0.0/4", "reserved 240.0.0.0/4"),
    ("::/128", "the unspecified address ::/128"),
    ("::1/128", "loopback ::1/128"),
    ("::ffff:0:0/96", "IPv4-mapped ::ffff:0:0/96"),
    ("fe80::/10", "link-local fe80::/10"),
    ("ff00::/8", "multicast ff00::/8"),
];

/// Liqo's tenant namespaces, where its network manager writes TunnelEndpoints.
pub const LIQO_TENANT_NAMESPACES: &str = "liqo-tenant-*";

/// The shortest IPv4 view a peer may have by default: a /8.
pub const DEFAULT_MIN_PREFIX: u8 = 8;

/// The shortest IPv6 view a peer may have by default: a /32, a regional
/// registry's smallest allocation to a network operator.
pub const DEFAULT_MIN_PREFIX6: u8 = 32;

/// A network of this node or cluster that no peer may be seen under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protected {
    /// The network.
    pub net: IpNet,
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
    pub net: IpNet,
}

impl HostAddress {
    /// The network it lies in, which no view may overlap.
    pub fn network(&self) -> Protected {
        Protected {
            net: self.net.trunc(),
            what: format!("the network of {} ({})", self.device, self.net),
        }
    }

    /// The address itself, which no peer may reach, if it is IPv4: the
    /// NatMappings and `IP`s that could expose one are IPv4 alone.
    pub fn address(&self) -> Option<NodeAddress> {
        let IpAddr::V4(addr) = self.net.addr() else {
            return None;
        };
        Some(NodeAddress {
            addr,
            what: format!("an address of this node ({})", self.device),
        })
    }
}

/// The rules every TunnelEndpoint must follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Namespaces a TunnelEndpoint may live in: names, or prefixes ending in `*`.
    pub namespaces: Vec<String>,
    /// The shortest prefix of any IPv4 network of a TunnelEndpoint.
    pub min_prefix: u8,
    /// The shortest prefix of any IPv6 network of a TunnelEndpoint.
    pub min_prefix6: u8,
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
    /// Liqo's namespaces, views of a /8 (IPv6: /32) or longer, nothing
    /// else protected.
    fn default() -> Self {
        Self {
            namespaces: vec![LIQO_TENANT_NAMESPACES.into()],
            min_prefix: DEFAULT_MIN_PREFIX,
            min_prefix6: DEFAULT_MIN_PREFIX6,
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
        for (field, net) in peer.all_networks() {
            let (min, flag) = match net {
                IpNet::V4(_) => (self.min_prefix, "--min-view-prefix"),
                IpNet::V6(_) => (self.min_prefix6, "--min-view-prefix-ipv6"),
            };
            if net.prefix_len() < min {
                return Err(Problem::TooWide {
                    field,
                    net,
                    min,
                    flag,
                });
            }
            if let Some(what) = reserved(net) {
                return Err(Problem::Forbidden { field, net, what });
            }
        }
        for (field, net) in peer.all_views() {
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
        for (field, net) in peer.all_local_networks() {
            if let Some(what) = self.cluster_node_named(nodes, net) {
                return Err(Problem::Forbidden { field, net, what });
            }
        }
        Ok(())
    }

    /// The first node of the cluster or API server whose address lies in
    /// `net`, named with that address.
    fn cluster_node_named(&self, nodes: &[Node], net: IpNet) -> Option<String> {
        match net {
            IpNet::V4(net) => self
                .cluster_node_in(nodes, |addr| net.contains(&addr))
                .map(|node| format!("{} {}", node.what, node.addr)),
            IpNet::V6(net) => nodes.iter().find_map(|n| {
                let addr = n.address6.filter(|addr| net.contains(addr))?;
                Some(format!("the address of node {} {addr}", n.name))
            }),
        }
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

    /// The Node object whose IPv6 address is `addr`, named.
    pub fn node_address6(&self, nodes: &[Node], addr: Ipv6Addr) -> Option<String> {
        nodes
            .iter()
            .find(|n| n.address6 == Some(addr))
            .map(|n| format!("the address of node {}", n.name))
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
fn node_pod_cidr(nodes: &[Node], net: IpNet) -> Option<String> {
    nodes.iter().find_map(|n| {
        let ipv4 = n.pod_cidrs.iter().map(|c| IpNet::V4(*c));
        let mut cidrs = ipv4.chain(n.pod_cidrs6.iter().map(|c| IpNet::V6(*c)));
        let cidr = cidrs.find(|c| overlaps(net, *c))?;
        Some(format!("the PodCIDR {cidr} of node {}", n.name))
    })
}

/// The reserved range `net` touches, named.
fn reserved(net: IpNet) -> Option<String> {
    RESERVED.iter().find_map(|(range, what)| {
        let range: IpNet = range.parse().expect("a valid CIDR");
        overlaps(net, range).then(|| (*what).to_owned())
    })
}

/// Whether two networks share an address; never across families.
pub fn overlaps(a: impl Into<IpNet>, b: impl Into<IpNet>) -> bool {
    let (a, b) = (a.into(), b.into());
    a.contains(&b.network()) || b.contains(&a.network())
}

/// This host's own addresses, each with its device: a view over one of
/// their networks would route the node's own LAN into a tunnel, and a peer
/// must reach none of them.
pub fn host_addresses() -> std::io::Result<Vec<HostAddress>> {
    let mut addresses = Vec::new();
    for address in nix::ifaddrs::getifaddrs()? {
        let (Some(addr), Some(mask)) = (address.address.as_ref(), address.netmask.as_ref()) else {
            continue;
        };
        let net = if let (Some(addr), Some(mask)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
            let len = u32::from(mask.ip()).leading_ones() as u8;
            Ipv4Net::new(addr.ip(), len).ok().map(IpNet::V4)
        } else if let (Some(addr), Some(mask)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
            let len = u128::from(mask.ip()).leading_ones() as u8;
            Ipv6Net::new(addr.ip(), len).ok().map(IpNet::V6)
        } else {
            None
        };
        if let Some(net) = net {
            addresses.push(HostAddress {
                device: address.interface_name,
                net,
            });
        }
    }
    Ok(addresses)
}

/// This cluster's networks given on the command line, named after the flag.
pub fn cluster_networks(pods: &[IpNet], services: &[IpNet]) -> Vec<Protected> {
    let named = |nets: &[IpNet], flag: &str| -> Vec<Protected> {
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
mod tests;
