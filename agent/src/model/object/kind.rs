//! The kinds of object the agent reads, and their API versions.

use std::fmt;

/// The API group and version of Liqo's objects the agent reads.
pub const API_VERSION: &str = "net.liqo.io/v1alpha1";
/// The API version of Kubernetes core objects.
pub const CORE_API_VERSION: &str = "v1";
/// The API version of EndpointSlices.
pub const DISCOVERY_API_VERSION: &str = "discovery.k8s.io/v1";
/// The API version of Liqo's NamespaceOffloadings.
pub const OFFLOADING_API_VERSION: &str = "offloading.liqo.io/v1alpha1";
/// The API version of Leases.
pub const COORDINATION_API_VERSION: &str = "coordination.k8s.io/v1";
/// The API version of Liqo v1's networking objects.
pub const LIQO_V1_NETWORKING_API_VERSION: &str = "networking.liqo.io/v1beta1";
/// The API version of Liqo v1's IPAM objects.
pub const LIQO_V1_IPAM_API_VERSION: &str = "ipam.liqo.io/v1alpha1";

/// A kind of object the agent reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// Liqo's per-peer object.
    TunnelEndpoint,
    /// Liqo's per-cluster DNAT table.
    NatMapping,
    /// A cluster node, read for the overlay: its PodCIDRs, its address and
    /// whether it is the gateway.
    Node,
    /// A pod, read for isolation: whether it was offloaded from a peer,
    /// and its addresses.
    Pod,
    /// Endpoints of a Service, read for isolation: what a namespace
    /// offloaded to a peer exports to it.
    EndpointSlice,
    /// Liqo's per-namespace offloading, read for isolation: which peers a
    /// namespace is offloaded to.
    NamespaceOffloading,
    /// The gateways' election: which gateway node is active, where the
    /// overlay sends remote-bound traffic.
    Lease,
    /// Liqo v1's per-peer networks: the peer's, and how we see them.
    Configuration,
    /// Liqo v1's copy of a peer gateway's WireGuard key.
    PublicKey,
    /// Liqo v1's gateway that listens for a peer.
    GatewayServer,
    /// Liqo v1's gateway that connects to a peer.
    GatewayClient,
    /// Liqo v1's address of ours exposed under another (`IP`).
    Ip,
}

impl ObjectKind {
    /// Every kind, in the order the agent reads them.
    pub const ALL: [ObjectKind; 7] = [
        Self::TunnelEndpoint,
        Self::NatMapping,
        Self::Node,
        Self::Pod,
        Self::EndpointSlice,
        Self::NamespaceOffloading,
        Self::Lease,
    ];

    /// Liqo v1's kinds, which describe peers the v1 way.
    pub const LIQO_V1: [ObjectKind; 5] = [
        Self::Configuration,
        Self::PublicKey,
        Self::GatewayServer,
        Self::GatewayClient,
        Self::Ip,
    ];

    /// The kinds a segregating gateway reads to know what each peer may
    /// reach.
    pub const ISOLATION: [ObjectKind; 3] =
        [Self::Pod, Self::EndpointSlice, Self::NamespaceOffloading];

    /// The `kind` field of such an object.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TunnelEndpoint => "TunnelEndpoint",
            Self::NatMapping => "NatMapping",
            Self::Node => "Node",
            Self::Pod => "Pod",
            Self::EndpointSlice => "EndpointSlice",
            Self::NamespaceOffloading => "NamespaceOffloading",
            Self::Lease => "Lease",
            Self::Configuration => "Configuration",
            Self::PublicKey => "PublicKey",
            Self::GatewayServer => "GatewayServer",
            Self::GatewayClient => "GatewayClient",
            Self::Ip => "IP",
        }
    }

    /// The `apiVersion` such an object carries.
    pub const fn api_version(self) -> &'static str {
        match self {
            Self::TunnelEndpoint | Self::NatMapping => API_VERSION,
            Self::Node | Self::Pod => CORE_API_VERSION,
            Self::EndpointSlice => DISCOVERY_API_VERSION,
            Self::NamespaceOffloading => OFFLOADING_API_VERSION,
            Self::Lease => COORDINATION_API_VERSION,
            Self::Configuration | Self::PublicKey | Self::GatewayServer | Self::GatewayClient => {
                LIQO_V1_NETWORKING_API_VERSION
            }
            Self::Ip => LIQO_V1_IPAM_API_VERSION,
        }
    }

    /// The API's resource name of the kind.
    pub const fn plural(self) -> &'static str {
        match self {
            Self::TunnelEndpoint => "tunnelendpoints",
            Self::NatMapping => "natmappings",
            Self::Node => "nodes",
            Self::Pod => "pods",
            Self::EndpointSlice => "endpointslices",
            Self::NamespaceOffloading => "namespaceoffloadings",
            Self::Lease => "leases",
            Self::Configuration => "configurations",
            // Sic: Liqo's CRD (apis/networking/v1beta1/publickey_types.go).
            Self::PublicKey => "publickeies",
            Self::GatewayServer => "gatewayservers",
            Self::GatewayClient => "gatewayclients",
            Self::Ip => "ips",
        }
    }

    /// The kind an object with these `apiVersion` and `kind` fields is, if
    /// the agent reads it.
    pub fn of(api_version: &str, kind: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::LIQO_V1)
            .find(|k| k.api_version() == api_version && k.as_str() == kind)
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
