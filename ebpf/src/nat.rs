//! DESIGN §1 "Who rewrites what" and "NatMapping": a gateway rewrites only
//! its own side.
//!
//! Egress rewrites the source, finding the peer by destination; ingress
//! rewrites the destination, finding the peer by source. An ICMP error also
//! quotes the packet that caused it, which travelled the other way, so the
//! quoted header gets the same rule with source and destination swapped.

use aya_ebpf::{bindings::TC_ACT_UNSPEC, programs::TcContext};
use isthmus_common::{
    counters::{Direction, Outcome},
    nat::{PeerNat, find_rule},
};

use crate::{
    csum, maps,
    parse::{self, Ipv4, Malformed, ip},
};

/// `skb->protocol` of IPv4: a big-endian ethertype in a `u32`.
const ETH_P_IP: u32 = 0x0800u16.to_be() as u32;

/// Which address field is ours and which is the peer's, in one direction.
#[derive(Clone, Copy)]
struct Fields {
    ours: usize,
    theirs: usize,
}

impl Fields {
    const fn of(direction: Direction) -> Self {
        match direction {
            Direction::Egress => Self {
                ours: ip::SRC,
                theirs: ip::DST,
            },
            Direction::Ingress => Self {
                ours: ip::DST,
                theirs: ip::SRC,
            },
        }
    }

    /// The view of a packet that travelled the opposite way.
    const fn swapped(self) -> Self {
        Self {
            ours: self.theirs,
            theirs: self.ours,
        }
    }
}

#[inline(always)]
fn addr(hdr: &Ipv4, field: usize) -> u32 {
    if field == ip::SRC { hdr.src } else { hdr.dst }
}

/// Entry point shared by every NAT program. Never drops: a packet that is
/// not ours or cannot be parsed goes on untouched, and is counted.
#[inline(always)]
pub fn run(ctx: &TcContext, l3: usize, direction: Direction) -> i32 {
    let outcome = match translate(ctx, l3, direction) {
        Ok(true) => Outcome::Translated,
        Ok(false) => Outcome::Passed,
        Err(Malformed) => Outcome::Unparseable,
    };
    maps::count(direction, outcome);
    // Let any later program on the hook run, then the stack.
    TC_ACT_UNSPEC
}

#[inline(always)]
fn translate(ctx: &TcContext, l3: usize, direction: Direction) -> Result<bool, Malformed> {
    if ctx.skb.protocol() != ETH_P_IP {
        return Ok(false);
    }
    let pkt = parse::packet(ctx, l3)?;
    let fields = Fields::of(direction);
    let quoted_fields = fields.swapped();

    // A router's ICMP error comes from an address of no peer; the packet it
    // quotes still names the peer.
    let peer = maps::peer(addr(&pkt.ip, fields.theirs)).or_else(|| {
        let err = pkt.icmp_error.as_ref()?;
        maps::peer(addr(&err.quoted, quoted_fields.theirs))
    });
    let Some(peer) = peer else {
        return Ok(false);
    };
    let mut translated = false;
    let own = addr(&pkt.ip, fields.ours);
    if let Some(new) = rewrite_own(peer, direction, own) {
        csum::set_addr(ctx, &pkt.ip, fields.ours, own, new)?;
        translated = true;
    }
    if let Some(err) = &pkt.icmp_error {
        let own = addr(&err.quoted, quoted_fields.ours);
        if let Some(new) = rewrite_own(peer, direction, own) {
            csum::set_quoted_addr(ctx, err, quoted_fields.ours, own, new)?;
            translated = true;
        }
    }
    Ok(translated)
}

/// Our side's address after this gateway's rules for `peer`, if they move
/// it. Ingress undoes the prefix remap, then resolves a NatMapping
/// externalIP to its endpoint; egress does the same steps backwards.
#[inline(always)]
fn rewrite_own(peer: &PeerNat, direction: Direction, own: u32) -> Option<u32> {
    let new = match direction {
        Direction::Ingress => {
            let real = find_rule(&peer.ingress, own).map_or(own, |r| r.apply(own));
            maps::endpoint_of(peer.peer_id, real).unwrap_or(real)
        }
        Direction::Egress => {
            let external = maps::external_of(peer.peer_id, own).unwrap_or(own);
            find_rule(&peer.egress, external).map_or(external, |r| r.apply(external))
        }
    };
    (new != own).then_some(new)
}
