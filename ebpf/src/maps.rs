//! The maps the programs share with the agent.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    macros::btf_map,
};
use isthmus_common::{
    counters::{self, DENY_SLOTS, DenyReason, Direction, DropReason, KINDS, Link, Outcome},
    guard::{GuardSource, Initiations, VERDICTS, Verdict},
    names::{
        DEFAULT_NAT_MAPPINGS, MAX_GUARD_INDEXES, MAX_GUARD_PORTS, MAX_GUARD_SOURCES, MAX_NODES,
        MAX_PEER_DEVS, MAX_PEER_NETWORKS, MAX_POD_DEVS, MAX_STACK_DESTINATIONS,
    },
    nat::{MappingKey, PREFIX_LENS, PeerKey, PeerNat, PrefixLens},
    overlay::{EVENTS, OverlayConfig, OverlayEvent},
    wire::{Address, Be16, Be32, Be128},
};

/// The flags of every hash map but the LRU: entries are allocated as they
/// are inserted, not all at load. A table sized for the busiest gateway
/// then costs an idle one only what it holds, and inserts take from the
/// kernel's per-CPU element caches, which any program context may use.
pub const ON_DEMAND: usize = aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize;

/// A peer's networks as we see them → what to rewrite for that peer.
#[btf_map(name = "ist_peer_nets")]
static PEERS: PeerTable<Be32> = HashMap::new();

/// The same for the peers' IPv6 networks.
#[btf_map(name = "ist_peer_nets6")]
static PEERS6: PeerTable<Be128> = HashMap::new();

/// A peer table of one family.
type PeerTable<A> = HashMap<PeerKey<A>, PeerNat<A>, { MAX_PEER_NETWORKS as usize }, ON_DEMAND>;

/// A peer's networks as we see them → its ID.
#[btf_map(name = "ist_peer_owners")]
static PEER_OWNERS: LpmTrie<Be32, u32, { MAX_PEER_NETWORKS as usize }> = LpmTrie::new();

/// The same for the peers' IPv6 networks.
#[btf_map(name = "ist_peer_owner6")]
static PEER_OWNERS6: LpmTrie<Be128, u32, { MAX_PEER_NETWORKS as usize }> = LpmTrie::new();

/// The ID of the peer whose networks hold `addr`, if any: one trie
/// lookup, for the rare path (a new flow) where [`peer`]'s loop would
/// cost the verifier more than the packet.
#[inline(always)]
pub fn peer_id(addr: Be32) -> Option<u32> {
    PEER_OWNERS.get(&Key::new(32, addr)).copied()
}

/// [`peer_id`] for an IPv6 address.
#[inline(always)]
pub fn peer6_id(addr: Be128) -> Option<u32> {
    PEER_OWNERS6.get(&Key::new(128, addr)).copied()
}

/// The prefix lengths present in `PEERS`, longest first.
#[btf_map(name = "ist_prefix_lens")]
static LENS: Array<PrefixLens, 1> = Array::new();

/// The prefix lengths present in `PEERS6`, longest first.
#[btf_map(name = "ist_prefix6")]
static LENS6: Array<PrefixLens, 1> = Array::new();

/// NatMapping DNAT: a peer cluster's externalIP → the endpoint behind it.
#[btf_map(name = "ist_natmap")]
static NATMAP: MappingTable<Be32> = HashMap::new();

/// The reverse: an endpoint → the externalIP that peer cluster knows it by.
#[btf_map(name = "ist_natmap_rev")]
static NATMAP_REV: MappingTable<Be32> = HashMap::new();

/// NatMapping DNAT of IPv6 addresses.
#[btf_map(name = "ist_natmap6")]
static NATMAP6: MappingTable<Be128> = HashMap::new();

/// The reverse of `NATMAP6`.
#[btf_map(name = "ist_natmap_rev6")]
static NATMAP_REV6: MappingTable<Be128> = HashMap::new();

/// A NatMapping table of one family.
type MappingTable<A> = HashMap<MappingKey<A>, A, { DEFAULT_NAT_MAPPINGS as usize }, ON_DEMAND>;

/// The largest MSS a SYN crossing the tunnel device may advertise.
#[btf_map(name = "ist_tcp_mss")]
static TCP_MSS: Array<u32, 1> = Array::new();

/// The largest MSS a SYN crossing the tunnel device may advertise, when
/// clamping is on.
#[inline(always)]
pub fn tcp_mss() -> Option<u16> {
    TCP_MSS
        .get(0)
        .map(|mss| *mss as u16)
        .filter(|mss| *mss != 0)
}

/// Packets per direction and outcome; summed over CPUs by the agent.
#[btf_map(name = "ist_counters")]
static COUNTERS: PerCpuArray<u64, { counters::SLOTS as usize }> = PerCpuArray::new();

/// Peers' packets denied, by peer and reason; summed over CPUs by the agent.
#[btf_map(name = "ist_peer_denied")]
static PEER_DENIED: PerCpuArray<u64, { DENY_SLOTS as usize }> = PerCpuArray::new();

/// Counts a packet of peer `peer_id` denied for `reason`.
#[inline(always)]
pub fn count_denied(peer_id: u32, reason: DenyReason) {
    increment(&PEER_DENIED, counters::deny_slot(peer_id, reason));
}

/// The peer whose networks hold `addr`, if any: one hash lookup per prefix
/// length in use, longest first.
#[inline(always)]
pub fn peer(addr: Be32) -> Option<&'static PeerNat> {
    peer_in(&PEERS, &LENS, addr)
}

/// The peer whose IPv6 networks hold `addr`, if any.
#[inline(always)]
pub fn peer6(addr: Be128) -> Option<&'static PeerNat<Be128>> {
    peer_in(&PEERS6, &LENS6, addr)
}

#[inline(always)]
fn peer_in<A: Address>(
    peers: &'static PeerTable<A>,
    lens: &'static Array<PrefixLens, 1>,
    addr: A,
) -> Option<&'static PeerNat<A>> {
    let lens = lens.get(0)?;
    for i in 0..PREFIX_LENS {
        if i as u32 >= lens.count {
            break;
        }
        let key = PeerKey::of(addr, lens.lens[i] as u8);
        // SAFETY: entries are replaced whole by the agent; a concurrent
        // replacement yields the old or the new value, both valid.
        if let Some(nat) = unsafe { peers.get(&key) } {
            return Some(nat);
        }
    }
    None
}

/// The tunnel devices that each carry one Liqo v1 peer alone, by ifindex
/// → the key of that peer in [`PEERS`].
#[btf_map(name = "ist_peer_devs")]
static PEER_DEVS: HashMap<u32, PeerKey, { MAX_PEER_DEVS as usize }, ON_DEMAND> = HashMap::new();

/// The same for the Liqo v1 peers' IPv6 networks: ifindex → the key of
/// that peer in [`PEERS6`].
#[btf_map(name = "ist_peer_devs6")]
static PEER_DEVS6: HashMap<u32, PeerKey<Be128>, { MAX_PEER_DEVS as usize }, ON_DEMAND> =
    HashMap::new();

/// The Liqo v1 peer device `ifindex` carries alone, if it carries one.
#[inline(always)]
pub fn peer_of_device(ifindex: u32) -> Option<&'static PeerNat> {
    // SAFETY: both values are replaced whole by the agent, as in `peer`.
    let key = unsafe { PEER_DEVS.get(&ifindex) }?;
    unsafe { PEERS.get(key) }
}

/// The IPv6 networks of the Liqo v1 peer device `ifindex` carries alone,
/// if it carries one that has them.
#[inline(always)]
pub fn peer6_of_device(ifindex: u32) -> Option<&'static PeerNat<Be128>> {
    // SAFETY: as in `peer_of_device`.
    let key = unsafe { PEER_DEVS6.get(&ifindex) }?;
    unsafe { PEERS6.get(key) }
}

/// The endpoint that peer `peer_id` reaches at `external`.
#[inline(always)]
pub fn endpoint_of(peer_id: u32, external: Be32) -> Option<Be32> {
    lookup(&NATMAP, peer_id, external)
}

/// The externalIP under which peer `peer_id` knows `endpoint`.
#[inline(always)]
pub fn external_of(peer_id: u32, endpoint: Be32) -> Option<Be32> {
    lookup(&NATMAP_REV, peer_id, endpoint)
}

/// The IPv6 endpoint that peer `peer_id` reaches at `external`.
#[inline(always)]
pub fn endpoint6_of(peer_id: u32, external: Be128) -> Option<Be128> {
    lookup(&NATMAP6, peer_id, external)
}

/// The IPv6 externalIP under which peer `peer_id` knows `endpoint`.
#[inline(always)]
pub fn external6_of(peer_id: u32, endpoint: Be128) -> Option<Be128> {
    lookup(&NATMAP_REV6, peer_id, endpoint)
}

#[inline(always)]
fn lookup<A: Address>(map: &MappingTable<A>, peer_id: u32, addr: A) -> Option<A> {
    // SAFETY: a small value, copied out at once.
    unsafe { map.get(&MappingKey { peer_id, addr }) }.copied()
}

/// Counts one packet of the NAT program for `link` and `direction`.
#[inline(always)]
pub fn count(link: Link, direction: Direction, outcome: Outcome) {
    increment(&COUNTERS, counters::outcome_slot(link, direction, outcome));
}

/// Counts why a NAT program dropped a packet.
#[inline(always)]
pub fn count_drop(link: Link, direction: Direction, reason: DropReason) {
    increment(&COUNTERS, counters::drop_slot(link, direction, reason));
}

/// Counts a translated packet once for each kind of rule in `kinds` (a set
/// of [`Kind::bit`]s).
#[inline(always)]
pub fn count_kinds(link: Link, direction: Direction, kinds: u8) {
    for kind in KINDS {
        if kinds & kind.bit() != 0 {
            increment(&COUNTERS, counters::kind_slot(link, direction, kind));
        }
    }
}

/// Adds one to `slot` of a per-CPU counter array.
#[inline(always)]
pub(crate) fn increment<const N: usize>(counters: &PerCpuArray<u64, N>, slot: u32) {
    if let Some(count) = counters.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, so no other writer runs concurrently.
        unsafe { *count += 1 };
    }
}

/// Sources allowed to reach the tunnel port.
#[btf_map(name = "ist_guard_src")]
static GUARD_SOURCES: HashMap<GuardSource, u8, { MAX_GUARD_SOURCES as usize }, ON_DEMAND> =
    HashMap::new();

/// IPv6 sources allowed to reach the tunnel port.
#[btf_map(name = "ist_guard_src6")]
static GUARD_SOURCES6: HashMap<GuardSource<Be128>, u8, { MAX_GUARD_SOURCES as usize }, ON_DEMAND> =
    HashMap::new();

/// Our peers' session indexes (top 24 bits of a receiver index).
#[btf_map(name = "ist_guard_idx")]
static GUARD_INDEXES: HashMap<u32, u8, { MAX_GUARD_INDEXES as usize }, ON_DEMAND> = HashMap::new();

/// The tunnel's ports, each with whether initiations pass from anywhere.
#[btf_map(name = "ist_guard_ports")]
static GUARD_PORTS: HashMap<Be16, u8, { MAX_GUARD_PORTS as usize }, ON_DEMAND> = HashMap::new();

/// Datagrams to the tunnel port, by verdict; summed over CPUs by the agent.
#[btf_map(name = "ist_guard_stats")]
static GUARD_STATS: PerCpuArray<u64, { VERDICTS.len() }> = PerCpuArray::new();

/// The setting of `port` if it is one of the tunnel's: whether
/// initiations pass there from any source.
#[inline(always)]
pub fn guard_port(port: Be16) -> Option<Initiations> {
    // SAFETY: a u8 written whole by the agent.
    let open = unsafe { GUARD_PORTS.get(&port) }?;
    Some(match *open {
        0 => Initiations::FromEndpoints,
        _ => Initiations::FromAnywhere,
    })
}

/// Whether `source` is a peer's IPv4 endpoint.
#[inline(always)]
pub fn guard_source_known(source: &GuardSource) -> bool {
    // SAFETY: only presence is read.
    unsafe { GUARD_SOURCES.get(source) }.is_some()
}

/// Whether `source` is a peer's IPv6 endpoint.
#[inline(always)]
pub fn guard_source6_known(source: &GuardSource<Be128>) -> bool {
    // SAFETY: only presence is read.
    unsafe { GUARD_SOURCES6.get(source) }.is_some()
}

/// Whether `index` is one of our peers' session indexes.
#[inline(always)]
pub fn guard_index_known(index: u32) -> bool {
    // SAFETY: only presence is read.
    unsafe { GUARD_INDEXES.get(&index) }.is_some()
}

/// Counts one guard verdict.
#[inline(always)]
pub fn count_guard(verdict: Verdict) {
    increment(&GUARD_STATS, verdict as u32);
}

/// The overlay's settings.
#[btf_map(name = "ist_overlay")]
static OVERLAY: Array<OverlayConfig, 1> = Array::new();

/// The cluster's other nodes: PodCIDR, or address/32, → node address.
#[btf_map(name = "ist_nodes")]
static NODES: LpmTrie<Be32, Be32, { MAX_NODES as usize }> = LpmTrie::new();

/// The cluster's nodes' addresses.
#[btf_map(name = "ist_node_addrs")]
static NODE_ADDRS: HashMap<Be32, u8, { MAX_NODES as usize }, ON_DEMAND> = HashMap::new();

/// The cluster's nodes' IPv6 addresses.
#[btf_map(name = "ist_node_addrs6")]
static NODE_ADDRS6: HashMap<Be128, u8, { MAX_NODES as usize }, ON_DEMAND> = HashMap::new();

/// Overlay events; summed over CPUs by the agent.
#[btf_map(name = "ist_overlay_st")]
static OVERLAY_STATS: PerCpuArray<u64, { EVENTS.len() }> = PerCpuArray::new();

/// The overlay's settings, once the agent has created its device.
#[inline(always)]
pub fn overlay() -> Option<&'static OverlayConfig> {
    OVERLAY.get(0).filter(|c| c.ifindex != 0)
}

/// The address of the other node whose PodCIDR holds `addr`, or which is
/// `addr`.
#[inline(always)]
pub fn node_of(addr: Be32) -> Option<Be32> {
    NODES.get(&Key::new(32, addr)).copied()
}

/// Whether `addr` is the address of one of the cluster's nodes.
#[inline(always)]
pub fn is_node(addr: Be32) -> bool {
    // SAFETY: only presence is read.
    unsafe { NODE_ADDRS.get(&addr) }.is_some()
}

/// Whether `addr` is an IPv6 address of one of the cluster's nodes.
#[inline(always)]
pub fn is_node6(addr: Be128) -> bool {
    // SAFETY: only presence is read.
    unsafe { NODE_ADDRS6.get(&addr) }.is_some()
}

/// Counts one overlay event.
#[inline(always)]
pub fn count_overlay(event: OverlayEvent) {
    increment(&OVERLAY_STATS, event as u32);
}

/// Destinations whose packets take the stack, where the node's netfilter
/// rules act on them (prefix → 1).
#[btf_map(name = "ist_stack_dsts")]
static STACK_DESTINATIONS: LpmTrie<Be32, u8, { MAX_STACK_DESTINATIONS as usize }> = LpmTrie::new();

/// Whether packets to `dst` must take the stack, past netfilter or not.
#[inline(always)]
pub fn takes_the_stack(dst: Be32) -> bool {
    STACK_DESTINATIONS.get(&Key::new(32, dst)).is_some()
}

/// As `ist_stack_dsts`, for IPv6.
#[btf_map(name = "ist_stack_dsts6")]
static STACK_DESTINATIONS6: LpmTrie<Be128, u8, { MAX_STACK_DESTINATIONS as usize }> =
    LpmTrie::new();

/// Whether IPv6 packets to `dst` must take the stack, past netfilter or
/// not.
#[inline(always)]
pub fn takes_the_stack6(dst: Be128) -> bool {
    STACK_DESTINATIONS6.get(&Key::new(128, dst)).is_some()
}

/// The pod devices (veths) of this node, by ifindex.
#[btf_map(name = "ist_pod_devs")]
static POD_DEVS: HashMap<u32, u8, { MAX_POD_DEVS as usize }, ON_DEMAND> = HashMap::new();

/// Whether `ifindex` is one of this node's pod veths.
#[inline(always)]
pub fn is_pod_dev(ifindex: u32) -> bool {
    // SAFETY: only presence is read.
    unsafe { POD_DEVS.get(&ifindex) }.is_some()
}
