//! Peers read from TunnelEndpoints of every layout Liqo wrote, and the
//! errors that name what is wrong.

use std::path::Path;

use isthmus_lab::objects::{Layout as Written, TunnelEndpoint};

use std::net::Ipv4Addr;

use isthmus_common::nat::PrefixRewrite;

use super::*;
use crate::model::{
    isolation::SecurityMode,
    object::{Object, parse_documents},
};

const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// Cluster a's TunnelEndpoint for b: both clusters use the same networks,
/// so each side remapped the other's.
fn a_to_b() -> TunnelEndpoint {
    TunnelEndpoint::new("b", "liqo")
        .cluster_id("cluster-b")
        .local([
            "10.244.0.0/24",
            "10.0.40.0/24",
            "192.168.0.0/24",
            "10.0.41.0/24",
        ])
        .remote([
            "10.244.0.0/24",
            "10.0.0.0/24",
            "192.168.0.0/24",
            "10.0.1.0/24",
        ])
}

fn parse(yaml: &str) -> Result<Peer, PeerError> {
    let docs = parse_documents(Path::new("f.yaml"), yaml);
    let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
        panic!("{docs:?}")
    };
    Peer::from_raw(raw, "f.yaml")
}

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

#[test]
fn double_nat_rules_for_cluster_a() {
    let peer = parse(&a_to_b().to_string()).unwrap();
    assert_eq!(peer.cluster_id.as_deref(), Some("cluster-b"));
    assert_eq!(peer.layout, Layout::Spec);
    assert_eq!(
        peer.views(),
        [
            ("remoteNATPodCIDR", net("10.0.0.0/24")),
            ("remoteNATExternalCIDR", net("10.0.1.0/24"))
        ]
    );
    let nat = peer.nat(7, SecurityMode::default());
    assert_eq!(nat.peer_id, 7);
    assert_eq!(
        nat.egress[0],
        PrefixRewrite::ipv4([10, 244, 0, 0], [10, 0, 40, 0], 24)
    );
    assert_eq!(
        nat.egress[1],
        PrefixRewrite::ipv4([192, 168, 0, 0], [10, 0, 41, 0], 24)
    );
    assert_eq!(
        nat.ingress[0],
        PrefixRewrite::ipv4([10, 0, 40, 0], [10, 244, 0, 0], 24)
    );
    assert_eq!(
        nat.ingress[1],
        PrefixRewrite::ipv4([10, 0, 41, 0], [192, 168, 0, 0], 24)
    );
}

#[test]
fn an_address_of_a_remapped_network_has_a_real_one_with_the_same_host_bits() {
    let peer = parse(&a_to_b().to_string()).unwrap();
    let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
    assert_eq!(
        peer.ipv4.local_external.real_of(ip("10.0.41.45")),
        Some(ip("192.168.0.45"))
    );
    assert_eq!(peer.ipv4.local_external.real_of(ip("192.168.0.45")), None);
}

#[test]
fn none_means_not_remapped() {
    let c =
        TunnelEndpoint::new("c", "liqo").remote(["10.1.0.0/24", "None", "192.168.2.0/24", "None"]);
    let peer = parse(&c.to_string()).unwrap();
    assert_eq!(peer.views()[0], ("remotePodCIDR", net("10.1.0.0/24")));
    let nat = peer.nat(1, SecurityMode::default());
    let identity = [
        PrefixRewrite::ipv4([10, 244, 0, 0], [10, 244, 0, 0], 24),
        PrefixRewrite::ipv4([192, 168, 0, 0], [192, 168, 0, 0], 24),
    ];
    assert_eq!(nat.egress, identity);
    assert_eq!(nat.ingress, identity);
}

/// Liqo v0.2.1–v0.3.0: the peer's real networks in spec, under
/// other names; everything else in status.
fn a_to_b_v030() -> String {
    a_to_b()
        .endpoint("203.0.113.2")
        .port(5871)
        .public_key(KEY)
        .layout(Written::Legacy)
        .to_string()
}

#[test]
fn the_v0_3_0_layout_reads_as_the_same_peer_and_is_reported() {
    let old = parse(&a_to_b_v030()).unwrap();
    let new = parse(
        &a_to_b()
            .endpoint("203.0.113.2")
            .port(5871)
            .public_key(KEY)
            .to_string(),
    )
    .unwrap();
    assert_eq!(old.layout, Layout::Legacy);
    assert_eq!(new.layout, Layout::Spec);
    assert_eq!(
        old.nat(1, SecurityMode::default()),
        new.nat(1, SecurityMode::default())
    );
    assert_eq!(old.views(), new.views());
    assert_eq!(old.tunnel, new.tunnel);
    let broken = a_to_b_v030().replace(
        "localNATPodCIDR: 10.0.40.0/24",
        "localNATPodCIDR: 10.0.40.0/23",
    );
    assert_eq!(
        parse(&broken).unwrap_err().to_string(),
        "f.yaml: TunnelEndpoint liqo/b: field status.localNATPodCIDR: mask /23 differs from status.localPodCIDR /24"
    );
    let no_pod = a_to_b_v030().replace("  localPodCIDR: 10.244.0.0/24\n", "");
    assert_eq!(
        parse(&no_pod).unwrap_err().to_string(),
        "f.yaml: TunnelEndpoint liqo/b: field status.localPodCIDR is missing"
    );
}

#[test]
fn networks_only_in_status_are_not_a_layout_liqo_wrote() {
    let yaml = a_to_b().to_string().replace("spec:\n", "status:\n");
    assert_eq!(
        parse(&yaml).unwrap_err().to_string(),
        "f.yaml: TunnelEndpoint liqo/b: field localPodCIDR is missing"
    );
}

#[test]
fn bad_cidr_names_file_object_and_field() {
    let yaml = a_to_b().to_string().replace(
        "remoteNATPodCIDR: 10.0.0.0/24",
        "remoteNATPodCIDR: 10.0.0.0/33",
    );
    let err = parse(&yaml).unwrap_err().to_string();
    assert_eq!(
        err,
        "f.yaml: TunnelEndpoint liqo/b: field remoteNATPodCIDR: \"10.0.0.0/33\" is not an IPv4 CIDR or \"None\""
    );
}

#[test]
fn mask_mismatch_names_both_fields() {
    let yaml = a_to_b().to_string().replace(
        "localNATPodCIDR: 10.0.40.0/24",
        "localNATPodCIDR: 10.0.40.0/23",
    );
    let err = parse(&yaml).unwrap_err().to_string();
    assert_eq!(
        err,
        "f.yaml: TunnelEndpoint liqo/b: field localNATPodCIDR: mask /23 differs from localPodCIDR /24"
    );
}

#[test]
fn tunnel_params_are_read_and_checked() {
    let at = |endpoint: &str| a_to_b().endpoint(endpoint);
    let peer = parse(&at("203.0.113.2").port(5871).public_key(KEY).to_string()).unwrap();
    let tunnel = peer.tunnel.unwrap();
    assert_eq!(tunnel.socket(), Some("203.0.113.2:5871".parse().unwrap()));
    assert_eq!(tunnel.public_key[31], 31);
    // No key: the peer is valid for NAT, with no tunnel.
    assert_eq!(
        parse(&at("203.0.113.2").port(5871).to_string())
            .unwrap()
            .tunnel,
        Err("backend_config.publicKey")
    );
    let beyond_u16 = at("203.0.113.2")
        .port(5871)
        .to_string()
        .replace("\"5871\"", "\"70000\"");
    assert_eq!(
        parse(&beyond_u16).unwrap_err().to_string(),
        "f.yaml: TunnelEndpoint liqo/b: field backend_config.port: \"70000\" is not a UDP port"
    );
    let err = parse(&at("203.0.113.2").public_key("short").to_string())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "f.yaml: TunnelEndpoint liqo/b: field backend_config.publicKey: \"short\" is not a base64 32-byte WireGuard key"
    );
    for bad in [
        "203.0.113.300",
        "gw_1.example",
        "-gw.example",
        "10.0.0.1/24",
        "\"\"",
    ] {
        let err = parse(&at(bad).to_string()).unwrap_err().to_string();
        assert!(
            err.contains("field endpointIP:")
                && err.ends_with("is not an IPv4 address or a DNS name"),
            "{bad}: {err}"
        );
    }
    // A LoadBalancer's host name, as Liqo copies it.
    let elb = "a1b2c3-1234567890.eu-west-1.ELB.amazonaws.com";
    let peer = parse(&at(elb).port(32100).public_key(KEY).to_string()).unwrap();
    let tunnel = peer.tunnel.unwrap();
    assert_eq!(tunnel.endpoint, Endpoint::Name(elb.to_ascii_lowercase()));
    assert_eq!((tunnel.port, tunnel.socket()), (32100, None));
}

#[test]
fn missing_network_is_named() {
    let yaml = a_to_b()
        .to_string()
        .replace("  remotePodCIDR: 10.244.0.0/24\n", "");
    let err = parse(&yaml).unwrap_err().to_string();
    assert_eq!(
        err,
        "f.yaml: TunnelEndpoint liqo/b: field remotePodCIDR is missing"
    );
}

#[test]
fn the_security_mode_annotation_overrides_the_agents_for_its_peer() {
    use SecurityMode::{FullPodToPod, IntraClusterTrafficSegregation as Segregation};
    use isthmus_common::isolation::SEGREGATED;
    let plain = parse(&a_to_b().to_string()).unwrap();
    assert_eq!(plain.security_mode, None);
    assert_eq!(plain.nat(1, FullPodToPod).flags, 0);
    assert_eq!(plain.nat(1, Segregation).flags, SEGREGATED);
    let annotated = |value: &str| {
        parse(
            &a_to_b()
                .annotation("isthmus.io/security-mode", value)
                .to_string(),
        )
    };
    let segregated = annotated("IntraClusterTrafficSegregation").unwrap();
    assert_eq!(segregated.security_mode, Some(Segregation));
    assert_eq!(segregated.nat(1, FullPodToPod).flags, SEGREGATED);
    let open = annotated("FullPodToPod").unwrap();
    assert_eq!(open.nat(1, Segregation).flags, 0);
    // Both modes give the same rewrites: only the flag differs.
    assert_eq!(
        PeerNat {
            flags: 0,
            ..segregated.nat(1, FullPodToPod)
        },
        plain.nat(1, FullPodToPod)
    );
    for bad in ["Segregated", "{mode: x}", "\"\""] {
        let e = annotated(bad).unwrap_err();
        assert!(
            e.to_string()
                .contains("field metadata.annotations[isthmus.io/security-mode]")
                && e.to_string()
                    .contains("FullPodToPod or IntraClusterTrafficSegregation"),
            "{bad}: {e}"
        );
    }
}

/// DESIGN's dual-stack lab: a's view of b, IPv6 beside IPv4.
fn a_to_b_dual_stack() -> TunnelEndpoint {
    let [local, remote] = isthmus_lab::topology::PEERINGS[0].ipv6_views();
    a_to_b().ipv6(local, remote)
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}

#[test]
fn the_ipv6_networks_of_spec_ipv6_sit_beside_the_ipv4_ones() {
    let single = parse(&a_to_b().to_string()).unwrap();
    assert_eq!(single.ipv6, None);
    let peer = parse(&a_to_b_dual_stack().to_string()).unwrap();
    assert_eq!(peer.ipv4, single.ipv4);
    let ipv6 = peer.ipv6.expect("IPv6 networks");
    assert_eq!(
        ipv6.views(peer.layout),
        [
            ("ipv6.remoteNATPodCIDR", net6("fd00:10::/64")),
            ("ipv6.remoteNATExternalCIDR", net6("fd00:10:0:1::/64"))
        ]
    );
    assert_eq!(
        ipv6.local_views(peer.layout),
        [
            ("ipv6.localNATPodCIDR", net6("fd00:10:0:40::/64")),
            ("ipv6.localNATExternalCIDR", net6("fd00:10:0:41::/64"))
        ]
    );
    assert_eq!(ipv6.all(peer.layout).len(), 8);
    // The v0.2.1-v0.3.0 layout keeps `spec.ipv6` where it is.
    let legacy = parse(&a_to_b_dual_stack().layout(Written::Legacy).to_string()).unwrap();
    assert_eq!(legacy.ipv6, Some(ipv6));
}

#[test]
fn a_broken_ipv6_network_names_its_field_in_spec_ipv6() {
    let yaml = a_to_b_dual_stack().to_string();
    let cases = [
        (
            "    remoteNATPodCIDR: fd00:10::/64",
            "    remoteNATPodCIDR: 10.0.0.0/24",
            "f.yaml: TunnelEndpoint liqo/b: field ipv6.remoteNATPodCIDR: \"10.0.0.0/24\" is not an IPv6 CIDR or \"None\"",
        ),
        (
            "    localPodCIDR: fd00:10:244::/64",
            "    localPodCIDR: fd00:10:244::/129",
            "f.yaml: TunnelEndpoint liqo/b: field ipv6.localPodCIDR: \"fd00:10:244::/129\" is not an IPv6 CIDR",
        ),
        (
            "    localNATExternalCIDR: fd00:10:0:41::/64",
            "    localNATExternalCIDR: fd00:10:0:41::/80",
            "f.yaml: TunnelEndpoint liqo/b: field ipv6.localNATExternalCIDR: mask /80 differs from ipv6.localExternalCIDR /64",
        ),
        (
            "    remoteExternalCIDR: fd00:192:168::/64\n",
            "",
            "f.yaml: TunnelEndpoint liqo/b: field ipv6.remoteExternalCIDR is missing",
        ),
    ];
    for (from, to, expected) in cases {
        assert!(yaml.contains(from), "{from}");
        let err = parse(&yaml.replace(from, to)).unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    let not_a_map = a_to_b().to_string() + "  ipv6: fd00:10:244::/64\n";
    assert_eq!(
        parse(&not_a_map).unwrap_err().to_string(),
        "f.yaml: TunnelEndpoint liqo/b: field ipv6: \"fd00:10:244::/64\" is not a map of the IPv6 networks"
    );
}
