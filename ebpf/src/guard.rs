//! The XDP guard of the tunnel's ports (see `isthmus_common::guard`):
//! drops datagrams aimed at one from sources that are not peers' endpoints
//! and that name none of our sessions (nor, on a port where the gateway
//! serves a peer that makes contact itself, initiate one), before they
//! cost userspace anything.
//! Everything else passes untouched, including what cannot be parsed,
//! with one exception: an IPv6 packet whose extension headers hide its
//! upper-layer header (a chain past the NAT's bound, a first fragment
//! without the whole chain) is dropped, since it could carry a datagram to
//! the tunnel's port past the guard.

use core::mem::size_of;

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use isthmus_common::{
    guard::{GuardSource, INITIATION, Initiations, Verdict, peer_index, receiver_offset},
    ipv4::{self, PROTO_UDP},
    ipv6::{self, Place, Stop},
    wire::{Be16, Be32, Be128},
};

use crate::{maps, parse::ETH_HLEN};

const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];
const UDP_HLEN: usize = 8;

/// The guard's action for one frame.
#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    match verdict(ctx) {
        None => xdp_action::XDP_PASS,
        Some(verdict) => {
            maps::count_guard(verdict);
            match verdict {
                Verdict::Dropped => xdp_action::XDP_DROP,
                _ => xdp_action::XDP_PASS,
            }
        }
    }
}

/// A copy of the `T` at packet offset `off`, if the packet holds it.
#[inline(always)]
fn read<T: Copy>(ctx: &XdpContext, off: usize) -> Option<T> {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + off + size_of::<T>() > end {
        return None;
    }
    // SAFETY: bounds checked just above against the packet's end.
    Some(unsafe { ((start + off) as *const T).read_unaligned() })
}

/// A UDP datagram's source address, of either family.
#[derive(Clone, Copy)]
enum Source {
    V4(Be32),
    V6(Be128),
}

/// Where a frame's UDP header is, with its source address; or the guard's
/// verdict without one; or None for a frame that holds no datagram.
enum Datagram {
    Udp { udp: usize, source: Source },
    Judged(Verdict),
}

/// None for a frame that is not a datagram to one of the tunnel's ports.
#[inline(always)]
fn verdict(ctx: &XdpContext) -> Option<Verdict> {
    let datagram = match read::<[u8; 2]>(ctx, 12)? {
        ETHERTYPE_IPV4 => ipv4_datagram(ctx)?,
        ETHERTYPE_IPV6 => ipv6_datagram(ctx)?,
        _ => return None,
    };
    let (udp, source) = match datagram {
        Datagram::Udp { udp, source } => (udp, source),
        Datagram::Judged(verdict) => return Some(verdict),
    };
    let (sport, dport): (u16, u16) = (read(ctx, udp)?, read(ctx, udp + 2)?);
    let initiations = maps::guard_port(Be16::from_bits(dport))?;
    let sport = Be16::from_bits(sport);
    let known = match source {
        Source::V4(addr) => maps::guard_source_known(&GuardSource::new(addr, sport)),
        Source::V6(addr) => maps::guard_source6_known(&GuardSource::new(addr, sport)),
    };
    if known {
        return Some(Verdict::KnownSource);
    }
    Some(judge(ctx, udp, initiations))
}

/// An IPv4 frame's datagram, if it holds one's header.
#[inline(always)]
fn ipv4_datagram(ctx: &XdpContext) -> Option<Datagram> {
    let ip: [u8; ipv4::MIN_HLEN] = read(ctx, ETH_HLEN)?;
    let ip = ipv4::Header(&ip);
    // A later fragment has no UDP header to judge by.
    if !ip.is_valid() || !ip.is_first_fragment() || ip.proto() != PROTO_UDP {
        return None;
    }
    Some(Datagram::Udp {
        udp: ETH_HLEN + ip.header_len(),
        source: Source::V4(ip.src()),
    })
}

/// An IPv6 frame's datagram, found past its extension headers within the
/// NAT's bounds; dropped where those hide it.
#[inline(always)]
fn ipv6_datagram(ctx: &XdpContext) -> Option<Datagram> {
    let ip: [u8; ipv6::HLEN] = read(ctx, ETH_HLEN)?;
    let ip = ipv6::Header(&ip);
    if !ip.is_valid() {
        return None;
    }
    let end = ctx.data_end() - ctx.data();
    let walked = ipv6::walk(ip.next_header(), ETH_HLEN + ipv6::HLEN, end, |at| {
        read(ctx, at)
    });
    let chain = walked.chain;
    match walked.stop {
        None if chain.proto == PROTO_UDP && chain.place != Place::Later => Some(Datagram::Udp {
            udp: chain.l4,
            source: Source::V6(ip.src()),
        }),
        Some(Stop::Refused(_)) => Some(Datagram::Judged(Verdict::Dropped)),
        // A later fragment has no UDP header to judge by.
        None | Some(Stop::Cut) => None,
    }
}

/// The verdict on a datagram at `udp` to a tunnel port from a source that
/// is no peer's endpoint: it passes if it names one of our sessions, or
/// initiates one where `initiations` come from anywhere.
#[inline(always)]
fn judge(ctx: &XdpContext, udp: usize, initiations: Initiations) -> Verdict {
    let message = udp + UDP_HLEN;
    let kind = read::<u8>(ctx, message);
    let receiver = kind
        .and_then(receiver_offset)
        .and_then(|offset| read::<[u8; 4]>(ctx, message + offset));
    let session = receiver
        .is_some_and(|receiver| maps::guard_index_known(peer_index(u32::from_le_bytes(receiver))));
    let udp_len = read::<[u8; 2]>(ctx, udp + 4).map(u16::from_be_bytes);
    let initiation = kind == Some(INITIATION.0)
        && udp_len == Some(UDP_HLEN as u16 + INITIATION.1)
        && initiations == Initiations::FromAnywhere;
    if session {
        Verdict::Session
    } else if initiation {
        Verdict::Initiation
    } else {
        Verdict::Dropped
    }
}
