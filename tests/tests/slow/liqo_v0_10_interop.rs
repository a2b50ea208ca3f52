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
    probe::Proto,
    topology::{self, A, B},
};
use isthmus_tests::{POLL, eventually, require_lab};
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

/// A round trip a conncheck could measure in the lab: above zero, under
/// 100 ms. A zone or parsing error in the timestamps lands far outside.
fn plausible_round_trip(latency_us: f64) -> bool {
    latency_us > 0.0 && latency_us < 100_000.0
}

/// Waits until b's Liqo conncheck has a-gw's PONGs and PINGs, and
/// measures a plausible round trip to a. The PINGs sent while
/// wireguard-go waits for its handshake come back together once it is
/// done, each with the wait in its round trip, so the measure is read
/// until a PING sent after the handshake has come back.
pub(crate) fn b_hears_a() {
    let mut last = Value::Null;
    let heard = isthmus_lab::wait::until(
        CONNCHECK,
        POLL,
        "b's Liqo conncheck hears a-gw's PONGs and PINGs, with a plausible round trip",
        || {
            last = liqo_side();
            let a = &last["peers"]["cluster-a"];
            a["connected"] == true
                && a["pongs"].as_u64().is_some_and(|n| n >= 3)
                && a["latency_us"].as_f64().is_some_and(plausible_round_trip)
                && last["pings_answered"].as_u64().is_some_and(|n| n > 0)
        },
    );
    if let Err(e) = heard {
        panic!("{e}; b last wrote {last}");
    }
}

/// Waits until a-gw's conncheck measures a plausible round trip to b, for
/// the reason [`b_hears_a`] gives.
pub(crate) fn a_measures_b() {
    let peer = [("cluster_id", "cluster-b")];
    eventually(
        CONNCHECK,
        "a-gw's conncheck measures a plausible round trip to b",
        || lab::metric_sum(&A.gw(), "liqo_peer_latency_us", &peer).is_ok_and(plausible_round_trip),
    );
}

/// Reachability rows 1 to 3, over TCP, UDP and ICMP, each end seeing
/// the addresses the row says.
pub(crate) fn assert_rows_1_to_3() {
    for reach in topology::reachability().iter().filter(|r| r.row <= 3) {
        for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
            isthmus_tests::assert_row(proto, reach);
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
    a_measures_b();
    b_hears_a();

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
