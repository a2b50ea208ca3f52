//! Masquerade in the kernel: ports allocated per flow, replies brought
//! back, a full table, closed connections, the collector, fragments.

use super::*;

#[test]
fn masquerade_allocates_ports_and_brings_replies_back() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let masqueraded = |d| h.counter(counters::kind_slot(Link::Eth, d, Kind::Masquerade));
    let before = [masqueraded(Egress), masqueraded(Ingress)];
    // The node's own flow keeps its port while it is free.
    h.expect(
        Egress,
        &tcp_ports(NODE, B_POD1, 40001, 80),
        &tcp_ports(A_MASQ_AT_B, B_POD1, 40001, 80),
    );
    assert_eq!(masqueraded(Egress), before[0] + 1, "counted as masquerade");
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40001),
        &tcp_ports(B_POD1, NODE, 80, 40001),
    );
    assert_eq!(masqueraded(Ingress), before[1] + 1, "counted as masquerade");
    // Another source, same port, same server: the port is taken, so another.
    let (ret, out) = h.run(
        Egress,
        &eth_ipv4(&tcp_ports(NODE2, B_POD1, 40001, 80).bytes()),
    );
    let port = sport_of(&out);
    assert_eq!(ret, HAND_ON);
    assert!(port != 40001 && port >= 1024, "allocated port {port}");
    assert_eq!(
        hex(&out),
        hex(&eth_ipv4(&tcp_ports(A_MASQ_AT_B, B_POD1, port, 80).bytes()))
    );
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, port),
        &tcp_ports(B_POD1, NODE2, 80, 40001),
    );
    // The first flow is undisturbed, and its next packet reuses its entry.
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40001),
        &tcp_ports(B_POD1, NODE, 80, 40001),
    );
    h.expect(
        Egress,
        &tcp_ports(NODE, B_POD1, 40001, 80),
        &tcp_ports(A_MASQ_AT_B, B_POD1, 40001, 80),
    );
    // UDP, and transit from another peer's network.
    h.expect(
        Egress,
        &udp_ports(TRANSIT, B_POD2, 5353, 53),
        &udp_ports(A_MASQ_AT_B, B_POD2, 5353, 53),
    );
    h.expect(
        Ingress,
        &udp_ports(B_POD2, A_MASQ_AT_B, 53, 5353),
        &udp_ports(B_POD2, TRANSIT, 53, 5353),
    );
    // ICMP echo: the identifier is the port.
    let echo = Datagram::new(NODE, B_POD1, L4::Echo { id: 77, seq: 1 });
    h.expect(Egress, &echo, &echo.between(A_MASQ_AT_B, B_POD1));
    let reply = Datagram::new(B_POD1, A_MASQ_AT_B, L4::EchoReply { id: 77, seq: 1 });
    h.expect(Ingress, &reply, &reply.between(B_POD1, NODE));
    let second = Datagram::new(NODE2, B_POD1, L4::Echo { id: 77, seq: 1 });
    let (_, out) = h.run(Egress, &eth_ipv4(&second.bytes()));
    let id = u16::from_be_bytes([out[38], out[39]]);
    assert_ne!(
        id, 77,
        "a second echo with the same identifier needs another"
    );
    let want = Datagram::new(A_MASQ_AT_B, B_POD1, L4::Echo { id, seq: 1 });
    assert_eq!(hex(&out), hex(&eth_ipv4(&want.bytes())));
    let reply = Datagram::new(B_POD1, A_MASQ_AT_B, L4::EchoReply { id, seq: 1 });
    let want = Datagram::new(B_POD1, NODE2, L4::EchoReply { id: 77, seq: 1 });
    h.expect(Ingress, &reply, &want);
    // The node says "fragmentation needed" for b's datagram to a pod whose
    // link is narrower: the error takes the masquerade address, without
    // state, and its quote the stateless rules.
    let quoted = udp(B_POD1, A_POD1);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 4, NODE, B_POD1, quoted, len);
    let want = err
        .between(A_MASQ_AT_B, B_POD1)
        .quoting(B_POD1, A_POD1_AT_B);
    h.expect(Egress, &err, &want);
    // A reply to no flow gets the stateless step only.
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 999),
        &tcp_ports(B_POD1, A_MASQ, 80, 999),
    );
    // Our own pods are never masqueraded.
    h.expect(
        Egress,
        &tcp_ports(A_POD1, B_POD1, 40001, 80),
        &tcp_ports(A_POD1_AT_B, B_POD1, 40001, 80),
    );
}

#[test]
fn a_full_table_drops_new_flows_evicts_none_and_dead_flows_are_collected() {
    use Direction::{Egress, Ingress};
    // Room for two flows.
    let mut h = Harness::build(Some(A_MASQ), 4);
    let udp_flow = udp_ports(NODE, B_POD1, 1000, 53);
    let tcp_flow = tcp_ports(NODE, B_POD1, 2000, 80);
    h.expect(Egress, &udp_flow, &udp_flow.between(A_MASQ_AT_B, B_POD1));
    h.expect(Egress, &tcp_flow, &tcp_flow.between(A_MASQ_AT_B, B_POD1));
    let third = udp_ports(NODE, B_POD1, 3000, 53);
    let dropped = || {
        [
            counters::outcome_slot(Link::Eth, Egress, Outcome::Dropped),
            counters::drop_slot(Link::Eth, Egress, DropReason::ConntrackFull),
        ]
        .map(|slot| h.counter(slot))
    };
    let before = dropped();
    let (ret, _) = h.run(Egress, &eth_ipv4(&third.bytes()));
    assert_eq!(ret, DROP, "a flow that cannot be tracked must not leave");
    assert_eq!(
        dropped(),
        before.map(|n| n + 1),
        "dropped, for a full table"
    );
    // Both live flows still work.
    h.expect(
        Ingress,
        &udp_ports(B_POD1, A_MASQ_AT_B, 53, 1000),
        &udp_ports(B_POD1, NODE, 53, 1000),
    );
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 2000),
        &tcp_ports(B_POD1, NODE, 80, 2000),
    );

    // The collector's clock: UDP and an unanswered SYN both live 60 s.
    let last = h
        .conntrack
        .entries()
        .unwrap()
        .iter()
        .map(|(_, nat)| nat.last_seen)
        .max()
        .unwrap();
    let timeouts = Timeouts::DEFAULT;
    let kept = h
        .conntrack
        .remove_dead(last + 59 * SECOND, &timeouts)
        .unwrap();
    assert_eq!((kept.live, kept.removed), (4, 0));
    let gone = h
        .conntrack
        .remove_dead(last + 61 * SECOND, &timeouts)
        .unwrap();
    assert_eq!((gone.live, gone.removed), (0, 4));
    h.expect(Egress, &third, &third.between(A_MASQ_AT_B, B_POD1));
}

/// A connection both sides closed is over, and the collector sees it so;
/// a SYN from the same port (a client reusing it within the close
/// timeout) opens a new one on the same masquerade, which is not.
#[test]
fn a_closed_connection_is_over_until_a_syn_from_its_port_opens_it_anew() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let fin = |src, dst, sport, dport| Datagram::new(src, dst, L4::TcpFin { sport, dport });
    let syn_ack = |src, dst, sport, dport| {
        let l4 = L4::TcpSyn {
            sport,
            dport,
            ack: true,
            mss: TUNNEL_MSS,
        };
        Datagram::new(src, dst, l4)
    };
    let open = || {
        let syn = tcp_ports(NODE, B_POD1, 40001, 80);
        h.expect(Egress, &syn, &syn.between(A_MASQ_AT_B, B_POD1));
        let answer = syn_ack(B_POD1, A_MASQ_AT_B, 80, 40001);
        h.expect(Ingress, &answer, &answer.between(B_POD1, NODE));
    };
    let states = || {
        let entries = h.conntrack.entries().unwrap();
        let state = |dir| {
            let (_, nat) = entries.iter().find(|(k, _)| k.dir == dir).unwrap();
            TcpState::from_u8(nat.state)
        };
        let flows = h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap();
        assert_eq!((entries.len(), flows.len()), (2, 1), "one flow");
        (state(DIR_OUT), state(DIR_IN), flows[0].closed)
    };
    open();
    assert_eq!(states(), (TcpState::Syn, TcpState::Established, false));
    let ours = fin(NODE, B_POD1, 40001, 80);
    h.expect(Egress, &ours, &ours.between(A_MASQ_AT_B, B_POD1));
    assert_eq!(states(), (TcpState::Fin, TcpState::Established, false));
    let theirs = fin(B_POD1, A_MASQ_AT_B, 80, 40001);
    h.expect(Ingress, &theirs, &theirs.between(B_POD1, NODE));
    assert_eq!(states(), (TcpState::Fin, TcpState::Fin, true));
    let read = h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap()[0];
    assert!(h.conntrack.still_closed(&read));
    open();
    assert_eq!(states(), (TcpState::Syn, TcpState::Established, false));
    // The collector read it closed, but it is open now: it stays.
    assert!(!h.conntrack.still_closed(&read));
    let mut h = h;
    assert_eq!(h.conntrack.remove_closed(&[read]), 0);
    assert_eq!(h.conntrack.entries().unwrap().len(), 2);
}

/// The collector removes a flow's reply entry before its outbound one:
/// between the two, a packet out still leaves by the flow's port. Removed
/// the other way round, the packet would find the port held by the reply's
/// entry and take another, and the far side would see a stranger.
#[test]
fn a_flow_half_removed_by_the_collector_keeps_its_port() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let data = |sport| {
        let l4 = L4::TcpData {
            sport,
            dport: 80,
            payload: b"more".to_vec(),
        };
        Datagram::new(NODE, B_POD1, l4)
    };
    let open = |h: &Harness, sport| {
        let syn = tcp_ports(NODE, B_POD1, sport, 80);
        h.expect(Egress, &syn, &syn.between(A_MASQ_AT_B, B_POD1));
        let answer = tcp_ports(B_POD1, A_MASQ_AT_B, 80, sport);
        h.expect(Ingress, &answer, &answer.between(B_POD1, NODE));
        h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap()[0]
    };
    let out_port = |h: &Harness| {
        let entries = h.conntrack.entries().unwrap();
        let (_, nat) = entries.iter().find(|(k, _)| k.dir == DIR_OUT).unwrap();
        nat.port
    };

    let flow = open(&h, 40001);
    let [first, second] = flow.keys() else {
        panic!("a masqueraded flow has two entries: {flow:?}")
    };
    assert_eq!(
        (first.dir(), second.dir()),
        (DIR_IN, DIR_OUT),
        "reply first"
    );
    assert_eq!(h.conntrack.remove(&[*first]), 1);
    let more = data(40001);
    h.expect(Egress, &more, &more.between(A_MASQ_AT_B, B_POD1));
    assert_eq!(h.conntrack.remove(&[*second]), 1);

    // The hazard the order avoids: the outbound entry gone first.
    let flow = open(&h, 40002);
    assert_eq!(h.conntrack.remove(&flow.keys()[1..]), 1);
    let (ret, _) = h.run(Egress, &eth_ipv4(&data(40002).bytes()));
    assert_eq!(ret, HAND_ON);
    assert_ne!(out_port(&h), 40002, "the reply's entry still holds 40002");
}

/// The collector reads a table of many thousand entries whole, though the
/// kernel hands them over a few thousand at a time.
#[test]
fn the_collector_reads_every_entry_of_a_table_larger_than_one_batch() {
    const FLOWS: u16 = 10_000;
    let h = Harness::build(Some(A_MASQ), 4 * u32::from(FLOWS));
    for port in 1..=FLOWS {
        let flow = udp_ports(NODE, B_POD1, port, 53);
        let (ret, _) = h.run(Direction::Egress, &eth_ipv4(&flow.bytes()));
        assert_ne!(ret, DROP, "flow {port} was not tracked");
    }
    let entries = h.conntrack.entries().unwrap();
    let keys: std::collections::HashSet<_> = entries.iter().map(|(key, _)| *key).collect();
    assert_eq!(
        entries.len(),
        2 * usize::from(FLOWS),
        "an entry per direction"
    );
    assert_eq!(keys.len(), entries.len(), "no entry read twice");
    let outbound = entries
        .iter()
        .filter(|(key, _)| key.dir == isthmus_common::conntrack::DIR_OUT)
        .count();
    assert_eq!(outbound, usize::from(FLOWS));
}

/// A masqueraded datagram in fragments: the first gets the flow's address
/// and port, the later ones (no ports) the same address, both ways; a later
/// fragment whose first was never seen is dropped and counted, never sent
/// with an address the far side cannot answer.
#[test]
fn the_fragments_of_a_masqueraded_datagram_go_where_the_first_went() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let out = udp_in_fragments(NODE, B_POD1, 5353, 53);
    let out_nat = out.between(A_MASQ_AT_B, B_POD1);
    let back = udp_in_fragments(B_POD1, A_MASQ_AT_B, 53, 5353);
    let back_nat = back.between(B_POD1, NODE);
    for (direction, whole, translated) in [(Egress, &out, &out_nat), (Ingress, &back, &back_nat)] {
        for (from, to) in [(0, 32), (32, 72)] {
            let (ret, got) = h.run(direction, &eth_ipv4(&whole.fragment(from, to)));
            assert_eq!(ret, HAND_ON, "{direction:?} fragment at {from}");
            assert_eq!(
                hex(&got),
                hex(&eth_ipv4(&translated.fragment(from, to))),
                "{direction:?} fragment at {from}"
            );
        }
        let unknown = |h: &Harness| {
            h.counter(counters::drop_slot(
                Link::Eth,
                direction,
                DropReason::UnknownFragment,
            ))
        };
        let before = unknown(&h);
        let stray = eth_ipv4(&with_id(whole.fragment(32, 72), 0x4321));
        assert_eq!(
            h.run(direction, &stray),
            (DROP, stray.clone()),
            "{direction:?} stray"
        );
        assert_eq!(unknown(&h), before + 1, "{direction:?}: counted");
    }
}
