//! A Liqo v1 peer from the API server, in the shapes Liqo v1.2 writes
//! (`tests/fixtures/liqo-v1/`): the gateway programs it, reaches the test's
//! own peer with the key Liqo keeps for the gateway, and creates and keeps
//! the peer's `Connection` as Liqo's gateway does.

use super::{test_peer::TestPeer, *};

const TENANT: &str = "liqo-tenant-rome";
const CONNECTION: &str = "gw-rome";

/// A fixture, as the API server would serve it.
fn fixture(yaml: &str) -> Value {
    serde_yaml_ng::from_str(yaml).expect("a fixture is YAML")
}

/// The Connection as stored, or Null.
fn connection(node: &KubeNode) -> Value {
    node.api
        .get("connections", TENANT, CONNECTION)
        .unwrap_or(Value::Null)
}

fn connection_value(node: &KubeNode) -> Value {
    connection(node)["status"]["value"].clone()
}

#[test]
fn a_liqo_v1_gateway_creates_and_keeps_the_peers_connection() {
    const NS: &str = "ist-t-kube-v1";
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let configuration = fixture(include_str!(
        "../../../fixtures/liqo-v1/configuration-rome.yaml"
    ));
    let mut public_key = fixture(include_str!(
        "../../../fixtures/liqo-v1/publickey-rome.yaml"
    ));
    public_key["spec"]["publicKey"] = json!(key_text::encode(&peer.public()));
    let mut client = fixture(include_str!(
        "../../../fixtures/liqo-v1/gatewayclient-rome.yaml"
    ));
    client["spec"]["endpoint"]["addresses"] = json!(["127.0.0.1"]);
    client["spec"]["endpoint"]["port"] = json!(peer.port);
    // The gateway's key, as Liqo's controller manager stores it for the
    // gateway: raw bytes in `gw-<gateway>`, in the namespace the gateway
    // runs in (the agent's).
    let mut private = [0u8; 32];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut private).unwrap();
    let public = *PublicKey::from(&StaticSecret::from(private)).as_bytes();
    let key_secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": CONNECTION, "namespace": AGENT_NS, "labels": {
            "liqo.io/remote-cluster-id": "rome",
            "networking.liqo.io/gateway-resource": "true",
        }},
        "data": {"privateKey": STANDARD.encode(private), "publicKey": STANDARD.encode(public)},
    });
    for object in [
        configuration,
        public_key.clone(),
        client,
        key_secret.clone(),
    ] {
        node.api.apply(object);
    }
    node.start_agent(&[
        "--keepalive=0",
        "--liqo-api=v1",
        &format!("--key-secret={CONNECTION}"),
    ])
    .unwrap();

    // Programmed by our views of rome, before any Connection is up.
    node.wait_peers("rome's views", &["10.70.0.0/16", "10.71.0.0/16"]);
    // The gateway uses Liqo's key, and leaves its Secret as it is.
    peer.answer(public);
    let secret = node.api.get("secrets", AGENT_NS, CONNECTION).unwrap();
    assert_eq!(secret["data"], key_secret["data"]);
    assert_eq!(node.requests("PATCH", "/secrets"), 0);
    assert_eq!(node.requests("POST", "/secrets"), 0);

    // Created as Liqo's gateway creates it, then Connected with a latency.
    wait_for("gw-rome Connected", || {
        connection_value(&node) == "Connected"
    });
    let created = connection(&node);
    let gateway_uid =
        node.api.get("gatewayclients", TENANT, "rome").unwrap()["metadata"]["uid"].clone();
    assert_eq!(
        created["metadata"]["labels"],
        json!({"liqo.io/remote-cluster-id": "rome"})
    );
    assert_eq!(
        created["metadata"]["ownerReferences"],
        json!([{"apiVersion": "networking.liqo.io/v1beta1", "kind": "GatewayClient", "name": "rome", "uid": gateway_uid}])
    );
    assert_eq!(
        created["spec"],
        json!({"type": "Client", "gatewayRef": {
            "apiVersion": "networking.liqo.io/v1beta1", "kind": "WgGatewayClient",
            "name": "rome", "namespace": TENANT, "uid": gateway_uid,
        }})
    );
    assert_liqo_latency(&created["status"]["latency"]);
    assert_eq!(
        sample(
            NS,
            "liqo_peer_is_connected{driver=\"wireguard\",cluster_id=\"rome\"}"
        ),
        1.0
    );
    // Status writes touch `status.value` and `status.latency` only.
    let patches = node.status_patches("connections/gw-rome");
    assert!(!patches.is_empty());
    for body in patches {
        let keys: Vec<&String> = body["status"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["latency", "value"], "{body}");
    }

    // An IP exposes an address of ours to rome; one outside our
    // ExternalCIDR is refused, with an Event naming it and its field.
    let ip = fixture(include_str!("../../../fixtures/liqo-v1/ip-legacy-db.yaml"));
    let mut stray = ip.clone();
    stray["metadata"]["name"] = json!("stray");
    stray["status"]["ip"] = json!("10.99.0.4");
    node.api.apply(ip);
    node.api.apply(stray);
    wait_for("the IP's mapping", || node.mappings() == 1);
    let about_stray = || {
        node.api
            .list("events")
            .into_iter()
            .find(|e| e["regarding"]["name"] == "stray")
    };
    wait_for("an Event about the stray IP", || about_stray().is_some());
    let event = about_stray().unwrap();
    assert_eq!(
        (
            event["regarding"]["kind"].as_str(),
            event["reason"].as_str()
        ),
        (Some("IP"), Some("Rejected"))
    );
    assert!(
        event["note"].as_str().unwrap().contains("status.ip"),
        "{event}"
    );

    // Restamped every ten seconds, as Liqo's gateway does.
    let stamp = || connection(&node)["status"]["latency"]["timestamp"].clone();
    let first = stamp();
    let took = wait_for("a new timestamp", || stamp() != first);
    println!("restamped after {took:?}");

    // Deleted under the agent: created again.
    assert!(node.api.delete("connections", TENANT, CONNECTION));
    wait_for("gw-rome again, Connected", || {
        connection_value(&node) == "Connected"
    });
    assert_eq!(node.requests("POST", "/connections"), 2);

    // Without the peer's key there is no tunnel: Error.
    assert!(node.api.delete("publickeies", TENANT, "rome"));
    wait_for("gw-rome Error without a PublicKey", || {
        connection_value(&node) == "Error"
    });
    let log = node.log();
    assert!(
        log.contains("PublicKey spec.publicKey is missing"),
        "the missing field is not named:\n{log}"
    );
    // And with it back, the tunnel is up again.
    node.api.apply(public_key);
    wait_for("gw-rome Connected with its key back", || {
        connection_value(&node) == "Connected"
    });
}
