//! Isthmus kernel programs.
//!
//! One pair of TC programs per link type: the same NAT code, compiled with
//! the offset of the IPv4 header fixed, so the verifier sees constants; and
//! the XDP guard of the tunnel port.
#![no_std]
#![no_main]

mod conntrack;
mod csum;
mod guard;
mod maps;
mod nat;
mod parse;

use aya_ebpf::{
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use isthmus_common::counters::Direction;

/// Length of an Ethernet header: where IPv4 starts on veth.
const ETH_HLEN: usize = 14;

/// Rewrites sources of packets leaving towards a peer, on an Ethernet device.
#[classifier]
pub fn nat_egress_eth(ctx: TcContext) -> i32 {
    nat::run(&ctx, ETH_HLEN, Direction::Egress)
}

/// Rewrites destinations of packets arriving from a peer, on an Ethernet device.
#[classifier]
pub fn nat_ingress_eth(ctx: TcContext) -> i32 {
    nat::run(&ctx, ETH_HLEN, Direction::Ingress)
}

/// Rewrites sources of packets leaving towards a peer, on an L3 device (tun).
#[classifier]
pub fn nat_egress_ip(ctx: TcContext) -> i32 {
    nat::run(&ctx, 0, Direction::Egress)
}

/// Rewrites destinations of packets arriving from a peer, on an L3 device (tun).
#[classifier]
pub fn nat_ingress_ip(ctx: TcContext) -> i32 {
    nat::run(&ctx, 0, Direction::Ingress)
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
