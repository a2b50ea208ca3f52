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
    ipv4, ipv6,
    overlay::{OverlayConfig, OverlayEvent, PAST_NETFILTER, PAST_NETFILTER6},
};

use crate::{
    maps,
    parse::{ETH_HLEN, bytes_at},
    stack,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// The length of the Ethernet header pushed onto an L3 packet.
const L2_HEADER_LEN: u32 = 14;

/// That header, padded to whole words, as `stack::zeroed` writes them.
#[repr(C, align(4))]
struct L2Header {
    bytes: [u8; L2_HEADER_LEN as usize],
    _pad: [u8; 2],
}

/// The family of a packet, as the overlay and the NAT's onward step have
/// told it before they read its header.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum IpVersion {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// Where the FIB sends a packet: out of `ifindex`, to `dmac`, from `smac`.
pub struct NextHop {
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
}

/// The fixed header of a packet the node forwards, in either family: what
/// the FIB is asked, and what forwarding changes in it.
pub trait Routed: Copy {
    /// The flag of [`OverlayConfig::flags`] that lets this family past
    /// netfilter: the agent proves each family's hooks apart.
    const PAST: u16;
    /// Its ethertype, in the order the wire has it.
    const ETHERTYPE: [u8; 2];
    /// The length of the header forwarding rewrites.
    const HLEN: usize;

    /// Whether the stack alone may forward it: a header that does not hold
    /// together, or whose length is more than the `available` bytes; a hop
    /// count that runs out; a destination the node's netfilter rules act
    /// on; and, in IPv6, a hop-by-hop header or a link-local address.
    fn for_the_stack(&self, available: usize) -> bool;
    /// Fills the FIB's question.
    fn ask(&self, fib: &mut bpf_fib_lookup);
    /// The header's bytes from its hop count on, with the count one lower
    /// (and the checksum to match, in IPv4), and where they go.
    fn lowered(&self) -> (usize, [u8; 4]);
}

impl Routed for ipv4::Header<'_> {
    const PAST: u16 = PAST_NETFILTER;
    const ETHERTYPE: [u8; 2] = [0x08, 0x00];
    const HLEN: usize = ipv4::MIN_HLEN;

    #[inline(always)]
    fn for_the_stack(&self, available: usize) -> bool {
        let total = usize::from(self.total_len());
        !self.is_valid()
            || total < self.header_len()
            || total > available
            || self.ttl() <= 1
            || maps::takes_the_stack(self.dst())
    }

    #[inline(always)]
    fn ask(&self, fib: &mut bpf_fib_lookup) {
        fib.family = AF_INET;
        fib.l4_protocol = self.proto();
        fib.__bindgen_anon_1.tot_len = self.total_len();
        fib.__bindgen_anon_2.tos = self.tos();
        fib.__bindgen_anon_3.ipv4_src = self.src().to_bits();
        fib.__bindgen_anon_4.ipv4_dst = self.dst().to_bits();
    }

    #[inline(always)]
    fn lowered(&self) -> (usize, [u8; 4]) {
        let ttl_proto = [self.ttl(), self.proto()];
        let lowered = [ttl_proto[0] - 1, ttl_proto[1]];
        let check = replace2(
            u16::from_ne_bytes([self.0[ipv4::CHECK], self.0[ipv4::CHECK + 1]]),
            u16::from_ne_bytes(ttl_proto),
            u16::from_ne_bytes(lowered),
        )
        .to_ne_bytes();
        (ipv4::TTL, [lowered[0], lowered[1], check[0], check[1]])
    }
}

impl Routed for ipv6::Header<'_> {
    const PAST: u16 = PAST_NETFILTER6;
    const ETHERTYPE: [u8; 2] = [0x86, 0xdd];
    const HLEN: usize = ipv6::HLEN;

    #[inline(always)]
    fn for_the_stack(&self, available: usize) -> bool {
        let payload = usize::from(self.payload_len());
        // A payload length of 0 announces a jumbogram's hop-by-hop option.
        !self.is_valid()
            || payload == 0
            || ipv6::HLEN + payload > available
            || self.hop_limit() <= 1
            || self.next_header() == ipv6::HOP_BY_HOP
            || link_local(self.0, ipv6::SRC)
            || link_local(self.0, ipv6::DST)
            || maps::takes_the_stack6(self.dst())
    }

    #[inline(always)]
    fn ask(&self, fib: &mut bpf_fib_lookup) {
        let h = self.0;
        // Each word as the wire has it: constant offsets, nothing checked
        // at run time.
        let word = |at: usize| u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let (src, dst) = (ipv6::SRC, ipv6::DST);
        fib.family = AF_INET6;
        fib.l4_protocol = self.next_header();
        fib.__bindgen_anon_1.tot_len = ipv6::HLEN as u16 + self.payload_len();
        // The traffic class and flow label, without the version.
        fib.__bindgen_anon_2.flowinfo = word(0) & 0x0fff_ffffu32.to_be();
        fib.__bindgen_anon_3.ipv6_src = [word(src), word(src + 4), word(src + 8), word(src + 12)];
        fib.__bindgen_anon_4.ipv6_dst = [word(dst), word(dst + 4), word(dst + 8), word(dst + 12)];
    }

    #[inline(always)]
    fn lowered(&self) -> (usize, [u8; 4]) {
        let at = ipv6::HOP_LIMIT;
        let hop_limit = self.hop_limit() - 1;
        (
            at,
            [hop_limit, self.0[at + 1], self.0[at + 2], self.0[at + 3]],
        )
    }
}

/// Whether the address at `at` of `header` is link-local (fe80::/10),
/// which the stack never forwards.
#[inline(always)]
fn link_local(header: &[u8; ipv6::HLEN], at: usize) -> bool {
    header[at] == 0xfe && header[at + 1] & 0xc0 == 0x80
}

/// The FIB's next hop for a packet with header `ip`, at `l3`, when it
/// settles it in one step and the node forwards its family past netfilter
/// ([`Routed::PAST`] in the overlay's `config`, which every caller has
/// already read).
/// Not for a packet with a mark, nor to a destination the node's netfilter
/// rules act on (`ist_stack_dsts`, `ist_stack_dsts6`): the agent proved its
/// rules harmless to the others only.
/// Not for a packet to this host, too big for the way out (a GSO packet's
/// total length says so too), to a next hop not resolved yet, or whose hop
/// count runs out: the stack does those, and answers with the ICMP errors
/// path MTU discovery and traceroute need. Nor for one whose length does
/// not hold its header or is more than the packet holds, which the stack
/// drops.
#[inline(always)]
pub fn route<H: Routed>(
    ctx: &TcContext,
    config: &OverlayConfig,
    l3: usize,
    ip: H,
) -> Option<NextHop> {
    // SAFETY: reading a field of the context.
    let mark = unsafe { (*ctx.skb.skb).mark };
    let available = (ctx.len() as usize).saturating_sub(l3);
    if config.flags & H::PAST == 0 || mark != 0 || ip.for_the_stack(available) {
        return None;
    }
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid bpf_fib_lookup.
    let fib: &mut bpf_fib_lookup = unsafe { stack::zeroed(&mut slot) };
    ip.ask(fib);
    // SAFETY: reading a field of the context.
    fib.ifindex = unsafe { (*ctx.skb.skb).ifindex };
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

/// Sends the Ethernet frame whose IP header is `ip` to `next_hop`, as the
/// stack would forward it: the next hop's MACs, a hop count one lower.
#[inline(always)]
pub fn send<H: Routed>(ctx: &TcContext, ip: H, next_hop: &NextHop) -> i32 {
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

/// Writes the next hop's MACs and the lowered hop count, with its
/// checksum in IPv4, straight into the packet: no helper call per field.
/// The headers are pulled into the linear part first if they are not
/// there.
#[inline(always)]
fn rewrite<H: Routed>(ctx: &TcContext, ip: H, next_hop: &NextHop) -> Option<()> {
    let headers = ETH_HLEN + H::HLEN;
    if ctx.data() + headers > ctx.data_end() {
        ctx.pull_data(headers as u32).ok()?;
    }
    let start = ctx.data();
    if start + headers > ctx.data_end() {
        return None;
    }
    let (at, lowered) = ip.lowered();
    // SAFETY: every byte written lies below `start + headers`, checked
    // against the packet's end just above (`at + 4` is within either
    // family's header); TC programs may write packet data, and the kernel
    // unclones the skb first.
    unsafe {
        let frame = start as *mut u8;
        frame.cast::<[u8; 6]>().write(next_hop.dmac);
        frame.add(6).cast::<[u8; 6]>().write(next_hop.smac);
        frame
            .add(ETH_HLEN + at)
            .cast::<[u8; 4]>()
            .write_unaligned(lowered);
    }
    Some(())
}

/// TC ingress, a packet whose IP header `ip` starts at `l3` (0 on an L3
/// device): forwarded past the stack when the FIB settles it in one step
/// out of an Ethernet device; left to the stack otherwise.
#[inline(always)]
pub fn to_next_hop<H: Routed>(ctx: &TcContext, config: &OverlayConfig, l3: usize, ip: H) -> i32 {
    let Some(next_hop) = route(ctx, config, l3, ip) else {
        return TC_ACT_UNSPEC;
    };
    if l3 == 0 && !push_l2_header(ctx, H::ETHERTYPE) {
        maps::count_overlay(OverlayEvent::Failed);
        return TC_ACT_UNSPEC;
    }
    send(ctx, ip, &next_hop)
}

/// As [`to_next_hop`], for the packet of `version` whose header starts at
/// `l3`, read here; to the stack if it is cut off.
#[inline(always)]
pub fn to_next_hop_at(
    ctx: &TcContext,
    config: &OverlayConfig,
    l3: usize,
    version: IpVersion,
) -> i32 {
    match version {
        IpVersion::Ipv4 => match bytes_at::<{ ipv4::MIN_HLEN }>(ctx, l3) {
            Some(ip) => to_next_hop(ctx, config, l3, ipv4::Header(&ip)),
            None => TC_ACT_UNSPEC,
        },
        IpVersion::Ipv6 => match bytes_at::<{ ipv6::HLEN }>(ctx, l3) {
            Some(ip) => to_next_hop(ctx, config, l3, ipv6::Header(&ip)),
            None => TC_ACT_UNSPEC,
        },
    }
}

/// Prepends an Ethernet header of `ethertype` to an L3 packet.
#[inline(always)]
pub fn push_l2_header(ctx: &TcContext, ethertype: [u8; 2]) -> bool {
    // SAFETY: the helper checks the skb itself.
    let grown = unsafe { bpf_skb_change_head(ctx.skb.skb, L2_HEADER_LEN, 0) };
    // The MACs are set later. Built on the stack, not copied from a
    // constant: a constant would sit in the object's read-only data, which
    // aya loads only where the kernel lets it probe for global data, so an
    // agent without CAP_BPF would fail on that rather than on the kernel's
    // refusal.
    let mut slot = MaybeUninit::uninit();
    // SAFETY: all-zero is a valid L2Header.
    let header: &mut L2Header = unsafe { stack::zeroed(&mut slot) };
    header.bytes[12] = ethertype[0];
    header.bytes[13] = ethertype[1];
    grown == 0 && ctx.store(0, &header.bytes, 0).is_ok()
}
