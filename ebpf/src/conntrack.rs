//! Stateful source NAT: the flow table and port allocation, one set of
//! tables per address family. See `isthmus_common::conntrack` for the
//! layout and the state machine.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::{Array, HashMap, LruHashMap},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::btf_map,
};
use isthmus_common::{
    conntrack::{
        DIR_IN, DIR_OUT, FlowKey, FlowNat, FragKey, PORT_MIN, SnatConfig, TcpState, TrackedAddr,
        next_tcp_state, reply_key,
    },
    ipv4::PROTO_TCP,
    names::{DEFAULT_CONNTRACK, MAX_FRAGMENTS},
    room::{FlowTable, OWNER_LOCAL, Short},
    wire::{Be16, Be32, Be128},
};

use crate::{
    budget,
    maps::{self, ON_DEMAND},
    parse::{Fragment, Transport},
    room,
};

/// A family's flow table: masqueraded flows, an entry per direction.
type Flows<A> = HashMap<FlowKey<A>, FlowNat<A>, { DEFAULT_CONNTRACK as usize }, ON_DEMAND>;

/// A family's fragment table: where the first fragment of each
/// masqueraded datagram was translated to, for the later ones, which
/// carry no ports. An LRU: a forgotten datagram costs only its later
/// fragments, which are then dropped and counted.
type Fragments<A> = LruHashMap<FragKey<A>, A, { MAX_FRAGMENTS as usize }>;

#[btf_map(name = "ist_conntrack")]
static FLOWS: Flows<Be32> = HashMap::new();

#[btf_map(name = "ist_conntrack6")]
static FLOWS6: Flows<Be128> = HashMap::new();

#[btf_map(name = "ist_frags")]
static FRAGS: Fragments<Be32> = LruHashMap::new();

#[btf_map(name = "ist_frags6")]
static FRAGS6: Fragments<Be128> = LruHashMap::new();

/// The gateway's masquerade settings, per family.
#[btf_map(name = "ist_snat")]
static SNAT: Array<SnatConfig, 1> = Array::new();

#[btf_map(name = "ist_snat6")]
static SNAT6: Array<SnatConfig<Be128>, 1> = Array::new();

/// An address family's masquerade tables. Both families' flows are
/// charged to one room per owner ([`FlowTable::Conntrack`]): a peer's
/// share bounds what it holds in both.
pub trait Tables: TrackedAddr {
    /// Its flows.
    fn flows() -> &'static Flows<Self>;
    /// Its fragments.
    fn fragments() -> &'static Fragments<Self>;
    /// Its masquerade settings.
    fn settings() -> &'static Array<SnatConfig<Self>, 1>;
    /// The identification of `fragment`'s datagram, as its key holds it.
    fn fragment_id(fragment: &Fragment) -> Self::FragmentId;
    /// The peer whose networks hold `addr`, as we see them.
    fn peer_id(addr: Self) -> Option<u32>;
    /// Charges a new fragment entry to peer `peer_id`, as
    /// [`budget::take_fragment`] says.
    fn take_fragment(peer_id: u32) -> bool;
}

impl Tables for Be32 {
    #[inline(always)]
    fn flows() -> &'static Flows<Self> {
        &FLOWS
    }

    #[inline(always)]
    fn fragments() -> &'static Fragments<Self> {
        &FRAGS
    }

    #[inline(always)]
    fn settings() -> &'static Array<SnatConfig<Self>, 1> {
        &SNAT
    }

    #[inline(always)]
    fn fragment_id(fragment: &Fragment) -> Be16 {
        // IPv4's identification, which `Fragment` widened.
        Be16::from_bits(fragment.id as u16)
    }

    #[inline(always)]
    fn peer_id(addr: Self) -> Option<u32> {
        maps::peer_id(addr)
    }

    #[inline(always)]
    fn take_fragment(peer_id: u32) -> bool {
        budget::take_fragment(peer_id)
    }
}

impl Tables for Be128 {
    #[inline(always)]
    fn flows() -> &'static Flows<Self> {
        &FLOWS6
    }

    #[inline(always)]
    fn fragments() -> &'static Fragments<Self> {
        &FRAGS6
    }

    #[inline(always)]
    fn settings() -> &'static Array<SnatConfig<Self>, 1> {
        &SNAT6
    }

    #[inline(always)]
    fn fragment_id(fragment: &Fragment) -> Be32 {
        Be32::from_bits(fragment.id)
    }

    #[inline(always)]
    fn peer_id(addr: Self) -> Option<u32> {
        maps::peer6_id(addr)
    }

    #[inline(always)]
    fn take_fragment(peer_id: u32) -> bool {
        budget::charge_fragment(peer_id)
    }
}

/// Ports tried before a flow is refused: the original, then random ones.
const PORT_TRIES: u32 = 8;
/// A busy entry's timestamp is rewritten at most this often (ns): a write
/// per packet would bounce its cache line between CPUs.
const REFRESH_NS: u64 = 1_000_000_000;
/// `-EEXIST`: the key is taken. Any other failure to insert means no
/// room: the map is full (`-E2BIG`), or, in a map allocated on demand,
/// the kernel had no memory at hand (`-ENOMEM`).
pub(crate) const EEXIST: i32 = -17;

/// Why a flow could not be masqueraded.
pub enum Refused {
    /// The flow table, or its owner's share of it, is full.
    Full,
    /// Every port tried was taken.
    NoPort,
    /// A later fragment whose first fragment was not seen.
    UnknownFragment,
}

/// The key under which the fragments of `fragment`'s datagram, from `src`
/// to `dst` in direction `dir`, find their translation.
#[inline(always)]
fn fragment_key<A: Tables>(fragment: &Fragment, src: A, dst: A, dir: u8) -> FragKey<A> {
    FragKey {
        saddr: src,
        daddr: dst,
        id: A::fragment_id(fragment),
        proto: fragment.proto,
        dir,
        pad: Default::default(),
    }
}

/// Remembers that the datagram of `fragment`, from `src` to `dst` in
/// direction `dir`, was translated to `addr` when its first fragment was,
/// if its owner (`peer_id`, or [`OWNER_LOCAL`]) has budget left: past it,
/// only this datagram's later fragments pay.
#[inline(always)]
pub fn remember_fragment<A: Tables>(
    fragment: &Fragment,
    src: A,
    dst: A,
    dir: u8,
    addr: A,
    peer_id: u32,
) {
    if !A::take_fragment(peer_id) {
        return;
    }
    let key = fragment_key(fragment, src, dst, dir);
    // Full: the LRU makes room; a failure only costs the later fragments.
    let _ = A::fragments().insert(&key, addr, 0);
}

/// Where the datagram of `fragment`, from `src` to `dst` in direction
/// `dir`, was translated to when its first fragment was.
#[inline(always)]
pub fn fragment_addr<A: Tables>(
    fragment: &Fragment,
    src: A,
    dst: A,
    dir: u8,
) -> Result<A, Refused> {
    let key = fragment_key(fragment, src, dst, dir);
    // SAFETY: an address, copied out at once.
    unsafe { A::fragments().get(&key) }
        .copied()
        .ok_or(Refused::UnknownFragment)
}

/// The masquerade address, when masquerading is on.
#[inline(always)]
pub fn masquerade_addr<A: Tables>() -> Option<A> {
    let config = A::settings().get(0)?;
    (config.enabled != 0).then_some(config.addr)
}

/// The flow key of a packet leaving towards a peer.
#[inline(always)]
fn out_key<A: Tables>(t: &Transport, src: A, dst: A) -> FlowKey<A> {
    FlowKey::new(src, dst, t.sport, t.dport, t.proto, DIR_OUT)
}

/// The flow key of a reply arriving from a peer, or None when `t` cannot
/// be one (a packet of the family's ICMP, `icmp`, that is not an echo
/// reply, `echo_reply`).
#[inline(always)]
fn in_key<A: Tables>(
    t: &Transport,
    src: A,
    dst: A,
    icmp: u8,
    echo_reply: u8,
) -> Option<FlowKey<A>> {
    let (sport, dport) = match t.proto {
        proto if proto == icmp && t.icmp_type != echo_reply => return None,
        proto if proto == icmp => (0, t.sport),
        _ => (t.sport, t.dport),
    };
    Some(FlowKey::new(src, dst, sport, dport, t.proto, DIR_IN))
}

/// Where the flow of `t` from `src` to `dst` goes out as, behind `masq`:
/// its existing entry, or a new one with a port of ours that no other flow
/// to the same peer address and port holds, charged to the owner of its
/// source.
#[inline(always)]
pub fn outbound<A: Tables>(t: &Transport, src: A, dst: A, masq: A) -> Result<FlowNat<A>, Refused> {
    let (key, tcp_flags) = (&out_key(t, src, dst), t.tcp_flags);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(entry) = A::flows().get_ptr_mut(key) {
        // SAFETY: a valid entry pointer from the map.
        return Ok(unsafe { refresh(entry, key.proto, tcp_flags, now) });
    }
    // Only a new flow looks its owner up: the peer its source is in, or
    // the gateway itself (the node's own traffic, the conncheck's).
    let owner = A::peer_id(key.saddr).unwrap_or(OWNER_LOCAL);
    room::take(FlowTable::Conntrack, owner).map_err(|_| Refused::Full)?;
    let result = insert(key, masq, tcp_flags, owner, now);
    if let Err(refused) = &result {
        room::give_back(FlowTable::Conntrack, owner);
        if matches!(refused, Refused::Full) {
            room::refused(FlowTable::Conntrack, owner, Short::Table);
        }
    }
    result
}

/// Inserts both entries of a new flow of `owner`, whose room is charged.
#[inline(always)]
fn insert<A: Tables>(
    key: &FlowKey<A>,
    masq: A,
    tcp_flags: u8,
    owner: u32,
    now: u64,
) -> Result<FlowNat<A>, Refused> {
    let mut nat = FlowNat {
        addr: masq,
        port: key.sport,
        state: initial_state(key.proto, tcp_flags),
        answered: 0,
        owner,
        pad: Default::default(),
        last_seen: now,
    };
    let back = FlowNat {
        addr: key.saddr,
        port: key.sport,
        state: TcpState::None as u8,
        ..nat
    };
    for _ in 0..PORT_TRIES {
        let reply = reply_key(key, &nat);
        match A::flows().insert(reply, back, BPF_NOEXIST as u64) {
            Ok(()) => return claim(key, &reply, nat),
            Err(EEXIST) => {
                // SAFETY: bpf_get_prandom_u32 has no preconditions.
                let r = unsafe { bpf_get_prandom_u32() };
                nat.port = PORT_MIN + (r % (u16::MAX as u32 - PORT_MIN as u32 + 1)) as u16;
            }
            Err(_) => return Err(Refused::Full),
        }
    }
    Err(Refused::NoPort)
}

/// Publishes the outbound entry once its reply entry holds the port. If
/// another CPU published the same flow first, its entry wins, and the
/// room taken for this one is given back.
#[inline(always)]
fn claim<A: Tables>(
    key: &FlowKey<A>,
    reply: &FlowKey<A>,
    nat: FlowNat<A>,
) -> Result<FlowNat<A>, Refused> {
    let flows = A::flows();
    match flows.insert(key, nat, BPF_NOEXIST as u64) {
        Ok(()) => Ok(nat),
        Err(e) => {
            let _ = flows.remove(reply);
            // SAFETY: a u64-aligned value copied out at once.
            match unsafe { flows.get(key) } {
                Some(existing) if e == EEXIST => {
                    room::give_back(FlowTable::Conntrack, nat.owner);
                    Ok(*existing)
                }
                _ => Err(Refused::Full),
            }
        }
    }
}

/// Where a reply `t` from `src` to `masq` goes back to: the original
/// source and port, if the flow is known (`icmp` and `echo_reply` are the
/// family's, see [`in_key`]). The flow is then answered, and no longer the
/// first to go when room is short.
#[inline(always)]
pub fn inbound<A: Tables>(
    t: &Transport,
    src: A,
    masq: A,
    icmp: u8,
    echo_reply: u8,
) -> Option<FlowNat<A>> {
    let key = &in_key(t, src, masq, icmp, echo_reply)?;
    let tcp_flags = t.tcp_flags;
    let entry = A::flows().get_ptr_mut(key)?;
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a valid entry pointer from the map.
    unsafe {
        mark_answered(addr_of_mut!((*entry).answered));
        Some(refresh(entry, key.proto, tcp_flags, now))
    }
}

/// Marks a flow answered, writing only the first time: a write per packet
/// would bounce the entry's cache line between CPUs.
///
/// # Safety
/// `answered` points into a live entry of a flow table.
#[inline(always)]
pub(crate) unsafe fn mark_answered(answered: *mut u8) {
    // SAFETY: the caller's promise.
    unsafe {
        if read_volatile(answered) == 0 {
            write_volatile(answered, 1);
        }
    }
}

#[inline(always)]
pub(crate) fn initial_state(proto: u8, tcp_flags: u8) -> u8 {
    if proto == PROTO_TCP {
        next_tcp_state(TcpState::None, tcp_flags) as u8
    } else {
        TcpState::None as u8
    }
}

/// Records a packet on the entry at `entry` and returns a copy of it.
///
/// # Safety
/// `entry` points at a live entry of a family's [`Tables::flows`].
#[inline(always)]
unsafe fn refresh<A: Tables>(
    entry: *mut FlowNat<A>,
    proto: u8,
    tcp_flags: u8,
    now: u64,
) -> FlowNat<A> {
    // SAFETY: fields of a live, aligned map entry (the caller's promise).
    unsafe {
        let (state, last_seen) = touch(
            addr_of_mut!((*entry).state),
            addr_of_mut!((*entry).last_seen),
            proto,
            tcp_flags,
            now,
        );
        FlowNat {
            addr: read_volatile(addr_of!((*entry).addr)),
            port: read_volatile(addr_of!((*entry).port)),
            state,
            answered: 0,
            // What a first fragment is charged to: a load from the line
            // just read, where a trie lookup for the few first fragments
            // cost the egress NAT 25,000 of the verifier's instructions.
            owner: read_volatile(addr_of!((*entry).owner)),
            pad: Default::default(),
            last_seen,
        }
    }
}

/// Records a packet with `tcp_flags` at `now` on one direction's state at
/// `state_at` and its flow's timestamp at `seen_at`; returns both as they
/// now are.
///
/// Other CPUs update the same entry while this one does: the entry is
/// never borrowed, and each field is read and written once, whole, with a
/// volatile access, so the compiler neither caches nor splits one. Two
/// racing updates leave one writer's state and timestamp, both valid.
///
/// # Safety
/// Both point into one live, aligned entry of a flow table: a family's
/// [`Tables::flows`], or
/// the isolation's flows towards segregated peers.
#[inline(always)]
pub(crate) unsafe fn touch(
    state_at: *mut u8,
    seen_at: *mut u64,
    proto: u8,
    tcp_flags: u8,
    now: u64,
) -> (u8, u64) {
    // SAFETY: the caller's promise.
    unsafe {
        let seen = read_volatile(seen_at);
        let before = read_volatile(state_at);
        let state = if proto == PROTO_TCP {
            next_tcp_state(TcpState::from_u8(before), tcp_flags) as u8
        } else {
            before
        };
        if state != before || now.wrapping_sub(seen) > REFRESH_NS {
            write_volatile(state_at, state);
            write_volatile(seen_at, now);
            (state, now)
        } else {
            (state, seen)
        }
    }
}
