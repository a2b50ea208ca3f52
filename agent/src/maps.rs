//! Typed views of the maps the programs share with the agent.

use std::path::Path;

use aya::maps::{LpmTrie, Map, MapData, MapError, PerCpuArray, lpm_trie::Key};
use ipnet::Ipv4Net;
use isthmus_common::{counters, names, nat::PeerNat};

use crate::{dataplane::Pins, reconcile::PeerTable};

/// The LPM trie of peer networks (`ist_nat_peers`).
pub struct PeerMap(LpmTrie<MapData, [u8; 4], PeerNat>);

impl PeerMap {
    /// Wraps the map taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Ok(Self(map.try_into()?))
    }

    /// Opens the map pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(open_pinned(root, names::MAP_PEERS)?)
    }
}

fn key(net: Ipv4Net) -> Key<[u8; 4]> {
    Key::new(u32::from(net.prefix_len()), net.network().octets())
}

impl PeerTable for PeerMap {
    type Error = MapError;

    fn entries(&self) -> Result<Vec<(Ipv4Net, PeerNat)>, MapError> {
        self.0
            .iter()
            .map(|entry| {
                let (key, nat) = entry?;
                // The kernel caps prefix lengths at the key's 32 bits.
                let len = key.prefix_len().min(32) as u8;
                let net = Ipv4Net::new(key.data().into(), len).expect("prefix length within 32");
                Ok((net, nat))
            })
            .collect()
    }

    fn put(&mut self, net: Ipv4Net, nat: &PeerNat) -> Result<(), MapError> {
        self.0.insert(&key(net), nat, 0)
    }

    fn delete(&mut self, net: Ipv4Net) -> Result<(), MapError> {
        self.0.remove(&key(net))
    }
}

/// The per-CPU packet counters (`ist_counters`).
pub struct Counters(PerCpuArray<MapData, u64>);

impl Counters {
    /// Wraps the map taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Ok(Self(map.try_into()?))
    }

    /// Opens the map pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(open_pinned(root, names::MAP_COUNTERS)?)
    }

    /// Every slot, summed over CPUs, indexed by [`counters::slot`].
    pub fn read(&self) -> Result<[u64; counters::SLOTS as usize], MapError> {
        let mut sums = [0u64; counters::SLOTS as usize];
        for (slot, sum) in sums.iter_mut().enumerate() {
            *sum = self.0.get(&(slot as u32), 0)?.iter().sum();
        }
        Ok(sums)
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counters")
    }
}

fn open_pinned(root: &Path, name: &str) -> Result<Map, MapError> {
    Map::from_map_data(MapData::from_pin(Pins::new(root).map(name))?)
}
