//! The XDP guard on a-gw's uplink, in the lab: a bounded flood of
//! handshake-shaped datagrams from an address no peer uses is dropped in
//! XDP, userspace sees none of it, and a and b keep talking throughout.
//! The guard is an option the DaemonSet ships off, so the lab runs without
//! it; this test turns it on for itself.

use std::{
    net::UdpSocket,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use isthmus_lab::{
    cmd::ip,
    lab::{self, LabTunnel},
    netns,
    probe::{self, Proto},
    topology::{A, TUNNEL_PORT, WAN_NS, reachability},
};
use isthmus_tests::{metrics::sample, require_lab};

/// An address of the test's own on the WAN bridge, which no peer uses.
const STRANGER: &str = "203.0.113.98";
/// Datagrams in the flood: bounded, and it stops by itself.
const FLOOD: u64 = 50_000;

/// The gateways run with their XDP guard until dropped.
struct GuardOn;

impl GuardOn {
    fn new() -> Self {
        lab::set_guard(true).unwrap();
        Self
    }
}

impl Drop for GuardOn {
    fn drop(&mut self) {
        if let Err(e) = lab::set_guard(false) {
            eprintln!("turning the guard back off: {e:#}");
        }
    }
}

struct Stranger;

impl Stranger {
    fn new() -> Self {
        let _ = ip(
            WAN_NS,
            &["addr", "del", &format!("{STRANGER}/24"), "dev", "br0"],
        );
        ip(
            WAN_NS,
            &["addr", "add", &format!("{STRANGER}/24"), "dev", "br0"],
        )
        .unwrap();
        Self
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = ip(
            WAN_NS,
            &["addr", "del", &format!("{STRANGER}/24"), "dev", "br0"],
        );
    }
}

fn guard(verdict: &str) -> f64 {
    sample(
        &A.gw(),
        &format!("isthmus_guard_packets_total{{verdict=\"{verdict}\"}}"),
    )
}

fn userspace_rejections() -> f64 {
    sample(
        &A.gw(),
        "isthmus_tunnel_dropped_packets_total{reason=\"unknown_sender\"}",
    ) + sample(&A.gw(), "isthmus_tunnel_cookies_sent_total")
}

#[test]
fn a_handshake_flood_from_a_stranger_dies_in_xdp() {
    require_lab();
    assert_eq!(
        lab::Setup::current().unwrap().tunnel,
        LabTunnel::Userspace,
        "the guard protects the embedded tunnel: run with the default lab"
    );
    let _guard = GuardOn::new();
    let build = lab::metric_sum(&A.gw(), "isthmus_build_info", &[("xdp_mode", "native")]);
    assert_eq!(
        build.unwrap(),
        1.0,
        "a-gw does not say its guard runs natively"
    );
    let _stranger = Stranger::new();
    let (dropped, session, seen_by_userspace) =
        (guard("dropped"), guard("session"), userspace_rejections());

    // The flood runs on its own thread while a and b exchange traffic.
    let done = Arc::new(AtomicBool::new(false));
    let flood = {
        let done = done.clone();
        let socket = netns::run_in(WAN_NS, || UdpSocket::bind((STRANGER, 0)))
            .unwrap()
            .unwrap();
        std::thread::spawn(move || {
            // A handshake initiation is 148 bytes and starts with type 1.
            let mut initiation = [0u8; 148];
            initiation[0] = 1;
            let target = (A.wan_addr(), TUNNEL_PORT);
            let mut sent = 0u64;
            while sent < FLOOD {
                initiation[4..12].copy_from_slice(&sent.to_le_bytes());
                if socket.send_to(&initiation, target).is_ok() {
                    sent += 1;
                }
            }
            done.store(true, Ordering::Relaxed);
            sent
        })
    };
    let row = &reachability()[0];
    let mut exchanges = 0;
    while !done.load(Ordering::Relaxed) || exchanges < 5 {
        let seen = probe::exchange(Proto::Tcp, &row.from, &row.answered_by, row.target)
            .unwrap_or_else(|e| panic!("a to b during the flood: {e:#}"));
        assert_eq!(seen.client_as_seen_by_server, row.client_seen_as);
        exchanges += 1;
    }
    let sent = flood.join().unwrap();

    // Counters are read at scrape time; the flood's last datagrams may
    // still be on the veth for a moment.
    let enough = || guard("dropped") - dropped >= sent as f64 * 0.9;
    isthmus_lab::wait::until(
        Duration::from_secs(5),
        isthmus_tests::POLL,
        "90% dropped",
        enough,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: the guard dropped {} of {sent} datagrams",
            guard("dropped") - dropped
        )
    });
    let dropped = guard("dropped") - dropped;
    println!(
        "flood: {sent} sent, {dropped} dropped in XDP, {exchanges} TCP exchanges a-b meanwhile"
    );
    assert!(
        dropped <= sent as f64,
        "more drops ({dropped}) than datagrams sent"
    );
    assert_eq!(
        guard("session"),
        session,
        "flood datagrams passed as sessions"
    );
    assert_eq!(
        userspace_rejections(),
        seen_by_userspace,
        "userspace saw flood datagrams"
    );
}
