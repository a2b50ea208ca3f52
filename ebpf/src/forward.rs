//! Forwarding past the stack: a packet the FIB settles in one step gets
//! its next hop's MACs and a TTL one lower, and is redirected there, as
//! the stack would forward it, without its IP layer, netfilter hooks and
//! a second pass through the backlog. Anything the FIB does not settle so
//! is left to the stack.

use core::mem::size_of;

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_UNSPEC, bpf_fib_lookup},
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_peer, bpf_skb_change_head},
    programs::TcContext,
};
use isthmus_common::{
    ipv4::{self, Header, MIN_HLEN},
    overlay::OverlayEvent,
};

use crate::{maps, parse::ETH_HLEN};

const AF_INET: u8 = 2;
/// An Ethernet header for an L3 packet, whose MACs are set later; the
/// ethertype is IPv4.
pub const L2_HEADER: [u8; 14] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];

/// Where the FIB sends a packet: out of `ifindex`, to `dmac`, from `smac`.
pub struct NextHop {
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
}

/// The FIB's next hop for a packet with header `ip`, when it settles it
/// in one step. Not for a packet to this host, too big for the way out (a
/// GSO packet's total length says so too), to a next hop not resolved
/// yet, or whose TTL runs out: the stack does those, and answers with the
/// ICMP errors path MTU discovery and traceroute need.
#[inline(always)]
pub fn route(ctx: &TcContext, ip: Header) -> Option<NextHop> {
    if !ip.is_valid() || ip.ttl() <= 1 {
        return None;
    }
    // SAFETY: all-zero is a valid bpf_fib_lookup.
    let mut fib: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    fib.family = AF_INET;
    fib.l4_protocol = ip.proto();
    fib.__bindgen_anon_1.tot_len = ip.total_len();
    fib.__bindgen_anon_2.tos = ip.tos();
    fib.__bindgen_anon_3.ipv4_src = ip.src().to_bits();
    fib.__bindgen_anon_4.ipv4_dst = ip.dst().to_bits();
    // SAFETY: reading a field of the context.
    fib.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: `fib` is a complete bpf_fib_lookup of the size given.
    let found = unsafe {
        fib_lookup(
            ctx.skb.skb.cast(),
            &mut fib,
            size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    (found == i64::from(BPF_FIB_LKUP_RET_SUCCESS)).then_some(NextHop {
        ifindex: fib.ifindex,
        dmac: fib.dmac,
        smac: fib.smac,
    })
}

/// Sends the packet whose IPv4 header `ip` starts at `l3` to `next_hop`,
/// as the stack would forward it: the next hop's MACs, a TTL one lower.
#[inline(always)]
pub fn send(ctx: &TcContext, l3: usize, ip: Header, next_hop: &NextHop) -> i32 {
    let ttl_proto = [ip.ttl(), ip.proto()];
    let lowered = [ttl_proto[0] - 1, ttl_proto[1]];
    let old = u16::from_ne_bytes(ttl_proto);
    let new = u16::from_ne_bytes(lowered);
    let rewritten = ctx
        .l3_csum_replace(l3 + ipv4::CHECK, u64::from(old), u64::from(new), 2)
        .and_then(|()| ctx.store(l3 + ipv4::TTL, &lowered, 0))
        .and_then(|()| ctx.store(0, &next_hop.dmac, 0))
        .and_then(|()| ctx.store(6, &next_hop.smac, 0));
    if rewritten.is_err() {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(OverlayEvent::Forwarded);
    // A pod's veth: straight into the pod's netns, skipping the veth's
    // transmit and a second pass through the backlog.
    if maps::is_pod_dev(next_hop.ifindex) {
        // SAFETY: plain helper call on a veth, from TC ingress.
        return unsafe { bpf_redirect_peer(next_hop.ifindex, 0) as i32 };
    }
    // SAFETY: plain helper call; an L3 device drops the MAC header itself.
    unsafe { bpf_redirect(next_hop.ifindex, 0) as i32 }
}

/// TC ingress, a packet whose IPv4 header `ip` starts at `l3` (0 on an L3
/// device): forwarded past the stack when the FIB settles it in one step
/// out of an Ethernet device; left to the stack otherwise.
#[inline(always)]
pub fn onward(ctx: &TcContext, l3: usize, ip: &[u8; MIN_HLEN]) -> i32 {
    let Some(next_hop) = route(ctx, Header(ip)) else {
        return TC_ACT_UNSPEC;
    };
    if l3 == 0 && !push_l2_header(ctx) {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    send(ctx, ETH_HLEN, Header(ip), &next_hop)
}

/// Prepends an Ethernet header to an L3 packet.
#[inline(always)]
pub fn push_l2_header(ctx: &TcContext) -> bool {
    // SAFETY: the helper checks the skb itself.
    let grown = unsafe { bpf_skb_change_head(ctx.skb.skb, L2_HEADER.len() as u32, 0) };
    grown == 0 && ctx.store(0, &L2_HEADER, 0).is_ok()
}
