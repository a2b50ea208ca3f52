//! The overlay between the nodes of a cluster: worker nodes steer pods'
//! remote-bound traffic to the gateway node, and the gateway sends traffic
//! from the tunnel to the node that holds its pod, both over one
//! collect-metadata VXLAN device.
//!
//! The kernel programs choose the remote node per packet and set it as the
//! tunnel key; no rule or FDB entry is involved. A worker's routes lead
//! only its own traffic for peers into the device.

/// Name of the VXLAN device the agent creates on every node.
pub const DEFAULT_DEVICE: &str = "isthmus.vx";
/// Default VNI: Liqo's routing table number, so captures are easy to tell.
pub const DEFAULT_VNI: u32 = 18952;
/// Default UDP port of the overlay (not the IANA 4789, which a CNI may own).
pub const DEFAULT_PORT: u16 = 4879;
/// Bytes the overlay adds to a packet: outer IPv4, UDP, VXLAN and the inner
/// Ethernet header.
pub const OVERHEAD: u32 = 20 + 8 + 8 + 14;

use crate::wire::Be32;

/// The overlay's settings on one node.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverlayConfig {
    /// The active gateway node's address, where workers send remote-bound
    /// traffic: this node's own (`local`) on the gateway itself, whose pods'
    /// remote-bound traffic goes to the tunnel past the stack; 0 while
    /// unknown.
    pub gateway: Be32,
    /// The VNI of every overlay packet.
    pub vni: u32,
    /// The VXLAN device's ifindex; 0 until the agent has created it, and
    /// then the programs encapsulate nothing.
    pub ifindex: u32,
    /// This node's own address, where overlay packets arrive; 0 while
    /// unknown, and then only the VXLAN device takes them in.
    pub local: Be32,
    /// The overlay's UDP port (host order).
    pub port: u16,
    /// [`PAST_NETFILTER`], [`PAST_NETFILTER6`], both or neither.
    pub flags: u16,
}

/// [`OverlayConfig::flags`]: forward what the FIB settles in one step past
/// the node's IP layer, netfilter included: the overlay's packets for this
/// node's pods, peers' packets for the gateway node's pods, and those pods'
/// packets for peers. Off, the stack forwards them all, and netfilter's
/// FORWARD chain (where some CNIs enforce NetworkPolicy) sees them.
/// It covers IPv4 packets.
pub const PAST_NETFILTER: u16 = 1;
/// [`OverlayConfig::flags`]: as [`PAST_NETFILTER`], for IPv6 packets. The
/// node's rules are proved harmless for each family apart.
pub const PAST_NETFILTER6: u16 = 2;

assert_layout!(OverlayConfig, size = 20, align = 4);

/// What the overlay did with a packet.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlayEvent {
    /// A worker sent a remote-bound packet, a pod's or its own, to the
    /// gateway node.
    ToGateway = 0,
    /// The gateway sent a packet from the tunnel to the node of its pod.
    ToNode = 1,
    /// A node took in a packet from the overlay.
    Received = 2,
    /// A worker had a remote-bound packet while no gateway is known: a
    /// pod's went on to the stack, the node's own was dropped.
    NoGateway = 3,
    /// A packet came in on the overlay device with another VNI; dropped.
    WrongVni = 4,
    /// The kernel refused to encapsulate or rewrite; the packet went on to
    /// the stack.
    Failed = 5,
    /// A packet taken in from the overlay, or a peer's from the tunnel,
    /// was forwarded by the FIB, without the stack.
    Forwarded = 6,
    /// A node took in a packet from the overlay on its uplink, removing the
    /// outer headers itself rather than through the VXLAN device.
    Decapsulated = 7,
    /// A packet of our VNI came from an address that is no node of the
    /// cluster (a pod, say, forging the overlay); dropped.
    UnknownNode = 8,
}

/// Every event, in slot order.
pub const EVENTS: [OverlayEvent; 9] = [
    OverlayEvent::ToGateway,
    OverlayEvent::ToNode,
    OverlayEvent::Received,
    OverlayEvent::NoGateway,
    OverlayEvent::WrongVni,
    OverlayEvent::Failed,
    OverlayEvent::Forwarded,
    OverlayEvent::Decapsulated,
    OverlayEvent::UnknownNode,
];

impl OverlayEvent {
    /// Lower-case name used in metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            OverlayEvent::ToGateway => "to_gateway",
            OverlayEvent::ToNode => "to_node",
            OverlayEvent::Received => "received",
            OverlayEvent::NoGateway => "no_gateway",
            OverlayEvent::WrongVni => "wrong_vni",
            OverlayEvent::Failed => "failed",
            OverlayEvent::Forwarded => "forwarded",
            OverlayEvent::Decapsulated => "decapsulated",
            OverlayEvent::UnknownNode => "unknown_node",
        }
    }
}
