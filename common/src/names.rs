//! Names of the programs and maps, as the kernel and `bpftool` show them.
//!
//! The kernel keeps 15 characters of a name; every name here fits.

/// Hash: a peer's networks as we see them ([`crate::nat::PeerKey`]) →
/// [`crate::nat::PeerNat`].
pub const MAP_PEERS: &str = "ist_peer_nets";
/// LPM trie: a peer's networks as we see them → its
/// [`crate::nat::PeerNat::peer_id`]: whose a source is, in one lookup,
/// when a new flow is charged to its owner ([`crate::room`]).
pub const MAP_PEER_OWNERS: &str = "ist_peer_owners";
/// LPM trie: [`MAP_PEER_OWNERS`] for the peers' IPv6 networks.
pub const MAP_PEER_OWNERS6: &str = "ist_peer_owner6";
/// Hash, written by the agent alone: each pinned map's name (NUL-padded to
/// 16 bytes) → the version of its entries' layout, so that a new agent
/// knows how to read what a previous one pinned. Its own layout never
/// changes. Not a map of the programs' object.
pub const MAP_LAYOUTS: &str = "ist_layouts";
/// One-entry array: the prefix lengths in [`MAP_PEERS`], longest first.
pub const MAP_PREFIX_LENS: &str = "ist_prefix_lens";
/// Hash: a peer's IPv6 networks as we see them
/// (`PeerKey<Be128>`) → `PeerNat<Be128>` (docs/design.md#dual-stack).
pub const MAP_PEERS6: &str = "ist_peer_nets6";
/// One-entry array: the prefix lengths in [`MAP_PEERS6`], longest first.
pub const MAP_PREFIX_LENS6: &str = "ist_prefix6";
/// Per-CPU array of packet counters, indexed by [`crate::counters::slot`].
pub const MAP_COUNTERS: &str = "ist_counters";

/// Per-CPU array of peers' packets denied, indexed by
/// [`crate::counters::deny_slot`].
pub const MAP_PEER_DENIED: &str = "ist_peer_denied";

/// Hash: NatMapping DNAT, ([`crate::nat::MappingKey`] of an externalIP) →
/// endpointIP ([`crate::wire::Be32`]).
pub const MAP_NATMAP: &str = "ist_natmap";
/// Hash: the reverse of [`MAP_NATMAP`], (key of an endpointIP) → externalIP.
pub const MAP_NATMAP_REV: &str = "ist_natmap_rev";
/// Hash: [`MAP_NATMAP`] for IPv6 addresses.
pub const MAP_NATMAP6: &str = "ist_natmap6";
/// Hash: [`MAP_NATMAP_REV`] for IPv6 addresses.
pub const MAP_NATMAP_REV6: &str = "ist_natmap_rev6";

/// Hash: masqueraded flows, both directions
/// ([`crate::conntrack::FlowKey`] → [`crate::conntrack::FlowNat`]).
pub const MAP_CONNTRACK: &str = "ist_conntrack";
/// Hash: [`MAP_CONNTRACK`] for IPv6 flows
/// ([`crate::conntrack::FlowKey`]`<Be128>` → [`crate::conntrack::FlowNat`]`<Be128>`),
/// of the same capacity; both families' flows share each owner's room.
pub const MAP_CONNTRACK6: &str = "ist_conntrack6";
/// LRU hash: fragments of masqueraded datagrams
/// ([`crate::conntrack::FragKey`] → the address the first was translated to).
pub const MAP_FRAGMENTS: &str = "ist_frags";
/// LRU hash: [`MAP_FRAGMENTS`] for IPv6 datagrams, of the same capacity.
pub const MAP_FRAGMENTS6: &str = "ist_frags6";
/// Capacity of [`MAP_FRAGMENTS`]: datagrams in flight in pieces.
pub const MAX_FRAGMENTS: u32 = 8192;
/// Array: each owner's budget of new entries per second in
/// [`MAP_FRAGMENTS`] ([`crate::budget::Budget`], by owner).
pub const MAP_FRAGMENT_BUDGET: &str = "ist_frag_budget";
/// Hash: what segregated peers may open connections to
/// ([`crate::isolation::AllowKey`] → 1).
pub const MAP_ALLOWED: &str = "ist_allowed";
/// Hash: [`MAP_ALLOWED`] for IPv6 addresses
/// ([`crate::isolation::AllowKey`]`<Be128>` → 1), of the same capacity.
pub const MAP_ALLOWED6: &str = "ist_allowed6";
/// Hash: flows our side opened towards segregated peers, keyed as their
/// replies arrive ([`crate::conntrack::FlowKey`] → [`crate::isolation::PeerFlow`]).
pub const MAP_PEER_FLOWS: &str = "ist_peer_flows";
/// Hash: [`MAP_PEER_FLOWS`] for IPv6 flows, of the same capacity; both
/// families' flows share each peer's room.
pub const MAP_PEER_FLOWS6: &str = "ist_peer_flows6";
/// Array: each owner's room in the flow tables ([`crate::room::Room`],
/// by [`crate::room::slot`]).
pub const MAP_ROOM: &str = "ist_room";
/// Per-CPU array: new flows refused for want of room, by
/// [`crate::room::refusal_slot`].
pub const MAP_ROOM_REFUSED: &str = "ist_room_refuse";
/// One-entry array: the gateway's masquerade settings
/// ([`crate::conntrack::SnatConfig`]).
pub const MAP_SNAT: &str = "ist_snat";
/// One-entry array: [`MAP_SNAT`] for IPv6
/// ([`crate::conntrack::SnatConfig`]`<Be128>`).
pub const MAP_SNAT6: &str = "ist_snat6";
/// One-entry array: the largest TCP MSS a SYN crossing the tunnel device
/// may advertise (0: no clamping).
pub const MAP_TCP_MSS: &str = "ist_tcp_mss";

/// Hash: sources allowed to reach the tunnel port
/// ([`crate::guard::GuardSource`] → 1).
pub const MAP_GUARD_SOURCES: &str = "ist_guard_src";
/// Hash: [`MAP_GUARD_SOURCES`] for IPv6 sources
/// ([`crate::guard::GuardSource`]`<Be128>` → 1).
pub const MAP_GUARD_SOURCES6: &str = "ist_guard_src6";
/// Hash: our peers' session indexes ([`crate::guard::peer_index`] → 1).
pub const MAP_GUARD_INDEXES: &str = "ist_guard_idx";
/// Hash: the tunnel's UDP ports the guard watches ([`crate::wire::Be16`] →
/// [`crate::guard::Initiations`]); empty, the guard passes everything.
pub const MAP_GUARD_PORTS: &str = "ist_guard_ports";
/// Per-CPU array of the guard's verdicts, indexed by [`crate::guard::Verdict`].
pub const MAP_GUARD_STATS: &str = "ist_guard_stats";

/// One-entry array: the overlay's settings
/// ([`crate::overlay::OverlayConfig`]).
pub const MAP_OVERLAY: &str = "ist_overlay";
/// LPM trie: the cluster's other nodes, (PodCIDR, or address/32) → node address
/// ([`crate::wire::Be32`]).
pub const MAP_NODES: &str = "ist_nodes";
/// Hash: the cluster's nodes' addresses ([`crate::wire::Be32`] → 1): the only outer
/// sources the overlay takes packets from.
pub const MAP_NODE_ADDRS: &str = "ist_node_addrs";
/// Hash: the cluster's nodes' IPv6 addresses ([`crate::wire::Be128`] → 1).
pub const MAP_NODE_ADDRS6: &str = "ist_node_addrs6";
/// Per-CPU array of overlay events, indexed by
/// [`crate::overlay::OverlayEvent`].
pub const MAP_OVERLAY_STATS: &str = "ist_overlay_st";
/// LPM trie: the destinations whose packets take the stack while others
/// forward past netfilter, where the node's rules act on them (prefix → 1).
pub const MAP_STACK_DESTINATIONS: &str = "ist_stack_dsts";
/// LPM trie: as [`MAP_STACK_DESTINATIONS`], for IPv6 prefixes.
pub const MAP_STACK_DESTINATIONS6: &str = "ist_stack_dsts6";

/// Hash: the ifindexes of the pod devices a worker steers from (→ 1):
/// veths, whose pods the overlay delivers to straight into their netns.
pub const MAP_POD_DEVS: &str = "ist_pod_devs";

/// Hash: the ifindex of a tunnel device that carries one Liqo v1 peer
/// alone → that peer's [`crate::nat::PeerKey`] in [`MAP_PEERS`]: inside
/// the tunnel the peer's sources are real, and may be anyone's, so the
/// device names the peer (docs/design.md#liqo-v1-peers).
pub const MAP_PEER_DEVS: &str = "ist_peer_devs";
/// Capacity of [`MAP_PEER_DEVS`] and of [`MAP_PEER_DEVS6`].
pub const MAX_PEER_DEVS: u32 = 256;
/// The same for the Liqo v1 peers with IPv6 networks: the ifindex → the
/// peer's [`crate::nat::PeerKey`] in [`MAP_PEERS6`].
pub const MAP_PEER_DEVS6: &str = "ist_peer_devs6";

/// Every map the agent pins, in the order it reports them.
pub const MAPS: [&str; 41] = [
    MAP_PEERS,
    MAP_PEER_OWNERS,
    MAP_PREFIX_LENS,
    MAP_PEERS6,
    MAP_PEER_OWNERS6,
    MAP_PREFIX_LENS6,
    MAP_COUNTERS,
    MAP_PEER_DENIED,
    MAP_NATMAP,
    MAP_NATMAP_REV,
    MAP_NATMAP6,
    MAP_NATMAP_REV6,
    MAP_CONNTRACK,
    MAP_CONNTRACK6,
    MAP_FRAGMENTS,
    MAP_FRAGMENTS6,
    MAP_FRAGMENT_BUDGET,
    MAP_SNAT,
    MAP_SNAT6,
    MAP_TCP_MSS,
    MAP_ALLOWED,
    MAP_ALLOWED6,
    MAP_PEER_FLOWS,
    MAP_PEER_FLOWS6,
    MAP_ROOM,
    MAP_ROOM_REFUSED,
    MAP_GUARD_SOURCES,
    MAP_GUARD_SOURCES6,
    MAP_GUARD_INDEXES,
    MAP_GUARD_PORTS,
    MAP_GUARD_STATS,
    MAP_OVERLAY,
    MAP_NODES,
    MAP_NODE_ADDRS,
    MAP_NODE_ADDRS6,
    MAP_OVERLAY_STATS,
    MAP_STACK_DESTINATIONS,
    MAP_STACK_DESTINATIONS6,
    MAP_POD_DEVS,
    MAP_PEER_DEVS,
    MAP_PEER_DEVS6,
];

/// Egress NAT for devices that carry Ethernet frames (veth).
pub const PROG_EGRESS_ETH: &str = "nat_egress_eth";
/// Ingress NAT for devices that carry Ethernet frames (veth).
pub const PROG_INGRESS_ETH: &str = "nat_ingress_eth";
/// Egress NAT for L3 devices with no link header (tun).
pub const PROG_EGRESS_IP: &str = "nat_egress_ip";
/// Ingress NAT for L3 devices with no link header (tun).
pub const PROG_INGRESS_IP: &str = "nat_ingress_ip";

/// The XDP guard of the tunnel port, on the gateway's uplink.
pub const PROG_GUARD: &str = "tunnel_guard";

/// Worker: sends pods' remote-bound packets to the gateway node, on the
/// pod-facing host devices.
pub const PROG_STEER: &str = "overlay_steer";
/// Every node: takes in packets from the overlay, on its VXLAN device.
pub const PROG_ACCEPT: &str = "overlay_accept";
/// Worker: sends the node's own packets for peers' networks, which its
/// routes lead into the VXLAN device, to the gateway node (egress).
pub const PROG_OWN: &str = "overlay_own";
/// Every node: takes in packets from the overlay straight off its uplink,
/// removing the outer headers itself.
pub const PROG_DECAP: &str = "overlay_decap";

/// Program array: what follows a gateway's ingress NAT, indexed by
/// [`crate::counters::Link`]. Pinned, as every program array: the NAT
/// programs an agent left attached go on in it while no agent runs, and
/// drop what finds a slot empty (docs/design.md#tail-calls).
pub const MAP_ONWARD: &str = "ist_onward";
/// The programs of [`MAP_ONWARD`], in its order: a peer's packet that the
/// ingress NAT let through goes to its pod, on another node through the
/// overlay, or on this one past the stack. Separate programs, so that the
/// verifier walks them once, not once for every path through the NAT.
pub const ONWARD_PROGRAMS: [&str; 2] = ["nat_onward_eth", "nat_onward_ip"];

/// Program array: what follows a gateway's egress NAT for a peer, indexed
/// by [`crate::counters::Link`]: the rewrite of a Liqo v1 peer's
/// destination. Pinned, as [`MAP_ONWARD`].
pub const MAP_PEER_DNAT: &str = "ist_peer_dnat";
/// The programs of [`MAP_PEER_DNAT`], in its order: a Liqo v1 peer's
/// destination goes from our view of it to the real address.
pub const PEER_DNAT_PROGRAMS: [&str; 2] = ["peer_dnat_eth", "peer_dnat_ip"];
/// Ingress of a tunnel device in [`MAP_PEER_DEVS`], Ethernet: the Liqo v1
/// peer's source goes from the real address to our view of it, then the
/// ingress NAT runs.
pub const PROG_PEER_SNAT_ETH: &str = "peer_snat_eth";
/// The same as [`PROG_PEER_SNAT_ETH`], on an L3 device (tun).
pub const PROG_PEER_SNAT_IP: &str = "peer_snat_ip";
/// Program array: the ingress NAT, indexed by [`crate::counters::Link`],
/// which the peer SNAT programs go on in. Pinned, as [`MAP_ONWARD`].
pub const MAP_NAT_IN: &str = "ist_nat_in";
/// The programs of [`MAP_NAT_IN`], in its order.
pub const NAT_IN_PROGRAMS: [&str; 2] = [PROG_INGRESS_ETH, PROG_INGRESS_IP];

/// Program array: the NAT of ICMP errors, which every NAT program goes on
/// in for an ICMP error, indexed by
/// [`crate::counters::Link::icmp_error_slot`]. Pinned, as
/// [`MAP_ONWARD`]. Apart, so that the verifier walks the quoted header
/// once, not once for every path through the NAT that other packets take.
pub const MAP_ICMP_ERROR: &str = "ist_icmp_error";
/// The programs of [`MAP_ICMP_ERROR`], in its order.
pub const ICMP_ERROR_PROGRAMS: [&str; 4] = [
    "err_egress_eth",
    "err_ingress_eth",
    "err_egress_ip",
    "err_ingress_ip",
];

/// Program array: the masquerade, which the egress NAT goes on in for a
/// packet whose source is none of ours, indexed by
/// [`crate::counters::Link`]. Pinned, as [`MAP_ONWARD`]. Apart, so that
/// the verifier walks the connection tracking once, not once for every
/// path through the stateless rules.
pub const MAP_MASQUERADE: &str = "ist_masquerade";
/// The programs of [`MAP_MASQUERADE`], in its order.
pub const MASQUERADE_PROGRAMS: [&str; 2] = ["masq_egress_eth", "masq_egress_ip"];

/// Program array: the masquerade's replies, which the ingress NAT goes on
/// in for a packet to the masquerade address, indexed by
/// [`crate::counters::Link`]. Pinned, as [`MAP_ONWARD`]. Apart, as
/// [`MAP_MASQUERADE`].
pub const MAP_MASQUERADE_IN: &str = "ist_masq_in";
/// The programs of [`MAP_MASQUERADE_IN`], in its order.
pub const MASQUERADE_IN_PROGRAMS: [&str; 2] = ["masq_in_eth", "masq_in_ip"];

/// Program array: the IPv6 NAT, which every IPv4 NAT program goes on in
/// for an IPv6 packet, indexed by [`crate::counters::Link::icmp_error_slot`].
/// Pinned, as [`MAP_ONWARD`]. Apart, so that the verifier walks each
/// family's paths in programs of their own (docs/design.md#dual-stack).
pub const MAP_NAT6: &str = "ist_nat6";
/// The programs of [`MAP_NAT6`], in its order.
pub const NAT6_PROGRAMS: [&str; 4] = ["nat6_out_eth", "nat6_in_eth", "nat6_out_ip", "nat6_in_ip"];
/// Program array: the NAT of ICMPv6 errors, which the IPv6 NAT goes on in
/// for one, as [`MAP_ICMP_ERROR`].
pub const MAP_ICMP6_ERROR: &str = "ist_icmp6_error";
/// The programs of [`MAP_ICMP6_ERROR`], in its order.
pub const ICMP6_ERROR_PROGRAMS: [&str; 4] =
    ["err6_out_eth", "err6_in_eth", "err6_out_ip", "err6_in_ip"];

/// Program array: the IPv6 masquerade, which the IPv6 NAT goes on in for
/// a packet whose source it translates or for the masquerade address, as
/// [`MAP_MASQUERADE`] and [`MAP_MASQUERADE_IN`] for IPv4, indexed by
/// [`crate::counters::Link::icmp_error_slot`].
pub const MAP_MASQUERADE6: &str = "ist_masq6";
/// The programs of [`MAP_MASQUERADE6`], in its order.
pub const MASQUERADE6_PROGRAMS: [&str; 4] = [
    "masq6_out_eth",
    "masq6_in_eth",
    "masq6_out_ip",
    "masq6_in_ip",
];

/// Program array: a Liqo v1 peer's IPv6 remap, as [`MAP_PEER_DNAT`] and
/// the peer SNAT programs for IPv4, indexed by
/// [`crate::counters::Link::icmp_error_slot`]: going out, after the IPv6
/// NAT; coming in, before it, from the peer SNAT program of the device.
pub const MAP_PEER_REMAP6: &str = "ist_peer_remap6";
/// The programs of [`MAP_PEER_REMAP6`], in its order.
pub const PEER_REMAP6_PROGRAMS: [&str; 4] = [
    "peer_dnat6_eth",
    "peer_snat6_eth",
    "peer_dnat6_ip",
    "peer_snat6_ip",
];

/// Every program array, pinned beside [`MAPS`].
pub const PROGRAM_ARRAYS: [&str; 10] = [
    MAP_ONWARD,
    MAP_PEER_DNAT,
    MAP_NAT_IN,
    MAP_ICMP_ERROR,
    MAP_MASQUERADE,
    MAP_MASQUERADE_IN,
    MAP_NAT6,
    MAP_ICMP6_ERROR,
    MAP_MASQUERADE6,
    MAP_PEER_REMAP6,
];

/// Every TC program the agent attaches.
pub const PROGRAMS: [&str; 10] = [
    PROG_EGRESS_ETH,
    PROG_INGRESS_ETH,
    PROG_EGRESS_IP,
    PROG_INGRESS_IP,
    PROG_STEER,
    PROG_ACCEPT,
    PROG_DECAP,
    // Last, so that the others keep their netlink handles
    // (`nl_handle`) across an upgrade.
    PROG_PEER_SNAT_ETH,
    PROG_PEER_SNAT_IP,
    PROG_OWN,
];

/// Every TC program of the object: those the agent attaches, and those
/// they go on in by tail call.
pub fn tc_programs() -> impl Iterator<Item = &'static str> {
    PROGRAMS
        .into_iter()
        .chain(ONWARD_PROGRAMS)
        .chain(PEER_DNAT_PROGRAMS)
        .chain(ICMP_ERROR_PROGRAMS)
        .chain(MASQUERADE_PROGRAMS)
        .chain(MASQUERADE_IN_PROGRAMS)
        .chain(NAT6_PROGRAMS)
        .chain(ICMP6_ERROR_PROGRAMS)
        .chain(MASQUERADE6_PROGRAMS)
        .chain(PEER_REMAP6_PROGRAMS)
}

/// Maximum number of peer networks in [`MAP_PEERS`] (two per peer).
pub const MAX_PEER_NETWORKS: u32 = 8192;
/// Capacity of [`MAP_GUARD_SOURCES`] and of [`MAP_GUARD_SOURCES6`]:
/// configured and roamed endpoints.
pub const MAX_GUARD_SOURCES: u32 = 16384;
/// Capacity of [`MAP_GUARD_INDEXES`]: one per tunnel peer.
pub const MAX_GUARD_INDEXES: u32 = 8192;
/// Capacity of [`MAP_GUARD_PORTS`]: one per tunnel device, as
/// [`MAX_PEER_DEVS`].
pub const MAX_GUARD_PORTS: u32 = MAX_PEER_DEVS;
/// Capacity of [`MAP_STACK_DESTINATIONS`] and of
/// [`MAP_STACK_DESTINATIONS6`]: a Service address each, for kube-proxy's
/// rules.
pub const MAX_STACK_DESTINATIONS: u32 = 16384;
/// Capacity of [`MAP_POD_DEVS`]: pods on one node.
pub const MAX_POD_DEVS: u32 = 4096;
/// Capacity of [`MAP_NODES`] (PodCIDRs and addresses of the cluster's nodes) and of
/// [`MAP_NODE_ADDRS`].
pub const MAX_NODES: u32 = 16384;
/// Default capacity of [`MAP_NATMAP`] and [`MAP_NATMAP_REV`]; the agent may
/// set another at load time.
pub const DEFAULT_NAT_MAPPINGS: u32 = 65536;
/// Default capacity of [`MAP_CONNTRACK`], in entries (two per flow); the
/// agent may set another at load time.
pub const DEFAULT_CONNTRACK: u32 = 131_072;
/// Default capacity of [`MAP_ALLOWED`]; the agent may set another at load
/// time.
pub const DEFAULT_ALLOWED: u32 = 65536;
/// Default capacity of [`MAP_PEER_FLOWS`]; the agent may set another at
/// load time.
pub const DEFAULT_PEER_FLOWS: u32 = 65536;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_fits_the_kernels_fifteen_characters() {
        let names = tc_programs()
            .chain([PROG_GUARD])
            .chain(PROGRAM_ARRAYS)
            .chain(MAPS);
        for name in names {
            assert!(name.len() <= 15, "{name} is longer than 15 characters");
        }
    }
}
