//! The datapath between real boringtun sessions: what is delivered,
//! dropped and counted, and forged input that must change nothing.

use std::time::Instant;

use boringtun::x25519::{PublicKey, StaticSecret};

use super::*;
use crate::{
    model::object::ObjectKey,
    tunnel::{
        HANDSHAKE_LIMIT,
        peers::PeerConfig,
        timers::{Retries, retry_first_contact, run_timers},
    },
};

/// Our gateway's tunnel with one peer, the peer's own state machine
/// and socket, and our socket, all on loopback.
struct Pair {
    shared: Arc<Shared>,
    ours: UdpSocket,
    remote: Tunn,
    remote_socket: UdpSocket,
    bufs: Buffers,
}

/// A socket bound to `at`: "[::]:0" takes both families.
fn bound(at: &str) -> UdpSocket {
    let socket = UdpSocket::bind(at).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    socket
}

fn loopback() -> UdpSocket {
    bound("127.0.0.1:0")
}

fn addr(socket: &UdpSocket) -> SocketAddr {
    socket.local_addr().unwrap()
}

impl Pair {
    /// A remote whose endpoint we know: we are its client.
    fn new() -> Self {
        Self::with_known_endpoint(true)
    }

    /// A remote whose endpoint we know, or one we serve (`known` false),
    /// which makes contact itself.
    fn with_known_endpoint(known: bool) -> Self {
        Self::between("127.0.0.1:0", "127.0.0.1:0", known)
    }

    /// A remote we know at an IPv6 address, our socket taking both
    /// families as the tunnel's does.
    fn over_ipv6() -> Self {
        Self::between("[::]:0", "[::1]:0", true)
    }

    /// Our socket bound to `ours`, the remote's to `theirs`.
    fn between(ours: &str, theirs: &str, known: bool) -> Self {
        let our_secret = StaticSecret::from([1u8; 32]);
        let remote_secret = StaticSecret::from([2u8; 32]);
        let our_public = PublicKey::from(&our_secret);
        let key = crate::tunnel::key::KeyPair {
            private: our_secret.clone(),
            public: our_public,
        };
        let shared = Arc::new(Shared::new(key, 1420));
        let remote_socket = bound(theirs);
        let config = PeerConfig {
            key: ObjectKey {
                namespace: "liqo-tenant-b".into(),
                name: "b".into(),
            },
            label: "b".into(),
            cluster_name: "b".into(),
            public: *PublicKey::from(&remote_secret).as_bytes(),
            endpoint: known.then(|| addr(&remote_socket)),
            networks: ["10.77.0.0/24", "fd00:77::/64"]
                .map(|n| n.parse().unwrap())
                .to_vec(),
        };
        let networks = config.networks.clone();
        let peer = Arc::new(TunnelPeer::new(
            config,
            5,
            &our_secret,
            None,
            shared.limiter(),
        ));
        shared.set_snapshot(PeerSet::new([(peer, networks)]));
        let remote = Tunn::new(remote_secret, our_public, None, None, 0x99, None);
        let bufs = Buffers::new(&shared);
        Self {
            shared,
            ours: bound(ours),
            remote,
            remote_socket,
            bufs,
        }
    }

    fn peer(&self) -> Arc<TunnelPeer> {
        self.shared.snapshot().iter().next().unwrap().clone()
    }

    /// Hands `datagram` to our gateway as if it came from `source`.
    fn receive(&mut self, datagram: &[u8], source: SocketAddr) -> Option<Vec<u8>> {
        let peers = self.shared.snapshot();
        let receiver = Receiver {
            shared: &self.shared,
            peers: &peers,
            udp: &self.ours,
        };
        let len = receiver.receive(
            datagram,
            source,
            &mut self.bufs.packet,
            &mut self.bufs.scratch,
        )?;
        Some(self.bufs.packet[VNET_HDR_LEN..VNET_HDR_LEN + len].to_vec())
    }

    /// What our gateway sent to the remote's socket.
    fn answer(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let (n, _) = self.remote_socket.recv_from(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// The remote initiates; our gateway answers; the remote confirms.
    fn handshake(&mut self) {
        let mut buf = vec![0u8; 2048];
        let TunnResult::WriteToNetwork(init) =
            self.remote.format_handshake_initiation(&mut buf, false)
        else {
            panic!("no initiation");
        };
        let (init, from) = (init.to_vec(), addr(&self.remote_socket));
        assert_eq!(self.receive(&init, from), None);
        let response = self.answer();
        let TunnResult::WriteToNetwork(keepalive) =
            self.remote.decapsulate(None, &response, &mut buf)
        else {
            panic!("the response did not complete the handshake");
        };
        let keepalive = keepalive.to_vec();
        assert_eq!(self.receive(&keepalive, from), None);
    }

    /// Hands `packet` from TUN to our gateway's sender; returns whether
    /// anything was queued for the remote.
    fn send(&self, packet: &[u8]) -> bool {
        let sender = Sender {
            shared: &self.shared,
            udp: &self.ours,
        };
        let mut outgoing = SendBatch::new(self.shared.max_sent());
        sender.encrypt(
            &self.peer(),
            addr(&self.remote_socket),
            packet,
            &mut outgoing,
        );
        !outgoing.is_empty()
    }

    /// `packet` encrypted by the remote.
    fn sealed(&mut self, packet: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; packet.len() + 64];
        match self.remote.encapsulate(packet, &mut buf) {
            TunnResult::WriteToNetwork(datagram) => datagram.to_vec(),
            _ => panic!("no session to encrypt with"),
        }
    }
}

/// A WireGuard message of type `kind`, `len` bytes of garbage after it.
fn message(kind: u8, len: usize) -> Vec<u8> {
    let mut m = vec![0x5au8; len];
    m[0] = kind;
    m
}

/// An IPv4 packet of `len` bytes from `src`, with a zeroed payload.
fn ipv4(src: [u8; 4], len: usize) -> Vec<u8> {
    let mut packet = vec![0u8; len];
    packet[0] = 0x45;
    packet[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    packet[8] = 64;
    packet[9] = 17;
    packet[12..16].copy_from_slice(&src);
    packet[16..20].copy_from_slice(&[10, 244, 0, 5]);
    packet
}

/// An IPv6 packet of 100 bytes from `src` to `dst`, a UDP header after it.
fn ipv6(src: &str, dst: &str) -> Vec<u8> {
    let mut packet = vec![0u8; 100];
    packet[0] = 0x60;
    packet[4..6].copy_from_slice(&60u16.to_be_bytes());
    packet[6] = 17;
    packet[7] = 64;
    packet[8..24].copy_from_slice(&src.parse::<std::net::Ipv6Addr>().unwrap().octets());
    packet[24..40].copy_from_slice(&dst.parse::<std::net::Ipv6Addr>().unwrap().octets());
    packet
}

/// A router advertisement, as a peer's router would send it to every node
/// of a link: from a link-local address to all nodes, hop limit 255.
fn router_advertisement() -> Vec<u8> {
    let mut packet = vec![0u8; 40 + 16];
    packet[0] = 0x60;
    packet[4..6].copy_from_slice(&16u16.to_be_bytes());
    packet[6] = 58;
    packet[7] = 255;
    packet[8..24].copy_from_slice(&"fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    packet[24..40].copy_from_slice(&"ff02::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    packet[40] = 134;
    packet
}

#[test]
fn a_router_advertisement_a_peer_sends_through_the_tunnel_reaches_no_device() {
    let mut pair = Pair::new();
    pair.handshake();
    let from = addr(&pair.remote_socket);
    let sealed = pair.sealed(&router_advertisement());
    assert_eq!(pair.receive(&sealed, from), None, "written to TUN");
    let peer = pair.peer();
    assert_eq!(peer.counters.dropped_source.load(Ordering::Relaxed), 1);
    assert_eq!(peer.counters.rx_packets.load(Ordering::Relaxed), 0);
    // It was authentic: the peer's session goes on.
    assert_eq!(pair.shared.counters.rejected.load(Ordering::Relaxed), 0);
    let datagram = pair.sealed(&ipv4([10, 77, 0, 9], 100));
    assert_eq!(pair.receive(&datagram, from).map(|p| p.len()), Some(100));
}

#[test]
fn ipv6_packets_from_the_peers_networks_are_delivered_and_none_bound_for_a_link() {
    let mut pair = Pair::new();
    pair.handshake();
    let from = addr(&pair.remote_socket);
    let routed = pair.sealed(&ipv6("fd00:77::9", "fd00:10:244::5"));
    assert_eq!(pair.receive(&routed, from).map(|p| p.len()), Some(100));
    for (src, dst) in [
        ("fd00:77::9", "ff02::1"),
        ("fd00:77::9", "ff05::2"),
        ("fd00:77::9", "fe80::1"),
        ("fd00:77::9", "::1"),
        ("fd00:78::9", "fd00:10:244::5"),
        ("fe80::9", "fd00:10:244::5"),
    ] {
        let sealed = pair.sealed(&ipv6(src, dst));
        assert_eq!(pair.receive(&sealed, from), None, "{src} → {dst}");
    }
    let peer = pair.peer();
    assert_eq!(peer.counters.dropped_source.load(Ordering::Relaxed), 6);
    assert_eq!(peer.counters.rx_packets.load(Ordering::Relaxed), 1);
}

#[test]
fn a_peer_over_an_ipv6_wan_handshakes_carries_both_families_and_roams_within_ipv6() {
    let mut pair = Pair::over_ipv6();
    pair.handshake();
    let from = addr(&pair.remote_socket);
    assert!(from.is_ipv6());
    for packet in [
        ipv4([10, 77, 0, 9], 100),
        ipv6("fd00:77::9", "fd00:10:244::5"),
    ] {
        let sealed = pair.sealed(&packet);
        assert_eq!(pair.receive(&sealed, from).map(|p| p.len()), Some(100));
    }
    assert_eq!(pair.peer().endpoint(), Some(from));
    // Our answer reaches it over IPv6.
    assert!(pair.send(&ipv4([10, 244, 0, 5], 100)));
    let moved: SocketAddr = "[::1]:40001".parse().unwrap();
    let sealed = pair.sealed(&ipv4([10, 77, 0, 9], 100));
    assert!(pair.receive(&sealed, moved).is_some());
    assert_eq!(pair.peer().endpoint(), Some(moved));
}

#[test]
fn an_oversized_forged_transport_message_is_rejected_without_a_panic() {
    let mut pair = Pair::new();
    pair.handshake();
    let genuine = pair.sealed(&ipv4([10, 77, 0, 9], 100));
    // Our session's receiver index, as a WAN observer reads it off a
    // genuine message, on 2,064 bytes and more of garbage.
    for len in [2064, 9000, MAX_DATAGRAM] {
        let mut forged = vec![0xa5u8; len];
        forged[..16].copy_from_slice(&genuine[..16]);
        let stranger = "203.0.113.99:40000".parse().unwrap();
        assert_eq!(pair.receive(&forged, stranger), None);
        assert_eq!(pair.peer().endpoint(), Some(addr(&pair.remote_socket)));
    }
    assert_eq!(pair.shared.counters.rejected.load(Ordering::Relaxed), 3);
    // The session still works.
    let from = addr(&pair.remote_socket);
    assert_eq!(pair.receive(&genuine, from).map(|p| p.len()), Some(100));
}

#[test]
fn a_packet_from_tun_too_big_for_one_datagram_is_dropped_and_counted() {
    let mut pair = Pair::new();
    pair.handshake();
    let largest = pair.shared.max_sent() - OVERHEAD;
    assert!(
        !pair.send(&ipv4([10, 244, 0, 5], largest + 1)),
        "the oversized packet was encrypted"
    );
    let oversized = || pair.shared.counters.oversized.load(Ordering::Relaxed);
    assert_eq!(oversized(), 1);
    assert!(
        pair.send(&ipv4([10, 244, 0, 5], largest)),
        "the largest packet that fits was not"
    );
    assert_eq!(oversized(), 1);
}

#[test]
fn data_for_a_silent_peer_starts_no_handshake_while_it_waits_and_flows_once_it_answers() {
    let mut pair = Pair::new();
    let peer = pair.peer();
    let packet = ipv4([10, 244, 0, 5], 100);
    // Its first round of handshakes went unanswered: data waits.
    peer.silence.round_given_up(clock_ns());
    assert!(!pair.send(&packet), "data started a round of handshakes");
    let silent_drops = || peer.counters.dropped_silent.load(Ordering::Relaxed);
    assert_eq!(silent_drops(), 1);
    assert_eq!(peer.counters.initiations.load(Ordering::Relaxed), 0);
    // The peer initiates meanwhile, and is answered: its data goes at once.
    pair.handshake();
    assert!(pair.send(&packet), "data for a peer with a session waited");
    assert_eq!(silent_drops(), 1);
    // Without a wait, data for a peer without a session starts a round.
    let fresh = Pair::new();
    assert!(fresh.send(&packet));
    let initiations = fresh.peer().counters.initiations.load(Ordering::Relaxed);
    assert_eq!(initiations, 1);
}

#[test]
fn a_peer_with_jumbo_frames_is_heard_whole() {
    let mut pair = Pair::new();
    pair.handshake();
    let datagram = pair.sealed(&ipv4([10, 77, 0, 9], 9000));
    let from = addr(&pair.remote_socket);
    assert_eq!(pair.receive(&datagram, from).map(|p| p.len()), Some(9000));
}

#[test]
fn replayed_handshake_responses_do_not_move_the_peer() {
    let mut pair = Pair::new();
    let home = addr(&pair.remote_socket);
    // Our gateway initiates; the remote's response completes the
    // handshake when it arrives from home.
    let mut buf = vec![0u8; 2048];
    let init = match lock(&pair.peer()).format_handshake_initiation(&mut buf, false) {
        TunnResult::WriteToNetwork(init) => init.to_vec(),
        _ => panic!("no initiation"),
    };
    let response = match pair.remote.decapsulate(None, &init, &mut buf) {
        TunnResult::WriteToNetwork(response) => response.to_vec(),
        _ => panic!("no response"),
    };
    assert_eq!(pair.receive(&response, home), None);
    // Our keepalive lets the responder send.
    let keepalive = pair.answer();
    assert!(matches!(
        pair.remote.decapsulate(None, &keepalive, &mut buf),
        TunnResult::Done
    ));
    // A stranger replays it: mac1 holds, and past the gateway's limit
    // boringtun answers with cookies.
    let stranger_socket = loopback();
    let stranger = addr(&stranger_socket);
    for _ in 0..=HANDSHAKE_LIMIT {
        assert_eq!(pair.receive(&response, stranger), None);
    }
    let mut cookie = [0u8; 128];
    let (n, _) = stranger_socket
        .recv_from(&mut cookie)
        .expect("boringtun answered no replayed response with a cookie");
    assert_eq!((n, cookie[0]), (64, MESSAGE_COOKIE_REPLY));
    assert_eq!(
        pair.peer().endpoint(),
        Some(home),
        "a cookie reply moved the peer"
    );
    // A transport message that decrypts is what moves it.
    let datagram = pair.sealed(&ipv4([10, 77, 0, 9], 60));
    let roamed = "127.0.0.1:40001".parse().unwrap();
    assert!(pair.receive(&datagram, roamed).is_some());
    assert_eq!(pair.peer().endpoint(), Some(roamed));
}

#[test]
fn a_peer_we_serve_gets_nothing_before_it_makes_contact_and_is_answered_where_it_is() {
    let mut pair = Pair::with_known_endpoint(false);
    let peer = pair.peer();
    assert_eq!(peer.endpoint(), None);
    // No first contact of ours, no timer's message: nowhere to send them.
    let mut buf = vec![0u8; 2048];
    let later = Instant::now() + Duration::from_secs(1);
    assert!(!retry_first_contact(&peer, &pair.ours, &mut buf, later));
    run_timers(&peer, &pair.ours, &mut buf, &mut Retries::default(), later);
    pair.remote_socket.set_nonblocking(true).unwrap();
    assert!(
        pair.remote_socket.recv_from(&mut buf).is_err(),
        "something was sent to a peer that made no contact"
    );
    pair.remote_socket.set_nonblocking(false).unwrap();
    // Forged and oversized initiations from a stranger give it no endpoint.
    let stranger = "203.0.113.99:40000".parse().unwrap();
    for forged in [message(1, 148), message(1, 2048), message(4, 64)] {
        assert_eq!(pair.receive(&forged, stranger), None);
        assert_eq!(peer.endpoint(), None, "a forged datagram drew the peer");
    }
    // It initiates; the answer goes where it initiated from, and so does
    // everything after.
    pair.handshake();
    let home = addr(&pair.remote_socket);
    assert_eq!(peer.endpoint(), Some(home));
    let datagram = pair.sealed(&ipv4([10, 77, 0, 9], 100));
    assert_eq!(pair.receive(&datagram, home).map(|p| p.len()), Some(100));
}

#[test]
fn a_thread_that_panics_is_restarted_and_unhealthy_meanwhile() {
    let pair = Pair::new();
    let shared = pair.shared.clone();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = runs.clone();
    let thread = shared
        .spawn_supervised("test".into(), move |shared| {
            assert!(
                seen.fetch_add(1, Ordering::SeqCst) != 0,
                "a datagram made a library panic"
            );
            shared.stop.store(true, Ordering::SeqCst);
        })
        .unwrap();
    // Down for the restart delay: long enough to be seen here.
    let deadline = Instant::now() + Duration::from_secs(5);
    while shared.down.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline && runs.load(Ordering::SeqCst) < 2,
            "the thread was never seen down"
        );
        std::thread::yield_now();
    }
    thread.join().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "not run again");
    assert_eq!(shared.counters.thread_restarts.load(Ordering::Relaxed), 1);
    assert_eq!(shared.down.load(Ordering::SeqCst), 0);
}
