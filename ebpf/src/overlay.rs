//! The overlay between the nodes of a cluster (see
//! `isthmus_common::overlay`): the tunnel key names the node, and the
//! collect-metadata VXLAN device does the encapsulation.

use core::mem::size_of;

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_SHOT, TC_ACT_UNSPEC, bpf_fib_lookup, bpf_tunnel_key,
    },
    helpers::{
        bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_peer, bpf_skb_change_head,
        bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key,
    },
    programs::TcContext,
};
use isthmus_common::overlay::{OverlayConfig, OverlayEvent};

use crate::{
    maps,
    parse::{ETH_HLEN, ETH_P_IP, ip},
};
/// `skb->pkt_type` of a packet addressed to this host.
const PACKET_HOST: u32 = 0;
/// An Ethernet header for an L3 packet: any MACs will do, since the
/// receiving node's `accept` makes it ours; the ethertype is IPv4.
const L2_HEADER: [u8; 14] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
/// Outer TTL of overlay packets.
const OUTER_TTL: u8 = 64;

/// Worker, on a pod-facing device: a packet for a peer's networks goes to
/// the gateway node; anything else goes on untouched.
#[inline(always)]
pub fn steer(ctx: &TcContext, l3: usize) -> i32 {
    let Some(dst) = ipv4_dst(ctx, l3) else {
        return TC_ACT_UNSPEC;
    };
    if maps::peer(dst).is_none() {
        return TC_ACT_UNSPEC;
    }
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    if config.gateway == 0 {
        maps::count_overlay(OverlayEvent::NoGateway);
        return TC_ACT_UNSPEC;
    }
    encapsulate(ctx, config, config.gateway, OverlayEvent::ToGateway)
}

/// Gateway, after the ingress NAT: a packet from the tunnel for a pod of
/// another node goes to that node. `l3` is 0 on an L3 device (tun), whose
/// packets get an Ethernet header first, as the VXLAN device carries frames.
#[inline(always)]
pub fn to_node(ctx: &TcContext, l3: usize) -> i32 {
    let Some(dst) = ipv4_dst(ctx, l3) else {
        return TC_ACT_UNSPEC;
    };
    let Some(node) = maps::node_of(dst) else {
        return TC_ACT_UNSPEC;
    };
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    if l3 == 0 && !push_l2_header(ctx) {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    encapsulate(ctx, config, node, OverlayEvent::ToNode)
}

/// Every node, on the VXLAN device: a frame of our VNI is for this host,
/// whatever MAC the sender wrote; it is forwarded as the stack would, or
/// left to the stack where that takes more. A frame of another VNI is
/// dropped.
#[inline(always)]
pub fn accept(ctx: &TcContext) -> i32 {
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: all-zero is a valid bpf_tunnel_key.
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    // SAFETY: the helper writes at most `size` bytes into `key`.
    let got = unsafe {
        bpf_skb_get_tunnel_key(ctx.skb.skb, &mut key, size_of::<bpf_tunnel_key>() as u32, 0)
    };
    if got != 0 || key.tunnel_id != config.vni {
        maps::count_overlay(OverlayEvent::WrongVni);
        return TC_ACT_SHOT;
    }
    if ctx.skb.change_type(PACKET_HOST).is_err() {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(OverlayEvent::Received);
    forward(ctx)
}

const AF_INET: u8 = 2;
/// IPv4 header fields the forwarding reads.
const IP_TOS: usize = 1;
const IP_TOT_LEN: usize = 2;
const IP_TTL: usize = 8;

/// Forwards an overlay packet by the kernel's FIB, as the stack would but
/// without its receive and forward paths: the next hop's MACs, a TTL one
/// lower, and out. Whatever the FIB does not settle in one step (a packet
/// for this host, too big for the way out, a next hop not resolved yet, a
/// TTL that runs out) goes to the stack, which also answers with the ICMP
/// errors path MTU discovery and traceroute need.
#[inline(always)]
fn forward(ctx: &TcContext) -> i32 {
    const L3: usize = ETH_HLEN;
    let (Some(dst), Ok(src), Ok(tos), Ok(tot_len), Ok(ttl_proto)) = (
        ipv4_dst(ctx, L3),
        ctx.load::<u32>(L3 + ip::SRC),
        ctx.load::<u8>(L3 + IP_TOS),
        ctx.load::<u16>(L3 + IP_TOT_LEN),
        ctx.load::<[u8; 2]>(L3 + IP_TTL),
    ) else {
        return TC_ACT_UNSPEC;
    };
    if ttl_proto[0] <= 1 {
        return TC_ACT_UNSPEC;
    }
    // SAFETY: all-zero is a valid bpf_fib_lookup.
    let mut fib: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    fib.family = AF_INET;
    fib.l4_protocol = ttl_proto[1];
    fib.__bindgen_anon_1.tot_len = u16::from_be(tot_len);
    fib.__bindgen_anon_2.tos = tos;
    fib.__bindgen_anon_3.ipv4_src = src;
    fib.__bindgen_anon_4.ipv4_dst = dst;
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
    if found != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return TC_ACT_UNSPEC;
    }
    let lowered = [ttl_proto[0] - 1, ttl_proto[1]];
    let old = u16::from_ne_bytes(ttl_proto);
    let new = u16::from_ne_bytes(lowered);
    let rewritten = ctx
        .l3_csum_replace(L3 + ip::CHECK, u64::from(old), u64::from(new), 2)
        .and_then(|()| ctx.store(L3 + IP_TTL, &lowered, 0))
        .and_then(|()| ctx.store(0, &fib.dmac, 0))
        .and_then(|()| ctx.store(6, &fib.smac, 0));
    if rewritten.is_err() {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(OverlayEvent::Forwarded);
    // A pod's veth: straight into the pod's netns, skipping the veth's
    // transmit and a second pass through the backlog.
    if maps::is_pod_dev(fib.ifindex) {
        // SAFETY: plain helper call on a veth, from TC ingress.
        return unsafe { bpf_redirect_peer(fib.ifindex, 0) as i32 };
    }
    // SAFETY: plain helper call; an L3 device drops the MAC header itself.
    unsafe { bpf_redirect(fib.ifindex, 0) as i32 }
}

/// The IPv4 destination (wire order) of an IPv4 packet starting at `l3`.
#[inline(always)]
fn ipv4_dst(ctx: &TcContext, l3: usize) -> Option<u32> {
    if ctx.skb.protocol() != ETH_P_IP {
        return None;
    }
    ctx.load::<u32>(l3 + ip::DST).ok()
}

/// Prepends an Ethernet header to an L3 packet.
#[inline(always)]
fn push_l2_header(ctx: &TcContext) -> bool {
    // SAFETY: the helper checks the skb itself.
    let grown = unsafe { bpf_skb_change_head(ctx.skb.skb, L2_HEADER.len() as u32, 0) };
    grown == 0 && ctx.store(0, &L2_HEADER, 0).is_ok()
}

/// Sets the tunnel key to `remote` (wire order) and redirects the packet
/// to the VXLAN device, which encapsulates it. A refusal leaves the packet
/// to the stack: never dropped for our sake.
#[inline(always)]
fn encapsulate(ctx: &TcContext, config: &OverlayConfig, remote: u32, event: OverlayEvent) -> i32 {
    // SAFETY: all-zero is a valid bpf_tunnel_key.
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    key.tunnel_id = config.vni;
    // The helper takes the address in host order.
    key.__bindgen_anon_1.remote_ipv4 = u32::from_be(remote);
    key.tunnel_ttl = OUTER_TTL;
    // SAFETY: `key` is a complete bpf_tunnel_key of the size given.
    let set = unsafe {
        bpf_skb_set_tunnel_key(ctx.skb.skb, &mut key, size_of::<bpf_tunnel_key>() as u32, 0)
    };
    if set != 0 {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(event);
    // SAFETY: plain helper call; it returns TC_ACT_REDIRECT.
    unsafe { bpf_redirect(config.ifindex, 0) as i32 }
}
