//! Parsing of the IPv4 headers the NAT needs, with every offset checked
//! against the packet before anything is rewritten.

use aya_ebpf::programs::TcContext;

/// Offsets of fields inside an IPv4 header.
pub mod ip {
    /// Header checksum.
    pub const CHECK: usize = 10;
    /// Source address.
    pub const SRC: usize = 12;
    /// Destination address.
    pub const DST: usize = 16;
}

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const IPV4_MIN_HLEN: usize = 20;
const TCP_CHECK: usize = 16;
const TCP_MIN_HLEN: usize = 20;
const UDP_CHECK: usize = 6;
const UDP_HLEN: usize = 8;
const ICMP_CHECK: usize = 2;
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
    /// Source address, wire order.
    pub src: u32,
    /// Destination address, wire order.
    pub dst: u32,
    /// The L4 checksum that an address change must update.
    pub csum: PseudoCsum,
}

/// The ICMP error wrapped around a quoted header.
pub struct IcmpError {
    /// Packet offset of the ICMP checksum.
    pub check_off: usize,
    /// The header of the packet that caused the error.
    pub quoted: Ipv4,
}

/// A parsed IPv4 packet.
pub struct Packet {
    /// Its IPv4 header.
    pub ip: Ipv4,
    /// Set when the packet is an ICMP error carrying a quoted header.
    pub icmp_error: Option<IcmpError>,
}

#[inline(always)]
fn load<T>(ctx: &TcContext, off: usize) -> Result<T, Malformed> {
    ctx.load::<T>(off).map_err(|_| Malformed)
}

/// Parses the IPv4 packet at `off`. Fails if any header it needs is cut off.
#[inline(always)]
pub fn packet(ctx: &TcContext, off: usize) -> Result<Packet, Malformed> {
    let outer = header(ctx, off, ctx.len() as usize, true)?;
    let icmp_error = if outer.proto == PROTO_ICMP && outer.first {
        icmp_error(ctx, outer.l4, outer.end)?
    } else {
        None
    };
    Ok(Packet {
        ip: outer.ip,
        icmp_error,
    })
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
}

/// Reads the IPv4 header at `off`, within `end`. `whole` is false for a
/// quoted header, whose total length describes a packet we do not have.
#[inline(always)]
fn header(ctx: &TcContext, off: usize, end: usize, whole: bool) -> Result<Header, Malformed> {
    let version_ihl: u8 = load(ctx, off)?;
    let hlen = ((version_ihl & 0x0f) as usize) * 4;
    if version_ihl >> 4 != 4 || hlen < IPV4_MIN_HLEN || off + hlen > end {
        return Err(Malformed);
    }
    // The packet may be longer than its datagram (link padding), never shorter.
    let end = if whole {
        let total = u16::from_be(load::<u16>(ctx, off + 2)?) as usize;
        if total < hlen || off + total > end {
            return Err(Malformed);
        }
        off + total
    } else {
        end
    };
    let first = u16::from_be(load::<u16>(ctx, off + 6)?) & 0x1fff == 0;
    let proto: u8 = load(ctx, off + 9)?;
    let l4 = off + hlen;
    let csum = if first {
        pseudo_csum(proto, l4, end, whole)?
    } else {
        PseudoCsum::None
    };
    let ip = Ipv4 {
        off,
        src: load(ctx, off + ip::SRC)?,
        dst: load(ctx, off + ip::DST)?,
        csum,
    };
    Ok(Header {
        ip,
        proto,
        l4,
        end,
        first,
    })
}

/// Where the pseudo-header checksum of `proto` sits. A whole packet must hold
/// its L4 header; a quoted one often holds only 8 bytes of it, and then a
/// checksum beyond them is simply not there to update.
#[inline(always)]
fn pseudo_csum(proto: u8, l4: usize, end: usize, whole: bool) -> Result<PseudoCsum, Malformed> {
    let (check, hlen) = match proto {
        PROTO_TCP => (l4 + TCP_CHECK, TCP_MIN_HLEN),
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

/// The quoted header of an ICMP error message, if this ICMP packet is one.
#[inline(always)]
fn icmp_error(ctx: &TcContext, l4: usize, end: usize) -> Result<Option<IcmpError>, Malformed> {
    let icmp_type: u8 = load(ctx, l4)?;
    // Destination unreachable, source quench, redirect, time exceeded, parameter problem.
    if !matches!(icmp_type, 3 | 4 | 5 | 11 | 12) {
        return Ok(None);
    }
    let quoted = header(ctx, l4 + ICMP_HLEN, end, false)?.ip;
    Ok(Some(IcmpError {
        check_off: l4 + ICMP_CHECK,
        quoted,
    }))
}
