//! Typed views of the maps the programs share with the agent.

use std::path::Path;

use std::collections::BTreeMap;

use aya::maps::{
    Array, HashMap, Map, MapData, MapError, PerCpuArray,
    lpm_trie::{Key, LpmTrie},
};
use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    counters,
    guard::{GuardSource, VERDICTS},
    names,
    nat::{MappingKey, PeerKey},
    overlay::{EVENTS, OverlayConfig},
    pins::Pins,
    room::{ALL_PEERS, FLOW_TABLES, FlowTable, OWNER_LOCAL, Room, slot},
    wire::{Be16, Be32, Be128},
};

use crate::{
    kernel::{pinned, table::KernelTable},
    model::cidr::Cidr,
};

/// One family's NatMapping tables (`ist_natmap` and its reverse
/// `ist_natmap_rev`, or `ist_natmap6` and `ist_natmap_rev6`), kept
/// consistent: every forward entry has its reverse.
pub struct MappingMap<A = Be32> {
    forward: HashMap<MapData, MappingKey<A>, A>,
    reverse: HashMap<MapData, MappingKey<A>, A>,
}

/// The IPv6 NatMapping tables.
pub type MappingMap6 = MappingMap<Be128>;

impl<A: aya::Pod + Eq> MappingMap<A>
where
    MappingKey<A>: aya::Pod,
{
    /// Wraps the two maps taken from a freshly loaded object.
    pub fn new(forward: Map, reverse: Map) -> Result<Self, MapError> {
        Ok(Self {
            forward: forward.try_into()?,
            reverse: reverse.try_into()?,
        })
    }

    /// Removes the reverse entry of `endpoint` if it still names `external`:
    /// an endpoint that moved to another externalIP keeps its new one.
    fn drop_reverse(&mut self, peer_id: u32, endpoint: A, external: A) -> Result<(), MapError> {
        let key = MappingKey {
            peer_id,
            addr: endpoint,
        };
        match self.reverse.get(&key, 0) {
            Ok(current) if current == external => self.reverse.remove(&key),
            _ => Ok(()),
        }
    }
}

impl MappingMap {
    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_NATMAP)?,
            open_pinned(root, names::MAP_NATMAP_REV)?,
        )
    }
}

impl<A: aya::Pod + Eq + Ord> KernelTable for MappingMap<A>
where
    MappingKey<A>: aya::Pod + Ord,
{
    type Key = MappingKey<A>;
    type Value = A;
    type Error = MapError;
    fn is_full(error: &MapError) -> bool {
        is_full(error)
    }

    fn entries(&self) -> Result<Vec<(MappingKey<A>, A)>, MapError> {
        self.forward.iter().collect()
    }

    /// Writes the reverse entry first: a reply must never find a forward
    /// entry without the way back.
    fn put(&mut self, key: MappingKey<A>, endpoint: &A, old: Option<&A>) -> Result<(), MapError> {
        let reverse = MappingKey {
            peer_id: key.peer_id,
            addr: *endpoint,
        };
        self.reverse.insert(reverse, key.addr, 0)?;
        self.forward.insert(key, endpoint, 0)?;
        match old {
            Some(&old) if old != *endpoint => self.drop_reverse(key.peer_id, old, key.addr),
            _ => Ok(()),
        }
    }

    fn delete(&mut self, key: MappingKey<A>, endpoint: &A) -> Result<(), MapError> {
        gone_is_fine(self.forward.remove(&key))?;
        self.drop_reverse(key.peer_id, *endpoint, key.addr)
    }
}

/// A hash of keys to a byte: 1 where it is used as a set. The guard's
/// tables.
pub struct ByteHash<K: aya::Pod>(HashMap<MapData, K, u8>);

impl<K: aya::Pod> ByteHash<K> {
    /// Wraps a map taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Ok(Self(map.try_into()?))
    }
}

impl<K: aya::Pod + Ord> KernelTable for ByteHash<K> {
    type Key = K;
    type Value = u8;
    type Error = MapError;
    fn is_full(error: &MapError) -> bool {
        is_full(error)
    }

    fn entries(&self) -> Result<Vec<(K, u8)>, MapError> {
        self.0.iter().collect()
    }

    fn put(&mut self, key: K, value: &u8, _old: Option<&u8>) -> Result<(), MapError> {
        self.0.insert(key, value, 0)
    }

    fn delete(&mut self, key: K, _old: &u8) -> Result<(), MapError> {
        gone_is_fine(self.0.remove(&key))
    }
}

/// The tunnel devices that each carry one Liqo v1 peer (`ist_peer_devs`,
/// and `ist_peer_devs6` for the peers' IPv6 networks): ifindex → the key
/// of that peer's PodCIDR view in the peer table of each family.
pub struct PeerDevices {
    ipv4: DeviceTable<Ipv4Net>,
    ipv6: DeviceTable<Ipv6Net>,
}

/// One family's table of the tunnel devices of Liqo v1 peers.
type DeviceTable<N> = HashMap<MapData, u32, PeerKey<<N as Cidr>::Wire>>;

impl PeerDevices {
    /// Wraps the maps of each family taken from a freshly loaded object.
    pub fn new(ipv4: Map, ipv6: Map) -> Result<Self, MapError> {
        Ok(Self {
            ipv4: ipv4.try_into()?,
            ipv6: ipv6.try_into()?,
        })
    }

    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_PEER_DEVS)?,
            open_pinned(root, names::MAP_PEER_DEVS6)?,
        )
    }

    /// Each device's ifindex, with the IPv4 view that names its peer.
    pub fn entries(&self) -> Result<BTreeMap<u32, Ipv4Net>, MapError> {
        entries_of(&self.ipv4)
    }

    /// Each device's ifindex, with the IPv6 view that names its peer.
    pub fn entries6(&self) -> Result<BTreeMap<u32, Ipv6Net>, MapError> {
        entries_of(&self.ipv6)
    }

    /// Makes the tables hold exactly `wanted` and `wanted6`: device
    /// ifindex → the view of each family that names its peer in that
    /// family's peer table.
    pub fn sync(
        &mut self,
        wanted: &BTreeMap<u32, Ipv4Net>,
        wanted6: &BTreeMap<u32, Ipv6Net>,
    ) -> Result<(), MapError> {
        sync_table(&mut self.ipv4, wanted)?;
        sync_table(&mut self.ipv6, wanted6)
    }
}

fn entries_of<N: Cidr>(table: &DeviceTable<N>) -> Result<BTreeMap<u32, N>, MapError>
where
    PeerKey<N::Wire>: aya::Pod,
{
    table
        .iter()
        .map(|entry| {
            let (ifindex, key) = entry?;
            Ok((ifindex, N::from_wire(key.addr, key.prefix_len as u8)))
        })
        .collect()
}

fn sync_table<N: Cidr>(
    table: &mut DeviceTable<N>,
    wanted: &BTreeMap<u32, N>,
) -> Result<(), MapError>
where
    PeerKey<N::Wire>: aya::Pod + PartialEq,
{
    let held: Vec<u32> = table.keys().collect::<Result<_, _>>()?;
    for ifindex in held.iter().filter(|i| !wanted.contains_key(i)) {
        gone_is_fine(table.remove(ifindex))?;
    }
    for (ifindex, view) in wanted {
        let key = PeerKey::of(view.wire(), view.prefix());
        if table.get(ifindex, 0).ok() != Some(key) {
            table.insert(ifindex, key, 0)?;
        }
    }
    Ok(())
}

/// The XDP guard's tables: the sources that may reach the tunnel's ports,
/// our peers' session indexes, and the ports.
pub struct GuardMaps {
    /// Allowed IPv4 sources (`ist_guard_src`).
    pub sources: ByteHash<GuardSource>,
    /// Allowed IPv6 sources (`ist_guard_src6`).
    pub sources6: ByteHash<GuardSource<Be128>>,
    /// Our peers' session indexes (`ist_guard_idx`).
    pub indexes: ByteHash<u32>,
    /// The tunnel's ports, each with its [`Initiations`] (`ist_guard_ports`).
    ///
    /// [`Initiations`]: isthmus_common::guard::Initiations
    pub ports: ByteHash<Be16>,
}

/// An LPM trie of prefixes of one family (IPv4's unless `N` says): the
/// cluster's other nodes (`ist_nodes`, PodCIDR → node address), or the
/// destinations that take the stack (`ist_stack_dsts`, `ist_stack_dsts6`,
/// prefix → 1).
pub struct PrefixTrie<V: aya::Pod, N: Cidr = Ipv4Net>(LpmTrie<MapData, N::Wire, V>)
where
    N::Wire: aya::Pod;

/// The cluster's other nodes (`ist_nodes`): PodCIDR → node address.
pub type NodeMap = PrefixTrie<Be32>;

impl<V: aya::Pod, N: Cidr> PrefixTrie<V, N>
where
    N::Wire: aya::Pod,
{
    /// Wraps the map taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Ok(Self(map.try_into()?))
    }
}

impl NodeMap {
    /// Opens the map pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(open_pinned(root, names::MAP_NODES)?)
    }
}

/// The trie key of `net`.
fn prefix_key<N: Cidr>(net: N) -> Key<N::Wire>
where
    N::Wire: aya::Pod,
{
    Key::new(u32::from(net.prefix()), net.wire())
}

impl<V: aya::Pod + PartialEq, N: Cidr + Ord> KernelTable for PrefixTrie<V, N>
where
    N::Wire: aya::Pod,
{
    type Key = N;
    type Value = V;
    type Error = MapError;
    fn is_full(error: &MapError) -> bool {
        is_full(error)
    }

    fn entries(&self) -> Result<Vec<(N, V)>, MapError> {
        self.0
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                Ok((N::from_wire(key.data(), key.prefix_len() as u8), value))
            })
            .collect()
    }

    fn put(&mut self, net: N, value: &V, _old: Option<&V>) -> Result<(), MapError> {
        self.0.insert(&prefix_key(net), value, 0)
    }

    fn delete(&mut self, net: N, _old: &V) -> Result<(), MapError> {
        gone_is_fine(self.0.remove(&prefix_key(net)))
    }
}

/// The overlay's settings (`ist_overlay`).
pub struct OverlaySettings(Array<MapData, OverlayConfig>);

impl OverlaySettings {
    /// Wraps the map taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Ok(Self(map.try_into()?))
    }

    /// Opens the map pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(open_pinned(root, names::MAP_OVERLAY)?)
    }

    /// The settings as the map holds them (all zero before any agent ran).
    pub fn get(&self) -> Result<OverlayConfig, MapError> {
        self.0.get(&0, 0)
    }

    /// Replaces the settings.
    pub fn set(&mut self, config: OverlayConfig) -> Result<(), MapError> {
        self.0.set(0, config, 0)
    }
}

/// A removal that found nothing removed what it wanted: `ENOENT` is success.
pub(crate) fn gone_is_fine(removal: Result<(), MapError>) -> Result<(), MapError> {
    match removal {
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// The overlay's maps.
pub struct OverlayMaps {
    /// Its settings.
    pub settings: OverlaySettings,
    /// The other nodes' PodCIDRs.
    pub nodes: NodeMap,
    /// Every node's address: the outer sources it takes packets from.
    pub addresses: ByteHash<Be32>,
    /// Every node's IPv6 address: where no peer's packet may lead.
    pub addresses6: ByteHash<Be128>,
    /// The destinations whose packets take the stack while others forward
    /// past netfilter.
    pub stack_destinations: PrefixTrie<u8>,
    /// The same, for IPv6.
    pub stack_destinations6: PrefixTrie<u8, Ipv6Net>,
}

/// Whether `error` is a write refused because the map is full.
pub fn is_full(error: &MapError) -> bool {
    matches!(error, MapError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// Per-CPU packet counters: the NAT's (`ist_counters`) or the guard's
/// (`ist_guard_stats`).
pub struct Counters {
    map: PerCpuArray<MapData, u64>,
    slots: u32,
}

impl Counters {
    /// Wraps the NAT's counters taken from a freshly loaded object.
    pub fn new(map: Map) -> Result<Self, MapError> {
        Self::with_slots(map, counters::SLOTS)
    }

    /// Wraps the guard's verdict counters taken from a freshly loaded object.
    pub fn guard(map: Map) -> Result<Self, MapError> {
        Self::with_slots(map, VERDICTS.len() as u32)
    }

    /// Wraps the overlay's event counters taken from a freshly loaded object.
    pub fn overlay(map: Map) -> Result<Self, MapError> {
        Self::with_slots(map, EVENTS.len() as u32)
    }

    /// Wraps the counters of peers' denied packets taken from a freshly
    /// loaded object.
    pub fn denied(map: Map) -> Result<Self, MapError> {
        Self::with_slots(map, counters::DENY_SLOTS)
    }

    fn with_slots(map: Map, slots: u32) -> Result<Self, MapError> {
        Ok(Self {
            map: map.try_into()?,
            slots,
        })
    }

    /// Opens the NAT's counters pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(open_pinned(root, names::MAP_COUNTERS)?)
    }

    /// Opens the guard's verdict counters pinned under `root`.
    pub fn open_guard(root: &Path) -> Result<Self, MapError> {
        Self::guard(open_pinned(root, names::MAP_GUARD_STATS)?)
    }

    /// Opens the counters of peers' denied packets pinned under `root`.
    pub fn open_denied(root: &Path) -> Result<Self, MapError> {
        Self::denied(open_pinned(root, names::MAP_PEER_DENIED)?)
    }

    /// Opens the overlay's event counters pinned under `root`.
    pub fn open_overlay(root: &Path) -> Result<Self, MapError> {
        Self::overlay(open_pinned(root, names::MAP_OVERLAY_STATS)?)
    }

    /// Every slot, summed over CPUs, in slot order.
    pub fn read(&self) -> Result<Vec<u64>, MapError> {
        (0..self.slots).map(|slot| self.slot(slot)).collect()
    }

    /// One slot, summed over CPUs: one system call, where [`Counters::read`]
    /// makes one per slot.
    pub fn slot(&self, slot: u32) -> Result<u64, MapError> {
        Ok(self.map.get(&slot, 0)?.iter().sum())
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counters")
    }
}

/// Opens map `name` pinned under `root`.
pub fn open_pinned(root: &Path, name: &str) -> Result<Map, MapError> {
    Map::from_map_data(MapData::from_pin(Pins::new(root).map(name))?)
}

/// How full one pinned map is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// The map's name.
    pub map: &'static str,
    /// Entries in use; an array's slots always are.
    pub entries: u32,
    /// The most it can hold.
    pub capacity: u32,
}

/// Every map the agent pins, opened once, to be counted on request.
pub struct PinnedMaps {
    maps: Vec<(&'static str, MapData)>,
    rooms: Array<MapData, Room>,
}

impl PinnedMaps {
    /// Opens every map of [`names::MAPS`] pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        let pins = Pins::new(root);
        Ok(Self {
            maps: names::MAPS
                .iter()
                .map(|name| Ok((*name, MapData::from_pin(pins.map(name))?)))
                .collect::<Result<_, MapError>>()?,
            rooms: open_pinned(root, names::MAP_ROOM)?.try_into()?,
        })
    }

    /// How full each map is now. A flow table holds what the kernel charged
    /// its owners, less what the collector gave back, read in one lookup
    /// each: walking a million flows would cost more than collecting them.
    /// The keys of other hash maps and tries are walked from userspace,
    /// never from the packet path, which takes no lock for it.
    pub fn occupancy(&self) -> Result<Vec<Occupancy>, MapError> {
        self.maps
            .iter()
            .map(|(map, data)| {
                let info = data.info()?;
                let capacity = info.max_entries();
                let entries = match (flow_table(map), info.map_type()?) {
                    (Some(table), _) => self.held(table)?.min(u64::from(capacity)) as u32,
                    (None, aya::maps::MapType::Array | aya::maps::MapType::PerCpuArray) => capacity,
                    // Entries that come and go meanwhile may be missed or
                    // seen twice; the walk stops at twice the capacity.
                    _ => pinned::walk(data, info.key_size(), capacity.saturating_mul(2), |_| ())?,
                };
                Ok(Occupancy {
                    map,
                    entries,
                    capacity,
                })
            })
            .collect()
    }

    /// Entries `table` holds: the peers' together, and the gateway's own.
    fn held(&self, table: FlowTable) -> Result<u64, MapError> {
        let used = |owner| {
            self.rooms
                .get(&slot(table, owner), 0)
                .map(|room| room.used(room.charged))
        };
        Ok(used(ALL_PEERS)? + used(OWNER_LOCAL)?)
    }
}

/// The flow table pinned as `map`, if it is one.
fn flow_table(map: &str) -> Option<FlowTable> {
    FLOW_TABLES.into_iter().find(|table| table.map() == map)
}
