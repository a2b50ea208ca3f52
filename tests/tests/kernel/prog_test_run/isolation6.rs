//! A segregated peer over IPv6: it reaches what the IPv6 allowed table
//! opens to it, and the replies to flows our side opened, recorded in the
//! IPv6 table of such flows, which the collector sweeps with IPv4's. Its
//! ICMPv6 errors are dropped.

use isthmus_common::{
    ipv6::{ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST, ICMPV6_PACKET_TOO_BIG},
    wire::Be128,
};
use isthmus_tests::packet6::{Packet6, icmp6, icmp6_error, tcp6, udp6};

use super::{
    ipv6::{Fate, a_pod1, a_pod1_at_b, a_pod2, a_pod2_at_b, b_pod1, check, with_peer_b},
    *,
};

/// Peer b segregated in both families, and the IPv6 allowed table.
fn segregated() -> (Harness, ByteHash<AllowKey<Be128>>) {
    let base = Harness::segregated(names::DEFAULT_PEER_FLOWS);
    let mut h = with_peer_b(base, SecurityMode::IntraClusterTrafficSegregation);
    let allowed = ByteHash::new(h.ebpf.take_map(names::MAP_ALLOWED6).unwrap()).unwrap();
    (h, allowed)
}

fn translated() -> &'static [Kind] {
    &[Kind::Prefix]
}

#[test]
fn a_segregated_peer_reaches_only_what_it_is_allowed_and_our_flows_over_ipv6() {
    use Direction::{Egress, Ingress};
    let (h, mut allowed) = segregated();
    let denied = || Fate::Dropped(DropReason::Denied);
    let to_pod1 = Packet6::new(b_pod1(), a_pod1_at_b(), tcp6(40000, 18080, 0x02, &[]));
    let mut failures = check(&h, "before any allow", Ingress, &to_pod1.bytes(), denied());
    // An endpoint exported to b, as its IPv6 slice names it: that protocol
    // and port alone.
    let endpoint = AllowKey::endpoint(1, Be128::from_bytes(a_pod1()), PROTO_TCP, 18080);
    allowed.put(endpoint, &1, None).unwrap();
    let pass = |name, direction, input: &Packet6, src, dst| {
        let fate = Fate::Out(
            input.between(src, dst).bytes(),
            Outcome::Translated,
            translated(),
        );
        check(&h, name, direction, &input.bytes(), fate)
    };
    failures.extend(pass("exported port", Ingress, &to_pod1, b_pod1(), a_pod1()));
    let other_port = Packet6::new(b_pod1(), a_pod1_at_b(), tcp6(40000, 18082, 0x02, &[]));
    failures.extend(check(
        &h,
        "another port",
        Ingress,
        &other_port.bytes(),
        denied(),
    ));
    let udp_same = Packet6::new(b_pod1(), a_pod1_at_b(), udp6(40000, 18080, b"q"));
    failures.extend(check(
        &h,
        "udp on that port",
        Ingress,
        &udp_same.bytes(),
        denied(),
    ));
    // A pod offloaded from b: any port, any protocol, pings too.
    let offloaded = AllowKey::any_port(1, Be128::from_bytes(a_pod2()));
    allowed.put(offloaded, &1, None).unwrap();
    let to_pod2 = Packet6::new(b_pod1(), a_pod2_at_b(), udp6(5353, 9, b"q"));
    failures.extend(pass(
        "offloaded pod, udp",
        Ingress,
        &to_pod2,
        b_pod1(),
        a_pod2(),
    ));
    let ping2 = Packet6::new(
        b_pod1(),
        a_pod2_at_b(),
        icmp6(ICMPV6_ECHO_REQUEST, [0, 5, 0, 1], b"ping"),
    );
    failures.extend(pass(
        "offloaded pod, ping",
        Ingress,
        &ping2,
        b_pod1(),
        a_pod2(),
    ));
    // A flow a-pod1 opens towards b: its replies pass; a flow b opens does not.
    let out = Packet6::new(a_pod1(), b_pod1(), tcp6(40200, 443, 0x02, &[]));
    failures.extend(pass("our flow out", Egress, &out, a_pod1_at_b(), b_pod1()));
    let reply = Packet6::new(b_pod1(), a_pod1_at_b(), tcp6(443, 40200, 0x12, &[]));
    failures.extend(pass("its reply", Ingress, &reply, b_pod1(), a_pod1()));
    let stray = Packet6::new(b_pod1(), a_pod1_at_b(), tcp6(443, 40201, 0x12, &[]));
    failures.extend(check(&h, "not our flow", Ingress, &stray.bytes(), denied()));
    let ping = Packet6::new(
        a_pod1(),
        b_pod1(),
        icmp6(ICMPV6_ECHO_REQUEST, [0, 31, 0, 1], b"ping"),
    );
    failures.extend(pass("our ping", Egress, &ping, a_pod1_at_b(), b_pod1()));
    let pong = Packet6::new(
        b_pod1(),
        a_pod1_at_b(),
        icmp6(ICMPV6_ECHO_REPLY, [0, 31, 0, 1], b"ping"),
    );
    failures.extend(pass("its answer", Ingress, &pong, b_pod1(), a_pod1()));
    let forged = Packet6::new(
        b_pod1(),
        a_pod1_at_b(),
        icmp6(ICMPV6_ECHO_REPLY, [0, 32, 0, 1], b"ping"),
    );
    failures.extend(check(
        &h,
        "an answer to no ping",
        Ingress,
        &forged.bytes(),
        denied(),
    ));
    // An ICMPv6 error from a segregated peer is dropped, even one about a
    // flow of ours: the errors' stage has no room to judge it.
    let quoted = out.between(a_pod1_at_b(), b_pod1()).bytes();
    let too_big = icmp6_error(
        b_pod1(),
        a_pod1_at_b(),
        ICMPV6_PACKET_TOO_BIG,
        [0, 0, 5, 0],
        &quoted,
    );
    failures.extend(check(
        &h,
        "an error about our flow",
        Ingress,
        &too_big.bytes(),
        denied(),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Both flows are in the IPv6 table, none in IPv4's, and the collector
    // sweeps them with IPv4's.
    let flows = h.peer_flows.entries6().unwrap();
    assert_eq!(flows.len(), 2, "{flows:?}");
    assert!(h.peer_flows.entries().unwrap().is_empty());
    let last = flows.iter().map(|(_, f)| f.last_seen).max().unwrap();
    let mut peer_flows = h.peer_flows;
    let collected = peer_flows
        .remove_dead(last + 7 * 3600 * SECOND, &Timeouts::DEFAULT)
        .unwrap();
    assert_eq!((collected.live, collected.removed), (0, 2));
    assert!(peer_flows.entries6().unwrap().is_empty());
}
