//! One Liqo v1 peer, joined from its objects by cluster ID: the networks
//! of its `Configuration`, the key of its `PublicKey` and our side of the
//! tunnel from its `IsthmusGatewayServer` or `IsthmusGatewayClient`. The result is the
//! peer model every table is written from, with the NAT running Liqo v1's
//! way (its layout, [`Layout::LiqoV1`], says so).

use crate::model::{
    object::{Layout, ObjectKey},
    peer::{Endpoint, GatewayImplementation, GatewayRole, LiqoGateway, Peer, TunnelParams},
};

use super::{Gateway, PeerKey, PeerNetworks, Side};

/// A peer's objects besides its `Configuration`, as far as they exist.
#[derive(Clone, Copy, Debug, Default)]
pub struct Companions<'a> {
    /// Its `PublicKey`.
    pub key: Option<&'a PeerKey>,
    /// Our `IsthmusGatewayServer` or `IsthmusGatewayClient` towards it.
    pub gateway: Option<&'a Gateway>,
}

impl PeerNetworks {
    /// The peer of the `Configuration` `config`, read from `origin`, with
    /// its `companions`. Our networks are never remapped by us: the peer
    /// remaps them on its side.
    pub fn peer(&self, config: &ObjectKey, origin: &str, companions: Companions<'_>) -> Peer {
        Peer {
            key: config.clone(),
            origin: origin.to_owned(),
            created: None,
            cluster_id: Some(self.cluster_id.clone()),
            cluster_name: None,
            layout: Layout::LiqoV1,
            ipv4: self.ipv4,
            ipv6: self.ipv6,
            tunnel: tunnel(companions),
            security_mode: None,
            liqo_gateway: companions.gateway.map(Gateway::reference),
        }
    }
}

impl Gateway {
    /// What the peer model keeps of this gateway: enough to name and
    /// write its `Connection`.
    pub fn reference(&self) -> LiqoGateway {
        LiqoGateway {
            role: match self.side {
                Side::Server { .. } => GatewayRole::Server,
                Side::Client { .. } => GatewayRole::Client,
            },
            implementation: GatewayImplementation::Isthmus,
            key: self.key.clone(),
            cluster_id: self.cluster_id.clone(),
            port: match self.side {
                Side::Server { port } | Side::Client { port, .. } => port,
            },
        }
    }
}

/// The tunnel to the peer's gateway, or the first field of the peer's
/// objects it lacks. As a client, we contact the peer at the endpoint of
/// our `IsthmusGatewayClient`; as a server, the peer contacts us at our
/// `IsthmusGatewayServer`'s port,
/// and we learn where it is from its handshake.
fn tunnel(companions: Companions<'_>) -> Result<TunnelParams, &'static str> {
    let gateway = companions
        .gateway
        .ok_or("IsthmusGatewayServer or IsthmusGatewayClient spec.endpoint")?;
    let key = companions.key.ok_or("PublicKey spec.publicKey")?;
    let (endpoint, port) = match &gateway.side {
        Side::Client { endpoint, port } => (endpoint.clone(), *port),
        Side::Server { port } => (Endpoint::Learned, *port),
    };
    Ok(TunnelParams {
        endpoint,
        port,
        public_key: key.key,
        mtu: Some(gateway.mtu),
    })
}
