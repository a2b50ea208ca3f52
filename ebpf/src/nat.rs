//! DESIGN §1 "Who rewrites what", "NatMapping" and "Stateful source NAT":
//! a gateway rewrites only its own side.
//!
//! Egress rewrites the source, finding the peer by destination; ingress
//! rewrites the destination, finding the peer by source. An ICMP error also
//! quotes the packet that caused it, which travelled the other way, so the
//! quoted header gets the same rule with source and destination swapped.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use isthmus_common::{
    conntrack::PROTO_ICMP,
    counters::{Direction, Outcome},
    nat::{PeerNat, find_rule},
};

use crate::{
    conntrack::{self, Refused},
    csum, maps,
    parse::{
        self, ETH_P_IP, ICMP_CHECK, ICMP_ECHO_ID, Ipv4, Malformed, Packet, PseudoCsum, Transport,
        ip,
    },
};

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

/// What a program did with a packet.
enum Verdict {
    Translated,
    Passed,
    /// A flow that needed masquerading could not have it.
    Dropped,
}

/// Entry point shared by every NAT program. Drops only what must be
/// masqueraded and cannot be: a packet that is not ours or cannot be parsed
/// goes on untouched, and is counted.
#[inline(always)]
pub fn run(ctx: &TcContext, l3: usize, direction: Direction) -> i32 {
    let (outcome, action) = match translate(ctx, l3, direction) {
        Ok(Verdict::Translated) => (Outcome::Translated, TC_ACT_UNSPEC),
        Ok(Verdict::Passed) => (Outcome::Passed, TC_ACT_UNSPEC),
        Ok(Verdict::Dropped) => (Outcome::Dropped, TC_ACT_SHOT),
        Err(Malformed) => (Outcome::Unparseable, TC_ACT_UNSPEC),
    };
    maps::count(direction, outcome);
    // UNSPEC lets any later program on the hook run, then the stack.
    action
}

/// Our side's new address, and port if it changes too.
struct Rewrite {
    addr: u32,
    port: Option<PortChange>,
}

/// A port (or ICMP echo identifier) to rewrite.
struct PortChange {
    off: usize,
    old: u16,
    new: u16,
}

#[inline(always)]
fn translate(ctx: &TcContext, l3: usize, direction: Direction) -> Result<Verdict, Malformed> {
    if ctx.skb.protocol() != ETH_P_IP {
        return Ok(Verdict::Passed);
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
        return Ok(Verdict::Passed);
    };

    let own = addr(&pkt.ip, fields.ours);
    let rewrite = match direction {
        Direction::Egress => match egress(peer, &pkt, own) {
            Ok(rewrite) => rewrite,
            Err(Refused::Full | Refused::NoPort) => return Ok(Verdict::Dropped),
        },
        Direction::Ingress => ingress(peer, &pkt, own),
    };
    let mut translated = false;
    if rewrite.addr != own {
        csum::set_addr(ctx, &pkt.ip, fields.ours, own, rewrite.addr)?;
        translated = true;
    }
    if let (Some(port), Some(t)) = (&rewrite.port, &pkt.transport) {
        let (check, udp) = match pkt.ip.csum {
            PseudoCsum::Tcp(off) => (off, false),
            PseudoCsum::Udp(off) => (off, true),
            PseudoCsum::None => (t.off + ICMP_CHECK, false),
        };
        csum::set_port(ctx, port.off, check, udp, port.old, port.new)?;
        translated = true;
    }
    // The quoted packet of an ICMP error gets the stateless rules only.
    if let Some(err) = &pkt.icmp_error {
        let own = addr(&err.quoted, quoted_fields.ours);
        let new = stateless(peer, direction, own);
        if new != own {
            csum::set_quoted_addr(ctx, err, quoted_fields.ours, own, new)?;
            translated = true;
        }
    }
    Ok(if translated {
        Verdict::Translated
    } else {
        Verdict::Passed
    })
}

/// Towards a peer: an endpoint takes the externalIP that peer knows it by;
/// a source that is none of ours (the node's own, or a transit flow) is
/// masqueraded; then our networks move into the peer's view of them.
#[inline(always)]
fn egress(peer: &PeerNat, pkt: &Packet, own: u32) -> Result<Rewrite, Refused> {
    let external = maps::external_of(peer.peer_id, own).unwrap_or(own);
    if let Some(rule) = find_rule(&peer.egress, external) {
        return Ok(Rewrite {
            addr: rule.apply(external),
            port: None,
        });
    }
    // None of ours: masquerade what can be, only now reading its settings.
    let Some(masq) = conntrack::masquerade_addr() else {
        return Ok(address_only(external));
    };
    // An ICMP error from one of our routers (a node, as on the way to a
    // pod with a narrower link): nothing answers it, so it takes the
    // masquerade address without state. Left as it was, the peer could not
    // route it, and its tunnel would refuse the source.
    if pkt.icmp_error.is_some() {
        return Ok(address_only(to_peer_view(peer, masq)));
    }
    let Some(t) = pkt
        .transport
        .as_ref()
        .filter(|t| conntrack::outbound_kind(t))
    else {
        return Ok(address_only(external));
    };
    let nat = conntrack::outbound(
        &conntrack::out_key(t, external, pkt.ip.dst),
        masq,
        t.tcp_flags,
    )?;
    Ok(Rewrite {
        addr: to_peer_view(peer, nat.addr),
        port: port_change(t, Direction::Egress, nat.port),
    })
}

/// From a peer: our networks come back from the peer's view; a reply to a
/// masqueraded flow goes back to its source; an externalIP resolves to its
/// endpoint.
#[inline(always)]
fn ingress(peer: &PeerNat, pkt: &Packet, own: u32) -> Rewrite {
    let real = from_peer_view(peer, own);
    if let (Some(t), Some(masq)) = (&pkt.transport, conntrack::masquerade_addr())
        && real == masq
        && let Some(key) = conntrack::in_key(t, pkt.ip.src, masq)
        && let Some(back) = conntrack::inbound(&key, t.tcp_flags)
    {
        return Rewrite {
            addr: back.addr,
            port: port_change(t, Direction::Ingress, back.port),
        };
    }
    address_only(maps::endpoint_of(peer.peer_id, real).unwrap_or(real))
}

/// The stateless rules alone (prefix remap and NatMapping), for headers
/// quoted in ICMP errors.
#[inline(always)]
fn stateless(peer: &PeerNat, direction: Direction, own: u32) -> u32 {
    match direction {
        Direction::Ingress => {
            let real = from_peer_view(peer, own);
            maps::endpoint_of(peer.peer_id, real).unwrap_or(real)
        }
        Direction::Egress => {
            to_peer_view(peer, maps::external_of(peer.peer_id, own).unwrap_or(own))
        }
    }
}

/// One of our addresses as the peer sees it (unchanged when it is none of ours).
#[inline(always)]
fn to_peer_view(peer: &PeerNat, addr: u32) -> u32 {
    find_rule(&peer.egress, addr).map_or(addr, |r| r.apply(addr))
}

/// An address in the peer's view of our networks, as it really is.
#[inline(always)]
fn from_peer_view(peer: &PeerNat, addr: u32) -> u32 {
    find_rule(&peer.ingress, addr).map_or(addr, |r| r.apply(addr))
}

/// A rewrite of the address alone.
#[inline(always)]
fn address_only(addr: u32) -> Rewrite {
    Rewrite { addr, port: None }
}

/// Where our port is in `t`, and its value: the source port going out, the
/// destination port coming back, and the identifier of an ICMP echo either way.
#[inline(always)]
fn our_port(t: &Transport, direction: Direction) -> (usize, u16) {
    match (t.proto, direction) {
        (PROTO_ICMP, _) => (t.off + ICMP_ECHO_ID, t.sport),
        (_, Direction::Egress) => (t.off, t.sport),
        (_, Direction::Ingress) => (t.off + 2, t.dport),
    }
}

/// The change of our port in `t` to `new`, if it changes.
#[inline(always)]
fn port_change(t: &Transport, direction: Direction, new: u16) -> Option<PortChange> {
    let (off, old) = our_port(t, direction);
    (old != new).then_some(PortChange { off, old, new })
}
