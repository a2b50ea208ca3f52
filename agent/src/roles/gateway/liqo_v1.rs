//! What a gateway does differently for a Liqo v1 peer
//! (docs/design.md#liqo-v1-peers): the tunnel carries the peer's real
//! addresses and its tunnel address, Liqo v1's point-to-point addressing
//! (`pkg/gateway/tunnel/netlink.go:27-29` at v1.2.0), which its conncheck
//! PINGs; and the tunnel device names the peer to the kernel.

use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;
use tracing::error;

use crate::{
    kernel::{dataplane::PeerDevices, link},
    model::peer::{GatewayRole, Peer, Remaps},
};

/// The server side's tunnel address.
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 18, 1);
/// The client side's tunnel address.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 18, 2);
/// The length of the tunnel's point-to-point network.
pub const PREFIX_LEN: u8 = 30;

/// The two ends of the tunnel to a Liqo v1 peer: ours and the peer's,
/// by the side our gateway object gives us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelAddresses {
    /// Ours, which the peer's conncheck PINGs.
    pub ours: Ipv4Addr,
    /// The peer's, which ours PINGs.
    pub theirs: Ipv4Addr,
}

impl TunnelAddresses {
    /// The ends of the tunnel to `peer`; None for a peer of Liqo v0.10's
    /// API, whose tunnel carries no addresses of its own. We are the
    /// server for an `IsthmusGatewayServer`, the client otherwise.
    pub fn of(peer: &Peer) -> Option<Self> {
        if peer.remaps() != Remaps::Theirs {
            return None;
        }
        let server = peer
            .liqo_gateway
            .as_ref()
            .is_some_and(|gateway| gateway.role == GatewayRole::Server);
        Some(Self::of_side(server))
    }

    /// The ends of the tunnel where we are the server, or else the client.
    pub fn of_side(server: bool) -> Self {
        let (ours, theirs) = match server {
            true => (SERVER_ADDR, CLIENT_ADDR),
            false => (CLIENT_ADDR, SERVER_ADDR),
        };
        Self { ours, theirs }
    }
}

/// The networks whose addresses `peer`'s packets carry inside the tunnel:
/// for a Liqo v1 peer, its real networks and its tunnel address.
pub fn tunnel_networks(peer: &Peer) -> Vec<Ipv4Net> {
    let networks = peer.tunnel_networks().map(|(_, net)| net);
    networks
        .into_iter()
        .chain(TunnelAddresses::of(peer).map(|ends| Ipv4Net::from(ends.theirs)))
        .collect()
}

/// The tunnel device's entry in the kernel's table of devices that carry
/// one Liqo v1 peer.
pub struct DeviceOfPeer {
    devices: PeerDevices,
    dev: String,
}

impl DeviceOfPeer {
    /// The table, for the tunnel device `dev`.
    pub fn new(devices: PeerDevices, dev: &str) -> Self {
        Self {
            devices,
            dev: dev.to_owned(),
        }
    }

    /// Names `peer` (the one Liqo v1 peer in the tunnel, if any) as the
    /// peer of the tunnel device, by its PodCIDR view, under the device's
    /// ifindex now: a recreated device gets its entry anew.
    pub fn sync(&mut self, peer: Option<&Peer>) {
        let wanted: BTreeMap<u32, Ipv4Net> = match (peer, link::ifindex(&self.dev)) {
            (Some(peer), Ok(ifindex)) => BTreeMap::from([(ifindex, peer.views()[0].1)]),
            _ => BTreeMap::new(),
        };
        if let Err(e) = self.devices.sync(&wanted) {
            error!(dev = %self.dev, error = %e, "naming the Liqo v1 peer of the tunnel device; will retry");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::{
        liqo_v1::{Companions, PeerNetworks},
        object::{Object, parse_documents},
        peer::{GatewayImplementation, LiqoGateway},
    };

    #[test]
    fn a_v1_peer_sends_from_its_real_networks_and_its_tunnel_address_alone() {
        let yaml = include_str!("../../../../tests/fixtures/liqo-v1/configuration-rome.yaml");
        let Some(Ok(Object::Configuration(raw))) = parse_documents(Path::new("c.yaml"), yaml).pop()
        else {
            panic!("not a Configuration")
        };
        let networks = PeerNetworks::from_configuration(&raw, "c.yaml").unwrap();
        let mut peer = networks.peer(&raw.key, "c.yaml", Companions::default());
        let net = |s: &str| s.parse::<Ipv4Net>().unwrap();
        assert_eq!(
            tunnel_networks(&peer),
            [
                net("10.200.0.0/16"),
                net("10.201.0.0/16"),
                net("169.254.18.1/32")
            ]
        );
        // Its views, which the kernel finds it by, are routed, not
        // carried: nothing inside the tunnel may claim them.
        let views: Vec<Ipv4Net> = peer.views().iter().map(|(_, n)| *n).collect();
        assert!(views.iter().all(|v| !tunnel_networks(&peer).contains(v)));
        // As its server, the peer is the client, at .2.
        peer.liqo_gateway = Some(LiqoGateway {
            role: GatewayRole::Server,
            implementation: GatewayImplementation::Isthmus,
            key: peer.key.clone(),
            cluster_id: "rome".into(),
        });
        assert_eq!(tunnel_networks(&peer)[2], net("169.254.18.2/32"));
        assert_eq!(
            TunnelAddresses::of(&peer),
            Some(TunnelAddresses {
                ours: SERVER_ADDR,
                theirs: CLIENT_ADDR
            })
        );
    }
}
