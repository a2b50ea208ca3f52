//! Liqo v1's `IP` objects, as NatMapping entries for every Liqo v1 peer:
//! an address of our ExternalCIDR (`status.ip`) that leads a peer to
//! another of ours (`spec.ip`) (docs/design.md#liqo-v1-peers).

use std::collections::BTreeSet;

use isthmus_common::{nat::MappingKey, wire::Be32};

use crate::model::{
    node::Node,
    object::{ObjectError, ObjectKey, ObjectKind},
    peer::{Peer, Remaps},
    policy::Policy,
    rejection::Rejection,
};

use super::Valid;

/// The entries that the IP mappings of `origins` give the Liqo v1 peers
/// of `peers` (with their IDs). An address outside our ExternalCIDR, or
/// one that leads to a node, is refused, naming the object and its field.
pub(super) fn entries<'a>(
    origins: impl Iterator<Item = (&'a String, &'a Valid)>,
    peers: &[(u32, &Peer)],
    policy: &Policy,
    nodes: &[Node],
    errors: &mut BTreeSet<Rejection>,
) -> Vec<(MappingKey, Be32)> {
    let v1_peers: Vec<&(u32, &Peer)> = peers
        .iter()
        .filter(|(_, p)| p.remaps() == Remaps::Theirs)
        .collect();
    let mut entries = Vec::new();
    for (origin, valid) in origins {
        let Valid::V1Ip(key, ip) = valid else {
            continue;
        };
        let refuse = |problem: String| {
            Rejection::from(ObjectError {
                origin: origin.clone(),
                kind: ObjectKind::Ip,
                object: ObjectKey::clone(key),
                problem,
            })
        };
        if let Some(node) = policy.node_address_in(nodes, |a| a == ip.target) {
            errors.insert(refuse(format!(
                "field spec.ip: {} is {}; no node is exposed to a peer",
                ip.target, node.what
            )));
            continue;
        }
        for (peer_id, peer) in &v1_peers {
            let external = peer.local_external.real;
            if !external.contains(&ip.exposed) {
                errors.insert(refuse(format!(
                    "field status.ip: {} is outside our ExternalCIDR {external} (spec.local.cidr.external of Configuration {})",
                    ip.exposed, peer.key
                )));
                continue;
            }
            let key = MappingKey {
                peer_id: *peer_id,
                addr: Be32::from(ip.exposed),
            };
            entries.push((key, Be32::from(ip.target)));
        }
    }
    entries
}
