//! A Liqo v1 peer from the API server, in the shapes Liqo v1.2 writes
//! (`tests/fixtures/liqo-v1/`): the gateway programs it, reaches the test's
//! own peer with the key Liqo keeps for the gateway, writes the status of
//! the gateway object Liqo renders from Isthmus's template as Liqo reads
//! it, publishes its public key, and creates and keeps the peer's
//! `Connection` as Liqo's gateway does.

use super::{test_peer::TestPeer, *};

pub(super) const TENANT: &str = "liqo-tenant-rome";
pub(super) const CONNECTION: &str = "gw-rome";
/// The port of rome's `GatewayServer`, as Liqo writes it.
const SERVER_PORT: u16 = 51840;

/// A fixture, as the API server would serve it.
pub(super) fn fixture(yaml: &str) -> Value {
    serde_yaml_ng::from_str(yaml).expect("a fixture is YAML")
}

/// The gateway's key, as Liqo's controller manager stores it for the
/// gateway: raw bytes in `gw-<gateway>`, in the namespace the gateway runs
/// in (the agent's). Returns the Secret and the public key.
pub(super) fn gateway_key() -> (Value, [u8; 32]) {
    let mut private = [0u8; 32];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut private).unwrap();
    let public = *PublicKey::from(&StaticSecret::from(private)).as_bytes();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": CONNECTION, "namespace": AGENT_NS, "labels": {
            "liqo.io/remote-cluster-id": "rome",
            "networking.liqo.io/gateway-resource": "true",
        }},
        "data": {"privateKey": STANDARD.encode(private), "publicKey": STANDARD.encode(public)},
    });
    (secret, public)
}

/// Liqo's gateway object `parent` (a fixture), applied, and the object
/// Liqo renders for it from Isthmus's template (`rendered`, a fixture),
/// owned by it and without the status the agent writes, to apply.
fn gateway_pair(node: &KubeNode, parent: &str, rendered: &str) -> Value {
    gateway_pair_of(node, fixture(parent), fixture(rendered))
}

/// [`gateway_pair`], of any peer's objects.
pub(super) fn gateway_pair_of(node: &KubeNode, parent: Value, mut rendered: Value) -> Value {
    let plural = format!("{}s", parent["kind"].as_str().unwrap().to_lowercase());
    let (namespace, name) = (
        parent["metadata"]["namespace"].as_str().unwrap().to_owned(),
        parent["metadata"]["name"].as_str().unwrap().to_owned(),
    );
    node.api.apply(parent);
    let uid = node.api.get(&plural, &namespace, &name).unwrap()["metadata"]["uid"].clone();
    rendered["metadata"]["ownerReferences"][0]["uid"] = uid;
    rendered.as_object_mut().unwrap().remove("status");
    rendered
}

/// Waits for the agent (of netns `ns`, whose Node's address is loopback)
/// to write the status of our `Isthmus{gateway_kind}` as Liqo's
/// controllers read it: a server's endpoint (addresses, an integer port,
/// the protocol), the Secret of its public key without a uid, and the
/// node. The public key is in that Secret, as 32 raw bytes, and alone.
fn assert_gateway_object_status(node: &KubeNode, ns: &str, gateway_kind: &str, public: [u8; 32]) {
    let plural = format!("isthmus{}s", gateway_kind.to_lowercase());
    let secret = format!("{CONNECTION}-public");
    let mut expected = json!({
        "secretRef": {"apiVersion": "v1", "kind": "Secret", "name": secret, "namespace": AGENT_NS},
        "internalEndpoint": {"ip": "127.0.0.1", "node": ns},
    });
    if gateway_kind == "GatewayServer" {
        expected["endpoint"] =
            json!({"addresses": ["127.0.0.1"], "port": SERVER_PORT, "protocol": "UDP"});
    }
    let status = || node.api.get(&plural, TENANT, "rome").unwrap()["status"].clone();
    wait_for("the gateway object's status", || status() == expected);
    let published = node.api.get("secrets", AGENT_NS, &secret).unwrap();
    assert_eq!(
        published["data"],
        json!({"publicKey": STANDARD.encode(public)})
    );
}

/// What kubelet would find asking the readiness of the pod of Liqo's
/// `gw-rome` Deployment, which the agent of netns `ns` keeps on its node.
fn gateway_pod_ready(node: &KubeNode, ns: &str) -> bool {
    let deployment = node
        .api
        .get("deployments", TENANT, CONNECTION)
        .expect("the gw-rome Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["nodeName"], ns);
    let probe = &pod["containers"][0]["readinessProbe"]["httpGet"];
    let host: Ipv4Addr = probe["host"].as_str().unwrap().parse().unwrap();
    let port = u16::try_from(probe["port"].as_u64().unwrap()).unwrap();
    let path = probe["path"].as_str().unwrap();
    let (status, _) =
        isthmus_lab::lab::http_get_at(ns, (host, port).into(), path).expect("the agent answers");
    status == 200
}

/// rome's Configuration, and its PublicKey with `peer`'s key.
pub(super) fn rome(peer: &TestPeer) -> (Value, Value) {
    let configuration = fixture(include_str!(
        "../../../fixtures/liqo-v1/configuration-rome.yaml"
    ));
    let mut public_key = fixture(include_str!(
        "../../../fixtures/liqo-v1/publickey-rome.yaml"
    ));
    public_key["spec"]["publicKey"] = json!(key_text::encode(&peer.public()));
    (configuration, public_key)
}

/// The Connection as stored, or Null.
pub(super) fn connection(node: &KubeNode) -> Value {
    node.api
        .get("connections", TENANT, CONNECTION)
        .unwrap_or(Value::Null)
}

pub(super) fn connection_value(node: &KubeNode) -> Value {
    connection(node)["status"]["value"].clone()
}

/// Waits for `gw-rome` to go Connected, and asserts it is as Liqo's
/// gateway creates it beside Liqo's `gateway_kind` object (`GatewayClient`
/// or `GatewayServer`): its label, its owner, its spec naming the kind of
/// the object rendered for Isthmus with the owner's UID, and its latency.
fn assert_connected_as_liqo_writes(node: &KubeNode, gateway_kind: &str) {
    wait_for("gw-rome Connected", || {
        connection_value(node) == "Connected"
    });
    let created = connection(node);
    let plural = format!("{}s", gateway_kind.to_lowercase());
    let uid = node.api.get(&plural, TENANT, "rome").unwrap()["metadata"]["uid"].clone();
    assert_eq!(
        created["metadata"]["labels"],
        json!({"liqo.io/remote-cluster-id": "rome"})
    );
    assert_eq!(
        created["metadata"]["ownerReferences"],
        json!([{"apiVersion": "networking.liqo.io/v1beta1", "kind": gateway_kind, "name": "rome", "uid": uid}])
    );
    let side = gateway_kind.trim_start_matches("Gateway");
    assert_eq!(
        created["spec"],
        json!({"type": side, "gatewayRef": {
            "apiVersion": "gateway.isthmus.dev/v1alpha1", "kind": format!("Isthmus{gateway_kind}"),
            "name": "rome", "namespace": TENANT, "uid": uid,
        }})
    );
    assert_liqo_latency(&created["status"]["latency"]);
}

#[test]
fn a_liqo_v1_gateway_creates_and_keeps_the_peers_connection() {
    const NS: &str = "ist-t-kube-v1";
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let (configuration, public_key) = rome(&peer);
    let mut client = gateway_pair(
        &node,
        include_str!("../../../fixtures/liqo-v1/gatewayclient-rome.yaml"),
        include_str!("../../../fixtures/liqo-v1/isthmusgatewayclient-rome.yaml"),
    );
    client["spec"]["endpoint"]["addresses"] = json!(["127.0.0.1"]);
    client["spec"]["endpoint"]["port"] = json!(peer.port);
    let (key_secret, public) = gateway_key();
    for object in [
        configuration,
        public_key.clone(),
        client,
        key_secret.clone(),
    ] {
        node.api.apply(object);
    }
    // The DaemonSet's keepalive.
    node.start_agent(&["--liqo-api=v1", &format!("--key-secret={CONNECTION}")])
        .unwrap();

    // Programmed by our views of rome, before any Connection is up.
    node.wait_peers("rome's views", &["10.70.0.0/16", "10.71.0.0/16"]);
    // The gateway uses Liqo's key, and leaves its Secret as it is.
    peer.answer(public);
    let secret = node.api.get("secrets", AGENT_NS, CONNECTION).unwrap();
    assert_eq!(secret["data"], key_secret["data"]);
    assert_eq!(
        node.requests("PATCH", &format!("/secrets/{CONNECTION}?")),
        0
    );
    assert_gateway_object_status(&node, NS, "GatewayClient", public);
    // Liqo's gw-rome Deployment: its pod on this node, ready while the
    // agent serves the gateway, before any Connection is up.
    wait_for("gw-rome ready", || {
        node.api.get("deployments", TENANT, CONNECTION).is_some() && gateway_pod_ready(&node, NS)
    });

    // Created as Liqo's gateway creates it, then Connected with a latency.
    assert_connected_as_liqo_writes(&node, "GatewayClient");
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

    // The peer falls silent, as behind a cut WAN link: Error within 10 s,
    // and Connected again once it answers.
    peer.set_cut(true);
    let cut = Instant::now();
    let took = isthmus_tests::eventually(
        Duration::from_secs(10),
        "gw-rome Error within 10 s of the peer going silent",
        || connection_value(&node) == "Error",
    );
    println!("Error {took:?} after the cut ({:?} in all)", cut.elapsed());
    peer.set_cut(false);
    wait_for("gw-rome Connected once the peer answers again", || {
        connection_value(&node) == "Connected"
    });

    // Deleted under the agent: created again.
    assert!(node.api.delete("connections", TENANT, CONNECTION));
    wait_for("gw-rome again, Connected", || {
        connection_value(&node) == "Connected"
    });
    assert_eq!(node.requests("POST", "/connections"), 2);

    // Without the peer's key there is no tunnel: Error, and the gateway's
    // pod is no longer ready.
    assert!(node.api.delete("publickeies", TENANT, "rome"));
    wait_for("gw-rome Error without a PublicKey", || {
        connection_value(&node) == "Error"
    });
    wait_for("gw-rome not ready", || !gateway_pod_ready(&node, NS));
    // Deleted under the agent: made again.
    assert!(node.api.delete("deployments", TENANT, CONNECTION));
    wait_for("gw-rome again", || {
        node.api.get("deployments", TENANT, CONNECTION).is_some()
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
    assert!(gateway_pod_ready(&node, NS));
}

#[test]
fn a_liqo_v1_gateway_server_listens_on_its_objects_port_waits_for_the_peer_and_can_turn_client() {
    const NS: &str = "ist-t-kube-v1s";
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let (configuration, public_key) = rome(&peer);
    // As Liqo writes it: port 51840.
    let server = gateway_pair(
        &node,
        include_str!("../../../fixtures/liqo-v1/gatewayserver-rome.yaml"),
        include_str!("../../../fixtures/liqo-v1/isthmusgatewayserver-rome.yaml"),
    );
    let (key_secret, public) = gateway_key();
    for object in [configuration, public_key, server, key_secret] {
        node.api.apply(object);
    }
    // The DaemonSet's keepalive: a served peer gets none before contact.
    node.start_agent(&["--liqo-api=v1", &format!("--key-secret={CONNECTION}")])
        .unwrap();
    node.wait_peers("rome's views", &["10.70.0.0/16", "10.71.0.0/16"]);

    // rome's own device listens on the object's port, not --listen-port,
    // and nothing goes to rome before it makes contact, the conncheck's
    // PINGs included: ready, and Connecting.
    let no_endpoint = || {
        sample(
            NS,
            "isthmus_tunnel_dropped_packets_total{reason=\"no_endpoint\"}",
        )
    };
    wait_for("a PING with nowhere to go", || no_endpoint() >= 1.0);
    assert_eq!(connection_value(&node), "Connecting");
    wait_for("gw-rome ready before contact", || {
        node.api.get("deployments", TENANT, CONNECTION).is_some() && gateway_pod_ready(&node, NS)
    });

    // It makes contact: Connected, as Liqo's server side shows it.
    peer.contact(public, (Ipv4Addr::LOCALHOST, SERVER_PORT).into());
    assert_connected_as_liqo_writes(&node, "GatewayServer");
    assert_gateway_object_status(&node, NS, "GatewayServer", public);
    assert!(gateway_pod_ready(&node, NS));
    // The server's end of the tunnel, which the peer's conncheck PINGs.
    // The device is made anew when the peering turns: absent meanwhile.
    let addresses = || {
        isthmus_lab::cmd::ip(NS, &["-4", "-o", "addr", "show", "dev", "ist-rome"])
            .unwrap_or_default()
    };
    let (server_end, client_end) = ("169.254.18.1/30", "169.254.18.2/30");
    assert!(addresses().contains(server_end) && !addresses().contains(client_end));

    // The peering turns around: the GatewayServer goes, and with it what
    // it owns (the API server's garbage collector follows the owner); a
    // GatewayClient comes. The gateway contacts the peer where it listens,
    // from the client's end in place of the server's.
    assert!(node.api.delete("gatewayservers", TENANT, "rome"));
    assert!(node.api.delete("isthmusgatewayservers", TENANT, "rome"));
    assert!(node.api.delete("connections", TENANT, CONNECTION));
    let mut client = gateway_pair(
        &node,
        include_str!("../../../fixtures/liqo-v1/gatewayclient-rome.yaml"),
        include_str!("../../../fixtures/liqo-v1/isthmusgatewayclient-rome.yaml"),
    );
    client["spec"]["endpoint"]["addresses"] = json!(["127.0.0.1"]);
    client["spec"]["endpoint"]["port"] = json!(peer.port);
    node.api.apply(client);
    wait_for("the client's end in place of the server's", || {
        let now = addresses();
        now.contains(client_end) && !now.contains(server_end)
    });
    assert_connected_as_liqo_writes(&node, "GatewayClient");
}
