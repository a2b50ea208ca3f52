//! Liqo's conncheck, both ways, in the lab. Every gateway
//! answers PINGs at 169.254.0.1:12345 behind its NatMappings' entry, PINGs
//! each peer's ExternalCIDR first host, and exports the round trip under
//! Liqo's metric names; five silent intervals mark the peer disconnected.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::Duration,
};

use isthmus_lab::{
    lab, netns,
    topology::{A, B, CONNCHECK_ADDR, NAT_MAPPING, PEERINGS},
};
use isthmus_tests::{eventually, require_lab};

/// A PING every 2 s, and Error after 4 unanswered: 8 s, and margin.
const SILENCE: Duration = Duration::from_secs(20);

fn liqo_metric(node: &str, name: &str, cluster_id: &str) -> Option<f64> {
    lab::metric_sum(node, name, &[("cluster_id", cluster_id)]).ok()
}

fn connected(node: &str, cluster_id: &str) -> bool {
    liqo_metric(node, "liqo_peer_is_connected", cluster_id) == Some(1.0)
}

#[test]
fn every_gateway_measures_every_peer_with_the_conncheck() {
    require_lab();
    for p in &PEERINGS {
        let (gw, peer) = (p.local.gw(), format!("cluster-{}", p.remote.name));
        eventually(SILENCE, &format!("{gw} reaches {peer}'s conncheck"), || {
            connected(&gw, &peer)
        });
        let latency = liqo_metric(&gw, "liqo_peer_latency_us", &peer).unwrap();
        assert!(
            latency > 0.0 && latency < 100_000.0,
            "{gw}: liqo_peer_latency_us for {peer} is {latency}"
        );
        let sent = liqo_metric(&gw, "liqo_peer_transmit_bytes_total", &peer).unwrap();
        assert!(sent > 0.0, "{gw}: nothing sent to {peer}");
    }
}

/// A PING exactly as a Liqo v0.10 gateway marshals it, from b-pod1 to the
/// address b's NatMapping view gives a-gw's conncheck (10.0.41.1): a-gw
/// answers the same message as PONG, from that address, after ignoring
/// garbage and oversized datagrams.
#[test]
fn a_liqo_ping_through_the_natmapping_is_answered_and_garbage_is_not() {
    require_lab();
    let a_from_b = PEERINGS
        .iter()
        .find(|p| p.local.name == "a" && p.remote.name == "b")
        .unwrap();
    let target = (a_from_b.conncheck_external(), 12345);
    assert_eq!(target.0, Ipv4Addr::new(10, 0, 41, 1));
    let ping = br#"{"clusterID":"cluster-a","msgType":"PING","timeStamp":"2024-03-01T10:20:30.123456789+01:00"}"#;
    let pong = netns::run_in(&B.pod(1), || -> std::io::Result<Vec<u8>> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.connect(target)?;
        socket.set_read_timeout(Some(Duration::from_millis(300)))?;
        let mut buf = [0u8; 2048];
        for garbage in [
            &b"not json"[..],
            &[b'{'; 1400][..],
            br#"{"msgType":"PONG"}"#,
        ] {
            socket.send(garbage)?;
            assert!(socket.recv(&mut buf).is_err(), "answered {garbage:?}");
        }
        for _ in 0..10 {
            socket.send(ping)?;
            if let Ok(n) = socket.recv(&mut buf) {
                return Ok(buf[..n].to_vec());
            }
        }
        Err(std::io::Error::other("no PONG in 10 tries"))
    })
    .unwrap()
    .unwrap();
    let pong: serde_json::Value = serde_json::from_slice(&pong).unwrap();
    assert_eq!(
        pong,
        serde_json::json!({"clusterID": "cluster-a", "msgType": "PONG", "timeStamp": "2024-03-01T10:20:30.123456789+01:00"})
    );
}

/// The conncheck's address is the gateway itself: through it a peer
/// reaches the conncheck's port and nothing else the gateway listens on.
#[test]
fn a_peer_reaches_no_other_port_of_the_gateway_through_the_conncheck_address() {
    require_lab();
    let port = isthmus_lab::probe::next_port();
    let listener = netns::run_in(&A.gw(), || std::net::TcpListener::bind(("0.0.0.0", port)))
        .unwrap()
        .unwrap();
    listener.set_nonblocking(true).unwrap();
    let denied = || {
        lab::metric_sum(
            &A.gw(),
            "isthmus_peer_denied_packets_total",
            &[("cluster_id", "cluster-b"), ("reason", "node_address")],
        )
        .unwrap_or(0.0)
    };
    let before = denied();
    let target = (Ipv4Addr::new(10, 0, 41, 1), port);
    let connected = netns::run_in(&B.pod(1), || {
        std::net::TcpStream::connect_timeout(&target.into(), Duration::from_millis(500))
    })
    .unwrap();
    assert!(connected.is_err(), "b-pod1 reached a-gw's TCP port {port}");
    assert!(listener.accept().is_err(), "a-gw accepted b-pod1");
    assert!(
        denied() > before,
        "a-gw did not count the attempt as denied"
    );
}

/// Without its NatMapping's 169.254.0.1 entry, b-gw leaves a-gw's PINGs
/// unanswered: a-gw marks b disconnected after four intervals, and
/// connected again once the entry is back.
#[test]
fn without_the_natmapping_entry_the_peer_falls_silent_and_comes_back() {
    require_lab();
    eventually(SILENCE, "a-gw reaches b's conncheck", || {
        connected("a-gw", "cluster-b")
    });
    let entry = format!(
        "    {CONNCHECK_ADDR}: {}\n",
        NAT_MAPPING.peering().conncheck_external()
    );
    let full = NAT_MAPPING.yaml(&[NAT_MAPPING.entry()]);
    assert!(full.contains(&entry), "{full}");
    for (node, _) in B.nodes() {
        lab::write_object(&node, &NAT_MAPPING.file_name(), &full.replace(&entry, "")).unwrap();
    }
    eventually(SILENCE, "a-gw marks b disconnected", || {
        !connected("a-gw", "cluster-b")
    });
    assert_eq!(
        liqo_metric("a-gw", "liqo_peer_latency_us", "cluster-b"),
        None,
        "a disconnected peer has no latency, as in Liqo"
    );
    lab::write_nat_mapping(&[NAT_MAPPING.entry()]).unwrap();
    eventually(SILENCE, "a-gw reaches b again", || {
        connected("a-gw", "cluster-b")
    });
}
