//! What a peer may reach: our networks, its mappings and our flows'
//! replies; a segregated peer, only what it is allowed.

use super::*;

/// After the ingress translation, a peer reaches only our networks, its
/// NatMapping endpoints and the sources of flows we masqueraded. Anything
/// else it sends is dropped, and counted for that peer and reason; what we
/// send and cannot parse still goes.
#[test]
fn a_peer_reaches_only_our_networks_its_mappings_and_our_flows() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let mut truncated = tcp_header_cut_at(10);
    truncated[12..16].copy_from_slice(&B_POD1);
    truncated[16..20].copy_from_slice(&A_POD1_AT_B);
    truncated[10..12].fill(0);
    let check = isthmus_common::csum::checksum(&truncated[..20]);
    truncated[10..12].copy_from_slice(&check.bytes());
    let denied = [
        (
            "to a node address",
            udp(B_POD1, NODE).bytes(),
            1,
            DenyReason::NodeAddress,
        ),
        (
            "to a NatMapping entry that leads to a node",
            tcp(B_POD1, NODE_EXT_AT_B).bytes(),
            1,
            DenyReason::NodeAddress,
        ),
        (
            "to peer s, with no NatMapping",
            udp(B_POD1, S_POD).bytes(),
            1,
            DenyReason::OtherPeer,
        ),
        (
            "to a ClusterIP",
            tcp(B_POD2, [10, 96, 0, 10]).bytes(),
            1,
            DenyReason::OutsideOurNetworks,
        ),
        (
            "from s to b's pods",
            udp(S_POD, B_POD1).bytes(),
            2,
            DenyReason::OtherPeer,
        ),
        (
            "to the conncheck's address, not its port",
            tcp(B_POD1, A_EXT_FIRST_AT_B).bytes(),
            1,
            DenyReason::NodeAddress,
        ),
        (
            "that cannot be parsed",
            truncated.clone(),
            1,
            DenyReason::Unparseable,
        ),
    ];
    for (name, packet, peer, reason) in denied {
        h.expect_dropped(
            name,
            Ingress,
            &packet,
            DropReason::Denied,
            Some((peer, reason)),
        );
    }
    // Allowed: our pods, the endpoint b's NatMapping names, a flow we masqueraded.
    h.expect(Ingress, &udp(B_POD1, A_POD1_AT_B), &udp(B_POD1, A_POD1));
    h.expect(Ingress, &udp(B_POD1, MAPPED_EXT_AT_B), &udp(B_POD1, S_POD));
    h.expect(
        Egress,
        &tcp_ports(NODE, B_POD1, 40100, 80),
        &tcp_ports(A_MASQ_AT_B, B_POD1, 40100, 80),
    );
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40100),
        &tcp_ports(B_POD1, NODE, 80, 40100),
    );
    // What we send and cannot parse goes on, as before.
    let mut ours = truncated;
    ours[12..20].copy_from_slice(&[A_POD1, B_POD1].concat());
    assert_eq!(
        h.run(Egress, &eth_ipv4(&ours)).0,
        HAND_ON,
        "our own unparseable packet"
    );
}

#[test]
fn a_segregated_peer_reaches_only_what_it_is_allowed_and_our_flows() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::segregated(names::DEFAULT_PEER_FLOWS);
    let not_allowed = Some((1, DenyReason::NotAllowed));
    let allow = |h: &mut Harness, key| h.allowed.put(key, &1, None).unwrap();
    // Nothing allowed yet: b opens nothing in our networks.
    let to_pod1 = tcp_ports(B_POD1, A_POD1_AT_B, 40000, 18080);
    h.expect_dropped(
        "before any allow",
        Ingress,
        &to_pod1.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // An endpoint exported to b: that protocol and port alone.
    allow(
        &mut h,
        AllowKey::endpoint(1, Be32::from_bytes(A_POD1), PROTO_TCP, 18080),
    );
    h.expect(Ingress, &to_pod1, &tcp_ports(B_POD1, A_POD1, 40000, 18080));
    let other_port = tcp_ports(B_POD1, A_POD1_AT_B, 40000, 18082);
    h.expect_dropped(
        "another port",
        Ingress,
        &other_port.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    let udp_same_port = udp_ports(B_POD1, A_POD1_AT_B, 40000, 18080);
    h.expect_dropped(
        "udp on that port",
        Ingress,
        &udp_same_port.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // A pod offloaded from b: any port, any protocol, pings too.
    allow(&mut h, AllowKey::any_port(1, Be32::from_bytes(A_POD2)));
    h.expect(Ingress, &udp(B_POD1, A_POD2_AT_B), &udp(B_POD1, A_POD2));
    let echo = Datagram::new(B_POD1, A_POD2_AT_B, L4::Echo { id: 5, seq: 1 });
    h.expect(Ingress, &echo, &echo.between(B_POD1, A_POD2));
    // b's NatMapping endpoint, as before.
    h.expect(Ingress, &udp(B_POD1, MAPPED_EXT_AT_B), &udp(B_POD1, S_POD));
    // A flow a-pod1 opens towards b: its replies pass, a flow b opens does not.
    let out = tcp_ports(A_POD1, B_POD1, 40200, 443);
    h.expect(Egress, &out, &tcp_ports(A_POD1_AT_B, B_POD1, 40200, 443));
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_POD1_AT_B, 443, 40200),
        &tcp_ports(B_POD1, A_POD1, 443, 40200),
    );
    let other_flow = tcp_ports(B_POD1, A_POD1_AT_B, 443, 40201);
    h.expect_dropped(
        "not our flow",
        Ingress,
        &other_flow.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    let ping = Datagram::new(A_POD1, B_POD1, L4::Echo { id: 31, seq: 1 });
    h.expect(Egress, &ping, &ping.between(A_POD1_AT_B, B_POD1));
    let pong = Datagram::new(B_POD1, A_POD1_AT_B, L4::EchoReply { id: 31, seq: 1 });
    h.expect(Ingress, &pong, &pong.between(B_POD1, A_POD1));
    // ICMP errors about our flow pass, quoting it as it left; about another, not.
    let quoted = tcp_ports(A_POD1_AT_B, B_POD1, 40200, 443);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, len);
    let want = err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1);
    h.expect(Ingress, &err, &want);
    let stray = icmp_error(
        3,
        4,
        B_GW_WAN,
        A_POD1_AT_B,
        tcp_ports(A_POD1_AT_B, B_POD1, 40999, 443),
        len,
    );
    h.expect_dropped(
        "an error about no flow of ours",
        Ingress,
        &stray.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // A forged error that quotes too little of our flow to name it: the
    // quote ends inside the ports, so nothing vouches for it.
    let quoted = tcp_ports(A_POD1_AT_B, B_POD1, 40200, 443);
    let short = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, 20 + 4);
    h.expect_dropped(
        "an error quoting 4 bytes of our flow",
        Ingress,
        &short.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // Peer s is not segregated: it reaches our pods as ever.
    h.expect(Ingress, &udp(S_POD, A_POD1_AT_S), &udp(S_POD, A_POD1));
}

/// Each direction of a flow towards a segregated peer is judged by what it
/// said itself: our SYN-ACK to the peer's SYN (on an exported port) starts
/// no flow of ours; our data the peer never answers lives a SYN's 60 s; a
/// flow it answered, an established one's six hours. An ICMP error quoting
/// our flow is no answer.
#[test]
fn a_flow_towards_a_segregated_peer_lives_long_only_once_both_sides_spoke() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::segregated(names::DEFAULT_PEER_FLOWS);
    h.allowed
        .put(
            AllowKey::endpoint(1, Be32::from_bytes(A_POD1), PROTO_TCP, 18080),
            &1,
            None,
        )
        .unwrap();
    let segment = |src, dst, sport, dport, ack| {
        let l4 = L4::TcpSyn {
            sport,
            dport,
            ack,
            mss: TUNNEL_MSS,
        };
        Datagram::new(src, dst, l4)
    };
    let data = |src, dst, sport, dport| {
        let payload = b"data".to_vec();
        Datagram::new(
            src,
            dst,
            L4::TcpData {
                sport,
                dport,
                payload,
            },
        )
    };
    // b opens a connection to the exported port; our pod answers SYN-ACK.
    let syn = segment(B_POD1, A_POD1_AT_B, 41000, 18080, false);
    h.expect(Ingress, &syn, &syn.between(B_POD1, A_POD1));
    let syn_ack = segment(A_POD1, B_POD1, 18080, 41000, true);
    h.expect(Egress, &syn_ack, &syn_ack.between(A_POD1_AT_B, B_POD1));
    assert!(
        h.peer_flows.entries().unwrap().is_empty(),
        "our SYN-ACK started a flow of ours"
    );
    // Our own flows: one b answers, one it never does (an ICMP error
    // quoting it does not count).
    let answered = data(A_POD1, B_POD1, 40500, 443);
    h.expect(Egress, &answered, &answered.between(A_POD1_AT_B, B_POD1));
    let answer = data(B_POD1, A_POD1_AT_B, 443, 40500);
    h.expect(Ingress, &answer, &answer.between(B_POD1, A_POD1));
    let ignored = data(A_POD1, B_POD1, 40501, 443);
    h.expect(Egress, &ignored, &ignored.between(A_POD1_AT_B, B_POD1));
    let quoted = data(A_POD1_AT_B, B_POD1, 40501, 443);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, len);
    h.expect(
        Ingress,
        &err,
        &err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1),
    );
    let flows = h.peer_flows.entries().unwrap();
    let theirs = |port: u16| {
        let (_, flow) = flows.iter().find(|(k, _)| k.dport == port).unwrap();
        (TcpState::from_u8(flow.ours), TcpState::from_u8(flow.theirs))
    };
    assert_eq!(
        theirs(40500),
        (TcpState::Established, TcpState::Established)
    );
    assert_eq!(theirs(40501), (TcpState::Established, TcpState::None));
    let last = flows.iter().map(|(_, f)| f.last_seen).max().unwrap();
    let collected = h
        .peer_flows
        .remove_dead(last + 61 * SECOND, &Timeouts::DEFAULT)
        .unwrap();
    assert_eq!((collected.live, collected.removed), (1, 1));
    let [(key, _)] = h.peer_flows.entries().unwrap()[..] else {
        panic!("one flow left")
    };
    assert_eq!(
        key.dport, 40500,
        "the unanswered flow outlived a SYN's lifetime"
    );
}
