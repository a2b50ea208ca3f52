//! Where and how to reach a peer's gateway: `endpointIP` (an address, or a
//! host name), the port and the WireGuard key.

use std::net::{IpAddr, SocketAddr};

/// Where and how to reach a peer's gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelParams {
    /// `endpointIP`.
    pub endpoint: Endpoint,
    /// `backend_config.port`.
    pub port: u16,
    /// `backend_config.publicKey`, decoded.
    pub public_key: [u8; 32],
    /// The tunnel's MTU, where the peer's objects give one (a Liqo v1
    /// gateway object's `spec.mtu`); else the gateway's own (`--mtu`).
    pub mtu: Option<u16>,
}

/// `endpointIP`: an address, or a DNS name that Liqo copied from a
/// LoadBalancer's status (an AWS ELB's, for instance); or none, for a peer
/// that makes contact itself.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    /// An IPv4 or IPv6 address.
    Addr(IpAddr),
    /// A host name, resolved by the gateway through the system resolver.
    Name(String),
    /// Where the peer makes contact from: we are its server (a Liqo v1
    /// `GatewayServer`), and nothing goes to it before it has.
    Learned,
}

impl Endpoint {
    /// The address, when the object gives one rather than a name.
    pub fn addr(&self) -> Option<IpAddr> {
        match self {
            Endpoint::Addr(ip) => Some(*ip),
            Endpoint::Name(_) | Endpoint::Learned => None,
        }
    }

    /// An address, or a host name; None for anything else.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Some(Endpoint::Addr(ip.to_canonical()));
        }
        is_host_name(text).then(|| Endpoint::Name(text.to_ascii_lowercase()))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Addr(ip) => ip.fmt(f),
            Endpoint::Name(name) => f.write_str(name),
            Endpoint::Learned => f.write_str("where the peer makes contact from"),
        }
    }
}

impl TunnelParams {
    /// The endpoint with its port, when it is an address.
    pub fn socket(&self) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.endpoint.addr()?, self.port))
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
