//! Layout of the NAT programs' per-CPU packet counters.
//!
//! Each NAT program (a [`Link`] kind and a [`Direction`]) owns one block of
//! [`PER_PROGRAM`] slots: every packet once by [`Outcome`], a dropped packet
//! again by [`DropReason`], and a translated one again by each [`Kind`] of
//! rule that rewrote it.

use crate::names;

/// Which way a packet crosses the tunnel-facing device.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Leaving towards a peer.
    Egress = 0,
    /// Arriving from a peer.
    Ingress = 1,
}

/// The kind of device a NAT program serves.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Ethernet frames (veth).
    Eth = 0,
    /// Bare IP packets (tun).
    Ip = 1,
}

/// What a NAT program did with one packet.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// At least one address was rewritten.
    Translated = 0,
    /// No rule applied; the packet went on untouched.
    Passed = 1,
    /// The packet could not be parsed; it went on untouched.
    Unparseable = 2,
    /// Dropped, for a [`DropReason`].
    Dropped = 3,
}

/// Why a NAT program dropped a packet.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The conntrack table had no room for a new masqueraded flow.
    ConntrackFull = 0,
    /// Every masquerade port towards that peer was taken.
    NoFreePort = 1,
    /// A peer's packet, once translated, was for somewhere the peer may not
    /// reach (see [`DenyReason`]).
    Denied = 2,
    /// A later fragment of a datagram that needs masquerading, whose first
    /// fragment was not seen (reordered, or forgotten under load): sent on,
    /// it would carry an address the far side cannot answer.
    UnknownFragment = 3,
    /// A kernel helper refused a write or checksum update half-way through
    /// the packet's rewrite: sent on, its fields and checksums could
    /// disagree. Not a parse failure: the packet had been read whole.
    RewriteFailed = 4,
    /// A flow our side opened towards a segregated peer found the table of
    /// such flows full: sent on, its replies would be denied.
    PeerFlowsFull = 5,
    /// The program a packet goes on in, by tail call, was missing from its
    /// program array: sent on, the packet would skip a rewrite or a check
    /// (docs/design.md#tail-calls).
    MissedTailCall = 6,
    /// An IPv6 packet whose chain of extension headers runs past the
    /// bound the NAT walks ([`crate::ipv6::MAX_EXTENSION_HEADERS`]): its
    /// upper-layer header, which the rules may need, is out of reach.
    ExtensionHeaders = 7,
    /// An IPv6 first fragment without the whole header chain, up to the
    /// upper-layer header's ports (RFC 7112): its later fragments could not
    /// be told apart from another flow's.
    TinyFragment = 8,
}

/// Where a peer's packet was headed that it may not reach: after the
/// ingress translation, a peer reaches only our Pod and External networks,
/// its NatMapping endpoints, and the sources of flows we masqueraded.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// One of the cluster's nodes.
    NodeAddress = 0,
    /// Another peer's networks, with no NatMapping of this peer's to it.
    OtherPeer = 1,
    /// Anywhere else outside our networks: a ClusterIP, the internet.
    OutsideOurNetworks = 2,
    /// A packet from a peer's network that could not be parsed.
    Unparseable = 3,
    /// From a segregated peer (see [`crate::isolation`]): a connection to
    /// what was neither offloaded from it nor exported to it.
    NotAllowed = 4,
}

/// Every deny reason, in slot order.
pub const DENY_REASONS: [DenyReason; 5] = [
    DenyReason::NodeAddress,
    DenyReason::OtherPeer,
    DenyReason::OutsideOurNetworks,
    DenyReason::Unparseable,
    DenyReason::NotAllowed,
];

/// Peer IDs with counters of their own in the denied-packets map; a larger
/// ID counts under ID 0.
pub const DENY_PEERS: u32 = names::MAX_PEER_NETWORKS / 2;
/// Number of slots in the denied-packets map.
pub const DENY_SLOTS: u32 = DENY_PEERS * DENY_REASONS.len() as u32;

/// Index of the counter of packets from peer `peer_id` denied for `reason`.
pub const fn deny_slot(peer_id: u32, reason: DenyReason) -> u32 {
    let peer = if peer_id < DENY_PEERS { peer_id } else { 0 };
    peer * DENY_REASONS.len() as u32 + reason as u32
}

impl DenyReason {
    /// Lower-case name used in metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            DenyReason::NodeAddress => "node_address",
            DenyReason::OtherPeer => "other_peer",
            DenyReason::OutsideOurNetworks => "outside_our_networks",
            DenyReason::Unparseable => "unparseable",
            DenyReason::NotAllowed => "not_allowed",
        }
    }
}

/// Which rule rewrote a packet; one packet may have several.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A prefix remap between a network and the peer's view of it.
    Prefix = 0,
    /// A NatMapping between an externalIP and its endpoint.
    NatMapping = 1,
    /// Stateful source NAT to the masquerade address.
    Masquerade = 2,
    /// A SYN's MSS option lowered to what the tunnel carries.
    MssClamp = 3,
}

/// Both directions, in slot order.
pub const DIRECTIONS: [Direction; 2] = [Direction::Egress, Direction::Ingress];
/// Both link kinds, in slot order.
pub const LINKS: [Link; 2] = [Link::Eth, Link::Ip];
/// Every outcome, in slot order.
pub const OUTCOMES: [Outcome; 4] = [
    Outcome::Translated,
    Outcome::Passed,
    Outcome::Unparseable,
    Outcome::Dropped,
];
/// Every drop reason, in slot order.
pub const DROP_REASONS: [DropReason; 9] = [
    DropReason::ConntrackFull,
    DropReason::NoFreePort,
    DropReason::Denied,
    DropReason::UnknownFragment,
    DropReason::RewriteFailed,
    DropReason::PeerFlowsFull,
    DropReason::MissedTailCall,
    DropReason::ExtensionHeaders,
    DropReason::TinyFragment,
];
/// Every kind of rule, in slot order.
pub const KINDS: [Kind; 4] = [
    Kind::Prefix,
    Kind::NatMapping,
    Kind::Masquerade,
    Kind::MssClamp,
];

/// The drop reasons counted in each program's block of slots: those of
/// the counters' first layout. A reason added since is counted after every
/// block, so that an upgraded agent reads the slots a previous one left
/// where they were.
const BLOCK_DROP_REASONS: u32 = 7;
/// The NAT programs that count: one per link and direction.
const PROGRAMS: u32 = (LINKS.len() * DIRECTIONS.len()) as u32;
/// Slots of one NAT program's block.
pub const PER_PROGRAM: u32 = OUTCOMES.len() as u32 + BLOCK_DROP_REASONS + KINDS.len() as u32;
/// Slots of the counters' first layout: every program's block.
pub const BLOCK_SLOTS: u32 = PROGRAMS * PER_PROGRAM;
/// Number of slots in the counters map: the blocks, then each program's
/// later drop reasons.
pub const SLOTS: u32 = BLOCK_SLOTS + PROGRAMS * (DROP_REASONS.len() as u32 - BLOCK_DROP_REASONS);

const fn program(link: Link, direction: Direction) -> u32 {
    link as u32 * DIRECTIONS.len() as u32 + direction as u32
}

const fn block(link: Link, direction: Direction) -> u32 {
    program(link, direction) * PER_PROGRAM
}

/// Index of the counter of `outcome` in the program for `link` and `direction`.
pub const fn outcome_slot(link: Link, direction: Direction, outcome: Outcome) -> u32 {
    block(link, direction) + outcome as u32
}

/// Index of the counter of drops for `reason`.
pub const fn drop_slot(link: Link, direction: Direction, reason: DropReason) -> u32 {
    let reason = reason as u32;
    if reason < BLOCK_DROP_REASONS {
        return block(link, direction) + OUTCOMES.len() as u32 + reason;
    }
    let later = DROP_REASONS.len() as u32 - BLOCK_DROP_REASONS;
    BLOCK_SLOTS + program(link, direction) * later + reason - BLOCK_DROP_REASONS
}

/// Index of the counter of packets rewritten by a rule of `kind`.
pub const fn kind_slot(link: Link, direction: Direction, kind: Kind) -> u32 {
    block(link, direction) + OUTCOMES.len() as u32 + BLOCK_DROP_REASONS + kind as u32
}

impl Direction {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

impl Link {
    /// The link kind of a program whose IPv4 header starts at `l3`.
    pub const fn of_l3(l3: usize) -> Self {
        if l3 == 0 { Link::Ip } else { Link::Eth }
    }

    /// The name of the NAT program for this link kind and `direction`.
    pub const fn program(self, direction: Direction) -> &'static str {
        match (self, direction) {
            (Link::Eth, Direction::Egress) => names::PROG_EGRESS_ETH,
            (Link::Eth, Direction::Ingress) => names::PROG_INGRESS_ETH,
            (Link::Ip, Direction::Egress) => names::PROG_EGRESS_IP,
            (Link::Ip, Direction::Ingress) => names::PROG_INGRESS_IP,
        }
    }

    /// The slot of [`names::MAP_ICMP_ERROR`] that serves this link kind in
    /// `direction`: [`names::ICMP_ERROR_PROGRAMS`] are in this order.
    pub const fn icmp_error_slot(self, direction: Direction) -> u32 {
        self as u32 * 2 + direction as u32
    }
}

impl Outcome {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Translated => "translated",
            Outcome::Passed => "passed",
            Outcome::Unparseable => "unparseable",
            Outcome::Dropped => "dropped",
        }
    }
}

impl DropReason {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::ConntrackFull => "conntrack_full",
            DropReason::NoFreePort => "no_free_port",
            DropReason::Denied => "denied",
            DropReason::UnknownFragment => "unknown_fragment",
            DropReason::RewriteFailed => "rewrite_failed",
            DropReason::PeerFlowsFull => "peer_flows_full",
            DropReason::MissedTailCall => "missed_tail_call",
            DropReason::ExtensionHeaders => "extension_headers",
            DropReason::TinyFragment => "tiny_fragment",
        }
    }
}

impl Kind {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Prefix => "prefix",
            Kind::NatMapping => "natmapping",
            Kind::Masquerade => "masquerade",
            Kind::MssClamp => "mss_clamp",
        }
    }

    /// This kind's bit in a set of kinds.
    pub const fn bit(self) -> u8 {
        1 << self as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_icmp_error_program_sits_in_the_slot_of_its_link_and_direction() {
        for link in [Link::Eth, Link::Ip] {
            for direction in [Direction::Egress, Direction::Ingress] {
                let slot = link.icmp_error_slot(direction) as usize;
                let nat = link.program(direction);
                // The NAT of errors is named as the NAT it follows.
                let error = names::ICMP_ERROR_PROGRAMS[slot];
                assert_eq!((&error[..4], &error[4..]), ("err_", &nat[4..]));
            }
        }
    }

    #[test]
    fn slots_are_distinct_and_dense() {
        let mut seen = [false; SLOTS as usize];
        let mut mark = |s: u32| {
            assert!(!seen[s as usize], "slot {s} used twice");
            seen[s as usize] = true;
        };
        for link in LINKS {
            for d in DIRECTIONS {
                for o in OUTCOMES {
                    mark(outcome_slot(link, d, o));
                }
                for r in DROP_REASONS {
                    mark(drop_slot(link, d, r));
                }
                for k in KINDS {
                    mark(kind_slot(link, d, k));
                }
            }
        }
        assert!(seen.iter().all(|s| *s));
    }

    /// The first layout's 60 slots keep their places: an upgraded agent
    /// reads a previous one's counters where it left them.
    #[test]
    fn the_first_layouts_slots_keep_their_places() {
        assert_eq!(BLOCK_SLOTS, 60);
        assert_eq!(
            outcome_slot(Link::Ip, Direction::Ingress, Outcome::Dropped),
            48
        );
        assert_eq!(
            drop_slot(Link::Ip, Direction::Ingress, DropReason::MissedTailCall),
            55
        );
        assert_eq!(kind_slot(Link::Ip, Direction::Ingress, Kind::MssClamp), 59);
        assert_eq!(
            drop_slot(Link::Eth, Direction::Egress, DropReason::ExtensionHeaders),
            60
        );
        assert_eq!(
            drop_slot(Link::Ip, Direction::Ingress, DropReason::TinyFragment),
            SLOTS - 1
        );
    }

    #[test]
    fn deny_slots_are_distinct_and_a_large_id_counts_as_zero() {
        let last = deny_slot(DENY_PEERS - 1, DenyReason::NotAllowed);
        assert_eq!(last, DENY_SLOTS - 1);
        assert_eq!(deny_slot(1, DenyReason::NodeAddress), 5);
        assert_eq!(
            deny_slot(DENY_PEERS, DenyReason::OtherPeer),
            deny_slot(0, DenyReason::OtherPeer)
        );
    }

    #[test]
    fn programs_are_named_as_the_object_names_them() {
        assert_eq!(Link::of_l3(0).program(Direction::Ingress), "nat_ingress_ip");
        assert_eq!(Link::of_l3(14).program(Direction::Egress), "nat_egress_eth");
    }
}
