//! Liqo v1's `IP` objects, as NatMapping entries for every Liqo v1 peer:
//! an address of our ExternalCIDR (`status.ip`) that leads a peer to
//! another of ours (`spec.ip`) (docs/design.md#liqo-v1-peers). An IPv6
//! `IP` gives entries of the IPv6 table to the peers with IPv6 networks.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_common::nat::MappingKey;

use crate::model::{
    cidr::Cidr,
    object::{ObjectError, ObjectKey, ObjectKind},
    peer::{Networks, Peer},
    rejection::Rejection,
};

use super::Valid;

/// One IP's entry for one peer, with the object it comes from.
pub(super) struct IpEntry<'a, A> {
    origin: &'a String,
    ip: &'a ObjectKey,
    key: MappingKey<A>,
    target: A,
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

/// The entries that the IP mappings of family `N` among `origins` give
/// `peers`: each Liqo v1 peer with its ID and its networks of that
/// family. An address outside our ExternalCIDR, or one that leads to a
/// node (`is_node` says which), is refused, naming the object and its
/// field.
pub(super) fn entries<'a, N: Cidr>(
    origins: impl Iterator<Item = (&'a String, &'a Valid)>,
    peers: &[(u32, &Peer, &Networks<N>)],
    is_node: impl Fn(N::Addr) -> Option<String>,
    errors: &mut BTreeSet<Rejection>,
) -> Vec<IpEntry<'a, N::Wire>> {
    let mut entries = Vec::new();
    for (origin, valid) in origins {
        let Valid::V1Ip(key, ip) = valid else {
            continue;
        };
        let (Some(exposed), Some(target)) = (N::addr_of(ip.exposed), N::addr_of(ip.target)) else {
            continue;
        };
        if let Some(what) = is_node(target) {
            errors.insert(refusal(
                origin,
                key,
                format!("field spec.ip: {target} is {what}; no node is exposed to a peer"),
            ));
            continue;
        }
        for (peer_id, peer, networks) in peers {
            let external = networks.local_external.real;
            if !external.holds(exposed) {
                errors.insert(refusal(origin, key, format!(
                    "field status.ip: {exposed} is outside our ExternalCIDR {external} (spec.local.cidr.external of Configuration {})",
                    peer.key
                )));
                continue;
            }
            entries.push(IpEntry {
                origin,
                ip: key,
                key: MappingKey {
                    peer_id: *peer_id,
                    addr: N::Wire::from(exposed),
                },
                target: N::Wire::from(target),
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
pub(super) fn within_room<N: Cidr>(
    mut entries: Vec<IpEntry<'_, N::Wire>>,
    room: usize,
    applied: &BTreeMap<MappingKey<N::Wire>, N::Wire>,
    errors: &mut BTreeSet<Rejection>,
) -> Vec<(MappingKey<N::Wire>, N::Wire)> {
    let rank = |e: &IpEntry<'_, N::Wire>| (applied.get(&e.key) != Some(&e.target), e.key);
    entries.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.ip.cmp(b.ip)));
    let mut kept: BTreeMap<MappingKey<N::Wire>, &ObjectKey> = BTreeMap::new();
    let mut programmed = Vec::new();
    for entry in entries {
        let problem = match kept.get(&entry.key) {
            Some(first) if *first == entry.ip => continue,
            Some(first) => format!(
                "field status.ip: {} is also IP {first}'s, which keeps it",
                Into::<N::Addr>::into(entry.key.addr)
            ),
            None if programmed.len() == room => format!(
                "the NatMapping table has no room left for status.ip {} ({room} entries for IPs): not programmed",
                Into::<N::Addr>::into(entry.key.addr)
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
