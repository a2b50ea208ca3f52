//! docs/design.md#who-rewrites-what, docs/design.md#natmapping and
//! docs/design.md#masquerade:
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
    conntrack::{DIR_IN, DIR_OUT},
    counters::{DenyReason, Direction, DropReason, Kind, Link, Outcome},
    ipv4::PROTO_UDP,
    isolation::SEGREGATED,
    nat::{CONNCHECK_PORT, PeerNat, REMAPS_PEER, find_rule},
    tcp::SYN,
    wire::Address,
};

mod rules;

use rules::{endpoint_of, external_of, from_peer_view, to_peer_view};

use crate::{
    conntrack::{self, Refused},
    csum,
    family::Family,
    isolation, maps,
    mss::{self, Oversized},
    parse::{
        ICMP_CHECK, ICMP_ECHO_ID, Ip, Malformed, Packet, Parsed, PseudoCsum, Reading, Transport,
    },
};

/// Which address field is ours and which is the peer's, in one direction.
#[derive(Clone, Copy)]
struct Fields {
    ours: usize,
    theirs: usize,
}

impl Fields {
    const fn of<F: Family>(direction: Direction) -> Self {
        match direction {
            Direction::Egress => Self {
                ours: F::SRC,
                theirs: F::DST,
            },
            Direction::Ingress => Self {
                ours: F::DST,
                theirs: F::SRC,
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

/// The address at `field` (`F::SRC` or `F::DST`) of `hdr`.
#[inline(always)]
pub(crate) fn addr<F: Family>(hdr: &Ip<F::Addr>, field: usize) -> F::Addr {
    if field == F::SRC { hdr.src } else { hdr.dst }
}

/// What a program did with a packet.
enum Verdict {
    /// Rewritten by the rules in a set of [`Kind::bit`]s.
    Translated(u8),
    /// A peer's packet that needed no rewrite.
    Unchanged,
    /// No peer's packet.
    Passed,
    /// A flow that needed masquerading could not have it.
    Dropped(DropReason),
    /// A packet from peer `.0` for somewhere it may not reach.
    Denied(u32, DenyReason),
    /// For the next stage of the NAT, having been rewritten by the rules
    /// in a set of [`Kind::bit`]s.
    Next(Stage, u8),
}

/// A program of the NAT. Every stage's program is compiled from the same
/// code: the stage, a constant once inlined, leaves each program only its
/// own paths.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Every packet first: it rewrites what needs no state, and sends
    /// the others on.
    First,
    /// ICMP errors, and the header each quotes.
    IcmpError,
    /// Packets towards a peer whose source the masquerade translates, and
    /// packets from a peer to the masquerade address.
    Masquerade,
}

impl Refused {
    /// What the NAT counts a packet it drops for this under.
    #[inline(always)]
    fn reason(self) -> DropReason {
        match self {
            Refused::Full => DropReason::ConntrackFull,
            Refused::NoPort => DropReason::NoFreePort,
            Refused::UnknownFragment => DropReason::UnknownFragment,
        }
    }
}

/// What a NAT program did with a packet.
pub struct Handled {
    /// The TC action.
    pub action: i32,
    /// The packet is a peer's, and goes on: translated, or needing no
    /// rewrite.
    pub peers: bool,
    /// That peer's NAT runs Liqo v1's way: we rewrite its addresses too.
    pub remaps_peer: bool,
    /// The packet goes on, not yet counted, in this stage of the NAT.
    pub next: Option<Stage>,
}

impl Handled {
    /// A packet that goes on untouched, and no peer's.
    const PASSED: Self = Self {
        action: TC_ACT_UNSPEC,
        peers: false,
        remaps_peer: false,
        next: None,
    };
}

/// Entry point shared by every NAT program, which runs `stage`. Drops
/// what must be masqueraded and cannot be, and what a peer sends where it
/// may not reach; a packet that is no peer's, or that we send and cannot
/// parse, goes on untouched. Each packet is counted, by the stage that
/// gives it its outcome.
#[inline(always)]
pub fn run<F: Family>(ctx: &TcContext, l3: usize, direction: Direction, stage: Stage) -> Handled {
    let link = Link::of_l3(l3);
    // Not of this family: nothing of ours to read or rewrite. Decided here,
    // not as an early verdict of `translate`, where LLVM read the unset
    // payload of that verdict from a register the verifier calls
    // uninitialised.
    if ctx.skb.protocol() != F::PROTOCOL {
        maps::count(link, direction, Outcome::Passed);
        return Handled::PASSED;
    }
    let mut remaps_peer = false;
    let verdict =
        translate::<F>(ctx, l3, direction, stage, &mut remaps_peer).or_else(|Malformed| {
            match direction {
                // A peer does not get in by sending what we cannot read.
                Direction::Ingress => match unparseable_from::<F>(ctx, l3) {
                    Some(peer_id) => Ok(Verdict::Denied(peer_id, DenyReason::Unparseable)),
                    None => Err(Malformed),
                },
                Direction::Egress => Err(Malformed),
            }
        });
    let peers = matches!(verdict, Ok(Verdict::Translated(_) | Verdict::Unchanged));
    let (outcome, action) = match verdict {
        Ok(Verdict::Next(stage, kinds)) => {
            if kinds != 0 {
                maps::count_kinds(link, direction, kinds);
            }
            return Handled {
                next: Some(stage),
                ..Handled::PASSED
            };
        }
        Ok(Verdict::Translated(kinds)) => {
            maps::count_kinds(link, direction, kinds);
            (Outcome::Translated, TC_ACT_UNSPEC)
        }
        Ok(Verdict::Unchanged | Verdict::Passed) => (Outcome::Passed, TC_ACT_UNSPEC),
        Ok(Verdict::Dropped(reason)) => {
            maps::count_drop(link, direction, reason);
            (Outcome::Dropped, TC_ACT_SHOT)
        }
        Ok(Verdict::Denied(peer_id, reason)) => {
            maps::count_drop(link, direction, DropReason::Denied);
            maps::count_denied(peer_id, reason);
            (Outcome::Dropped, TC_ACT_SHOT)
        }
        Err(Malformed) => (Outcome::Unparseable, TC_ACT_UNSPEC),
    };
    maps::count(link, direction, outcome);
    // UNSPEC lets any later program on the hook run, then the stack.
    Handled {
        action,
        peers,
        remaps_peer: peers && remaps_peer,
        next: None,
    }
}

/// Runs one write of a packet's rewrite. A write the kernel refuses may
/// follow others that succeeded, so the packet's fields and checksums may
/// disagree: it is dropped, and counted apart from what cannot be parsed.
macro_rules! or_drop {
    ($write:expr) => {
        if $write.is_err() {
            return Ok(Verdict::Dropped(DropReason::RewriteFailed));
        }
    };
}

/// Our side's new address, and port if it changes too, and the kinds of
/// rule that produced them (a set of [`Kind::bit`]s).
struct Rewrite<A> {
    addr: A,
    port: Option<PortChange>,
    kinds: u8,
}

/// A port (or ICMP echo identifier) to rewrite.
struct PortChange {
    off: usize,
    old: u16,
    new: u16,
}

/// Sets `remaps_peer` when the packet's peer is one whose NAT runs Liqo
/// v1's way.
#[inline(always)]
fn translate<F: Family>(
    ctx: &TcContext,
    l3: usize,
    direction: Direction,
    stage: Stage,
    remaps_peer: &mut bool,
) -> Result<Verdict, Malformed> {
    let reading = match stage {
        Stage::First => Reading::Fresh,
        Stage::IcmpError => Reading::IcmpError,
        Stage::Masquerade => Reading::Again,
    };
    let pkt = match F::parse(ctx, l3, reading)? {
        Parsed::Packet(pkt) => pkt,
        Parsed::IcmpError => return Ok(Verdict::Next(Stage::IcmpError, 0)),
        Parsed::Refused(reason) => return Ok(Verdict::Dropped(reason)),
    };
    let fields = Fields::of::<F>(direction);
    let quoted_fields = fields.swapped();

    // A router's ICMP error comes from an address of no peer; the packet it
    // quotes still names the peer.
    let peer = F::peer(addr::<F>(&pkt.ip, fields.theirs)).or_else(|| {
        let err = pkt.icmp_error.as_ref()?;
        F::peer(addr::<F>(&err.quoted, quoted_fields.theirs))
    });
    let Some(peer) = peer else {
        return Ok(Verdict::Passed);
    };
    *remaps_peer = peer.flags & REMAPS_PEER != 0;
    // Before the rules, while the verifier has one state to walk the
    // options with, not one per path through them. The first stage clamps:
    // the masquerade's would find nothing left to clamp.
    // The map is read only for a SYN: one in a flow's packets.
    let mut clamped = false;
    if let (Some(t), PseudoCsum::Full(check)) = (&pkt.transport, pkt.ip.csum)
        && stage == Stage::First
        && t.tcp_flags & SYN != 0
        && let Some(max) = maps::tcp_mss().map(F::mss)
        && let Some(Oversized { off, mss }) = mss::oversized(ctx, t, max)?
    {
        or_drop!(csum::set_be16(ctx, off, check, false, mss, max));
        clamped = true;
    }

    let own = addr::<F>(&pkt.ip, fields.ours);
    let rewrite = match direction {
        Direction::Egress => {
            let rewrite = match egress::<F>(peer, &pkt, own, stage) {
                Ok(Some(rewrite)) => rewrite,
                Ok(None) => return Ok(to_masquerade(clamped)),
                Err(refused) => return Ok(Verdict::Dropped(refused.reason())),
            };
            // A segregated peer's replies pass by this record; a masqueraded
            // flow's by its conntrack entry.
            if peer.flags & SEGREGATED != 0
                && rewrite.kinds & Kind::Masquerade.bit() == 0
                && let Some(t) = pkt.transport.as_ref().filter(|t| outbound_kind::<F>(t))
                && isolation::remember(peer.peer_id, t, own, pkt.ip.dst).is_err()
            {
                return Ok(Verdict::Dropped(DropReason::PeerFlowsFull));
            }
            rewrite
        }
        Direction::Ingress => {
            let rewrite = match ingress::<F>(peer, &pkt, own, stage) {
                Ok(Some(rewrite)) => rewrite,
                Ok(None) => return Ok(to_masquerade(clamped)),
                Err(refused) => return Ok(Verdict::Dropped(refused.reason())),
            };
            if let Some(reason) = denied::<F>(peer, &pkt, &rewrite, stage) {
                return Ok(Verdict::Denied(peer.peer_id, reason));
            }
            rewrite
        }
    };
    let mut translated = false;
    let mut kinds = 0;
    if rewrite.addr != own {
        or_drop!(F::set_addr(ctx, &pkt.ip, fields.ours, own, rewrite.addr));
        translated = true;
        kinds |= rewrite.kinds;
    }
    if let (Some(port), Some(t)) = (&rewrite.port, &pkt.transport) {
        let (check, udp) = match pkt.ip.csum {
            PseudoCsum::Full(off) => (off, false),
            PseudoCsum::Udp(off) => (off, true),
            PseudoCsum::None => (t.off + ICMP_CHECK, false),
        };
        or_drop!(csum::set_be16(
            ctx, port.off, check, udp, port.old, port.new
        ));
        translated = true;
        kinds |= rewrite.kinds;
    }
    if clamped {
        translated = true;
        kinds |= Kind::MssClamp.bit();
    }
    // The quoted packet of an ICMP error gets the stateless rules only.
    if let Some(err) = &pkt.icmp_error {
        let own = addr::<F>(&err.quoted, quoted_fields.ours);
        let quoted = stateless::<F>(peer, direction, own);
        if quoted.addr != own {
            or_drop!(F::set_quoted_addr(
                ctx,
                err,
                quoted_fields.ours,
                own,
                quoted.addr
            ));
            translated = true;
            kinds |= quoted.kinds;
        }
    }
    Ok(if translated {
        Verdict::Translated(kinds)
    } else {
        Verdict::Unchanged
    })
}

/// Towards a peer: an endpoint takes the externalIP that peer knows it by;
/// a source that is none of ours (the node's own, or a transit flow) is
/// masqueraded; then our networks move into the peer's view. The first
/// `stage` leaves the masquerade to its own (None).
#[inline(always)]
fn egress<F: Family>(
    peer: &PeerNat<F::Addr>,
    pkt: &Packet<F::Addr>,
    own: F::Addr,
    stage: Stage,
) -> Result<Option<Rewrite<F::Addr>>, Refused> {
    let external = external_of::<F>(peer, own);
    if let Some(rule) = find_rule(&peer.egress, external.addr) {
        let remapped = rule.apply(external.addr);
        return Ok(Some(external.then(remapped, Kind::Prefix)));
    }
    // None of ours: masquerade what can be, only now reading its settings.
    let Some(masq) = conntrack::masquerade_addr() else {
        return Ok(Some(external));
    };
    match stage {
        Stage::First => Ok(None),
        // An ICMP error from one of our routers (a node, as on the way to a
        // pod with a narrower link): nothing answers it, so it takes the
        // masquerade address without state. Left as it was, the peer could
        // not route it, and its tunnel would refuse the source.
        Stage::IcmpError => Ok(Some(to_peer_view(
            peer,
            external.then(masq, Kind::Masquerade),
        ))),
        Stage::Masquerade => masquerade::<F>(peer, pkt, external, masq).map(Some),
    }
}

/// `external`, none of our networks' addresses, as the masquerade
/// translates it: a flow's address and port, or those where its first
/// fragment went.
#[inline(always)]
fn masquerade<F: Family>(
    peer: &PeerNat<F::Addr>,
    pkt: &Packet<F::Addr>,
    external: Rewrite<F::Addr>,
    masq: F::Addr,
) -> Result<Rewrite<F::Addr>, Refused> {
    // A later fragment, with no ports: where its first fragment went.
    if let Some(fragment) = pkt.fragment.as_ref().filter(|f| !f.first) {
        let addr = conntrack::fragment_addr(fragment, external.addr, pkt.ip.dst, DIR_OUT)?;
        return Ok(to_peer_view(peer, external.then(addr, Kind::Masquerade)));
    }
    let Some(t) = pkt.transport.as_ref().filter(|t| outbound_kind::<F>(t)) else {
        return Ok(external);
    };
    let nat = conntrack::outbound(t, external.addr, pkt.ip.dst, masq)?;
    if let Some(fragment) = &pkt.fragment {
        conntrack::remember_fragment(
            fragment,
            external.addr,
            pkt.ip.dst,
            DIR_OUT,
            nat.addr,
            nat.owner,
        );
    }
    Ok(Rewrite {
        port: port_change::<F>(t, Direction::Egress, nat.port),
        ..to_peer_view(peer, external.then(nat.addr, Kind::Masquerade))
    })
}

/// From a peer: our networks come back from the peer's view; a reply to a
/// masqueraded flow goes back to its source, and so do the later fragments
/// of a reply whose first went there; an externalIP resolves to its
/// endpoint. The first `stage` leaves what comes to the masquerade
/// address to the masquerade's (None).
#[inline(always)]
fn ingress<F: Family>(
    peer: &PeerNat<F::Addr>,
    pkt: &Packet<F::Addr>,
    own: F::Addr,
    stage: Stage,
) -> Result<Option<Rewrite<F::Addr>>, Refused> {
    let real = from_peer_view(peer, own);
    let Some(masq) = conntrack::masquerade_addr().filter(|masq| real.addr == *masq) else {
        return Ok(Some(endpoint_of::<F>(peer, real)));
    };
    match stage {
        Stage::First => Ok(None),
        // An error names no flow: it goes to the masquerade address as it
        // is.
        Stage::IcmpError => Ok(Some(endpoint_of::<F>(peer, real))),
        Stage::Masquerade => unmasquerade::<F>(peer, pkt, real, masq).map(Some),
    }
}

/// `real`, the masquerade address `masq`, as a reply to a masqueraded flow
/// goes back: to the flow's source and port, or where the first fragment
/// of its datagram went.
#[inline(always)]
fn unmasquerade<F: Family>(
    peer: &PeerNat<F::Addr>,
    pkt: &Packet<F::Addr>,
    real: Rewrite<F::Addr>,
    masq: F::Addr,
) -> Result<Rewrite<F::Addr>, Refused> {
    if let Some(fragment) = pkt.fragment.as_ref().filter(|f| !f.first) {
        let addr = conntrack::fragment_addr(fragment, pkt.ip.src, masq, DIR_IN)?;
        return Ok(real.then(addr, Kind::Masquerade));
    }
    if let Some(t) = &pkt.transport
        && let Some(back) = conntrack::inbound(t, pkt.ip.src, masq, F::ICMP, F::ECHO_REPLY)
    {
        if let Some(fragment) = &pkt.fragment {
            conntrack::remember_fragment(
                fragment,
                pkt.ip.src,
                masq,
                DIR_IN,
                back.addr,
                peer.peer_id,
            );
        }
        return Ok(Rewrite {
            port: port_change::<F>(t, Direction::Ingress, back.port),
            ..real.then(back.addr, Kind::Masquerade)
        });
    }
    Ok(endpoint_of::<F>(peer, real))
}

/// A packet for the masquerade's stage, having been clamped or not: the
/// clamp is counted here, as that stage finds nothing left to clamp.
#[inline(always)]
fn to_masquerade(clamped: bool) -> Verdict {
    let kinds = if clamped { Kind::MssClamp.bit() } else { 0 };
    Verdict::Next(Stage::Masquerade, kinds)
}

/// Why a packet from `peer`, translated by `rewrite`, may not go on, if it
/// may not: it goes on only into our Pod and External networks (where the
/// peer's ingress rules lead), to an endpoint the peer's NatMapping named,
/// or back to the source of a flow we masqueraded. The conncheck's address
/// is the gateway itself: a peer reaches only the conncheck's port there.
/// No rule leads to a node: what an object wrote cannot expose one. A
/// segregated peer reaches in our networks only what it is allowed to.
#[inline(always)]
fn denied<F: Family>(
    peer: &PeerNat<F::Addr>,
    pkt: &Packet<F::Addr>,
    rewrite: &Rewrite<F::Addr>,
    stage: Stage,
) -> Option<DenyReason> {
    let dst = rewrite.addr;
    let t = pkt.transport.as_ref();
    if F::is_conncheck(dst) && !t.is_some_and(|t| t.proto == PROTO_UDP && t.dport == CONNCHECK_PORT)
    {
        return Some(DenyReason::NodeAddress);
    }
    // A reply to a flow we opened, a node's own among them.
    if rewrite.kinds & Kind::Masquerade.bit() != 0 {
        return None;
    }
    if F::is_node(dst) {
        return Some(DenyReason::NodeAddress);
    }
    if rewrite.kinds & Kind::NatMapping.bit() != 0 {
        return None;
    }
    if peer
        .ingress
        .iter()
        .any(|rule| rule.active != 0 && dst.masked(rule.mask) == rule.to)
    {
        let segregated = peer.flags & SEGREGATED != 0;
        return (segregated && !isolation::admits(peer.peer_id, pkt, pkt.ip.src, dst))
            .then_some(DenyReason::NotAllowed);
    }
    // The masquerade's stage sends on only the masquerade address, one of
    // ours, which no peer's view holds: the lookup would cost the
    // verifier a walk of the prefix lengths for each of its paths.
    Some(if stage != Stage::Masquerade && F::peer(dst).is_some() {
        DenyReason::OtherPeer
    } else {
        DenyReason::OutsideOurNetworks
    })
}

/// The peer a packet comes from when only its source can be read.
#[inline(always)]
fn unparseable_from<F: Family>(ctx: &TcContext, l3: usize) -> Option<u32> {
    F::peer(F::address(ctx, l3, F::SRC)?).map(|peer| peer.peer_id)
}

/// The stateless rules alone (prefix remap and NatMapping), for headers
/// quoted in ICMP errors.
#[inline(always)]
fn stateless<F: Family>(
    peer: &PeerNat<F::Addr>,
    direction: Direction,
    own: F::Addr,
) -> Rewrite<F::Addr> {
    match direction {
        Direction::Ingress => endpoint_of::<F>(peer, from_peer_view(peer, own)),
        Direction::Egress => to_peer_view(peer, external_of::<F>(peer, own)),
    }
}

/// Where our port is in `t`, and its value: the source port going out, the
/// destination port coming back, and the identifier of an ICMP echo either way.
#[inline(always)]
fn our_port<F: Family>(t: &Transport, direction: Direction) -> (usize, u16) {
    match (t.proto, direction) {
        (proto, _) if proto == F::ICMP => (t.off + ICMP_ECHO_ID, t.sport),
        (_, Direction::Egress) => (t.off, t.sport),
        (_, Direction::Ingress) => (t.off + 2, t.dport),
    }
}

/// The change of our port in `t` to `new`, if it changes.
#[inline(always)]
fn port_change<F: Family>(t: &Transport, direction: Direction, new: u16) -> Option<PortChange> {
    let (off, old) = our_port::<F>(t, direction);
    (old != new).then_some(PortChange { off, old, new })
}

/// Whether the flow of `t` can be masqueraded, or opened towards a
/// segregated peer, at all: TCP, UDP, and ICMP echo requests (replies and
/// errors are answers, never new flows).
#[inline(always)]
fn outbound_kind<F: Family>(t: &Transport) -> bool {
    t.proto != F::ICMP || t.icmp_type == F::ECHO_REQUEST
}
