//! An `endpointIP` that is a host name, as Liqo copies a
//! LoadBalancer's. a-gw's TunnelEndpoint for b names b's gateway
//! `b-gw.wan.isthmus.test`, which a-gw's `/etc/hosts` (the lab's
//! `/etc/netns/a-gw/hosts`) resolves. When the name moves to another
//! address, the peer moves with it, and keeps its session.

use std::{fs, time::Duration};

use isthmus_lab::{
    cmd::ip,
    lab,
    probe::{self, Proto},
    topology::{A, B, PEERINGS},
};
use isthmus_tests::{eventually, require_lab};

const NAME: &str = "b-gw.wan.isthmus.test";
/// A second address of b-gw's uplink, the name's new address.
const MOVED: &str = "203.0.113.12";
/// Several lookup intervals, and margin.
const WITHIN: Duration = Duration::from_secs(15);

fn a_gw_log() -> String {
    fs::read_to_string(lab::log_file(&A.gw())).unwrap_or_default()
}

/// The name's address in a-gw's hosts file, and b-gw's extra address,
/// put back however the test ends.
struct Moved;

impl Drop for Moved {
    fn drop(&mut self) {
        let _ = fs::write(
            lab::hosts_file(&A.gw()),
            format!("127.0.0.1 localhost\n{} {NAME}\n", B.wan_addr()),
        );
        let _ = ip(
            &B.gw(),
            &["addr", "del", &format!("{MOVED}/24"), "dev", "wan0"],
        );
    }
}

fn a_reaches_b() {
    let row1 = isthmus_lab::topology::reachability().remove(0);
    let seen = probe::exchange(Proto::Tcp, &row1.from, &row1.answered_by, row1.target).unwrap();
    assert_eq!(seen.client_as_seen_by_server, row1.client_seen_as);
}

#[test]
fn a_host_name_endpoint_is_resolved_and_followed_when_it_moves() {
    require_lab();
    let a_to_b = PEERINGS
        .iter()
        .find(|p| p.local.name == "a" && p.remote.name == "b")
        .unwrap();
    assert!(
        a_to_b
            .tunnel_endpoint_yaml(None)
            .contains(&format!("endpointIP: {NAME}")),
        "the lab's a→b TunnelEndpoint should name b by host name"
    );
    eventually(WITHIN, "a-gw resolved b's name", || {
        a_gw_log().lines().any(|l| {
            l.contains("endpointIP resolved")
                && l.contains(NAME)
                && l.contains(&B.wan_addr().to_string())
        })
    });
    a_reaches_b();

    let _restore = Moved;
    let log_before = a_gw_log().len();
    ip(
        &B.gw(),
        &["addr", "add", &format!("{MOVED}/24"), "dev", "wan0"],
    )
    .unwrap();
    fs::write(
        lab::hosts_file(&A.gw()),
        format!("127.0.0.1 localhost\n{MOVED} {NAME}\n"),
    )
    .unwrap();
    eventually(WITHIN, "a-gw moved b to the name's new address", || {
        let log = a_gw_log();
        let since = &log[log_before.min(log.len())..];
        since.contains(MOVED)
            && since.contains("endpointIP resolved")
            && since
                .lines()
                .any(|l| l.contains("tunnel peer") && l.contains("tep-b") && l.contains("Moved"))
    });
    let log = a_gw_log();
    let since = &log[log_before.min(log.len())..];
    assert!(
        !since
            .lines()
            .any(|l| l.contains("tunnel peer") && l.contains("tep-b") && l.contains("Started")),
        "the move started a new session:\n{since}"
    );
    a_reaches_b();
}
