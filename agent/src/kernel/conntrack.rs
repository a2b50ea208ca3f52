//! The kernel's flow tables from userspace: the masquerade's, with its
//! settings, and the flows our side opened towards segregated peers; and
//! the garbage collector that removes dead flows from both. Expiry is
//! decided here, with a clock the caller passes, so tests choose the time.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    net::Ipv4Addr,
    path::Path,
};

use aya::maps::{Array, HashMap, Map, MapData, MapError};
use isthmus_common::{
    conntrack::{DIR_IN, DIR_OUT, FlowKey, FlowNat, SnatConfig, Timeouts, reply_key},
    isolation::PeerFlow,
    names,
    wire::Be32,
};

use crate::kernel::maps::open_pinned;

/// What one collection found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Entries left (two per live flow).
    pub live: usize,
    /// Entries removed.
    pub removed: usize,
}

/// The flow table (`ist_conntrack`) and the masquerade settings (`ist_snat`).
pub struct Conntrack {
    flows: HashMap<MapData, FlowKey, FlowNat>,
    config: Array<MapData, SnatConfig>,
}

impl Conntrack {
    /// Wraps the two maps taken from a freshly loaded object.
    pub fn new(flows: Map, config: Map) -> Result<Self, MapError> {
        Ok(Self {
            flows: flows.try_into()?,
            config: config.try_into()?,
        })
    }

    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_CONNTRACK)?,
            open_pinned(root, names::MAP_SNAT)?,
        )
    }

    /// Masquerades flows that need it to `addr` (one of our own addresses),
    /// or stops masquerading.
    pub fn set_masquerade(&mut self, addr: Option<Ipv4Addr>) -> Result<(), MapError> {
        let config = SnatConfig {
            addr: addr.map_or(Be32::ZERO, Be32::from),
            enabled: u32::from(addr.is_some()),
        };
        self.config.set(0, config, 0)
    }

    /// Every entry, as the kernel holds it now.
    pub fn entries(&self) -> Result<Vec<(FlowKey, FlowNat)>, MapError> {
        self.flows.iter().collect()
    }

    /// Removes the flows dead at `now` (nanoseconds of CLOCK_MONOTONIC, the
    /// kernel's `bpf_ktime_get_ns`): both entries of a flow go together. A
    /// reply entry whose outbound entry is gone (a lost race in the kernel)
    /// goes once it is itself past its lifetime.
    pub fn collect(&mut self, now: u64, timeouts: &Timeouts) -> Result<Collected, MapError> {
        let entries: StdHashMap<FlowKey, FlowNat> = self.entries()?.into_iter().collect();
        let mut dead = Vec::new();
        let mut paired = HashSet::new();
        for (key, nat) in entries.iter().filter(|(k, _)| k.dir == DIR_OUT) {
            let reply = reply_key(key, nat);
            paired.insert(reply);
            let back = entries.get(&reply).unwrap_or(nat);
            if timeouts.expired(key.proto, nat, back, now) {
                dead.extend([*key, reply]);
            }
        }
        for (key, nat) in entries.iter().filter(|(k, _)| k.dir == DIR_IN) {
            if !paired.contains(key) && timeouts.expired(key.proto, nat, nat, now) {
                dead.push(*key);
            }
        }
        let removed = remove_all(&mut self.flows, &dead);
        Ok(Collected {
            live: entries.len() - removed,
            removed,
        })
    }
}

/// The flows our side opened towards segregated peers (`ist_peer_flows`),
/// one entry each, keyed as their replies arrive.
pub struct PeerFlows(HashMap<MapData, FlowKey, PeerFlow>);

impl PeerFlows {
    /// Wraps the map taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Ok(Self(map.try_into()?))
    }

    /// Every entry, as the kernel holds it now.
    pub fn entries(&self) -> Result<Vec<(FlowKey, PeerFlow)>, MapError> {
        self.0.iter().collect()
    }

    /// Removes the flows dead at `now`, with the conntrack's lifetimes,
    /// each direction judged by what it said.
    pub fn collect(&mut self, now: u64, timeouts: &Timeouts) -> Result<Collected, MapError> {
        let entries = self.entries()?;
        let dead: Vec<FlowKey> = entries
            .iter()
            .filter(|(key, flow)| flow.expired(key.proto, timeouts, now))
            .map(|(key, _)| *key)
            .collect();
        let removed = remove_all(&mut self.0, &dead);
        Ok(Collected {
            live: entries.len() - removed,
            removed,
        })
    }
}

/// Removes `keys` from `table`; returns how many it removed. Already gone
/// is fine: the kernel may have lost a race for an entry.
fn remove_all<V: aya::Pod>(table: &mut HashMap<MapData, FlowKey, V>, keys: &[FlowKey]) -> usize {
    keys.iter().filter(|key| table.remove(key).is_ok()).count()
}

/// The kernel's clock for conntrack timestamps: CLOCK_MONOTONIC, in ns.
pub fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
