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
/// The API version of Isthmus's own gateway objects, which Liqo v1 renders
/// from Isthmus's gateway templates.
pub const ISTHMUS_GATEWAY_API_VERSION: &str = "gateway.isthmus.dev/v1alpha1";

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
    /// The server side of a Liqo v1 peering that Isthmus serves: Liqo
    /// renders it from a `GatewayServer` whose template is Isthmus's.
    IsthmusGatewayServer,
    /// The client side of a Liqo v1 peering that Isthmus serves, rendered
    /// from a `GatewayClient`.
    IsthmusGatewayClient,
    /// Liqo v1's address of ours exposed under another (`IP`).
    Ip,
}

/// What a kind of object is read for, which decides which nodes read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFor {
    /// The cluster itself, on every node: its nodes and the election.
    Cluster,
    /// Peers as Liqo v0.10 describes them (`--liqo-api v0.10`).
    LiqoV0_10,
    /// Peers as Liqo v1 describes them (`--liqo-api v1`).
    LiqoV1,
    /// What a segregating gateway reads to know what each peer may reach;
    /// gateways only.
    Isolation,
}

/// Everything the agent knows of one kind: adding a kind is one entry.
struct KindInfo {
    kind: ObjectKind,
    /// The `kind` field.
    name: &'static str,
    /// The `apiVersion` field.
    api_version: &'static str,
    /// The API's resource name.
    plural: &'static str,
    read_for: ReadFor,
    /// Whether the Kubernetes source keeps every object of the kind: the
    /// kinds whose status and Events the agent writes. The others (Pods
    /// above all) are not held in memory twice.
    stored: bool,
}

/// One entry per kind, in [`ObjectKind`]'s order (a test checks it).
const KINDS: [KindInfo; 12] = [
    KindInfo {
        kind: ObjectKind::TunnelEndpoint,
        name: "TunnelEndpoint",
        api_version: API_VERSION,
        plural: "tunnelendpoints",
        read_for: ReadFor::LiqoV0_10,
        stored: true,
    },
    KindInfo {
        kind: ObjectKind::NatMapping,
        name: "NatMapping",
        api_version: API_VERSION,
        plural: "natmappings",
        read_for: ReadFor::LiqoV0_10,
        stored: true,
    },
    KindInfo {
        kind: ObjectKind::Node,
        name: "Node",
        api_version: CORE_API_VERSION,
        plural: "nodes",
        read_for: ReadFor::Cluster,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::Pod,
        name: "Pod",
        api_version: CORE_API_VERSION,
        plural: "pods",
        read_for: ReadFor::Isolation,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::EndpointSlice,
        name: "EndpointSlice",
        api_version: DISCOVERY_API_VERSION,
        plural: "endpointslices",
        read_for: ReadFor::Isolation,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::NamespaceOffloading,
        name: "NamespaceOffloading",
        api_version: OFFLOADING_API_VERSION,
        plural: "namespaceoffloadings",
        read_for: ReadFor::Isolation,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::Lease,
        name: "Lease",
        api_version: COORDINATION_API_VERSION,
        plural: "leases",
        read_for: ReadFor::Cluster,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::Configuration,
        name: "Configuration",
        api_version: LIQO_V1_NETWORKING_API_VERSION,
        plural: "configurations",
        read_for: ReadFor::LiqoV1,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::PublicKey,
        name: "PublicKey",
        api_version: LIQO_V1_NETWORKING_API_VERSION,
        // Sic: Liqo's CRD (apis/networking/v1beta1/publickey_types.go).
        plural: "publickeies",
        read_for: ReadFor::LiqoV1,
        stored: false,
    },
    KindInfo {
        kind: ObjectKind::IsthmusGatewayServer,
        name: "IsthmusGatewayServer",
        api_version: ISTHMUS_GATEWAY_API_VERSION,
        plural: "isthmusgatewayservers",
        read_for: ReadFor::LiqoV1,
        stored: true,
    },
    KindInfo {
        kind: ObjectKind::IsthmusGatewayClient,
        name: "IsthmusGatewayClient",
        api_version: ISTHMUS_GATEWAY_API_VERSION,
        plural: "isthmusgatewayclients",
        read_for: ReadFor::LiqoV1,
        stored: true,
    },
    KindInfo {
        kind: ObjectKind::Ip,
        name: "IP",
        api_version: LIQO_V1_IPAM_API_VERSION,
        plural: "ips",
        read_for: ReadFor::LiqoV1,
        stored: false,
    },
];

impl ObjectKind {
    /// Every kind, in the order the agent reads them.
    pub const ALL: [ObjectKind; KINDS.len()] = {
        let mut all = [ObjectKind::TunnelEndpoint; KINDS.len()];
        let mut i = 0;
        while i < KINDS.len() {
            all[i] = KINDS[i].kind;
            i += 1;
        }
        all
    };

    const fn info(self) -> &'static KindInfo {
        &KINDS[self as usize]
    }

    /// The `kind` field of such an object.
    pub const fn as_str(self) -> &'static str {
        self.info().name
    }

    /// The `apiVersion` such an object carries.
    pub const fn api_version(self) -> &'static str {
        self.info().api_version
    }

    /// The API's resource name of the kind.
    pub const fn plural(self) -> &'static str {
        self.info().plural
    }

    /// What the kind is read for.
    pub const fn read_for(self) -> ReadFor {
        self.info().read_for
    }

    /// Whether the Kubernetes source keeps every object of the kind.
    pub const fn stored(self) -> bool {
        self.info().stored
    }

    /// The kinds read for `read_for`.
    pub fn read_for_all(read_for: ReadFor) -> impl Iterator<Item = ObjectKind> {
        Self::ALL
            .into_iter()
            .filter(move |k| k.read_for() == read_for)
    }

    /// The kind an object with these `apiVersion` and `kind` fields is, if
    /// the agent reads it.
    pub fn of(api_version: &str, kind: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.as_str() == kind)
    }

    /// Every kind the agent reads, by API version, as an error says what
    /// it wants: `net.liqo.io/v1alpha1 TunnelEndpoint or NatMapping, v1
    /// Node or Pod, …`.
    pub fn wanted() -> String {
        let mut versions: Vec<(&str, Vec<&str>)> = Vec::new();
        for kind in Self::ALL {
            match versions.iter_mut().find(|(v, _)| *v == kind.api_version()) {
                Some((_, names)) => names.push(kind.as_str()),
                None => versions.push((kind.api_version(), vec![kind.as_str()])),
            }
        }
        versions
            .iter()
            .map(|(version, names)| format!("{version} {}", names.join(" or ")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
