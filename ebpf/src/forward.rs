//! Forwarding past the stack: a packet the FIB settles in one step gets
//! its next hop's MACs and a TTL one lower, and is redirected there, as
//! the stack would forward it, without its IP layer, netfilter hooks and
//! a second pass through the backlog. Anything the FIB does not settle so
//! is left to the stack.

use core::mem::{MaybeUninit, size_of};

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_UNSPEC, bpf_fib_lookup},
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_peer, bpf_skb_change_head},
    programs::TcContext,
};
use isthmus_common::{
    csum::replace2,
    ipv4::{self, Header, MIN_HLEN},
    overlay::{OverlayConfig, OverlayEvent, PAST_NETFILTER},
};

use crate::{maps, parse::ETH_HLEN, stack};

const AF_INET: u8 = 2;
/// The length of the Ethernet header pushed onto an L3 packet.
const L2_HEADER_LEN: u32 = 14;

/// That header, padded to whole words, as `stack::zeroed` writes them.
#[repr(C, align(4))]
struct L2Header {
    bytes: [u8; L2_HEADER_LEN as usize],
    _pad: [u8; 2],
}

/// Where the FIB sends a packet: out of `ifindex`, to `dmac`, from `smac`.
pub struct NextHop {
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
}

/// The FIB's next hop for a packet with header `ip`, at `l3`, when it
/// settles it in one step and the node forwards past netfilter
/// ([`PAST_NETFILTER`] in the overlay's `config`, which every caller has
/// already read).
/// Not for a packet with a mark, nor to a destination the node's netfilter
/// rules act on (`ist_stack_dsts`): the agent proved its rules harmless to
/// the others only.
/// Not for a packet to this host, too big for the way out (a GSO packet's
/// total length says so too), to a next hop not resolved yet, or whose TTL
/// runs out: the stack does those, and answers with the ICMP errors path
/// MTU discovery and traceroute need. Nor for one whose total length does
/// not hold its header or is more than the packet holds, which the stack
/// drops.
#[inline(always)]
pub fn route(ctx: &TcContext, config: &OverlayConfig, l3: usize, ip: Header) -> Option<NextHop> {
    let total = usize::from(ip.total_len());
    // SAFETY: reading a field of the context.
    let mark = unsafe { (*ctx.skb.skb).mark };
    if config.flags & PAST_NETFILTER == 0
        || mark != 0
        || !ip.is_valid()
        || total < ip.header_len()
        || l3 + total > ctx.len() as usize
        || ip.ttl() <= 1
        || maps::takes_the_stack(ip.dst())
    {
        return None;
    }
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid bpf_fib_lookup.
    let fib: &mut bpf_fib_lookup = unsafe { stack::zeroed(&mut slot) };
    fib.family = AF_INET;
    fib.l4_protocol = ip.proto();
    fib.__bindgen_anon_1.tot_len = ip.total_len();
    // SAFETY: reading a field of the context.
    fib.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    fib.__bindgen_anon_2.tos = ip.tos();
    fib.__bindgen_anon_3.ipv4_src = ip.src().to_bits();
    fib.__bindgen_anon_4.ipv4_dst = ip.dst().to_bits();
    // SAFETY: `fib` is a complete bpf_fib_lookup of the size given.
    let found = unsafe {
        fib_lookup(
            ctx.skb.skb.cast(),
            &mut *fib,
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

/// Sends the Ethernet frame whose IPv4 header is `ip` to `next_hop`, as the
/// stack would forward it: the next hop's MACs, a TTL one lower.
#[inline(always)]
pub fn send(ctx: &TcContext, ip: Header, next_hop: &NextHop) -> i32 {
    if rewrite(ctx, ip, next_hop).is_none() {
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

/// Writes the next hop's MACs and the lowered TTL, with its checksum,
/// straight into the packet: no helper call per field. The headers are
/// pulled into the linear part first if they are not there.
#[inline(always)]
fn rewrite(ctx: &TcContext, ip: Header, next_hop: &NextHop) -> Option<()> {
    let headers = ETH_HLEN + MIN_HLEN;
    if ctx.data() + headers > ctx.data_end() {
        ctx.pull_data(headers as u32).ok()?;
    }
    let start = ctx.data();
    if start + headers > ctx.data_end() {
        return None;
    }
    let ttl_proto = [ip.ttl(), ip.proto()];
    let lowered = [ttl_proto[0] - 1, ttl_proto[1]];
    let check = replace2(
        u16::from_ne_bytes([ip.0[ipv4::CHECK], ip.0[ipv4::CHECK + 1]]),
        u16::from_ne_bytes(ttl_proto),
        u16::from_ne_bytes(lowered),
    );
    // SAFETY: every byte written lies below `start + headers`, checked
    // against the packet's end just above; TC programs may write packet
    // data, and the kernel unclones the skb first.
    unsafe {
        let frame = start as *mut u8;
        frame.cast::<[u8; 6]>().write(next_hop.dmac);
        frame.add(6).cast::<[u8; 6]>().write(next_hop.smac);
        *frame.add(ETH_HLEN + ipv4::TTL) = lowered[0];
        frame
            .add(ETH_HLEN + ipv4::CHECK)
            .cast::<[u8; 2]>()
            .write(check.to_ne_bytes());
    }
    Some(())
}

/// TC ingress, a packet whose IPv4 header `ip` starts at `l3` (0 on an L3
/// device): forwarded past the stack when the FIB settles it in one step
/// out of an Ethernet device; left to the stack otherwise.
#[inline(always)]
pub fn to_next_hop(ctx: &TcContext, config: &OverlayConfig, l3: usize, ip: &[u8; MIN_HLEN]) -> i32 {
    let Some(next_hop) = route(ctx, config, l3, Header(ip)) else {
        return TC_ACT_UNSPEC;
    };
    if l3 == 0 && !push_l2_header(ctx) {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    send(ctx, Header(ip), &next_hop)
}

/// Prepends an Ethernet header to an L3 packet.
#[inline(always)]
pub fn push_l2_header(ctx: &TcContext) -> bool {
    // SAFETY: the helper checks the skb itself.
    let grown = unsafe { bpf_skb_change_head(ctx.skb.skb, L2_HEADER_LEN, 0) };
    // The MACs are set later; the ethertype is IPv4. Built on the stack,
    // not copied from a constant: a constant would sit in the object's
    // read-only data, which aya loads only where the kernel lets it probe
    // for global data, so an agent without CAP_BPF would fail on that
    // rather than on the kernel's refusal.
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid L2Header.
    let header: &mut L2Header = unsafe { stack::zeroed(&mut slot) };
    header.bytes[12] = 0x08;
    grown == 0 && ctx.store(0, &header.bytes, 0).is_ok()
}
