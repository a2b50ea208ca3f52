//! The IPv6 masquerade in the kernel: ports allocated per flow in the IPv6
//! flow table, replies brought back, ICMPv6 echoes by their identifier,
//! fragments after their first, and the collector over both families'
//! tables.

use isthmus_agent::kernel::conntrack::TrackedKey;
use isthmus_common::{
    ipv6::{ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST},
    wire::Be128,
};
use isthmus_tests::packet6::{Packet6, addr6, icmp6, tcp6, udp6};

use super::{
    ipv6::{Fate, a_pod1, a_pod1_at_b, b_pod1, check, with_peer_b},
    *,
};

/// a-gw's IPv6 masquerade address: the last but one of a's PodCIDR.
fn masq() -> [u8; 16] {
    addr6("fd00:10:244::ffff:ffff:ffff:fffe")
}

/// How b sees it.
fn masq_at_b() -> [u8; 16] {
    addr6("fd00:10:0:40:ffff:ffff:ffff:fffe")
}

/// Two of a's nodes, whose addresses are none of a's networks.
fn node() -> [u8; 16] {
    addr6("fd00:172:16:1::2")
}
fn node2() -> [u8; 16] {
    addr6("fd00:172:16:1::1")
}

/// `base` with peer b's IPv6 networks and the IPv6 masquerade on.
fn masquerading(base: Harness) -> Harness {
    let mut h = with_peer_b(base, SecurityMode::FullPodToPod);
    Masquerade::<Be128>::new(h.ebpf.take_map(names::MAP_SNAT6).unwrap())
        .unwrap()
        .set(Some(Be128::from_bytes(masq())))
        .unwrap();
    h
}

const MASQUERADED: &[Kind] = &[Kind::Masquerade, Kind::Prefix];

/// A packet out and its expected rewrite, as [`check`] takes them.
fn out(expected: &Packet6) -> Fate {
    Fate::Out(expected.bytes(), Outcome::Translated, MASQUERADED)
}

/// The source port (or echo identifier) of the IPv6 packet in `frame`.
fn sport6(frame: &[u8]) -> u16 {
    let l4 = 14 + 40;
    let at = if frame[14 + 6] == 58 { l4 + 4 } else { l4 };
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

#[test]
fn the_ipv6_masquerade_allocates_ports_and_brings_replies_back() {
    use Direction::{Egress, Ingress};
    let h = masquerading(Harness::new());
    let syn = Packet6::new(node(), b_pod1(), tcp6(40001, 80, 0x02, &[]));
    let answer = Packet6::new(b_pod1(), masq_at_b(), tcp6(80, 40001, 0x12, &[]));
    let mut failures = check(
        &h,
        "the node's SYN keeps its free port",
        Egress,
        &syn.bytes(),
        out(&syn.between(masq_at_b(), b_pod1())),
    );
    failures.extend(check(
        &h,
        "the answer goes back to the node",
        Ingress,
        &answer.bytes(),
        out(&answer.between(b_pod1(), node())),
    ));
    // Another source, same port, same server: the port is taken.
    let second = Packet6::new(node2(), b_pod1(), tcp6(40001, 80, 0x02, &[]));
    let (ret, frame) = h.run(Egress, &ethernet(ETH_P_IPV6, &second.bytes()));
    let port = sport6(&frame);
    assert_eq!(ret, HAND_ON);
    assert!(port != 40001 && port >= 1024, "allocated port {port}");
    let moved = Packet6::new(masq_at_b(), b_pod1(), tcp6(port, 80, 0x02, &[]));
    assert_eq!(hex(&frame), hex(&ethernet(ETH_P_IPV6, &moved.bytes())));
    let answer2 = Packet6::new(b_pod1(), masq_at_b(), tcp6(80, port, 0x12, &[]));
    let back2 = Packet6::new(b_pod1(), node2(), tcp6(80, 40001, 0x12, &[]));
    failures.extend(check(
        &h,
        "the second flow's answer goes back to its own source and port",
        Ingress,
        &answer2.bytes(),
        out(&back2),
    ));
    // ICMPv6 echo: the identifier is the port, and the checksum covers
    // the addresses.
    let echo = Packet6::new(
        node(),
        b_pod1(),
        icmp6(ICMPV6_ECHO_REQUEST, [0, 77, 0, 1], b"hi"),
    );
    let reply = Packet6::new(
        b_pod1(),
        masq_at_b(),
        icmp6(ICMPV6_ECHO_REPLY, [0, 77, 0, 1], b"hi"),
    );
    failures.extend(check(
        &h,
        "echo request",
        Egress,
        &echo.bytes(),
        out(&echo.between(masq_at_b(), b_pod1())),
    ));
    failures.extend(check(
        &h,
        "echo reply",
        Ingress,
        &reply.bytes(),
        out(&reply.between(b_pod1(), node())),
    ));
    // A reply to no flow gets the stateless step only.
    let stray = Packet6::new(b_pod1(), masq_at_b(), udp6(53, 999, b"stray"));
    failures.extend(check(
        &h,
        "a reply to no flow",
        Ingress,
        &stray.bytes(),
        Fate::Out(
            stray.between(b_pod1(), masq()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    ));
    // Our own pods are never masqueraded.
    let pod = Packet6::new(a_pod1(), b_pod1(), udp6(5353, 53, b"query"));
    failures.extend(check(
        &h,
        "a pod's datagram",
        Egress,
        &pod.bytes(),
        Fate::Out(
            pod.between(a_pod1_at_b(), b_pod1()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Three flows, two entries each, all in the IPv6 table.
    assert!(h.conntrack.entries().unwrap().is_empty());
    assert_eq!(h.conntrack.entries6().unwrap().len(), 6);
}

#[test]
fn later_ipv6_fragments_follow_their_first_through_the_masquerade() {
    use Direction::{Egress, Ingress};
    let h = masquerading(Harness::new());
    let datagram = Packet6::new(node(), b_pod1(), udp6(5353, 53, &[7; 64]));
    let first = datagram.in_fragment(0, true, 0x0a0b_0c0d);
    let mut failures = check(
        &h,
        "first fragment",
        Egress,
        &first.bytes(),
        out(&first.between(masq_at_b(), b_pod1())),
    );
    let data = [9u8; 24];
    let later = datagram.in_fragment(9, false, 0x0a0b_0c0d);
    failures.extend(check(
        &h,
        "later fragment",
        Egress,
        &later.with_segment(&data),
        Fate::Out(
            later.between(masq_at_b(), b_pod1()).with_segment(&data),
            Outcome::Translated,
            MASQUERADED,
        ),
    ));
    // A later fragment whose first was never seen names no flow.
    let orphan = datagram.in_fragment(9, false, 0x0bad_0bad);
    failures.extend(check(
        &h,
        "a later fragment of an unknown datagram",
        Egress,
        &orphan.with_segment(&data),
        Fate::Dropped(DropReason::UnknownFragment),
    ));
    // The answer's fragments come back the same way.
    let answer = Packet6::new(b_pod1(), masq_at_b(), udp6(53, 5353, &[8; 64]));
    let first = answer.in_fragment(0, true, 0x0102_0304);
    failures.extend(check(
        &h,
        "the answer's first fragment",
        Ingress,
        &first.bytes(),
        out(&first.between(b_pod1(), node())),
    ));
    let later = answer.in_fragment(9, false, 0x0102_0304);
    failures.extend(check(
        &h,
        "the answer's later fragment",
        Ingress,
        &later.with_segment(&data),
        Fate::Out(
            later.between(b_pod1(), node()).with_segment(&data),
            Outcome::Translated,
            MASQUERADED,
        ),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_collector_sweeps_both_families_flows_as_one_table() {
    use Direction::Egress;
    let mut h = masquerading(Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK));
    let v4 = udp_ports(NODE, B_POD1, 1000, 53);
    h.expect(Egress, &v4, &v4.between(A_MASQ_AT_B, B_POD1));
    let v6 = Packet6::new(node(), b_pod1(), udp6(1000, 53, b"q"));
    let failures = check(
        &h,
        "v6",
        Egress,
        &v6.bytes(),
        out(&v6.between(masq_at_b(), b_pod1())),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let flows = h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap();
    let families: Vec<bool> = flows
        .iter()
        .map(|f| matches!(f.keys()[0], TrackedKey::V6(_)))
        .collect();
    assert_eq!(
        families,
        [false, true],
        "one flow of each family: {flows:?}"
    );
    assert!(flows.iter().all(|f| f.keys().len() == 2 && !f.dead));
    // Past UDP's lifetime, both are dead, and both tables are emptied.
    let last = flows.iter().map(|f| f.last_seen).max().unwrap();
    let collected = h
        .conntrack
        .remove_dead(last + 61 * SECOND, &Timeouts::DEFAULT)
        .unwrap();
    assert_eq!(collected.removed, 4);
    assert!(h.conntrack.entries().unwrap().is_empty());
    assert!(h.conntrack.entries6().unwrap().is_empty());
}
