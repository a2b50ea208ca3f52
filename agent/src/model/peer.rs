//! A validated peer: the networks of one TunnelEndpoint, checked field by
//! field, and the kernel rules they turn into.

use std::net::{Ipv4Addr, SocketAddrV4};

use ipnet::Ipv4Net;
use isthmus_common::nat::{PeerNat, PrefixRewrite};
use serde_yaml_ng::Value;
use thiserror::Error;

use crate::model::object::{Layout, ObjectKey, RawTunnelEndpoint};

/// The value Liqo writes for "not remapped".
pub const NONE: &str = "None";

/// A TunnelEndpoint that cannot be used, naming the file, object and field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{file}: TunnelEndpoint {object}: {problem}")]
pub struct PeerError {
    /// File holding the object.
    pub file: String,
    /// The object.
    pub object: ObjectKey,
    /// What is wrong with it.
    pub problem: Box<Problem>,
}

impl PeerError {
    /// `problem` with the object found in `file`.
    pub fn new(file: &str, object: &ObjectKey, problem: Problem) -> Self {
        Self {
            file: file.to_owned(),
            object: object.clone(),
            problem: Box::new(problem),
        }
    }
}

/// What makes a TunnelEndpoint unusable, by field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A required network is absent.
    #[error("field {field} is missing")]
    Missing {
        /// The field, by its Liqo name.
        field: &'static str,
    },
    /// A network that does not parse.
    #[error("field {field}: {value:?} is not an IPv4 CIDR{none}")]
    BadCidr {
        /// The field, by its Liqo name.
        field: &'static str,
        /// What it holds.
        value: String,
        /// `or "None"` where "None" is allowed.
        none: &'static str,
    },
    /// A remapped network whose mask differs from the real one.
    #[error("field {field}: mask /{nat_len} differs from {real_field} /{real_len}")]
    MaskMismatch {
        /// The remapped field.
        field: &'static str,
        /// Its prefix length.
        nat_len: u8,
        /// The field it remaps.
        real_field: &'static str,
        /// That field's prefix length.
        real_len: u8,
    },
    /// Two peers are seen under overlapping networks, so a packet could not
    /// tell them apart.
    #[error(
        "field {field} ({net}) overlaps field {other_field} ({other_net}) of TunnelEndpoint {other} in {other_file}"
    )]
    Overlap {
        /// The overlapping field.
        field: &'static str,
        /// That field's network.
        net: Ipv4Net,
        /// The object kept.
        other: ObjectKey,
        /// File holding the object kept.
        other_file: String,
        /// Its overlapping field.
        other_field: &'static str,
        /// That field's network.
        other_net: Ipv4Net,
    },
    /// A scalar field that does not parse.
    #[error("field {field}: {value:?} is not {what}")]
    BadValue {
        /// The field, by its Liqo name.
        field: &'static str,
        /// What it holds.
        value: String,
        /// What it should be.
        what: &'static str,
    },
    /// A gateway needs the peer's WireGuard endpoint and key.
    #[error("field {field} is missing: no tunnel to this peer")]
    NoTunnel {
        /// The first missing field.
        field: &'static str,
    },
    /// Two documents share a namespace and name.
    #[error("also defined in {other_file}; field metadata.name must be unique")]
    Duplicate {
        /// File holding the one kept.
        other_file: String,
    },
    /// A namespace where no peer is accepted.
    #[error(
        "field metadata.namespace: {namespace:?} is not one where TunnelEndpoints are accepted ({allowed}; see --tunnelendpoint-namespaces)"
    )]
    Namespace {
        /// The object's namespace.
        namespace: String,
        /// The namespaces allowed.
        allowed: String,
    },
    /// A network shorter than the policy allows.
    #[error("field {field}: {net} is wider than /{min} (--min-view-prefix)")]
    TooWide {
        /// The field.
        field: &'static str,
        /// Its network.
        net: Ipv4Net,
        /// The shortest prefix allowed.
        min: u8,
    },
    /// A network that touches one no peer may use.
    #[error("field {field}: {net} touches {what}; no peer may use it")]
    Forbidden {
        /// The field.
        field: &'static str,
        /// Its network.
        net: Ipv4Net,
        /// What it touches.
        what: String,
    },
    /// A view that holds a peer's WireGuard endpoint, or an endpoint in
    /// another peer's view: the tunnel's own traffic would enter a tunnel.
    #[error(
        "field {field} ({net}) holds endpointIP {endpoint} of TunnelEndpoint {other} in {other_file}: its WireGuard traffic would be routed into a tunnel"
    )]
    EndpointInView {
        /// The field holding the endpoint.
        field: &'static str,
        /// Its network.
        net: Ipv4Net,
        /// The endpoint.
        endpoint: Ipv4Addr,
        /// The TunnelEndpoint of that endpoint, or of that view.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
    },
    /// An endpoint inside another peer's view.
    #[error(
        "field endpointIP ({endpoint}) lies in field {other_field} ({other_net}) of TunnelEndpoint {other} in {other_file}: its WireGuard traffic would be routed into a tunnel"
    )]
    EndpointUnderView {
        /// The endpoint.
        endpoint: Ipv4Addr,
        /// The TunnelEndpoint whose view holds it.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
        /// Its field.
        other_field: &'static str,
        /// That field's network.
        other_net: Ipv4Net,
    },
    /// A second TunnelEndpoint with a public key already taken.
    #[error(
        "field backend_config.publicKey: the same key as TunnelEndpoint {other} in {other_file}"
    )]
    DuplicateKey {
        /// The TunnelEndpoint kept.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
    },
    /// A second TunnelEndpoint for a cluster that has one.
    #[error(
        "field clusterID: cluster {cluster_id} already has TunnelEndpoint {other} in {other_file}"
    )]
    DuplicateCluster {
        /// The cluster.
        cluster_id: String,
        /// The TunnelEndpoint kept.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
    },
}

/// A real network and, when the other side remapped it, its remapped form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// The real network.
    pub real: Ipv4Net,
    /// The network it is remapped to, if any.
    pub nat: Option<Ipv4Net>,
}

impl Mapped {
    /// The network as it appears after remapping.
    pub fn seen(&self) -> Ipv4Net {
        self.nat.unwrap_or(self.real)
    }

    /// The real address behind `addr`, an address of the remapped network.
    pub fn real_of(&self, addr: Ipv4Addr) -> Option<Ipv4Addr> {
        let wire = isthmus_common::nat::wire(addr.octets());
        self.seen()
            .contains(&addr)
            .then(|| Ipv4Addr::from(self.inbound().apply(wire).to_ne_bytes()))
    }

    /// The address of the remapped network behind `addr`, a real one.
    pub fn seen_of(&self, addr: Ipv4Addr) -> Option<Ipv4Addr> {
        let wire = isthmus_common::nat::wire(addr.octets());
        self.real
            .contains(&addr)
            .then(|| Ipv4Addr::from(self.outbound().apply(wire).to_ne_bytes()))
    }

    /// Real → remapped, or the identity when not remapped: the kernel
    /// still needs the real network, to tell our addresses from others'.
    fn outbound(&self) -> PrefixRewrite {
        rewrite(self.real, self.seen())
    }

    /// Remapped → real, or the identity when not remapped.
    fn inbound(&self) -> PrefixRewrite {
        rewrite(self.seen(), self.real)
    }
}

fn rewrite(from: Ipv4Net, to: Ipv4Net) -> PrefixRewrite {
    PrefixRewrite::new(
        from.network().octets(),
        to.network().octets(),
        from.prefix_len(),
    )
}

/// The Liqo field names of one network pair.
struct Fields {
    real: &'static str,
    nat: &'static str,
}

const LOCAL_POD: Fields = Fields {
    real: "localPodCIDR",
    nat: "localNATPodCIDR",
};
const LOCAL_EXTERNAL: Fields = Fields {
    real: "localExternalCIDR",
    nat: "localNATExternalCIDR",
};
const REMOTE_POD: Fields = Fields {
    real: "remotePodCIDR",
    nat: "remoteNATPodCIDR",
};
const REMOTE_EXTERNAL: Fields = Fields {
    real: "remoteExternalCIDR",
    nat: "remoteNATExternalCIDR",
};

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
    /// Our PodCIDR, and how the peer sees it.
    pub local_pod: Mapped,
    /// Our ExternalCIDR, and how the peer sees it.
    pub local_external: Mapped,
    /// The peer's PodCIDR, and how we see it.
    pub remote_pod: Mapped,
    /// The peer's ExternalCIDR, and how we see it.
    pub remote_external: Mapped,
    /// The peer gateway's WireGuard endpoint and key, or the first of their
    /// fields the object lacks.
    pub tunnel: Result<TunnelParams, &'static str>,
}

/// Where and how to reach a peer's gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelParams {
    /// `endpointIP`.
    pub endpoint: Endpoint,
    /// `backend_config.port`.
    pub port: u16,
    /// `backend_config.publicKey`, decoded.
    pub public_key: [u8; 32],
}

/// `endpointIP`: an address, or a DNS name that Liqo copied from a
/// LoadBalancer's status (an AWS ELB's, for instance).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    /// An IPv4 address.
    Addr(Ipv4Addr),
    /// A host name, resolved by the gateway through the system resolver.
    Name(String),
}

impl Endpoint {
    /// The address, when the object gives one rather than a name.
    pub fn addr(&self) -> Option<Ipv4Addr> {
        match self {
            Endpoint::Addr(ip) => Some(*ip),
            Endpoint::Name(_) => None,
        }
    }

    fn parse(text: &str) -> Option<Self> {
        if let Ok(ip) = text.parse::<Ipv4Addr>() {
            return Some(Endpoint::Addr(ip));
        }
        is_host_name(text).then(|| Endpoint::Name(text.to_ascii_lowercase()))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Addr(ip) => ip.fmt(f),
            Endpoint::Name(name) => f.write_str(name),
        }
    }
}

impl TunnelParams {
    /// The endpoint with its port, when it is an address.
    pub fn socket(&self) -> Option<SocketAddrV4> {
        Some(SocketAddrV4::new(self.endpoint.addr()?, self.port))
    }
}

/// An RFC 1123 host name with at least one letter in its last label, so
/// that a mistyped address (`203.0.113.300`) is not taken for a name.
fn is_host_name(text: &str) -> bool {
    let name = text.strip_suffix('.').unwrap_or(text);
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    (1..=253).contains(&name.len())
        && name.split('.').all(label_ok)
        && name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().any(|b| b.is_ascii_alphabetic()))
}

/// WireGuard port when `backend_config.port` is absent (Liqo's default).
pub const DEFAULT_TUNNEL_PORT: u16 = 5871;

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
            local_pod: reader.mapped(&LOCAL_POD)?,
            local_external: reader.mapped(&LOCAL_EXTERNAL)?,
            remote_pod: reader.mapped(&REMOTE_POD)?,
            remote_external: reader.mapped(&REMOTE_EXTERNAL)?,
            tunnel: reader.tunnel()?,
        })
    }

    /// The networks we see the peer under, with the field each comes from.
    /// The kernel finds the peer of a packet by these.
    pub fn views(&self) -> [(&'static str, Ipv4Net); 2] {
        [
            (
                seen_field(&self.remote_pod, &REMOTE_POD),
                self.remote_pod.seen(),
            ),
            (
                seen_field(&self.remote_external, &REMOTE_EXTERNAL),
                self.remote_external.seen(),
            ),
        ]
    }

    /// Our ExternalCIDR as the peer sees it, with its field: where the
    /// peer reaches what our NatMapping for it exposes.
    pub fn local_external_view(&self) -> (&'static str, Ipv4Net) {
        self.local_views()[1]
    }

    /// Our networks as the peer sees them, each with its field.
    pub fn local_views(&self) -> [(&'static str, Ipv4Net); 2] {
        [
            (
                seen_field(&self.local_pod, &LOCAL_POD),
                self.local_pod.seen(),
            ),
            (
                seen_field(&self.local_external, &LOCAL_EXTERNAL),
                self.local_external.seen(),
            ),
        ]
    }

    /// Every network of the object, each with its field: the real ones and
    /// those remapped.
    pub fn networks(&self) -> Vec<(&'static str, Ipv4Net)> {
        [
            (&self.local_pod, &LOCAL_POD),
            (&self.local_external, &LOCAL_EXTERNAL),
            (&self.remote_pod, &REMOTE_POD),
            (&self.remote_external, &REMOTE_EXTERNAL),
        ]
        .into_iter()
        .flat_map(|(mapped, fields)| {
            [(fields.real, Some(mapped.real)), (fields.nat, mapped.nat)]
                .into_iter()
                .filter_map(|(field, net)| Some((field, net?)))
        })
        .collect()
    }

    /// The kernel rules for this peer.
    pub fn nat(&self, peer_id: u32) -> PeerNat {
        PeerNat {
            peer_id,
            egress: [self.local_pod.outbound(), self.local_external.outbound()],
            ingress: [self.local_pod.inbound(), self.local_external.inbound()],
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

fn seen_field(mapped: &Mapped, fields: &Fields) -> &'static str {
    if mapped.nat.is_some() {
        fields.nat
    } else {
        fields.real
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

struct Reader<'a> {
    raw: &'a RawTunnelEndpoint,
    origin: &'a str,
}

impl Reader<'_> {
    fn mapped(&self, fields: &Fields) -> Result<Mapped, PeerError> {
        let (real_field, real) = self.cidr(fields.real, false)?;
        let real = real.ok_or_else(|| self.error(Problem::Missing { field: real_field }))?;
        let (nat_field, nat) = self.cidr(fields.nat, true)?;
        if let Some(nat) = nat
            && nat.prefix_len() != real.prefix_len()
        {
            return Err(self.error(Problem::MaskMismatch {
                field: nat_field,
                nat_len: nat.prefix_len(),
                real_field,
                real_len: real.prefix_len(),
            }));
        }
        Ok(Mapped { real, nat })
    }

    /// The network in `field`, with the name it goes by in the object's
    /// layout; `None` if absent, or "None" where allowed.
    fn cidr(
        &self,
        field: &'static str,
        none_allowed: bool,
    ) -> Result<(&'static str, Option<Ipv4Net>), PeerError> {
        let (field, value) = self.raw.network(field);
        let Some(value) = value else {
            return Ok((field, None));
        };
        let text = value.as_str().unwrap_or_default();
        if none_allowed && text == NONE {
            return Ok((field, None));
        }
        text.parse::<Ipv4Net>()
            .map(|net| (field, Some(net.trunc())))
            .map_err(|_| {
                self.error(Problem::BadCidr {
                    field,
                    value: match value {
                        Value::String(s) => s.clone(),
                        other => serde_yaml_ng::to_string(other)
                            .unwrap_or_default()
                            .trim()
                            .to_owned(),
                    },
                    none: if none_allowed { " or \"None\"" } else { "" },
                })
            })
    }

    /// `endpointIP` and `backend_config`: absent fields leave no tunnel,
    /// malformed ones are errors.
    fn tunnel(&self) -> Result<Result<TunnelParams, &'static str>, PeerError> {
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => serde_yaml_ng::to_string(other)
                .unwrap_or_default()
                .trim()
                .to_owned(),
        };
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
            Some(v) => Some(crate::model::key::decode(&text(v)).ok_or_else(|| {
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
            }),
        })
    }

    fn error(&self, problem: Problem) -> PeerError {
        PeerError::new(self.origin, &self.raw.key, problem)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::object::{Object, parse_documents};

    pub(crate) fn peer_yaml(name: &str, fields: &str) -> String {
        format!(
            "apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata: {{name: {name}, namespace: liqo}}\nspec:\n{fields}"
        )
    }

    const A_TO_B: &str = "  clusterID: cluster-b\n  localPodCIDR: 10.244.0.0/24\n  localNATPodCIDR: 10.0.40.0/24\n  localExternalCIDR: 192.168.0.0/24\n  localNATExternalCIDR: 10.0.41.0/24\n  remotePodCIDR: 10.244.0.0/24\n  remoteNATPodCIDR: 10.0.0.0/24\n  remoteExternalCIDR: 192.168.0.0/24\n  remoteNATExternalCIDR: 10.0.1.0/24\n";

    fn parse(yaml: &str) -> Result<Peer, PeerError> {
        let docs = parse_documents(Path::new("f.yaml"), yaml);
        let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
            panic!("{docs:?}")
        };
        Peer::from_raw(raw, "f.yaml")
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn double_nat_rules_for_cluster_a() {
        let peer = parse(&peer_yaml("b", A_TO_B)).unwrap();
        assert_eq!(peer.cluster_id.as_deref(), Some("cluster-b"));
        assert_eq!(peer.layout, Layout::Spec);
        assert_eq!(
            peer.views(),
            [
                ("remoteNATPodCIDR", net("10.0.0.0/24")),
                ("remoteNATExternalCIDR", net("10.0.1.0/24"))
            ]
        );
        let nat = peer.nat(7);
        assert_eq!(nat.peer_id, 7);
        assert_eq!(
            nat.egress[0],
            PrefixRewrite::new([10, 244, 0, 0], [10, 0, 40, 0], 24)
        );
        assert_eq!(
            nat.egress[1],
            PrefixRewrite::new([192, 168, 0, 0], [10, 0, 41, 0], 24)
        );
        assert_eq!(
            nat.ingress[0],
            PrefixRewrite::new([10, 0, 40, 0], [10, 244, 0, 0], 24)
        );
        assert_eq!(
            nat.ingress[1],
            PrefixRewrite::new([10, 0, 41, 0], [192, 168, 0, 0], 24)
        );
    }

    #[test]
    fn an_address_of_a_remapped_network_has_a_real_one_with_the_same_host_bits() {
        let peer = parse(&peer_yaml("b", A_TO_B)).unwrap();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            peer.local_external.real_of(ip("10.0.41.45")),
            Some(ip("192.168.0.45"))
        );
        assert_eq!(peer.local_external.real_of(ip("192.168.0.45")), None);
    }

    #[test]
    fn none_means_not_remapped() {
        let fields = "  localPodCIDR: 10.244.0.0/24\n  localNATPodCIDR: None\n  localExternalCIDR: 192.168.0.0/24\n  remotePodCIDR: 10.1.0.0/24\n  remoteNATPodCIDR: None\n  remoteExternalCIDR: 192.168.2.0/24\n  remoteNATExternalCIDR: None\n";
        let peer = parse(&peer_yaml("c", fields)).unwrap();
        assert_eq!(peer.views()[0], ("remotePodCIDR", net("10.1.0.0/24")));
        let nat = peer.nat(1);
        let identity = [
            PrefixRewrite::new([10, 244, 0, 0], [10, 244, 0, 0], 24),
            PrefixRewrite::new([192, 168, 0, 0], [192, 168, 0, 0], 24),
        ];
        assert_eq!(nat.egress, identity);
        assert_eq!(nat.ingress, identity);
    }

    /// Liqo v0.2.1–v0.3.0: the peer's real networks in spec, under
    /// other names; everything else in status.
    const A_TO_B_V030: &str = "  clusterID: cluster-b\n  podCIDR: 10.244.0.0/24\n  externalCIDR: 192.168.0.0/24\n  endpointIP: 203.0.113.2\n  backendType: wireguard\n  backend_config: {port: \"5871\", publicKey: \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}\nstatus:\n  phase: Ready\n  localPodCIDR: 10.244.0.0/24\n  localNATPodCIDR: 10.0.40.0/24\n  remoteNATPodCIDR: 10.0.0.0/24\n  localExternalCIDR: 192.168.0.0/24\n  localNATExternalCIDR: 10.0.41.0/24\n  remoteNATExternalCIDR: 10.0.1.0/24\n  connection: {status: connected}\n";

    #[test]
    fn the_v0_3_0_layout_reads_as_the_same_peer_and_is_reported() {
        let old = parse(&peer_yaml("b", A_TO_B_V030)).unwrap();
        let new = parse(&peer_yaml("b", &format!("{A_TO_B}  endpointIP: 203.0.113.2\n  backend_config: {{port: \"5871\", publicKey: \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}}\n"))).unwrap();
        assert_eq!(old.layout, Layout::Legacy);
        assert_eq!(new.layout, Layout::Spec);
        assert_eq!(old.nat(1), new.nat(1));
        assert_eq!(old.views(), new.views());
        assert_eq!(old.tunnel, new.tunnel);
        let broken = A_TO_B_V030.replace(
            "localNATPodCIDR: 10.0.40.0/24",
            "localNATPodCIDR: 10.0.40.0/23",
        );
        assert_eq!(
            parse(&peer_yaml("b", &broken)).unwrap_err().to_string(),
            "f.yaml: TunnelEndpoint liqo/b: field status.localNATPodCIDR: mask /23 differs from status.localPodCIDR /24"
        );
        let no_pod = A_TO_B_V030.replace("  localPodCIDR: 10.244.0.0/24\n", "");
        assert_eq!(
            parse(&peer_yaml("b", &no_pod)).unwrap_err().to_string(),
            "f.yaml: TunnelEndpoint liqo/b: field status.localPodCIDR is missing"
        );
    }

    #[test]
    fn networks_only_in_status_are_not_a_layout_liqo_wrote() {
        let yaml = peer_yaml("b", "  {}\n").replace("spec:\n  {}\n", &format!("status:\n{A_TO_B}"));
        assert_eq!(
            parse(&yaml).unwrap_err().to_string(),
            "f.yaml: TunnelEndpoint liqo/b: field localPodCIDR is missing"
        );
    }

    #[test]
    fn bad_cidr_names_file_object_and_field() {
        let yaml = peer_yaml(
            "b",
            &A_TO_B.replace(
                "remoteNATPodCIDR: 10.0.0.0/24",
                "remoteNATPodCIDR: 10.0.0.0/33",
            ),
        );
        let err = parse(&yaml).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.yaml: TunnelEndpoint liqo/b: field remoteNATPodCIDR: \"10.0.0.0/33\" is not an IPv4 CIDR or \"None\""
        );
    }

    #[test]
    fn mask_mismatch_names_both_fields() {
        let yaml = peer_yaml(
            "b",
            &A_TO_B.replace(
                "localNATPodCIDR: 10.0.40.0/24",
                "localNATPodCIDR: 10.0.40.0/23",
            ),
        );
        let err = parse(&yaml).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.yaml: TunnelEndpoint liqo/b: field localNATPodCIDR: mask /23 differs from localPodCIDR /24"
        );
    }

    #[test]
    fn tunnel_params_are_read_and_checked() {
        let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let with =
            |extra: &str| peer_yaml("b", &format!("{A_TO_B}  endpointIP: 203.0.113.2\n{extra}"));
        let peer = parse(&with(&format!(
            "  backend_config: {{port: \"5871\", publicKey: \"{key}\"}}\n"
        )))
        .unwrap();
        let tunnel = peer.tunnel.unwrap();
        assert_eq!(tunnel.socket(), Some("203.0.113.2:5871".parse().unwrap()));
        assert_eq!(tunnel.public_key[31], 31);
        // No key: the peer is valid for NAT, with no tunnel.
        assert_eq!(
            parse(&with("  backend_config: {port: \"5871\"}\n"))
                .unwrap()
                .tunnel,
            Err("backend_config.publicKey")
        );
        let err = parse(&with("  backend_config: {port: \"70000\"}\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "f.yaml: TunnelEndpoint liqo/b: field backend_config.port: \"70000\" is not a UDP port"
        );
        let err = parse(&with("  backend_config: {publicKey: short}\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "f.yaml: TunnelEndpoint liqo/b: field backend_config.publicKey: \"short\" is not a base64 32-byte WireGuard key"
        );
        for bad in [
            "203.0.113.300",
            "gw_1.example",
            "-gw.example",
            "10.0.0.1/24",
            "\"\"",
        ] {
            let err = parse(&peer_yaml("b", &format!("{A_TO_B}  endpointIP: {bad}\n")))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("field endpointIP:")
                    && err.ends_with("is not an IPv4 address or a DNS name"),
                "{bad}: {err}"
            );
        }
        // A LoadBalancer's host name, as Liqo copies it.
        let elb = "a1b2c3-1234567890.eu-west-1.ELB.amazonaws.com";
        let peer = parse(&peer_yaml(
            "b",
            &format!("{A_TO_B}  endpointIP: {elb}\n  backend_config: {{port: \"32100\", publicKey: \"{key}\"}}\n"),
        ))
        .unwrap();
        let tunnel = peer.tunnel.unwrap();
        assert_eq!(tunnel.endpoint, Endpoint::Name(elb.to_ascii_lowercase()));
        assert_eq!((tunnel.port, tunnel.socket()), (32100, None));
    }

    #[test]
    fn missing_network_is_named() {
        let yaml = peer_yaml("b", &A_TO_B.replace("  remotePodCIDR: 10.244.0.0/24\n", ""));
        let err = parse(&yaml).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.yaml: TunnelEndpoint liqo/b: field remotePodCIDR is missing"
        );
    }
}
