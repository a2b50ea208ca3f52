//! IPv6 past the stack (docs/design.md#dual-stack), as IPv4 goes in
//! `overlay_test_run`: a peer's packet for a pod of the gateway node after
//! the IPv6 NAT, and the gateway's own pods' packets for a peer, forwarded
//! by the FIB with the next hop's MACs and a hop limit one lower; and what
//! the stack alone must forward left to it. IPv6 has a switch of its own.

use isthmus_agent::kernel::table::KernelTable;
use isthmus_common::{
    names,
    overlay::{OverlayEvent, PAST_NETFILTER},
};
use isthmus_tests::{
    addrs::{A_POD2, A_POD2_AT_B, B_POD1},
    netns,
    packet::{eth_ipv4, ethernet, tcp},
    packet6::{Packet6, addr6, tcp6, udp6},
};

use crate::{
    forwarding_node::ForwardingNode,
    overlay_test_run::{HAND_ON, Harness, REDIRECT, Row, check},
};

const NS: &str = "ist-t-onward6";
const NEXT_HOP_NS: &str = "ist-t-onward6-nh";
const ETH_P_IPV6: u16 = 0x86dd;

/// `packet` in an Ethernet frame, with `hop_limit`.
fn frame(packet: &Packet6, hop_limit: u8) -> Vec<u8> {
    let mut bytes = packet.bytes();
    bytes[7] = hop_limit;
    ethernet(ETH_P_IPV6, &bytes)
}

/// A row of a frame the programs leave to the stack as `out`, counting
/// nothing.
fn stays(name: &'static str, program: &'static str, input: Vec<u8>, out: Vec<u8>) -> Row {
    (name, program, input, HAND_ON, out, &[][..])
}

#[test]
fn ipv6_goes_past_the_stack_where_the_fib_settles_it_and_its_rules_allow() {
    let mut h = Harness::new();
    let node = ForwardingNode::new(NS, NEXT_HOP_NS);
    node.route6("fd00:10:244::/64");
    h.netns = Some(NS);
    let a_pod2 = addr6("fd00:10:244:0:8000::133");
    let a_pod2_at_b = addr6("fd00:10:0:40:8000::133");
    let b_pod1 = addr6("fd00:10::5");
    let segment = tcp6(40000, 80, 0x10, &[]);
    let from_b = Packet6::new(b_pod1, a_pod2_at_b, segment.clone());
    let translated = Packet6::new(b_pod1, a_pod2, segment);
    let ingress = names::PROG_INGRESS_ETH;
    use OverlayEvent::Forwarded;
    check(
        &h,
        vec![
            (
                "b's IPv6 packet for a-pod2: translated, next hop's MACs, hop limit 63",
                ingress,
                frame(&from_b, 64),
                REDIRECT,
                node.to_next_hop(frame(&translated, 63)),
                &[Forwarded],
            ),
            stays(
                "hop limit 1: translated, the stack answers time-exceeded",
                ingress,
                frame(&from_b, 1),
                frame(&translated, 1),
            ),
        ],
    );

    let pod = format!("{}/128", std::net::Ipv6Addr::from(a_pod2))
        .parse()
        .unwrap();
    h.stack_destinations6.put(pod, &1, None).unwrap();
    check(
        &h,
        vec![stays(
            "a destination the node's IPv6 rules act on: translated, to the stack",
            ingress,
            frame(&from_b, 64),
            frame(&translated, 64),
        )],
    );
    h.stack_destinations6.delete(pod, &1).unwrap();

    // IPv4 past netfilter, IPv6 not: each family follows its own switch.
    h.configure(|c| c.flags = PAST_NETFILTER);
    let from_b4 = |dst, ttl| eth_ipv4(&tcp(B_POD1, dst).with_ttl(ttl).bytes());
    check(
        &h,
        vec![
            stays(
                "IPv6 not past netfilter: translated, to the stack",
                ingress,
                frame(&from_b, 64),
                frame(&translated, 64),
            ),
            (
                "IPv4 past netfilter meanwhile: b's packet for a-pod2 forwarded",
                ingress,
                from_b4(A_POD2_AT_B, 64),
                REDIRECT,
                node.to_next_hop(from_b4(A_POD2, 63)),
                &[Forwarded],
            ),
        ],
    );
    h.configure(|c| c.flags = 0);
    netns::remove(&[NS, NEXT_HOP_NS]);
}

/// On the active gateway node, its own pods' IPv6 packets for b go towards
/// the NAT device by the FIB; what the stack must see stays with it.
#[test]
fn the_gateways_pods_ipv6_for_a_peer_goes_past_the_stack_but_what_the_stack_must_see() {
    let mut h = Harness::new();
    let node = ForwardingNode::new("ist-t-steer6", "ist-t-steer6-nh");
    node.route6("fd00:10::/64");
    h.netns = Some("ist-t-steer6");
    h.configure(|c| c.local = c.gateway);
    let a_pod2 = addr6("fd00:10:244:0:8000::133");
    let b_pod1 = addr6("fd00:10::5");
    let to_b = Packet6::new(a_pod2, b_pod1, udp6(40000, 53, b"isthmus"));
    let link_local = to_b.between(addr6("fe80::1"), b_pod1);
    let hop_by_hop = to_b.with_options(1);
    let cut = frame(&to_b, 64)[..14 + 40 + 4].to_vec();
    let steer = names::PROG_STEER;
    let untouched = |name, frame: Vec<u8>| stays(name, steer, frame.clone(), frame);
    check(
        &h,
        vec![
            (
                "a-pod2's IPv6 packet for b: next hop's MACs, hop limit 63",
                steer,
                frame(&to_b, 64),
                REDIRECT,
                node.to_next_hop(frame(&to_b, 63)),
                &[OverlayEvent::Forwarded],
            ),
            untouched("hop limit 1: to the stack", frame(&to_b, 1)),
            untouched(
                "a link-local source, which the stack never forwards: to it",
                frame(&link_local, 64),
            ),
            untouched(
                "a hop-by-hop header, which routers read: to the stack",
                frame(&hop_by_hop, 64),
            ),
            untouched(
                "a payload length more than the packet holds: to the stack",
                cut,
            ),
        ],
    );
    netns::remove(&["ist-t-steer6", "ist-t-steer6-nh"]);
}
