//! Maps a previous agent pinned, checked before they are reused: aya would
//! adopt a pinned map whatever its shape, and a map of another capacity or
//! layout (a changed flag, an upgrade) would then be read and written as if
//! it were this agent's.
//!
//! A pin that matches what this agent would create is kept. A hash map
//! whose capacity, flags or entries' layout ([`layouts`]) changed is
//! migrated: its entries are copied into the new one, each in this
//! agent's layout, or the agent refuses to start if they do not fit.
//! Anything else is replaced by a new, empty map, and said so: counters
//! restart, the tables the objects describe are written again, masqueraded
//! flows are lost.

use std::{
    collections::HashMap,
    os::fd::{AsFd, AsRawFd},
    path::PathBuf,
};

use aya::maps::{MapData, MapError, MapType};
use thiserror::Error;
use tracing::{error, info};

use super::layouts::{self, Plan, Registry, Shape, Upgrade, io, shape_of};

/// A pinned map that cannot be reused.
#[derive(Debug, Error)]
pub enum PinnedError {
    /// The kernel refused an operation on it.
    #[error("pinned map {name} at {path}: {source}")]
    Map {
        /// The map.
        name: String,
        /// Its pin.
        path: PathBuf,
        /// What the kernel said.
        source: Box<MapError>,
    },
    /// Its entries do not fit the capacity asked for.
    #[error(
        "pinned map {name} holds {entries} entries, more than the {capacity} it is to hold now; raise its capacity, or remove it with `isthmus-agent cleanup`"
    )]
    TooSmall {
        /// The map.
        name: String,
        /// Entries it holds.
        entries: usize,
        /// The capacity asked for.
        capacity: u32,
    },
}

/// The entries of a pinned map to be carried into its successor, held
/// while the loader creates the new map in its place: its capacity, flags
/// or layout changed.
pub struct Migration {
    name: String,
    path: PathBuf,
    old: MapData,
    found: Shape,
    upgrades: Vec<Upgrade>,
}

/// Checks every pinned map among `wanted` (name → pin and the shape this
/// agent would create) before the loader reuses it, by the layout versions
/// `registry` recorded. A pin whose shape or layout differs is unpinned;
/// the returned migrations copy the entries of those that can keep them,
/// once the loader has created their successors.
pub fn check<S: std::hash::BuildHasher>(
    wanted: &HashMap<&'static str, (PathBuf, Shape), S>,
    registry: &Registry,
) -> Result<Vec<Migration>, PinnedError> {
    let mut migrations = Vec::new();
    for (name, (path, shape)) in wanted {
        if !path.exists() {
            continue;
        }
        let failed = |source| PinnedError::Map {
            name: (*name).to_owned(),
            path: path.clone(),
            source: Box::new(source),
        };
        let old = MapData::from_pin(path).map_err(failed)?;
        let found = shape_of(&old).map_err(failed)?;
        let recorded = registry.recorded(name);
        let history = layouts::history(name, shape);
        match layouts::plan(&found, recorded, shape, &history) {
            Plan::Keep => continue,
            Plan::Migrate(upgrades) => {
                let entries = keys(&old, found.key_size, found.max_entries)
                    .map_err(failed)?
                    .len();
                if entries > shape.max_entries as usize {
                    return Err(PinnedError::TooSmall {
                        name: (*name).to_owned(),
                        entries,
                        capacity: shape.max_entries,
                    });
                }
                info!(
                    map = name, found = %found, wanted = %shape, entries,
                    layout_from = recorded, layout_steps = upgrades.len(),
                    "migrating a pinned map into one of this agent's shape and layout"
                );
                migrations.push(Migration {
                    name: (*name).to_owned(),
                    path: path.clone(),
                    old,
                    found,
                    upgrades,
                });
            }
            Plan::Replace => error!(
                map = name, found = %found, layout = recorded, wanted = %shape,
                "a pinned map has a layout this agent cannot read: replaced by a new, empty one (its counters restart, its tables are rebuilt from the objects, its flows are lost)"
            ),
        }
        std::fs::remove_file(path).map_err(|e| failed(MapError::SyscallError(io(e))))?;
    }
    Ok(migrations)
}

impl Migration {
    /// Copies the old map's entries into `new`, the map the loader created
    /// in its place, each through the layout upgrades. Returns how many.
    pub fn copy_into(&self, new: &MapData) -> Result<usize, PinnedError> {
        let failed = |source| PinnedError::Map {
            name: self.name.clone(),
            path: self.path.clone(),
            source: Box::new(source),
        };
        let keys = keys(&self.old, self.found.key_size, u32::MAX).map_err(failed)?;
        let mut value = vec![0u8; value_len(&self.found).map_err(failed)?];
        for key in &keys {
            // Gone since it was listed: nothing to copy.
            if syscall(
                BPF_MAP_LOOKUP_ELEM,
                &self.old,
                key.as_ptr(),
                value.as_mut_ptr(),
            )
            .is_err()
            {
                continue;
            }
            let (key, mut value) = self
                .upgrades
                .iter()
                .fold((key.clone(), value.clone()), |(k, v), upgrade| {
                    upgrade(&k, &v)
                });
            syscall(BPF_MAP_UPDATE_ELEM, new, key.as_ptr(), value.as_mut_ptr())
                .map_err(|e| failed(MapError::SyscallError(e)))?;
        }
        Ok(keys.len())
    }

    /// The migrated map's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where it is pinned.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// The bytes a lookup of a map of shape `shape` writes: a value for each
/// possible CPU, each 8-byte aligned, in a per-CPU map.
fn value_len(shape: &Shape) -> Result<usize, MapError> {
    let per_cpu = [
        MapType::PerCpuArray,
        MapType::PerCpuHash,
        MapType::LruPerCpuHash,
    ]
    .iter()
    .any(|t| *t as u32 == shape.map_type);
    if !per_cpu {
        return Ok(shape.value_size as usize);
    }
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| MapError::SyscallError(io(e)))?;
    Ok((shape.value_size as usize).next_multiple_of(8) * cpus)
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// `union bpf_attr` as the element commands read it: the map, a key, and a
/// value or the next key.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn syscall(
    cmd: libc::c_long,
    map: &MapData,
    key: *const u8,
    out: *mut u8,
) -> Result<(), aya::sys::SyscallError> {
    let attr = ElemAttr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        pad: 0,
        key: key as u64,
        value: out as u64,
        flags: 0,
    };
    // SAFETY: `attr` points at buffers of the map's key and value sizes,
    // alive for the call.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, &raw const attr, size_of::<ElemAttr>()) };
    match ret {
        0 => Ok(()),
        _ => Err(io(std::io::Error::last_os_error())),
    }
}

/// The keys of `map`, at most `limit` of them.
pub fn keys(map: &MapData, key_size: u32, limit: u32) -> Result<Vec<Vec<u8>>, MapError> {
    let mut keys = Vec::new();
    walk(map, key_size, limit, |key| keys.push(key.to_vec()))?;
    Ok(keys)
}

/// Calls `each` on the keys of `map`, at most `limit` of them, walked with
/// `BPF_MAP_GET_NEXT_KEY` from userspace, which takes no lock the packet
/// path waits on. Returns how many.
pub fn walk(
    map: &MapData,
    key_size: u32,
    limit: u32,
    mut each: impl FnMut(&[u8]),
) -> Result<u32, MapError> {
    let (mut key, mut next) = (vec![0u8; key_size as usize], vec![0u8; key_size as usize]);
    let mut count = 0;
    while count < limit {
        let current = if count == 0 {
            std::ptr::null()
        } else {
            key.as_ptr()
        };
        match syscall(BPF_MAP_GET_NEXT_KEY, map, current, next.as_mut_ptr()) {
            Ok(()) => {
                each(&next);
                std::mem::swap(&mut key, &mut next);
                count += 1;
            }
            Err(e) if e.io_error.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(MapError::SyscallError(e)),
        }
    }
    Ok(count)
}
