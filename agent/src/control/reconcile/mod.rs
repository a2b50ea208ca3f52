//! From the objects of every origin to the kernel's tables, as a diff.
//!
//! The reconciler is replayable: it keeps no history beyond which peer was
//! accepted first, and it starts from what the kernel already holds, so a
//! restarted agent that reads the same objects writes nothing.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    isolation::AllowKey,
    nat::{MappingKey, PeerNat},
    wire::{Be32, Be128},
};

mod allowed;
mod conflict;
mod ip_mappings;
mod mappings;
mod share;
mod validate;
mod views;

use conflict::Accepted;
use validate::{read_by_selection, validate};

use crate::{
    kernel::table::{
        AllowedTable, AllowedTable6, KernelTable, MappingTable, MappingTable6, MemoryTable, Mirror,
        PeerTable, PeerTable6, TableFailure,
    },
    model::{
        lease::LeaseRecord,
        liqo_v1::{Companions, Gateway, IpMapping, PeerKey, PeerNetworks},
        natmapping::NatMapping,
        node::Node,
        object::{DocumentError, Object, ObjectError, ObjectKey, ObjectKind},
        offloading::{ExportedSlice, OffloadedPod, Offloading},
        peer::Peer,
        policy::Policy,
        rejection::Rejection,
    },
};

/// What one pass changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Peer table entries written or replaced.
    pub written: usize,
    /// Peer table entries removed.
    pub removed: usize,
    /// NatMapping entries written or replaced.
    pub mappings_written: usize,
    /// NatMapping entries removed.
    pub mappings_removed: usize,
    /// Peers accepted after this pass.
    pub peers: usize,
    /// NatMapping entries in the kernel after this pass.
    pub mappings: usize,
    /// Allowed table entries written.
    pub allowed_written: usize,
    /// Allowed table entries removed.
    pub allowed_removed: usize,
    /// Allowed table entries in the kernel after this pass.
    pub allowed: usize,
    /// Objects or entries rejected (or held) after this pass.
    pub rejected: usize,
    /// Peers accepted by this pass that were not, or differed, before.
    pub added: Vec<Peer>,
    /// Peers no longer accepted.
    pub dropped: Vec<ObjectKey>,
    /// Rejections that were not reported before.
    pub new_errors: Vec<Rejection>,
    /// Rejections reported before that no longer hold.
    pub cleared_errors: Vec<Rejection>,
}

/// A document of an origin, as parsed.
pub(super) type Document = Result<Object, DocumentError>;

/// A document of an origin, validated as far as it can be alone.
enum Valid {
    Peer(Box<Peer>),
    Mapping(NatMapping),
    Node(Node),
    Pod(OffloadedPod),
    Slice(ExportedSlice),
    Offloading(Offloading),
    Lease(LeaseRecord),
    /// A Liqo v1 `Configuration`: a peer, once joined with its companions.
    V1Networks(ObjectKey, PeerNetworks),
    V1Key(PeerKey),
    V1Gateway(Gateway),
    /// A Liqo v1 `IP` the IPAM has given an address.
    V1Ip(ObjectKey, IpMapping),
}

/// An allowed table in memory: what `check` programs, and the tests'.
pub type MemoryAllowedTable = MemoryTable<AllowKey, u8>;
/// An IPv6 peer table in memory.
pub type MemoryPeerTable6 = MemoryTable<Ipv6Net, PeerNat<Be128>>;
/// An IPv6 NatMapping table in memory.
pub type MemoryMappingTable6 = MemoryTable<MappingKey<Be128>, Be128>;
/// An IPv6 allowed table in memory.
pub type MemoryAllowedTable6 = MemoryTable<AllowKey<Be128>, u8>;

/// Keeps the kernel's tables equal to what the objects describe.
pub struct Reconciler<
    P: PeerTable,
    M: MappingTable,
    A: AllowedTable = MemoryAllowedTable,
    P6: PeerTable6 = MemoryPeerTable6,
    M6: MappingTable6 = MemoryMappingTable6,
    A6: AllowedTable6 = MemoryAllowedTable6,
> {
    peer_table: Mirror<P>,
    peer6_table: Mirror<P6>,
    mapping_table: Mirror<M>,
    mapping6_table: Mirror<M6>,
    allowed_table: Mirror<A>,
    allowed6_table: Mirror<A6>,
    /// Each origin's documents, validated once when the origin changes.
    origins: BTreeMap<String, Vec<Result<Valid, Rejection>>>,
    /// Order of acceptance: a peer accepted earlier wins an overlap.
    seniority: HashMap<ObjectKey, u64>,
    next_seniority: u64,
    /// What the kernel held when this agent started: the views and rules of
    /// the peers a previous agent accepted, which keep winning after a
    /// restart.
    inherited: BTreeMap<Ipv4Net, PeerNat>,
    policy: Policy,
    ids: HashMap<ObjectKey, u32>,
    errors: BTreeSet<Rejection>,
    /// Shared, so that what follows the peers holds them without a copy,
    /// and knows an unchanged selection by its address alone.
    accepted: Arc<[Peer]>,
    nodes: Vec<Node>,
    /// The accepted peers' views, as the peer table should hold them.
    views: BTreeMap<Ipv4Net, PeerNat>,
    /// Their IPv6 views, as the IPv6 peer table should hold them.
    views6: BTreeMap<Ipv6Net, PeerNat<Be128>>,
    /// What the selection of nodes and peers rejected.
    peer_errors: BTreeSet<Rejection>,
    /// Whether an object the selection of peers reads changed since it
    /// last ran: a change of NatMappings alone (most changes, on a hub)
    /// keeps the peers as they were.
    peers_changed: bool,
    mapping_capacity: usize,
    /// Whether each Liqo v1 peer has a tunnel device of its own (the
    /// embedded tunnel's), or they would share one NAT device.
    device_per_liqo_v1_peer: bool,
}

impl<P, M, A> Reconciler<P, M, A>
where
    P: PeerTable<Error = std::io::Error>,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
{
    /// As [`Reconciler::dual_stack`], over tables in memory, the IPv6 peer
    /// table among them: what `check` and the tests program.
    pub fn new(peers: P, mappings: M, allowed: A) -> Result<Self, P::Error> {
        let ipv6 = Ipv6Tables {
            peers: MemoryPeerTable6::default(),
            mappings: MemoryMappingTable6::default(),
            allowed: MemoryAllowedTable6::default(),
        };
        Self::dual_stack(peers, mappings, allowed, ipv6)
    }
}

/// The IPv6 tables a reconciler writes beside the IPv4 ones.
pub struct Ipv6Tables<P6, M6, A6> {
    /// The peers' IPv6 networks.
    pub peers: P6,
    /// The NatMappings' IPv6 entries.
    pub mappings: M6,
    /// What segregated peers may open connections to, of our IPv6
    /// addresses.
    pub allowed: A6,
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
    /// Starts from what the tables already hold (a previous agent's work),
    /// with Liqo's default policy, writing the peers' IPv6 networks, the
    /// NatMappings' IPv6 entries and the IPv6 allowed entries to `ipv6`'s
    /// tables.
    pub fn dual_stack(
        peers: P,
        mappings: M,
        allowed: A,
        ipv6: Ipv6Tables<P6, M6, A6>,
    ) -> Result<Self, P::Error> {
        let peer_table = Mirror::new(peers)?;
        let peer6_table = Mirror::new(ipv6.peers)?;
        let mapping_table = Mirror::new(mappings)?;
        let mapping6_table = Mirror::new(ipv6.mappings)?;
        let allowed_table = Mirror::new(allowed)?;
        let allowed6_table = Mirror::new(ipv6.allowed)?;
        Ok(Self {
            inherited: peer_table.applied().clone(),
            peer_table,
            peer6_table,
            mapping_table,
            mapping6_table,
            allowed_table,
            allowed6_table,
            origins: BTreeMap::new(),
            seniority: HashMap::new(),
            next_seniority: 0,
            policy: Policy::default(),
            ids: HashMap::new(),
            errors: BTreeSet::new(),
            accepted: Arc::from([]),
            nodes: Vec::new(),
            views: BTreeMap::new(),
            views6: BTreeMap::new(),
            peer_errors: BTreeSet::new(),
            peers_changed: true,
            mapping_capacity: usize::MAX,
            device_per_liqo_v1_peer: false,
        })
    }

    /// Splits a NatMapping table of `capacity` entries fairly between the
    /// clusters: none can take the room of another's entries.
    pub fn set_mapping_capacity(&mut self, capacity: usize) {
        self.mapping_capacity = capacity;
    }

    /// Lets several Liqo v1 peers in, where each has a tunnel device of
    /// its own; otherwise one NAT device could tell only one from another.
    pub fn set_device_per_liqo_v1_peer(&mut self, own_devices: bool) {
        self.device_per_liqo_v1_peer = own_devices;
        self.peers_changed = true;
    }

    /// Replaces the documents of `origin` (a file, for the directory source),
    /// validating them now: a pass over every origin then only arbitrates.
    pub fn set_origin(&mut self, origin: String, documents: Vec<Document>) {
        let validated: Vec<_> = documents
            .into_iter()
            .filter_map(|document| validate(document, &origin))
            .collect();
        self.peers_changed |= read_by_selection(&validated);
        if let Some(old) = self.origins.insert(origin, validated) {
            self.peers_changed |= read_by_selection(&old);
        }
    }

    /// Replaces the policy; returns whether it changed, so that the caller
    /// knows a pass is due.
    pub fn set_policy(&mut self, policy: Policy) -> bool {
        let changed = policy != self.policy;
        self.policy = policy;
        self.peers_changed |= changed;
        changed
    }

    /// Forgets `origin` and everything it held.
    pub fn remove_origin(&mut self, origin: &str) {
        if let Some(old) = self.origins.remove(origin) {
            self.peers_changed |= read_by_selection(&old);
        }
    }

    /// Everything the last pass rejected or held.
    pub fn rejections(&self) -> &BTreeSet<Rejection> {
        &self.errors
    }

    /// The peers accepted by the last pass, shared: the same allocation
    /// while the selection stands.
    pub fn shared_peers(&self) -> Arc<[Peer]> {
        Arc::clone(&self.accepted)
    }

    /// The peers accepted by the last pass.
    pub fn peers(&self) -> &[Peer] {
        &self.accepted
    }

    /// The NatMapping table as last written: (peer, real externalIP) →
    /// endpointIP.
    pub fn mapping_entries(&self) -> Vec<(MappingKey, Be32)> {
        self.mapping_table
            .applied()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Every accepted peer with its ID in the kernel.
    pub fn peer_ids(&self) -> Vec<(u32, &Peer)> {
        self.accepted
            .iter()
            .filter_map(|p| Some((*self.ids.get(&p.key)?, p)))
            .collect()
    }

    /// The cluster's nodes as of the last pass, by name.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node holding the gateways' Lease, where gateways elect: the
    /// active gateway. The source reads the one Lease of the election.
    pub fn active_gateway(&self) -> Option<&str> {
        self.valid().find_map(|v| match v {
            Valid::Lease(lease) => lease.holder.as_deref(),
            _ => None,
        })
    }

    /// Brings the kernel tables in line with the current objects. Every
    /// change is attempted, in every table; the pass's report comes with
    /// the first failure, if any, so that whatever depends on the accepted
    /// peers (the tunnel, the routes) follows them whatever a table said.
    pub fn reconcile(&mut self) -> (Report, Option<TableFailure<P::Error>>) {
        let before = self.peers_changed.then(|| self.select_peers());
        let mut errors = self.peer_errors.clone();
        let accepted = &self.accepted;
        let mappings = self.select_mappings(accepted, &mut errors);
        let segregated: Vec<(u32, &Peer)> = accepted
            .iter()
            .filter(|p| p.segregated(self.policy.security_mode))
            .map(|p| (self.ids[&p.key], p))
            .collect();
        let allowed = allowed::desired(&segregated, self.valid());

        // The flag only spares lookups: between the peers' writes and the
        // mappings', a peer is translated as before its mappings changed,
        // or as after.
        let (written, removed, peer_failure) = apply_both(
            (
                &mut self.peer_table,
                &views::marking_unmapped(&self.views, &mappings.ipv4),
            ),
            (
                &mut self.peer6_table,
                &views::marking_unmapped(&self.views6, &mappings.ipv6),
            ),
        );
        let (mappings_written, mappings_removed, mapping_failure) = apply_both(
            (&mut self.mapping_table, &mappings.ipv4),
            (&mut self.mapping6_table, &mappings.ipv6),
        );
        let (allowed_written, allowed_removed, allowed_failure) = apply_both(
            (&mut self.allowed_table, &allowed.ipv4),
            (&mut self.allowed6_table, &allowed.ipv6),
        );
        let report = Report {
            written,
            removed,
            mappings_written,
            mappings_removed,
            peers: self.accepted.len(),
            mappings: self.mapping_table.applied().len() + self.mapping6_table.applied().len(),
            allowed_written,
            allowed_removed,
            allowed: self.allowed_table.applied().len() + self.allowed6_table.applied().len(),
            rejected: errors.len(),
            added: before.as_ref().map_or_else(Vec::new, |before| {
                self.accepted
                    .iter()
                    .filter(|p| !before.contains(p))
                    .cloned()
                    .collect()
            }),
            dropped: before.as_ref().map_or_else(Vec::new, |before| {
                before
                    .iter()
                    .filter(|old| !self.accepted.iter().any(|p| p.key == old.key))
                    .map(|old| old.key.clone())
                    .collect()
            }),
            new_errors: errors.difference(&self.errors).cloned().collect(),
            cleared_errors: self.errors.difference(&errors).cloned().collect(),
        };
        self.errors = errors;
        let failure = peer_failure
            .map(|source| TableFailure {
                kind: ObjectKind::TunnelEndpoint,
                full: P::is_full(&source),
                source,
            })
            .or(mapping_failure.map(|source| TableFailure {
                kind: ObjectKind::NatMapping,
                full: M::is_full(&source),
                source,
            }))
            .or(allowed_failure.map(|source| TableFailure {
                kind: ObjectKind::Pod,
                full: A::is_full(&source),
                source,
            }));
        (report, failure)
    }

    /// Selects the nodes and the peers, with their IDs and views, as the
    /// objects are now. Returns the peers accepted before.
    fn select_peers(&mut self) -> Arc<[Peer]> {
        let mut errors = BTreeSet::new();
        self.nodes = self.select_nodes(&mut errors);
        let accepted = self.select(&mut errors);
        self.seniority
            .retain(|key, _| accepted.iter().any(|p| &p.key == key));
        for peer in &accepted {
            if !self.seniority.contains_key(&peer.key) {
                self.seniority.insert(peer.key.clone(), self.next_seniority);
                self.next_seniority += 1;
            }
        }
        self.assign_ids(&accepted);
        (self.views, self.views6) = views::of(&accepted, &self.ids, self.policy.security_mode);
        self.peer_errors = errors;
        self.peers_changed = false;
        std::mem::replace(&mut self.accepted, accepted.into())
    }

    /// Every valid Node, once: where two origins define the same node,
    /// the first (in origin order) wins and the other is rejected.
    fn select_nodes(&self, errors: &mut BTreeSet<Rejection>) -> Vec<Node> {
        let mut nodes: BTreeMap<&str, (&str, &Node)> = BTreeMap::new();
        for (origin, results) in &self.origins {
            for node in results.iter().filter_map(|v| match v {
                Ok(Valid::Node(node)) => Some(node),
                _ => None,
            }) {
                if let Some((first, _)) = nodes.get(node.name.as_str()) {
                    errors.insert(Rejection::from(ObjectError {
                        origin: origin.clone(),
                        kind: ObjectKind::Node,
                        object: ObjectKey {
                            namespace: String::new(),
                            name: node.name.clone(),
                        },
                        problem: format!("field metadata.name: node already defined in {first}"),
                    }));
                    continue;
                }
                nodes.insert(&node.name, (origin, node));
            }
        }
        nodes.into_values().map(|(_, node)| node.clone()).collect()
    }

    /// Picks the peers to program among those the policy allows, senior
    /// peers first, so that a newcomer cannot displace a working peer.
    fn select(&self, errors: &mut BTreeSet<Rejection>) -> Vec<Peer> {
        let mut candidates = Vec::new();
        let companions = self.companions();
        for (origin, results) in &self.origins {
            for result in results {
                let peer = match result {
                    Ok(Valid::Peer(peer)) => Peer::clone(peer),
                    Ok(Valid::V1Networks(key, networks)) => {
                        let of_peer = companions.get(networks.cluster_id.as_str());
                        networks.peer(key, origin, of_peer.copied().unwrap_or_default())
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        errors.insert(e.clone());
                        continue;
                    }
                };
                match self.policy.check(&peer, &self.nodes) {
                    Ok(()) => candidates.push(peer),
                    Err(problem) => {
                        errors.insert(peer.error(problem).into());
                    }
                }
            }
        }
        candidates.sort_by_cached_key(|p| self.rank(p));
        let mut accepted = Accepted::new(self.device_per_liqo_v1_peer);
        for peer in candidates {
            if let Err(e) = accepted.admit(peer) {
                errors.insert(e.into());
            }
        }
        accepted.into_peers()
    }

    /// The other Liqo v1 objects of each peer, by cluster ID: the first of
    /// each kind, in origin order. Gathered in one pass over the objects,
    /// not once per Configuration.
    fn companions(&self) -> HashMap<&str, Companions<'_>> {
        let mut by_cluster: HashMap<&str, Companions<'_>> = HashMap::new();
        for valid in self.valid() {
            match valid {
                Valid::V1Key(key) => {
                    let companions = by_cluster.entry(key.cluster_id.as_str()).or_default();
                    companions.key = companions.key.or(Some(key));
                }
                Valid::V1Gateway(gateway) => {
                    let companions = by_cluster.entry(gateway.cluster_id.as_str()).or_default();
                    companions.gateway = companions.gateway.or(Some(gateway));
                }
                _ => {}
            }
        }
        by_cluster
    }

    /// Seniority, the same on every node and across restarts as far as the
    /// objects allow: created first (by the API server's timestamps), then
    /// accepted first by this agent, then held by the kernel when it
    /// started (both views, written for this very object), then by origin
    /// and name.
    fn rank(&self, p: &Peer) -> impl Ord + use<P, M, A, P6, M6, A6> {
        let accepted = self.seniority.get(&p.key).copied().unwrap_or(u64::MAX);
        let owner = p.owner();
        let inherited = p.views().iter().all(|(_, view)| {
            self.inherited
                .get(view)
                .is_some_and(|held| held.owner == owner)
        });
        (
            p.created.is_none(),
            p.created.clone(),
            accepted,
            !inherited,
            p.origin.clone(),
            p.key.clone(),
        )
    }

    /// Every valid document of every origin.
    fn valid(&self) -> impl Iterator<Item = &Valid> + Clone {
        self.origins
            .values()
            .flatten()
            .filter_map(|v| v.as_ref().ok())
    }

    /// Keeps each peer's ID; a new peer takes the ID the kernel already holds
    /// for its networks (so a restart rewrites nothing), else the lowest free.
    fn assign_ids(&mut self, accepted: &[Peer]) {
        self.ids
            .retain(|key, _| accepted.iter().any(|p| &p.key == key));
        for peer in accepted {
            if self.ids.contains_key(&peer.key) {
                continue;
            }
            let used: BTreeSet<u32> = self.ids.values().copied().collect();
            let adopted = peer
                .views()
                .iter()
                .filter_map(|(_, net)| self.peer_table.applied().get(net).map(|nat| nat.peer_id))
                .find(|id| *id != 0 && !used.contains(id));
            let id = adopted
                .unwrap_or_else(|| (1..=u32::MAX).find(|id| !used.contains(id)).unwrap_or(1));
            self.ids.insert(peer.key.clone(), id);
        }
    }
}

/// Brings one table of each family to what it should hold: the entries
/// written and removed in both, and the first failure.
fn apply_both<T4, T6>(
    (ipv4, desired4): (&mut Mirror<T4>, &BTreeMap<T4::Key, T4::Value>),
    (ipv6, desired6): (&mut Mirror<T6>, &BTreeMap<T6::Key, T6::Value>),
) -> (usize, usize, Option<T4::Error>)
where
    T4: KernelTable,
    T6: KernelTable<Error = T4::Error>,
{
    let (written4, removed4, failure4) = ipv4.apply(desired4);
    let (written6, removed6, failure6) = ipv6.apply(desired6);
    (
        written4 + written6,
        removed4 + removed6,
        failure4.or(failure6),
    )
}

#[cfg(test)]
mod tests;
