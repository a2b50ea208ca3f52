//! Our CRDs: Liqo's objects fit their schemas and malformed ones do not,
//! and they are a superset of Liqo v0.10's.

use super::*;

/// The schema of a CRD's served version, as a JSON Schema validator.
fn schema(crd: &str) -> jsonschema::Validator {
    let crd = &yaml_file(crd)[0];
    jsonschema::draft4::new(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        .expect("the CRD schema compiles")
}

const KEY: &str = "oR2+uQn4MBy1GmxIvBqEjW6sIpH9h5CTmhzRrTzB4W8=";

#[test]
fn liqo_objects_fit_the_crd_schemas_and_malformed_ones_do_not() {
    let tunnel_endpoints = schema("crds/net.liqo.io_tunnelendpoints.yaml");
    // The lab's TunnelEndpoints, in both layouts Liqo wrote.
    for p in &PEERINGS {
        let object = yaml(&p.tunnel_endpoint_yaml(Some(KEY)));
        let errors: Vec<String> = tunnel_endpoints
            .iter_errors(&object)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{}→{}: {errors:?}",
            p.local.name,
            p.remote.name
        );
    }
    let good = PEERINGS[0].tunnel_endpoint_yaml(Some(KEY));
    let endpoint = format!(
        "endpointIP: {}",
        PEERINGS[0]
            .endpoint_name
            .expect("the lab names b by host name")
    );
    assert!(good.contains(&endpoint), "{good}");
    for (what, bad) in [
        ("bad CIDR", good.replace("10.0.40.0/24", "10.0.40.0/33")),
        (
            "bad IP",
            good.replace(&endpoint, "endpointIP: 203.0.113.256"),
        ),
        (
            "bad port",
            good.replace("port: \"5871\"", "port: \"65536\""),
        ),
        ("bad key", good.replace(KEY, "not-base64")),
    ] {
        assert!(
            !tunnel_endpoints.is_valid(&yaml(&bad)),
            "{what} accepted:\n{bad}"
        );
    }
    let status = serde_json::json!({"status": {"connection": {"status": "Sleeping"}}});
    assert!(
        !tunnel_endpoints.is_valid(&status),
        "unknown connection status accepted"
    );
    // Liqo v0.2-v0.4 wrote statuses in lower case.
    let status = serde_json::json!({"status": {"connection": {"status": "connected"}}});
    assert!(tunnel_endpoints.is_valid(&status));
    let elb = good.replace(
        &endpoint,
        "endpointIP: a1b2c3-1234567890.eu-west-1.elb.amazonaws.com",
    );
    assert!(tunnel_endpoints.is_valid(&yaml(&elb)), "{elb}");
    assert_ipv6_networks_are_validated(&tunnel_endpoints);

    // Every object of Liqo's shapes in the fixtures.
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/liqo");
    let nat_mappings = schema("crds/net.liqo.io_natmappings.yaml");
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let object = yaml(&std::fs::read_to_string(&path).unwrap());
        let validator = match object["kind"].as_str() {
            Some("TunnelEndpoint") => &tunnel_endpoints,
            _ => &nat_mappings,
        };
        let errors: Vec<String> = validator
            .iter_errors(&object)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }

    let good = NAT_MAPPING.yaml(&[NAT_MAPPING.entry()]);
    assert!(nat_mappings.is_valid(&yaml(&good)), "{good}");
    let bad = good.replace(": 10.0.1.45", ": 10.0.1.450");
    assert!(
        !nat_mappings.is_valid(&yaml(&bad)),
        "bad externalIP accepted"
    );
    let dual = NAT_MAPPING.dual_stack_yaml(&[NAT_MAPPING.entry()], &[NAT_MAPPING.entry6()]);
    assert!(nat_mappings.is_valid(&yaml(&dual)), "{dual}");
    let bad6 = dual.replace("fd00:10:0:1::45", "fd00:10:0:1::45/64");
    assert!(
        !nat_mappings.is_valid(&yaml(&bad6)),
        "a network as IPv6 externalIP accepted"
    );
    let no_cluster = good.replace("spec:\n  clusterID: cluster-a\n", "spec:\n");
    assert!(
        !nat_mappings.is_valid(&yaml(&no_cluster)),
        "missing clusterID accepted"
    );
}

/// Every field, printer column and category of Liqo v0.10.3's CRDs
/// (`deployments/liqo/crds`) is in ours, so that either may own them.
/// `spec.ipv6` of a dual-stack peering holds IPv6 networks, each where its
/// IPv4 namesake holds an IPv4 one.
fn assert_ipv6_networks_are_validated(tunnel_endpoints: &jsonschema::Validator) {
    let dual = isthmus_lab::objects::TunnelEndpoint::new("b", "liqo-tenant-b")
        .cluster_id("cluster-b")
        .ipv6(
            [
                "fd00:10:244::/64",
                "fd00:10:0:40::/64",
                "fd00:192:168::/64",
                "None",
            ],
            [
                "fd00:10:244::/64",
                "fd00:10::/64",
                "fd00:192:168::/64",
                "::/0",
            ],
        )
        .to_string();
    assert!(tunnel_endpoints.is_valid(&yaml(&dual)), "{dual}");
    for (what, from, to) in [
        ("an IPv4 network", "fd00:10::/64", "10.0.0.0/24"),
        ("a prefix past 128", "fd00:10::/64", "fd00:10::/129"),
        ("two compressions", "fd00:10::/64", "fd00::10::/64"),
        (
            "None for a real network",
            "remotePodCIDR: fd00:10:244::/64",
            "remotePodCIDR: None",
        ),
        (
            "a missing network",
            "    localExternalCIDR: fd00:192:168::/64\n",
            "",
        ),
    ] {
        let bad = dual.replace(from, to);
        assert_ne!(bad, dual, "{what}");
        assert!(
            !tunnel_endpoints.is_valid(&yaml(&bad)),
            "{what} accepted:\n{bad}"
        );
    }
}

#[test]
fn our_crds_are_a_superset_of_liqo_v0_10() {
    let crd = |file: &str| yaml_file(file).remove(0);
    let tep = crd("crds/net.liqo.io_tunnelendpoints.yaml");
    let nm = crd("crds/net.liqo.io_natmappings.yaml");
    for c in [&tep, &nm] {
        assert_eq!(
            c["spec"]["names"]["categories"],
            serde_json::json!(["liqo"])
        );
    }
    let has = |c: &Value, path: &str| {
        let mut node = &c["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for part in path.split('.') {
            node = &node["properties"][part];
        }
        !node.is_null()
    };
    for path in [
        "spec.backend_config",
        "spec.backendType",
        "spec.clusterIdentity.clusterID",
        "spec.clusterIdentity.clusterName",
        "spec.endpointIP",
        "spec.localExternalCIDR",
        "spec.localNATExternalCIDR",
        "spec.localNATPodCIDR",
        "spec.localPodCIDR",
        "spec.remoteExternalCIDR",
        "spec.remoteNATExternalCIDR",
        "spec.remoteNATPodCIDR",
        "spec.remotePodCIDR",
        "status.connection.latency.timestamp",
        "status.connection.latency.value",
        "status.connection.peerConfiguration",
        "status.connection.status",
        "status.connection.statusMessage",
        "status.gatewayIP",
        "status.tunnelIFaceIndex",
        "status.tunnelIFaceName",
        "status.vethIFaceIndex",
        "status.vethIFaceName",
        "status.vethIP",
    ] {
        assert!(has(&tep, path), "TunnelEndpoint lacks Liqo's {path}");
    }
    for path in [
        "spec.clusterID",
        "spec.clusterMappings",
        "spec.externalCIDR",
        "spec.podCIDR",
    ] {
        assert!(has(&nm, path), "NatMapping lacks Liqo's {path}");
    }
    let columns: Vec<(&str, &str)> = tep["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Peering Cluster", ".spec.clusterIdentity.clusterName"),
            ("Endpoint IP", ".spec.endpointIP"),
            ("Backend type", ".spec.backendType"),
            ("Latency", ".status.connection.latency.value"),
            ("Connection status", ".status.connection.status"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}
