//! A Liqo v1 peer over IPv6 (docs/design.md#liqo-v1-peers): the harness
//! of `liqo_v1`, whose peer b has IPv6 networks too. Egress runs
//! `nat_egress_eth`, which goes on in the IPv6 NAT and then in
//! `peer_dnat6_eth`; ingress runs `peer_snat_eth`, which goes on in
//! `peer_snat6_eth` and then in the IPv6 NAT. Each output frame is
//! compared whole, with every checksum computed from scratch.

use aya::maps::HashMap as BpfHashMap;
use isthmus_agent::kernel::peer_table::PeerMap6;
use isthmus_common::{ipv6::ICMPV6_PACKET_TOO_BIG, nat::PeerKey, wire::Be128};
use isthmus_tests::packet6::{Packet6, addr6, icmp6_error, tcp6, udp6};

use super::{
    ipv6::{a_pod1, b_pod1},
    liqo_v1::V1,
    *,
};

/// b-pod1 as it really is: a-pod1's own address.
fn b_pod1_real() -> [u8; 16] {
    a_pod1()
}

/// An address of b's ExternalCIDR, in a's view and as it really is.
fn b_ext() -> [u8; 16] {
    addr6("fd00:10:0:1::45")
}
fn b_ext_real() -> [u8; 16] {
    addr6("fd00:192:168::45")
}

/// One of a's nodes, which no peer may reach.
fn node6() -> [u8; 16] {
    addr6("fd00:172:16:1::1")
}

/// Puts `peer`'s IPv6 networks in the IPv6 peer table, names it as the
/// peer of device `ifindex`, and lists a's node.
pub(super) fn add_peer(ebpf: &mut Ebpf, peer: &Peer, ifindex: u32) {
    let mut peers = PeerMap6::new(
        ebpf.take_map(names::MAP_PEERS6).unwrap(),
        ebpf.take_map(names::MAP_PEER_OWNERS6).unwrap(),
        ebpf.take_map(names::MAP_PREFIX_LENS6).unwrap(),
    )
    .unwrap();
    let networks = peer.ipv6.as_ref().expect("b's IPv6 networks");
    let nat = peer.nat6(1, SecurityMode::FullPodToPod).unwrap();
    let views = networks.views(peer.layout);
    for (_, net) in views {
        peers.put(net, &nat, None).unwrap();
    }
    let pod_view = views[0].1;
    let mut devices: BpfHashMap<_, u32, PeerKey<Be128>> =
        BpfHashMap::try_from(ebpf.map_mut(names::MAP_PEER_DEVS6).unwrap()).unwrap();
    let key = PeerKey::of(Be128::from(pod_view.network()), pod_view.prefix_len());
    devices.insert(ifindex, key, 0).unwrap();
    let mut nodes: ByteHash<Be128> =
        ByteHash::new(ebpf.take_map(names::MAP_NODE_ADDRS6).unwrap()).unwrap();
    nodes.put(Be128::from_bytes(node6()), &1, None).unwrap();
}

fn frame(packet: &Packet6) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &packet.bytes())
}

fn tcp(src: [u8; 16], dst: [u8; 16]) -> Packet6 {
    Packet6::new(src, dst, tcp6(40000, 8080, 0x18, &[]))
}

fn udp(src: [u8; 16], dst: [u8; 16]) -> Packet6 {
    Packet6::new(src, dst, udp6(5353, 53, b"query"))
}

#[test]
fn towards_a_v1_peer_over_ipv6_its_address_goes_back_to_the_real_one_and_ours_stays() {
    use Direction::Egress;
    let v1 = V1::new();
    let cases = [
        (
            "tcp to b-pod1",
            tcp(a_pod1(), b_pod1()),
            tcp(a_pod1(), b_pod1_real()),
            &[Kind::Prefix][..],
        ),
        (
            "udp to b's ExternalCIDR",
            udp(a_pod1(), b_ext()),
            udp(a_pod1(), b_ext_real()),
            &[Kind::Prefix],
        ),
        (
            "our ICMPv6 error quotes b's packet: its source goes back too",
            icmp6_error(
                a_pod1(),
                b_pod1(),
                1,
                [0; 4],
                &udp(b_pod1(), a_pod1()).bytes(),
            ),
            icmp6_error(
                a_pod1(),
                b_pod1_real(),
                1,
                [0; 4],
                &udp(b_pod1_real(), a_pod1()).bytes(),
            ),
            &[Kind::Prefix],
        ),
        (
            "not a peer's",
            tcp(a_pod1(), addr6("2001:db8::8")),
            tcp(a_pod1(), addr6("2001:db8::8")),
            &[],
        ),
    ];
    for (name, input, want, kinds) in cases {
        v1.expect_frame(name, Egress, &frame(&input), &frame(&want), kinds);
    }
}

#[test]
fn from_a_v1_peer_over_ipv6_its_real_source_goes_to_our_view_before_the_nat() {
    use Direction::Ingress;
    let v1 = V1::new();
    v1.expect_frame(
        "b-pod1 to a-pod1: the same real address on both ends",
        Ingress,
        &frame(&tcp(b_pod1_real(), a_pod1())),
        &frame(&tcp(b_pod1(), a_pod1())),
        &[Kind::Prefix],
    );
    // a-pod1's datagram as it left, seen by a router of b's: too big.
    let router = addr6("fd00:172:16:2::1");
    let sent = udp(a_pod1(), b_pod1_real());
    let too_big = |quoted: &Packet6| {
        icmp6_error(
            router,
            a_pod1(),
            ICMPV6_PACKET_TOO_BIG,
            1280u32.to_be_bytes(),
            &quoted.bytes(),
        )
    };
    v1.expect_frame(
        "a router of b's quotes our packet: its destination goes to our view",
        Ingress,
        &frame(&too_big(&sent)),
        &frame(&too_big(&sent.between(a_pod1(), b_pod1()))),
        &[Kind::Prefix],
    );
}

#[test]
fn a_v1_peer_reaches_no_node_over_ipv6_and_sends_nothing_unreadable() {
    let v1 = V1::new();
    v1.expect_denied_frame(
        "b to a node",
        &frame(&tcp(b_pod1_real(), node6())),
        DenyReason::NodeAddress,
    );
    let mut cut = tcp(b_pod1_real(), a_pod1()).bytes();
    cut.truncate(cut.len() - 12);
    let payload_len = (cut.len() - 40) as u16;
    cut[4..6].copy_from_slice(&payload_len.to_be_bytes());
    v1.expect_denied_frame(
        "a cut TCP header",
        &ethernet(ETH_P_IPV6, &cut),
        DenyReason::Unparseable,
    );
    // Past the walk's bound, the remap cannot name the peer's source: the
    // packet is refused before the NAT, and counted so.
    let long = udp(b_pod1_real(), a_pod1()).with_options(9);
    let before = v1.counters.read().unwrap();
    let (ret, _) = v1.run_frame(Direction::Ingress, &frame(&long));
    assert_eq!(ret, DROP, "nine extension headers");
    let after = v1.counters.read().unwrap();
    let slot = counters::drop_slot(Link::Eth, Direction::Ingress, DropReason::ExtensionHeaders);
    assert_eq!(after[slot as usize] - before[slot as usize], 1);
}
