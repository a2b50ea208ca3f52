//! Parsing of the IPv4 headers the NAT needs, with every offset checked
//! against the packet before anything is rewritten.

use aya_ebpf::programs::TcContext;
use isthmus_common::{
    ipv4::{self, PROTO_ICMP, PROTO_TCP, PROTO_UDP},
    tcp,
    wire::{Be16, Be32},
};

/// Length of an Ethernet header: where IPv4 starts on veth and VXLAN.
pub const ETH_HLEN: usize = 14;

/// `skb->protocol` of IPv4: a big-endian ethertype in a `u32`.
pub const ETH_P_IP: u32 = 0x0800u16.to_be() as u32;

const TCP_CHECK: usize = 16;
const UDP_CHECK: usize = 6;
const UDP_HLEN: usize = 8;
/// Offset of the ICMP checksum.
pub const ICMP_CHECK: usize = 2;
const ICMP_HLEN: usize = 8;

/// The packet could not be parsed; it is passed untouched.
pub struct Malformed;

/// An L4 checksum that covers the IPv4 pseudo-header.
#[derive(Clone, Copy)]
pub enum PseudoCsum {
    /// No such checksum in reach: another protocol, or a later fragment.
    None,
    /// TCP checksum at this packet offset.
    Tcp(usize),
    /// UDP checksum at this packet offset (zero means "not computed").
    Udp(usize),
}

/// An IPv4 header, either the packet's own or one quoted in an ICMP error.
pub struct Ipv4 {
    /// Packet offset of the header.
    pub off: usize,
    /// Source address.
    pub src: Be32,
    /// Destination address.
    pub dst: Be32,
    /// The L4 checksum that an address change must update.
    pub csum: PseudoCsum,
}

/// The ICMP error wrapped around a quoted header.
pub struct IcmpError {
    /// Packet offset of the ICMP checksum.
    pub check_off: usize,
    /// The header of the packet that caused the error.
    pub quoted: Ipv4,
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
    /// IP protocol: TCP, UDP or ICMP.
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

/// ICMP echo request and reply.
pub const ICMP_ECHO_REPLY: u8 = 0;
/// ICMP echo request.
pub const ICMP_ECHO_REQUEST: u8 = 8;
/// Offset of the ICMP echo identifier.
pub const ICMP_ECHO_ID: usize = 4;

/// What a fragment shares with the others of its datagram.
#[derive(Clone, Copy)]
pub struct Fragment {
    /// The IPv4 identification.
    pub id: Be16,
    /// The first fragment, which alone carries the L4 header.
    pub first: bool,
    /// The IP protocol of the datagram.
    pub proto: u8,
}

/// A parsed IPv4 packet.
pub struct Packet {
    /// Its IPv4 header.
    pub ip: Ipv4,
    /// Set when the packet is one fragment of a datagram, unless it is an
    /// ICMP error.
    pub fragment: Option<Fragment>,
    /// Set when the packet is an ICMP error carrying a quoted header.
    pub icmp_error: Option<IcmpError>,
    /// Its ports, when it is a whole first fragment of TCP, UDP or ICMP,
    /// and no ICMP error.
    pub transport: Option<Transport>,
}

/// The most the parser reads past the IPv4 header's start: a header with
/// options, an ICMP header, a quoted header with options, and the quoted
/// TCP checksum.
const MAX_PARSED: usize = 60 + ICMP_HLEN + 60 + TCP_CHECK + 2;

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

/// Makes the headers [`packet`] parses at `off` linear, pulling them in
/// when the packet is longer than its linear part: a TCP segment's payload
/// usually lies in page fragments, and so may a GRO packet's or one sent
/// from a packet socket's ring.
#[inline(always)]
pub fn linearize(ctx: &TcContext, off: usize) -> Result<(), Malformed> {
    let len = ctx.len() as usize;
    let wanted = if len < off + MAX_PARSED {
        len
    } else {
        off + MAX_PARSED
    };
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

/// What [`packet`] found.
pub enum Parsed {
    /// A packet for this program.
    Packet(Packet),
    /// An ICMP error, which programs of their own rewrite: the verifier
    /// then walks its quoted header once, not once for every path through
    /// the NAT that other packets take.
    IcmpError,
}

/// Parses the IPv4 packet at `off` for a NAT program: one that rewrites
/// ICMP errors when `errors`, and every other packet otherwise. Fails if
/// any header it needs is cut off, or, when `errors`, if the packet is no
/// ICMP error.
#[inline(always)]
pub fn packet(ctx: &TcContext, off: usize, errors: bool) -> Result<Parsed, Malformed> {
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
pub fn any_packet(ctx: &TcContext, off: usize) -> Result<Packet, Malformed> {
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
fn plain(view: &View, outer: Header) -> Result<Packet, Malformed> {
    let transport = if outer.first {
        transport(view, outer.proto, outer.l4)?
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
fn error(view: &View, outer: Header) -> Result<Packet, Malformed> {
    Ok(Packet {
        ip: outer.ip,
        fragment: None,
        icmp_error: Some(icmp_error(view, outer.l4, outer.end)?),
        transport: None,
    })
}

/// The ports of a first fragment. `header` has already checked that the
/// whole L4 header lies within the datagram.
#[inline(always)]
fn transport(view: &View, proto: u8, l4: usize) -> Result<Option<Transport>, Malformed> {
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
        PROTO_ICMP => {
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

/// One IPv4 header and what follows from it.
struct Header {
    ip: Ipv4,
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
        id: h.id(),
        first,
        proto,
    });
    let l4 = off + hlen;
    let csum = if first {
        pseudo_csum(proto, l4, end, whole)?
    } else {
        PseudoCsum::None
    };
    let ip = Ipv4 {
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

/// Where the pseudo-header checksum of `proto` sits. A whole packet must hold
/// its L4 header; a quoted one often holds only 8 bytes of it, and then a
/// checksum beyond them is simply not there to update.
#[inline(always)]
fn pseudo_csum(proto: u8, l4: usize, end: usize, whole: bool) -> Result<PseudoCsum, Malformed> {
    let (check, hlen) = match proto {
        PROTO_TCP => (l4 + TCP_CHECK, tcp::MIN_HEADER),
        PROTO_UDP => (l4 + UDP_CHECK, UDP_HLEN),
        PROTO_ICMP if whole && l4 + ICMP_HLEN > end => return Err(Malformed),
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
        (true, _, PROTO_TCP) => Ok(PseudoCsum::Tcp(check)),
        (true, _, _) => Ok(PseudoCsum::Udp(check)),
    }
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
fn icmp_error(view: &View, l4: usize, end: usize) -> Result<IcmpError, Malformed> {
    let quoted = header(view, l4 + ICMP_HLEN, end, false)?;
    // RFC 792 quotes 8 bytes of the L4 header: both ports, or an echo's
    // identifier.
    let quoted_flow = match view.span::<ICMP_HLEN>(quoted.l4) {
        Ok(h) if quoted.first && quoted.l4 + ICMP_HLEN <= end => match quoted.proto {
            PROTO_TCP | PROTO_UDP => Some((be16(h, 0), be16(h, 2))),
            PROTO_ICMP => Some((be16(h, ICMP_ECHO_ID), 0)),
            _ => None,
        },
        _ => None,
    }
    .map(|(sport, dport)| QuotedFlow {
        proto: quoted.proto,
        sport,
        dport,
    });
    Ok(IcmpError {
        check_off: l4 + ICMP_CHECK,
        quoted: quoted.ip,
        quoted_flow,
    })
}
