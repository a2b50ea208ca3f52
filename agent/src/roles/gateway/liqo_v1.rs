//! What a gateway does differently for a Liqo v1 peer
//! (docs/design.md#liqo-v1-peers): the tunnel carries the peer's real
//! addresses and its tunnel address, Liqo v1's point-to-point addressing
//! (`pkg/gateway/tunnel/netlink.go:27-29` at v1.2.0), which its conncheck
//! PINGs; and each such peer has a tunnel device of its own, which names
//! it to the kernel: peers' real networks may overlap.

use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
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

/// The networks of both families whose addresses `peer`'s packets carry
/// inside the tunnel: for a Liqo v1 peer, its real networks and its
/// tunnel address.
pub fn tunnel_networks(peer: &Peer) -> Vec<IpNet> {
    let networks = peer.all_tunnel_networks().into_iter();
    let tunnel_address = TunnelAddresses::of(peer).map(|ends| Ipv4Net::from(ends.theirs));
    (networks.map(|(_, net)| net))
        .chain(tunnel_address.map(IpNet::V4))
        .collect()
}

/// The prefix of the tunnel devices of Liqo v1 peers.
pub const DEVICE_PREFIX: &str = "ist-";

/// The tunnel device of the Liqo v1 peer whose cluster ID is `cluster_id`:
/// `ist-<cluster ID>`, the same across restarts, so that a restarted agent
/// finds the device and its routes. An ID too long for a device name
/// (15 bytes), or with other characters than a DNS label's, is cut to its
/// first six and followed by a hash of the whole.
pub fn device_of(cluster_id: &str) -> String {
    let plain = format!("{DEVICE_PREFIX}{cluster_id}");
    let label = cluster_id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if label && !cluster_id.is_empty() && plain.len() < libc::IFNAMSIZ {
        return plain;
    }
    let head: String = cluster_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(6)
        .collect::<String>()
        .to_ascii_lowercase();
    format!("{DEVICE_PREFIX}{head}-{:04x}", fnv1a(cluster_id) & 0xffff)
}

/// The TUN devices of Liqo v1 peers in this netns, by their prefix.
pub fn peer_devices() -> Vec<String> {
    let devices = link::devices().unwrap_or_default();
    devices
        .into_iter()
        .filter(|dev| dev.starts_with(DEVICE_PREFIX) && link::is_tun(dev))
        .collect()
}

/// FNV-1a, 32 bits: a hash that stays the same across builds and
/// platforms, as a device name must.
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The kernel's table of the tunnel devices that each carry one Liqo v1
/// peer, kept as the gateway's devices and peers are.
pub struct DevicesOfPeers(PeerDevices);

impl DevicesOfPeers {
    /// The table.
    pub fn new(devices: PeerDevices) -> Self {
        Self(devices)
    }

    /// Names, for each device in `devices`, its peer: by the peer's
    /// PodCIDR view of each family it has, under the device's ifindex now,
    /// so that a recreated device gets its entry anew. Every other entry
    /// goes. Returns whether the tables took them; it logs why not.
    pub fn sync<'a>(&mut self, devices: impl IntoIterator<Item = (&'a str, &'a Peer)>) -> bool {
        let by_ifindex: Vec<(u32, &Peer)> = devices
            .into_iter()
            .filter_map(|(dev, peer)| Some((link::ifindex(dev).ok()?, peer)))
            .collect();
        let wanted: BTreeMap<u32, Ipv4Net> = (by_ifindex.iter())
            .map(|(ifindex, peer)| (*ifindex, peer.views()[0].1))
            .collect();
        let wanted6: BTreeMap<u32, Ipv6Net> = (by_ifindex.iter())
            .filter_map(|(ifindex, peer)| {
                let ipv6 = peer.ipv6.as_ref()?;
                Some((*ifindex, ipv6.views(peer.layout)[0].1))
            })
            .collect();
        let synced = self.0.sync(&wanted, &wanted6);
        if let Err(e) = &synced {
            error!(error = %e, "naming the Liqo v1 peers of the tunnel devices; will retry");
        }
        synced.is_ok()
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
    fn a_peers_device_is_named_after_its_cluster_the_same_way_every_time() {
        assert_eq!(device_of("rome"), "ist-rome");
        assert_eq!(device_of("milan-west"), "ist-milan-west");
        assert_eq!(device_of("milan-west-1"), "ist-milanw-d74c");
        let long = device_of("b7a3e2c0-4f1d-4c55-9e0b-5a1f2d3c4b5a");
        // FNV-1a of the whole ID, as Python computes it too.
        assert_eq!(long, "ist-b7a3e2-f7c9");
        assert!(long.len() < libc::IFNAMSIZ);
        assert_eq!(long, device_of("b7a3e2c0-4f1d-4c55-9e0b-5a1f2d3c4b5a"));
        // Two IDs that share their first six characters differ by hash.
        assert_ne!(
            device_of("tenant-alpha-000001"),
            device_of("tenant-alpha-000002")
        );
        // Characters no device name should carry are left out.
        for odd in ["Rome", "a/b", "x y", "", "über"] {
            let dev = device_of(odd);
            assert!(dev.len() < libc::IFNAMSIZ, "{dev}");
            assert!(
                dev.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{dev}"
            );
        }
    }

    #[test]
    fn a_v1_peer_sends_from_its_real_networks_and_its_tunnel_address_alone() {
        let yaml = include_str!("../../../../tests/fixtures/liqo-v1/configuration-rome.yaml");
        let Some(Ok(Object::Configuration(raw))) = parse_documents(Path::new("c.yaml"), yaml).pop()
        else {
            panic!("not a Configuration")
        };
        let networks = PeerNetworks::from_configuration(&raw, "c.yaml").unwrap();
        let mut peer = networks.peer(&raw.key, "c.yaml", Companions::default());
        let net = |s: &str| s.parse::<IpNet>().unwrap();
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
        let views: Vec<IpNet> = peer.all_views().iter().map(|(_, n)| *n).collect();
        assert!(views.iter().all(|v| !tunnel_networks(&peer).contains(v)));
        // As its server, the peer is the client, at .2.
        peer.liqo_gateway = Some(LiqoGateway::rome(
            GatewayRole::Server,
            GatewayImplementation::Isthmus,
        ));
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
