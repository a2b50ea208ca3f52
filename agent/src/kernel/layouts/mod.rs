//! The layouts of the pinned maps' entries, by version, and how an entry
//! of one layout becomes an entry of the next: what lets a new agent keep
//! the flows and tables a previous one pinned, across an upgrade that
//! changed what an entry holds.
//!
//! Each pinned map records its layout's version in [`names::MAP_LAYOUTS`],
//! a hash of map name → version that the agent writes once its maps are
//! in place. A map pinned before versions were recorded has the newest
//! layout of its sizes. A layout change that keeps the sizes must
//! therefore come with a new version here, and a map's version is never
//! taken back.

use std::path::Path;

use aya::maps::{HashMap, Map, MapData, MapError, MapType};
use isthmus_common::{
    conntrack::{FlowKey, FlowNat, TcpState},
    counters, names,
    room::OWNER_LOCAL,
    wire::Be32,
};
use tracing::warn;

/// A map's shape, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `bpf_map_type`.
    pub map_type: u32,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// Capacity.
    pub max_entries: u32,
    /// `BPF_F_*` creation flags, such as whether entries are preallocated.
    pub map_flags: u32,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "type {}, key {} B, value {} B, {} entries, flags {:#x}",
            self.map_type, self.key_size, self.value_size, self.max_entries, self.map_flags
        )
    }
}

/// The shape of `map`.
pub fn shape_of(map: &MapData) -> Result<Shape, MapError> {
    let info = map.info()?;
    Ok(Shape {
        map_type: info.map_type()? as u32,
        key_size: info.key_size(),
        value_size: info.value_size(),
        max_entries: info.max_entries(),
        map_flags: info.map_flags(),
    })
}

/// Whether a map of `map_type` is a hash, whose entries can be copied one
/// by one into a map of another capacity.
fn is_hash(map_type: u32) -> bool {
    [MapType::Hash, MapType::LruHash, MapType::LpmTrie]
        .iter()
        .any(|t| *t as u32 == map_type)
}

/// A failed system call on a pin, as aya reports one.
pub(super) fn io(io_error: std::io::Error) -> aya::sys::SyscallError {
    aya::sys::SyscallError {
        call: "bpf",
        io_error,
    }
}

/// Turns an entry (key, value) of the layout before into one of this.
pub type Upgrade = fn(&[u8], &[u8]) -> (Vec<u8>, Vec<u8>);

/// One layout of a map's entries.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Its version: 1 for the first.
    pub version: u32,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// How an entry of the version before becomes one of this; None for
    /// the first.
    pub upgrade: Option<Upgrade>,
    /// For an array whose slots keep their places as it grows: its length
    /// in this layout. A later layout then reads it slot for slot.
    pub slots: Option<u32>,
}

/// The conntrack's layouts: version 2 charges each flow to an owner.
const CONNTRACK: [Layout; 2] = [
    Layout {
        version: 1,
        key_size: 16,
        value_size: 16,
        upgrade: None,
        slots: None,
    },
    Layout {
        version: 2,
        key_size: size_of::<FlowKey>() as u32,
        value_size: size_of::<FlowNat>() as u32,
        upgrade: Some(conntrack_owners),
        slots: None,
    },
];

/// The NAT counters' layouts: version 2 counts IPv6's drop reasons after
/// the blocks of version 1, whose slots stay where they were.
const COUNTERS: [Layout; 2] = [
    Layout {
        version: 1,
        key_size: 4,
        value_size: 8,
        upgrade: None,
        slots: Some(counters::BLOCK_SLOTS),
    },
    Layout {
        version: 2,
        key_size: 4,
        value_size: 8,
        upgrade: Some(same_entry),
        slots: Some(counters::SLOTS),
    },
];

/// An entry that keeps its key and value: a counter in its slot.
fn same_entry(key: &[u8], value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (key.to_vec(), value.to_vec())
}

/// The layouts map `name`'s entries have had, oldest first: the last is
/// this agent's, of `current` shape. A map whose layout never changed has
/// one.
pub fn history(name: &str, current: &Shape) -> Vec<Layout> {
    match name {
        names::MAP_CONNTRACK => CONNTRACK.to_vec(),
        names::MAP_COUNTERS => COUNTERS.to_vec(),
        _ => vec![Layout {
            version: 1,
            key_size: current.key_size,
            value_size: current.value_size,
            upgrade: None,
            slots: None,
        }],
    }
}

/// This agent's version of map `name`'s layout.
pub fn current_version(name: &str, current: &Shape) -> u32 {
    history(name, current).last().map_or(1, |l| l.version)
}

/// What becomes of a pinned map.
#[derive(Debug)]
pub enum Plan {
    /// Its layout and shape are this agent's: reused as it is.
    Keep,
    /// Its entries are copied into a new map, each through `upgrades` in
    /// turn (none when only the capacity or the flags changed).
    Migrate(Vec<Upgrade>),
    /// Unpinned, to be created anew, empty: nothing says how to read it.
    Replace,
}

/// The plan for a pinned map of shape `found`, whose recorded layout is
/// `recorded` (None if none was), where this agent creates `wanted` with
/// the layouts of `history`.
pub fn plan(found: &Shape, recorded: Option<u32>, wanted: &Shape, history: &[Layout]) -> Plan {
    let sizes = |l: &&Layout| {
        l.key_size == found.key_size
            && l.value_size == found.value_size
            && l.slots.is_none_or(|slots| slots == found.max_entries)
    };
    let layout = match recorded {
        Some(version) => history.iter().find(|l| l.version == version).filter(sizes),
        None => history.iter().rev().find(sizes),
    };
    let Some(from) = layout else {
        return Plan::Replace;
    };
    if found.map_type != wanted.map_type {
        return Plan::Replace;
    }
    let later = history.iter().filter(|l| l.version > from.version);
    let Some(upgrades) = later.map(|l| l.upgrade).collect::<Option<Vec<Upgrade>>>() else {
        return Plan::Replace;
    };
    match (
        upgrades.is_empty() && found == wanted,
        is_hash(found.map_type) || from.slots.is_some(),
    ) {
        (true, _) => Plan::Keep,
        (false, true) => Plan::Migrate(upgrades),
        // An array's length or layout is its meaning, unless its history
        // says its slots keep their places.
        (false, false) => Plan::Replace,
    }
}

/// Conntrack, version 1 to 2: the value gains the owner its flow is
/// charged to, and whether the flow was answered takes the padding byte.
/// Nothing says whose a carried-over flow was: it counts as the gateway's
/// own, which has no share of its own to exceed, until it ends. It counts
/// as answered unless it is a TCP connection still opening, so that no
/// established flow is the first evicted.
fn conntrack_owners(key: &[u8], value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut old = [0u8; 16];
    let len = value.len().min(old.len());
    old[..len].copy_from_slice(&value[..len]);
    let [a0, a1, a2, a3, p0, p1, state, _pad, t @ ..] = old;
    let next = FlowNat {
        addr: Be32::from_bytes([a0, a1, a2, a3]),
        port: u16::from_ne_bytes([p0, p1]),
        state,
        answered: u8::from(TcpState::from_u8(state) != TcpState::Syn),
        owner: OWNER_LOCAL,
        pad: 0,
        last_seen: u64::from_ne_bytes(t),
    };
    (key.to_vec(), pod_bytes(&next).to_vec())
}

/// The bytes of a map value.
fn pod_bytes<T: aya::Pod>(value: &T) -> &[u8] {
    // SAFETY: a `Pod` map type is plain bytes, alive as long as the slice.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(value).cast(), size_of::<T>()) }
}

/// The versions the pinned maps' layouts have: [`names::MAP_LAYOUTS`].
pub struct Registry {
    map: HashMap<MapData, [u8; 16], u32>,
}

/// The shape of the registry: a hash of names (15 bytes and a NUL) to
/// versions. It never changes.
const REGISTRY_SHAPE: Shape = Shape {
    map_type: aya::maps::MapType::Hash as u32,
    key_size: 16,
    value_size: 4,
    max_entries: 128,
    map_flags: 0,
};

impl Registry {
    /// The registry pinned at `path`, created and pinned if there is none
    /// (or one of another shape, which no agent writes).
    pub fn open(path: &Path) -> Result<Self, MapError> {
        if path.exists() {
            let pinned = MapData::from_pin(path)?;
            if shape_of(&pinned)? == REGISTRY_SHAPE {
                return Self::of(pinned);
            }
            warn!(path = %path.display(), "the registry of map layouts has another shape: created anew");
            std::fs::remove_file(path).map_err(|e| MapError::SyscallError(io(e)))?;
        }
        let obj = aya_obj::Map::new_from_params(
            REGISTRY_SHAPE.map_type,
            REGISTRY_SHAPE.key_size,
            REGISTRY_SHAPE.value_size,
            REGISTRY_SHAPE.max_entries,
            REGISTRY_SHAPE.map_flags,
        );
        let created = MapData::create(obj, names::MAP_LAYOUTS, None)?;
        created.pin(path).map_err(|error| MapError::PinError {
            name: Some(names::MAP_LAYOUTS.to_owned()),
            error,
        })?;
        Self::of(created)
    }

    fn of(map: MapData) -> Result<Self, MapError> {
        Ok(Self {
            map: HashMap::try_from(Map::from_map_data(map)?)?,
        })
    }

    /// The version recorded for map `name`, if any.
    pub fn recorded(&self, name: &str) -> Option<u32> {
        self.map.get(&key(name), 0).ok()
    }

    /// Records `version` for map `name`.
    pub fn record(&mut self, name: &str, version: u32) -> Result<(), MapError> {
        self.map.insert(key(name), version, 0)
    }
}

/// A map's name as the registry's key: its bytes, NUL-padded.
fn key(name: &str) -> [u8; 16] {
    let mut key = [0u8; 16];
    let len = name.len().min(15);
    key[..len].copy_from_slice(&name.as_bytes()[..len]);
    key
}

#[cfg(test)]
mod tests;
