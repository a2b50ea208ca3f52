//! The rules that arbitrate between objects that are each valid alone: two
//! peers may not claim the same networks, keys or cluster, a WireGuard
//! endpoint may not hide in a view, and a NatMapping must be written for the
//! views its TunnelEndpoint gives.

use ipnet::Ipv4Net;

use crate::model::{
    natmapping::{MappingProblem, NatMapping},
    peer::{Peer, PeerError, Problem},
    policy::overlaps,
};

/// Why `peer` cannot join `accepted`, if it cannot.
pub(super) fn conflict(peer: &Peer, accepted: &[Peer]) -> Option<PeerError> {
    if let Some(other) = accepted.iter().find(|o| o.key == peer.key) {
        let other_file = other.origin.clone();
        return Some(PeerError::new(
            &peer.origin,
            &peer.key,
            Problem::Duplicate { other_file },
        ));
    }
    if let Some(e) =
        duplicate_identity(peer, accepted).or_else(|| endpoint_in_a_view(peer, accepted))
    {
        return Some(PeerError::new(&peer.origin, &peer.key, e));
    }
    // Views taken so far; the peer's own first view counts against its second.
    let mut taken: Vec<(&Peer, (&'static str, Ipv4Net))> = accepted
        .iter()
        .flat_map(|other| other.views().map(|view| (other, view)))
        .collect();
    for (field, net) in peer.views() {
        if let Some((other, (other_field, other_net))) = taken
            .iter()
            .find(|(_, (_, taken_net))| overlaps(net, *taken_net))
        {
            let problem = Problem::Overlap {
                field,
                net,
                other: other.key.clone(),
                other_file: other.origin.clone(),
                other_field,
                other_net: *other_net,
            };
            return Some(PeerError::new(&peer.origin, &peer.key, problem));
        }
        taken.push((peer, (field, net)));
    }
    None
}

/// A network of `mapping` that is not the view `peer`'s TunnelEndpoint
/// gives: its values would then be read in the wrong network.
pub(super) fn view_mismatch(mapping: &NatMapping, peer: &Peer) -> Option<MappingProblem> {
    let (tep_field, expected) = peer.local_external_view();
    let (pod_field, pod_view) = peer.views()[0];
    [
        (
            "externalCIDR",
            mapping.external_cidr,
            expected,
            "ExternalCIDR of ours the peer sees",
            tep_field,
        ),
        (
            "podCIDR",
            mapping.pod_cidr,
            pod_view,
            "PodCIDR of the peer we see",
            pod_field,
        ),
    ]
    .into_iter()
    .find_map(|(field, found, expected, meaning, tep_field)| {
        let found = found.filter(|found| *found != expected)?;
        Some(MappingProblem::ViewMismatch {
            field,
            found,
            expected,
            meaning,
            tep_field,
            tunnel_endpoint: peer.key.clone(),
        })
    })
}

/// A public key or cluster ID that `peer` shares with an accepted peer.
fn duplicate_identity(peer: &Peer, accepted: &[Peer]) -> Option<Problem> {
    let key = |p: &Peer| p.tunnel.as_ref().ok().map(|t| t.public_key);
    accepted.iter().find_map(|other| {
        let (other_file, o) = (other.origin.clone(), other.key.clone());
        if key(peer).is_some() && key(peer) == key(other) {
            return Some(Problem::DuplicateKey {
                other: o,
                other_file,
            });
        }
        let cluster_id = peer.cluster_id.clone()?;
        (other.cluster_id.as_ref() == Some(&cluster_id)).then_some(Problem::DuplicateCluster {
            cluster_id,
            other: o,
            other_file,
        })
    })
}

/// A view of `peer` holding a WireGuard endpoint (its own included), or its
/// endpoint inside an accepted peer's view.
fn endpoint_in_a_view(peer: &Peer, accepted: &[Peer]) -> Option<Problem> {
    let endpoint = |p: &Peer| p.tunnel.as_ref().ok().and_then(|t| t.endpoint.addr());
    for other in accepted.iter().chain([peer]) {
        let Some(at) = endpoint(other) else { continue };
        if let Some((field, net)) = peer.views().into_iter().find(|(_, v)| v.contains(&at)) {
            return Some(Problem::EndpointInView {
                field,
                net,
                endpoint: at,
                other: other.key.clone(),
                other_file: other.origin.clone(),
            });
        }
    }
    let at = endpoint(peer)?;
    accepted.iter().find_map(|other| {
        let (other_field, other_net) = other.views().into_iter().find(|(_, v)| v.contains(&at))?;
        Some(Problem::EndpointUnderView {
            endpoint: at,
            other: other.key.clone(),
            other_file: other.origin.clone(),
            other_field,
            other_net,
        })
    })
}
