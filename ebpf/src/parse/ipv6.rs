//! The IPv6 header, its chain of extension headers, and what the NAT reads
//! behind them.
//!
//! The chain is walked by `isthmus_common::ipv6::walk`, within its bounds;
//! a packet past them is refused, and counted: its upper-layer header,
//! which the rules may need, is out of reach. A first fragment must hold
//! the whole chain and the upper-layer header's ports (RFC 7112).

use aya_ebpf::programs::TcContext;
use isthmus_common::{
    counters::DropReason,
    ipv4::{PROTO_TCP, PROTO_UDP},
    ipv6::{self, CHAIN_MAX, Chain, HLEN, PROTO_ICMPV6, Place, Stop, Walked},
    tcp,
    wire::{Be32, Be128},
};

use super::{
    Fragment, ICMP_CHECK, ICMP_HLEN, IcmpError, Ip, Malformed, Packet, Parsed, PseudoCsum, Reading,
    UDP_HLEN, View, pseudo_csum, quoted_flow, transport,
};

/// The most the parser reads past the header's start in an ordinary
/// packet: the header, its chain, and a TCP header.
const MAX_PARSED: usize = HLEN + CHAIN_MAX + tcp::MIN_HEADER;

/// The most it reads in an ICMPv6 error: the error's header, its own
/// header, the quoted header and its chain, and the quoted TCP checksum.
const MAX_PARSED_ERROR: usize = HLEN + ICMP_HLEN + HLEN + CHAIN_MAX + tcp::MIN_HEADER;

/// What the packet shares with the other fragments of its datagram, if
/// it is one of them.
#[inline(always)]
fn fragment(chain: &Chain) -> Option<Fragment> {
    (chain.place != Place::Whole).then_some(Fragment {
        id: chain.id,
        first: chain.place == Place::First,
        proto: chain.proto,
    })
}

/// Makes the headers [`packet`] reads at `off` for an ordinary packet
/// linear.
#[inline(always)]
pub fn linearize(ctx: &TcContext, off: usize) -> Result<(), Malformed> {
    super::linearize(ctx, off, MAX_PARSED)
}

/// Parses the IPv6 packet at `off` for a NAT program, as `reading` says.
/// Fails if any header it needs is cut off, or, for the stage of ICMPv6
/// errors, if the packet is no ICMPv6 error.
#[inline(always)]
pub fn packet(ctx: &TcContext, off: usize, reading: Reading) -> Result<Parsed<Be128>, Malformed> {
    let errors = reading == Reading::IcmpError;
    let len = ctx.len() as usize;
    let quotes = errors || reading == Reading::Either;
    super::linearize(ctx, off, if quotes { MAX_PARSED_ERROR } else { MAX_PARSED })?;
    let view = View::of(ctx);
    let h = ipv6::Header(view.span::<HLEN>(off)?);
    // A payload length longer than the packet is a lie; shorter is link
    // padding. Zero would be a jumbogram, which no link here carries.
    let end = off + HLEN + usize::from(h.payload_len());
    if !h.is_valid() || h.payload_len() == 0 || end > len {
        return Err(Malformed);
    }
    let (src, dst) = (
        view.address(off + ipv6::SRC)?,
        view.address(off + ipv6::DST)?,
    );
    let chain = match reading {
        Reading::Again => kept(ctx, off)?,
        Reading::Fresh | Reading::IcmpError | Reading::Either => {
            let walked = walk(ctx, h.next_header(), off + HLEN, end);
            match walked.stop {
                None => walked.chain,
                Some(Stop::Cut) => return Err(Malformed),
                Some(Stop::Refused(reason)) => return Ok(Parsed::Refused(reason)),
            }
        }
    };
    if reading == Reading::Fresh {
        keep(ctx, &chain);
    }
    let header = |csum| Ip {
        off,
        src,
        dst,
        csum,
    };
    // A later fragment carries no header of its own.
    if chain.place == Place::Later {
        return match errors {
            true => Err(Malformed),
            false => Ok(Parsed::Packet(Packet {
                ip: header(PseudoCsum::None),
                fragment: fragment(&chain),
                icmp_error: None,
                transport: None,
            })),
        };
    }
    if chain.place == Place::First && chain.l4 + upper_len(chain.proto) > end {
        return Ok(Parsed::Refused(DropReason::TinyFragment));
    }
    let is_error =
        chain.proto == PROTO_ICMPV6 && ipv6::is_error(view.span::<ICMP_HLEN>(chain.l4)?[0]);
    let either = reading == Reading::Either;
    match (errors, is_error) {
        (false, true) if !either => return Ok(Parsed::IcmpError),
        (true, false) => return Err(Malformed),
        _ => {}
    }
    let csum = pseudo_csum(chain.proto, chain.l4, end, true, PROTO_ICMPV6)?;
    let packet = if is_error {
        Packet {
            ip: header(csum),
            fragment: None,
            icmp_error: Some(icmp_error(ctx, &view, chain.l4, len)?),
            transport: None,
        }
    } else {
        Packet {
            ip: header(csum),
            fragment: fragment(&chain),
            icmp_error: None,
            transport: transport(&view, chain.proto, chain.l4, PROTO_ICMPV6)?,
        }
    };
    Ok(Parsed::Packet(packet))
}

/// The address at `field` (`ipv6::SRC` or `ipv6::DST`) of the IPv6 packet
/// at `off`, when that much of it can be read.
#[inline(always)]
pub fn address(ctx: &TcContext, off: usize, field: usize) -> Option<Be128> {
    let words: [u32; 4] = ctx.load(off + field).ok()?;
    Some(Be128::from_words(words.map(Be32::from_bits)))
}

/// Keeps `chain` in the socket buffer's control block, which a tail call
/// leaves as it was, for the stage the packet may go on in.
#[inline(always)]
fn keep(ctx: &TcContext, chain: &Chain) {
    let [first, second] = chain.keep();
    // SAFETY: the context's socket buffer, whose control block TC programs
    // may write.
    unsafe {
        (*ctx.skb.skb).cb[0] = first;
        (*ctx.skb.skb).cb[1] = second;
    }
}

/// The chain the first stage kept for the packet at `off`.
#[inline(always)]
fn kept(ctx: &TcContext, off: usize) -> Result<Chain, Malformed> {
    let cb = ctx.skb.cb();
    Chain::kept([cb[0], cb[1]], off + HLEN + CHAIN_MAX).ok_or(Malformed)
}

/// Walks the chain from a header of kind `next` at `at` within `end`.
/// Each extension header is copied out by the kernel: an offset that grows
/// by what the packet says, in a loop, is one LLVM compiles into bounds
/// checks the verifier cannot follow. Most packets have no extension
/// header, and copy nothing.
#[inline(always)]
fn walk(ctx: &TcContext, next: u8, at: usize, end: usize) -> Walked {
    ipv6::walk(next, at, end, |at| ctx.load(at).ok())
}

/// The least of the upper-layer header a first fragment must hold: what
/// names the flow.
#[inline(always)]
const fn upper_len(proto: u8) -> usize {
    match proto {
        PROTO_TCP => tcp::MIN_HEADER,
        PROTO_UDP | PROTO_ICMPV6 => UDP_HLEN,
        _ => 0,
    }
}

/// The quoted header of the ICMPv6 error message at `l4`, in a packet that
/// ends at `end`. A quoted chain that is cut off, or too long, still has
/// its addresses rewritten; only its L4 checksum and flow are out of reach.
#[inline(always)]
fn icmp_error(
    ctx: &TcContext,
    view: &View,
    l4: usize,
    end: usize,
) -> Result<IcmpError<Be128>, Malformed> {
    let off = l4 + ICMP_HLEN;
    let h = ipv6::Header(view.span::<HLEN>(off)?);
    if !h.is_valid() || off + HLEN > end {
        return Err(Malformed);
    }
    let walked = walk(ctx, h.next_header(), off + HLEN, end);
    let chain = walked.chain;
    let (csum, quoted_flow) = match walked.stop {
        None if chain.place != Place::Later => (
            pseudo_csum(chain.proto, chain.l4, end, false, PROTO_ICMPV6)?,
            quoted_flow(view, chain.proto, chain.l4, end, PROTO_ICMPV6),
        ),
        _ => (PseudoCsum::None, None),
    };
    Ok(IcmpError {
        check_off: l4 + ICMP_CHECK,
        quoted: Ip {
            off,
            src: view.address(off + ipv6::SRC)?,
            dst: view.address(off + ipv6::DST)?,
            csum,
        },
        quoted_flow,
    })
}
