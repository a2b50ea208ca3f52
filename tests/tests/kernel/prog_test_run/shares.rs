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
    let refused = |owner, short| h.rooms.refused(FlowTable::Conntrack, owner, short).unwrap();
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
        .refused(FlowTable::PeerFlows, 1, Short::Share)
        .unwrap();
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
