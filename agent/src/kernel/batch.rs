//! Whole-table reads a few thousand entries per system call
//! (`BPF_MAP_LOOKUP_BATCH`), where aya's iterator makes two calls per
//! entry: the flow collector reads every entry of tables of up to millions
//! on each sweep. The kernel holds each hash bucket's lock only while it
//! copies that bucket.

use std::{
    io,
    ops::Range,
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
    collected(map, Span::All)
}

/// The entries at `range` of the array `map`, whose values are `V`:
/// (index, value).
pub fn array_range<V: Pod>(map: &MapData, range: Range<u32>) -> Result<Vec<(u32, V)>, MapError> {
    collected(map, Span::Indexes(range))
}

/// The entries of `span` of `map`, one value each.
fn collected<K: Pod, V: Pod>(map: &MapData, span: Span) -> Result<Vec<(K, V)>, MapError> {
    let mut entries = Vec::new();
    in_batches::<K, V>(map, 1, span, |keys, values| {
        entries.extend(keys.iter().copied().zip(values.iter().copied()));
    })?;
    Ok(entries)
}

/// The entries at `range` of the per-CPU array `map` of u64 counters,
/// summed over the CPUs: (index, sum).
pub fn per_cpu_sums(map: &MapData, range: Range<u32>) -> Result<Vec<(u32, u64)>, MapError> {
    let cpus = aya::util::nr_cpus().map_err(|(_, io_error)| {
        MapError::SyscallError(SyscallError {
            call: "reading the possible CPUs",
            io_error,
        })
    })?;
    let mut sums = Vec::new();
    in_batches::<u32, u64>(map, cpus, Span::Indexes(range), |keys, values| {
        sums.extend(
            keys.iter()
                .zip(values.chunks(cpus))
                .map(|(key, per_cpu)| (*key, per_cpu.iter().sum::<u64>())),
        );
    })?;
    Ok(sums)
}

/// What a read covers.
enum Span {
    /// The whole map.
    All,
    /// These indexes of an array.
    Indexes(Range<u32>),
}

/// Reads `span` of `map` in calls of at most [`CHUNK`] entries, and hands
/// each call's keys, and their values, `per_key` of `V` each (one per
/// possible CPU in a per-CPU map), to `each`.
fn in_batches<K: Pod, V: Pod>(
    map: &MapData,
    per_key: usize,
    span: Span,
    mut each: impl FnMut(&[K], &[V]),
) -> Result<(), MapError> {
    // SAFETY: Pod types are plain data, valid when zeroed.
    let (mut keys, mut values) = unsafe {
        (
            vec![std::mem::zeroed::<K>(); CHUNK],
            vec![std::mem::zeroed::<V>(); CHUNK * per_key],
        )
    };
    // A batch position is a hash map's bucket index, or the array index
    // before the next to read; none to start at the first.
    let (mut position, mut left) = match span {
        Span::All => (None::<u32>, usize::MAX),
        Span::Indexes(range) => (range.start.checked_sub(1), range.len()),
    };
    let mut next = 0u32;
    while left > 0 {
        let asked = left.min(CHUNK);
        let mut attr = BatchAttr {
            in_batch: position
                .as_ref()
                .map_or(0, |p| std::ptr::from_ref::<u32>(p) as u64),
            out_batch: &raw mut next as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: asked as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the key and value buffers hold CHUNK entries of the
        // map's key and value sizes (a per-CPU value `per_key` times), and
        // the positions one u32 each, all alive for the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        let error = (ret < 0).then(io::Error::last_os_error);
        let filled = (attr.count as usize).min(asked);
        each(&keys[..filled], &values[..filled * per_key]);
        left -= filled;
        match error {
            None => position = Some(next),
            // The last entries were read.
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Some(io_error) => {
                return Err(MapError::SyscallError(SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                }));
            }
        }
    }
    Ok(())
}
