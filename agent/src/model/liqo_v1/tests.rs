//! Liqo v1's objects in the shapes its controllers write them
//! (`tests/fixtures/liqo-v1/`), and broken ones.

use std::path::Path;

use super::*;
use crate::model::{
    object::{Object, parse_documents},
    peer::{GatewayImplementation, GatewayRole},
};

use super::fixtures::{CLIENT, CONFIGURATION, PUBLIC_KEY, SERVER, dual_stack};

const IP: &str = include_str!("../../../../tests/fixtures/liqo-v1/ip-legacy-db.yaml");

/// The one object of `yaml`, its kind and its raw form.
fn raw(yaml: &str) -> (ObjectKind, RawObject) {
    match parse_documents(Path::new("v1.yaml"), yaml).pop() {
        Some(Ok(Object::Configuration(raw))) => (ObjectKind::Configuration, raw),
        Some(Ok(Object::PublicKey(raw))) => (ObjectKind::PublicKey, raw),
        Some(Ok(Object::IsthmusGatewayServer(raw))) => (ObjectKind::IsthmusGatewayServer, raw),
        Some(Ok(Object::IsthmusGatewayClient(raw))) => (ObjectKind::IsthmusGatewayClient, raw),
        Some(Ok(Object::Ip(raw))) => (ObjectKind::Ip, raw),
        other => panic!("not a Liqo v1 object: {other:?}"),
    }
}

fn networks(yaml: &str) -> Result<PeerNetworks, ObjectError> {
    PeerNetworks::from_configuration(&raw(yaml).1, "v1.yaml")
}

fn gateway(yaml: &str) -> Result<Gateway, ObjectError> {
    let (kind, raw) = raw(yaml);
    Gateway::from_raw(&raw, kind, "v1.yaml")
}

fn net(text: &str) -> Ipv4Net {
    text.parse().unwrap()
}

/// The error of `result`, which must name `field`.
fn names<T: std::fmt::Debug>(result: Result<T, ObjectError>, field: &str) -> String {
    let text = result.unwrap_err().to_string();
    assert!(text.contains(&format!("field {field}")), "{text}");
    text
}

#[test]
fn a_configuration_gives_the_peers_real_networks_and_our_view_of_them() {
    assert_eq!(
        networks(CONFIGURATION).unwrap(),
        PeerNetworks {
            cluster_id: "rome".into(),
            ipv4: Networks {
                local_pod: Mapped {
                    real: net("10.200.0.0/16"),
                    nat: None
                },
                local_external: Mapped {
                    real: net("10.201.0.0/16"),
                    nat: None
                },
                remote_pod: Mapped {
                    real: net("10.200.0.0/16"),
                    nat: Some(net("10.70.0.0/16")),
                },
                remote_external: Mapped {
                    real: net("10.201.0.0/16"),
                    nat: Some(net("10.71.0.0/16")),
                },
            },
            ipv6: None,
        }
    );
    // A network the IPAM left as it is (no overlap) is not remapped.
    let same = CONFIGURATION.replace("      - 10.70.0.0/16", "      - 10.200.0.0/16");
    assert_eq!(networks(&same).unwrap().ipv4.remote_pod.nat, None);
}

#[test]
fn a_configuration_not_yet_remapped_or_malformed_names_the_field() {
    let status = CONFIGURATION.find("\nstatus:").unwrap();
    names(networks(&CONFIGURATION[..status]), "status.remote.cidr.pod");
    let pending = CONFIGURATION.replace("      - 10.70.0.0/16", "      - \"\"");
    assert!(
        names(networks(&pending), "status.remote.cidr.pod").contains("has not remapped it yet")
    );
    let two = CONFIGURATION.replace(
        "      pod:\n      - 10.200.0.0/16\n      external:\n      - 10.201.0.0/16\n  remote",
        "      pod:\n      - 10.200.0.0/16\n      - 10.210.0.0/16\n      external:\n      - 10.201.0.0/16\n  remote",
    );
    assert!(names(networks(&two), "spec.local.cidr.pod").contains("2 networks, two of them IPv4"));
    let shorter = CONFIGURATION.replace("10.70.0.0/16", "10.70.0.0/24");
    names(networks(&shorter), "status.remote.cidr.pod");
    let garbage = CONFIGURATION.replace("      - 10.71.0.0/16", "      - 10.71.0.0/40");
    names(networks(&garbage), "status.remote.cidr.external");
    let unlabelled = CONFIGURATION.replace("    liqo.io/remote-cluster-id: rome\n", "");
    names(
        networks(&unlabelled),
        "metadata.labels[liqo.io/remote-cluster-id]",
    );
}

#[test]
fn a_public_key_gives_the_peers_key_and_a_broken_one_names_the_field() {
    let key = PeerKey::from_public_key(&raw(PUBLIC_KEY).1, "v1.yaml").unwrap();
    assert_eq!(key.cluster_id, "rome");
    assert_eq!(
        key_text::encode(&key.key),
        "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
    );
    for broken in ["AAAA", "not base64!", "[1, 2]"] {
        let text = PUBLIC_KEY.replace("HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=", broken);
        names(
            PeerKey::from_public_key(&raw(&text).1, "v1.yaml"),
            "spec.publicKey",
        );
    }
}

#[test]
fn a_gateway_client_connects_to_the_peers_endpoint_and_a_server_listens() {
    let client = gateway(CLIENT).unwrap();
    assert_eq!(
        client,
        Gateway {
            key: ObjectKey {
                namespace: "liqo-tenant-rome".into(),
                name: "rome".into(),
            },
            cluster_id: "rome".into(),
            side: Side::Client {
                endpoint: Endpoint::Addr(Ipv4Addr::new(203, 0, 113, 2).into()),
                port: 51840,
            },
            mtu: 1340,
        }
    );
    // The Connection its Liqo gateway would report to.
    let reference = client.reference();
    assert_eq!(reference.role, GatewayRole::Client);
    assert_eq!(reference.implementation, GatewayImplementation::Isthmus);
    assert_eq!(
        reference.connection().to_string(),
        "liqo-tenant-rome/gw-rome"
    );
    assert_eq!(
        gateway(SERVER).unwrap().side,
        Side::Server { port: DEFAULT_PORT }
    );
    let named = CLIENT.replace("    - 203.0.113.2", "    - gw.rome.example.com");
    assert!(matches!(
        gateway(&named).unwrap().side,
        Side::Client {
            endpoint: Endpoint::Name(_),
            ..
        }
    ));
    let tcp = CLIENT.replace("    port: 51840\n", "    port: 51840\n    protocol: TCP\n");
    names(gateway(&tcp), "spec.endpoint.protocol");
    let nowhere = CLIENT.replace("    addresses:\n    - 203.0.113.2\n", "");
    names(gateway(&nowhere), "spec.endpoint.addresses");
    let port = CLIENT.replace("    port: 51840\n", "    port: 70000\n");
    names(gateway(&port), "spec.endpoint.port");
    let tiny = CLIENT.replace("mtu: 1340", "mtu: 100");
    names(gateway(&tiny), "spec.mtu");
    let unset = CLIENT.replace("mtu: 1340", "mtu: 0");
    assert_eq!(gateway(&unset).unwrap().mtu, DEFAULT_MTU);
}

#[test]
fn an_ip_exposes_its_target_once_the_ipam_gave_it_an_address() {
    let (_, ip) = raw(IP);
    assert_eq!(
        IpMapping::from_raw(&ip, "v1.yaml").unwrap(),
        Some(IpMapping {
            exposed: Ipv4Addr::new(10, 201, 0, 4).into(),
            target: Ipv4Addr::new(172, 16, 4, 20).into(),
        })
    );
    let status = IP.find("\nstatus:").unwrap();
    assert_eq!(
        IpMapping::from_raw(&raw(&IP[..status]).1, "v1.yaml").unwrap(),
        None
    );
    let bad = IP.replace("ip: 172.16.4.20", "ip: 172.16.4.300");
    names(IpMapping::from_raw(&raw(&bad).1, "v1.yaml"), "spec.ip");
}

#[test]
fn an_ipv6_ip_exposes_an_ipv6_target_and_a_mixed_one_names_its_field() {
    let ipv6 = IP
        .replace("ip: 172.16.4.20", "ip: fd00:172:16:4::20")
        .replace("ip: 10.201.0.4", "ip: fd00:192:168::4")
        .replace("cidr: 10.201.0.0/16", "cidr: fd00:192:168::/64");
    let addr = |text: &str| text.parse::<IpAddr>().unwrap();
    assert_eq!(
        IpMapping::from_raw(&raw(&ipv6).1, "v1.yaml").unwrap(),
        Some(IpMapping {
            exposed: addr("fd00:192:168::4"),
            target: addr("fd00:172:16:4::20"),
        })
    );
    let mixed = IP.replace("ip: 172.16.4.20", "ip: fd00:172:16:4::20");
    let err = names(IpMapping::from_raw(&raw(&mixed).1, "v1.yaml"), "status.ip");
    assert!(err.contains("is not of the family of spec.ip"), "{err}");
}

#[test]
fn the_unknown_source_is_the_network_address_of_our_external_cidr() {
    let (_, raw) = raw(CONFIGURATION);
    let peer = networks(CONFIGURATION)
        .unwrap()
        .peer(&raw.key, "v1.yaml", Companions::default());
    // Liqo's "first IP" of 10.201.0.0/16 is 10.201.0.0 itself, not .1.
    assert_eq!(
        unknown_sources(std::slice::from_ref(&peer)),
        (Some(Ipv4Addr::new(10, 201, 0, 0)), None)
    );
    assert_eq!(unknown_sources(&[]), (None, None));
    let dual = networks(&dual_stack())
        .unwrap()
        .peer(&raw.key, "v1.yaml", Companions::default());
    assert_eq!(
        unknown_sources(&[dual]).1,
        Some("fd00:192:168::".parse().unwrap())
    );
}

#[test]
fn a_configuration_lists_an_ipv6_network_beside_each_ipv4_one() {
    let single = networks(CONFIGURATION).unwrap();
    let dual = networks(&dual_stack()).unwrap();
    assert_eq!(dual.ipv4, single.ipv4);
    let ipv6 = dual.ipv6.expect("IPv6 networks");
    let net6 = |text: &str| text.parse::<ipnet::Ipv6Net>().unwrap();
    assert_eq!(
        ipv6.remote_pod,
        Mapped {
            real: net6("fd00:10:244::/64"),
            nat: Some(net6("fd00:10::/64"))
        }
    );
    assert_eq!(ipv6.local_external.real, net6("fd00:192:168::/64"));
    assert_eq!(ipv6.local_external.nat, None);
    assert_eq!(
        ipv6.views(crate::model::object::Layout::LiqoV1)[1],
        ("status.remote.cidr.external", net6("fd00:10:0:1::/64"))
    );
    // The order within a list does not matter.
    let swapped = dual_stack().replace(
        "      - 10.70.0.0/16\n      - fd00:10::/64\n",
        "      - fd00:10::/64\n      - 10.70.0.0/16\n",
    );
    assert_eq!(
        networks(&swapped).unwrap(),
        networks(&dual_stack()).unwrap()
    );
}

#[test]
fn a_configuration_with_ipv6_in_some_lists_or_twice_in_one_names_the_field() {
    let partial = dual_stack().replace("      - fd00:10:0:1::/64\n", "");
    assert!(
        names(networks(&partial), "status.remote.cidr.external")
            .contains("no IPv6 network, where spec.local.cidr.pod has one")
    );
    let twice = dual_stack().replace(
        "      - fd00:10::/64\n",
        "      - fd00:10::/64\n      - fd00:11::/64\n",
    );
    assert!(
        names(networks(&twice), "status.remote.cidr.pod").contains("3 networks, two of them IPv6")
    );
    let only_ipv6 = dual_stack().replace("      - 10.200.0.0/16\n", "");
    assert!(names(networks(&only_ipv6), "spec.local.cidr.pod").contains("no IPv4 network"));
    let shorter = dual_stack().replace("fd00:10::/64", "fd00:10::/80");
    names(networks(&shorter), "status.remote.cidr.pod");
    let garbage = dual_stack().replace("fd00:10::/64", "fd00:10::/200");
    assert!(
        names(networks(&garbage), "status.remote.cidr.pod").contains("is not an IPv4 or IPv6 CIDR")
    );
}
