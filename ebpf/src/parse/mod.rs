//! Parsing of the IP headers the NAT needs, with every offset checked
//! against the packet before anything is rewritten: what both families
//! share here, each family's header in a module of its own.

use aya_ebpf::programs::TcContext;
use isthmus_common::{
    counters::DropReason,
    ipv4::{PROTO_TCP, PROTO_UDP},
    ipv6::PROTO_ICMPV6,
    tcp,
    wire::{Be32, Be128},
};

pub mod ipv4;
pub mod ipv6;

/// Length of an Ethernet header: where IPv4 starts on veth and VXLAN.
pub const ETH_HLEN: usize = 14;

/// `skb->protocol` of IPv4: a big-endian ethertype in a `u32`.
pub const ETH_P_IP: u32 = 0x0800u16.to_be() as u32;
/// `skb->protocol` of IPv6.
pub const ETH_P_IPV6: u32 = 0x86ddu16.to_be() as u32;

const TCP_CHECK: usize = 16;
const UDP_CHECK: usize = 6;
const UDP_HLEN: usize = 8;
/// Offset of the ICMP checksum, in either family.
pub const ICMP_CHECK: usize = 2;
const ICMP_HLEN: usize = 8;

/// The packet could not be parsed; it is passed untouched.
pub struct Malformed;

/// An L4 checksum that covers the pseudo-header, and so the addresses.
#[derive(Clone, Copy)]
pub enum PseudoCsum {
    /// No such checksum in reach: another protocol, or a later fragment.
    None,
    /// A checksum never left out, at this packet offset: TCP's, or
    /// ICMPv6's.
    Full(usize),
    /// UDP checksum at this packet offset (zero means "not computed").
    Udp(usize),
}

/// An IP header, either the packet's own or one quoted in an ICMP error,
/// with its addresses of type `A`.
pub struct Ip<A> {
    /// Packet offset of the header.
    pub off: usize,
    /// Source address.
    pub src: A,
    /// Destination address.
    pub dst: A,
    /// The L4 checksum that an address change must update.
    pub csum: PseudoCsum,
}

/// The ICMP error wrapped around a quoted header.
pub struct IcmpError<A> {
    /// Packet offset of the ICMP checksum.
    pub check_off: usize,
    /// The header of the packet that caused the error.
    pub quoted: Ip<A>,
    /// That packet's flow, when the error quotes enough of it.
    pub quoted_flow: Option<QuotedFlow>,
}

/// The flow of a packet quoted in an ICMP error, as its sender named it.
#[derive(Clone, Copy)]
pub struct QuotedFlow {
    /// IP protocol.
    pub proto: u8,
    /// Source port; an ICMP echo's identifier.
    pub sport: u16,
    /// Destination port; 0 for ICMP.
    pub dport: u16,
}

/// The ports of a whole first fragment: what names its flow.
pub struct Transport {
    /// IP protocol: TCP, UDP, or the family's ICMP.
    pub proto: u8,
    /// Packet offset of the L4 header.
    pub off: usize,
    /// Source port; an ICMP echo's identifier.
    pub sport: u16,
    /// Destination port; 0 for ICMP.
    pub dport: u16,
    /// TCP flags; 0 for the others.
    pub tcp_flags: u8,
    /// ICMP type; 0 for the others.
    pub icmp_type: u8,
}

/// What a stage of the NAT parses a packet as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A packet first seen: anything but an ICMP error. An IPv6 packet's
    /// chain of headers is walked, and kept for a later stage.
    Fresh,
    /// An ICMP error, which its own stage parses afresh.
    IcmpError,
    /// A packet the first stage parsed and sent on: an IPv6 packet's chain
    /// is the one that stage kept.
    Again,
    /// A packet of either kind, an ICMP error with its quoted header, read
    /// afresh and kept for no later stage: what a Liqo v1 peer's remap
    /// reads, which rewrites one address of both kinds.
    Either,
}

/// ICMP echo reply.
pub const ICMP_ECHO_REPLY: u8 = 0;
/// ICMP echo request.
pub const ICMP_ECHO_REQUEST: u8 = 8;
/// Offset of the ICMP echo identifier.
pub const ICMP_ECHO_ID: usize = 4;

/// What a fragment shares with the others of its datagram.
#[derive(Clone, Copy)]
pub struct Fragment {
    /// The identification, as its bits in memory: IPv4's 16 bits, widened,
    /// or IPv6's 32.
    pub id: u32,
    /// The first fragment, which alone carries the L4 header.
    pub first: bool,
    /// The IP protocol of the datagram.
    pub proto: u8,
}

/// A parsed packet, with addresses of type `A`.
pub struct Packet<A> {
    /// Its IP header.
    pub ip: Ip<A>,
    /// Set when the packet is one fragment of a datagram, unless it is an
    /// ICMP error.
    pub fragment: Option<Fragment>,
    /// Set when the packet is an ICMP error carrying a quoted header.
    pub icmp_error: Option<IcmpError<A>>,
    /// Its ports, when it is a whole first fragment of TCP, UDP or ICMP,
    /// and no ICMP error.
    pub transport: Option<Transport>,
}

/// Direct read access to the linear part of the packet. Only valid until
/// the next helper that changes packet data.
struct View {
    start: usize,
    end: usize,
}

impl View {
    /// The packet's linear part as it is now.
    #[inline(always)]
    fn of(ctx: &TcContext) -> Self {
        Self {
            start: ctx.data(),
            end: ctx.data_end(),
        }
    }

    /// The `N` bytes at `off`. Every read goes through one fixed-size span
    /// check: the verifier then accepts constant offsets into it, where a
    /// check per field can be folded by LLVM into a form it rejects.
    #[inline(always)]
    fn span<const N: usize>(&self, off: usize) -> Result<&[u8; N], Malformed> {
        if self.start + off + N > self.end {
            return Err(Malformed);
        }
        // SAFETY: bounds checked against data_end just above.
        Ok(unsafe { &*((self.start + off) as *const [u8; N]) })
    }

    /// The IPv6 address at `off`, read a word at a time: kept in four
    /// registers or stack words, not in sixteen bytes spilled one by one.
    #[inline(always)]
    fn address(&self, off: usize) -> Result<Be128, Malformed> {
        let span = self.span::<16>(off)?.as_ptr().cast::<u32>();
        // SAFETY: the 16 bytes are within the packet, as `span` checked;
        // unaligned reads of packet data are what every BPF program does.
        let word = |i| Be32::from_bits(unsafe { span.add(i).read_unaligned() });
        Ok(Be128::from_words([word(0), word(1), word(2), word(3)]))
    }
}

/// A copy of the `N` bytes at `off`, from the packet's linear part, which
/// is pulled that far first when the packet is longer but not linear. None
/// when the packet is shorter.
#[inline(always)]
pub fn bytes_at<const N: usize>(ctx: &TcContext, off: usize) -> Option<[u8; N]> {
    if ctx.data() + off + N > ctx.data_end() {
        if (ctx.len() as usize) < off + N {
            return None;
        }
        ctx.pull_data((off + N) as u32).ok()?;
    }
    let view = View::of(ctx);
    view.span::<N>(off).ok().copied()
}

/// A copy of the `N` bytes at `off`: read in place from the linear part,
/// or copied out by the kernel when they are not there, without pulling
/// the packet: for a read that most packets go no further than.
#[inline(always)]
pub fn peek<const N: usize>(ctx: &TcContext, off: usize) -> Option<[u8; N]> {
    let view = View::of(ctx);
    match view.span::<N>(off) {
        Ok(bytes) => Some(*bytes),
        Err(Malformed) => ctx.load::<[u8; N]>(off).ok(),
    }
}

/// Makes the first `max` bytes at `off`, the headers a parser reads,
/// linear, pulling them in when the packet is longer than its linear part:
/// a TCP segment's payload usually lies in page fragments, and so may a GRO
/// packet's or one sent from a packet socket's ring.
#[inline(always)]
pub fn linearize(ctx: &TcContext, off: usize, max: usize) -> Result<(), Malformed> {
    let len = ctx.len() as usize;
    let wanted = if len < off + max { len } else { off + max };
    // Forwarded packets are usually linear already; pull only when not.
    if ctx.data() + wanted > ctx.data_end() {
        ctx.pull_data(wanted as u32).map_err(|_| Malformed)?;
    }
    Ok(())
}

/// The big-endian `u16` at `at`.
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// What a family's parser found.
pub enum Parsed<A> {
    /// A packet for this program.
    Packet(Packet<A>),
    /// An ICMP error, which programs of their own rewrite: the verifier
    /// then walks its quoted header once, not once for every path through
    /// the NAT that other packets take.
    IcmpError,
    /// A packet no program may let through, for this reason.
    Refused(DropReason),
}

/// The ports of a first fragment, whose family's ICMP is `icmp`. The
/// caller has already checked that the whole L4 header lies within the
/// datagram.
#[inline(always)]
fn transport(view: &View, proto: u8, l4: usize, icmp: u8) -> Result<Option<Transport>, Malformed> {
    // (source port, destination port, TCP flags, ICMP type)
    let (sport, dport, tcp_flags, icmp_type) = match proto {
        PROTO_TCP => {
            let h = view.span::<{ tcp::MIN_HEADER }>(l4)?;
            (be16(h, 0), be16(h, 2), h[13], 0)
        }
        PROTO_UDP => {
            let h = view.span::<UDP_HLEN>(l4)?;
            (be16(h, 0), be16(h, 2), 0, 0)
        }
        _ if proto == icmp => {
            let h = view.span::<ICMP_HLEN>(l4)?;
            (be16(h, ICMP_ECHO_ID), 0, 0, h[0])
        }
        _ => return Ok(None),
    };
    Ok(Some(Transport {
        proto,
        off: l4,
        sport,
        dport,
        tcp_flags,
        icmp_type,
    }))
}

/// Where the pseudo-header checksum of `proto` sits, in a packet whose
/// family's ICMP is `icmp`. A whole packet must hold its L4 header; a
/// quoted one often holds only 8 bytes of it, and then a checksum beyond
/// them is simply not there to update. ICMPv6's checksum covers the
/// pseudo-header; ICMP's does not.
#[inline(always)]
fn pseudo_csum(
    proto: u8,
    l4: usize,
    end: usize,
    whole: bool,
    icmp: u8,
) -> Result<PseudoCsum, Malformed> {
    let (check, hlen) = match proto {
        PROTO_TCP => (l4 + TCP_CHECK, tcp::MIN_HEADER),
        PROTO_UDP => (l4 + UDP_CHECK, UDP_HLEN),
        PROTO_ICMPV6 if icmp == PROTO_ICMPV6 => (l4 + ICMP_CHECK, ICMP_HLEN),
        _ if proto == icmp && whole && l4 + ICMP_HLEN > end => return Err(Malformed),
        _ => return Ok(PseudoCsum::None),
    };
    let present = if whole {
        l4 + hlen <= end
    } else {
        check + 2 <= end
    };
    match (present, whole, proto) {
        (false, true, _) => Err(Malformed),
        (false, false, _) => Ok(PseudoCsum::None),
        (true, _, PROTO_TCP | PROTO_ICMPV6) => Ok(PseudoCsum::Full(check)),
        (true, _, _) => Ok(PseudoCsum::Udp(check)),
    }
}

/// The flow of a quoted packet whose L4 header starts at `l4`, within
/// `end`, if the error quotes enough of it: RFC 792 quotes 8 bytes of the L4
/// header, both ports or an echo's identifier.
#[inline(always)]
fn quoted_flow(view: &View, proto: u8, l4: usize, end: usize, icmp: u8) -> Option<QuotedFlow> {
    let h = view.span::<ICMP_HLEN>(l4).ok()?;
    if l4 + ICMP_HLEN > end {
        return None;
    }
    let (sport, dport) = match proto {
        PROTO_TCP | PROTO_UDP => (be16(h, 0), be16(h, 2)),
        _ if proto == icmp => (be16(h, ICMP_ECHO_ID), 0),
        _ => return None,
    };
    Some(QuotedFlow {
        proto,
        sport,
        dport,
    })
}
