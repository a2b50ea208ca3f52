//! docs/design.md#tail-calls: the program arrays a packet goes on in, and
//! what a packet that finds its slot empty gets.
//!
//! The agent pins the arrays, so the programs it left attached go on in
//! them while no agent runs. A slot is empty only if the agent failed to
//! fill it: the packet would then skip a rewrite or a check, so it is
//! dropped and counted, as Cilium does with `DROP_MISSED_TAIL_CALL`.

use aya_ebpf::{
    bindings::TC_ACT_SHOT, btf_maps::ProgramArray, macros::btf_map, programs::TcContext,
};
use isthmus_common::counters::{Direction, DropReason, Link, Outcome};

use crate::{family::Family, maps, nat::Stage};

/// The programs after the ingress NAT (`names::ONWARD_PROGRAMS`), by link.
#[btf_map(name = "ist_onward")]
static ONWARD: ProgramArray<2> = ProgramArray::new();

/// The rewrite of a Liqo v1 peer's destination, after the egress NAT
/// (`names::PEER_DNAT_PROGRAMS`), by link.
#[btf_map(name = "ist_peer_dnat")]
static PEER_DNAT: ProgramArray<2> = ProgramArray::new();

/// The ingress NAT, after the rewrite of a Liqo v1 peer's source
/// (`names::NAT_IN_PROGRAMS`), by link.
#[btf_map(name = "ist_nat_in")]
static NAT_IN: ProgramArray<2> = ProgramArray::new();

/// The NAT of ICMP errors (`names::ICMP_ERROR_PROGRAMS`), by link and
/// direction.
#[btf_map(name = "ist_icmp_error")]
static ICMP_ERROR: ProgramArray<4> = ProgramArray::new();

/// The masquerade after the egress NAT (`names::MASQUERADE_PROGRAMS`), by
/// link.
#[btf_map(name = "ist_masquerade")]
static MASQUERADE: ProgramArray<2> = ProgramArray::new();

/// The masquerade's replies, after the ingress NAT
/// (`names::MASQUERADE_IN_PROGRAMS`), by link.
#[btf_map(name = "ist_masq_in")]
static MASQUERADE_IN: ProgramArray<2> = ProgramArray::new();

/// The IPv6 NAT, which the NAT sends IPv6 packets to
/// (`names::NAT6_PROGRAMS`), by link and direction.
#[btf_map(name = "ist_nat6")]
static NAT6: ProgramArray<4> = ProgramArray::new();

/// The NAT of ICMPv6 errors (`names::ICMP6_ERROR_PROGRAMS`), by link and
/// direction.
#[btf_map(name = "ist_icmp6_error")]
static ICMP6_ERROR: ProgramArray<4> = ProgramArray::new();

/// The IPv6 masquerade, after the IPv6 NAT
/// (`names::MASQUERADE6_PROGRAMS`), by link and direction.
#[btf_map(name = "ist_masq6")]
static MASQUERADE6: ProgramArray<4> = ProgramArray::new();

/// A Liqo v1 peer's IPv6 remap (`names::PEER_REMAP6_PROGRAMS`), by link
/// and direction.
#[btf_map(name = "ist_peer_remap6")]
static PEER_REMAP6: ProgramArray<4> = ProgramArray::new();

/// Goes on in the program after the ingress NAT for `link`: a peer's
/// packet, which the NAT gave its outcome.
#[inline(always)]
pub fn onward(ctx: &TcContext, link: Link) -> i32 {
    // SAFETY: a tail call into a TC program of the agent's own object.
    unsafe { ONWARD.tail_call(ctx, link as u32) };
    missed(link, Direction::Ingress)
}

/// Goes on in the rewrite of a Liqo v1 peer's destination of family `F`
/// for `link`: a peer's packet, which the egress NAT gave its outcome.
#[inline(always)]
pub fn peer_dnat<F: Family>(ctx: &TcContext, link: Link) -> i32 {
    // SAFETY: tail calls into TC programs of the agent's own object.
    unsafe {
        match F::IPV6 {
            false => PEER_DNAT.tail_call(ctx, link as u32),
            true => PEER_REMAP6.tail_call(ctx, link.icmp_error_slot(Direction::Egress)),
        }
    };
    missed(link, Direction::Egress)
}

/// Goes on in the rewrite of a Liqo v1 peer's IPv6 source for `link`,
/// before the IPv6 NAT, which gives a packet its outcome: one that misses
/// it gets `dropped` here.
#[inline(always)]
pub fn peer_snat6(ctx: &TcContext, link: Link) -> i32 {
    // SAFETY: a tail call into a TC program of the agent's own object.
    unsafe { PEER_REMAP6.tail_call(ctx, link.icmp_error_slot(Direction::Ingress)) };
    missed_before_outcome(link, Direction::Ingress)
}

/// Goes on in the ingress NAT for `link`, which gives a packet its
/// outcome: one that misses it gets `dropped` here.
#[inline(always)]
pub fn nat_in(ctx: &TcContext, link: Link) -> i32 {
    // SAFETY: a tail call into a TC program of the agent's own object.
    unsafe { NAT_IN.tail_call(ctx, link as u32) };
    missed_before_outcome(link, Direction::Ingress)
}

/// Goes on in `stage` of family `F`'s NAT for `link` and `direction`,
/// which gives a packet its outcome: one that misses it gets `dropped`
/// here.
#[inline(always)]
pub fn next_stage<F: Family>(
    ctx: &TcContext,
    link: Link,
    direction: Direction,
    stage: Stage,
) -> i32 {
    let slot = link.icmp_error_slot(direction);
    // SAFETY: tail calls into TC programs of the agent's own object.
    unsafe {
        match (stage, F::IPV6) {
            (Stage::IcmpError, false) => ICMP_ERROR.tail_call(ctx, slot),
            (Stage::IcmpError, true) => ICMP6_ERROR.tail_call(ctx, slot),
            (Stage::Masquerade, false) => match direction {
                Direction::Egress => MASQUERADE.tail_call(ctx, link as u32),
                Direction::Ingress => MASQUERADE_IN.tail_call(ctx, link as u32),
            },
            (Stage::Masquerade, true) => MASQUERADE6.tail_call(ctx, slot),
            // No stage goes back to the first.
            (Stage::First, _) => {}
        }
    };
    missed_before_outcome(link, direction)
}

/// Goes on in the IPv6 NAT for `link` and `direction`, which gives an
/// IPv6 packet its outcome: one that misses it gets `dropped` here.
#[inline(always)]
pub fn nat6(ctx: &TcContext, link: Link, direction: Direction) -> i32 {
    // SAFETY: a tail call into a TC program of the agent's own object.
    unsafe { NAT6.tail_call(ctx, link.icmp_error_slot(direction)) };
    missed_before_outcome(link, direction)
}

/// As [`missed`], for a packet no program gave its outcome yet: it gets
/// `dropped`.
#[inline(always)]
fn missed_before_outcome(link: Link, direction: Direction) -> i32 {
    maps::count(link, direction, Outcome::Dropped);
    missed(link, direction)
}

/// A tail call returned, so its slot was empty: counted and dropped.
#[inline(always)]
fn missed(link: Link, direction: Direction) -> i32 {
    maps::count_drop(link, direction, DropReason::MissedTailCall);
    TC_ACT_SHOT
}
