//! Liqo v1's objects (`networking.liqo.io/v1beta1`, `ipam.liqo.io/v1alpha1`),
//! read for what a peer needs: its networks and how we see them (a
//! `Configuration`), its gateway's key (a `PublicKey`), our side of the
//! tunnel (an `IsthmusGatewayServer` or `IsthmusGatewayClient`, which Liqo
//! renders for its `GatewayServer` or `GatewayClient`), and the addresses
//! of ours exposed under others (`IP`). The objects of one peer carry its cluster ID
//! in the label `liqo.io/remote-cluster-id`.
//!
//! Liqo v1 translates the other way from v0.10: each cluster remaps only its
//! peers' addresses, so between the gateways both addresses are real. The
//! file and line references are to liqotech/liqo at v1.2.0.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde_yaml_ng::Value;

mod peer;

pub use peer::Companions;

use crate::model::{
    cidr::Cidr,
    key_text,
    object::{ObjectError, ObjectKey, ObjectKind, RawObject},
    peer::{Endpoint, Mapped, Networks, Peer, Remaps},
};

/// The label that names the peer an object is about.
pub const CLUSTER_ID_LABEL: &str = "liqo.io/remote-cluster-id";
/// Liqo v1's WireGuard port, where the objects leave it out
/// (`forge/gatewayserver.go:35`).
pub const DEFAULT_PORT: u16 = 51840;
/// Liqo v1's tunnel MTU, where the objects leave it out (`forge/common.go:19`).
pub const DEFAULT_MTU: u16 = 1340;

/// Liqo v1's address for sources the peers cannot route back to, which its
/// fabric gives a node's own traffic: the first address of our
/// ExternalCIDR, the network address itself (`pkg/utils/ipam/ips.go:47-75`,
/// `internal-network/configuration-controller/firewall.go:95`). Taken from
/// the first Liqo v1 peer among `peers`, as every `Configuration` gives our
/// ExternalCIDR; None without one. The IPv6 address is found the same way
/// in our IPv6 ExternalCIDR, from the first such peer that has one.
pub fn unknown_sources(peers: &[Peer]) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let mut v1_peers = peers.iter().filter(|peer| peer.remaps() == Remaps::Theirs);
    let ipv4 = v1_peers.clone().next();
    let ipv6 = v1_peers.find_map(|peer| peer.ipv6.as_ref());
    (
        ipv4.map(|peer| peer.ipv4.local_external.real.network()),
        ipv6.map(|networks| networks.local_external.real.network()),
    )
}

/// One peer's networks, from its `Configuration`: ours
/// (`spec.local.cidr`), never remapped by us, and the peer's
/// (`spec.remote.cidr`) with how we see them (`status.remote.cidr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerNetworks {
    /// The peer's cluster ID.
    pub cluster_id: String,
    /// The IPv4 networks.
    pub ipv4: Networks,
    /// The IPv6 networks, where every list holds one.
    pub ipv6: Option<Networks<Ipv6Net>>,
}

/// The networks of one field's list: one IPv4 network and at most one IPv6
/// network.
struct Listed {
    ipv4: Ipv4Net,
    ipv6: Option<Ipv6Net>,
}

/// A peer gateway's WireGuard key, from its `PublicKey`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerKey {
    /// The peer's cluster ID.
    pub cluster_id: String,
    /// `spec.publicKey`, decoded.
    pub key: [u8; 32],
}

/// Our side of the tunnel to one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Side {
    /// We listen on `port`; the peer connects (`IsthmusGatewayServer`).
    Server {
        /// `spec.endpoint.port`.
        port: u16,
    },
    /// We connect to the peer's gateway (`IsthmusGatewayClient`).
    Client {
        /// `spec.endpoint.addresses[0]`: an address, or a host name.
        endpoint: Endpoint,
        /// `spec.endpoint.port`.
        port: u16,
    },
}

/// Our gateway towards one peer, from an `IsthmusGatewayServer` or
/// `IsthmusGatewayClient`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gateway {
    /// The object.
    pub key: ObjectKey,
    /// The peer's cluster ID.
    pub cluster_id: String,
    /// Server or client, and where.
    pub side: Side,
    /// `spec.mtu`.
    pub mtu: u16,
}

/// An address of ours that peers reach under another, from an `IP`: the
/// gateway sends what arrives for `exposed` on to `target`. Both are of
/// one family: an IPv6 `IP` exposes an IPv6 address in our IPv6
/// ExternalCIDR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpMapping {
    /// `status.ip`: the address in our ExternalCIDR the IPAM gave it.
    pub exposed: IpAddr,
    /// `spec.ip`: the address behind it.
    pub target: IpAddr,
}

impl PeerNetworks {
    /// Reads a `Configuration` from `origin`. Its `status.remote` is written
    /// by Liqo's IPAM once it has remapped the peer's networks; until then
    /// the peer has no view of ours to route by, and the object is an error
    /// that says so.
    pub fn from_configuration(raw: &RawObject, origin: &str) -> Result<Self, ObjectError> {
        let fields = Fields::new(raw, origin, ObjectKind::Configuration);
        let list = |path: &[&str]| fields.cidrs(path);
        let [local_pod, local_external] =
            ["pod", "external"].map(|network| list(&["spec", "local", "cidr", network]));
        let [remote_pod, remote_external] =
            ["pod", "external"].map(|network| list(&["spec", "remote", "cidr", network]));
        let [seen_pod, seen_external] =
            ["pod", "external"].map(|network| list(&["status", "remote", "cidr", network]));
        let lists = [
            local_pod?,
            local_external?,
            remote_pod?,
            remote_external?,
            seen_pod?,
            seen_external?,
        ];
        let ipv4 = fields.networks(lists.each_ref().map(|listed| Some(listed.ipv4)))?;
        let ipv6 = lists.each_ref().map(|listed| listed.ipv6);
        let ipv6 = match ipv6.iter().position(Option::is_none) {
            Some(_) if ipv6.iter().all(Option::is_none) => None,
            None => Some(fields.networks(ipv6)?),
            Some(missing) => {
                let with = ipv6.iter().position(Option::is_some).unwrap_or_default();
                return Err(fields.error(format!(
                    "field {}: no IPv6 network, where {} has one; a peer has IPv6 networks in \
                     every field or in none",
                    CONFIGURATION_LISTS[missing], CONFIGURATION_LISTS[with]
                )));
            }
        };
        Ok(Self {
            cluster_id: fields.cluster_id()?,
            ipv4,
            ipv6,
        })
    }
}

/// The lists of a `Configuration`, in the order [`Fields::networks`] reads
/// them.
const CONFIGURATION_LISTS: [&str; 6] = [
    "spec.local.cidr.pod",
    "spec.local.cidr.external",
    "spec.remote.cidr.pod",
    "spec.remote.cidr.external",
    "status.remote.cidr.pod",
    "status.remote.cidr.external",
];

impl PeerKey {
    /// Reads a `PublicKey` from `origin`.
    pub fn from_public_key(raw: &RawObject, origin: &str) -> Result<Self, ObjectError> {
        let fields = Fields::new(raw, origin, ObjectKind::PublicKey);
        let text = fields.text(&["spec", "publicKey"])?;
        let key = key_text::decode(&text).ok_or_else(|| {
            fields.error(format!(
                "field spec.publicKey: {text:?} is not the base64 of a 32-byte key"
            ))
        })?;
        Ok(Self {
            cluster_id: fields.cluster_id()?,
            key,
        })
    }
}

impl Gateway {
    /// Reads an `IsthmusGatewayServer` or an `IsthmusGatewayClient` from
    /// `origin`.
    pub fn from_raw(raw: &RawObject, kind: ObjectKind, origin: &str) -> Result<Self, ObjectError> {
        let fields = Fields::new(raw, origin, kind);
        let port = fields.port(&["spec", "endpoint", "port"])?;
        let side = match kind {
            ObjectKind::IsthmusGatewayClient => Side::Client {
                endpoint: fields.client_endpoint()?,
                port,
            },
            _ => Side::Server { port },
        };
        Ok(Self {
            key: raw.key.clone(),
            cluster_id: fields.cluster_id()?,
            side,
            mtu: fields.mtu()?,
        })
    }
}

impl IpMapping {
    /// Reads an `IP` from `origin`; None until the IPAM has given it an
    /// address (`status.ip`).
    pub fn from_raw(raw: &RawObject, origin: &str) -> Result<Option<Self>, ObjectError> {
        let fields = Fields::new(raw, origin, ObjectKind::Ip);
        let target = fields.address(&["spec", "ip"])?;
        if fields.get(&["status", "ip"]).is_none() {
            return Ok(None);
        }
        let exposed = fields.address(&["status", "ip"])?;
        if exposed.is_ipv6() != target.is_ipv6() {
            return Err(fields.error(format!(
                "field status.ip: {exposed} is not of the family of spec.ip {target}"
            )));
        }
        Ok(Some(Self { exposed, target }))
    }
}

/// Reads a Liqo v1 object of `kind` for its errors alone.
pub fn read(raw: &RawObject, kind: ObjectKind, origin: &str) -> Result<(), ObjectError> {
    match kind {
        ObjectKind::Configuration => PeerNetworks::from_configuration(raw, origin).map(drop),
        ObjectKind::PublicKey => PeerKey::from_public_key(raw, origin).map(drop),
        ObjectKind::Ip => IpMapping::from_raw(raw, origin).map(drop),
        _ => Gateway::from_raw(raw, kind, origin).map(drop),
    }
}

/// Reads the fields of one object, naming them in its errors.
struct Fields<'a> {
    raw: &'a RawObject,
    origin: &'a str,
    kind: ObjectKind,
}

impl<'a> Fields<'a> {
    fn new(raw: &'a RawObject, origin: &'a str, kind: ObjectKind) -> Self {
        Self { raw, origin, kind }
    }

    fn error(&self, problem: String) -> ObjectError {
        ObjectError::new(self.origin, self.kind, self.raw, problem)
    }

    fn get(&self, path: &[&str]) -> Option<&'a Value> {
        self.raw
            .get(path)
            .filter(|value| !matches!(value, Value::Null))
    }

    fn missing(&self, path: &[&str]) -> ObjectError {
        self.error(format!("field {}: missing", path.join(".")))
    }

    fn text(&self, path: &[&str]) -> Result<String, ObjectError> {
        match self.get(path) {
            Some(Value::String(text)) => Ok(text.clone()),
            Some(other) => Err(self.error(format!(
                "field {}: {other:?} is not a string",
                path.join(".")
            ))),
            None => Err(self.missing(path)),
        }
    }

    /// The label that names the peer.
    fn cluster_id(&self) -> Result<String, ObjectError> {
        self.raw
            .label(CLUSTER_ID_LABEL)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                self.error(format!(
                    "field metadata.labels[{CLUSTER_ID_LABEL}]: missing; it names the peer"
                ))
            })
    }

    /// The networks of one family of a `Configuration`, its lists in the
    /// order of [`CONFIGURATION_LISTS`], each present.
    fn networks<N: Cidr>(&self, lists: [Option<N>; 6]) -> Result<Networks<N>, ObjectError> {
        let [
            local_pod,
            local_external,
            remote_pod,
            remote_external,
            seen_pod,
            seen_external,
        ] = lists.map(|net| net.expect("checked by the caller"));
        let ours = |real| Mapped { real, nat: None };
        let theirs = |network: &str, real: N, seen: N| {
            if seen.prefix() != real.prefix() {
                return Err(self.error(format!(
                    "field status.remote.cidr.{network}: {seen} does not have the length of \
                     spec.remote.cidr.{network} ({real})"
                )));
            }
            Ok(Mapped {
                real,
                nat: (seen != real).then_some(seen),
            })
        };
        Ok(Networks {
            local_pod: ours(local_pod),
            local_external: ours(local_external),
            remote_pod: theirs("pod", remote_pod, seen_pod)?,
            remote_external: theirs("external", remote_external, seen_external)?,
        })
    }

    /// The networks of the list at `path`: one IPv4 network, and at most
    /// one IPv6 network. Isthmus maps one network of each family and kind
    /// per peer, so a longer list is an error rather than a network
    /// silently left out.
    fn cidrs(&self, path: &[&str]) -> Result<Listed, ObjectError> {
        let field = path.join(".");
        let list = match self.get(path) {
            Some(Value::Sequence(list)) => list,
            Some(_) => return Err(self.error(format!("field {field}: not a list"))),
            None => return Err(self.missing(path)),
        };
        let mut ipv4 = None;
        let mut ipv6 = None;
        for item in list {
            let Some(text) = item.as_str() else {
                return Err(self.error(format!("field {field}: {item:?} is not a string")));
            };
            if text.is_empty() {
                return Err(self.error(format!(
                    "field {field}: empty; Liqo's IPAM has not remapped it yet"
                )));
            }
            let (slot, family) = match (Ipv4Net::parse_network(text), Ipv6Net::parse_network(text))
            {
                (Some(net), _) => (ipv4.replace(net).map(|_| ()), "IPv4"),
                (_, Some(net)) => (ipv6.replace(net).map(|_| ()), "IPv6"),
                _ => {
                    return Err(self.error(format!(
                        "field {field}: {text:?} is not an IPv4 or IPv6 CIDR"
                    )));
                }
            };
            if slot.is_some() {
                return Err(self.error(format!(
                    "field {field}: {} networks, two of them {family}; Isthmus maps one of each \
                     family",
                    list.len()
                )));
            }
        }
        let ipv4 = ipv4.ok_or_else(|| {
            self.error(format!(
                "field {field}: no IPv4 network; Isthmus needs one, and maps an IPv6 one beside it"
            ))
        })?;
        Ok(Listed { ipv4, ipv6 })
    }

    fn address(&self, path: &[&str]) -> Result<IpAddr, ObjectError> {
        let text = self.text(path)?;
        text.parse().map_err(|_| {
            self.error(format!(
                "field {}: {text:?} is not an IPv4 or IPv6 address",
                path.join(".")
            ))
        })
    }

    /// A port, Liqo's default where absent.
    fn port(&self, path: &[&str]) -> Result<u16, ObjectError> {
        self.number(path, DEFAULT_PORT, 1..=u16::MAX)
    }

    /// `spec.mtu`, Liqo's default where absent or zero (Go's omitempty).
    fn mtu(&self) -> Result<u16, ObjectError> {
        match self.number(&["spec", "mtu"], DEFAULT_MTU, 0..=u16::MAX)? {
            0 => Ok(DEFAULT_MTU),
            mtu if mtu < 576 => Err(self.error(format!(
                "field spec.mtu: {mtu} is below 576, the least an IPv4 path carries"
            ))),
            mtu => Ok(mtu),
        }
    }

    fn number(
        &self,
        path: &[&str],
        default: u16,
        range: std::ops::RangeInclusive<u16>,
    ) -> Result<u16, ObjectError> {
        let Some(value) = self.get(path) else {
            return Ok(default);
        };
        value
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| range.contains(n))
            .ok_or_else(|| {
                self.error(format!(
                    "field {}: {value:?} is not in {range:?}",
                    path.join(".")
                ))
            })
    }

    /// A client's `spec.endpoint`: the first address, over UDP.
    fn client_endpoint(&self) -> Result<Endpoint, ObjectError> {
        let protocol = ["spec", "endpoint", "protocol"];
        if let Some(value) = self.get(&protocol)
            && value.as_str() != Some("UDP")
        {
            return Err(self.error(format!(
                "field spec.endpoint.protocol: {value:?}; WireGuard runs over UDP"
            )));
        }
        let path = ["spec", "endpoint", "addresses"];
        let first = match self.get(&path) {
            Some(Value::Sequence(list)) => list.first(),
            Some(_) => return Err(self.error("field spec.endpoint.addresses: not a list".into())),
            None => None,
        };
        let text = first
            .and_then(Value::as_str)
            .ok_or_else(|| self.missing(&path))?;
        Endpoint::parse(text).ok_or_else(|| {
            self.error(format!(
                "field spec.endpoint.addresses[0]: {text:?} is neither an IP address nor a host name"
            ))
        })
    }
}

#[cfg(test)]
pub mod fixtures;
#[cfg(test)]
mod tests;
