//! Isthmus kernel programs.
//!
//! One pair of TC programs per link type: the same NAT code, compiled with
//! the offset of the IP header fixed, so the verifier sees constants;
//! the NAT's later stages, which it goes on in by tail call (ICMP errors,
//! the masquerade), and the IPv6 NAT, the same code again for the other
//! family; the overlay's programs; and the XDP guard of the tunnel port.
#![no_std]
#![no_main]
// The BPF target has atomic adds but no compare-and-swap, so Rust's
// atomic types offer no `fetch_add` there: the intrinsic lowers to BPF's.
#![feature(core_intrinsics)]
#![allow(internal_features)]
// aya-ebpf's program macros wrap each documented program in an exported
// function of their own, which carries no doc comment.
#![allow(missing_docs)]

mod budget;
mod conntrack;
mod csum;
mod family;
mod forward;
mod guard;
mod isolation;
mod maps;
mod mss;
mod nat;
mod overlay;
mod parse;
mod peer_remap;
mod room;
mod stack;
mod tail_call;

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use isthmus_common::{
    counters::{Direction, Link},
    ipv4::{self, MIN_HLEN},
};

use family::{Family, V4, V6};
use forward::IpVersion;
use nat::Stage;
use parse::{ETH_HLEN, ETH_P_IPV6};

/// Rewrites sources of packets leaving towards a peer, on an Ethernet device.
#[classifier]
pub fn nat_egress_eth(ctx: TcContext) -> i32 {
    egress::<V4>(&ctx, ETH_HLEN, Stage::First)
}

/// Rewrites destinations of packets arriving from a peer, on an Ethernet
/// device, and sends those for another node's pods to it.
#[classifier]
pub fn nat_ingress_eth(ctx: TcContext) -> i32 {
    ingress::<V4>(&ctx, ETH_HLEN, Stage::First)
}

/// Rewrites sources of packets leaving towards a peer, on an L3 device (tun).
#[classifier]
pub fn nat_egress_ip(ctx: TcContext) -> i32 {
    egress::<V4>(&ctx, 0, Stage::First)
}

/// After `nat_egress_eth`, by tail call: an ICMP error, and the header it
/// quotes.
#[classifier]
pub fn err_egress_eth(ctx: TcContext) -> i32 {
    egress::<V4>(&ctx, ETH_HLEN, Stage::IcmpError)
}

/// After `nat_ingress_eth`, by tail call: an ICMP error, and the header it
/// quotes.
#[classifier]
pub fn err_ingress_eth(ctx: TcContext) -> i32 {
    ingress::<V4>(&ctx, ETH_HLEN, Stage::IcmpError)
}

/// After `nat_egress_ip`, by tail call: an ICMP error, and the header it
/// quotes.
#[classifier]
pub fn err_egress_ip(ctx: TcContext) -> i32 {
    egress::<V4>(&ctx, 0, Stage::IcmpError)
}

/// After `nat_ingress_ip`, by tail call: an ICMP error, and the header it
/// quotes.
#[classifier]
pub fn err_ingress_ip(ctx: TcContext) -> i32 {
    ingress::<V4>(&ctx, 0, Stage::IcmpError)
}

/// After `nat_egress_eth`, by tail call: a packet whose source the
/// masquerade translates.
#[classifier]
pub fn masq_egress_eth(ctx: TcContext) -> i32 {
    egress::<V4>(&ctx, ETH_HLEN, Stage::Masquerade)
}

/// After `nat_egress_ip`, by tail call: a packet whose source the
/// masquerade translates.
#[classifier]
pub fn masq_egress_ip(ctx: TcContext) -> i32 {
    egress::<V4>(&ctx, 0, Stage::Masquerade)
}

/// After `nat_ingress_eth`, by tail call: a packet for the masquerade
/// address, a reply to a masqueraded flow.
#[classifier]
pub fn masq_in_eth(ctx: TcContext) -> i32 {
    ingress::<V4>(&ctx, ETH_HLEN, Stage::Masquerade)
}

/// After `nat_ingress_ip`, by tail call: a packet for the masquerade
/// address, a reply to a masqueraded flow.
#[classifier]
pub fn masq_in_ip(ctx: TcContext) -> i32 {
    ingress::<V4>(&ctx, 0, Stage::Masquerade)
}

/// After `nat_egress_eth`, by tail call: an IPv6 packet.
#[classifier]
pub fn nat6_out_eth(ctx: TcContext) -> i32 {
    egress::<V6>(&ctx, ETH_HLEN, Stage::First)
}

/// After `nat_ingress_eth`, by tail call: an IPv6 packet.
#[classifier]
pub fn nat6_in_eth(ctx: TcContext) -> i32 {
    ingress::<V6>(&ctx, ETH_HLEN, Stage::First)
}

/// After `nat_egress_ip`, by tail call: an IPv6 packet.
#[classifier]
pub fn nat6_out_ip(ctx: TcContext) -> i32 {
    egress::<V6>(&ctx, 0, Stage::First)
}

/// After `nat_ingress_ip`, by tail call: an IPv6 packet.
#[classifier]
pub fn nat6_in_ip(ctx: TcContext) -> i32 {
    ingress::<V6>(&ctx, 0, Stage::First)
}

/// After `nat6_out_eth`, by tail call: an ICMPv6 error, and the header it
/// quotes.
#[classifier]
pub fn err6_out_eth(ctx: TcContext) -> i32 {
    egress::<V6>(&ctx, ETH_HLEN, Stage::IcmpError)
}

/// After `nat6_in_eth`, by tail call: an ICMPv6 error, and the header it
/// quotes.
#[classifier]
pub fn err6_in_eth(ctx: TcContext) -> i32 {
    ingress::<V6>(&ctx, ETH_HLEN, Stage::IcmpError)
}

/// After `nat6_out_ip`, by tail call: an ICMPv6 error, and the header it
/// quotes.
#[classifier]
pub fn err6_out_ip(ctx: TcContext) -> i32 {
    egress::<V6>(&ctx, 0, Stage::IcmpError)
}

/// After `nat6_in_ip`, by tail call: an ICMPv6 error, and the header it
/// quotes.
#[classifier]
pub fn err6_in_ip(ctx: TcContext) -> i32 {
    ingress::<V6>(&ctx, 0, Stage::IcmpError)
}

/// After `nat6_out_eth`, by tail call: an IPv6 packet whose source the
/// masquerade translates.
#[classifier]
pub fn masq6_out_eth(ctx: TcContext) -> i32 {
    egress::<V6>(&ctx, ETH_HLEN, Stage::Masquerade)
}

/// After `nat6_in_eth`, by tail call: an IPv6 packet for the masquerade
/// address.
#[classifier]
pub fn masq6_in_eth(ctx: TcContext) -> i32 {
    ingress::<V6>(&ctx, ETH_HLEN, Stage::Masquerade)
}

/// After `nat6_out_ip`, by tail call: an IPv6 packet whose source the
/// masquerade translates.
#[classifier]
pub fn masq6_out_ip(ctx: TcContext) -> i32 {
    egress::<V6>(&ctx, 0, Stage::Masquerade)
}

/// After `nat6_in_ip`, by tail call: an IPv6 packet for the masquerade
/// address.
#[classifier]
pub fn masq6_in_ip(ctx: TcContext) -> i32 {
    ingress::<V6>(&ctx, 0, Stage::Masquerade)
}

/// `stage` of family `F`'s egress NAT.
#[inline(always)]
fn egress<F: Family>(ctx: &TcContext, l3: usize, stage: Stage) -> i32 {
    nat_stage::<F>(ctx, l3, Direction::Egress, stage)
}

/// `stage` of family `F`'s NAT for `direction`. The IPv4 NAT's first stage
/// sends an IPv6 packet to the IPv6 NAT; a packet for a later stage goes on
/// there. A peer's packet that goes on continues after the NAT: going out,
/// a Liqo v1 peer's has its destination rewritten too
/// (docs/design.md#liqo-v1-peers); coming in, it goes to its pod.
#[inline(always)]
fn nat_stage<F: Family>(ctx: &TcContext, l3: usize, direction: Direction, stage: Stage) -> i32 {
    let link = Link::of_l3(l3);
    if !F::IPV6 && stage == Stage::First && ctx.skb.protocol() == ETH_P_IPV6 {
        return tail_call::nat6(ctx, link, direction);
    }
    let handled = nat::run::<F>(ctx, l3, direction, stage);
    if let Some(next) = handled.next {
        return tail_call::next_stage::<F>(ctx, link, direction, next);
    }
    if handled.action != TC_ACT_UNSPEC {
        return handled.action;
    }
    match direction {
        Direction::Egress if handled.remaps_peer => tail_call::peer_dnat::<F>(ctx, link),
        Direction::Ingress if handled.peers => tail_call::onward(ctx, link),
        _ => handled.action,
    }
}

/// After `nat_egress_eth`, by tail call: a Liqo v1 peer's destination goes
/// from our view of it to its real address.
#[classifier]
pub fn peer_dnat_eth(ctx: TcContext) -> i32 {
    peer_remap::dnat::<V4>(&ctx, ETH_HLEN)
}

/// After `nat_egress_ip`, by tail call: as `peer_dnat_eth`, on a tun.
#[classifier]
pub fn peer_dnat_ip(ctx: TcContext) -> i32 {
    peer_remap::dnat::<V4>(&ctx, 0)
}

/// Ingress of an Ethernet device that carries one Liqo v1 peer: its real
/// source goes to our view of it, then `nat_ingress_eth` runs.
#[classifier]
pub fn peer_snat_eth(ctx: TcContext) -> i32 {
    peer_remap::snat::<V4>(&ctx, ETH_HLEN)
}

/// As `peer_snat_eth`, on a tun, then `nat_ingress_ip`.
#[classifier]
pub fn peer_snat_ip(ctx: TcContext) -> i32 {
    peer_remap::snat::<V4>(&ctx, 0)
}

/// After the IPv6 NAT's egress, by tail call: as `peer_dnat_eth`, for
/// IPv6.
#[classifier]
pub fn peer_dnat6_eth(ctx: TcContext) -> i32 {
    peer_remap::dnat::<V6>(&ctx, ETH_HLEN)
}

/// As `peer_dnat6_eth`, on a tun.
#[classifier]
pub fn peer_dnat6_ip(ctx: TcContext) -> i32 {
    peer_remap::dnat::<V6>(&ctx, 0)
}

/// After `peer_snat_eth`, by tail call, for an IPv6 packet: as it, then
/// `nat6_in_eth` runs.
#[classifier]
pub fn peer_snat6_eth(ctx: TcContext) -> i32 {
    peer_remap::snat::<V6>(&ctx, ETH_HLEN)
}

/// As `peer_snat6_eth`, on a tun, then `nat6_in_ip`.
#[classifier]
pub fn peer_snat6_ip(ctx: TcContext) -> i32 {
    peer_remap::snat::<V6>(&ctx, 0)
}

/// Rewrites destinations of packets arriving from a peer, on an L3 device
/// (tun), and sends those for another node's pods to it.
#[classifier]
pub fn nat_ingress_ip(ctx: TcContext) -> i32 {
    ingress::<V4>(&ctx, 0, Stage::First)
}

/// `stage` of family `F`'s ingress NAT.
#[inline(always)]
fn ingress<F: Family>(ctx: &TcContext, l3: usize, stage: Stage) -> i32 {
    nat_stage::<F>(ctx, l3, Direction::Ingress, stage)
}

/// After `nat_ingress_eth`, by tail call: a peer's packet goes to its pod.
#[classifier]
pub fn nat_onward_eth(ctx: TcContext) -> i32 {
    onward(&ctx, ETH_HLEN)
}

/// After `nat_ingress_ip`, by tail call: a peer's packet goes to its pod.
#[classifier]
pub fn nat_onward_ip(ctx: TcContext) -> i32 {
    onward(&ctx, 0)
}

/// A peer's packet for a pod of another node goes there through the
/// overlay; one for a pod of this node, past the stack where the FIB
/// settles it, as the overlay's packets do on the node that takes them in.
/// An IPv6 one goes past the stack wherever the FIB settles it: the
/// overlay carries IPv6 to the gateway node alone, and the stack's routes
/// lead it to other nodes.
#[inline(always)]
fn onward(ctx: &TcContext, l3: usize) -> i32 {
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    // The NAT's parser left the headers linear: read in place.
    if ctx.skb.protocol() == ETH_P_IPV6 {
        return forward::to_next_hop_at(ctx, config, l3, IpVersion::Ipv6);
    }
    let Some(ip) = parse::bytes_at::<MIN_HLEN>(ctx, l3) else {
        return TC_ACT_UNSPEC;
    };
    overlay::to_node(ctx, config, l3, ipv4::Header(&ip).dst())
        .unwrap_or_else(|| forward::to_next_hop(ctx, config, l3, ipv4::Header(&ip)))
}

/// Sends pods' packets for peers' networks to the gateway node, or on the
/// gateway node towards the tunnel, on a pod-facing host device (ingress).
#[classifier]
pub fn overlay_steer(ctx: TcContext) -> i32 {
    overlay::steer(&ctx, ETH_HLEN)
}

/// Sends the node's own packets for peers' networks to the gateway node,
/// on the VXLAN device (egress).
#[classifier]
pub fn overlay_own(ctx: TcContext) -> i32 {
    overlay::own_to_gateway(&ctx)
}

/// Takes in the overlay's packets, on the VXLAN device (ingress).
#[classifier]
pub fn overlay_accept(ctx: TcContext) -> i32 {
    overlay::accept(&ctx)
}

/// Takes in the overlay's packets on the node's uplink (ingress), without
/// the VXLAN device where the FIB settles them.
#[classifier]
pub fn overlay_decap(ctx: TcContext) -> i32 {
    overlay::decapsulate(&ctx)
}

/// Drops datagrams to the tunnel port from unknown sources, on the uplink.
#[xdp]
pub fn tunnel_guard(ctx: XdpContext) -> u32 {
    guard::run(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
