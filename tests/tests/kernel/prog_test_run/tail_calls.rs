//! docs/design.md#tail-calls: a packet whose next program is missing from
//! its program array is dropped and counted as `missed_tail_call`, never
//! sent on without the rewrite or the check that program does. Each array
//! is emptied in turn under a packet that goes on in it.

use aya::maps::ProgramArray;

use super::{
    liqo_v1::{B_POD1_REAL, V1},
    *,
};

/// Empties slot `index` of program array `array` of `ebpf`.
fn empty_slot(ebpf: &mut Ebpf, array: &str, index: u32) {
    let mut programs = ProgramArray::try_from(ebpf.map_mut(array).unwrap()).unwrap();
    programs.clear_index(&index).unwrap();
}

/// How far the counters of `direction`'s Ethernet program moved.
#[derive(Debug, PartialEq, Eq)]
struct Moved {
    /// Each outcome that moved, and by how much.
    outcomes: Vec<(Outcome, u64)>,
    /// Drops counted as `missed_tail_call`.
    missed: u64,
}

/// Runs `run` (which returns the TC action) and says how `counters`
/// moved for `direction`.
fn counted(counters: &Counters, direction: Direction, run: impl FnOnce() -> i32) -> (i32, Moved) {
    let before = counters.read().unwrap();
    let action = run();
    let after = counters.read().unwrap();
    let delta = |slot: u32| after[slot as usize] - before[slot as usize];
    let moved = Moved {
        outcomes: counters::OUTCOMES
            .into_iter()
            .map(|o| (o, delta(counters::outcome_slot(Link::Eth, direction, o))))
            .filter(|(_, n)| *n != 0)
            .collect(),
        missed: delta(counters::drop_slot(
            Link::Eth,
            direction,
            DropReason::MissedTailCall,
        )),
    };
    (action, moved)
}

#[test]
fn a_peers_packet_that_misses_the_onward_program_is_dropped_and_counted() {
    use Direction::Ingress;
    let mut harness = Harness::new();
    let from_b = eth_ipv4(&udp(B_POD1, A_POD1_AT_B).bytes());
    let (action, _) = harness.run(Ingress, &from_b);
    assert_eq!(action, HAND_ON, "with the onward program in place");

    empty_slot(&mut harness.ebpf, names::MAP_ONWARD, Link::Eth as u32);
    let (action, moved) = counted(&harness.counters, Ingress, || {
        harness.run(Ingress, &from_b).0
    });
    assert_eq!(action, DROP, "without it");
    // The NAT gave the packet its outcome before the call.
    let translated = vec![(Outcome::Translated, 1)];
    assert_eq!(
        moved,
        Moved {
            outcomes: translated,
            missed: 1
        }
    );

    let stranger = eth_ipv4(&udp([8, 8, 8, 8], A_POD1).bytes());
    let (action, out) = harness.run(Ingress, &stranger);
    assert_eq!(
        (action, out),
        (HAND_ON, stranger),
        "no peer's packet makes no call"
    );
}

#[test]
fn a_gateway_of_liqo_v0_10_peers_makes_no_call_to_the_peer_dnat() {
    use Direction::Egress;
    // Its peer DNAT array is empty, as the agent leaves it.
    let harness = Harness::new();
    let to_b = eth_ipv4(&udp(A_POD1, B_POD1).bytes());
    let mut out = Vec::new();
    let (action, moved) = counted(&harness.counters, Egress, || {
        let (action, frame) = harness.run(Egress, &to_b);
        out = frame;
        action
    });
    assert_eq!(action, HAND_ON);
    assert_eq!(out, eth_ipv4(&udp(A_POD1_AT_B, B_POD1).bytes()));
    assert_eq!(moved.missed, 0);
}

#[test]
fn a_v1_peers_packet_that_misses_the_peer_dnat_or_the_nat_is_dropped_and_counted() {
    let cases = [
        // Sent on, it would carry b's address in our view; the egress NAT
        // gave it its outcome.
        (
            names::MAP_PEER_DNAT,
            Direction::Egress,
            tcp(A_POD1, B_POD1),
            Outcome::Passed,
        ),
        // Sent on, it would skip the NAT's checks; the NAT never saw it,
        // so the drop is its one outcome.
        (
            names::MAP_NAT_IN,
            Direction::Ingress,
            tcp(B_POD1_REAL, A_POD1),
            Outcome::Dropped,
        ),
    ];
    for (array, direction, packet, outcome) in cases {
        let mut v1 = V1::new();
        assert_eq!(v1.run(direction, &packet).0, HAND_ON, "{array} in place");
        empty_slot(&mut v1.ebpf, array, Link::Eth as u32);
        let (action, moved) = counted(&v1.counters, direction, || v1.run(direction, &packet).0);
        assert_eq!(action, DROP, "{array} empty");
        let want = Moved {
            outcomes: vec![(outcome, 1)],
            missed: 1,
        };
        assert_eq!(moved, want, "{array} empty");
    }
}

#[test]
fn a_packet_that_misses_a_later_stage_of_the_nat_is_dropped_and_counted() {
    use Direction::{Egress, Ingress};
    let error_slot = |direction| Link::Eth.icmp_error_slot(direction);
    let cases = [
        // a-pod1 refuses b-pod1's datagram.
        (
            names::MAP_ICMP_ERROR,
            error_slot(Egress),
            Egress,
            icmp_error(3, 3, A_POD1, B_POD1, udp(B_POD1, A_POD1), 28),
            None,
        ),
        // b-pod1 refuses a-pod1's.
        (
            names::MAP_ICMP_ERROR,
            error_slot(Ingress),
            Ingress,
            icmp_error(3, 3, B_POD1, A_POD1_AT_B, udp(A_POD1_AT_B, B_POD1), 28),
            None,
        ),
        // The node's own flow, which the masquerade translates.
        (
            names::MAP_MASQUERADE,
            Link::Eth as u32,
            Egress,
            tcp_ports(NODE, B_POD1, 40001, 80),
            None,
        ),
        // b-pod1's answer to it, which the masquerade takes back.
        (
            names::MAP_MASQUERADE_IN,
            Link::Eth as u32,
            Ingress,
            tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40001),
            Some(tcp_ports(NODE, B_POD1, 40001, 80)),
        ),
    ];
    for (array, slot, direction, packet, opened_by) in cases {
        let mut harness = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
        if let Some(first) = opened_by {
            let (action, _) = harness.run(Egress, &eth_ipv4(&first.bytes()));
            assert_eq!(action, HAND_ON, "{array}: the flow opens");
        }
        let frame = eth_ipv4(&packet.bytes());
        let (action, out) = harness.run(direction, &frame);
        assert_eq!(action, HAND_ON, "{array} in place");
        assert_ne!(out, frame, "{array}: the packet is translated");

        empty_slot(&mut harness.ebpf, array, slot);
        let (action, moved) = counted(&harness.counters, direction, || {
            harness.run(direction, &frame).0
        });
        assert_eq!(action, DROP, "{array} empty");
        // The first stage leaves the packet's outcome to the next.
        let want = Moved {
            outcomes: vec![(Outcome::Dropped, 1)],
            missed: 1,
        };
        assert_eq!(moved, want, "{array} empty");
    }
}
