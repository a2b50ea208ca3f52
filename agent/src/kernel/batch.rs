//! Whole-table reads a few thousand entries per system call
//! (`BPF_MAP_LOOKUP_BATCH`), where aya's iterator makes two calls per
//! entry: the flow collector reads every entry of tables of up to millions
//! on each sweep. The kernel holds each hash bucket's lock only while it
//! copies that bucket.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    Pod,
    maps::{MapData, MapError},
    sys::SyscallError,
};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call; a hash bucket holds far fewer, so the
/// kernel never finds one that does not fit (ENOSPC).
const CHUNK: usize = 4096;

/// `union bpf_attr` as the batch commands read it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of the hash map `map`, whose keys are `K` and values `V`
/// (as aya checked when it typed the map).
pub fn entries<K: Pod, V: Pod>(map: &MapData) -> Result<Vec<(K, V)>, MapError> {
    // SAFETY: Pod types are plain data, valid when zeroed.
    let (mut keys, mut values) = unsafe {
        (
            vec![std::mem::zeroed::<K>(); CHUNK],
            vec![std::mem::zeroed::<V>(); CHUNK],
        )
    };
    // A hash map's batch position is a bucket index; none to start.
    let (mut position, mut next) = (None::<u32>, 0u32);
    let mut entries = Vec::new();
    loop {
        let mut attr = BatchAttr {
            in_batch: position
                .as_ref()
                .map_or(0, |p| std::ptr::from_ref::<u32>(p) as u64),
            out_batch: &raw mut next as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the key and value buffers hold CHUNK entries of the
        // map's key and value sizes, and the positions one u32 each, all
        // alive for the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        let error = (ret < 0).then(io::Error::last_os_error);
        let filled = (attr.count as usize).min(CHUNK);
        entries.extend(
            keys[..filled]
                .iter()
                .copied()
                .zip(values[..filled].iter().copied()),
        );
        match error {
            None => position = Some(next),
            // The last buckets were read.
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Some(io_error) => {
                return Err(MapError::SyscallError(SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                }));
            }
        }
    }
    Ok(entries)
}
