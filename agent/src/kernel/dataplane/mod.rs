//! Loading, pinning and attaching the kernel programs, adopting what a
//! previous agent left behind, and removing it all on request.
//!
//! Everything lives under one bpffs directory:
//! `maps/<map>`, `progs/<program>` and, with TCX,
//! `links/<device>-<direction>-<program>`.
//! An agent that stops leaves all of it in place, so the dataplane keeps
//! forwarding; the next agent reuses the maps and swaps its programs in
//! atomically (`bpf_link_update`, or a netlink filter replace).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{TcAttachType, Xdp, XdpMode, links::PinnedLink, tc::TcHandle},
};
use isthmus_common::{
    isolation::AllowKey,
    names,
    pins::{Direction, Pins},
    wire::Be128,
};
use thiserror::Error;
use tracing::info;

use crate::{
    kernel::link::DeviceError,
    kernel::maps::{
        ByteHash, GuardMaps, MappingMap, MappingMap6, NodeMap, OverlayMaps, OverlaySettings,
        PrefixTrie,
    },
    kernel::peer_table::{PeerMap, PeerMap6},
    kernel::pinned,
    kernel::{
        conntrack::{Conntrack, MasqueradeSettings, PeerFlows},
        layouts::{self, Registry},
        room::Rooms,
    },
};

mod attach;
mod cleanup;
mod verify;

pub use crate::kernel::maps::PeerDevices;
pub use attach::{AttachMode, Attached, load_nat_stages};
pub use cleanup::cleanup;
pub use verify::loading_time;

/// The compiled eBPF object, built by `build.rs`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/isthmus"));

/// Where the agent pins under by default: its own directory of the host's
/// bpf filesystem.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf/isthmus";

/// `statfs` magic of a bpf filesystem.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Failures of loading, attaching or cleaning up.
#[derive(Debug, Error)]
pub enum DataplaneError {
    /// The pin directory is not on a bpf filesystem.
    #[error("{0}: not on a bpf filesystem (mount one with `mount -t bpf bpf /sys/fs/bpf`)")]
    NotBpffs(PathBuf),
    /// A file operation under the pin directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The device cannot carry the NAT programs.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// aya refused to load the object.
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("program {program} on {dev}: {source}")]
    Program {
        /// The program.
        program: &'static str,
        /// The device.
        dev: String,
        /// What went wrong.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A program failed the verifier, or could not be loaded.
    #[error("program {program}: {source}")]
    Verify {
        /// The program.
        program: &'static str,
        /// What went wrong.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A program another goes on in, by tail call, could not be loaded.
    #[error("program {program}, of program array {array}: {source}")]
    Onward {
        /// The program array.
        array: &'static str,
        /// The program.
        program: &'static str,
        /// What went wrong.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A map has the wrong type.
    #[error("map {0}: {1}")]
    Map(&'static str, aya::maps::MapError),
    /// A map is missing from the object.
    #[error("map {0} is missing from the eBPF object")]
    MissingMap(&'static str),
    /// The object does not parse.
    #[error("reading the eBPF object: {0}")]
    Object(#[from] aya_obj::ParseError),
    /// A pinned map cannot be reused.
    #[error(transparent)]
    Pinned(#[from] pinned::PinnedError),
}

/// Sizes of the maps whose capacity the operator chooses.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// NatMapping entries, over every cluster.
    pub nat_mappings: u32,
    /// Conntrack entries, two per masqueraded flow.
    pub conntrack: u32,
    /// Endpoints segregated peers may open connections to, over every peer.
    pub allowed: u32,
    /// Flows our side opened towards segregated peers.
    pub peer_flows: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            nat_mappings: names::DEFAULT_NAT_MAPPINGS,
            conntrack: names::DEFAULT_CONNTRACK,
            allowed: names::DEFAULT_ALLOWED,
            peer_flows: names::DEFAULT_PEER_FLOWS,
        }
    }
}

/// The loaded object, with its maps pinned.
pub struct Dataplane {
    ebpf: Ebpf,
    pins: Pins,
    /// Whether the gateway serves Liqo v1 peers
    /// (docs/design.md#liqo-v1-peers): its tunnel's ingress program is then
    /// the peer SNAT, which goes on in the NAT.
    serves_liqo_v1: bool,
}

impl Dataplane {
    /// Loads the object, reusing the maps already pinned under `root` that
    /// have the shape this agent creates, and migrating or replacing the
    /// others (see [`pinned`]). With `serves_liqo_v1`, a gateway's peers'
    /// packets go on in the programs that rewrite a Liqo v1 peer's
    /// addresses, which are loaded into their program arrays.
    pub fn load(
        root: &Path,
        capacity: &Capacity,
        serves_liqo_v1: bool,
    ) -> Result<Self, DataplaneError> {
        ensure_bpffs(root)?;
        let pins = Pins::new(root);
        for dir in pins.dirs() {
            fs::create_dir_all(&dir).map_err(|source| DataplaneError::Io { path: dir, source })?;
        }
        let sized = [
            (names::MAP_NATMAP, capacity.nat_mappings),
            (names::MAP_NATMAP_REV, capacity.nat_mappings),
            (names::MAP_NATMAP6, capacity.nat_mappings),
            (names::MAP_NATMAP_REV6, capacity.nat_mappings),
            (names::MAP_CONNTRACK, capacity.conntrack),
            (names::MAP_CONNTRACK6, capacity.conntrack),
            (names::MAP_ALLOWED, capacity.allowed),
            (names::MAP_ALLOWED6, capacity.allowed),
            (names::MAP_PEER_FLOWS, capacity.peer_flows),
            (names::MAP_PEER_FLOWS6, capacity.peer_flows),
        ];
        let object = aya_obj::Object::parse(OBJECT)?;
        let mut wanted = std::collections::HashMap::new();
        for name in names::MAPS.into_iter().chain(names::PROGRAM_ARRAYS) {
            let map = object
                .maps
                .get(name)
                .ok_or(DataplaneError::MissingMap(name))?;
            let max_entries = sized
                .iter()
                .find_map(|(sized, entries)| (*sized == name).then_some(*entries))
                .unwrap_or(map.max_entries());
            let shape = layouts::Shape {
                map_type: map.map_type(),
                key_size: map.key_size(),
                value_size: map.value_size(),
                max_entries,
                map_flags: map.map_flags(),
            };
            wanted.insert(name, (pins.map(name), shape));
        }
        let layouts_pin = pins.map(names::MAP_LAYOUTS);
        let mut registry = Registry::open(&layouts_pin).map_err(|e| DataplaneError::Io {
            path: layouts_pin.clone(),
            source: io::Error::other(e),
        })?;
        let migrations = pinned::check(&wanted, &registry)?;
        let mut loader = EbpfLoader::new();
        for (name, (path, _)) in &wanted {
            loader.map_pin_path(name, path.as_path());
        }
        for (name, entries) in sized {
            loader.map_max_entries(name, entries);
        }
        let ebpf = loader.load(OBJECT)?;
        for migration in migrations {
            let new =
                aya::maps::MapData::from_pin(migration.path()).map_err(|e| DataplaneError::Io {
                    path: migration.path().to_owned(),
                    source: io::Error::other(e),
                })?;
            let copied = migration.copy_into(&new)?;
            info!(
                map = migration.name(),
                entries = copied,
                "pinned map migrated"
            );
        }
        // Only now: a map recorded in this agent's layout must hold it.
        for (name, (_, shape)) in &wanted {
            registry
                .record(name, layouts::current_version(name, shape))
                .map_err(|e| DataplaneError::Io {
                    path: layouts_pin.clone(),
                    source: io::Error::other(e),
                })?;
        }
        let mut dataplane = Self {
            ebpf,
            pins,
            serves_liqo_v1,
        };
        match serves_liqo_v1 {
            true => dataplane.load_liqo_v1_programs()?,
            // What an agent that served Liqo v1 peers left in the arrays.
            false => {
                for array in [names::MAP_PEER_DNAT, names::MAP_NAT_IN] {
                    attach::clear_program_array(&mut dataplane.ebpf, array)?;
                }
            }
        }
        Ok(dataplane)
    }

    /// Whether the gateway serves Liqo v1 peers: the NAT devices attached
    /// take their packets in through the peer SNAT.
    pub fn serves_liqo_v1(&self) -> bool {
        self.serves_liqo_v1
    }

    /// Puts the programs that rewrite a Liqo v1 peer's addresses, of both
    /// families, and the ingress NAT after them, into their program arrays.
    fn load_liqo_v1_programs(&mut self) -> Result<(), DataplaneError> {
        attach::load_program_array(
            &mut self.ebpf,
            names::MAP_PEER_DNAT,
            names::PEER_DNAT_PROGRAMS,
        )?;
        attach::load_program_array(&mut self.ebpf, names::MAP_NAT_IN, names::NAT_IN_PROGRAMS)?;
        attach::load_program_array(
            &mut self.ebpf,
            names::MAP_PEER_REMAP6,
            names::PEER_REMAP6_PROGRAMS,
        )
    }

    /// The table of tunnel devices that each carry one Liqo v1 peer.
    pub fn take_peer_devs(&mut self) -> Result<PeerDevices, DataplaneError> {
        let (ipv4, ipv6) = (
            self.take(names::MAP_PEER_DEVS)?,
            self.take(names::MAP_PEER_DEVS6)?,
        );
        PeerDevices::new(ipv4, ipv6).map_err(|e| DataplaneError::Map(names::MAP_PEER_DEVS, e))
    }

    /// The peer table, for the reconciler.
    pub fn take_peer_map(&mut self) -> Result<PeerMap, DataplaneError> {
        let (nets, owners, lens) = (
            self.take(names::MAP_PEERS)?,
            self.take(names::MAP_PEER_OWNERS)?,
            self.take(names::MAP_PREFIX_LENS)?,
        );
        PeerMap::new(nets, owners, lens).map_err(|e| DataplaneError::Map(names::MAP_PEERS, e))
    }

    /// The IPv6 peer table, for the reconciler.
    pub fn take_peer_map6(&mut self) -> Result<PeerMap6, DataplaneError> {
        let (nets, owners, lens) = (
            self.take(names::MAP_PEERS6)?,
            self.take(names::MAP_PEER_OWNERS6)?,
            self.take(names::MAP_PREFIX_LENS6)?,
        );
        PeerMap6::new(nets, owners, lens).map_err(|e| DataplaneError::Map(names::MAP_PEERS6, e))
    }

    /// The NatMapping tables, for the reconciler.
    pub fn take_mapping_map(&mut self) -> Result<MappingMap, DataplaneError> {
        let (forward, reverse) = (
            self.take(names::MAP_NATMAP)?,
            self.take(names::MAP_NATMAP_REV)?,
        );
        MappingMap::new(forward, reverse).map_err(|e| DataplaneError::Map(names::MAP_NATMAP, e))
    }

    /// The IPv6 NatMapping tables, for the reconciler.
    pub fn take_mapping_map6(&mut self) -> Result<MappingMap6, DataplaneError> {
        let (forward, reverse) = (
            self.take(names::MAP_NATMAP6)?,
            self.take(names::MAP_NATMAP_REV6)?,
        );
        MappingMap6::new(forward, reverse).map_err(|e| DataplaneError::Map(names::MAP_NATMAP6, e))
    }

    /// The allowed table of segregated peers, for the reconciler.
    pub fn take_allowed(&mut self) -> Result<ByteHash<AllowKey>, DataplaneError> {
        self.take_byte_hash(names::MAP_ALLOWED)
    }

    /// The IPv6 allowed table of segregated peers, for the reconciler.
    pub fn take_allowed6(&mut self) -> Result<ByteHash<AllowKey<Be128>>, DataplaneError> {
        self.take_byte_hash(names::MAP_ALLOWED6)
    }

    /// The masquerade's flow tables.
    pub fn take_conntrack(&mut self) -> Result<Conntrack, DataplaneError> {
        let flows = self.take(names::MAP_CONNTRACK)?;
        let flows6 = self.take(names::MAP_CONNTRACK6)?;
        Conntrack::new(flows, flows6).map_err(|e| DataplaneError::Map(names::MAP_CONNTRACK, e))
    }

    /// The masquerade settings.
    pub fn take_masquerade(&mut self) -> Result<MasqueradeSettings, DataplaneError> {
        let ipv4 = self.take(names::MAP_SNAT)?;
        let ipv6 = self.take(names::MAP_SNAT6)?;
        MasqueradeSettings::new(ipv4, ipv6).map_err(|e| DataplaneError::Map(names::MAP_SNAT, e))
    }

    /// The flows our side opened towards segregated peers, of both
    /// families.
    pub fn take_peer_flows(&mut self) -> Result<PeerFlows, DataplaneError> {
        let flows = self.take(names::MAP_PEER_FLOWS)?;
        let flows6 = self.take(names::MAP_PEER_FLOWS6)?;
        PeerFlows::new(flows, flows6).map_err(|e| DataplaneError::Map(names::MAP_PEER_FLOWS, e))
    }

    /// Each owner's room in the flow tables.
    pub fn take_rooms(&mut self) -> Result<Rooms, DataplaneError> {
        let (rooms, refused, fragments) = (
            self.take(names::MAP_ROOM)?,
            self.take(names::MAP_ROOM_REFUSED)?,
            self.take(names::MAP_FRAGMENT_BUDGET)?,
        );
        Rooms::new(rooms, refused, fragments).map_err(|e| DataplaneError::Map(names::MAP_ROOM, e))
    }

    /// Sets the largest MSS a SYN crossing the NAT device may advertise
    /// (0: none is clamped).
    pub fn set_tcp_mss(&mut self, mss: u16) -> Result<(), DataplaneError> {
        let error = |e| DataplaneError::Map(names::MAP_TCP_MSS, e);
        let map = self
            .ebpf
            .map_mut(names::MAP_TCP_MSS)
            .ok_or(DataplaneError::MissingMap(names::MAP_TCP_MSS))?;
        let mut array = aya::maps::Array::<_, u32>::try_from(map).map_err(error)?;
        array.set(0, u32::from(mss), 0).map_err(error)
    }

    /// The XDP guard's tables.
    pub fn take_guard(&mut self) -> Result<GuardMaps, DataplaneError> {
        let sources = self.take_byte_hash(names::MAP_GUARD_SOURCES)?;
        let sources6 = self.take_byte_hash(names::MAP_GUARD_SOURCES6)?;
        let indexes = self.take_byte_hash(names::MAP_GUARD_INDEXES)?;
        let ports = self.take_byte_hash(names::MAP_GUARD_PORTS)?;
        Ok(GuardMaps {
            sources,
            sources6,
            indexes,
            ports,
        })
    }

    /// Attaches the XDP guard to `dev` in native (driver) mode. The link
    /// lives as long as the agent: the guard protects the userspace tunnel,
    /// which does not outlive it either.
    pub fn attach_guard(&mut self, dev: &str) -> Result<(), DataplaneError> {
        let program = names::PROG_GUARD;
        let attach = |ebpf: &mut Ebpf| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let prog: &mut Xdp = ebpf
                .program_mut(program)
                .ok_or("missing from the object")?
                .try_into()?;
            verify::uninterrupted(|| prog.load())?;
            prog.attach(dev, XdpMode::Driver)?;
            Ok(())
        };
        attach(&mut self.ebpf).map_err(|source| DataplaneError::Program {
            program,
            dev: dev.into(),
            source,
        })?;
        info!(dev, mode = "native", program, "XDP guard attached");
        Ok(())
    }

    /// The table of pod veths the overlay delivers into directly.
    pub fn take_pod_devs(&mut self) -> Result<ByteHash<u32>, DataplaneError> {
        self.take_byte_hash(names::MAP_POD_DEVS)
    }

    /// The overlay's settings, node table, node addresses of both families
    /// and the destinations that take the stack.
    pub fn take_overlay(&mut self) -> Result<OverlayMaps, DataplaneError> {
        let settings = OverlaySettings::new(self.take(names::MAP_OVERLAY)?)
            .map_err(|e| DataplaneError::Map(names::MAP_OVERLAY, e))?;
        let nodes = NodeMap::new(self.take(names::MAP_NODES)?)
            .map_err(|e| DataplaneError::Map(names::MAP_NODES, e))?;
        let addresses = self.take_byte_hash(names::MAP_NODE_ADDRS)?;
        let addresses6 = self.take_byte_hash(names::MAP_NODE_ADDRS6)?;
        let stack_destinations = PrefixTrie::new(self.take(names::MAP_STACK_DESTINATIONS)?)
            .map_err(|e| DataplaneError::Map(names::MAP_STACK_DESTINATIONS, e))?;
        let stack_destinations6 = PrefixTrie::new(self.take(names::MAP_STACK_DESTINATIONS6)?)
            .map_err(|e| DataplaneError::Map(names::MAP_STACK_DESTINATIONS6, e))?;
        Ok(OverlayMaps {
            settings,
            nodes,
            addresses,
            addresses6,
            stack_destinations,
            stack_destinations6,
        })
    }

    /// The hash `name` of keys to a byte, wrapped; an error names it.
    fn take_byte_hash<K: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<ByteHash<K>, DataplaneError> {
        ByteHash::new(self.take(name)?).map_err(|e| DataplaneError::Map(name, e))
    }

    fn take(&mut self, name: &'static str) -> Result<aya::maps::Map, DataplaneError> {
        self.ebpf
            .take_map(name)
            .ok_or(DataplaneError::MissingMap(name))
    }
}

/// Fails unless `root` (or the directory it will be created in) is on bpffs.
fn ensure_bpffs(root: &Path) -> Result<(), DataplaneError> {
    let existing = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let stat = nix::sys::statfs::statfs(existing).map_err(|e| DataplaneError::Io {
        path: existing.into(),
        source: e.into(),
    })?;
    if stat.filesystem_type().0 as i64 != BPF_FS_MAGIC {
        return Err(DataplaneError::NotBpffs(root.into()));
    }
    Ok(())
}

/// Netlink filter priority used in clsact mode, fixed so a restarted agent
/// can find and replace its own filters.
pub(super) const NL_PRIORITY: u16 = 0x1517;

/// The netlink filter handle of `program` in clsact mode: one per program,
/// since two of them may share a device's hook (NAT and the overlay's
/// decapsulation on a single-NIC gateway).
pub(super) fn nl_handle(program: &str) -> TcHandle {
    let index = names::PROGRAMS.iter().position(|p| *p == program);
    TcHandle::new(0x1517, 1 + index.unwrap_or(0) as u16)
}

/// The hook of `attach_type`, as a link's pin names it.
pub(super) fn direction(attach_type: TcAttachType) -> Direction {
    match attach_type {
        TcAttachType::Egress => Direction::Egress,
        _ => Direction::Ingress,
    }
}

/// Unpins a TCX link, if pinned. That drops the last reference to it, so
/// the kernel detaches it.
pub(super) fn unpin_link(path: &Path) -> Result<(), DataplaneError> {
    if !path.exists() {
        return Ok(());
    }
    PinnedLink::from_pin(path)
        .map_err(|e| DataplaneError::Io {
            path: path.into(),
            source: io::Error::other(e),
        })?
        .unpin()
        .map_err(|source| DataplaneError::Io {
            path: path.into(),
            source,
        })?;
    Ok(())
}

pub(super) fn pin_entries(dir: &Path) -> Result<Vec<PathBuf>, DataplaneError> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(DataplaneError::Io {
            path: dir.into(),
            source,
        }),
    }
}

pub(super) fn remove_pin(path: &Path) -> Result<(), DataplaneError> {
    already_gone_is_fine(path, fs::remove_file(path))
}

pub(super) fn remove_dir(path: &Path) -> Result<(), DataplaneError> {
    already_gone_is_fine(path, fs::remove_dir(path))
}

/// Cleanup is idempotent: what is already gone counts as removed.
fn already_gone_is_fine(path: &Path, result: io::Result<()>) -> Result<(), DataplaneError> {
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DataplaneError::Io {
            path: path.into(),
            source: e,
        }),
        _ => Ok(()),
    }
}
