//! docs/design.md#expected-reachability, rows 1–5, with real sockets in the lab's pods:
//! the right pod answers, and each end sees the other under the remapped
//! address (row 5: through the hub b, by NatMapping and masquerade). The
//! gateways' NAT counters prove the kernel programs did it.

use isthmus_lab::{
    probe::{self, Proto},
    topology::{self, A, B},
};
use isthmus_tests::{metrics::nat_packets, require_lab};

pub(crate) fn check_rows(proto: Proto) {
    require_lab();
    let translated = |gw: &str| {
        nat_packets(gw, "egress", "translated") + nat_packets(gw, "ingress", "translated")
    };
    // c-gw translates nothing: b and c see each other unremapped, and the
    // hub's work for row 5 happens on b-gw.
    let gateways: Vec<String> = [A.gw(), B.gw()].into();
    let before: Vec<f64> = gateways.iter().map(|gw| translated(gw)).collect();
    let rows = topology::reachability();
    for row in &rows {
        let seen = probe::exchange(proto, &row.from, &row.answered_by, row.target)
            .unwrap_or_else(|e| panic!("row {}: {e:#}", row.row));
        assert_eq!(
            seen.client_as_seen_by_server,
            row.client_seen_as,
            "row {} {}: {} saw the client as {}",
            row.row,
            proto.as_str(),
            row.answered_by,
            seen.client_as_seen_by_server
        );
        assert_eq!(
            seen.server_as_seen_by_client,
            row.target,
            "row {} {}: reply came from elsewhere",
            row.row,
            proto.as_str()
        );
    }
    // A gateway translates the request and the reply of every row it
    // carries, except row 4 (b to c, nothing remapped).
    let after: Vec<f64> = gateways.iter().map(|gw| translated(gw)).collect();
    for (i, gw) in gateways.iter().enumerate() {
        let rows_here = rows
            .iter()
            .filter(|r| r.clusters_crossed().iter().any(|c| &c.gw() == gw))
            .filter(|r| r.row != 4)
            .count();
        assert!(
            after[i] - before[i] >= 2.0 * rows_here as f64,
            "{gw}: only {} packets translated for {rows_here} exchanges",
            after[i] - before[i],
        );
    }
}

#[test]
fn rows_1_to_5_over_tcp() {
    check_rows(Proto::Tcp);
}

#[test]
fn rows_1_to_5_over_udp() {
    check_rows(Proto::Udp);
}

#[test]
fn rows_1_to_5_over_icmp_echo() {
    check_rows(Proto::Icmp);
}
