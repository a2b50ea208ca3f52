//! DESIGN §2 reachability rows 1–3, with real sockets in the lab's pods:
//! the right pod answers, and each end sees the other under the remapped
//! address. The gateways' NAT counters prove the kernel programs did it.

use isthmus_tests::{metrics::nat_packets, require_lab};
use xtask::{
    probe::{self, Proto},
    topology::{self, A, B},
};

fn check_rows(proto: Proto) {
    require_lab();
    let translated = |gw: &str| {
        nat_packets(gw, "egress", "translated") + nat_packets(gw, "ingress", "translated")
    };
    let before = [translated(&A.gw()), translated(&B.gw())];
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
    // Each exchange crosses both gateways twice (request and reply), at least.
    let after = [translated(&A.gw()), translated(&B.gw())];
    for (i, gw) in [A.gw(), B.gw()].iter().enumerate() {
        assert!(
            after[i] - before[i] >= 2.0 * rows.len() as f64,
            "{gw}: only {} packets translated for {} exchanges",
            after[i] - before[i],
            rows.len()
        );
    }
}

#[test]
fn rows_1_to_3_over_tcp() {
    check_rows(Proto::Tcp);
}

#[test]
fn rows_1_to_3_over_udp() {
    check_rows(Proto::Udp);
}

#[test]
fn rows_1_to_3_over_icmp_echo() {
    check_rows(Proto::Icmp);
}
