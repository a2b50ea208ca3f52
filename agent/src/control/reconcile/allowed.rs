//! The allowed table (`isthmus_common::isolation`): what each segregated
//! peer may open connections to, from what was offloaded from it and what
//! is exported to it.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use isthmus_common::{
    isolation::AllowKey,
    liqo::namespace_map_name,
    wire::{Be32, Be128},
};

use super::Valid;
use crate::model::{offloading::ExportedPort, peer::Peer};

/// The allowed tables' entries, one table per family.
#[derive(Debug, Default)]
pub(super) struct Allowed {
    pub(super) ipv4: BTreeMap<AllowKey, u8>,
    pub(super) ipv6: BTreeMap<AllowKey<Be128>, u8>,
}

impl Allowed {
    /// Opens `addr` to peer `peer_id` on `port`, in its family's table.
    fn insert(&mut self, peer_id: u32, addr: IpAddr, port: ExportedPort) {
        match addr {
            IpAddr::V4(addr) => self.ipv4.insert(key(peer_id, Be32::from(addr), port), 1),
            IpAddr::V6(addr) => self.ipv6.insert(key(peer_id, Be128::from(addr), port), 1),
        };
    }
}

/// Every entry the `segregated` peers (with their IDs) are owed by the
/// objects: each pod offloaded from a peer on any port, and each endpoint
/// of a namespace offloaded to a peer on its ports.
pub(super) fn desired<'a>(
    segregated: &[(u32, &Peer)],
    objects: impl Iterator<Item = &'a Valid> + Clone,
) -> Allowed {
    let mut allowed = Allowed::default();
    if segregated.is_empty() {
        return allowed;
    }
    let mut by_cluster: HashMap<&str, Vec<u32>> = HashMap::new();
    // A NamespaceOffloading names a peer by its NamespaceMap (Liqo v0.5
    // on) or by its cluster ID (v0.3 and v0.4).
    let mut by_status_key: HashMap<String, Vec<u32>> = HashMap::new();
    for (id, peer) in segregated {
        let Some(cluster) = peer.cluster_id.as_deref() else {
            continue;
        };
        by_cluster.entry(cluster).or_default().push(*id);
        by_status_key
            .entry(cluster.to_owned())
            .or_default()
            .push(*id);
        if let Some(name) = peer.cluster_name.as_deref() {
            let map_name = namespace_map_name(name, cluster);
            by_status_key.entry(map_name).or_default().push(*id);
        }
    }
    let mut offloaded_to: HashMap<&str, BTreeSet<u32>> = HashMap::new();
    for offloading in objects.clone().filter_map(|v| match v {
        Valid::Offloading(o) => Some(o),
        _ => None,
    }) {
        let peers = offloading
            .selected
            .iter()
            .filter_map(|key| by_status_key.get(key))
            .flatten();
        offloaded_to
            .entry(offloading.key.namespace.as_str())
            .or_default()
            .extend(peers);
    }
    for object in objects {
        match object {
            Valid::Pod(pod) => {
                for id in by_cluster
                    .get(pod.origin_cluster.as_str())
                    .into_iter()
                    .flatten()
                {
                    for addr in &pod.addresses {
                        allowed.insert(*id, *addr, ExportedPort::Any);
                    }
                }
            }
            Valid::Slice(slice) => {
                let Some(peers) = offloaded_to.get(slice.key.namespace.as_str()) else {
                    continue;
                };
                for id in peers {
                    for addr in &slice.addresses {
                        for port in &slice.ports {
                            allowed.insert(*id, *addr, *port);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    allowed
}

fn key<A: Copy>(peer_id: u32, addr: A, port: ExportedPort) -> AllowKey<A> {
    match port {
        ExportedPort::Exact { proto, port } => AllowKey::endpoint(peer_id, addr, proto, port),
        ExportedPort::Any => AllowKey::any_port(peer_id, addr),
    }
}
