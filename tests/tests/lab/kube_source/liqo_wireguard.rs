//! `isthmus-agent liqo-wireguard`, as the `wireguard` container of a Liqo
//! v1 gateway pod (docs/design.md#liqo-v1-gateway-templates), with the
//! flags Liqo's client template renders: it carries the tunnel to the
//! test's peer from the PublicKey alone, creates the Connection and leaves
//! its status to Liqo's gateway container, and reads it for `liqo_peer_*`.

use super::{
    liqo_v1::{CONNECTION, TENANT, connection, connection_value, rome},
    test_peer::TestPeer,
    *,
};

/// The GatewayClient's UID, as Liqo's template passes it.
const GATEWAY_UID: &str = "7d2f4b8e-1a6e-4f5c-b1d9-0c3e8f2a9b44";

/// A private key where Liqo mounts the gateway's Secret: the raw 32 bytes.
/// Returns the directory and the public key.
fn keys_dir(ns: &str) -> (std::path::PathBuf, [u8; 32]) {
    let mut private = [0u8; 32];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut private).unwrap();
    let dir = std::env::temp_dir().join(format!("{ns}-keys"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("privateKey"), private).unwrap();
    (
        dir,
        *PublicKey::from(&StaticSecret::from(private)).as_bytes(),
    )
}

/// The ends of the tunnel, ours first, for a client or a server.
fn ends(server: bool) -> (&'static str, &'static str) {
    match server {
        true => ("169.254.18.1", "169.254.18.2"),
        false => ("169.254.18.2", "169.254.18.1"),
    }
}

/// Whether a conncheck PING to the peer's end of the tunnel comes back as
/// a PONG: data crossed the tunnel both ways.
fn pong_through_tunnel(ns: &str, server: bool) -> bool {
    let (ours, theirs) = ends(server);
    let socket = netns::run_in(ns, || UdpSocket::bind((ours, 0)))
        .unwrap()
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let ping = json!({"clusterID": "test", "msgType": "PING", "timestamp": "2026-11-28T01:00:00Z"});
    let _ = socket.send_to(&serde_json::to_vec(&ping).unwrap(), (theirs, 12345));
    let mut buf = [0u8; 512];
    let Ok(n) = socket.recv(&mut buf) else {
        return false;
    };
    serde_json::from_slice::<Value>(&buf[..n]).is_ok_and(|m| m["msgType"] == "PONG")
}

#[test]
fn as_liqos_wireguard_container_the_tunnel_follows_the_public_key_and_leaves_the_status_to_liqo() {
    const NS: &str = "ist-t-kube-v1wg";
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let (_, public_key) = rome(&peer);
    node.api.apply(public_key.clone());
    let (keys, public) = keys_dir(NS);
    let (keys_flag, port_flag) = (
        format!("--keys-dir={}", keys.display()),
        format!("--endpoint-port={}", peer.port),
    );
    // The client template's flags (one replica), the endpoint the test's peer's.
    node.start_liqo_wireguard(&[
        "--name=rome",
        &format!("--namespace={TENANT}"),
        "--remote-cluster-id=rome",
        &format!("--gateway-uid={GATEWAY_UID}"),
        "--mode=client",
        "--container-name=wireguard",
        "--mtu=1340",
        "--endpoint-address=127.0.0.1",
        &port_flag,
        "--leader-election=false",
        "--implementation=userspace",
        &keys_flag,
    ])
    .unwrap();
    peer.answer(public);

    // The device as Liqo's container makes it: the client's end, the MTU.
    let link =
        isthmus_lab::cmd::ip(NS, &["-4", "-o", "addr", "show", "dev", "liqo-tunnel"]).unwrap();
    assert!(link.contains("169.254.18.2/30"), "{link}");
    let details = isthmus_lab::cmd::ip(NS, &["-o", "link", "show", "dev", "liqo-tunnel"]).unwrap();
    assert!(details.contains("mtu 1340"), "{details}");

    // The Connection, as Liqo's wireguard container creates it: Connecting.
    wait_for("gw-rome Connecting", || {
        connection_value(&node) == "Connecting"
    });
    let created = connection(&node);
    assert_eq!(
        created["metadata"]["labels"],
        json!({"liqo.io/remote-cluster-id": "rome"})
    );
    assert_eq!(
        created["metadata"]["ownerReferences"],
        json!([{"apiVersion": "networking.liqo.io/v1beta1", "kind": "GatewayClient", "name": "rome", "uid": GATEWAY_UID}])
    );
    assert_eq!(created["spec"]["type"], "Client");
    assert_eq!(created["spec"]["gatewayRef"]["kind"], "WgGatewayClient");
    assert_eq!(created["spec"]["gatewayRef"]["uid"], GATEWAY_UID);

    // Data crosses: the peer's gateway answers a PING at its end.
    wait_for("a PONG through the tunnel", || {
        pong_through_tunnel(NS, false)
    });
    let liqo_connected = || {
        sample(
            NS,
            "liqo_peer_is_connected{driver=\"wireguard\",cluster_id=\"rome\"}",
        )
    };
    assert_eq!(liqo_connected(), 0.0, "Connecting is not connected");

    // Liqo's gateway container finds the peer: Connected, 379µs. The
    // metrics follow, and the container never sets it back.
    assert!(node.api.set_status(
        "connections",
        TENANT,
        CONNECTION,
        json!({"value": "Connected", "latency": {"value": "379µs", "timestamp": "2026-11-28T01:00:00Z"}}),
    ));
    wait_for("liqo_peer_is_connected 1", || liqo_connected() == 1.0);
    assert_eq!(
        sample(
            NS,
            "liqo_peer_latency_us{driver=\"wireguard\",cluster_id=\"rome\"}"
        ),
        379.0
    );
    assert_eq!(connection_value(&node), "Connected");

    // A forged PublicKey for the same peer: no peer, both named, until it goes.
    let mut forged = public_key.clone();
    forged["metadata"]["name"] = json!("rome-forged");
    forged["spec"]["publicKey"] = json!(key_text::encode(&[1; 32]));
    node.api.apply(forged);
    wait_for("both PublicKeys named", || {
        node.log()
            .contains("PublicKeys rome, rome-forged all carry liqo.io/remote-cluster-id=rome")
    });
    wait_for("no PONG while the peer is in doubt", || {
        !pong_through_tunnel(NS, false)
    });
    // Another peer's key, and one for rome that does not parse, take
    // nothing from rome once the forged one is gone.
    let mut milan = public_key.clone();
    milan["metadata"]["name"] = json!("gw-milan");
    milan["metadata"]["labels"]["liqo.io/remote-cluster-id"] = json!("milan");
    node.api.apply(milan);
    let mut garbled = public_key.clone();
    garbled["metadata"]["name"] = json!("rome-garbled");
    garbled["spec"]["publicKey"] = json!("A".repeat(100_000));
    node.api.apply(garbled);
    assert!(node.api.delete("publickeies", TENANT, "rome-forged"));
    wait_for("a PONG again", || pong_through_tunnel(NS, false));
    assert!(
        node.log().contains("rome-garbled"),
        "the garbled key is named"
    );
    let _ = fs::remove_dir_all(&keys);
}

#[test]
fn as_liqos_wireguard_container_of_a_server_the_tunnel_waits_for_the_peer_to_make_contact() {
    const NS: &str = "ist-t-kube-v1wgs";
    /// The GatewayServer's port, as Liqo's server template passes it.
    const LISTEN_PORT: u16 = 51840;
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let (_, public_key) = rome(&peer);
    node.api.apply(public_key);
    let (keys, public) = keys_dir(NS);
    node.start_liqo_wireguard(&[
        "--name=rome",
        &format!("--namespace={TENANT}"),
        "--remote-cluster-id=rome",
        &format!("--gateway-uid={GATEWAY_UID}"),
        "--mode=server",
        &format!("--listen-port={LISTEN_PORT}"),
        "--preserve-client-endpoint=true",
        &format!("--keys-dir={}", keys.display()),
    ])
    .unwrap();
    let link =
        isthmus_lab::cmd::ip(NS, &["-4", "-o", "addr", "show", "dev", "liqo-tunnel"]).unwrap();
    assert!(link.contains("169.254.18.1/30"), "{link}");
    wait_for("gw-rome Connecting", || {
        connection_value(&node) == "Connecting"
    });
    assert_eq!(
        connection(&node)["spec"]["gatewayRef"]["kind"],
        "WgGatewayServer"
    );
    // Nothing reaches a peer that has not made contact.
    assert!(!pong_through_tunnel(NS, true));
    peer.contact(public, (Ipv4Addr::LOCALHOST, LISTEN_PORT).into());
    wait_for("a PONG once the peer made contact", || {
        pong_through_tunnel(NS, true)
    });
    let _ = fs::remove_dir_all(&keys);
}
