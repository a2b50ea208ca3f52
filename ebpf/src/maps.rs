//! The maps the programs share with the agent.

use aya_ebpf::{
    btf_maps::{Array, HashMap, PerCpuArray},
    macros::btf_map,
};
use isthmus_common::{
    counters::{self, Direction, Outcome},
    names::{DEFAULT_NAT_MAPPINGS, MAX_PEER_NETWORKS},
    nat::{MappingKey, PREFIX_LENS, PeerKey, PeerNat, PrefixLens},
};

/// A peer's networks as we see them → what to rewrite for that peer.
#[btf_map(name = "ist_peer_nets")]
static PEERS: HashMap<PeerKey, PeerNat, { MAX_PEER_NETWORKS as usize }> = HashMap::new();

/// The prefix lengths present in `PEERS`, longest first.
#[btf_map(name = "ist_prefix_lens")]
static LENS: Array<PrefixLens, 1> = Array::new();

/// NatMapping DNAT: a peer cluster's externalIP → the endpoint behind it.
#[btf_map(name = "ist_natmap")]
static NATMAP: HashMap<MappingKey, u32, { DEFAULT_NAT_MAPPINGS as usize }> = HashMap::new();

/// The reverse: an endpoint → the externalIP that peer cluster knows it by.
#[btf_map(name = "ist_natmap_rev")]
static NATMAP_REV: HashMap<MappingKey, u32, { DEFAULT_NAT_MAPPINGS as usize }> = HashMap::new();

/// Packets per direction and outcome; summed over CPUs by the agent.
#[btf_map(name = "ist_counters")]
static COUNTERS: PerCpuArray<u64, { counters::SLOTS as usize }> = PerCpuArray::new();

/// The peer whose networks hold `addr` (wire order), if any: one hash
/// lookup per prefix length in use, longest first.
#[inline(always)]
pub fn peer(addr: u32) -> Option<&'static PeerNat> {
    let lens = LENS.get(0)?;
    for i in 0..PREFIX_LENS {
        if i as u32 >= lens.count {
            break;
        }
        let key = PeerKey::of(addr, lens.lens[i] as u8);
        // SAFETY: entries are replaced whole by the agent; a concurrent
        // replacement yields the old or the new value, both valid.
        if let Some(nat) = unsafe { PEERS.get(&key) } {
            return Some(nat);
        }
    }
    None
}

/// The endpoint that peer `peer_id` reaches at `external` (wire order).
#[inline(always)]
pub fn endpoint_of(peer_id: u32, external: u32) -> Option<u32> {
    lookup(&NATMAP, peer_id, external)
}

/// The externalIP under which peer `peer_id` knows `endpoint` (wire order).
#[inline(always)]
pub fn external_of(peer_id: u32, endpoint: u32) -> Option<u32> {
    lookup(&NATMAP_REV, peer_id, endpoint)
}

#[inline(always)]
fn lookup(
    map: &HashMap<MappingKey, u32, { DEFAULT_NAT_MAPPINGS as usize }>,
    peer_id: u32,
    addr: u32,
) -> Option<u32> {
    // SAFETY: a u32 value, copied out at once.
    unsafe { map.get(&MappingKey { peer_id, addr }) }.copied()
}

/// Counts one packet.
#[inline(always)]
pub fn count(direction: Direction, outcome: Outcome) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counters::slot(direction, outcome)) {
        // SAFETY: per-CPU slot, so no other writer runs concurrently.
        unsafe { *slot += 1 };
    }
}
