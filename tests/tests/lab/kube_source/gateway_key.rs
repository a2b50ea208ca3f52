//! The gateway's key in a Secret, and the status and events it reports,
//! seen from a WireGuard peer of the test's own.

use super::{
    test_peer::{TestPeer, secret_text},
    *,
};

#[test]
fn the_gateway_keeps_its_key_in_a_secret_and_reports_status_and_events() {
    const NS: &str = "ist-t-kube2";
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let peer_key = key_text::encode(&peer.public());
    let tunnel = |addr: &str, port: u16, key: &str| json!({"endpointIP": addr, "backend_config": {"port": port.to_string(), "publicKey": key}});
    let b = tep(
        "tep-b",
        "b",
        "10.60.0.0/24",
        "10.61.0.0/24",
        tunnel("127.0.0.1", peer.port, &peer_key),
    );
    let silent_key = key_text::encode(&[7u8; 32]);
    let c = tep(
        "tep-c",
        "c",
        "10.70.0.0/24",
        "10.71.0.0/24",
        tunnel("127.0.0.2", 9, &silent_key),
    );
    let no_key = tep(
        "tep-nokey",
        "nokey",
        "10.80.0.0/24",
        "10.81.0.0/24",
        json!({"endpointIP": "127.0.0.3"}),
    );
    let bad_key = tep(
        "tep-badkey",
        "badkey",
        "10.90.0.0/24",
        "10.91.0.0/24",
        tunnel("127.0.0.4", 9, "not-a-key"),
    );
    // b's conncheck reaches us at our ExternalCIDR's first host, as Liqo's
    // NatMapping for b says.
    let conncheck = [("169.254.0.1", "192.168.0.1")];
    for object in [b, c, no_key, bad_key, nat_mapping("b", &conncheck)] {
        node.api.apply(object);
    }
    start(&mut node);

    // The key: created in the Secret, the public half published beside it.
    let secret = node
        .api
        .get("secrets", AGENT_NS, KEY_SECRET)
        .expect("the agent created its key Secret");
    let private = key_text::decode(&secret_text(&secret, "privateKey"))
        .expect("privateKey holds a base64 key");
    let public = *PublicKey::from(&StaticSecret::from(private)).as_bytes();
    assert_eq!(secret_text(&secret, "publicKey"), key_text::encode(&public));
    peer.answer(public);

    // Status, through the status subresource.
    wait_for("tep-b Connected", || {
        node.connection("liqo-tenant-b", "tep-b")["status"] == "Connected"
    });
    let connected = node.connection("liqo-tenant-b", "tep-b");
    assert_liqo_latency(&connected["latency"]);
    assert_eq!(connected["statusMessage"], "VPN connection established");
    assert_eq!(
        connected["peerConfiguration"],
        json!({"allowedIPs": "10.60.0.0/24, 10.61.0.0/24", "endpointIP": "127.0.0.1", "port": peer.port.to_string(), "publicKey": peer_key})
    );
    wait_for("tep-c Connecting", || {
        node.connection("liqo-tenant-c", "tep-c")["status"] == "Connecting"
    });
    let waiting = node.connection("liqo-tenant-c", "tep-c");
    assert_eq!(
        waiting["statusMessage"],
        "Waiting VPN connection to be established"
    );
    assert_eq!(waiting["latency"]["value"], "N/A");
    assert_eq!(waiting["peerConfiguration"]["endpointIP"], "127.0.0.2");
    // Four PINGs (8 s) without a PONG: Error, as Liqo says it.
    wait_for("tep-c Error once its conncheck is silent", || {
        node.connection("liqo-tenant-c", "tep-c")["status"] == "Error"
    });
    assert_eq!(
        node.connection("liqo-tenant-c", "tep-c")["statusMessage"],
        "No network connectivity towards remote cluster"
    );
    wait_for("tep-nokey Error", || {
        node.connection("liqo-tenant-nokey", "tep-nokey")["status"] == "Error"
    });
    assert_eq!(
        node.connection("liqo-tenant-nokey", "tep-nokey")["statusMessage"],
        "field backend_config.publicKey is missing: no tunnel to this peer"
    );
    wait_for("tep-badkey Error", || {
        node.connection("liqo-tenant-badkey", "tep-badkey")["status"] == "Error"
    });
    let bad_message = node.connection("liqo-tenant-badkey", "tep-badkey")["statusMessage"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        bad_message.starts_with("field backend_config.publicKey: \"not-a-key\""),
        "{bad_message}"
    );
    // The rejected object's NAT is not programmed; the three others are.
    assert_eq!(node.peers().len(), 6);

    // Every status write is a merge patch of status.connection only.
    for body in node.status_patches("tunnelendpoints") {
        let keys: Vec<&String> = body["status"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["connection"], "{body}");
        assert!(body.as_object().unwrap().len() == 1, "{body}");
    }

    // Events: one Warning per object in Error, naming the field.
    wait_for("two Events", || node.api.list("events").len() >= 2);
    for (name, field) in [
        ("tep-badkey", "backend_config.publicKey: \"not-a-key\""),
        ("tep-nokey", "backend_config.publicKey is missing"),
    ] {
        let events = node.api.list("events");
        let event = events
            .iter()
            .find(|e| e["regarding"]["name"] == name)
            .unwrap_or_else(|| panic!("no Event about {name}: {events:?}"));
        assert_eq!(
            (event["type"].as_str(), event["reason"].as_str()),
            (Some("Warning"), Some("Rejected"))
        );
        assert!(event["note"].as_str().unwrap().contains(field), "{event}");
        assert_eq!(event["regarding"]["kind"], "TunnelEndpoint");
        assert!(event["regarding"]["uid"].as_str().is_some(), "{event}");
    }

    // Nothing changed: passes go by and skip every object.
    let patches = node.requests("PATCH", "/status");
    let skipped = || sample(NS, "isthmus_status_writes_total{outcome=\"skipped\"}");
    let before = skipped();
    wait_for("three more status passes", || {
        skipped() >= before + 3.0 * 4.0
    });
    assert_eq!(
        node.requests("PATCH", "/status"),
        patches,
        "a status was rewritten though nothing changed"
    );

    // A fixed object clears its Error.
    let fixed_key = key_text::encode(&[9u8; 32]);
    node.api.apply(tep(
        "tep-badkey",
        "badkey",
        "10.90.0.0/24",
        "10.91.0.0/24",
        tunnel("127.0.0.4", 9, &fixed_key),
    ));
    wait_for("tep-badkey Connecting once fixed", || {
        node.connection("liqo-tenant-badkey", "tep-badkey")["status"] == "Connecting"
    });
    assert_eq!(node.peers().len(), 8);
}
