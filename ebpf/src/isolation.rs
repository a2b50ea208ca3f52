//! Cross-cluster isolation (`isthmus_common::isolation`): what a segregated
//! peer may open connections to, and the flows our side opened towards it,
//! whose replies pass; one pair of tables per address family.

use core::{mem::MaybeUninit, ptr::addr_of_mut};

use aya_ebpf::{
    bindings::BPF_NOEXIST, btf_maps::HashMap, helpers::bpf_ktime_get_ns, macros::btf_map,
};
use isthmus_common::{
    conntrack::{FlowKey, TcpState},
    ipv4::{PROTO_ICMP, PROTO_TCP},
    isolation::{AllowKey, PeerFlow, is_icmp, reply_key},
    names::{DEFAULT_ALLOWED, DEFAULT_PEER_FLOWS},
    room::{FlowTable, Short},
    tcp::{ACK, SYN},
    wire::{Address, Be32, Be128},
};

use crate::{
    conntrack::{self, EEXIST},
    maps::ON_DEMAND,
    parse::{Packet, Transport},
    room, stack,
};

/// A family's allowed table: what segregated peers may open connections to.
type Allowed<A> = HashMap<AllowKey<A>, u8, { DEFAULT_ALLOWED as usize }, ON_DEMAND>;

/// A family's flows our side opened towards segregated peers, keyed as
/// their replies arrive.
type Flows<A> = HashMap<FlowKey<A>, PeerFlow, { DEFAULT_PEER_FLOWS as usize }, ON_DEMAND>;

#[btf_map(name = "ist_allowed")]
static ALLOWED: Allowed<Be32> = HashMap::new();

#[btf_map(name = "ist_allowed6")]
static ALLOWED6: Allowed<Be128> = HashMap::new();

#[btf_map(name = "ist_peer_flows")]
static FLOWS: Flows<Be32> = HashMap::new();

#[btf_map(name = "ist_peer_flows6")]
static FLOWS6: Flows<Be128> = HashMap::new();

/// An address family's isolation tables. Both families' flows are charged
/// to one room per peer ([`FlowTable::PeerFlows`]): a peer's share bounds
/// what it holds in both.
pub trait Tables: Address + 'static {
    /// Whether a segregated peer's ICMP errors pass when the flow they
    /// quote would; otherwise they are dropped.
    const JUDGES_ERRORS: bool;
    /// What segregated peers may open connections to.
    fn allowed() -> &'static Allowed<Self>;
    /// The flows our side opened towards them.
    fn flows() -> &'static Flows<Self>;
}

impl Tables for Be32 {
    const JUDGES_ERRORS: bool = true;

    #[inline(always)]
    fn allowed() -> &'static Allowed<Self> {
        &ALLOWED
    }

    #[inline(always)]
    fn flows() -> &'static Flows<Self> {
        &FLOWS
    }
}

impl Tables for Be128 {
    // Judged, the ICMPv6 errors' stage goes past what its verifier
    // budget allows: after the walks of two chains of extension headers,
    // each error it lets on is walked through the rest of the stage again
    // (964,444 of the verifier's 1,000,000 instructions, measured; the
    // lookups in a subprogram of their own changed nothing).
    const JUDGES_ERRORS: bool = false;

    #[inline(always)]
    fn allowed() -> &'static Allowed<Self> {
        &ALLOWED6
    }

    #[inline(always)]
    fn flows() -> &'static Flows<Self> {
        &FLOWS6
    }
}

/// The table of flows towards segregated peers is full.
pub struct Full;

/// Towards segregated peer `peer_id`: remembers the flow of `t`, from
/// `ours` (real, before the translation) to the peer's `theirs`, so its
/// replies pass, charging it to the peer's room. A SYN-ACK answers a
/// connection the peer opened (to what it is allowed to reach): it is no
/// flow of ours, and starts none.
#[inline(always)]
pub fn remember<A: Tables>(peer_id: u32, t: &Transport, ours: A, theirs: A) -> Result<(), Full> {
    let key = reply_key(t.proto, ours, t.sport, theirs, t.dport);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(entry) = A::flows().get_ptr_mut(&key) {
        // SAFETY: fields of a valid entry pointer from the map.
        unsafe {
            let ours_at = addr_of_mut!((*entry).ours);
            let seen_at = addr_of_mut!((*entry).last_seen);
            conntrack::touch(ours_at, seen_at, t.proto, t.tcp_flags, now);
        }
        return Ok(());
    }
    if t.proto == PROTO_TCP && t.tcp_flags & (SYN | ACK) == SYN | ACK {
        return Ok(());
    }
    room::take(FlowTable::PeerFlows, peer_id).map_err(|_| Full)?;
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid PeerFlow. Zeroed word by word: a literal's
    // zero padding became a memset call.
    let life = unsafe { stack::zeroed::<PeerFlow>(&mut slot) };
    life.ours = conntrack::initial_state(t.proto, t.tcp_flags);
    life.theirs = TcpState::None as u8;
    life.owner = peer_id;
    life.last_seen = now;
    match A::flows().insert(&key, life, BPF_NOEXIST as u64) {
        Ok(()) => Ok(()),
        Err(e) => {
            room::give_back(FlowTable::PeerFlows, peer_id);
            if e == EEXIST {
                // Another CPU inserted it first: remembered all the same.
                return Ok(());
            }
            room::refused(FlowTable::PeerFlows, peer_id, Short::Table);
            Err(Full)
        }
    }
}

/// From segregated peer `peer_id`: whether `pkt`, from the peer's `theirs`
/// to `ours` (translated), may go on. An ICMP error passes when the flow
/// it quotes would.
#[inline(always)]
pub fn admits<A: Tables>(peer_id: u32, pkt: &Packet<A>, theirs: A, ours: A) -> bool {
    if let Some(err) = &pkt.icmp_error {
        // The quoted packet went from us to the peer: its source port is ours.
        // An error is no answer: it keeps the flow, and changes no state
        // (as a packet that is not TCP would not).
        return A::JUDGES_ERRORS
            && err.quoted_flow.is_some_and(|f| {
                reply(
                    reply_key(f.proto, ours, f.sport, err.quoted.dst, f.dport),
                    PROTO_ICMP,
                    0,
                ) || allowed(peer_id, ours, f.proto, f.sport)
            });
    }
    match &pkt.transport {
        Some(t) => {
            // Arriving, our port is the destination's; an echo's identifier either way.
            let our_port = if is_icmp(t.proto) { t.sport } else { t.dport };
            let key = reply_key(t.proto, ours, our_port, theirs, t.sport);
            reply(key, t.proto, t.tcp_flags) || allowed(peer_id, ours, t.proto, t.dport)
        }
        // A later fragment, or another protocol: only where any port is open.
        None => exists(&AllowKey::any_port(peer_id, ours)),
    }
}

/// Whether `key` is a reply to a flow our side opened; it records the
/// peer's side of the flow.
#[inline(always)]
fn reply<A: Tables>(key: FlowKey<A>, proto: u8, tcp_flags: u8) -> bool {
    let Some(entry) = A::flows().get_ptr_mut(&key) else {
        return false;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: fields of a valid entry pointer from the map.
    unsafe {
        conntrack::mark_answered(addr_of_mut!((*entry).answered));
        let theirs_at = addr_of_mut!((*entry).theirs);
        let seen_at = addr_of_mut!((*entry).last_seen);
        conntrack::touch(theirs_at, seen_at, proto, tcp_flags, now);
    }
    true
}

/// Whether `addr`'s `port` on `proto`, or any port of it, is open to the peer.
#[inline(always)]
fn allowed<A: Tables>(peer_id: u32, addr: A, proto: u8, port: u16) -> bool {
    exists(&AllowKey::endpoint(peer_id, addr, proto, port))
        || exists(&AllowKey::any_port(peer_id, addr))
}

#[inline(always)]
fn exists<A: Tables>(key: &AllowKey<A>) -> bool {
    // SAFETY: only presence is read.
    unsafe { A::allowed().get(key) }.is_some()
}
