//! What the peer tables of both families should hold: each accepted peer's
//! views, to its rules.

use std::collections::{BTreeMap, HashMap};

use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    nat::{MappingKey, NO_MAPPINGS, PeerNat},
    wire::Be128,
};

use crate::model::{isolation::SecurityMode, object::ObjectKey, peer::Peer};

/// The IPv4 views of `accepted` and their IPv6 views, each to its peer's
/// rules, under the peer's ID in `ids`.
pub(super) fn of(
    accepted: &[Peer],
    ids: &HashMap<ObjectKey, u32>,
    mode: SecurityMode,
) -> (
    BTreeMap<Ipv4Net, PeerNat>,
    BTreeMap<Ipv6Net, PeerNat<Be128>>,
) {
    let ipv4 = accepted
        .iter()
        .flat_map(|peer| {
            let nat = peer.nat(ids[&peer.key], mode);
            peer.views().map(|(_, net)| (net, nat))
        })
        .collect();
    let ipv6 = accepted
        .iter()
        .filter_map(|peer| Some((peer, peer.ipv6.as_ref()?, peer.nat6(ids[&peer.key], mode)?)))
        .flat_map(|(peer, ipv6, nat)| ipv6.views(peer.layout).map(|(_, net)| (net, nat)))
        .collect();
    (ipv4, ipv6)
}

/// `views` as the peer table should hold them beside the NatMapping table
/// of the same family, `mappings`: each peer with no entry there has
/// [`NO_MAPPINGS`], and its packets skip that table's lookups.
pub(super) fn marking_unmapped<N: Copy + Ord, A: Copy, V>(
    views: &BTreeMap<N, PeerNat<A>>,
    mappings: &BTreeMap<MappingKey<A>, V>,
) -> BTreeMap<N, PeerNat<A>> {
    // The keys are in peer order: one entry per mapped peer, kept sorted.
    let mut mapped: Vec<u32> = mappings.keys().map(|key| key.peer_id).collect();
    mapped.dedup();
    let marked = |nat: &PeerNat<A>| PeerNat {
        flags: match mapped.binary_search(&nat.peer_id) {
            Ok(_) => nat.flags & !NO_MAPPINGS,
            Err(_) => nat.flags | NO_MAPPINGS,
        },
        ..*nat
    };
    views.iter().map(|(net, nat)| (*net, marked(nat))).collect()
}
