//! The tunnels of a gateway, one per tunnel device, as the metrics and
//! the health check read them: one tunnel where every peer shares a
//! device, one per peer where each has its own (Liqo v1's).

use std::{
    collections::BTreeMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use super::{PeerStatus, Tunnel, TunnelCounters};
use crate::sync::Unpoisoned;

/// The running tunnels, by device.
#[derive(Default)]
pub struct TunnelSet {
    tunnels: RwLock<BTreeMap<String, Arc<Tunnel>>>,
}

impl TunnelSet {
    /// A set of the one tunnel of `device`.
    pub fn of(device: &str, tunnel: Arc<Tunnel>) -> Self {
        let set = Self::default();
        set.insert(device, tunnel);
        set
    }

    /// Adds the tunnel of `device`, or replaces it.
    pub fn insert(&self, device: &str, tunnel: Arc<Tunnel>) {
        self.tunnels
            .write()
            .unpoisoned()
            .insert(device.to_owned(), tunnel);
    }

    /// Takes out the tunnel of `device`.
    pub fn remove(&self, device: &str) -> Option<Arc<Tunnel>> {
        self.tunnels.write().unpoisoned().remove(device)
    }

    /// The state of every peer of every tunnel.
    pub fn status(&self) -> Vec<PeerStatus> {
        self.each().iter().flat_map(|t| t.status()).collect()
    }

    /// Whether every tunnel's threads run.
    pub fn healthy(&self) -> bool {
        self.each().iter().all(|t| t.healthy())
    }

    /// One of the tunnels' counters, summed over them.
    pub fn sum(&self, counter: impl Fn(&TunnelCounters) -> &AtomicU64) -> u64 {
        self.each()
            .iter()
            .map(|t| counter(t.counters()).load(Ordering::Relaxed))
            .sum()
    }

    /// The tunnels now, without holding the lock while they are read.
    fn each(&self) -> Vec<Arc<Tunnel>> {
        self.tunnels.read().unpoisoned().values().cloned().collect()
    }
}
