//! What the gateway's parts should hold for a set of peers, computed from
//! the peers alone: [`super::Gateway::sync`] then applies it part by part.
//! A new fact about a peer is a method here, not a collection more in a
//! loop.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use ipnet::IpNet;

use super::{conncheck::Target, lane::LaneSpec, liqo_v1};
use crate::{
    model::{
        key_text,
        object::ObjectKey,
        peer::{Peer, Problem, TunnelParams},
    },
    tunnel::peers::PeerConfig,
};

/// A peer the tunnel carries, with what it was given.
pub struct Carried<'a> {
    /// The peer.
    pub peer: &'a Peer,
    /// Its tunnel peer.
    pub config: PeerConfig,
}

/// The gateway's desired state for a set of peers.
#[derive(Default)]
pub struct Plan<'a> {
    /// The peers the tunnel carries.
    pub carried: Vec<Carried<'a>>,
    /// Peers left out of the tunnel for want of an endpoint address, with
    /// why.
    pub unresolved: BTreeMap<ObjectKey, String>,
    /// Peers with no tunnel at all: each object, and what is wrong.
    pub problems: BTreeSet<(String, String)>,
}

impl<'a> Plan<'a> {
    /// The plan for `peers`, reaching each peer's gateway where `address`
    /// says (none for a peer we serve, which makes contact itself).
    pub fn new(
        peers: &'a [Peer],
        address: impl Fn(&TunnelParams) -> Result<Option<IpAddr>, String>,
    ) -> Self {
        let mut plan = Plan::default();
        for peer in peers {
            let params = match &peer.tunnel {
                Ok(params) => params,
                Err(field) => {
                    let problem = peer.error(Problem::NoTunnel { field });
                    plan.problems
                        .insert((peer.key.to_string(), problem.to_string()));
                    continue;
                }
            };
            match address(params) {
                Ok(addr) => plan.carried.push(Carried {
                    peer,
                    config: tunnel_peer(peer, params, addr),
                }),
                Err(why) => {
                    plan.unresolved.insert(peer.key.clone(), why);
                }
            }
        }
        plan
    }

    /// What each carried peer's tunnel was given, as Liqo's
    /// `peerConfiguration`, with the cluster ID its PINGs carry.
    pub fn configurations(&self) -> BTreeMap<ObjectKey, (String, Arc<BTreeMap<String, String>>)> {
        self.carried
            .iter()
            .map(|c| {
                let configuration = Arc::new(peer_configuration(&c.config));
                (c.peer.key.clone(), (c.config.label.clone(), configuration))
            })
            .collect()
    }

    /// The carried peers on tunnel device `device`, by their devices in
    /// `lanes`.
    pub fn on_device<'s>(
        &'s self,
        lanes: &'s BTreeMap<ObjectKey, LaneSpec>,
        device: &'s str,
    ) -> impl Iterator<Item = &'s Carried<'a>> {
        self.carried.iter().filter(move |c| {
            lanes
                .get(&c.peer.key)
                .is_some_and(|spec| spec.device == device)
        })
    }

    /// Leaves the carried peer `key` out of the tunnel, with why.
    pub fn leave_out(&mut self, key: &ObjectKey, why: String) {
        self.carried.retain(|c| c.peer.key != *key);
        self.unresolved.insert(key.clone(), why);
    }

    /// Where the conncheck PINGs each carried peer, by its label, through
    /// its device in `lanes`.
    pub fn conncheck_targets(
        &self,
        lanes: &BTreeMap<ObjectKey, LaneSpec>,
    ) -> BTreeMap<String, Target> {
        self.carried
            .iter()
            .filter_map(|c| {
                let target = Target {
                    addr: conncheck_target(c.peer),
                    device: lanes.get(&c.peer.key)?.device.clone(),
                };
                Some((c.config.label.clone(), target))
            })
            .collect()
    }

    /// The networks of both families routed into the tunnel: our views of
    /// the carried peers. The addresses inside the tunnel may be real ones,
    /// which a Liqo v1 peer shares with us.
    pub fn routed(&self) -> BTreeSet<IpNet> {
        self.carried
            .iter()
            .flat_map(|c| c.peer.all_views().into_iter().map(|(_, net)| net))
            .collect()
    }

    /// The tunnel's peers.
    pub fn tunnel_peers(&self) -> Vec<PeerConfig> {
        self.carried.iter().map(|c| c.config.clone()).collect()
    }
}

/// The tunnel peer of `peer`, reached at `addr` on its port.
fn tunnel_peer(peer: &Peer, params: &TunnelParams, addr: Option<IpAddr>) -> PeerConfig {
    PeerConfig {
        key: peer.key.clone(),
        label: peer.label().to_owned(),
        cluster_name: peer.name().to_owned(),
        public: params.public_key,
        endpoint: addr.map(|addr| SocketAddr::new(addr, params.port)),
        networks: liqo_v1::tunnel_networks(peer),
    }
}

/// Where the conncheck PINGs `peer`: the first host of its ExternalCIDR as
/// we see it, which its NatMapping for us sends to its 169.254.0.1; a
/// Liqo v1 peer's tunnel address.
fn conncheck_target(peer: &Peer) -> Ipv4Addr {
    if let Some(ends) = liqo_v1::TunnelAddresses::of(peer) {
        return ends.theirs;
    }
    let view = peer.ipv4.remote_external.seen();
    Ipv4Addr::from(u32::from(view.network()).saturating_add(1))
}

/// Liqo's `status.connection.peerConfiguration` for a peer's tunnel.
fn peer_configuration(config: &PeerConfig) -> BTreeMap<String, String> {
    let allowed: Vec<String> = config.networks.iter().map(ToString::to_string).collect();
    let endpoint = config.endpoint.iter().flat_map(|endpoint| {
        [
            ("endpointIP".to_owned(), endpoint.ip().to_string()),
            ("port".to_owned(), endpoint.port().to_string()),
        ]
    });
    [
        ("allowedIPs".to_owned(), allowed.join(", ")),
        ("publicKey".to_owned(), key_text::encode(&config.public)),
    ]
    .into_iter()
    .chain(endpoint)
    .collect()
}
