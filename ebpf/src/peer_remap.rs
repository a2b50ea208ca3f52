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
//!
//! Both families run this code, IPv6 in programs of its own: the device's
//! IPv4 program sends an IPv6 packet on to them.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use isthmus_common::{
    counters::{DenyReason, Direction, DropReason, Kind, Link, Outcome},
    nat::{PrefixRewrite, REMAPS_PEER, find_rule},
};

use crate::{
    family::Family,
    maps, nat,
    parse::{self, ETH_P_IPV6, Parsed, Reading},
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
/// real address. Runs after family `F`'s egress NAT, by tail call.
#[inline(always)]
pub fn dnat<F: Family>(ctx: &TcContext, l3: usize) -> i32 {
    let link = Link::of_l3(l3);
    // The peer first, by the destination alone: found after the parse,
    // it was looked for in each of the parse's many outcomes, which cost
    // the IPv6 program 830,000 of the verifier's instructions. An ICMP
    // error of ours goes back to the sender of what it quotes, so its
    // destination names the peer as any packet's does.
    if ctx.skb.protocol() != F::PROTOCOL {
        return TC_ACT_UNSPEC;
    }
    let peer = F::address(ctx, l3, F::DST).and_then(F::peer);
    let Some(peer) = peer.filter(|p| p.flags & REMAPS_PEER != 0) else {
        return TC_ACT_UNSPEC;
    };
    let Ok(Parsed::Packet(pkt)) = F::parse(ctx, l3, Reading::Either) else {
        return TC_ACT_UNSPEC;
    };
    finish(
        link,
        Direction::Egress,
        rewrite::<F>(ctx, &pkt, peer.theirs, F::DST),
    )
}

/// From a Liqo v1 peer, on a device that carries it alone: its real
/// source goes to our view of it; then family `F`'s ingress NAT runs, by
/// tail call. A packet that cannot be read does not get in. The IPv4
/// program, which the device runs, sends an IPv6 packet to the IPv6 one.
#[inline(always)]
pub fn snat<F: Family>(ctx: &TcContext, l3: usize) -> i32 {
    let link = Link::of_l3(l3);
    if !F::IPV6 && ctx.skb.protocol() == ETH_P_IPV6 {
        return tail_call::peer_snat6(ctx, link);
    }
    // SAFETY: the skb of a TC program is valid for the whole run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if let Some(peer) = F::peer_of_device(ifindex)
        && ctx.skb.protocol() == F::PROTOCOL
    {
        let action = match F::parse(ctx, l3, Reading::Either) {
            Ok(Parsed::Packet(pkt)) => {
                let back = [peer.theirs[0].inverse(), peer.theirs[1].inverse()];
                finish(
                    link,
                    Direction::Ingress,
                    rewrite::<F>(ctx, &pkt, back, F::SRC),
                )
            }
            // Refused as the NAT would refuse it, for this reason.
            Ok(Parsed::Refused(reason)) => {
                maps::count_drop(link, Direction::Ingress, reason);
                TC_ACT_SHOT
            }
            // A header cut off (`Either` reads an error whole, so
            // `IcmpError` never comes).
            Ok(Parsed::IcmpError) | Err(_) => {
                maps::count_drop(link, Direction::Ingress, DropReason::Denied);
                maps::count_denied(peer.peer_id, DenyReason::Unparseable);
                TC_ACT_SHOT
            }
        };
        if action != TC_ACT_UNSPEC {
            // The ingress NAT, which gives every other packet its outcome,
            // never sees this one.
            maps::count(link, Direction::Ingress, Outcome::Dropped);
            return action;
        }
    }
    match F::IPV6 {
        false => tail_call::nat_in(ctx, link),
        true => tail_call::nat6(ctx, link, Direction::Ingress),
    }
}

/// Applies `rules` to the peer's address at `field` (the destination
/// going out, the source coming in), and to the other address of the
/// header an ICMP error quotes.
#[inline(always)]
fn rewrite<F: Family>(
    ctx: &TcContext,
    pkt: &parse::Packet<F::Addr>,
    rules: [PrefixRewrite<F::Addr>; 2],
    field: usize,
) -> Remapped {
    let mut changed = false;
    let theirs = nat::addr::<F>(&pkt.ip, field);
    if let Some(rule) = find_rule(&rules, theirs) {
        let new = rule.apply(theirs);
        if F::set_addr(ctx, &pkt.ip, field, theirs, new).is_err() {
            return Remapped::Failed;
        }
        changed |= new != theirs;
    }
    if let Some(err) = &pkt.icmp_error {
        let quoted_field = if field == F::SRC { F::DST } else { F::SRC };
        let quoted = nat::addr::<F>(&err.quoted, quoted_field);
        if let Some(rule) = find_rule(&rules, quoted) {
            let new = rule.apply(quoted);
            if F::set_quoted_addr(ctx, err, quoted_field, quoted, new).is_err() {
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
