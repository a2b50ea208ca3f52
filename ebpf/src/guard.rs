//! The XDP guard of the tunnel's ports (see `isthmus_common::guard`):
//! drops datagrams aimed at one from sources that are not peers' endpoints
//! and that name none of our sessions (nor, on a port where the gateway
//! serves a peer that makes contact itself, initiate one), before they
//! cost userspace anything.
//! Everything else passes untouched, including what cannot be parsed.

use core::mem::size_of;

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use isthmus_common::{
    guard::{GuardSource, INITIATION, Initiations, Verdict, peer_index, receiver_offset},
    ipv4::{self, Header, PROTO_UDP},
    wire::Be16,
};

use crate::{maps, parse::ETH_HLEN};

const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
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

/// None for a frame that is not a datagram to one of the tunnel's ports.
#[inline(always)]
fn verdict(ctx: &XdpContext) -> Option<Verdict> {
    if read::<[u8; 2]>(ctx, 12)? != ETHERTYPE_IPV4 {
        return None;
    }
    let ip: [u8; ipv4::MIN_HLEN] = read(ctx, ETH_HLEN)?;
    let ip = Header(&ip);
    // A later fragment has no UDP header to judge by.
    if !ip.is_valid() || !ip.is_first_fragment() || ip.proto() != PROTO_UDP {
        return None;
    }
    let udp = ETH_HLEN + ip.header_len();
    let (sport, dport): (u16, u16) = (read(ctx, udp)?, read(ctx, udp + 2)?);
    let initiations = maps::guard_port(Be16::from_bits(dport))?;
    if maps::guard_source_known(&GuardSource::new(ip.src(), Be16::from_bits(sport))) {
        return Some(Verdict::KnownSource);
    }
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
    Some(if session {
        Verdict::Session
    } else if initiation {
        Verdict::Initiation
    } else {
        Verdict::Dropped
    })
}
