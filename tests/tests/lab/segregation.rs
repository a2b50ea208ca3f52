//! Cross-cluster isolation, as far as it goes today (issue 17): b holds a
//! segregated, by the annotation on b's TunnelEndpoint for a. Nothing is
//! offloaded from a or exported to it yet, so a opens nothing in b's
//! networks and b-gw counts each try; b's own connections to a are
//! answered, the hub path through b's NatMapping still carries a to c, and
//! without the annotation a is back.

use std::time::Duration;

use isthmus_tests::{eventually, require_lab};
use xtask::{
    lab,
    probe::{self, Proto},
    topology::{A, B, PEERINGS, Reach, reachability},
};

const GIVE_UP: Duration = Duration::from_secs(30);
const SEGREGATED: &str =
    "  annotations:\n    isthmus.io/security-mode: IntraClusterTrafficSegregation\n";

/// Writes b's TunnelEndpoint for a, with or without the annotation, on
/// every node of b.
fn segregate_a(on: bool) {
    let peering = PEERINGS
        .iter()
        .find(|p| p.local.name == B.name && p.remote.name == A.name)
        .expect("b peers with a");
    let key = lab::public_key(&A.gw()).unwrap();
    let mut yaml = peering.tunnel_endpoint_yaml(Some(&key));
    if on {
        yaml = yaml.replacen("metadata:\n", &format!("metadata:\n{SEGREGATED}"), 1);
    }
    for (node, _) in B.nodes() {
        lab::write_object(&node, &format!("peer-{}.yaml", A.name), &yaml).unwrap();
    }
}

/// Lifts the annotation even when an assertion fails, for the tests after.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        segregate_a(false);
    }
}

fn answered(row: &Reach, proto: Proto) -> bool {
    probe::exchange(proto, &row.from, &row.answered_by, row.target)
        .is_ok_and(|seen| seen.client_as_seen_by_server == row.client_seen_as)
}

fn not_allowed() -> f64 {
    lab::metric_sum(
        &B.gw(),
        "isthmus_peer_denied_packets_total",
        &[("cluster_id", "cluster-a"), ("reason", "not_allowed")],
    )
    .unwrap_or(0.0)
}

#[test]
fn a_segregated_peer_opens_nothing_it_was_not_given_and_the_rest_goes_on() {
    require_lab();
    let rows = reachability();
    let (a_to_b, b_to_a, hub) = (&rows[0], &rows[2], &rows[4]);
    assert_eq!((a_to_b.row, b_to_a.row, hub.row), (1, 3, 5));
    let _restore = Restore;
    segregate_a(true);
    eventually(GIVE_UP, "b-gw refusing a's new connections", || {
        !answered(a_to_b, Proto::Udp)
    });
    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        let before = not_allowed();
        assert!(!answered(a_to_b, proto), "{proto:?}: a reached b-pod1");
        assert!(
            not_allowed() > before,
            "{proto:?}: b-gw counted no denial for a"
        );
        assert!(answered(b_to_a, proto), "{proto:?}: b-pod1 opens to a-pod1");
        assert!(
            answered(hub, proto),
            "{proto:?}: a-pod1 to c-pod1 through b"
        );
    }
    segregate_a(false);
    eventually(GIVE_UP, "a reaching b again", || {
        answered(a_to_b, Proto::Tcp)
    });
}
