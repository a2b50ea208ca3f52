//! Isthmus against a Liqo v0.10 gateway. In the Liqo-peer lab
//! (`cargo xtask lab up --liqo-v0-10-peer b`), cluster b runs wireguard-go, Liqo's
//! iptables rules and a conncheck written from Liqo's protocol
//! (`isthmus_lab::lab::liqo_v0_10_peer`); cluster a runs Isthmus. Reachability rows 1–3 hold,
//! and each side's conncheck reaches the other.
//!
//! These tests need that lab, not the standard one: `cargo xtask test` runs
//! them in it, after the rest of the suite.

use std::time::Duration;

use isthmus_lab::{
    lab::{self, liqo_conncheck},
    probe::{self, Proto},
    topology::{self, A, B},
};
use isthmus_tests::{eventually, require_lab};
use serde_json::Value;

/// Liqo's PING every 2 s and five of them before a verdict, with margin.
pub(crate) const CONNCHECK: Duration = Duration::from_secs(20);

fn require_liqo_lab() {
    require_lab();
    assert_eq!(
        lab::Setup::current()
            .expect("the lab's setup")
            .liqo
            .map(|l| l.cluster().name),
        Some(B.name),
        "the lab is not the Liqo-peer lab: run `cargo xtask lab up --liqo-v0-10-peer b`"
    );
}

/// What b's Liqo conncheck last wrote.
pub(crate) fn liqo_side() -> Value {
    std::fs::read_to_string(liqo_conncheck::status_file(&B))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

#[test]
#[ignore = "needs the Liqo-peer lab; `cargo xtask test` runs it there"]
fn rows_1_to_3_hold_between_isthmus_and_a_liqo_gateway() {
    require_liqo_lab();
    assert_rows_1_to_3();
}

/// Waits until b's Liqo conncheck has a-gw's PONGs and PINGs.
pub(crate) fn b_hears_a() {
    eventually(
        CONNCHECK,
        "b's Liqo conncheck hears a-gw's PONGs and PINGs",
        || {
            let b = liqo_side();
            b["peers"]["cluster-a"]["connected"] == true
                && b["peers"]["cluster-a"]["pongs"]
                    .as_u64()
                    .is_some_and(|n| n >= 3)
                && b["pings_answered"].as_u64().is_some_and(|n| n > 0)
        },
    );
}

/// Reachability rows 1 to 3, over TCP, UDP and ICMP, each end seeing
/// the addresses the row says.
pub(crate) fn assert_rows_1_to_3() {
    for reach in topology::reachability().iter().filter(|r| r.row <= 3) {
        for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
            let seen = probe::exchange(proto, &reach.from, &reach.answered_by, reach.target)
                .unwrap_or_else(|e| panic!("row {} over {proto:?}: {e:#}", reach.row));
            assert_eq!(
                (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
                (reach.client_seen_as, reach.target),
                "row {} over {proto:?}",
                reach.row
            );
        }
    }
}

#[test]
#[ignore = "needs the Liqo-peer lab; `cargo xtask test` runs it there"]
fn isthmus_measures_the_liqo_gateway_and_the_liqo_gateway_measures_isthmus() {
    require_liqo_lab();
    let connected = || {
        lab::metric_sum(
            &A.gw(),
            "liqo_peer_is_connected",
            &[("cluster_id", "cluster-b")],
        )
        .is_ok_and(|v| v == 1.0)
    };
    eventually(
        CONNCHECK,
        "a-gw's conncheck reaches b's Liqo gateway",
        connected,
    );
    let latency = lab::metric_sum(
        &A.gw(),
        "liqo_peer_latency_us",
        &[("cluster_id", "cluster-b")],
    )
    .unwrap();
    assert!(
        latency > 0.0 && latency < 100_000.0,
        "a-gw measures {latency} µs to b"
    );

    // The first PING waits in wireguard-go for the handshake: the round
    // trip is read once a few have come back, as Liqo's status refreshes.
    b_hears_a();
    let b = liqo_side();
    let rtt = b["peers"]["cluster-a"]["latency_us"].as_f64().unwrap();
    assert!(
        rtt > 0.0 && rtt < 100_000.0,
        "b measures {rtt} µs to a: {b}"
    );
    assert!(
        b["pings_answered"].as_u64().unwrap() > 0,
        "b answered none of a-gw's PINGs: {b}"
    );

    // What a-gw's TunnelEndpoint status says, as its log shows it with
    // `--source dir:`: Connected, with Liqo's message and a latency in μs
    // or ms.
    eventually(CONNCHECK, "a-gw logs b Connected", || {
        let log = std::fs::read_to_string(lab::log_file(&A.gw())).unwrap_or_default();
        log.lines().any(|l| {
            l.contains("TunnelEndpoint status")
                && l.contains("liqo-tenant-b/tep-b")
                && l.contains("Connected")
                && l.contains("VPN connection established")
                && (l.contains("μs") || l.contains("ms"))
        })
    });
}
