//! The allowed table: what a segregated peer may reach, from the Pods,
//! EndpointSlices and NamespaceOffloadings Liqo and Kubernetes write, as a
//! diff.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use isthmus_common::{
    ipv4::{PROTO_TCP, PROTO_UDP},
    isolation::SEGREGATED,
    nat::NO_MAPPINGS,
};
use isthmus_lab::offloading::{Listed, endpoint_slice, namespace_offloading, pod};

use super::*;
use crate::model::isolation::{ANNOTATION, SecurityMode};

type Allowed = MemoryTable<AllowKey, u8>;

/// Peer `name` with cluster ID `cluster-<name>`, segregated or not.
fn cluster(name: &str, third_octet: u8, segregated: bool) -> String {
    let mut tep = peer(
        name,
        &format!("10.{third_octet}.0.0/24"),
        &format!("10.{third_octet}.1.0/24"),
    )
    .cluster_identity(&format!("cluster-{name}"), name);
    if segregated {
        tep = tep.annotation(
            ANNOTATION,
            SecurityMode::IntraClusterTrafficSegregation.as_str(),
        );
    }
    tep.to_string()
}

fn listed(name: &'static str, cluster_id: &'static str, selected: bool) -> Listed<'static> {
    Listed {
        cluster_name: Some(name),
        cluster_id,
        selected,
    }
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, last)
}

fn ip6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, last)
}

/// A reconciler over `peers` and `allowed`, fed the objects of peers a
/// (segregated, ID 1) and c (not, ID 2); a pod offloaded from
/// each; namespace `shop` offloaded to a and not c, exporting b-pod1's
/// TCP 18080 and UDP 53; namespace `other`, offloaded to nobody.
fn lab<'a>(
    peers: &'a mut Peers,
    allowed: &'a mut Allowed,
) -> Reconciler<&'a mut Peers, Mappings, &'a mut Allowed> {
    let mut r = Reconciler::new(peers, Mappings::default(), allowed).unwrap();
    let files = [
        ("a.yaml", cluster("a", 40, true)),
        ("c.yaml", cluster("c", 41, false)),
        (
            "pod-from-a.yaml",
            pod("web", "shop", Some("cluster-a"), &[ip(133)]),
        ),
        (
            "pod-from-c.yaml",
            pod("db", "shop", Some("cluster-c"), &[ip(134)]),
        ),
        ("pod-local.yaml", pod("local", "shop", None, &[ip(135)])),
        (
            "slice-shop.yaml",
            endpoint_slice(
                "web",
                "shop",
                &[ip(5)],
                &[("http", 18080, "TCP"), ("dns", 53, "UDP")],
            ),
        ),
        (
            "offloading-shop.yaml",
            namespace_offloading(
                "shop",
                &[
                    listed("a", "cluster-a", true),
                    listed("c", "cluster-c", false),
                ],
            ),
        ),
        (
            "slice-other.yaml",
            endpoint_slice("api", "other", &[ip(7)], &[("http", 80, "TCP")]),
        ),
    ];
    for (file, yaml) in files {
        r.set_origin(file.into(), docs(file, &yaml));
    }
    r
}

fn entries(allowed: &Allowed) -> Vec<AllowKey> {
    allowed.entries.keys().copied().collect()
}

#[test]
fn a_segregated_peer_is_allowed_its_offloaded_pods_and_the_endpoints_exported_to_it() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = lab(&mut peers, &mut allowed);
    let report = r.reconcile().0;
    assert_eq!(
        (report.rejected, report.allowed),
        (0, 3),
        "{:?}",
        report.new_errors
    );
    drop(r);
    let a = 1;
    assert_eq!(
        entries(&allowed),
        [
            AllowKey::endpoint(a, Be32::from(ip(5)), PROTO_UDP, 53),
            AllowKey::endpoint(a, Be32::from(ip(5)), PROTO_TCP, 18080),
            AllowKey::any_port(a, Be32::from(ip(133))),
        ]
    );
    // Neither has a NatMapping.
    let flags = |view| peers.entries[&net(view)].flags;
    assert_eq!(flags("10.40.0.0/24"), SEGREGATED | NO_MAPPINGS);
    assert_eq!(flags("10.41.0.0/24"), NO_MAPPINGS);
}

/// A dual-stack pod's IPv6 address, and the IPv6 slice of a dual-stack
/// Service, go to the IPv6 table; the IPv4 ones to the IPv4 table.
#[test]
fn a_dual_stack_pod_and_an_ipv6_slice_open_ipv6_entries() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut allowed6 = MemoryAllowedTable6::default();
    let ipv6 = Ipv6Tables {
        peers: MemoryPeerTable6::default(),
        mappings: MemoryMappingTable6::default(),
        allowed: &mut allowed6,
    };
    let mut r =
        Reconciler::dual_stack(&mut peers, Mappings::default(), &mut allowed, ipv6).unwrap();
    let files = [
        ("a.yaml", cluster("a", 40, true)),
        (
            "pod-from-a.yaml",
            pod(
                "web",
                "shop",
                Some("cluster-a"),
                &[ip(133).into(), IpAddr::from(ip6(0x85))],
            ),
        ),
        (
            "slice-shop6.yaml",
            endpoint_slice("web", "shop", &[ip6(5)], &[("http", 18080, "TCP")]),
        ),
        (
            "offloading-shop.yaml",
            namespace_offloading("shop", &[listed("a", "cluster-a", true)]),
        ),
    ];
    for (file, yaml) in files {
        r.set_origin(file.into(), docs(file, &yaml));
    }
    let report = r.reconcile().0;
    assert_eq!(
        (report.rejected, report.allowed, report.allowed_written),
        (0, 3, 3),
        "{:?}",
        report.new_errors
    );
    drop(r);
    assert_eq!(
        entries(&allowed),
        [AllowKey::any_port(1, Be32::from(ip(133)))]
    );
    let a = 1;
    assert_eq!(
        allowed6.entries.keys().copied().collect::<Vec<_>>(),
        [
            AllowKey::endpoint(a, Be128::from(ip6(5)), PROTO_TCP, 18080),
            AllowKey::any_port(a, Be128::from(ip6(0x85))),
        ]
    );
}

#[test]
fn each_change_reaches_the_table_as_a_diff() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = lab(&mut peers, &mut allowed);
    r.reconcile();
    // The pod's label removed: it is no longer a's.
    r.set_origin(
        "pod-from-a.yaml".into(),
        docs("pod-from-a.yaml", &pod("web", "shop", None, &[ip(133)])),
    );
    let report = r.reconcile().0;
    assert_eq!((report.allowed_written, report.allowed_removed), (0, 1));
    // The namespace no longer offloaded to a.
    r.set_origin(
        "offloading-shop.yaml".into(),
        docs(
            "offloading-shop.yaml",
            &namespace_offloading("shop", &[listed("a", "cluster-a", false)]),
        ),
    );
    let report = r.reconcile().0;
    assert_eq!((report.allowed_removed, report.allowed), (2, 0));
    // c turns segregated: its own pod opens, and nothing else.
    r.set_origin("c.yaml".into(), docs("c.yaml", &cluster("c", 41, true)));
    let report = r.reconcile().0;
    assert_eq!((report.allowed_written, report.allowed), (1, 1));
    drop(r);
    assert_eq!(
        entries(&allowed),
        [AllowKey::any_port(2, Be32::from(ip(134)))]
    );
}

#[test]
fn a_peer_no_longer_segregated_or_gone_leaves_nothing_behind() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = lab(&mut peers, &mut allowed);
    r.reconcile();
    r.set_origin("a.yaml".into(), docs("a.yaml", &cluster("a", 40, false)));
    assert_eq!(r.reconcile().0.allowed, 0);
    r.set_origin("a.yaml".into(), docs("a.yaml", &cluster("a", 40, true)));
    assert_eq!(r.reconcile().0.allowed, 3);
    r.remove_origin("a.yaml");
    assert_eq!(r.reconcile().0.allowed, 0);
}

#[test]
fn the_agents_mode_segregates_every_peer_without_an_annotation() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = lab(&mut peers, &mut allowed);
    r.set_policy(Policy {
        security_mode: SecurityMode::IntraClusterTrafficSegregation,
        ..Policy::default()
    });
    // c's pod opens too; a's entries stay.
    assert_eq!(r.reconcile().0.allowed, 4);
}

/// Liqo v0.3 and v0.4 keyed a NamespaceOffloading's status by cluster
/// ID, and their TunnelEndpoints carry no cluster name.
#[test]
fn an_offloading_keyed_by_cluster_id_selects_the_peer_too() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = Reconciler::new(&mut peers, Mappings::default(), &mut allowed).unwrap();
    let old = peer("a", "10.40.0.0/24", "10.40.1.0/24")
        .cluster_id("cluster-a")
        .annotation(
            ANNOTATION,
            SecurityMode::IntraClusterTrafficSegregation.as_str(),
        );
    let by_id = Listed {
        cluster_name: None,
        cluster_id: "cluster-a",
        selected: true,
    };
    let files = [
        ("a.yaml", old.to_string()),
        ("offloading.yaml", namespace_offloading("shop", &[by_id])),
        (
            "slice.yaml",
            endpoint_slice("web", "shop", &[ip(5)], &[("http", 18080, "TCP")]),
        ),
    ];
    for (file, yaml) in files {
        r.set_origin(file.into(), docs(file, &yaml));
    }
    let report = r.reconcile().0;
    assert_eq!(
        (report.rejected, report.allowed),
        (0, 1),
        "{:?}",
        report.new_errors
    );
}

#[test]
fn a_broken_object_is_rejected_alone_naming_its_field() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = lab(&mut peers, &mut allowed);
    let broken = pod("web", "shop", Some("cluster-a"), &[ip(133)])
        .replace("- ip: 10.244.0.133", "- ip: 10.244.0.1333");
    r.set_origin("pod-from-a.yaml".into(), docs("pod-from-a.yaml", &broken));
    let report = r.reconcile().0;
    assert_eq!(report.allowed, 2);
    assert_eq!(
        messages(&report.new_errors),
        [
            "pod-from-a.yaml: Pod shop/web: field status.podIPs[0].ip: \"10.244.0.1333\" is not an IP address"
        ]
    );
}

#[test]
fn ten_thousand_endpoints_change_one_entry_at_a_time() {
    let (mut peers, mut allowed) = (Peers::default(), Allowed::default());
    let mut r = lab(&mut peers, &mut allowed);
    r.reconcile();
    let addresses: Vec<Ipv4Addr> = (0..10_000u32)
        .map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 64, 0)) + i))
        .collect();
    let slice = endpoint_slice("big", "shop", &addresses, &[("http", 8080, "TCP")]);
    r.set_origin("big.yaml".into(), docs("big.yaml", &slice));
    assert_eq!(r.reconcile().0.allowed_written, 10_000);
    r.set_origin(
        "pod-from-a.yaml".into(),
        docs(
            "pod-from-a.yaml",
            &pod("web", "shop", Some("cluster-a"), &[ip(136)]),
        ),
    );
    let report = r.reconcile().0;
    assert_eq!((report.allowed_written, report.allowed_removed), (1, 1));
    assert_eq!(report.allowed, 10_003);
}
