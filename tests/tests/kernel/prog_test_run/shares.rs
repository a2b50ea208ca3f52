//! Each peer's share of the flow table: a flood from one peer fills only
//! its own share.

use super::*;

/// A peer's transit flows fill only that peer's share of the conntrack:
/// the next one is dropped and counted against that peer, while the other
/// peer's flows and the gateway's own still find room. The collector then
/// evicts that peer's oldest flow that was never answered, not its
/// answered one, and its next flow fits.
#[test]
fn a_peers_flows_fill_only_its_share_and_its_unanswered_ones_go_first() {
    use Direction::{Egress, Ingress};
    // 16 entries, 4 kept for the gateway: two peers, 6 entries (3 flows) each.
    let mut h = Harness::build(Some(A_MASQ), 16);
    let metrics = test_metrics();
    let mut sweeper = Sweeper::new(16, 4);
    let peers = [1, 2];
    sweeper.pass(
        &mut h.conntrack,
        &mut h.rooms,
        &peers,
        sharing(),
        true,
        &*metrics,
    );
    // Peer s (ID 2) sends three transit flows towards b; b answers the first.
    // Not S_POD: a NatMapping exposes that one, and it is not masqueraded.
    let transit = |port| udp_ports(S_POD2, B_POD1, port, 53);
    for port in [5000, 5001, 5002] {
        h.expect(
            Egress,
            &transit(port),
            &transit(port).between(A_MASQ_AT_B, B_POD1),
        );
    }
    h.expect(
        Ingress,
        &udp_ports(B_POD1, A_MASQ_AT_B, 53, 5000),
        &udp_ports(B_POD1, S_POD2, 53, 5000),
    );
    let refused = |owner, short| {
        h.rooms
            .refusals(FlowTable::Conntrack, 2)
            .unwrap()
            .get(owner, short)
    };
    h.expect_dropped(
        "a fourth flow of peer s",
        Egress,
        &transit(5003).bytes(),
        DropReason::ConntrackFull,
        None,
    );
    assert_eq!(
        refused(2, Short::Share),
        1,
        "counted against peer s's share"
    );
    assert_eq!(refused(OWNER_LOCAL, Short::Share), 0);
    // The gateway's own flow, and flows of the other peer, still fit.
    let own = udp_ports(NODE, B_POD1, 6000, 53);
    h.expect(Egress, &own, &own.between(A_MASQ_AT_B, B_POD1));

    // The collector sees the refusal: s's oldest unanswered flow (5001)
    // goes; the answered one stays.
    sweeper.pass(
        &mut h.conntrack,
        &mut h.rooms,
        &peers,
        sharing(),
        false,
        &*metrics,
    );
    let ports: Vec<u16> = h
        .conntrack
        .entries()
        .unwrap()
        .iter()
        .filter(|(k, nat)| k.dir == isthmus_common::conntrack::DIR_OUT && nat.owner == 2)
        .map(|(k, _)| k.sport)
        .collect();
    let mut ports = ports;
    ports.sort_unstable();
    assert_eq!(
        ports,
        [5000, 5002],
        "the oldest unanswered flow was evicted"
    );
    let room = h.rooms.room(FlowTable::Conntrack, 2).unwrap();
    assert_eq!((room.limit, room.used(room.charged)), (6, 4));
    let all = h.rooms.room(FlowTable::Conntrack, ALL_PEERS).unwrap();
    assert_eq!(all.limit, 12);
    h.expect(
        Egress,
        &transit(5003),
        &transit(5003).between(A_MASQ_AT_B, B_POD1),
    );
}

/// Flows towards a segregated peer are charged to that peer: past its
/// share, its next one is dropped and counted against it.
#[test]
fn flows_towards_a_segregated_peer_are_bounded_by_its_share() {
    use Direction::Egress;
    let mut h = Harness::segregated(8);
    let metrics = test_metrics();
    let mut sweeper = Sweeper::new(8, 0);
    // Two peers: b (ID 1, segregated) gets half the table.
    sweeper.pass(
        &mut h.peer_flows,
        &mut h.rooms,
        &[1, 2],
        sharing(),
        true,
        &*metrics,
    );
    for port in 40000..40004 {
        let flow = tcp_ports(A_POD1, B_POD1, port, 443);
        h.expect(Egress, &flow, &tcp_ports(A_POD1_AT_B, B_POD1, port, 443));
    }
    h.expect_dropped(
        "a fifth flow towards b",
        Egress,
        &tcp_ports(A_POD1, B_POD1, 40004, 443).bytes(),
        DropReason::PeerFlowsFull,
        None,
    );
    let refused = h
        .rooms
        .refusals(FlowTable::PeerFlows, 2)
        .unwrap()
        .get(1, Short::Share);
    assert_eq!(refused, 1);
    // None answered: the collector evicts the oldest, and the next fits.
    sweeper.pass(
        &mut h.peer_flows,
        &mut h.rooms,
        &[1, 2],
        sharing(),
        false,
        &*metrics,
    );
    assert_eq!(h.peer_flows.entries().unwrap().len(), 3);
    let flow = tcp_ports(A_POD1, B_POD1, 40004, 443);
    h.expect(Egress, &flow, &tcp_ports(A_POD1_AT_B, B_POD1, 40004, 443));
}

#[test]
fn a_full_table_of_flows_towards_a_segregated_peer_drops_new_ones_and_keeps_the_rest() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::segregated(1);
    let first = tcp_ports(A_POD1, B_POD1, 40300, 443);
    h.expect(Egress, &first, &tcp_ports(A_POD1_AT_B, B_POD1, 40300, 443));
    let second = tcp_ports(A_POD1, B_POD1, 40301, 443);
    h.expect_dropped(
        "a second flow",
        Egress,
        &second.bytes(),
        DropReason::PeerFlowsFull,
        None,
    );
    // The first flow's packets and replies go on.
    h.expect(Egress, &first, &tcp_ports(A_POD1_AT_B, B_POD1, 40300, 443));
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_POD1_AT_B, 443, 40300),
        &tcp_ports(B_POD1, A_POD1, 443, 40300),
    );
    // Once collected past the lifetime of its state, as the conntrack's
    // flows are, the room goes to the next flow.
    let [(_, life)] = h.peer_flows.entries().unwrap()[..] else {
        panic!("one flow recorded")
    };
    let (ours, theirs) = (TcpState::from_u8(life.ours), TcpState::from_u8(life.theirs));
    let lifetime = Timeouts::DEFAULT.lifetime(PROTO_TCP, ours, theirs) * SECOND;
    let kept = h
        .peer_flows
        .remove_dead(life.last_seen + lifetime - SECOND, &Timeouts::DEFAULT);
    assert_eq!(kept.map(|c| (c.live, c.removed)).unwrap(), (1, 0));
    let gone = h
        .peer_flows
        .remove_dead(life.last_seen + lifetime + SECOND, &Timeouts::DEFAULT);
    assert_eq!(gone.map(|c| (c.live, c.removed)).unwrap(), (0, 1));
    h.expect(Egress, &second, &tcp_ports(A_POD1_AT_B, B_POD1, 40301, 443));
}

/// The first fragments a peer's transit datagrams leave in the fragment
/// table are bounded per second by its budget, which the collector sets:
/// past it, only that peer's datagrams lose their later fragments, and the
/// refusals are counted against it. Another peer's datagrams, and the
/// gateway's own, still cross whole.
#[test]
fn a_peers_first_fragments_past_its_budget_cost_only_its_own_datagrams() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let metrics = test_metrics();
    let mut budgets = FragmentBudgets::new(25);
    // Two peers, each with 1% of the peers' room: 61 entries a second.
    budgets
        .pass(&mut h.rooms, &[1, 2], Share::Percent(1), &*metrics)
        .unwrap();
    let budget = |h: &Harness, owner| h.rooms.fragment_budget(owner).unwrap();
    assert_eq!(budget(&h, 2).limit, 61);
    assert_eq!(budget(&h, ALL_PEERS).limit, 6144);
    assert_eq!(
        budget(&h, OWNER_LOCAL).limit,
        0,
        "the gateway's own: the table bounds it"
    );

    // Crosses in two fragments with identification `id`: both translated,
    // or the later one dropped as a fragment whose first was not seen.
    let crosses = |h: &Harness, direction, whole: &Datagram, translated: &Datagram, id| {
        let (ret, got) = h.run(direction, &eth_ipv4(&with_id(whole.fragment(0, 32), id)));
        assert_eq!(ret, HAND_ON, "a first fragment always crosses");
        assert_eq!(
            hex(&got),
            hex(&eth_ipv4(&with_id(translated.fragment(0, 32), id)))
        );
        let later = eth_ipv4(&with_id(whole.fragment(32, 72), id));
        let (ret, got) = h.run(direction, &later);
        if ret == DROP {
            assert_eq!(got, later, "dropped untouched");
            return false;
        }
        assert_eq!(
            hex(&got),
            hex(&eth_ipv4(&with_id(translated.fragment(32, 72), id)))
        );
        true
    };
    // Peer s (ID 2) sends transit datagrams towards b: 61 cross whole.
    let transit = udp_in_fragments(S_POD2, B_POD1, 5353, 53);
    let transit_nat = transit.between(A_MASQ_AT_B, B_POD1);
    let unknown = || {
        h.counter(counters::drop_slot(
            Link::Eth,
            Egress,
            DropReason::UnknownFragment,
        ))
    };
    let dropped_before = unknown();
    let whole = (1..=70)
        .filter(|id| crosses(&h, Egress, &transit, &transit_nat, *id))
        .count();
    // A window that opened just before a second passed may let one more in.
    assert!(
        (61..=62).contains(&whole),
        "{whole} of 70 crossed whole, past a budget of 61"
    );
    assert_eq!(
        unknown(),
        dropped_before + 70 - whole as u64,
        "each counted"
    );
    let refused = budget(&h, 2).refused(Short::Share);
    assert_eq!(refused, 70 - whole as u64, "counted against peer s");

    // The gateway's own datagrams, and b's replies to them, still cross.
    let own = udp_in_fragments(NODE, B_POD1, 6000, 53);
    let reply = udp_in_fragments(B_POD1, A_MASQ_AT_B, 53, 6000);
    for (direction, whole, translated, id) in [
        (Egress, &own, own.between(A_MASQ_AT_B, B_POD1), 900),
        (Ingress, &reply, reply.between(B_POD1, NODE), 901),
    ] {
        assert!(
            crosses(&h, direction, whole, &translated, id),
            "{direction:?}"
        );
    }
    assert_eq!(budget(&h, 1).refused(Short::Share), 0);

    // The collector reports the refusals, against peer s.
    budgets
        .pass(&mut h.rooms, &[1, 2], Share::Percent(1), &*metrics)
        .unwrap();
    let labels = [
        ("table", "fragments".to_owned()),
        ("owner", metrics.owner_name(2)),
        ("reason", "share_full".to_owned()),
    ];
    assert_eq!(metrics.flow_refusals.get_or_create(&labels).get(), refused);
}
