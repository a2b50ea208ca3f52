//! The rules that arbitrate between objects that are each valid alone: two
//! peers may not claim the same networks, keys or cluster, a WireGuard
//! endpoint may not hide in a view, and a NatMapping must be written for the
//! views its TunnelEndpoint gives.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use ipnet::IpNet;

use crate::model::{
    cidr::Cidr,
    natmapping::{FieldNames, MappingProblem, Mappings, NatMapping},
    object::ObjectKey,
    peer::{Networks, Peer, PeerError, Problem, Remaps},
    policy::overlaps,
};

/// The peers a pass has accepted so far, indexed so that checking a
/// newcomer costs a few lookups: a pass runs on every object change, and
/// comparing each of hundreds of peers with all the others made it the
/// slowest step between an event and the kernel.
#[derive(Default)]
pub(super) struct Accepted {
    peers: Vec<Peer>,
    /// The origin of the first candidate of each object key, accepted or
    /// not.
    first_of_key: HashMap<ObjectKey, String>,
    public_keys: HashMap<[u8; 32], usize>,
    cluster_ids: HashMap<String, usize>,
    /// Every accepted view, of both families, by its first address, with
    /// its peer and its place among that peer's views. Accepted views never
    /// overlap.
    views: BTreeMap<AddrKey, (usize, usize)>,
    /// Every accepted endpoint address, with its peer.
    endpoints: BTreeSet<(IpAddr, usize)>,
    /// The accepted Liqo v1 peer, if any.
    v1_peer: Option<usize>,
    /// Whether each Liqo v1 peer has a device of its own.
    device_per_v1_peer: bool,
}

impl Accepted {
    /// None accepted yet; with `device_per_v1_peer`, any number of Liqo
    /// v1 peers may be, else one.
    pub(super) fn new(device_per_v1_peer: bool) -> Self {
        Self {
            device_per_v1_peer,
            ..Self::default()
        }
    }

    /// Accepts `peer`, the next candidate in seniority, or says why it
    /// cannot join. Only the first candidate of an object key may: the
    /// others are duplicates, even where the first was refused, so that
    /// which of them stands never depends on the agent's history (a
    /// restarted agent would not know which one it accepted before).
    pub(super) fn admit(&mut self, peer: Peer) -> Result<(), PeerError> {
        if let Some(other_file) = self.first_of_key.get(&peer.key) {
            let other_file = other_file.clone();
            return Err(peer.error(Problem::Duplicate { other_file }));
        }
        self.first_of_key
            .insert(peer.key.clone(), peer.origin.clone());
        if let Some(e) = self.conflict(&peer) {
            return Err(e);
        }
        self.push(peer);
        Ok(())
    }

    /// Why `peer` cannot join, if it cannot. Where several accepted peers
    /// stand in the way, the error names the senior one.
    fn conflict(&self, peer: &Peer) -> Option<PeerError> {
        let problem = self
            .duplicate_identity(peer)
            .or_else(|| self.endpoint_in_a_view(peer))
            .or_else(|| self.overlap(peer))
            .or_else(|| self.second_v1_peer(peer))?;
        Some(peer.error(problem))
    }

    /// Accepts `peer`, which has no conflict.
    fn push(&mut self, peer: Peer) {
        let at = self.peers.len();
        if let Some(public_key) = public_key(&peer) {
            self.public_keys.insert(public_key, at);
        }
        if let Some(cluster_id) = &peer.cluster_id {
            self.cluster_ids.insert(cluster_id.clone(), at);
        }
        for (place, (_, view)) in peer.all_views().into_iter().enumerate() {
            self.views.insert(key(view.network()), (at, place));
        }
        if let Some(endpoint) = endpoint(&peer) {
            self.endpoints.insert((endpoint, at));
        }
        if peer.remaps() == Remaps::Theirs {
            self.v1_peer = Some(at);
        }
        self.peers.push(peer);
    }

    /// The accepted peers, senior first.
    pub(super) fn into_peers(self) -> Vec<Peer> {
        self.peers
    }

    /// A Liqo v1 peer beside another on one NAT device: the device names
    /// the peer of a packet whose source is real
    /// (docs/design.md#liqo-v1-peers), so it carries one such peer alone.
    fn second_v1_peer(&self, peer: &Peer) -> Option<Problem> {
        if self.device_per_v1_peer {
            return None;
        }
        let other = self.v1_peer.filter(|_| peer.remaps() == Remaps::Theirs)?;
        let (other, other_file) = self.named(other);
        Some(Problem::SecondV1Peer { other, other_file })
    }

    /// A public key or cluster ID that `peer` shares with an accepted peer.
    fn duplicate_identity(&self, peer: &Peer) -> Option<Problem> {
        let by_key = public_key(peer).and_then(|k| self.public_keys.get(&k).copied());
        let by_cluster = (peer.cluster_id.as_ref()).and_then(|c| self.cluster_ids.get(c).copied());
        let other = by_key.into_iter().chain(by_cluster).min()?;
        let (o, other_file) = self.named(other);
        Some(if by_key == Some(other) {
            Problem::DuplicateKey {
                other: o,
                other_file,
            }
        } else {
            Problem::DuplicateCluster {
                cluster_id: peer.cluster_id.clone().expect("matched by cluster ID"),
                other: o,
                other_file,
            }
        })
    }

    /// A view of `peer` holding a WireGuard endpoint (an accepted peer's,
    /// else its own), or its endpoint inside an accepted peer's view.
    fn endpoint_in_a_view(&self, peer: &Peer) -> Option<Problem> {
        let views = peer.all_views();
        let senior_inside = views
            .iter()
            .filter_map(|(_, view)| {
                let range = (view.network(), 0)..=(view.broadcast(), usize::MAX);
                self.endpoints.range(range).min_by_key(|(_, other)| *other)
            })
            .min_by_key(|(_, other)| *other)
            .map(|&(at, other)| (at, self.named(other)));
        let own_inside = || {
            endpoint(peer)
                .filter(|at| views.iter().any(|(_, view)| view.contains(at)))
                .map(|at| (at, (peer.key.clone(), peer.origin.clone())))
        };
        if let Some((endpoint, (other, other_file))) = senior_inside.or_else(own_inside) {
            let (field, net) = views
                .into_iter()
                .find(|(_, view)| view.contains(&endpoint))
                .expect("found in a view");
            return Some(Problem::EndpointInView {
                field,
                net,
                endpoint,
                other,
                other_file,
            });
        }
        let at = endpoint(peer)?;
        let (other, place) = self.view_holding(at)?;
        let (other_field, other_net) = self.peers[other].all_views()[place];
        let (other, other_file) = self.named(other);
        Some(Problem::EndpointUnderView {
            endpoint: at,
            other,
            other_file,
            other_field,
            other_net,
        })
    }

    /// A view of `peer` that overlaps an accepted peer's view, or its own
    /// earlier view.
    fn overlap(&self, peer: &Peer) -> Option<Problem> {
        let views = peer.all_views();
        for (place, &(field, net)) in views.iter().enumerate() {
            let accepted = self
                .overlapping(net)
                .map(|(other, other_place)| (&self.peers[other], other_place));
            let own_earlier = || {
                (views[..place].iter())
                    .position(|(_, own)| overlaps(net, *own))
                    .map(|own_place| (peer, own_place))
            };
            if let Some((other, other_place)) = accepted.or_else(own_earlier) {
                let (other_field, other_net) = other.all_views()[other_place];
                return Some(Problem::Overlap {
                    field,
                    net: Box::new(net),
                    other: other.key.clone(),
                    other_file: other.origin.clone(),
                    other_field,
                    other_net: Box::new(other_net),
                });
            }
        }
        None
    }

    /// The senior accepted view overlapping `net`, as (peer, place): the
    /// one holding its first address, or any that starts inside it.
    fn overlapping(&self, net: IpNet) -> Option<(usize, usize)> {
        let inside = key(net.network())..=key(net.broadcast());
        let starting_inside = self.views.range(inside).map(|(_, held)| *held);
        (self.view_holding(net.network()).into_iter())
            .chain(starting_inside)
            .min()
    }

    /// The accepted view holding `addr`, as (peer, place).
    fn view_holding(&self, addr: IpAddr) -> Option<(usize, usize)> {
        let (_, &(other, place)) = self.views.range(..=key(addr)).next_back()?;
        let (_, view) = self.peers[other].all_views()[place];
        view.contains(&addr).then_some((other, place))
    }

    /// An accepted peer's object and origin, for an error.
    fn named(&self, at: usize) -> (ObjectKey, String) {
        let peer = &self.peers[at];
        (peer.key.clone(), peer.origin.clone())
    }
}

/// An address as the index orders it: IPv4 before IPv6, each family by
/// number, so that a range of one family holds none of the other.
type AddrKey = (bool, u128);

fn key(addr: IpAddr) -> AddrKey {
    match addr {
        IpAddr::V4(addr) => (false, u128::from(u32::from(addr))),
        IpAddr::V6(addr) => (true, u128::from(addr)),
    }
}

fn public_key(peer: &Peer) -> Option<[u8; 32]> {
    peer.tunnel.as_ref().ok().map(|t| t.public_key)
}

fn endpoint(peer: &Peer) -> Option<IpAddr> {
    peer.tunnel.as_ref().ok().and_then(|t| t.endpoint.addr())
}

/// A network of `mapping` that is not the view `peer`'s TunnelEndpoint
/// gives: its values would then be read in the wrong network.
pub(super) fn view_mismatch(mapping: &NatMapping, peer: &Peer) -> Option<MappingProblem> {
    let ipv6 = match (&mapping.ipv6, &peer.ipv6) {
        (Some(mappings), Some(networks)) => family_mismatch(mappings, networks, peer),
        _ => None,
    };
    family_mismatch(&mapping.ipv4, &peer.ipv4, peer).or(ipv6)
}

/// [`view_mismatch`] in one family: `mappings` against `networks`.
fn family_mismatch<N: Cidr>(
    mappings: &Mappings<N>,
    networks: &Networks<N>,
    peer: &Peer,
) -> Option<MappingProblem> {
    let names = FieldNames::of(N::IPV6);
    let checks = [
        (
            names.external_cidr,
            mappings.external_cidr,
            networks.local_views(peer.layout)[1],
            "ExternalCIDR of ours the peer sees",
        ),
        (
            names.pod_cidr,
            mappings.pod_cidr,
            networks.views(peer.layout)[0],
            "PodCIDR of the peer we see",
        ),
    ];
    checks
        .into_iter()
        .find_map(|(field, found, (tep_field, expected), meaning)| {
            let found = found.filter(|found| *found != expected)?;
            Some(MappingProblem::ViewMismatch {
                field,
                found: found.into(),
                expected: expected.into(),
                meaning,
                tep_field,
                tunnel_endpoint: peer.key.clone(),
            })
        })
}
