//! docs/design.md#liqo-v1-peers: for a peer whose NAT runs Liqo v1's way,
//! we rewrite the peer's addresses, not ours.
//!
//! Towards the peer, after the egress NAT, the destination goes from our
//! view of the peer back to its real address (DNAT of the prefix). From
//! the peer, before the ingress NAT, its real source goes to our view of
//! it (SNAT of the prefix), so that the NAT, its NatMappings and its
//! checks find the peer as they find any other. Real sources may be
//! anyone's, our own pods' included: the tunnel device, which carries
//! that one peer alone, names the peer. An ICMP error's quoted header,
//! which travelled the other way, gets the same rule on its other address.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use isthmus_common::{
    counters::{DenyReason, Direction, DropReason, Kind, Link, Outcome},
    ipv4,
    nat::{PrefixRewrite, REMAPS_PEER, find_rule},
    wire::Be32,
};

use crate::{
    csum,
    family::V4,
    maps, nat,
    parse::{self, ETH_P_IP, Malformed},
    tail_call,
};

/// What the remap did with a packet.
enum Remapped {
    /// Rewritten, or no rule applied.
    Done(bool),
    /// A write the kernel refused: fields and checksums may disagree.
    Failed,
}

/// Towards a Liqo v1 peer: its destination, in our view, goes back to the
/// real address. Runs after the egress NAT, by tail call.
#[inline(always)]
pub fn dnat(ctx: &TcContext, l3: usize) -> i32 {
    let link = Link::of_l3(l3);
    let Ok(pkt) = packet(ctx, l3) else {
        return TC_ACT_UNSPEC;
    };
    let peer = maps::peer(pkt.ip.dst).or_else(|| {
        let err = pkt.icmp_error.as_ref()?;
        maps::peer(err.quoted.src)
    });
    let Some(peer) = peer.filter(|p| p.flags & REMAPS_PEER != 0) else {
        return TC_ACT_UNSPEC;
    };
    finish(
        link,
        Direction::Egress,
        rewrite(ctx, &pkt, peer.theirs, ipv4::DST),
    )
}

/// From a Liqo v1 peer, on a device that carries it alone: its real
/// source goes to our view of it; then the ingress NAT runs, by tail call.
/// A packet that cannot be read does not get in.
#[inline(always)]
pub fn snat(ctx: &TcContext, l3: usize) -> i32 {
    let link = Link::of_l3(l3);
    // SAFETY: the skb of a TC program is valid for the whole run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if let Some(peer) = maps::peer_of_device(ifindex)
        && ctx.skb.protocol() == ETH_P_IP
    {
        let Ok(pkt) = parse::ipv4::any_packet(ctx, l3) else {
            maps::count(link, Direction::Ingress, Outcome::Dropped);
            maps::count_drop(link, Direction::Ingress, DropReason::Denied);
            maps::count_denied(peer.peer_id, DenyReason::Unparseable);
            return TC_ACT_SHOT;
        };
        let back = [peer.theirs[0].inverse(), peer.theirs[1].inverse()];
        let action = finish(
            link,
            Direction::Ingress,
            rewrite(ctx, &pkt, back, ipv4::SRC),
        );
        if action != TC_ACT_UNSPEC {
            // The ingress NAT, which gives every other packet its outcome,
            // never sees this one.
            maps::count(link, Direction::Ingress, Outcome::Dropped);
            return action;
        }
    }
    tail_call::nat_in(ctx, link)
}

/// `pkt`, if it is IPv4 and can be read; anything else is not ours to
/// rewrite.
#[inline(always)]
fn packet(ctx: &TcContext, l3: usize) -> Result<parse::Packet<Be32>, Malformed> {
    if ctx.skb.protocol() != ETH_P_IP {
        return Err(Malformed);
    }
    parse::ipv4::any_packet(ctx, l3)
}

/// Applies `rules` to the peer's address at `field` (the destination
/// going out, the source coming in), and to the other address of the
/// header an ICMP error quotes.
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    pkt: &parse::Packet<Be32>,
    rules: [PrefixRewrite; 2],
    field: usize,
) -> Remapped {
    let mut changed = false;
    let theirs = nat::addr::<V4>(&pkt.ip, field);
    if let Some(rule) = find_rule(&rules, theirs) {
        let new = rule.apply(theirs);
        if csum::set_addr(ctx, &pkt.ip, field, theirs, new).is_err() {
            return Remapped::Failed;
        }
        changed |= new != theirs;
    }
    if let Some(err) = &pkt.icmp_error {
        let quoted_field = if field == ipv4::SRC {
            ipv4::DST
        } else {
            ipv4::SRC
        };
        let quoted = nat::addr::<V4>(&err.quoted, quoted_field);
        if let Some(rule) = find_rule(&rules, quoted) {
            let new = rule.apply(quoted);
            if csum::set_quoted_addr(ctx, err, quoted_field, quoted, new).is_err() {
                return Remapped::Failed;
            }
            changed |= new != quoted;
        }
    }
    Remapped::Done(changed)
}

/// Counts what the remap did, and the TC action that follows from it.
#[inline(always)]
fn finish(link: Link, direction: Direction, remapped: Remapped) -> i32 {
    match remapped {
        Remapped::Done(changed) => {
            if changed {
                maps::count_kinds(link, direction, Kind::Prefix.bit());
            }
            TC_ACT_UNSPEC
        }
        Remapped::Failed => {
            maps::count_drop(link, direction, DropReason::RewriteFailed);
            TC_ACT_SHOT
        }
    }
}
