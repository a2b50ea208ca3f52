//! A peer's sessions under attack: roaming and new keys, oversized
//! fragments naming our sessions, forged handshake responses.

use super::*;

/// An ICMP echo request from the outsider's network to a-pod2, which the
/// pod's kernel answers through the tunnel. (a-pod2 lives on the gateway,
/// which routes every tunnel peer's networks; the worker only knows the
/// lab's peers until the overlay lands.)
fn ping_a_pod2() -> Vec<u8> {
    Datagram::new(
        [10, 77, 0, 9],
        A.pod_addr(2).octets(),
        L4::Echo { id: 0x1234, seq: 1 },
    )
    .bytes()
}

#[test]
fn the_endpoint_roams_and_a_new_key_means_a_new_handshake() {
    let (mut outsider, object) = known_outsider();
    let gw = A.gw();

    // Roaming: the outsider now speaks from another port; a-gw's answer
    // (a-pod2's echo reply) must follow it there.
    let moved = netns::run_in(WAN_NS, || UdpSocket::bind(("203.0.113.99", 0)))
        .unwrap()
        .unwrap();
    moved
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = vec![0u8; 2048];
    if let TunnResult::WriteToNetwork(datagram) =
        outsider.tunn.encapsulate(&ping_a_pod2(), &mut buf)
    {
        moved.send_to(datagram, outsider.gateway).unwrap();
    }
    let start = Instant::now();
    let mut datagram = vec![0u8; 2048];
    let replied = loop {
        assert!(
            start.elapsed() < GIVE_UP,
            "a-gw never answered at the roamed endpoint"
        );
        let Ok((n, _)) = moved.recv_from(&mut datagram) else {
            continue;
        };
        if let TunnResult::WriteToTunnelV4(packet, source) =
            outsider.tunn.decapsulate(None, &datagram[..n], &mut buf)
        {
            break (packet[20], source);
        }
    };
    assert_eq!(
        replied,
        (0, A.pod_addr(2)),
        "expected a-pod2's echo reply (ICMP type 0)"
    );

    // New keys for the same TunnelEndpoint: a-gw handshakes with each new
    // one, and forgets the one it replaced.
    let old_secret = random_secret();
    let (mut old, old_public) = identity(outsider.gateway_public, old_secret);
    Outsider::register(outsider.port(), &old_public);
    eventually(GIVE_UP, "a-gw takes the second key", || {
        handshake(
            &outsider.socket,
            outsider.gateway,
            &mut old,
            Duration::from_millis(500),
        )
    });
    let (mut new, new_public) = identity(outsider.gateway_public, random_secret());
    Outsider::register(outsider.port(), &new_public);
    eventually(GIVE_UP, "a-gw takes the third key", || {
        handshake(
            &outsider.socket,
            outsider.gateway,
            &mut new,
            Duration::from_millis(500),
        )
    });
    let (mut old_again, _) = identity(outsider.gateway_public, old_secret);
    assert!(
        !handshake(
            &outsider.socket,
            outsider.gateway,
            &mut old_again,
            Duration::from_secs(2)
        ),
        "a-gw still accepts a key it was told to replace"
    );

    fs::remove_file(&object).unwrap();
    eventually(GIVE_UP, "a-gw drops the outsider", || {
        sample(&gw, "isthmus_peers ") == 1.0
    });
}

/// Our peers' indexes on a-gw (the upper 24 bits of a session's index), as
/// a WAN observer reads them: off the receiver index of the transport
/// messages a-gw's peers send it while a and b talk.
fn peer_indexes(gw: &str) -> Vec<u32> {
    let pcap = PathBuf::from(lab::STATE_DIR).join("peer-indexes.pcap");
    let filter = format!(
        "udp and dst host {} and dst port {TUNNEL_PORT}",
        A.wan_addr()
    );
    let tcpdump = capture::start(
        gw,
        "wan0",
        &["-s", "128", "-w", pcap.to_str().unwrap(), &filter],
        "peer-indexes",
    );
    a_and_b_work();
    capture::stop(tcpdump);
    let bytes = fs::read(&pcap).unwrap();
    // Ethernet, an IPv4 header without options, UDP: WireGuard at 42. A
    // transport message is type 4, with the receiver's index at 4..8.
    let mut indexes: Vec<u32> = capture::frames(&bytes)
        .iter()
        .filter_map(|frame| frame.get(42..50))
        .filter(|message| message[0] == 4)
        .map(|message| u32::from_le_bytes(message[4..8].try_into().unwrap()) >> 8)
        .collect();
    indexes.sort_unstable();
    indexes.dedup();
    assert!(!indexes.is_empty(), "no transport message reached {gw}");
    indexes
}

/// a-pod1 reaches b-pod1 and back, and a-gw says it is healthy.
fn a_and_b_work() {
    let b_pod1 = std::net::Ipv4Addr::from(B_POD1);
    for proto in [Proto::Udp, Proto::Tcp] {
        probe::exchange(proto, &A.pod(1), &B.pod(1), b_pod1)
            .unwrap_or_else(|e| panic!("a-pod1 no longer reaches b-pod1: {e:#}"));
    }
    let (status, body) = lab::http_get(&A.gw(), "/healthz").unwrap();
    assert_eq!((status, body.trim()), (200, "ok"), "a-gw's /healthz");
}

#[test]
fn oversized_fragmented_transport_messages_naming_our_sessions_change_nothing() {
    let outsider = Outsider::new();
    let gw = A.gw();
    a_and_b_work();
    let restarts = || sample(&gw, "isthmus_tunnel_thread_restarts_total");
    let rejected = || {
        sample(
            &gw,
            "isthmus_tunnel_dropped_packets_total{reason=\"rejected\"}",
        )
    };
    let (restarts_before, rejected_before) = (restarts(), rejected());
    // Every session index of every peer, on 3,000 bytes: fragmented on the
    // WAN, reassembled by a-gw's stack, longer than the old decrypt buffer.
    let mut sent = 0.0;
    for index in peer_indexes(&gw) {
        for session in 0..=255u32 {
            let datagram = forged_transport((index << 8) | session, 3000);
            outsider
                .socket
                .send_to(&datagram, outsider.gateway)
                .unwrap();
            sent += 1.0;
        }
    }
    eventually(GIVE_UP, "a-gw rejects every forged message", || {
        rejected() >= rejected_before + sent
    });
    assert_eq!(restarts(), restarts_before, "a datapath thread panicked");
    a_and_b_work();
}

#[test]
fn forged_handshake_responses_do_not_take_a_peers_traffic() {
    let outsider = Outsider::new();
    let gw = A.gw();
    a_and_b_work();
    // 250 per peer index at once: past the 200 handshake messages a second
    // the gateway's one limiter lets through, the last ones are answered
    // with cookie replies.
    for index in peer_indexes(&gw) {
        let forged = forged_response(&outsider.gateway_public, index << 8);
        for _ in 0..250 {
            outsider.socket.send_to(&forged, outsider.gateway).unwrap();
        }
    }
    let mut cookies = 0;
    let mut datagram = [0u8; 2048];
    while let Ok((n, _)) = outsider.socket.recv_from(&mut datagram) {
        assert_ne!(
            datagram[0], 4,
            "a-gw sent a peer's transport data to the stranger"
        );
        cookies += usize::from(n == 64 && datagram[0] == 3);
    }
    assert!(
        cookies > 0,
        "a-gw answered no forged response with a cookie: the test proves nothing"
    );
    // Traffic for b still goes to b, and none reaches the stranger.
    a_and_b_work();
    outsider
        .socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while let Ok((_, _)) = outsider.socket.recv_from(&mut datagram) {
        assert_ne!(
            datagram[0], 4,
            "a-gw sent a peer's transport data to the stranger"
        );
    }
}
