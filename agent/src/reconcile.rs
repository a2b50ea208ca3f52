//! From the objects of every origin to the kernel's peer table, as a diff.
//!
//! The reconciler is replayable: it keeps no history beyond which peer was
//! accepted first, and it starts from what the kernel already holds, so a
//! restarted agent that reads the same objects writes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ipnet::Ipv4Net;
use isthmus_common::nat::PeerNat;

use crate::{
    object::{DocumentError, Object, ObjectKey},
    peer::{Peer, PeerError, Problem},
};

/// Where the kernel keeps peers: the peer table, or a stand-in in tests.
pub trait PeerTable {
    /// Failure of the underlying store.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every entry, as the store holds it now.
    fn entries(&self) -> Result<Vec<(Ipv4Net, PeerNat)>, Self::Error>;
    /// Inserts or replaces the entry for `net`.
    fn put(&mut self, net: Ipv4Net, nat: &PeerNat) -> Result<(), Self::Error>;
    /// Removes the entry for `net`.
    fn delete(&mut self, net: Ipv4Net) -> Result<(), Self::Error>;
}

/// What one pass changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Entries written or replaced.
    pub written: usize,
    /// Entries removed.
    pub removed: usize,
    /// Peers accepted after this pass.
    pub peers: usize,
    /// Objects rejected after this pass.
    pub rejected: usize,
    /// Peers accepted by this pass that were not, or differed, before.
    pub added: Vec<Peer>,
    /// Peers no longer accepted.
    pub dropped: Vec<ObjectKey>,
    /// Rejections that were not reported before.
    pub new_errors: Vec<String>,
    /// Rejections reported before that no longer hold.
    pub cleared_errors: Vec<String>,
}

/// A document of an origin, as parsed.
type Document = Result<Object, DocumentError>;

/// Keeps the kernel's peer table equal to the peers the objects describe.
pub struct Reconciler<T> {
    table: T,
    /// Each origin's documents, validated once when the origin changes.
    origins: BTreeMap<String, Vec<Result<Peer, String>>>,
    /// Order of acceptance: a peer accepted earlier wins an overlap.
    seniority: HashMap<ObjectKey, u64>,
    next_seniority: u64,
    ids: HashMap<ObjectKey, u32>,
    /// Mirror of the kernel table.
    applied: BTreeMap<Ipv4Net, PeerNat>,
    errors: BTreeSet<String>,
    accepted: Vec<Peer>,
}

impl<T: PeerTable> Reconciler<T> {
    /// Starts from what `table` already holds (a previous agent's work).
    pub fn new(table: T) -> Result<Self, T::Error> {
        let applied = table.entries()?.into_iter().collect();
        Ok(Self {
            table,
            origins: BTreeMap::new(),
            seniority: HashMap::new(),
            next_seniority: 0,
            ids: HashMap::new(),
            applied,
            errors: BTreeSet::new(),
            accepted: Vec::new(),
        })
    }

    /// Replaces the documents of `origin` (a file, for the directory source),
    /// validating them now: a pass over every origin then only arbitrates.
    pub fn set_origin(&mut self, origin: String, documents: Vec<Document>) {
        let validated = documents
            .into_iter()
            .map(|document| match document {
                Err(e) => Err(e.to_string()),
                Ok(Object::TunnelEndpoint(raw)) => {
                    Peer::from_raw(&raw, &origin).map_err(|e| e.to_string())
                }
            })
            .collect();
        self.origins.insert(origin, validated);
    }

    /// Forgets `origin` and everything it held.
    pub fn remove_origin(&mut self, origin: &str) {
        self.origins.remove(origin);
    }

    /// The peers accepted by the last pass.
    pub fn peers(&self) -> &[Peer] {
        &self.accepted
    }

    /// Brings the kernel table in line with the current objects.
    pub fn reconcile(&mut self) -> Result<Report, T::Error> {
        let (accepted, errors) = self.select();
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

        let mut report = self.apply(desired)?;
        report.peers = accepted.len();
        report.rejected = errors.len();
        report.new_errors = errors.difference(&self.errors).cloned().collect();
        report.cleared_errors = self.errors.difference(&errors).cloned().collect();
        report.added = accepted
            .iter()
            .filter(|p| !self.accepted.contains(p))
            .cloned()
            .collect();
        report.dropped = self
            .accepted
            .iter()
            .filter(|old| !accepted.iter().any(|p| p.key == old.key))
            .map(|old| old.key.clone())
            .collect();
        self.errors = errors;
        self.accepted = accepted;
        Ok(report)
    }

    /// Validates every object and picks the peers to program: senior peers
    /// first, so a newcomer cannot displace a working peer.
    fn select(&self) -> (Vec<Peer>, BTreeSet<String>) {
        let mut errors = BTreeSet::new();
        let mut candidates = Vec::new();
        for result in self.origins.values().flatten() {
            match result {
                Ok(peer) => candidates.push(peer.clone()),
                Err(e) => {
                    errors.insert(e.clone());
                }
            }
        }
        candidates.sort_by_key(|p| {
            let rank = self.seniority.get(&p.key).copied().unwrap_or(u64::MAX);
            (rank, p.origin.clone(), p.key.clone())
        });

        let mut accepted: Vec<Peer> = Vec::new();
        for peer in candidates {
            match conflict(&peer, &accepted) {
                Some(e) => {
                    errors.insert(e.to_string());
                }
                None => accepted.push(peer),
            }
        }
        (accepted, errors)
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
                .filter_map(|(_, net)| self.applied.get(net).map(|nat| nat.peer_id))
                .find(|id| *id != 0 && !used.contains(id));
            let id = adopted.unwrap_or_else(|| (1..).find(|id| !used.contains(id)).unwrap_or(1));
            self.ids.insert(peer.key.clone(), id);
        }
    }

    /// Writes new and changed entries, then removes stale ones: longest-prefix
    /// match keeps traffic flowing while both exist.
    fn apply(&mut self, desired: BTreeMap<Ipv4Net, PeerNat>) -> Result<Report, T::Error> {
        let mut report = Report::default();
        for (net, nat) in &desired {
            if self.applied.get(net) != Some(nat) {
                self.table.put(*net, nat)?;
                self.applied.insert(*net, *nat);
                report.written += 1;
            }
        }
        let stale: Vec<Ipv4Net> = self
            .applied
            .keys()
            .filter(|net| !desired.contains_key(net))
            .copied()
            .collect();
        for net in stale {
            self.table.delete(net)?;
            self.applied.remove(&net);
            report.removed += 1;
        }
        Ok(report)
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

fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, path::Path};

    use super::*;
    use crate::object::parse_documents;

    /// The kernel table stand-in: counts every write so tests can see diffs.
    #[derive(Default)]
    struct Table {
        entries: BTreeMap<Ipv4Net, PeerNat>,
        writes: usize,
    }

    impl PeerTable for &mut Table {
        type Error = Infallible;
        fn entries(&self) -> Result<Vec<(Ipv4Net, PeerNat)>, Infallible> {
            Ok(self.entries.iter().map(|(k, v)| (*k, *v)).collect())
        }
        fn put(&mut self, net: Ipv4Net, nat: &PeerNat) -> Result<(), Infallible> {
            self.entries.insert(net, *nat);
            self.writes += 1;
            Ok(())
        }
        fn delete(&mut self, net: Ipv4Net) -> Result<(), Infallible> {
            self.entries.remove(&net);
            self.writes += 1;
            Ok(())
        }
    }

    fn tep(name: &str, remote_pod: &str, remote_ext: &str) -> String {
        format!(
            "apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata: {{name: {name}, namespace: liqo}}\nspec:\n  localPodCIDR: 10.244.0.0/24\n  localNATPodCIDR: 10.0.40.0/24\n  localExternalCIDR: 192.168.0.0/24\n  localNATExternalCIDR: None\n  remotePodCIDR: 10.244.0.0/24\n  remoteNATPodCIDR: {remote_pod}\n  remoteExternalCIDR: 192.168.0.0/24\n  remoteNATExternalCIDR: {remote_ext}\n"
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
        let mut table = Table::default();
        let mut r = Reconciler::new(&mut table).unwrap();
        r.set_origin(
            "b.yaml".into(),
            docs("b.yaml", &tep("b", "10.0.0.0/24", "10.0.1.0/24")),
        );
        let report = r.reconcile().unwrap();
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
        let mut table = Table::default();
        let mut r = Reconciler::new(&mut table).unwrap();
        for i in 0..50 {
            let file = format!("p{i}.yaml");
            let yaml = tep(
                &format!("p{i}"),
                &format!("10.{i}.0.0/24"),
                &format!("10.{}.1.0/24", i),
            );
            r.set_origin(file.clone(), docs(&file, &yaml));
        }
        assert_eq!(r.reconcile().unwrap().written, 100);
        r.set_origin(
            "p7.yaml".into(),
            docs("p7.yaml", &tep("p7", "10.7.0.0/24", "10.99.1.0/24")),
        );
        let report = r.reconcile().unwrap();
        assert_eq!((report.written, report.removed), (1, 1));
        r.remove_origin("p8.yaml");
        let report = r.reconcile().unwrap();
        assert_eq!((report.written, report.removed, report.peers), (0, 2, 49));
    }

    #[test]
    fn overlap_rejects_the_newcomer_and_keeps_the_rest() {
        let mut table = Table::default();
        let mut r = Reconciler::new(&mut table).unwrap();
        r.set_origin(
            "z.yaml".into(),
            docs("z.yaml", &tep("z", "10.0.0.0/24", "10.0.1.0/24")),
        );
        r.reconcile().unwrap();
        // Sorts before z.yaml, but z was accepted first and keeps its networks.
        r.set_origin(
            "a.yaml".into(),
            docs("a.yaml", &tep("a", "10.9.0.0/24", "10.0.0.0/24")),
        );
        let report = r.reconcile().unwrap();
        assert_eq!((report.written, report.peers, report.rejected), (0, 1, 1));
        assert_eq!(
            report.new_errors,
            [
                "a.yaml: TunnelEndpoint liqo/a: field remoteNATExternalCIDR (10.0.0.0/24) overlaps field remoteNATPodCIDR (10.0.0.0/24) of TunnelEndpoint liqo/z in z.yaml"
            ]
        );
        // The same error is not reported twice.
        assert!(r.reconcile().unwrap().new_errors.is_empty());
        // Once z goes, a is accepted.
        r.remove_origin("z.yaml");
        let report = r.reconcile().unwrap();
        assert_eq!(
            (report.peers, report.rejected, report.cleared_errors.len()),
            (1, 0, 1)
        );
    }

    #[test]
    fn a_peer_whose_two_views_overlap_is_rejected() {
        let mut table = Table::default();
        let mut r = Reconciler::new(&mut table).unwrap();
        r.set_origin(
            "s.yaml".into(),
            docs("s.yaml", &tep("s", "10.0.1.0/24", "10.0.1.0/24")),
        );
        let report = r.reconcile().unwrap();
        assert_eq!(report.peers, 0);
        assert!(report.new_errors[0].contains("field remoteNATExternalCIDR (10.0.1.0/24) overlaps field remoteNATPodCIDR (10.0.1.0/24) of TunnelEndpoint liqo/s"), "{:?}", report.new_errors);
    }

    #[test]
    fn bad_document_does_not_disturb_other_peers() {
        let mut table = Table::default();
        let mut r = Reconciler::new(&mut table).unwrap();
        r.set_origin(
            "good.yaml".into(),
            docs("good.yaml", &tep("good", "10.0.0.0/24", "10.0.1.0/24")),
        );
        r.set_origin(
            "bad.yaml".into(),
            docs("bad.yaml", &tep("bad", "10.5.0.0/99", "10.0.9.0/24")),
        );
        let report = r.reconcile().unwrap();
        assert_eq!((report.peers, report.rejected, report.written), (1, 1, 2));
        assert!(
            report.new_errors[0]
                .starts_with("bad.yaml: TunnelEndpoint liqo/bad: field remoteNATPodCIDR")
        );
    }

    #[test]
    fn a_restart_that_reads_the_same_objects_writes_nothing() {
        let mut table = Table::default();
        let yaml = format!(
            "{}---\n{}",
            tep("b", "10.0.0.0/24", "10.0.1.0/24"),
            tep("c", "10.3.0.0/24", "10.3.1.0/24")
        );
        {
            let mut r = Reconciler::new(&mut table).unwrap();
            r.set_origin("x.yaml".into(), docs("x.yaml", &yaml));
            r.reconcile().unwrap();
        }
        // Reverse the acceptance order: adopted IDs still match the kernel.
        let writes = table.writes;
        let mut r = Reconciler::new(&mut table).unwrap();
        let swapped = format!(
            "{}---\n{}",
            tep("c", "10.3.0.0/24", "10.3.1.0/24"),
            tep("b", "10.0.0.0/24", "10.0.1.0/24")
        );
        r.set_origin("x.yaml".into(), docs("x.yaml", &swapped));
        let report = r.reconcile().unwrap();
        assert_eq!((report.written, report.removed), (0, 0));
        drop(r);
        assert_eq!(table.writes, writes);
    }
}
