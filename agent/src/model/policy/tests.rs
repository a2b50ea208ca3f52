//! The policy's checks, one rule at a time.

use std::path::Path;

use isthmus_lab::objects::TunnelEndpoint;

use super::*;
use crate::model::object::{Object, parse_documents};

/// A peer in `namespace` whose remote networks are `remote` (pod and
/// external, each real then as we see it).
fn peer(namespace: &str, remote: [&str; 4]) -> Peer {
    read(TunnelEndpoint::new("tep", namespace).remote(remote))
}

/// `tep`, with a tunnel, as the agent reads it.
fn read(tep: TunnelEndpoint) -> Peer {
    let yaml = tep
        .endpoint("203.0.113.2")
        .public_key("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
        .to_string();
    let docs = parse_documents(Path::new("t.yaml"), &yaml);
    let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
        panic!("{docs:?}")
    };
    Peer::from_raw(raw, "t.yaml").unwrap()
}

const ORDINARY: [&str; 4] = ["10.1.0.0/24", "None", "192.168.2.0/24", "None"];

fn lan() -> Policy {
    Policy {
        protected: vec![Protected {
            net: "172.16.1.0/24".parse().unwrap(),
            what: "the network of lan0 (172.16.1.1/24)".into(),
        }],
        ..Policy::default()
    }
}

fn problem(policy: &Policy, peer: &Peer) -> String {
    policy.check(peer, &[]).unwrap_err().to_string()
}

#[test]
fn an_ordinary_peer_passes() {
    let p = peer("liqo-tenant-b", ORDINARY);
    assert_eq!(lan().check(&p, &[]), Ok(()));
}

#[test]
fn views_over_everything_are_refused_naming_the_field() {
    let p = peer(
        "liqo-tenant-b",
        ["0.0.0.0/1", "None", "128.0.0.0/1", "None"],
    );
    assert_eq!(
        problem(&lan(), &p),
        "field remotePodCIDR: 0.0.0.0/1 is wider than /8 (--min-view-prefix)"
    );
    let p = peer(
        "liqo-tenant-b",
        ["10.1.0.0/24", "0.0.0.0/24", "192.168.2.0/24", "None"],
    );
    assert_eq!(
        problem(&lan(), &p),
        "field remoteNATPodCIDR: 0.0.0.0/24 touches \"this network\" 0.0.0.0/8; no peer may use it"
    );
}

#[test]
fn views_over_the_nodes_networks_or_the_clusters_are_refused() {
    let over_lan = ["10.1.0.0/24", "172.16.1.0/24", "192.168.2.0/24", "None"];
    assert_eq!(
        problem(&lan(), &peer("liqo-tenant-b", over_lan)),
        "field remoteNATPodCIDR: 172.16.1.0/24 touches the network of lan0 (172.16.1.1/24); no peer may use it"
    );
    let over_services = ["10.96.0.0/24", "None", "192.168.2.0/24", "None"];
    let mut policy = lan();
    policy
        .protected
        .extend(cluster_networks(&[], &["10.96.0.0/12".parse().unwrap()]));
    let p = peer("liqo-tenant-b", over_services);
    assert_eq!(
        policy.check(&p, &[]).unwrap_err().to_string(),
        "field remotePodCIDR: 10.96.0.0/24 touches this cluster's 10.96.0.0/12 (--service-cidr); no peer may use it"
    );
    let link_local = ["10.1.0.0/24", "None", "169.254.0.0/24", "None"];
    let p = peer("liqo-tenant-b", link_local);
    assert!(problem(&lan(), &p).contains("link-local 169.254.0.0/16"));
}

#[test]
fn a_real_network_may_overlap_ours_but_not_be_reserved() {
    // Double NAT: the peer's real PodCIDR is ours too, seen remapped.
    let remapped = ["172.16.1.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"];
    assert_eq!(lan().check(&peer("liqo-tenant-b", remapped), &[]), Ok(()));
    let loopback = ["127.0.0.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"];
    assert!(
        problem(&lan(), &peer("liqo-tenant-b", loopback))
            .starts_with("field remotePodCIDR: 127.0.0.0/24 touches loopback")
    );
}

#[test]
fn only_allowed_namespaces_pass() {
    let p = peer("default", ORDINARY);
    assert_eq!(
        problem(&lan(), &p),
        "field metadata.namespace: \"default\" is not one where TunnelEndpoints are accepted (liqo-tenant-*; see --tunnelendpoint-namespaces)"
    );
    let more = Policy {
        namespaces: vec![LIQO_TENANT_NAMESPACES.into(), "default".into()],
        ..lan()
    };
    assert_eq!(more.check(&p, &[]), Ok(()));
}

#[test]
fn host_addresses_include_loopback() {
    let addresses = host_addresses().unwrap();
    let lo = addresses
        .iter()
        .find(|a| a.net == "127.0.0.1/8".parse().unwrap())
        .unwrap_or_else(|| panic!("{addresses:?}"));
    assert_eq!(lo.network().net, "127.0.0.0/8".parse().unwrap());
    assert!(lo.network().what.contains("lo"), "{lo:?}");
    assert_eq!(lo.address().unwrap().addr, Ipv4Addr::LOCALHOST);
    let lo6 = addresses
        .iter()
        .find(|a| a.net == "::1/128".parse().unwrap());
    assert!(lo6.is_some(), "IPv6 addresses are read too: {addresses:?}");
}

#[test]
fn our_networks_may_hold_no_node() {
    let node = Node {
        name: "b-node".into(),
        pod_cidrs: Vec::new(),
        pod_cidrs6: Vec::new(),
        address: Ipv4Addr::new(172, 16, 2, 2),
        address6: None,
        external_address: None,
        labels: std::collections::BTreeMap::default(),
    };
    let p = read(
        TunnelEndpoint::new("tep", "liqo-tenant-b")
            .local([
                "10.244.0.0/24",
                "10.0.40.0/24",
                "172.16.2.0/24",
                "10.0.41.0/24",
            ])
            .remote(ORDINARY),
    );
    assert_eq!(
        Policy::default()
            .check(&p, &[node])
            .unwrap_err()
            .to_string(),
        "field localExternalCIDR: 172.16.2.0/24 touches the address of node b-node 172.16.2.2; no peer may use it"
    );
    let api_server = Policy {
        api_server: Some(NodeAddress {
            addr: Ipv4Addr::new(172, 16, 2, 9),
            what: "the API server's address".into(),
        }),
        ..Policy::default()
    };
    // This node's own addresses may lie in our networks (a CNI's
    // bridge, the masquerade address).
    let own = Policy {
        host_addresses: vec![NodeAddress {
            addr: Ipv4Addr::new(172, 16, 2, 1),
            what: "an address of this node (lan0)".into(),
        }],
        ..Policy::default()
    };
    assert_eq!(own.check(&p, &[]), Ok(()));
    assert!(
        api_server
            .check(&p, &[])
            .unwrap_err()
            .to_string()
            .contains("the API server's address 172.16.2.9")
    );
    assert_eq!(Policy::default().check(&p, &[]), Ok(()));
}

/// A peer with ORDINARY IPv4 networks and the IPv6 ones given, ours
/// then theirs.
fn dual_stack(local6: [&str; 4], remote6: [&str; 4]) -> Peer {
    let tep = TunnelEndpoint::new("tep", "liqo-tenant-b").remote(ORDINARY);
    read(tep.ipv6(local6, remote6))
}

const OURS6: [&str; 4] = ["fd00:10:244::/64", "None", "fd00:192:168::/64", "None"];

#[test]
fn ipv6_views_are_bounded_as_ipv4_ones() {
    let ordinary = dual_stack(OURS6, ["fd00:10::/64", "None", "fd00:10:0:1::/64", "None"]);
    assert_eq!(lan().check(&ordinary, &[]), Ok(()));
    let everything = dual_stack(OURS6, ["::/0", "None", "fd00:10:0:1::/64", "None"]);
    assert_eq!(
        problem(&lan(), &everything),
        "field ipv6.remotePodCIDR: ::/0 is wider than /32 (--min-view-prefix-ipv6)"
    );
    let wider = Policy {
        min_prefix6: 0,
        ..lan()
    };
    assert!(problem(&wider, &everything).contains("touches the unspecified address"));
    for (net, what) in [
        ("fe80::/64", "link-local fe80::/10"),
        ("ff02::/64", "multicast ff00::/8"),
        ("::ffff:10.0.0.0/120", "IPv4-mapped ::ffff:0:0/96"),
    ] {
        let p = dual_stack(OURS6, ["fd00:10::/64", "None", net, "None"]);
        let expected = format!("field ipv6.remoteExternalCIDR: {net} touches {what}");
        assert!(problem(&lan(), &p).starts_with(&expected), "{net}");
    }
}

#[test]
fn ipv6_views_over_our_networks_and_our_nodes_are_refused() {
    let node = Node {
        name: "b-node".into(),
        pod_cidrs: Vec::new(),
        pod_cidrs6: vec!["fd00:10:244:1::/64".parse().unwrap()],
        address: Ipv4Addr::new(172, 16, 2, 2),
        address6: Some("fd00:172:16:2::2".parse().unwrap()),
        external_address: None,
        labels: std::collections::BTreeMap::default(),
    };
    let host = HostAddress {
        device: "lan0".into(),
        net: "fd00:172:16:2::1/64".parse().unwrap(),
    };
    assert_eq!(host.address(), None, "no IPv6 NatMapping can expose it");
    let policy = Policy {
        protected: vec![host.network()],
        ..Policy::default()
    };
    let over_lan = dual_stack(OURS6, ["fd00:172:16:2::/64", "None", "fd00:1::/64", "None"]);
    assert_eq!(
        policy.check(&over_lan, &[]).unwrap_err().to_string(),
        "field ipv6.remotePodCIDR: fd00:172:16:2::/64 touches the network of lan0 (fd00:172:16:2::1/64); no peer may use it"
    );
    let over_pods = dual_stack(OURS6, ["fd00:10:244::/48", "None", "fd00:1::/64", "None"]);
    assert!(
        policy
            .check(&over_pods, std::slice::from_ref(&node))
            .unwrap_err()
            .to_string()
            .contains("touches the PodCIDR fd00:10:244:1::/64 of node b-node")
    );
    let holding_node = [
        "fd00:10:244::/64",
        "None",
        "fd00:172:16:2::/64",
        "fd00:41::/64",
    ];
    let p = dual_stack(
        holding_node,
        ["fd00:10::/64", "None", "fd00:1::/64", "None"],
    );
    assert_eq!(
        Policy::default()
            .check(&p, &[node])
            .unwrap_err()
            .to_string(),
        "field ipv6.localExternalCIDR: fd00:172:16:2::/64 touches the address of node b-node fd00:172:16:2::2; no peer may use it"
    );
}
