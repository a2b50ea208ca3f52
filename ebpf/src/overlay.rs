//! The overlay between the nodes of a cluster (see
//! `isthmus_common::overlay`): the tunnel key names the node, and the
//! collect-metadata VXLAN device does the encapsulation.

use core::mem::{MaybeUninit, size_of};

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_tunnel_key},
    helpers::{bpf_redirect, bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key},
    programs::TcContext,
};
use isthmus_common::{
    ipv4::{DST, Header, MIN_HLEN, PROTO_UDP},
    ipv6,
    overlay::{OverlayConfig, OverlayEvent},
    wire::{Be32, Be128},
};

use crate::{
    forward::{self, IpVersion},
    maps,
    parse::{self, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, be16, bytes_at},
    stack,
};

/// `skb->pkt_type` of a packet addressed to this host.
const PACKET_HOST: u32 = 0;
/// Outer TTL of overlay packets.
const OUTER_TTL: u8 = 64;

/// On a pod-facing device: a packet for a peer's networks, of either
/// family, goes to the gateway node, or, on the gateway node itself,
/// towards the tunnel past the stack where the FIB settles it (its egress
/// NAT still runs). Anything else goes on untouched.
#[inline(always)]
pub fn steer(ctx: &TcContext, l3: usize) -> i32 {
    let Some(family) = peer_bound(ctx, l3) else {
        return TC_ACT_UNSPEC;
    };
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    if config.gateway.is_zero() {
        maps::count_overlay(OverlayEvent::NoGateway);
        return TC_ACT_UNSPEC;
    }
    if config.gateway == config.local {
        // The egress NAT parses the packet next: pulled once, for both.
        let pulled = match family {
            IpVersion::Ipv4 => parse::ipv4::linearize(ctx, l3),
            IpVersion::Ipv6 => parse::ipv6::linearize(ctx, l3),
        };
        if pulled.is_err() {
            return TC_ACT_UNSPEC;
        }
        return forward::to_next_hop_at(ctx, config, l3, family);
    }
    encapsulate(ctx, config, config.gateway, OverlayEvent::ToGateway)
}

/// A worker, on the VXLAN device (egress): the node's own packet for a
/// peer's networks, which its routes send into the device, goes to the
/// gateway node, which masquerades it. A packet the steering or the
/// gateway redirected here already has its key, and goes on as it is.
/// Without a gateway node known, the device could send it nowhere: dropped
/// and counted.
#[inline(always)]
pub fn own_to_gateway(ctx: &TcContext) -> i32 {
    // Steered packets, nearly all of what leaves here, carry their key:
    // read it before the peer table's longest-prefix lookup, which the
    // steering already did for them.
    if has_tunnel_key(ctx) || peer_bound(ctx, ETH_HLEN).is_none() {
        return TC_ACT_UNSPEC;
    }
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    if config.gateway.is_zero() || config.gateway == config.local {
        maps::count_overlay(OverlayEvent::NoGateway);
        return TC_ACT_SHOT;
    }
    if set_tunnel_key(ctx, config, config.gateway) {
        maps::count_overlay(OverlayEvent::ToGateway);
    }
    TC_ACT_UNSPEC
}

/// Gateway, after the ingress NAT: a packet from the tunnel for `dst`, a
/// pod of another node, goes to that node, and this is the TC action; None
/// for a packet for no other node. `l3` is 0 on an L3 device (tun), whose
/// packets get an Ethernet header first, as the VXLAN device carries frames.
#[inline(always)]
pub fn to_node(ctx: &TcContext, config: &OverlayConfig, l3: usize, dst: Be32) -> Option<i32> {
    let node = maps::node_of(dst)?;
    // Any MACs will do: the receiving node's `accept` makes it ours.
    if l3 == 0 && !forward::push_l2_header(ctx, <Header as forward::Routed>::ETHERTYPE) {
        maps::count_overlay(OverlayEvent::Failed);
        return Some(TC_ACT_UNSPEC);
    }
    Some(encapsulate(ctx, config, node, OverlayEvent::ToNode))
}

/// Every node, on the VXLAN device: a frame of our VNI from another node is
/// for this host, whatever MAC the sender wrote; it is forwarded as the
/// stack would, or left to the stack where that takes more. A frame of
/// another VNI, or from an address that is no node's, is dropped.
#[inline(always)]
pub fn accept(ctx: &TcContext) -> i32 {
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid bpf_tunnel_key.
    let key: &mut bpf_tunnel_key = unsafe { stack::zeroed(&mut slot) };
    if !read_tunnel_key(ctx, key) || key.tunnel_id != config.vni {
        maps::count_overlay(OverlayEvent::WrongVni);
        return TC_ACT_SHOT;
    }
    // SAFETY: an IPv4 key, as asked for; the helper gives it in host order.
    let remote = Be32::from_host(unsafe { key.__bindgen_anon_1.remote_ipv4 });
    if !maps::is_node(remote) {
        maps::count_overlay(OverlayEvent::UnknownNode);
        return TC_ACT_SHOT;
    }
    if ctx.skb.change_type(PACKET_HOST).is_err() {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(OverlayEvent::Received);
    match ctx.skb.protocol() {
        ETH_P_IP => forward::to_next_hop_at(ctx, config, ETH_HLEN, IpVersion::Ipv4),
        ETH_P_IPV6 => forward::to_next_hop_at(ctx, config, ETH_HLEN, IpVersion::Ipv6),
        _ => TC_ACT_UNSPEC,
    }
}

/// Where the outer headers end and the inner IPv4 header starts, in a
/// VXLAN frame on the node's uplink.
const OUTER_IP: usize = ETH_HLEN;
const OUTER_UDP: usize = OUTER_IP + MIN_HLEN;
const VXLAN: usize = OUTER_UDP + 8;
const INNER_ETH: usize = VXLAN + 8;
const INNER_IP: usize = INNER_ETH + ETH_HLEN;
/// The VXLAN header's flags byte with the "VNI present" bit.
const VXLAN_VNI_PRESENT: u8 = 0x08;

/// Every node, on its uplink: a VXLAN datagram of our VNI to this node's
/// overlay port whose inner packet the FIB forwards in one step loses its
/// outer headers here and goes on, without the UDP socket, the VXLAN
/// device and a second pass through the stack. One from an address that is
/// no node's is dropped here. Anything else, including a packet the FIB
/// does not settle and a GSO packet, goes on unchanged to the VXLAN
/// device's socket, and `accept`.
#[inline(always)]
pub fn decapsulate(ctx: &TcContext) -> i32 {
    let Some(config) = maps::overlay() else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: reading a field of the context.
    let gso = unsafe { (*ctx.skb.skb).gso_size } != 0;
    if config.local.is_zero() || gso || ctx.skb.protocol() != ETH_P_IP {
        return TC_ACT_UNSPEC;
    }
    // Most packets on the uplink are not ours: this read is all they cost.
    let Some(udp) = bytes_at::<{ VXLAN }>(ctx, 0) else {
        return TC_ACT_UNSPEC;
    };
    let Some(outer) = udp[OUTER_IP..].first_chunk::<MIN_HLEN>().map(Header) else {
        return TC_ACT_UNSPEC;
    };
    if !outer.is_minimal()
        || outer.proto() != PROTO_UDP
        || outer.is_fragment()
        || outer.dst() != config.local
        || be16(&udp, OUTER_UDP + 2) != config.port
    {
        return TC_ACT_UNSPEC;
    }
    let Some(frame) = bytes_at::<{ INNER_IP + MIN_HLEN }>(ctx, 0) else {
        return TC_ACT_UNSPEC;
    };
    let vni = u32::from_be_bytes([0, frame[VXLAN + 4], frame[VXLAN + 5], frame[VXLAN + 6]]);
    if frame[VXLAN] & VXLAN_VNI_PRESENT == 0
        || vni != config.vni
        || be16(&frame, INNER_ETH + 12) != ETH_TYPE_IPV4
    {
        return TC_ACT_UNSPEC;
    }
    if !maps::is_node(outer.src()) {
        maps::count_overlay(OverlayEvent::UnknownNode);
        return TC_ACT_SHOT;
    }
    let mut ip = [0u8; MIN_HLEN];
    ip.copy_from_slice(&frame[INNER_IP..]);
    let Some(next_hop) = forward::route(ctx, config, INNER_IP, Header(&ip)) else {
        return TC_ACT_UNSPEC;
    };
    // Drops the outer IPv4, UDP and VXLAN headers and the inner Ethernet
    // header; the outer Ethernet header stays, and gets the next hop's MACs.
    if ctx
        .adjust_room(-((INNER_IP - ETH_HLEN) as i32), BPF_ADJ_ROOM_MAC, 0)
        .is_err()
    {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(OverlayEvent::Decapsulated);
    forward::send(ctx, Header(&ip), &next_hop)
}

const ETH_TYPE_IPV4: u16 = 0x0800;

/// The family of a packet starting at `l3` if its destination lies in a
/// peer's networks: its destination and one lookup are all a pod's packet
/// that is for no peer costs.
#[inline(always)]
fn peer_bound(ctx: &TcContext, l3: usize) -> Option<IpVersion> {
    let protocol = ctx.skb.protocol();
    if protocol == ETH_P_IP {
        let dst = parse::peek::<4>(ctx, l3 + DST).map(Be32::from_bytes)?;
        return maps::peer(dst).map(|_| IpVersion::Ipv4);
    }
    if protocol == ETH_P_IPV6 {
        let dst = parse::peek::<16>(ctx, l3 + ipv6::DST).map(Be128::from_bytes)?;
        return maps::peer6(dst).map(|_| IpVersion::Ipv6);
    }
    None
}

/// Sets the tunnel key to `remote` and redirects the packet to the VXLAN
/// device, which encapsulates it. A refusal leaves the packet to the
/// stack: never dropped for our sake.
#[inline(always)]
fn encapsulate(ctx: &TcContext, config: &OverlayConfig, remote: Be32, event: OverlayEvent) -> i32 {
    if !set_tunnel_key(ctx, config, remote) {
        return TC_ACT_UNSPEC;
    }
    maps::count_overlay(event);
    // SAFETY: plain helper call; it returns TC_ACT_REDIRECT.
    unsafe { bpf_redirect(config.ifindex, 0) as i32 }
}

/// Gives the packet the tunnel key that sends it to node `remote`; false,
/// counted, where the kernel refuses.
#[inline(always)]
fn set_tunnel_key(ctx: &TcContext, config: &OverlayConfig, remote: Be32) -> bool {
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid bpf_tunnel_key.
    let key: &mut bpf_tunnel_key = unsafe { stack::zeroed(&mut slot) };
    key.tunnel_id = config.vni;
    // The helper takes the address in host order.
    key.__bindgen_anon_1.remote_ipv4 = remote.to_host();
    key.tunnel_ttl = OUTER_TTL;
    // SAFETY: `key` is a complete bpf_tunnel_key of the size given.
    let set = unsafe {
        bpf_skb_set_tunnel_key(
            ctx.skb.skb,
            &mut *key,
            size_of::<bpf_tunnel_key>() as u32,
            0,
        )
    };
    if set != 0 {
        maps::count_overlay(OverlayEvent::Failed);
    }
    set == 0
}

/// Whether the packet carries a tunnel key: one of ours, set before it was
/// redirected to the VXLAN device.
#[inline(always)]
fn has_tunnel_key(ctx: &TcContext) -> bool {
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid bpf_tunnel_key.
    read_tunnel_key(ctx, unsafe { stack::zeroed(&mut slot) })
}

/// Reads the packet's tunnel key into `key`; false where it has none.
#[inline(always)]
fn read_tunnel_key(ctx: &TcContext, key: &mut bpf_tunnel_key) -> bool {
    // SAFETY: the helper writes at most `size` bytes into `key`.
    let got = unsafe {
        bpf_skb_get_tunnel_key(
            ctx.skb.skb,
            &mut *key,
            size_of::<bpf_tunnel_key>() as u32,
            0,
        )
    };
    got == 0
}
