//! A validated peer: the networks of one TunnelEndpoint, checked field by
//! field, and the kernel rules they turn into.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use isthmus_common::{
    isolation::SEGREGATED,
    nat::{PeerNat, REMAPS_PEER},
    wire::Be128,
};
use serde_yaml_ng::Value;
use sha2::{Digest, Sha256};

use crate::model::{
    cidr::Cidr,
    isolation::{self, SecurityMode},
    object::{Layout, ObjectKey, ObjectKind, RawTunnelEndpoint},
};

mod endpoint;
mod error;
mod liqo_gateway;
mod networks;

pub use endpoint::{DEFAULT_TUNNEL_PORT, Endpoint, TunnelParams};
pub use error::{PeerError, Problem};
pub use liqo_gateway::{GatewayImplementation, GatewayRole, LiqoGateway};
use networks::{Fields, LayoutFields};
pub use networks::{Mapped, Networks};

/// The field of a TunnelEndpoint's spec that holds its IPv6 networks, by
/// the names of the IPv4 ones.
pub const IPV6_FIELD: &str = "ipv6";

/// The value Liqo writes for "not remapped".
pub const NONE: &str = "None";
/// Whose addresses this gateway rewrites for a peer
/// (docs/design.md#who-rewrites-what, docs/design.md#liqo-v1-peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remaps {
    /// Ours, into the peer's view of them: Liqo v0.10's way.
    Ours,
    /// The peer's, from our view of them to the real ones: Liqo v1's way.
    Theirs,
}

impl Remaps {
    /// The Liqo API whose peers are served this way.
    pub fn api(self) -> LiqoApi {
        match self {
            Remaps::Ours => LiqoApi::V0_10,
            Remaps::Theirs => LiqoApi::V1,
        }
    }
}

/// Which of Liqo's network APIs a cluster runs (docs/design.md#liqo-v1-peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LiqoApi {
    /// Liqo v0.9/v0.10: TunnelEndpoints and NatMappings; each side remaps
    /// its own addresses.
    #[value(name = "v0.10")]
    V0_10,
    /// Liqo v1: Configurations, PublicKeys, Isthmus's gateway objects and
    /// IPs; each side remaps its peer's addresses, and a gateway serves one
    /// peer.
    #[value(name = "v1")]
    V1,
}

impl LiqoApi {
    /// The value of `--liqo-api` that selects it.
    pub fn as_str(self) -> &'static str {
        match self {
            LiqoApi::V0_10 => "v0.10",
            LiqoApi::V1 => "v1",
        }
    }
}

/// One peer, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The TunnelEndpoint it came from.
    pub key: ObjectKey,
    /// File (or other origin) it was read from.
    pub origin: String,
    /// When the API server created the object, if it says.
    pub created: Option<String>,
    /// The peer's cluster ID, if the object carries one.
    pub cluster_id: Option<String>,
    /// The peer's cluster name (`clusterIdentity.clusterName`), if the
    /// object carries one.
    pub cluster_name: Option<String>,
    /// Where the fields were found.
    pub layout: Layout,
    /// Its IPv4 networks.
    pub ipv4: Networks,
    /// Its IPv6 networks, if it has them (docs/design.md#dual-stack).
    pub ipv6: Option<Networks<Ipv6Net>>,
    /// The peer gateway's WireGuard endpoint and key, or the first of their
    /// fields the object lacks.
    pub tunnel: Result<TunnelParams, &'static str>,
    /// The security mode its annotation asks for; None for the agent's.
    pub security_mode: Option<SecurityMode>,
    /// For a Liqo v1 peer, our gateway object towards it, whose
    /// `Connection` shows its state; a TunnelEndpoint shows its own.
    pub liqo_gateway: Option<LiqoGateway>,
}

impl Peer {
    /// Validates a TunnelEndpoint read from `origin`.
    pub fn from_raw(raw: &RawTunnelEndpoint, origin: &str) -> Result<Self, PeerError> {
        let reader = Reader { raw, origin };
        Ok(Self {
            key: raw.key.clone(),
            origin: origin.to_owned(),
            created: raw.created.clone(),
            cluster_id: identity(raw, "clusterID"),
            cluster_name: identity(raw, "clusterName"),
            layout: raw.layout(),
            ipv4: reader.networks()?,
            ipv6: reader.ipv6_networks()?,
            tunnel: reader.tunnel()?,
            security_mode: reader.security_mode()?,
            liqo_gateway: None,
        })
    }

    /// The IPv4 networks we see the peer under, with the field each comes
    /// from. The kernel finds the peer of a packet by these.
    pub fn views(&self) -> [(&'static str, Ipv4Net); 2] {
        self.ipv4.views(self.layout)
    }

    /// The networks we see the peer under in both families, with their
    /// fields: IPv4's, then IPv6's if it has them. No two peers' overlap.
    pub fn all_views(&self) -> Vec<(&'static str, IpNet)> {
        let ipv6 = self.ipv6.as_ref().map(|n| n.views(self.layout));
        in_both_families(self.views(), ipv6)
    }

    /// The networks in both families whose addresses the peer's packets
    /// carry inside the tunnel, with their fields.
    pub fn all_tunnel_networks(&self) -> Vec<(&'static str, IpNet)> {
        let ipv6 = self.ipv6.as_ref().map(|n| n.tunnel_networks(self.layout));
        in_both_families(self.tunnel_networks(), ipv6)
    }

    /// Our real networks in both families, with their fields.
    pub fn all_local_networks(&self) -> Vec<(&'static str, IpNet)> {
        let ipv6 = self.ipv6.as_ref().map(|n| n.local_networks(self.layout));
        in_both_families(self.local_networks(), ipv6)
    }

    /// Every network of the object in both families, with its field.
    pub fn all_networks(&self) -> Vec<(&'static str, IpNet)> {
        let ipv6 = self.ipv6.as_ref().map(|n| n.all(self.layout));
        in_both_families(self.networks(), ipv6)
    }

    /// The IPv4 networks whose addresses the peer's packets carry inside
    /// the tunnel, with their fields.
    pub fn tunnel_networks(&self) -> [(&'static str, Ipv4Net); 2] {
        self.ipv4.tunnel_networks(self.layout)
    }

    /// Our IPv4 ExternalCIDR as the peer sees it, with its field: where the
    /// peer reaches what our NatMapping for it exposes.
    pub fn local_external_view(&self) -> (&'static str, Ipv4Net) {
        self.local_views()[1]
    }

    /// Our IPv4 networks as the peer sees them, each with its field.
    pub fn local_views(&self) -> [(&'static str, Ipv4Net); 2] {
        self.ipv4.local_views(self.layout)
    }

    /// Our real IPv4 networks, each with its field: where the ingress rules
    /// lead the peer's packets.
    pub fn local_networks(&self) -> [(&'static str, Ipv4Net); 2] {
        self.ipv4.local_networks(self.layout)
    }

    /// Every IPv4 network of the object, each with its field: the real ones
    /// and those remapped.
    pub fn networks(&self) -> Vec<(&'static str, Ipv4Net)> {
        self.ipv4.all(self.layout)
    }

    /// The kernel rules for this peer.
    pub fn nat(&self, peer_id: u32, default_mode: SecurityMode) -> PeerNat {
        self.rules(&self.ipv4, peer_id, default_mode)
    }

    /// The kernel rules for this peer's IPv6 networks, if it has them.
    pub fn nat6(&self, peer_id: u32, default_mode: SecurityMode) -> Option<PeerNat<Be128>> {
        let ipv6 = self.ipv6.as_ref()?;
        Some(self.rules(ipv6, peer_id, default_mode))
    }

    /// The kernel rules for `networks`, of one family of this peer.
    fn rules<N: Cidr>(
        &self,
        networks: &Networks<N>,
        peer_id: u32,
        default_mode: SecurityMode,
    ) -> PeerNat<N::Wire> {
        let segregated = if self.segregated(default_mode) {
            SEGREGATED
        } else {
            0
        };
        let (remaps, theirs) = match self.remaps() {
            Remaps::Ours => (0, Default::default()),
            Remaps::Theirs => (
                REMAPS_PEER,
                [
                    networks.remote_pod.inbound(),
                    networks.remote_external.inbound(),
                ],
            ),
        };
        PeerNat {
            peer_id,
            flags: segregated | remaps,
            egress: [
                networks.local_pod.outbound(),
                networks.local_external.outbound(),
            ],
            ingress: [
                networks.local_pod.inbound(),
                networks.local_external.inbound(),
            ],
            theirs,
            owner: self.owner(),
        }
    }

    /// A fingerprint of the object this peer came from, its origin and
    /// name, the same in every agent version: SHA-256's first 8 bytes.
    pub fn owner(&self) -> u64 {
        let digest = Sha256::new()
            .chain_update(&self.origin)
            .chain_update([0])
            .chain_update(&self.key.namespace)
            .chain_update([0])
            .chain_update(&self.key.name)
            .finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }

    /// Whether the kernel holds the peer to the allowed table: its
    /// annotation says so, or the agent's `default_mode` where it says
    /// nothing.
    pub fn segregated(&self, default_mode: SecurityMode) -> bool {
        self.security_mode.unwrap_or(default_mode).segregates()
    }

    /// Whose addresses we rewrite: the objects' Liqo version says.
    pub fn remaps(&self) -> Remaps {
        self.layout.remaps()
    }

    /// `problem` of this peer, naming the object it came from.
    pub fn error(&self, problem: Problem) -> PeerError {
        let kind = match self.layout {
            Layout::Spec | Layout::Legacy => ObjectKind::TunnelEndpoint,
            Layout::LiqoV1 => ObjectKind::Configuration,
        };
        PeerError {
            kind,
            ..PeerError::new(&self.origin, &self.key, problem)
        }
    }

    /// A label for logs and metrics: the cluster ID, else the object name.
    pub fn label(&self) -> &str {
        self.cluster_id.as_deref().unwrap_or(&self.key.name)
    }

    /// The cluster's name for metrics: its `clusterName`, else the object
    /// name.
    pub fn name(&self) -> &str {
        self.cluster_name.as_deref().unwrap_or(&self.key.name)
    }
}

/// `ipv4`'s networks, then `ipv6`'s, each with its field.
fn in_both_families(
    ipv4: impl IntoIterator<Item = (&'static str, Ipv4Net)>,
    ipv6: Option<impl IntoIterator<Item = (&'static str, Ipv6Net)>>,
) -> Vec<(&'static str, IpNet)> {
    let ipv4 = ipv4.into_iter().map(|(field, net)| (field, IpNet::V4(net)));
    let ipv6 = ipv6.into_iter().flatten();
    ipv4.chain(ipv6.map(|(field, net)| (field, IpNet::V6(net))))
        .collect()
}

impl Layout {
    /// Whose addresses a gateway rewrites for a peer whose objects are
    /// written this way.
    pub fn remaps(self) -> Remaps {
        match self {
            Layout::Spec | Layout::Legacy => Remaps::Ours,
            Layout::LiqoV1 => Remaps::Theirs,
        }
    }
}

/// A field of the peer's identity: in the spec before Liqo v0.6, in
/// `clusterIdentity` since.
fn identity(raw: &RawTunnelEndpoint, field: &str) -> Option<String> {
    raw.field(field)
        .or_else(|| raw.field("clusterIdentity").and_then(|i| i.get(field)))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Where the security mode is asked for.
const MODE_FIELD: &str = "metadata.annotations[isthmus.io/security-mode]";

/// A field's value as the object's author wrote it.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

struct Reader<'a> {
    raw: &'a RawTunnelEndpoint,
    origin: &'a str,
}

impl Reader<'_> {
    fn networks<N: Cidr>(&self) -> Result<Networks<N>, PeerError> {
        let [local_pod, local_external, remote_pod, remote_external] =
            LayoutFields::of::<N>(self.raw.layout()).0;
        Ok(Networks {
            local_pod: self.mapped(local_pod)?,
            local_external: self.mapped(local_external)?,
            remote_pod: self.mapped(remote_pod)?,
            remote_external: self.mapped(remote_external)?,
        })
    }

    /// The networks of `spec.ipv6`, if the object has them.
    fn ipv6_networks(&self) -> Result<Option<Networks<Ipv6Net>>, PeerError> {
        match self.raw.field(IPV6_FIELD) {
            None => Ok(None),
            Some(Value::Mapping(_)) => self.networks().map(Some),
            Some(other) => Err(self.error(Problem::BadValue {
                field: IPV6_FIELD,
                value: text(other),
                what: "a map of the IPv6 networks",
            })),
        }
    }

    fn mapped<N: Cidr>(&self, fields: &Fields) -> Result<Mapped<N>, PeerError> {
        let (real_field, real) = self.cidr::<N>(fields.real, false)?;
        let real = real.ok_or_else(|| self.error(Problem::Missing { field: real_field }))?;
        let (nat_field, nat) = self.cidr::<N>(fields.nat, true)?;
        if let Some(nat) = nat
            && nat.prefix() != real.prefix()
        {
            return Err(self.error(Problem::MaskMismatch {
                field: nat_field,
                nat_len: nat.prefix(),
                real_field,
                real_len: real.prefix(),
            }));
        }
        Ok(Mapped { real, nat })
    }

    /// The network in `field`, with the name it goes by in the object's
    /// layout; `None` if absent, or "None" where allowed.
    fn cidr<N: Cidr>(
        &self,
        field: &'static str,
        none_allowed: bool,
    ) -> Result<(&'static str, Option<N>), PeerError> {
        let (field, value) = self.raw.network(field);
        let Some(value) = value else {
            return Ok((field, None));
        };
        let written = value.as_str().unwrap_or_default();
        if none_allowed && written == NONE {
            return Ok((field, None));
        }
        N::parse_network(written)
            .map(|net| (field, Some(net)))
            .ok_or_else(|| {
                self.error(Problem::BadCidr {
                    field,
                    value: text(value),
                    family: N::FAMILY,
                    none: if none_allowed { " or \"None\"" } else { "" },
                })
            })
    }

    /// `endpointIP` and `backend_config`: absent fields leave no tunnel,
    /// malformed ones are errors.
    /// The mode of the security-mode annotation, if it has one.
    fn security_mode(&self) -> Result<Option<SecurityMode>, PeerError> {
        let Some(value) = self.raw.annotations.get(isolation::ANNOTATION) else {
            return Ok(None);
        };
        let mode = value.as_str().and_then(|s| s.parse().ok());
        mode.map(Some).ok_or_else(|| {
            self.error(Problem::BadValue {
                field: MODE_FIELD,
                value: text(value),
                what: "FullPodToPod or IntraClusterTrafficSegregation",
            })
        })
    }

    fn tunnel(&self) -> Result<Result<TunnelParams, &'static str>, PeerError> {
        let bad = |field: &'static str, value: &Value, what: &'static str| {
            self.error(Problem::BadValue {
                field,
                value: text(value),
                what,
            })
        };
        let backend = self.raw.field("backend_config");
        let endpoint = match self.raw.field("endpointIP") {
            None => None,
            Some(v) => Some(
                Endpoint::parse(&text(v))
                    .ok_or_else(|| bad("endpointIP", v, "an IPv4 address or a DNS name"))?,
            ),
        };
        let port = match backend.and_then(|b| b.get("port")) {
            None => DEFAULT_TUNNEL_PORT,
            Some(v) => text(v)
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("backend_config.port", v, "a UDP port"))?,
        };
        let public_key = match backend.and_then(|b| b.get("publicKey")) {
            None => None,
            Some(v) => Some(crate::model::key_text::decode(&text(v)).ok_or_else(|| {
                bad(
                    "backend_config.publicKey",
                    v,
                    "a base64 32-byte WireGuard key",
                )
            })?),
        };
        Ok(match (endpoint, public_key) {
            (None, _) => Err("endpointIP"),
            (_, None) => Err("backend_config.publicKey"),
            (Some(endpoint), Some(public_key)) => Ok(TunnelParams {
                endpoint,
                port,
                public_key,
                mtu: None,
            }),
        })
    }

    fn error(&self, problem: Problem) -> PeerError {
        PeerError::new(self.origin, &self.raw.key, problem)
    }
}

#[cfg(test)]
mod tests;
