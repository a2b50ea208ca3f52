//! From the objects of every origin to the kernel's tables, as a diff.
//!
//! The reconciler is replayable: it keeps no history beyond which peer was
//! accepted first, and it starts from what the kernel already holds, so a
//! restarted agent that reads the same objects writes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ipnet::Ipv4Net;
use isthmus_common::nat::{MappingKey, PeerNat, wire};

use crate::{
    natmapping::{self, MappingProblem, NatMapping, NatMappingError},
    node::{Node, NodeError},
    object::{DocumentError, KIND_NAT_MAPPING, KIND_NODE, KIND_TUNNEL_ENDPOINT, Object, ObjectKey},
    peer::{Peer, PeerError, Problem},
    policy::{Policy, overlaps},
};

/// A kernel map the reconciler keeps in line with the objects: the peer
/// table, the NatMapping table, or a stand-in in tests.
pub trait KernelTable {
    /// What an entry is found by.
    type Key: Ord + Copy;
    /// What an entry holds.
    type Value: PartialEq + Copy;
    /// Failure of the underlying store.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every entry, as the store holds it now.
    fn entries(&self) -> Result<Vec<Entry<Self>>, Self::Error>;
    /// Inserts or replaces the entry for `key`.
    /// `old` is what the entry held, as the caller's mirror knows it: no
    /// store needs to read it back.
    fn put(
        &mut self,
        key: Self::Key,
        value: &Self::Value,
        old: Option<&Self::Value>,
    ) -> Result<(), Self::Error>;
    /// Removes the entry for `key`, which held `old`.
    fn delete(&mut self, key: Self::Key, old: &Self::Value) -> Result<(), Self::Error>;
}

/// One entry of a table.
pub type Entry<T> = (<T as KernelTable>::Key, <T as KernelTable>::Value);

/// A borrowed table is a table, so a caller can keep it after the reconciler.
impl<T: KernelTable> KernelTable for &mut T {
    type Key = T::Key;
    type Value = T::Value;
    type Error = T::Error;
    fn entries(&self) -> Result<Vec<Entry<T>>, T::Error> {
        (**self).entries()
    }
    fn put(
        &mut self,
        key: T::Key,
        value: &T::Value,
        old: Option<&T::Value>,
    ) -> Result<(), T::Error> {
        (**self).put(key, value, old)
    }
    fn delete(&mut self, key: T::Key, old: &T::Value) -> Result<(), T::Error> {
        (**self).delete(key, old)
    }
}

/// A table in memory: what `check` programs instead of the kernel, and
/// the tests' stand-in. It counts every write, so that a diff shows, and
/// refuses new entries beyond `capacity`, as a full map does.
#[derive(Debug)]
pub struct MemoryTable<K, V> {
    /// What it holds.
    pub entries: BTreeMap<K, V>,
    /// Entries written or removed so far.
    pub writes: usize,
    /// The most entries it takes.
    pub capacity: usize,
}

impl<K, V> Default for MemoryTable<K, V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            writes: 0,
            capacity: usize::MAX,
        }
    }
}

impl<K: Ord + Copy, V: PartialEq + Copy> KernelTable for MemoryTable<K, V> {
    type Key = K;
    type Value = V;
    type Error = std::io::Error;
    fn entries(&self) -> std::io::Result<Vec<(K, V)>> {
        Ok(self.entries.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn put(&mut self, key: K, value: &V, _old: Option<&V>) -> std::io::Result<()> {
        if !self.entries.contains_key(&key) && self.entries.len() == self.capacity {
            return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
        }
        self.entries.insert(key, *value);
        self.writes += 1;
        Ok(())
    }
    fn delete(&mut self, key: K, _old: &V) -> std::io::Result<()> {
        self.entries.remove(&key);
        self.writes += 1;
        Ok(())
    }
}

/// The peer table: a peer's network as we see it → its rules.
pub trait PeerTable: KernelTable<Key = Ipv4Net, Value = PeerNat> {}
impl<T: KernelTable<Key = Ipv4Net, Value = PeerNat>> PeerTable for T {}

/// The NatMapping table: (peer, externalIP) → endpointIP, wire order.
pub trait MappingTable: KernelTable<Key = MappingKey, Value = u32> {}
impl<T: KernelTable<Key = MappingKey, Value = u32>> MappingTable for T {}

/// A kernel table and a mirror of what it holds, so that a pass writes
/// only what changed.
pub(crate) struct Mirror<T: KernelTable> {
    table: T,
    applied: BTreeMap<T::Key, T::Value>,
}

impl<T: KernelTable> Mirror<T> {
    pub(crate) fn new(table: T) -> Result<Self, T::Error> {
        let applied = table.entries()?.into_iter().collect();
        Ok(Self { table, applied })
    }

    /// Writes new and changed entries, then removes stale ones: longest-prefix
    /// match keeps traffic flowing while both exist. A failed write (a full
    /// map) does not stop the others, and is retried on the next pass; the
    /// first failure is returned once everything was tried.
    pub(crate) fn apply(
        &mut self,
        desired: &BTreeMap<T::Key, T::Value>,
    ) -> (usize, usize, Option<T::Error>) {
        let (mut written, mut removed, mut failure) = (0, 0, None);
        for (key, value) in desired {
            let old = self.applied.get(key);
            if old != Some(value) {
                match self.table.put(*key, value, old) {
                    Ok(()) => {
                        self.applied.insert(*key, *value);
                        written += 1;
                    }
                    Err(e) => failure = failure.or(Some(e)),
                }
            }
        }
        let stale: Vec<Entry<T>> = self
            .applied
            .iter()
            .filter(|(key, _)| !desired.contains_key(key))
            .map(|(key, value)| (*key, *value))
            .collect();
        for (key, old) in stale {
            match self.table.delete(key, &old) {
                Ok(()) => {
                    self.applied.remove(&key);
                    removed += 1;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        (written, removed, failure)
    }
}

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

/// A kernel table a reconcile pass could not bring up to date; the next
/// pass tries again.
#[derive(Debug, thiserror::Error)]
#[error("the {kind} table: {source}")]
pub struct TableFailure<E: std::error::Error + 'static> {
    /// The kind of object whose table failed.
    pub kind: &'static str,
    /// What the kernel said.
    #[source]
    pub source: E,
}

/// An object, or one entry of it, that is not programmed, and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rejection {
    /// The object's kind and key; None for a document that names no object.
    pub object: Option<(&'static str, ObjectKey)>,
    /// What is wrong, naming the field, for the object's own status.
    pub problem: String,
    /// The whole message, naming the origin too, for logs.
    pub message: String,
}

impl Rejection {
    /// The object's kind and key for log fields; empty for a document that
    /// names no object.
    pub fn kind_and_key(&self) -> (&'static str, String) {
        self.object
            .as_ref()
            .map_or(("", String::new()), |(kind, key)| (*kind, key.to_string()))
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<PeerError> for Rejection {
    fn from(e: PeerError) -> Self {
        Self {
            object: Some((KIND_TUNNEL_ENDPOINT, e.object.clone())),
            problem: e.problem.to_string(),
            message: e.to_string(),
        }
    }
}

impl From<NatMappingError> for Rejection {
    fn from(e: NatMappingError) -> Self {
        Self {
            object: Some((KIND_NAT_MAPPING, e.object.clone())),
            problem: e.problem.to_string(),
            message: e.to_string(),
        }
    }
}

impl From<NodeError> for Rejection {
    fn from(e: NodeError) -> Self {
        Self {
            object: Some((KIND_NODE, e.object.clone())),
            problem: e.problem.clone(),
            message: e.to_string(),
        }
    }
}

impl From<DocumentError> for Rejection {
    fn from(e: DocumentError) -> Self {
        Self {
            object: None,
            problem: e.to_string(),
            message: e.to_string(),
        }
    }
}

/// A document of an origin, as parsed.
type Document = Result<Object, DocumentError>;

/// A document of an origin, validated as far as it can be alone.
enum Valid {
    Peer(Peer),
    Mapping(NatMapping),
    Node(Node),
}

/// Keeps the kernel's tables equal to what the objects describe.
pub struct Reconciler<P: PeerTable, M: MappingTable> {
    peer_table: Mirror<P>,
    mapping_table: Mirror<M>,
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
    accepted: Vec<Peer>,
    nodes: Vec<Node>,
}

impl<P: PeerTable, M: MappingTable<Error = P::Error>> Reconciler<P, M> {
    /// Starts from what the tables already hold (a previous agent's work),
    /// with Liqo's default policy.
    pub fn new(peers: P, mappings: M) -> Result<Self, P::Error> {
        let peer_table = Mirror::new(peers)?;
        Ok(Self {
            inherited: peer_table.applied.clone(),
            peer_table,
            mapping_table: Mirror::new(mappings)?,
            origins: BTreeMap::new(),
            seniority: HashMap::new(),
            next_seniority: 0,
            policy: Policy::default(),
            ids: HashMap::new(),
            errors: BTreeSet::new(),
            accepted: Vec::new(),
            nodes: Vec::new(),
        })
    }

    /// Replaces the documents of `origin` (a file, for the directory source),
    /// validating them now: a pass over every origin then only arbitrates.
    pub fn set_origin(&mut self, origin: String, documents: Vec<Document>) {
        let validated = documents
            .into_iter()
            .map(|document| match document {
                Err(e) => Err(e.into()),
                Ok(Object::TunnelEndpoint(raw)) => Peer::from_raw(&raw, &origin)
                    .map(Valid::Peer)
                    .map_err(Rejection::from),
                Ok(Object::NatMapping(raw)) => NatMapping::from_raw(&raw, &origin)
                    .map(Valid::Mapping)
                    .map_err(Rejection::from),
                Ok(Object::Node(raw)) => Node::from_raw(&raw, &origin)
                    .map(Valid::Node)
                    .map_err(Rejection::from),
            })
            .collect();
        self.origins.insert(origin, validated);
    }

    /// Replaces the policy; returns whether it changed, so that the caller
    /// knows a pass is due.
    pub fn set_policy(&mut self, policy: Policy) -> bool {
        let changed = policy != self.policy;
        self.policy = policy;
        changed
    }

    /// Forgets `origin` and everything it held.
    pub fn remove_origin(&mut self, origin: &str) {
        self.origins.remove(origin);
    }

    /// Everything the last pass rejected or held.
    pub fn rejections(&self) -> &BTreeSet<Rejection> {
        &self.errors
    }

    /// The peers accepted by the last pass.
    pub fn peers(&self) -> &[Peer] {
        &self.accepted
    }

    /// The NatMapping table as last written: (peer, real externalIP) →
    /// endpointIP.
    pub fn mapping_entries(&self) -> Vec<(MappingKey, u32)> {
        self.mapping_table
            .applied
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

    /// Brings the kernel tables in line with the current objects. Every
    /// change is attempted, in every table; the pass's report comes with
    /// the first failure, if any, so that whatever depends on the accepted
    /// peers (the tunnel, the routes) follows them whatever a table said.
    pub fn reconcile(&mut self) -> (Report, Option<TableFailure<P::Error>>) {
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
        let desired: BTreeMap<Ipv4Net, PeerNat> = accepted
            .iter()
            .flat_map(|peer| {
                let nat = peer.nat(self.ids[&peer.key]);
                peer.views().map(|(_, net)| (net, nat))
            })
            .collect();
        let mappings = self.select_mappings(&accepted, &mut errors);

        let (written, removed, peer_failure) = self.peer_table.apply(&desired);
        let (mappings_written, mappings_removed, mapping_failure) =
            self.mapping_table.apply(&mappings);
        let report = Report {
            written,
            removed,
            mappings_written,
            mappings_removed,
            peers: accepted.len(),
            mappings: self.mapping_table.applied.len(),
            rejected: errors.len(),
            added: accepted
                .iter()
                .filter(|p| !self.accepted.contains(p))
                .cloned()
                .collect(),
            dropped: self
                .accepted
                .iter()
                .filter(|old| !accepted.iter().any(|p| p.key == old.key))
                .map(|old| old.key.clone())
                .collect(),
            new_errors: errors.difference(&self.errors).cloned().collect(),
            cleared_errors: self.errors.difference(&errors).cloned().collect(),
        };
        self.errors = errors;
        self.accepted = accepted;
        let failure = peer_failure
            .map(|source| (KIND_TUNNEL_ENDPOINT, source))
            .or(mapping_failure.map(|source| (KIND_NAT_MAPPING, source)))
            .map(|(kind, source)| TableFailure { kind, source });
        (report, failure)
    }

    /// The NatMapping entries to program: one NatMapping per cluster, held
    /// while its cluster has no accepted TunnelEndpoint, each entry checked
    /// against our ExternalCIDR for that cluster.
    fn select_mappings(
        &self,
        accepted: &[Peer],
        errors: &mut BTreeSet<Rejection>,
    ) -> BTreeMap<MappingKey, u32> {
        let candidates = self.origins.values().flatten().filter_map(|v| match v {
            Ok(Valid::Mapping(m)) => Some(m),
            _ => None,
        });
        let (kept, duplicates) = natmapping::one_per_cluster(candidates);
        errors.extend(duplicates.into_iter().map(Rejection::from));
        let mut desired = BTreeMap::new();
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
            for (external, endpoint) in &mapping.entries {
                // The kernel keys the entry by the real address the prefix
                // step gives it: the same packets, with one lookup.
                let Some(real) = peer.local_external.real_of(*external) else {
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
                    addr: wire(real.octets()),
                };
                desired.insert(key, wire(endpoint.octets()));
            }
        }
        desired
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
                    errors.insert(Rejection::from(NodeError {
                        origin: origin.clone(),
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
        for result in self.origins.values().flatten() {
            match result {
                Ok(Valid::Peer(peer)) => match self.policy.check(peer, &self.nodes) {
                    Ok(()) => candidates.push(peer.clone()),
                    Err(problem) => {
                        errors.insert(PeerError::new(&peer.origin, &peer.key, problem).into());
                    }
                },
                Ok(Valid::Mapping(_) | Valid::Node(_)) => {}
                Err(e) => {
                    errors.insert(e.clone());
                }
            }
        }
        candidates.sort_by_cached_key(|p| self.rank(p));
        let mut accepted: Vec<Peer> = Vec::new();
        for peer in candidates {
            match conflict(&peer, &accepted) {
                Some(e) => {
                    errors.insert(e.into());
                }
                None => accepted.push(peer),
            }
        }
        accepted
    }

    /// Seniority, the same on every node and across restarts as far as the
    /// objects allow: created first (by the API server's timestamps), then
    /// accepted first by this agent, then held by the kernel when it
    /// started, then by origin and name.
    fn rank(&self, p: &Peer) -> impl Ord + use<P, M> {
        let accepted = self.seniority.get(&p.key).copied().unwrap_or(u64::MAX);
        let inherited = p.views().iter().all(|(_, view)| {
            self.inherited.get(view).is_some_and(|held| {
                PeerNat {
                    peer_id: held.peer_id,
                    ..p.nat(0)
                } == *held
            })
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
                .filter_map(|(_, net)| self.peer_table.applied.get(net).map(|nat| nat.peer_id))
                .find(|id| *id != 0 && !used.contains(id));
            let id = adopted.unwrap_or_else(|| (1..).find(|id| !used.contains(id)).unwrap_or(1));
            self.ids.insert(peer.key.clone(), id);
        }
    }
}

/// Why `peer` cannot join `accepted`, if it cannot.
fn conflict(peer: &Peer, accepted: &[Peer]) -> Option<PeerError> {
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
fn view_mismatch(mapping: &NatMapping, peer: &Peer) -> Option<MappingProblem> {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{object::parse_documents, policy::Protected};

    fn messages(rejections: &[Rejection]) -> Vec<&str> {
        rejections.iter().map(|r| r.message.as_str()).collect()
    }

    type Peers = MemoryTable<Ipv4Net, PeerNat>;
    type Mappings = MemoryTable<MappingKey, u32>;

    /// A reconciler over `peers` and a NatMapping table of its own.
    fn reconciler(peers: &mut Peers) -> Reconciler<&mut Peers, Mappings> {
        Reconciler::new(peers, Mappings::default()).unwrap()
    }

    fn tep(name: &str, remote_pod: &str, remote_ext: &str) -> String {
        format!(
            "apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata: {{name: {name}, namespace: liqo-tenant-x}}\nspec:\n  localPodCIDR: 10.244.0.0/24\n  localNATPodCIDR: 10.0.40.0/24\n  localExternalCIDR: 192.168.0.0/24\n  localNATExternalCIDR: None\n  remotePodCIDR: 10.244.0.0/24\n  remoteNATPodCIDR: {remote_pod}\n  remoteExternalCIDR: 192.168.0.0/24\n  remoteNATExternalCIDR: {remote_ext}\n"
        )
    }

    fn docs(file: &str, yaml: &str) -> Vec<Document> {
        parse_documents(Path::new(file), yaml)
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn programs_both_views_of_each_peer() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        r.set_origin(
            "b.yaml".into(),
            docs("b.yaml", &tep("b", "10.0.0.0/24", "10.0.1.0/24")),
        );
        let report = r.reconcile().0;
        assert_eq!((report.written, report.removed, report.peers), (2, 0, 1));
        drop(r);
        assert_eq!(
            table.entries.keys().copied().collect::<Vec<_>>(),
            [net("10.0.0.0/24"), net("10.0.1.0/24")]
        );
        assert_eq!(table.entries[&net("10.0.0.0/24")].peer_id, 1);
    }

    #[test]
    fn a_change_touches_only_that_peer() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        for i in 0..50 {
            let file = format!("p{i}.yaml");
            let yaml = tep(
                &format!("p{i}"),
                &format!("10.{i}.0.0/24"),
                &format!("10.{}.1.0/24", i),
            );
            r.set_origin(file.clone(), docs(&file, &yaml));
        }
        assert_eq!(r.reconcile().0.written, 100);
        r.set_origin(
            "p7.yaml".into(),
            docs("p7.yaml", &tep("p7", "10.7.0.0/24", "10.99.1.0/24")),
        );
        let report = r.reconcile().0;
        assert_eq!((report.written, report.removed), (1, 1));
        r.remove_origin("p8.yaml");
        let report = r.reconcile().0;
        assert_eq!((report.written, report.removed, report.peers), (0, 2, 49));
    }

    #[test]
    fn overlap_rejects_the_newcomer_and_keeps_the_rest() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        r.set_origin(
            "z.yaml".into(),
            docs("z.yaml", &tep("z", "10.0.0.0/24", "10.0.1.0/24")),
        );
        r.reconcile();
        // Sorts before z.yaml, but z was accepted first and keeps its networks.
        r.set_origin(
            "a.yaml".into(),
            docs("a.yaml", &tep("a", "10.9.0.0/24", "10.0.0.0/24")),
        );
        let report = r.reconcile().0;
        assert_eq!((report.written, report.peers, report.rejected), (0, 1, 1));
        assert_eq!(
            messages(&report.new_errors),
            [
                "a.yaml: TunnelEndpoint liqo-tenant-x/a: field remoteNATExternalCIDR (10.0.0.0/24) overlaps field remoteNATPodCIDR (10.0.0.0/24) of TunnelEndpoint liqo-tenant-x/z in z.yaml"
            ]
        );
        // The same error is not reported twice.
        assert!(r.reconcile().0.new_errors.is_empty());
        // Once z goes, a is accepted.
        r.remove_origin("z.yaml");
        let report = r.reconcile().0;
        assert_eq!(
            (report.peers, report.rejected, report.cleared_errors.len()),
            (1, 0, 1)
        );
    }

    #[test]
    fn a_peer_whose_two_views_overlap_is_rejected() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        r.set_origin(
            "s.yaml".into(),
            docs("s.yaml", &tep("s", "10.0.1.0/24", "10.0.1.0/24")),
        );
        let report = r.reconcile().0;
        assert_eq!(report.peers, 0);
        assert!(report.new_errors[0].message.contains("field remoteNATExternalCIDR (10.0.1.0/24) overlaps field remoteNATPodCIDR (10.0.1.0/24) of TunnelEndpoint liqo-tenant-x/s"), "{:?}", report.new_errors);
    }

    #[test]
    fn bad_document_does_not_disturb_other_peers() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        r.set_origin(
            "good.yaml".into(),
            docs("good.yaml", &tep("good", "10.0.0.0/24", "10.0.1.0/24")),
        );
        r.set_origin(
            "bad.yaml".into(),
            docs("bad.yaml", &tep("bad", "10.5.0.0/99", "10.0.9.0/24")),
        );
        let report = r.reconcile().0;
        assert_eq!((report.peers, report.rejected, report.written), (1, 1, 2));
        assert!(
            report.new_errors[0]
                .message
                .starts_with("bad.yaml: TunnelEndpoint liqo-tenant-x/bad: field remoteNATPodCIDR")
        );
        // Attributed to its object, so the object's status and events can say it.
        let bad = ObjectKey {
            namespace: "liqo-tenant-x".into(),
            name: "bad".into(),
        };
        assert_eq!(
            report.new_errors[0].object,
            Some((KIND_TUNNEL_ENDPOINT, bad))
        );
        assert!(
            report.new_errors[0]
                .problem
                .starts_with("field remoteNATPodCIDR")
        );
    }

    #[test]
    fn a_full_natmapping_table_still_lets_peers_come_and_go() {
        let mut peers = Peers::default();
        let mut mappings = Mappings {
            capacity: 0,
            ..Mappings::default()
        };
        let mut r = Reconciler::new(&mut peers, &mut mappings).unwrap();
        let b = with_cluster_id(tep("b", "10.0.0.0/24", "10.0.1.0/24"), "cluster-b");
        let c = with_cluster_id(tep("c", "10.0.2.0/24", "10.0.3.0/24"), "cluster-c");
        let entry = [("10.1.0.5".to_owned(), "192.168.0.45".to_owned())];
        r.set_origin("b.yaml".into(), docs("b.yaml", &b));
        r.set_origin("c.yaml".into(), docs("c.yaml", &c));
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &natmapping("cluster-b", &entry)),
        );
        let (report, failure) = r.reconcile();
        assert_eq!(failure.map(|f| f.kind), Some(KIND_NAT_MAPPING));
        assert_eq!((report.peers, report.written), (2, 4));
        // c goes while the NatMapping table is still full: the report
        // says so, for the tunnel and the routes to follow.
        r.remove_origin("c.yaml");
        let (report, failure) = r.reconcile();
        assert!(failure.is_some(), "the NatMapping entry still does not fit");
        assert_eq!(
            report.dropped,
            [ObjectKey {
                namespace: "liqo-tenant-x".into(),
                name: "c".into()
            }]
        );
        assert_eq!(r.peers().len(), 1);
        assert_eq!(report.removed, 2);
    }

    #[test]
    fn a_restart_that_reads_the_same_objects_writes_nothing() {
        let mut table = Peers::default();
        let yaml = format!(
            "{}---\n{}",
            tep("b", "10.0.0.0/24", "10.0.1.0/24"),
            tep("c", "10.3.0.0/24", "10.3.1.0/24")
        );
        {
            let mut r = reconciler(&mut table);
            r.set_origin("x.yaml".into(), docs("x.yaml", &yaml));
            r.reconcile();
        }
        // Reverse the acceptance order: adopted IDs still match the kernel.
        let writes = table.writes;
        let mut r = reconciler(&mut table);
        let swapped = format!(
            "{}---\n{}",
            tep("c", "10.3.0.0/24", "10.3.1.0/24"),
            tep("b", "10.0.0.0/24", "10.0.1.0/24")
        );
        r.set_origin("x.yaml".into(), docs("x.yaml", &swapped));
        let report = r.reconcile().0;
        assert_eq!((report.written, report.removed), (0, 0));
        drop(r);
        assert_eq!(table.writes, writes);
    }

    /// `tep` with a tunnel to `endpoint` with `key` (a byte repeated), of
    /// cluster `cluster`, created at `created` if given.
    fn tep_of(
        name: &str,
        views: (&str, &str),
        tunnel: (&str, u8),
        cluster: &str,
        created: Option<&str>,
    ) -> String {
        let key = crate::tunnel::key::encode(&[tunnel.1; 32]);
        let mut yaml = tep(name, views.0, views.1);
        if let Some(at) = created {
            yaml = yaml.replace(
                "namespace: liqo-tenant-x}",
                &format!("namespace: liqo-tenant-x, creationTimestamp: \"{at}\"}}"),
            );
        }
        format!(
            "{yaml}  clusterID: {cluster}\n  endpointIP: {}\n  backend_config: {{publicKey: \"{key}\"}}\n",
            tunnel.0
        )
    }

    #[test]
    fn a_second_peer_with_a_taken_key_or_cluster_is_rejected_naming_the_first() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        let first = tep_of(
            "b",
            ("10.0.0.0/24", "10.0.1.0/24"),
            ("203.0.113.2", 1),
            "cluster-b",
            None,
        );
        r.set_origin("b.yaml".into(), docs("b.yaml", &first));
        r.reconcile();
        let same_key = tep_of(
            "k",
            ("10.0.2.0/24", "10.0.3.0/24"),
            ("203.0.113.7", 1),
            "cluster-k",
            None,
        );
        let same_cluster = tep_of(
            "c",
            ("10.0.4.0/24", "10.0.5.0/24"),
            ("203.0.113.8", 2),
            "cluster-b",
            None,
        );
        r.set_origin("k.yaml".into(), docs("k.yaml", &same_key));
        r.set_origin("c.yaml".into(), docs("c.yaml", &same_cluster));
        let report = r.reconcile().0;
        assert_eq!((report.peers, report.rejected), (1, 2));
        assert_eq!(
            messages(&report.new_errors),
            [
                "c.yaml: TunnelEndpoint liqo-tenant-x/c: field clusterID: cluster cluster-b already has TunnelEndpoint liqo-tenant-x/b in b.yaml",
                "k.yaml: TunnelEndpoint liqo-tenant-x/k: field backend_config.publicKey: the same key as TunnelEndpoint liqo-tenant-x/b in b.yaml",
            ]
        );
    }

    #[test]
    fn a_view_may_hold_no_wireguard_endpoint() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        // Its own endpoint in its own view: its handshakes would enter the tunnel.
        let own = tep_of(
            "o",
            ("10.0.0.0/24", "203.0.113.0/24"),
            ("203.0.113.2", 1),
            "cluster-o",
            None,
        );
        r.set_origin("o.yaml".into(), docs("o.yaml", &own));
        let report = r.reconcile().0;
        assert_eq!(
            messages(&report.new_errors),
            [
                "o.yaml: TunnelEndpoint liqo-tenant-x/o: field remoteNATExternalCIDR (203.0.113.0/24) holds endpointIP 203.0.113.2 of TunnelEndpoint liqo-tenant-x/o in o.yaml: its WireGuard traffic would be routed into a tunnel"
            ]
        );
        let b = tep_of(
            "b",
            ("10.0.0.0/24", "10.0.1.0/24"),
            ("198.51.100.2", 2),
            "cluster-b",
            None,
        );
        r.set_origin("o.yaml".into(), docs("o.yaml", &b));
        r.reconcile();
        // Another's endpoint in a newcomer's view, and the reverse.
        let over_b = tep_of(
            "v",
            ("10.0.2.0/24", "198.51.100.0/24"),
            ("203.0.113.9", 3),
            "cluster-v",
            None,
        );
        let under_b = tep_of(
            "u",
            ("10.0.4.0/24", "10.0.5.0/24"),
            ("10.0.1.7", 4),
            "cluster-u",
            None,
        );
        r.set_origin("v.yaml".into(), docs("v.yaml", &over_b));
        r.set_origin("u.yaml".into(), docs("u.yaml", &under_b));
        let report = r.reconcile().0;
        assert_eq!(report.peers, 1);
        assert_eq!(
            messages(&report.new_errors),
            [
                "u.yaml: TunnelEndpoint liqo-tenant-x/u: field endpointIP (10.0.1.7) lies in field remoteNATExternalCIDR (10.0.1.0/24) of TunnelEndpoint liqo-tenant-x/b in o.yaml: its WireGuard traffic would be routed into a tunnel",
                "v.yaml: TunnelEndpoint liqo-tenant-x/v: field remoteNATExternalCIDR (198.51.100.0/24) holds endpointIP 198.51.100.2 of TunnelEndpoint liqo-tenant-x/b in o.yaml: its WireGuard traffic would be routed into a tunnel",
            ]
        );
    }

    #[test]
    fn the_policy_and_the_nodes_pod_cidrs_bound_every_view() {
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        r.set_origin(
            "nodes.yaml".into(),
            docs(
                "nodes.yaml",
                "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {podCIDR: 10.244.0.0/25}\nstatus: {addresses: [{type: InternalIP, address: 172.16.1.2}]}\n",
            ),
        );
        let everything = tep("all", "None", "None")
            .replace("remotePodCIDR: 10.244.0.0/24", "remotePodCIDR: 0.0.0.0/1")
            .replace(
                "remoteExternalCIDR: 192.168.0.0/24",
                "remoteExternalCIDR: 128.0.0.0/1",
            );
        let our_pods = tep("p", "10.244.0.0/24", "10.0.1.0/24");
        let lan = tep("l", "10.0.0.0/24", "172.16.1.0/24");
        r.set_origin("all.yaml".into(), docs("all.yaml", &everything));
        r.set_origin("p.yaml".into(), docs("p.yaml", &our_pods));
        r.set_origin("l.yaml".into(), docs("l.yaml", &lan));
        let report = r.reconcile().0;
        assert_eq!(
            report.peers, 1,
            "only l passes: the LAN is not protected yet"
        );
        assert_eq!(
            messages(&report.new_errors),
            [
                "all.yaml: TunnelEndpoint liqo-tenant-x/all: field remotePodCIDR: 0.0.0.0/1 is wider than /8 (--min-view-prefix)",
                "p.yaml: TunnelEndpoint liqo-tenant-x/p: field remoteNATPodCIDR: 10.244.0.0/24 touches the PodCIDR 10.244.0.0/25 of node n1; no peer may use it",
            ]
        );
        let lan_protected = Policy {
            protected: vec![Protected {
                net: net("172.16.1.0/24"),
                what: "the network of lan0 (172.16.1.2/24)".into(),
            }],
            ..Policy::default()
        };
        assert!(r.set_policy(lan_protected.clone()));
        assert!(!r.set_policy(lan_protected));
        let report = r.reconcile().0;
        assert_eq!((report.peers, report.removed), (0, 2));
        drop(r);
        assert!(table.entries.is_empty(), "the kernel still holds a view");
    }

    #[test]
    fn the_first_created_wins_on_any_node_and_a_restart_keeps_the_winner() {
        // Two peers claiming 10.0.0.0/24; y's file sorts first.
        let x = tep_of(
            "x",
            ("10.0.0.0/24", "10.0.1.0/24"),
            ("203.0.113.2", 1),
            "cluster-x",
            Some("2024-05-01T10:00:00Z"),
        );
        let y = tep_of(
            "y",
            ("10.0.0.0/24", "10.0.9.0/24"),
            ("203.0.113.3", 2),
            "cluster-y",
            Some("2024-05-02T10:00:00Z"),
        );
        let mut table = Peers::default();
        let mut r = reconciler(&mut table);
        r.set_origin("b.yaml".into(), docs("b.yaml", &x));
        r.set_origin("a.yaml".into(), docs("a.yaml", &y));
        assert_eq!(r.reconcile().0.added[0].key.name, "x");
        drop(r);
        // Without timestamps, a restarted agent keeps what the kernel
        // holds, although y's file now sorts first.
        let strip = |yaml: &str| {
            yaml.replace(", creationTimestamp: \"2024-05-01T10:00:00Z\"", "")
                .replace(", creationTimestamp: \"2024-05-02T10:00:00Z\"", "")
        };
        let writes = table.writes;
        let mut r = reconciler(&mut table);
        r.set_origin("b.yaml".into(), docs("b.yaml", &strip(&x)));
        r.set_origin("a.yaml".into(), docs("a.yaml", &strip(&y)));
        let report = r.reconcile().0;
        assert_eq!(
            report
                .added
                .iter()
                .map(|p| p.key.name.as_str())
                .collect::<Vec<_>>(),
            ["x"]
        );
        assert_eq!((report.written, report.removed), (0, 0));
        drop(r);
        assert_eq!(table.writes, writes);
    }

    fn natmapping(cluster: &str, entries: &[(String, String)]) -> String {
        let mut yaml = format!(
            "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata: {{name: nm-{cluster}}}\nspec:\n  clusterID: {cluster}\n  clusterMappings:\n"
        );
        for (endpoint, external) in entries {
            yaml.push_str(&format!("    {endpoint}: {external}\n"));
        }
        yaml
    }

    fn with_cluster_id(yaml: String, id: &str) -> String {
        yaml.replace("spec:\n", &format!("spec:\n  clusterID: {id}\n"))
    }

    fn mapping_key(peer_id: u32, external: [u8; 4]) -> MappingKey {
        MappingKey {
            peer_id,
            addr: wire(external),
        }
    }

    #[test]
    fn a_natmapping_is_held_until_its_cluster_has_a_tunnel_endpoint() {
        let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
        let mut r = Reconciler::new(&mut peers, &mut mappings).unwrap();
        let entry = [("10.1.0.5".to_owned(), "192.168.0.45".to_owned())];
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &natmapping("cluster-a", &entry)),
        );
        let report = r.reconcile().0;
        assert_eq!((report.mappings, report.rejected), (0, 1));
        assert_eq!(
            messages(&report.new_errors),
            [
                "nm.yaml: NatMapping nm-cluster-a: field spec.clusterID: cluster cluster-a has no TunnelEndpoint yet; its mappings are held until one appears"
            ]
        );
        let tep_a = with_cluster_id(tep("a", "10.0.40.0/24", "10.0.41.0/24"), "cluster-a");
        r.set_origin("a.yaml".into(), docs("a.yaml", &tep_a));
        let report = r.reconcile().0;
        assert_eq!(
            (
                report.mappings,
                report.mappings_written,
                report.cleared_errors.len()
            ),
            (1, 1, 1)
        );
        drop(r);
        assert_eq!(
            mappings.entries.into_iter().collect::<Vec<_>>(),
            [(mapping_key(1, [192, 168, 0, 45]), wire([10, 1, 0, 5]))]
        );
    }

    #[test]
    fn an_external_ip_outside_our_external_cidr_is_rejected_alone() {
        let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
        let mut r = Reconciler::new(&mut peers, &mut mappings).unwrap();
        let tep_a = with_cluster_id(tep("a", "10.0.40.0/24", "10.0.41.0/24"), "cluster-a");
        r.set_origin("a.yaml".into(), docs("a.yaml", &tep_a));
        let entries = [
            ("10.1.0.5".to_owned(), "192.168.0.45".to_owned()),
            ("10.1.0.6".to_owned(), "192.168.7.46".to_owned()),
        ];
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &natmapping("cluster-a", &entries)),
        );
        let report = r.reconcile().0;
        assert_eq!(report.mappings, 1);
        assert_eq!(
            messages(&report.new_errors),
            [
                "nm.yaml: NatMapping nm-cluster-a: field spec.clusterMappings.10.1.0.6: externalIP 192.168.7.46 lies outside 192.168.0.0/24, our ExternalCIDR as the peer sees it (localExternalCIDR of TunnelEndpoint liqo-tenant-x/a)"
            ]
        );
    }

    /// The hub case: the peer remapped our ExternalCIDR, and Liqo's IPAM
    /// writes the values in that view (DESIGN §1, "NatMapping").
    #[test]
    fn values_in_the_peers_view_of_our_external_cidr_reach_the_kernel_as_real_addresses() {
        let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
        let mut r = Reconciler::new(&mut peers, &mut mappings).unwrap();
        let tep_a = with_cluster_id(tep("a", "10.0.40.0/24", "10.0.41.0/24"), "cluster-a").replace(
            "localNATExternalCIDR: None",
            "localNATExternalCIDR: 10.0.1.0/24",
        );
        r.set_origin("a.yaml".into(), docs("a.yaml", &tep_a));
        let liqo = |pod: &str, external: &str, entries: &str| {
            format!(
                "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata:\n  generateName: natmapping-\n  name: natmapping-x7k2p\n  labels: {{net.liqo.io/natmapping: \"true\", clusterID: cluster-a}}\nspec:\n  clusterID: cluster-a\n  podCIDR: {pod}\n  externalCIDR: {external}\n  clusterMappings:\n{entries}"
            )
        };
        let entries =
            "    10.1.0.5: 10.0.1.45\n    169.254.0.1: 10.0.1.1\n    10.1.0.6: 192.168.0.46\n";
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &liqo("10.0.40.0/24", "10.0.1.0/24", entries)),
        );
        let report = r.reconcile().0;
        assert_eq!(report.mappings, 2);
        assert_eq!(
            messages(&report.new_errors),
            [
                "nm.yaml: NatMapping natmapping-x7k2p: field spec.clusterMappings.10.1.0.6: externalIP 192.168.0.46 lies outside 10.0.1.0/24, our ExternalCIDR as the peer sees it (localNATExternalCIDR of TunnelEndpoint liqo-tenant-x/a)"
            ]
        );
        // A NatMapping written for other views is refused whole.
        for (pod, external, field, found) in [
            (
                "10.0.40.0/24",
                "192.168.0.0/24",
                "externalCIDR",
                "192.168.0.0/24",
            ),
            ("10.0.50.0/24", "10.0.1.0/24", "podCIDR", "10.0.50.0/24"),
        ] {
            r.set_origin(
                "nm.yaml".into(),
                docs("nm.yaml", &liqo(pod, external, entries)),
            );
            let report = r.reconcile().0;
            assert_eq!(report.mappings, 0);
            assert!(
                messages(&report.new_errors)
                    .iter()
                    .any(|m| m.contains(&format!("field spec.{field}: {found} is not "))),
                "{:?}",
                messages(&report.new_errors)
            );
        }
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &liqo("10.0.40.0/24", "10.0.1.0/24", entries)),
        );
        r.reconcile();
        drop(r);
        assert_eq!(
            mappings.entries.into_iter().collect::<Vec<_>>(),
            [
                (mapping_key(1, [192, 168, 0, 1]), wire([169, 254, 0, 1])),
                (mapping_key(1, [192, 168, 0, 45]), wire([10, 1, 0, 5]))
            ]
        );
    }

    #[test]
    fn one_changed_entry_of_ten_thousand_touches_one_element() {
        let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
        let mut r = Reconciler::new(&mut peers, &mut mappings).unwrap();
        // A /16 ExternalCIDR, so that 10,000 externalIPs fit in it.
        let tep_a = tep("a", "10.0.40.0/24", "10.0.41.0/24").replace(
            "localExternalCIDR: 192.168.0.0/24",
            "localExternalCIDR: 192.168.0.0/16",
        );
        r.set_origin(
            "a.yaml".into(),
            docs("a.yaml", &with_cluster_id(tep_a, "cluster-a")),
        );
        let mut entries: Vec<(String, String)> = (0..10_000u32)
            .map(|i| {
                (
                    format!("10.2.{}.{}", i / 256, i % 256),
                    format!("192.168.{}.{}", i / 256, i % 256),
                )
            })
            .collect();
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &natmapping("cluster-a", &entries)),
        );
        let report = r.reconcile().0;
        assert_eq!((report.mappings, report.mappings_written), (10_000, 10_000));
        entries[4321].0 = "10.3.0.1".into();
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &natmapping("cluster-a", &entries)),
        );
        let report = r.reconcile().0;
        assert_eq!(
            (
                report.mappings_written,
                report.mappings_removed,
                report.written
            ),
            (1, 0, 0)
        );
        entries.remove(17);
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &natmapping("cluster-a", &entries)),
        );
        let report = r.reconcile().0;
        assert_eq!((report.mappings_written, report.mappings_removed), (0, 1));
        drop(r);
        assert_eq!(mappings.writes, 10_002);
        assert_eq!(
            mappings.entries[&mapping_key(1, [192, 168, 16, 225])],
            wire([10, 3, 0, 1])
        );
    }
}
