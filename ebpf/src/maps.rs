//! The maps the programs share with the agent.

use aya_ebpf::{
    btf_maps::{LpmTrie, PerCpuArray, lpm_trie::Key},
    macros::btf_map,
};
use isthmus_common::{
    counters::{self, Direction, Outcome},
    names::MAX_PEER_NETWORKS,
    nat::PeerNat,
};

/// A peer's networks as we see them → what to rewrite for that peer.
#[btf_map(name = "ist_nat_peers")]
static PEERS: LpmTrie<[u8; 4], PeerNat, { MAX_PEER_NETWORKS as usize }> = LpmTrie::new();

/// Packets per direction and outcome; summed over CPUs by the agent.
#[btf_map(name = "ist_counters")]
static COUNTERS: PerCpuArray<u64, { counters::SLOTS as usize }> = PerCpuArray::new();

/// The peer whose networks hold `addr` (wire order), if any.
#[inline(always)]
pub fn peer(addr: u32) -> Option<&'static PeerNat> {
    PEERS.get(&Key::new(32, addr.to_ne_bytes()))
}

/// Counts one packet.
#[inline(always)]
pub fn count(direction: Direction, outcome: Outcome) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counters::slot(direction, outcome)) {
        // SAFETY: per-CPU slot, so no other writer runs concurrently.
        unsafe { *slot += 1 };
    }
}
