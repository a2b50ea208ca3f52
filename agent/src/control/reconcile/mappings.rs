//! The NatMapping tables' entries, one table per address family: each
//! cluster's NatMapping, checked and held to its fair share, and Liqo v1's
//! IP mappings.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    nat::{CONNCHECK_ADDR, MappingKey},
    wire::{Be32, Be128},
};

use super::{Reconciler, Valid, conflict::view_mismatch, ip_mappings, share};
use crate::{
    kernel::table::{
        AllowedTable, AllowedTable6, MappingTable, MappingTable6, PeerTable, PeerTable6,
    },
    model::{
        cidr::Cidr,
        natmapping::{self, FieldNames, MappingProblem, Mappings, NatMapping},
        peer::{Networks, Peer, Remaps},
        rejection::Rejection,
    },
};

/// One family's entries a NatMapping asks for, as the kernel keys them.
type Wanted<'m, A> = Vec<(&'m NatMapping, Vec<(MappingKey<A>, A)>)>;

/// The entries to program, by family.
pub(super) struct Desired {
    /// IPv4's: NatMappings' and Liqo v1 IPs'.
    pub(super) ipv4: BTreeMap<MappingKey, Be32>,
    /// IPv6's: NatMappings' `spec.ipv6` and Liqo v1 IPv6 IPs'.
    pub(super) ipv6: BTreeMap<MappingKey<Be128>, Be128>,
}

impl<P, M, A, P6, M6, A6> Reconciler<P, M, A, P6, M6, A6>
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    /// The NatMapping entries to program: one NatMapping per cluster, held
    /// while its cluster has no accepted TunnelEndpoint, each entry checked
    /// against our ExternalCIDR for that cluster.
    pub(super) fn select_mappings(
        &self,
        accepted: &[Peer],
        errors: &mut BTreeSet<Rejection>,
    ) -> Desired {
        let candidates = self.origins.values().flatten().filter_map(|v| match v {
            Ok(Valid::Mapping(m)) => Some(m),
            _ => None,
        });
        let (kept, duplicates) = natmapping::one_per_cluster(candidates);
        errors.extend(duplicates.into_iter().map(Rejection::from));
        // Looked up for every entry of every NatMapping: one set per pass.
        let node_addresses = self.policy.node_addresses(&self.nodes);
        let node4 = |addr: Ipv4Addr| {
            let node = self.policy.node_address_in(&self.nodes, |a| a == addr);
            node.map(|node| node.what)
        };
        let is_node4 = |endpoint: Ipv4Addr| {
            // The conncheck's entry leads to the gateway itself, which
            // holds that address: the kernel lets a peer reach only the
            // conncheck's port there.
            if Be32::from(endpoint) == CONNCHECK_ADDR || !node_addresses.contains(&endpoint) {
                return None;
            }
            node4(endpoint)
        };
        let is_node6 = |endpoint: Ipv6Addr| self.policy.node_address6(&self.nodes, endpoint);
        let (mut wanted, mut wanted6) = (Vec::new(), Vec::new());
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
            let entries = Entries {
                mapping,
                peer,
                peer_id: self.ids[&peer.key],
            };
            wanted.push((
                mapping,
                entries.keyed(&mapping.ipv4, &peer.ipv4, is_node4, errors),
            ));
            let Some(ipv6) = &mapping.ipv6 else {
                continue;
            };
            let Some(networks) = &peer.ipv6 else {
                if !ipv6.entries.is_empty() {
                    let problem = MappingProblem::NoIpv6Networks {
                        cluster: mapping.cluster_id.clone(),
                        tunnel_endpoint: peer.key.clone(),
                    };
                    errors.insert(mapping.error(problem).into());
                }
                continue;
            };
            wanted6.push((mapping, entries.keyed(ipv6, networks, is_node6, errors)));
        }
        let capacity = self.mapping_capacity;
        let (applied, applied6) = (self.mapping_table.applied(), self.mapping6_table.applied());
        let mut ipv4 =
            within_shares::<Ipv4Net>(wanted, capacity, applied, Some(CONNCHECK_ADDR), errors);
        let mut ipv6 = within_shares::<Ipv6Net>(wanted6, capacity, applied6, None, errors);
        let v1_peers: Vec<(u32, &Peer)> = (accepted.iter())
            .filter(|p| p.remaps() == Remaps::Theirs)
            .map(|p| (self.ids[&p.key], p))
            .collect();
        let peers4: Vec<_> = (v1_peers.iter())
            .map(|(id, p)| (*id, *p, &p.ipv4))
            .collect();
        let peers6: Vec<_> = (v1_peers.iter())
            .filter_map(|(id, p)| Some((*id, *p, p.ipv6.as_ref()?)))
            .collect();
        let entries4 = ip_mappings::entries(self.valid_objects(), &peers4, node4, errors);
        let entries6 = ip_mappings::entries(self.valid_objects(), &peers6, is_node6, errors);
        // IPs belong to no one peer: they get what the NatMappings left.
        let room = capacity.saturating_sub(ipv4.len());
        ipv4.extend(ip_mappings::within_room::<Ipv4Net>(
            entries4, room, applied, errors,
        ));
        let room = capacity.saturating_sub(ipv6.len());
        ipv6.extend(ip_mappings::within_room::<Ipv6Net>(
            entries6, room, applied6, errors,
        ));
        Desired { ipv4, ipv6 }
    }

    /// Every object read and found valid, with where it was read from.
    fn valid_objects(&self) -> impl Iterator<Item = (&String, &Valid)> {
        (self.origins.iter())
            .flat_map(|(origin, results)| results.iter().flatten().map(move |v| (origin, v)))
    }
}

/// A NatMapping's entries, as they are checked and keyed for its peer.
#[derive(Clone, Copy)]
struct Entries<'a> {
    mapping: &'a NatMapping,
    peer: &'a Peer,
    peer_id: u32,
}

impl Entries<'_> {
    /// One family's entries, `mappings`, as the kernel keys them: by the
    /// real address the prefix step gives the externalIP in our ExternalCIDR
    /// of `networks`, which gives the same packets with one lookup. An entry
    /// that names a node (`is_node` says which), or whose externalIP lies
    /// outside the peer's view, is rejected alone.
    fn keyed<N: Cidr>(
        self,
        mappings: &Mappings<N>,
        networks: &Networks<N>,
        is_node: impl Fn(N::Addr) -> Option<String>,
        errors: &mut BTreeSet<Rejection>,
    ) -> Vec<(MappingKey<N::Wire>, N::Wire)> {
        let field = FieldNames::of(N::IPV6).entries;
        let (tep_field, _) = networks.local_views(self.peer.layout)[1];
        let local_external = &networks.local_external;
        let mut keyed = Vec::with_capacity(mappings.entries.len());
        for (external, endpoint) in &mappings.entries {
            if let Some(what) = is_node(*endpoint) {
                let problem = MappingProblem::NodeAddress {
                    entries: field,
                    endpoint: (*endpoint).into(),
                    external: (*external).into(),
                    what,
                };
                errors.insert(self.mapping.error(problem).into());
                continue;
            }
            let Some(real) = local_external.real_of(*external) else {
                let problem = MappingProblem::OutsideExternalCidr {
                    entries: field,
                    endpoint: (*endpoint).into(),
                    external: (*external).into(),
                    cidr: local_external.seen().into(),
                    field: tep_field,
                    tunnel_endpoint: self.peer.key.clone(),
                };
                errors.insert(self.mapping.error(problem).into());
                continue;
            };
            let key = MappingKey {
                peer_id: self.peer_id,
                addr: N::Wire::from(real),
            };
            keyed.push((key, N::Wire::from(*endpoint)));
        }
        keyed
    }
}

/// The entries to program of one family's table of `capacity` entries,
/// which holds `applied`: each cluster's within its fair share. Where a
/// cluster asks for more, its conncheck entry (to `conncheck`, where the
/// family has one) is kept first, then those the kernel already holds (a
/// pass never trades a working entry for a new one); the rest are refused,
/// in one error.
fn within_shares<N: Cidr>(
    wanted: Wanted<'_, N::Wire>,
    capacity: usize,
    applied: &BTreeMap<MappingKey<N::Wire>, N::Wire>,
    conncheck: Option<N::Wire>,
    errors: &mut BTreeSet<Rejection>,
) -> BTreeMap<MappingKey<N::Wire>, N::Wire> {
    let demands: Vec<usize> = wanted.iter().map(|(_, entries)| entries.len()).collect();
    let shares = share::fair_shares(&demands, capacity);
    let mut desired = Vec::new();
    for ((mapping, mut entries), share) in wanted.into_iter().zip(shares) {
        if entries.len() > share {
            entries.sort_by_key(|(key, endpoint)| {
                (
                    Some(*endpoint) != conncheck,
                    !applied.contains_key(key),
                    *key,
                )
            });
            let problem = MappingProblem::BeyondShare {
                field: FieldNames::of(N::IPV6).entries,
                family: N::FAMILY,
                refused: entries.len() - share,
                entries: entries.len(),
                share,
                capacity,
            };
            errors.insert(mapping.error(problem).into());
            entries.truncate(share);
        }
        desired.extend(entries);
    }
    // Built at once from a sorted list, much faster than entry by entry.
    BTreeMap::from_iter(desired)
}
