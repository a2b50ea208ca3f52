//! The NatMapping table's entries: each cluster's NatMapping, checked and
//! held to its fair share, and Liqo v1's IP mappings.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_common::{
    nat::{CONNCHECK_ADDR, MappingKey},
    wire::Be32,
};

use super::{Reconciler, Valid, conflict::view_mismatch, ip_mappings, share};
use crate::{
    kernel::table::{AllowedTable, MappingTable, PeerTable, PeerTable6},
    model::{
        natmapping::{self, MappingProblem, NatMapping},
        peer::Peer,
        rejection::Rejection,
    },
};

impl<P, M, A, P6> Reconciler<P, M, A, P6>
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
{
    /// The NatMapping entries to program: one NatMapping per cluster, held
    /// while its cluster has no accepted TunnelEndpoint, each entry checked
    /// against our ExternalCIDR for that cluster.
    pub(super) fn select_mappings(
        &self,
        accepted: &[Peer],
        errors: &mut BTreeSet<Rejection>,
    ) -> BTreeMap<MappingKey, Be32> {
        let candidates = self.origins.values().flatten().filter_map(|v| match v {
            Ok(Valid::Mapping(m)) => Some(m),
            _ => None,
        });
        let (kept, duplicates) = natmapping::one_per_cluster(candidates);
        errors.extend(duplicates.into_iter().map(Rejection::from));
        // Looked up for every entry of every NatMapping: one set per pass.
        let node_addresses = self.policy.node_addresses(&self.nodes);
        let mut wanted = Vec::new();
        for mapping in kept {
            errors.extend(mapping.rejected.iter().cloned().map(Rejection::from));
            let Some(peer) = accepted
                .iter()
                .find(|p| p.cluster_id.as_deref() == Some(mapping.cluster_id.as_str()))
            else {
                let cluster = mapping.cluster_id.clone();
                errors.insert(mapping.error(MappingProblem::Held { cluster }).into());
                continue;
            };
            if let Some(problem) = view_mismatch(mapping, peer) {
                errors.insert(mapping.error(problem).into());
                continue;
            }
            let peer_id = self.ids[&peer.key];
            let (field, cidr) = peer.local_external_view();
            let mut entries = Vec::new();
            for (external, endpoint) in &mapping.entries {
                // The conncheck's entry leads to the gateway itself, which
                // holds that address: the kernel lets a peer reach only the
                // conncheck's port there.
                if Be32::from(*endpoint) != CONNCHECK_ADDR
                    && node_addresses.contains(endpoint)
                    && let Some(node) = self.policy.node_address_in(&self.nodes, |a| a == *endpoint)
                {
                    let problem = MappingProblem::NodeAddress {
                        endpoint: *endpoint,
                        external: *external,
                        what: node.what,
                    };
                    errors.insert(mapping.error(problem).into());
                    continue;
                }
                // The kernel keys the entry by the real address the prefix
                // step gives it: the same packets, with one lookup.
                let Some(real) = peer.ipv4.local_external.real_of(*external) else {
                    let problem = MappingProblem::OutsideExternalCidr {
                        endpoint: *endpoint,
                        external: *external,
                        cidr,
                        field,
                        tunnel_endpoint: peer.key.clone(),
                    };
                    errors.insert(mapping.error(problem).into());
                    continue;
                };
                let key = MappingKey {
                    peer_id,
                    addr: Be32::from(real),
                };
                entries.push((key, Be32::from(*endpoint)));
            }
            wanted.push((mapping, entries));
        }
        let mut desired = self.within_shares(wanted, errors);
        let ids: Vec<(u32, &Peer)> = accepted.iter().map(|p| (self.ids[&p.key], p)).collect();
        let origins = self
            .origins
            .iter()
            .flat_map(|(origin, results)| results.iter().flatten().map(move |v| (origin, v)));
        let ip_entries = ip_mappings::entries(origins, &ids, &self.policy, &self.nodes, errors);
        // IPs belong to no one peer: they get what the NatMappings left.
        let room = self.mapping_capacity.saturating_sub(desired.len());
        let applied = self.mapping_table.applied();
        desired.extend(ip_mappings::within_room(ip_entries, room, applied, errors));
        desired
    }

    /// The entries to program: each cluster's within its fair share of the
    /// table. Where a cluster asks for more, its conncheck entry is kept
    /// first, then those the kernel already holds (a pass never trades a
    /// working entry for a new one); the rest are refused, in one error.
    fn within_shares(
        &self,
        wanted: Vec<(&NatMapping, Vec<(MappingKey, Be32)>)>,
        errors: &mut BTreeSet<Rejection>,
    ) -> BTreeMap<MappingKey, Be32> {
        let demands: Vec<usize> = wanted.iter().map(|(_, entries)| entries.len()).collect();
        let shares = share::fair_shares(&demands, self.mapping_capacity);
        let applied = self.mapping_table.applied();
        let mut desired = Vec::new();
        for ((mapping, mut entries), share) in wanted.into_iter().zip(shares) {
            if entries.len() > share {
                entries.sort_by_key(|(key, endpoint)| {
                    (
                        *endpoint != CONNCHECK_ADDR,
                        !applied.contains_key(key),
                        *key,
                    )
                });
                let problem = MappingProblem::BeyondShare {
                    refused: entries.len() - share,
                    entries: entries.len(),
                    share,
                    capacity: self.mapping_capacity,
                };
                errors.insert(mapping.error(problem).into());
                entries.truncate(share);
            }
            desired.extend(entries);
        }
        // Built at once from a sorted list, much faster than entry by entry.
        BTreeMap::from_iter(desired)
    }
}
