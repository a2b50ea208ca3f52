//! Our Liqo v1 gateway towards a peer, as the peer model keeps it: which
//! side of the tunnel it takes, what carries the tunnel, and the objects
//! named after it.

use crate::model::object::{LIQO_V1_NETWORKING_API_VERSION, ObjectKey, ObjectKind};

/// Our Liqo v1 gateway towards one peer: Liqo's `GatewayServer` or
/// `GatewayClient`, through the object Liqo renders from its template for
/// the implementation that carries the tunnel.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiqoGateway {
    /// Server or client.
    pub role: GatewayRole,
    /// What carries the tunnel.
    pub implementation: GatewayImplementation,
    /// The gateway's name and namespace, which the rendered object shares.
    pub key: ObjectKey,
    /// The peer's cluster ID, which labels the `Connection`.
    pub cluster_id: String,
    /// The UDP port of the tunnel: ours, where the peer contacts us, for a
    /// server; the peer's for a client.
    pub port: u16,
}

/// The side of a Liqo v1 peering's tunnel a gateway takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GatewayRole {
    /// The peer contacts us (`GatewayServer`).
    Server,
    /// We contact the peer (`GatewayClient`).
    Client,
}

/// What carries a Liqo v1 peering's tunnel, by the kind of object Liqo
/// renders from the gateway's template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GatewayImplementation {
    /// Isthmus's gateway DaemonSet (`IsthmusGatewayServer`,
    /// `IsthmusGatewayClient`).
    Isthmus,
    /// Liqo's gateway pod from its WireGuard templates (`WgGatewayServer`,
    /// `WgGatewayClient`), with `isthmus-agent liqo-wireguard` as its
    /// `wireguard` container.
    LiqoWireGuard,
}

impl LiqoGateway {
    /// The kind of Liqo's gateway object, which owns the rendered object and
    /// the `Connection`.
    pub fn owner_kind(&self) -> &'static str {
        match self.role {
            GatewayRole::Server => "GatewayServer",
            GatewayRole::Client => "GatewayClient",
        }
    }

    /// The rendered object's `apiVersion` and `kind`.
    pub fn rendered_kind(&self) -> (&'static str, &'static str) {
        match self.implementation {
            GatewayImplementation::Isthmus => {
                let kind = Self::isthmus_kind(self.role);
                (kind.api_version(), kind.as_str())
            }
            GatewayImplementation::LiqoWireGuard => {
                let kind = match self.role {
                    GatewayRole::Server => "WgGatewayServer",
                    GatewayRole::Client => "WgGatewayClient",
                };
                (LIQO_V1_NETWORKING_API_VERSION, kind)
            }
        }
    }

    /// The kind of Isthmus's object for a gateway of `role`.
    pub fn isthmus_kind(role: GatewayRole) -> ObjectKind {
        match role {
            GatewayRole::Server => ObjectKind::IsthmusGatewayServer,
            GatewayRole::Client => ObjectKind::IsthmusGatewayClient,
        }
    }

    /// The `Connection` Liqo v1's gateway reports to: `gw-<gateway>`, beside
    /// the gateway (`pkg/gateway/forge/utils.go:18`,
    /// `tunnel/wireguard/k8s.go:90-128` at v1.2.0).
    pub fn connection(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.key.namespace.clone(),
            name: format!("gw-{}", self.key.name),
        }
    }
}

#[cfg(test)]
impl LiqoGateway {
    /// Our gateway of `role` towards the fixtures' peer, rome, in its
    /// tenant namespace, carried by `implementation`.
    pub fn rome(role: GatewayRole, implementation: GatewayImplementation) -> Self {
        Self {
            role,
            implementation,
            key: ObjectKey {
                namespace: "liqo-tenant-rome".into(),
                name: "rome".into(),
            },
            cluster_id: "rome".into(),
            port: 51840,
        }
    }
}
