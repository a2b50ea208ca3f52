//! Liqo v1's `IP` objects, as NatMapping entries for every Liqo v1 peer:
//! an address of our ExternalCIDR (`status.ip`) that leads a peer to
//! another of ours (`spec.ip`) (docs/design.md#liqo-v1-peers).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use isthmus_common::{nat::MappingKey, wire::Be32};

use crate::model::{
    node::Node,
    object::{ObjectError, ObjectKey, ObjectKind},
    peer::{Peer, Remaps},
    policy::Policy,
    rejection::Rejection,
};

use super::Valid;

/// One IP's entry for one peer, with the object it comes from.
pub(super) struct IpEntry<'a> {
    origin: &'a String,
    ip: &'a ObjectKey,
    key: MappingKey,
    target: Be32,
}

/// The refusal of IP `key`, read from `origin`.
fn refusal(origin: &str, key: &ObjectKey, problem: String) -> Rejection {
    Rejection::from(ObjectError {
        origin: origin.to_owned(),
        kind: ObjectKind::Ip,
        object: key.clone(),
        problem,
    })
}

/// The entries that the IP mappings of `origins` give the Liqo v1 peers
/// of `peers` (with their IDs). An address outside our ExternalCIDR, or
/// one that leads to a node, is refused, naming the object and its field.
pub(super) fn entries<'a>(
    origins: impl Iterator<Item = (&'a String, &'a Valid)>,
    peers: &[(u32, &Peer)],
    policy: &Policy,
    nodes: &[Node],
    errors: &mut BTreeSet<Rejection>,
) -> Vec<IpEntry<'a>> {
    let v1_peers: Vec<&(u32, &Peer)> = peers
        .iter()
        .filter(|(_, p)| p.remaps() == Remaps::Theirs)
        .collect();
    let mut entries = Vec::new();
    for (origin, valid) in origins {
        let Valid::V1Ip(key, ip) = valid else {
            continue;
        };
        if let Some(node) = policy.node_address_in(nodes, |a| a == ip.target) {
            errors.insert(refusal(
                origin,
                key,
                format!(
                    "field spec.ip: {} is {}; no node is exposed to a peer",
                    ip.target, node.what
                ),
            ));
            continue;
        }
        for (peer_id, peer) in &v1_peers {
            let external = peer.ipv4.local_external.real;
            if !external.contains(&ip.exposed) {
                errors.insert(refusal(origin, key, format!(
                    "field status.ip: {} is outside our ExternalCIDR {external} (spec.local.cidr.external of Configuration {})",
                    ip.exposed, peer.key
                )));
                continue;
            }
            entries.push(IpEntry {
                origin,
                ip: key,
                key: MappingKey {
                    peer_id: *peer_id,
                    addr: Be32::from(ip.exposed),
                },
                target: Be32::from(ip.target),
            });
        }
    }
    entries
}

/// The entries to program of `entries`: one per exposed address, and no
/// more than `room`. What the kernel holds (`applied`) goes first, so a
/// pass never trades a working entry for a new one; then the order of the
/// addresses. A second IP for an address and an entry beyond the room are
/// refused, each naming its IP.
pub(super) fn within_room(
    mut entries: Vec<IpEntry<'_>>,
    room: usize,
    applied: &BTreeMap<MappingKey, Be32>,
    errors: &mut BTreeSet<Rejection>,
) -> Vec<(MappingKey, Be32)> {
    let rank = |e: &IpEntry<'_>| (applied.get(&e.key) != Some(&e.target), e.key);
    entries.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.ip.cmp(b.ip)));
    let mut kept: BTreeMap<MappingKey, &ObjectKey> = BTreeMap::new();
    let mut programmed = Vec::new();
    for entry in entries {
        let problem = match kept.get(&entry.key) {
            Some(first) if *first == entry.ip => continue,
            Some(first) => format!(
                "field status.ip: {} is also IP {first}'s, which keeps it",
                Ipv4Addr::from(entry.key.addr)
            ),
            None if programmed.len() == room => format!(
                "the NatMapping table has no room left for status.ip {} ({room} entries for IPs): not programmed",
                Ipv4Addr::from(entry.key.addr)
            ),
            None => {
                kept.insert(entry.key, entry.ip);
                programmed.push((entry.key, entry.target));
                continue;
            }
        };
        errors.insert(refusal(entry.origin, entry.ip, problem));
    }
    programmed
}
