//! The IPv4 header and what the NAT reads behind it.

use aya_ebpf::programs::TcContext;
use isthmus_common::{
    ipv4::{self, PROTO_ICMP},
    wire::Be32,
};

use super::{
    Fragment, ICMP_CHECK, ICMP_HLEN, IcmpError, Ip, Malformed, Packet, Parsed, PseudoCsum,
    TCP_CHECK, View, pseudo_csum, quoted_flow, transport,
};

/// The most the parser reads past the IPv4 header's start: a header with
/// options, an ICMP header, a quoted header with options, and the quoted
/// TCP checksum.
const MAX_PARSED: usize = 60 + ICMP_HLEN + 60 + TCP_CHECK + 2;

/// Makes the headers [`packet`] reads at `off` linear.
#[inline(always)]
pub fn linearize(ctx: &TcContext, off: usize) -> Result<(), Malformed> {
    super::linearize(ctx, off, MAX_PARSED)
}

/// Parses the IPv4 packet at `off` for a NAT program: one that rewrites
/// ICMP errors when `errors`, and every other packet otherwise. Fails if
/// any header it needs is cut off, or, when `errors`, if the packet is no
/// ICMP error.
#[inline(always)]
pub fn packet(ctx: &TcContext, off: usize, errors: bool) -> Result<Parsed<Be32>, Malformed> {
    let (view, outer, is_error) = outer(ctx, off)?;
    match (errors, is_error) {
        (false, true) => Ok(Parsed::IcmpError),
        (false, false) => Ok(Parsed::Packet(plain(&view, outer)?)),
        (true, true) => Ok(Parsed::Packet(error(&view, outer)?)),
        (true, false) => Err(Malformed),
    }
}

/// Parses the IPv4 packet at `off`, of either kind.
#[inline(always)]
pub fn any_packet(ctx: &TcContext, off: usize) -> Result<Packet<Be32>, Malformed> {
    let (view, outer, is_error) = outer(ctx, off)?;
    if is_error {
        error(&view, outer)
    } else {
        plain(&view, outer)
    }
}

/// The packet's own IPv4 header, in the view that reads it, and whether
/// the packet is an ICMP error.
#[inline(always)]
fn outer(ctx: &TcContext, off: usize) -> Result<(View, Header, bool), Malformed> {
    let len = ctx.len() as usize;
    linearize(ctx, off)?;
    let view = View::of(ctx);
    let outer = header(&view, off, len, true)?;
    let is_error = outer.proto == PROTO_ICMP && outer.first && is_error(&view, outer.l4)?;
    Ok((view, outer, is_error))
}

/// A packet that is no ICMP error, and its ports if it has them.
#[inline(always)]
fn plain(view: &View, outer: Header) -> Result<Packet<Be32>, Malformed> {
    let transport = if outer.first {
        transport(view, outer.proto, outer.l4, PROTO_ICMP)?
    } else {
        None
    };
    Ok(Packet {
        ip: outer.ip,
        fragment: outer.fragment,
        icmp_error: None,
        transport,
    })
}

/// An ICMP error and the header it quotes. An error names no flow of its
/// own, and the rules read only its quoted packet's: it is translated
/// whole, without state.
#[inline(always)]
fn error(view: &View, outer: Header) -> Result<Packet<Be32>, Malformed> {
    Ok(Packet {
        ip: outer.ip,
        fragment: None,
        icmp_error: Some(icmp_error(view, outer.l4, outer.end)?),
        transport: None,
    })
}

/// One IPv4 header and what follows from it.
struct Header {
    ip: Ip<Be32>,
    proto: u8,
    /// Offset of the L4 header.
    l4: usize,
    /// End of the datagram (whole packet) or of the packet (quoted header).
    end: usize,
    /// A first fragment, or not a fragment at all.
    first: bool,
    /// Set when the datagram is in fragments.
    fragment: Option<Fragment>,
}

/// Reads the IPv4 header at `off`, within `end`. `whole` is false for a
/// quoted header, whose total length describes a packet we do not have.
#[inline(always)]
fn header(view: &View, off: usize, end: usize, whole: bool) -> Result<Header, Malformed> {
    let h = ipv4::Header(view.span::<{ ipv4::MIN_HLEN }>(off)?);
    let hlen = h.header_len();
    if !h.is_valid() || off + hlen > end {
        return Err(Malformed);
    }
    // The packet may be longer than its datagram (link padding), never shorter.
    let end = if whole {
        let total = h.total_len() as usize;
        if total < hlen || off + total > end {
            return Err(Malformed);
        }
        off + total
    } else {
        end
    };
    let first = h.is_first_fragment();
    let proto = h.proto();
    let fragment = h.is_fragment().then(|| Fragment {
        id: u32::from(h.id().to_bits()),
        first,
        proto,
    });
    let l4 = off + hlen;
    let csum = if first {
        pseudo_csum(proto, l4, end, whole, PROTO_ICMP)?
    } else {
        PseudoCsum::None
    };
    let ip = Ip {
        off,
        src: h.src(),
        dst: h.dst(),
        csum,
    };
    Ok(Header {
        ip,
        proto,
        l4,
        end,
        first,
        fragment,
    })
}

/// Whether the ICMP message at `l4` is an error, which quotes a header.
#[inline(always)]
fn is_error(view: &View, l4: usize) -> Result<bool, Malformed> {
    let icmp_type = view.span::<ICMP_HLEN>(l4)?[0];
    // Destination unreachable, source quench, redirect, time exceeded, parameter problem.
    Ok(matches!(icmp_type, 3 | 4 | 5 | 11 | 12))
}

/// The quoted header of the ICMP error message at `l4`.
#[inline(always)]
fn icmp_error(view: &View, l4: usize, end: usize) -> Result<IcmpError<Be32>, Malformed> {
    let quoted = header(view, l4 + ICMP_HLEN, end, false)?;
    let quoted_flow = if quoted.first {
        quoted_flow(view, quoted.proto, quoted.l4, end, PROTO_ICMP)
    } else {
        None
    };
    Ok(IcmpError {
        check_off: l4 + ICMP_CHECK,
        quoted: quoted.ip,
        quoted_flow,
    })
}
