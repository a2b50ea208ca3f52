//! Liqo v1 peers, from the objects in the shapes Liqo v1.2 writes them
//! (`tests/fixtures/liqo-v1/`): joined by cluster ID, with the NAT
//! running the other way.

use isthmus_common::nat::{PrefixRewrite, REMAPS_PEER};

use super::*;
use crate::model::peer::{Endpoint, GatewayRole, LiqoApi, Remaps};

const FIXTURES: [(&str, &str); 4] = [
    (
        "configuration-rome.yaml",
        include_str!("../../../../../tests/fixtures/liqo-v1/configuration-rome.yaml"),
    ),
    (
        "publickey-rome.yaml",
        include_str!("../../../../../tests/fixtures/liqo-v1/publickey-rome.yaml"),
    ),
    (
        "isthmusgatewayclient-rome.yaml",
        include_str!("../../../../../tests/fixtures/liqo-v1/isthmusgatewayclient-rome.yaml"),
    ),
    (
        "ip-legacy-db.yaml",
        include_str!("../../../../../tests/fixtures/liqo-v1/ip-legacy-db.yaml"),
    ),
];

/// The objects of `FIXTURES` but `leave_out`, for an agent that serves
/// Liqo v1 (`--liqo-api v1`).
fn with_fixtures<P, M, A, P6, M6, A6>(r: &mut Reconciler<P, M, A, P6, M6, A6>, leave_out: &str)
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    r.set_policy(Policy {
        liqo_api: LiqoApi::V1,
        ..Policy::default()
    });
    for (file, yaml) in FIXTURES.iter().filter(|(file, _)| *file != leave_out) {
        r.set_origin((*file).into(), docs(file, yaml));
    }
}

fn rule(from: &str, to: &str) -> PrefixRewrite {
    let (from, to) = (net(from), net(to));
    PrefixRewrite::ipv4(
        from.network().octets(),
        to.network().octets(),
        from.prefix_len(),
    )
}

#[test]
fn a_v1_peer_remaps_the_peers_addresses_and_keeps_ours() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "");
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.rejected), (1, 0), "{report:?}");
    let peer = &r.peers()[0];
    assert_eq!(peer.remaps(), Remaps::Theirs);
    assert_eq!(peer.cluster_id.as_deref(), Some("rome"));
    let tunnel = peer.tunnel.as_ref().unwrap();
    assert_eq!(tunnel.port, 51840);
    assert_eq!(
        peer.tunnel_networks(),
        [
            ("spec.remote.cidr.pod", net("10.200.0.0/16")),
            ("spec.remote.cidr.external", net("10.201.0.0/16"))
        ]
    );
    let entries = r.mapping_entries();
    drop(r);
    // The kernel finds the peer by our view of it, as any other.
    let views: Vec<Ipv4Net> = table.entries.keys().copied().collect();
    assert_eq!(views, [net("10.70.0.0/16"), net("10.71.0.0/16")]);
    let nat = table.entries[&net("10.70.0.0/16")];
    assert_eq!(nat.flags, REMAPS_PEER);
    // Our networks stay as they are: identity rules, which only tell them
    // from others' (for masquerading and the ingress checks).
    assert_eq!(
        nat.egress,
        [
            rule("10.200.0.0/16", "10.200.0.0/16"),
            rule("10.201.0.0/16", "10.201.0.0/16")
        ]
    );
    assert_eq!(nat.ingress, nat.egress);
    // The peer's: from our view back to the real networks.
    assert_eq!(
        nat.theirs,
        [
            rule("10.70.0.0/16", "10.200.0.0/16"),
            rule("10.71.0.0/16", "10.201.0.0/16")
        ]
    );
    // The IP leads the peer from status.ip to spec.ip.
    let key = MappingKey {
        peer_id: nat.peer_id,
        addr: Be32::from_bytes([10, 201, 0, 4]),
    };
    assert_eq!(entries, [(key, Be32::from_bytes([172, 16, 4, 20]))]);
}

#[test]
fn a_v1_peer_without_its_key_or_gateway_object_has_no_tunnel_and_names_what_it_lacks() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "publickey-rome.yaml");
    r.reconcile();
    assert_eq!(r.peers()[0].tunnel, Err("PublicKey spec.publicKey"));
    with_fixtures(&mut r, "isthmusgatewayclient-rome.yaml");
    r.set_origin("isthmusgatewayclient-rome.yaml".into(), Vec::new());
    r.reconcile();
    assert_eq!(
        r.peers()[0].tunnel,
        Err("IsthmusGatewayServer or IsthmusGatewayClient spec.endpoint")
    );
}

#[test]
fn as_the_peers_gateway_server_we_learn_its_endpoint_and_listen_on_the_servers_port() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "isthmusgatewayclient-rome.yaml");
    let server =
        include_str!("../../../../../tests/fixtures/liqo-v1/isthmusgatewayserver-rome.yaml");
    r.set_origin(
        "isthmusgatewayserver-rome.yaml".into(),
        docs("isthmusgatewayserver-rome.yaml", server),
    );
    r.reconcile();
    let peer = &r.peers()[0];
    let tunnel = peer.tunnel.as_ref().expect("a tunnel");
    assert_eq!((&tunnel.endpoint, tunnel.port), (&Endpoint::Learned, 51840));
    assert_eq!(tunnel.socket(), None);
    let gateway = peer.liqo_gateway.as_ref().expect("its gateway object");
    assert_eq!(gateway.role, GatewayRole::Server);
}

#[test]
fn an_ip_outside_our_external_cidr_is_refused_alone_naming_its_field() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "ip-legacy-db.yaml");
    let outside = ip_object("legacy-db", "10.99.0.4", "172.16.4.20");
    r.set_origin("outside.yaml".into(), docs("outside.yaml", &outside));
    let report = r.reconcile().0;
    let errors = messages(&report.new_errors);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("IP default/legacy-db")
            && errors[0]
                .contains("field status.ip: 10.99.0.4 is outside our ExternalCIDR 10.201.0.0/16"),
        "{errors:?}"
    );
    assert!(r.mapping_entries().is_empty());
    assert_eq!(report.peers, 1, "the peer keeps working");
}

/// An IP named `name`, leading `status_ip` to `target`.
fn ip_object(name: &str, status_ip: &str, target: &str) -> String {
    FIXTURES[3]
        .1
        .replace("name: legacy-db", &format!("name: {name}"))
        .replace("ip: 10.201.0.4", &format!("ip: {status_ip}"))
        .replace("ip: 172.16.4.20", &format!("ip: {target}"))
}

#[test]
fn a_second_ip_for_an_address_is_refused_naming_the_ip_that_keeps_it() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "");
    r.reconcile();
    let other = ip_object("a-rival", "10.201.0.4", "172.16.4.99");
    r.set_origin("rival.yaml".into(), docs("rival.yaml", &other));
    let report = r.reconcile().0;
    let errors = messages(&report.new_errors);
    // legacy-db was programmed first, and keeps the address although
    // a-rival comes first by name (which decides within one pass).
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("IP default/a-rival")
            && errors[0].contains("field status.ip: 10.201.0.4 is also IP default/legacy-db's"),
        "{errors:?}"
    );
    let targets: Vec<Be32> = r.mapping_entries().into_iter().map(|(_, t)| t).collect();
    assert_eq!(targets, [Be32::from_bytes([172, 16, 4, 20])]);
}

#[test]
fn ips_beyond_the_tables_room_are_refused_one_by_one_and_programmed_ones_stay() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_mapping_capacity(3);
    with_fixtures(&mut r, "");
    r.reconcile();
    // legacy-db is in the kernel; four more IPs, sorted before it by name
    // and address, ask for three slots in all.
    for (i, host) in [1, 2, 3, 5].into_iter().enumerate() {
        let name = format!("a-{i}");
        let yaml = ip_object(&name, &format!("10.201.0.{host}"), "172.16.4.21");
        r.set_origin(format!("{name}.yaml"), docs("x.yaml", &yaml));
    }
    let report = r.reconcile().0;
    let errors = messages(&report.new_errors);
    assert_eq!(errors.len(), 2, "{errors:?}");
    for (error, name) in errors.iter().zip(["a-2", "a-3"]) {
        assert!(
            error.contains(&format!("IP default/{name}"))
                && error.contains("the NatMapping table has no room left"),
            "{errors:?}"
        );
    }
    let exposed: Vec<[u8; 4]> = r
        .mapping_entries()
        .into_iter()
        .map(|(k, _)| k.addr.bytes())
        .collect();
    assert_eq!(exposed, [[10, 201, 0, 1], [10, 201, 0, 2], [10, 201, 0, 4]]);
    assert_eq!(report.peers, 1, "the peer keeps working");
}

#[test]
fn a_second_v1_peer_on_one_nat_device_is_refused_naming_the_first_and_welcome_with_a_device_each() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "");
    let milan = FIXTURES[0]
        .1
        .replace("rome", "milan")
        .replace("10.70.0.0/16", "10.72.0.0/16")
        .replace("10.71.0.0/16", "10.73.0.0/16");
    r.set_origin("milan.yaml".into(), docs("milan.yaml", &milan));
    let report = r.reconcile().0;
    assert_eq!(report.peers, 1);
    let errors = messages(&report.new_errors);
    assert_eq!(
        errors,
        [
            "milan.yaml: Configuration liqo-tenant-milan/milan: this gateway already serves Liqo v1 peer liqo-tenant-rome/rome (Configuration in configuration-rome.yaml) on its NAT device (--nat-dev), which carries one Liqo v1 peer; the embedded tunnel (--tunnel userspace) gives each a device of its own"
        ]
    );
    // Their real networks are the same; the views we gave them differ.
    r.set_device_per_liqo_v1_peer(true);
    let report = r.reconcile().0;
    assert_eq!(report.peers, 2);
    assert!(r.rejections().is_empty(), "{:?}", r.rejections());
}

#[test]
fn each_api_refuses_the_other_apis_peers_naming_the_flag() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    with_fixtures(&mut r, "");
    r.set_origin(
        "b.yaml".into(),
        docs("b.yaml", &tep("b", "10.0.0.0/24", "10.0.1.0/24")),
    );
    let report = r.reconcile().0;
    let errors = messages(&report.new_errors);
    assert_eq!(
        errors,
        [
            "b.yaml: TunnelEndpoint liqo-tenant-x/b: a Liqo v0.10 peer, and this agent serves Liqo v1's network API (--liqo-api v1)"
        ]
    );
    r.set_policy(Policy::default());
    let report = r.reconcile().0;
    let errors = messages(&report.new_errors);
    assert_eq!(
        errors,
        [
            "configuration-rome.yaml: Configuration liqo-tenant-rome/rome: a Liqo v1 peer, and this agent serves Liqo v0.10's network API (--liqo-api v0.10)"
        ]
    );
    assert_eq!(r.peers()[0].key.name, "b");
}

#[test]
fn a_dual_stack_v1_peer_is_remapped_in_both_families_and_an_ipv6_ip_leads_to_its_target() {
    use super::dual_stack::{Mappings6, Peers6, reconciler6};
    use crate::model::liqo_v1::fixtures::dual_stack;
    let (mut peers, mut peers6) = (Peers::default(), Peers6::default());
    let mut mappings6 = Mappings6::default();
    let mut r = reconciler6(&mut peers, &mut peers6, &mut mappings6);
    with_fixtures(&mut r, FIXTURES[0].0);
    r.set_origin("dual.yaml".into(), docs("dual.yaml", &dual_stack()));
    let ipv6 = |name, status_ip, target| {
        ip_object(name, status_ip, target).replace("cidr: 10.201.0.0/16", "cidr: fd00:192:168::/64")
    };
    for (file, ip) in [
        (
            "db6.yaml",
            ipv6("db6", "fd00:192:168::4", "fd00:172:16:4::20"),
        ),
        (
            "stray6.yaml",
            ipv6("stray6", "fd00:99::4", "fd00:172:16:4::21"),
        ),
    ] {
        r.set_origin(file.into(), docs(file, &ip));
    }
    let report = r.reconcile().0;
    assert_eq!(
        messages(&report.new_errors),
        [
            "stray6.yaml: IP default/stray6: field status.ip: fd00:99::4 is outside our ExternalCIDR fd00:192:168::/64 (spec.local.cidr.external of Configuration liqo-tenant-rome/rome)"
        ]
    );
    assert_eq!(report.peers, 1, "the peer keeps working");
    drop(r);
    let addr = |text: &str| Be128::from(text.parse::<std::net::Ipv6Addr>().unwrap());
    let key = MappingKey {
        peer_id: 1,
        addr: addr("fd00:192:168::4"),
    };
    assert_eq!(
        mappings6.entries.into_iter().collect::<Vec<_>>(),
        [(key, addr("fd00:172:16:4::20"))]
    );
    // The IPv4 IP still gives its entry: each family's IPs their own.
    assert_eq!(peers.entries.len(), 2);
    let views: Vec<String> = peers6.entries.keys().map(ToString::to_string).collect();
    assert_eq!(views, ["fd00:10::/64", "fd00:10:0:1::/64"]);
    let nat = peers6.entries.values().next().unwrap();
    assert_eq!(nat.flags, REMAPS_PEER);
    let rule6 = |from: &str, to: &str| {
        let (from, to) = (
            from.parse::<Ipv6Net>().unwrap(),
            to.parse::<Ipv6Net>().unwrap(),
        );
        PrefixRewrite::new(
            Be128::from(from.network()),
            Be128::from(to.network()),
            from.prefix_len(),
        )
    };
    assert_eq!(
        nat.theirs,
        [
            rule6("fd00:10::/64", "fd00:10:244::/64"),
            rule6("fd00:10:0:1::/64", "fd00:192:168::/64")
        ]
    );
}
