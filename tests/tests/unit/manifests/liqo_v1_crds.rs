//! Liqo v1.2's CRDs (`tests/fixtures/liqo-v1/crds/`, copied from its chart):
//! the fixtures the v1 reader is tested with, and the Connection the
//! gateway writes, fit their schemas.

use isthmus_agent::{
    control::status::{ConnectionStatus, ShownOn, State, liqo_connection},
    model::{
        object::ObjectKey,
        peer::{GatewayImplementation, GatewayRole, LiqoGateway},
    },
};

use super::*;

/// The schema of `version` of Liqo v1.2's CRD `file`.
pub(super) fn liqo_schema(file: &str, version: &str) -> jsonschema::Validator {
    let path = manifests()
        .join("../tests/fixtures/liqo-v1/crds")
        .join(file);
    let crd: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let served = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("{file} serves no {version}"));
    jsonschema::draft4::new(&served["schema"]["openAPIV3Schema"]).expect("the CRD schema compiles")
}

fn errors(schema: &jsonschema::Validator, object: &Value) -> Vec<String> {
    schema.iter_errors(object).map(|e| e.to_string()).collect()
}

#[test]
fn the_liqo_v1_fixtures_fit_liqo_v1_2s_crds() {
    for (fixture, crd, version) in [
        (
            "configuration-rome.yaml",
            "networking.liqo.io_configurations.yaml",
            "v1beta1",
        ),
        (
            "publickey-rome.yaml",
            "networking.liqo.io_publickeies.yaml",
            "v1beta1",
        ),
        (
            "gatewayclient-rome.yaml",
            "networking.liqo.io_gatewayclients.yaml",
            "v1beta1",
        ),
        (
            "gatewayserver-rome.yaml",
            "networking.liqo.io_gatewayservers.yaml",
            "v1beta1",
        ),
        ("ip-legacy-db.yaml", "ipam.liqo.io_ips.yaml", "v1alpha1"),
    ] {
        let path = manifests().join("../tests/fixtures/liqo-v1").join(fixture);
        let object: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let schema = liqo_schema(crd, version);
        assert_eq!(errors(&schema, &object), Vec::<String>::new(), "{fixture}");
    }
    // The schemas can refuse: a GatewayClient whose MTU is text.
    let schema = liqo_schema("networking.liqo.io_gatewayclients.yaml", "v1beta1");
    let path = manifests().join("../tests/fixtures/liqo-v1/gatewayclient-rome.yaml");
    let mut object: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    object["spec"]["mtu"] = serde_json::json!("1340");
    assert!(!errors(&schema, &object).is_empty());
}

#[test]
fn the_connection_the_gateway_writes_fits_liqo_v1_2s_crd() {
    let schema = liqo_schema("networking.liqo.io_connections.yaml", "v1beta1");
    for (role, implementation) in [
        (GatewayRole::Client, GatewayImplementation::LiqoWireGuard),
        (GatewayRole::Server, GatewayImplementation::LiqoWireGuard),
        (GatewayRole::Client, GatewayImplementation::Isthmus),
        (GatewayRole::Server, GatewayImplementation::Isthmus),
    ] {
        let gateway = LiqoGateway {
            role,
            implementation,
            key: ObjectKey {
                namespace: "liqo-tenant-rome".into(),
                name: "rome".into(),
            },
            cluster_id: "rome".into(),
            port: 51840,
        };
        let created = liqo_connection::object(&gateway.connection(), &gateway, Some("7d2f4b8e"));
        let mut connection = serde_json::to_value(created).unwrap();
        for state in [State::Connecting, State::Connected, State::Error] {
            let status = ConnectionStatus {
                shown_on: ShownOn::Connection(gateway.clone()),
                state,
                message: String::new(),
                latency: Some("379μs".into()),
                peer_configuration: None,
            };
            let now = "2026-11-27T10:00:00Z".parse().unwrap();
            connection["status"] = liqo_connection::status_patch(&status, now)["status"].clone();
            assert_eq!(
                errors(&schema, &connection),
                Vec::<String>::new(),
                "{connection}"
            );
        }
        // The schema can refuse: a type it does not know.
        connection["spec"]["type"] = serde_json::json!("Both");
        assert!(!errors(&schema, &connection).is_empty());
    }
}
