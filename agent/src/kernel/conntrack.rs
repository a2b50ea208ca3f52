//! The masquerade's flow table from userspace: its settings, and the
//! garbage collector that removes dead flows. Expiry is decided here, with
//! a clock the caller passes, so tests choose the time.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    net::Ipv4Addr,
    path::Path,
};

use aya::maps::{Array, HashMap, Map, MapData, MapError};
use isthmus_common::{
    conntrack::{DIR_IN, DIR_OUT, FlowKey, FlowNat, SnatConfig, Timeouts, reply_key},
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
        let mut removed = 0;
        for key in &dead {
            // Already gone is fine: the kernel may have lost a race for it.
            if self.flows.remove(key).is_ok() {
                removed += 1;
            }
        }
        Ok(Collected {
            live: entries.len() - removed,
            removed,
        })
    }
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
