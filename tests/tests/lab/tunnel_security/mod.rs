//! The tunnel's security properties, asserted against a-gw in the lab by an
//! outside party on the WAN that speaks WireGuard (boringtun as a client).

mod flood;
mod sessions;

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    path::PathBuf,
    time::{Duration, Instant},
};

use boringtun::{
    noise::{Tunn, TunnResult},
    x25519::{PublicKey, StaticSecret},
};
use isthmus_agent::model::key_text;
use isthmus_lab::{
    cmd::{ip, run},
    lab, netns,
    objects::TunnelEndpoint,
    probe::{self, Proto, next_port},
    stream::UdpStream,
    topology::{A, B, C, Cluster, TUNNEL_PORT, WAN_NS},
};
use isthmus_tests::{
    addrs::B_POD1,
    capture, eventually,
    metrics::sample,
    packet::{Datagram, L4},
    require_lab,
    wireguard::{forged_response, forged_transport},
};

/// An address of the test's own on the WAN bridge.
const OUTSIDER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 99);
const GIVE_UP: Duration = Duration::from_secs(10);

/// A key pair and a WireGuard state machine for it, towards a-gw.
fn identity(gateway_public: [u8; 32], secret: [u8; 32]) -> (Tunn, [u8; 32]) {
    let private = StaticSecret::from(secret);
    let public = *PublicKey::from(&private).as_bytes();
    (
        Tunn::new(
            private,
            PublicKey::from(gateway_public),
            None,
            None,
            0x77,
            None,
        ),
        public,
    )
}

fn random_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    let mut urandom = fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut urandom, &mut secret).unwrap();
    secret
}

/// Starts a handshake over `socket` and answers everything a-gw sends until
/// `tunn` has a session or `wait` passes, sending the initiation again
/// whenever nothing came for the socket's read timeout (after a cookie,
/// say). Returns whether it has one.
fn handshake(socket: &UdpSocket, gateway: SocketAddr, tunn: &mut Tunn, wait: Duration) -> bool {
    let mut buf = vec![0u8; 2048];
    let mut initiate = |tunn: &mut Tunn, again| {
        if let TunnResult::WriteToNetwork(init) = tunn.format_handshake_initiation(&mut buf, again)
        {
            socket.send_to(init, gateway).unwrap();
        }
    };
    initiate(tunn, false);
    let start = Instant::now();
    let mut datagram = vec![0u8; 2048];
    let mut buf = vec![0u8; 2048];
    while start.elapsed() < wait {
        let Ok((n, from)) = socket.recv_from(&mut datagram) else {
            initiate(tunn, true);
            continue;
        };
        let mut result = tunn.decapsulate(Some(from.ip()), &datagram[..n], &mut buf);
        while let TunnResult::WriteToNetwork(reply) = result {
            socket.send_to(reply, from).unwrap();
            result = tunn.decapsulate(None, &[], &mut buf);
        }
        if tunn.stats().0.is_some() {
            return true;
        }
    }
    false
}

pub(crate) struct Outsider {
    address: Ipv4Addr,
    socket: UdpSocket,
    tunn: Tunn,
    pub(crate) public: [u8; 32],
    gateway: SocketAddr,
    gateway_public: [u8; 32],
}

impl Outsider {
    pub(crate) fn new() -> Self {
        Self::towards(&A)
    }

    /// An outsider with a key of its own that `cluster`'s gateway does not
    /// know, on the WAN.
    fn towards(cluster: &Cluster) -> Self {
        Self::at(OUTSIDER, cluster)
    }

    /// As [`Outsider::towards`], at `address` on the WAN.
    fn at(address: Ipv4Addr, cluster: &Cluster) -> Self {
        require_lab();
        let cidr = format!("{address}/24");
        let _ = ip(WAN_NS, &["addr", "del", &cidr, "dev", "br0"]);
        ip(WAN_NS, &["addr", "add", &cidr, "dev", "br0"]).unwrap();
        let socket = netns::run_in(WAN_NS, || UdpSocket::bind((address, 0)))
            .unwrap()
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let gateway_public = key_text::decode(&lab::public_key(&cluster.gw()).unwrap()).unwrap();
        let (tunn, public) = identity(gateway_public, random_secret());
        let gateway = SocketAddr::from((cluster.wan_addr(), TUNNEL_PORT));
        Self {
            address,
            socket,
            tunn,
            public,
            gateway,
            gateway_public,
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.socket.local_addr().unwrap().port()
    }

    /// Handshakes with a-gw on the outsider's socket.
    pub(crate) fn handshake(&mut self, wait: Duration) -> bool {
        handshake(&self.socket, self.gateway, &mut self.tunn, wait)
    }

    /// Makes a-gw know the outsider as peer `tep-outsider`, with networks
    /// 10.77.0.0/24 and 10.78.0.0/24, endpoint `port`, and `public` key.
    fn register(port: u16, public: &[u8; 32]) -> PathBuf {
        Self::register_at(SocketAddrV4::new(OUTSIDER, port), public)
    }

    /// As [`Outsider::register`], with the endpoint `endpoint`.
    fn register_at(endpoint: SocketAddrV4, public: &[u8; 32]) -> PathBuf {
        Self::write_object(Self::object(endpoint, public))
    }

    /// As [`Outsider::register`], the outsider also having the IPv6
    /// networks `fd00:77::/64` and `fd00:78::/64`, and a-gw its own.
    pub(crate) fn register_dual_stack(port: u16, public: &[u8; 32]) -> PathBuf {
        let ours = [A.pod_cidr6, "None", A.external_cidr6, "None"];
        let theirs = ["fd00:77::/64", "None", "fd00:78::/64", "None"];
        let object = Self::object(SocketAddrV4::new(OUTSIDER, port), public);
        Self::write_object(object.ipv6(ours, theirs))
    }

    /// Its TunnelEndpoint, reached at `endpoint`, with `public` key.
    fn object(endpoint: SocketAddrV4, public: &[u8; 32]) -> TunnelEndpoint {
        TunnelEndpoint::new("tep-outsider", "liqo-tenant-outsider")
            .cluster_id("cluster-outsider")
            .remote(["10.77.0.0/24", "None", "10.78.0.0/24", "None"])
            .endpoint(endpoint.ip().to_string())
            .port(endpoint.port())
            .public_key(&key_text::encode(public))
    }

    /// Writes `object` into a-gw's object directory; returns its path.
    fn write_object(object: TunnelEndpoint) -> PathBuf {
        let object_file = lab::object_dir(&A.gw()).join("peer-outsider.yaml");
        fs::write(&object_file, object.to_string()).unwrap();
        object_file
    }

    pub(crate) fn send_inner(&mut self, packet: &[u8]) {
        let mut buf = vec![0u8; 2048];
        if let TunnResult::WriteToNetwork(datagram) = self.tunn.encapsulate(packet, &mut buf) {
            self.socket.send_to(datagram, self.gateway).unwrap();
        }
    }
}

impl Drop for Outsider {
    fn drop(&mut self) {
        let cidr = format!("{}/24", self.address);
        let _ = ip(WAN_NS, &["addr", "del", &cidr, "dev", "br0"]);
    }
}

/// An outsider a-gw knows as a peer, with a session up, and its object file.
fn known_outsider() -> (Outsider, PathBuf) {
    let mut outsider = Outsider::new();
    let object = Outsider::register(outsider.port(), &outsider.public);
    eventually(GIVE_UP, "a-gw programs the outsider", || {
        sample(&A.gw(), "isthmus_peers ") == 2.0
    });
    assert!(
        outsider.handshake(GIVE_UP),
        "no handshake with a-gw as a known peer"
    );
    (outsider, object)
}

/// A file that makes a-gw expect a peer at the outsider's address, with
/// some other key: the outsider's datagrams reach the tunnel (the XDP
/// guard, where it runs, lets them through too), which must then turn the
/// stranger's key away itself.
struct Impostor(PathBuf);

impl Impostor {
    fn of(outsider: &Outsider) -> Self {
        let object = Outsider::register(outsider.port(), &[0x42; 32]);
        eventually(GIVE_UP, "a-gw programs the expected peer", || {
            sample(&A.gw(), "isthmus_peers ") == 2.0
        });
        Self(object)
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn a_key_we_do_not_know_gets_no_handshake() {
    let mut outsider = Outsider::new();
    let _expected = Impostor::of(&outsider);
    let unknown = || {
        sample(
            &A.gw(),
            "isthmus_tunnel_dropped_packets_total{reason=\"unknown_sender\"}",
        )
    };
    let before = unknown();
    assert!(
        !outsider.handshake(Duration::from_secs(2)),
        "a-gw completed a handshake with a key it does not know"
    );
    assert!(
        unknown() > before,
        "the initiation was not counted as from an unknown sender"
    );
}

#[test]
fn a_known_peer_cannot_send_from_outside_its_networks() {
    let (mut outsider, object) = known_outsider();
    let gw = A.gw();

    // A listener in a-pod1 tells what came through.
    let port = next_port();
    let listener = netns::run_in(&A.pod(1), || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
        .unwrap()
        .unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let inner = |src: [u8; 4], payload: &[u8]| {
        Datagram::new(
            src,
            A.pod_addr(1).octets(),
            L4::Udp {
                sport: 4000,
                dport: port,
                payload: payload.to_vec(),
                zero_csum: false,
            },
        )
        .bytes()
    };
    let violations = || {
        sample(
            &gw,
            "isthmus_peer_source_violations_total{cluster_id=\"cluster-outsider\"",
        )
    };
    let before = violations();

    // Spoofing peer b's network: dropped and counted.
    outsider.send_inner(&inner([10, 0, 0, 5], b"spoofed"));
    eventually(GIVE_UP, "the spoofed packet is counted", || {
        violations() > before
    });
    // From its own network: delivered.
    outsider.send_inner(&inner([10, 77, 0, 9], b"allowed"));
    let mut buf = [0u8; 64];
    let (n, from) = listener
        .recv_from(&mut buf)
        .expect("the allowed packet never reached a-pod1");
    assert_eq!(&buf[..n], b"allowed", "a-pod1 received the spoofed packet");
    assert_eq!(
        from,
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 9), 4000))
    );
    assert!(
        listener.recv_from(&mut buf).is_err(),
        "a second packet reached a-pod1"
    );

    fs::remove_file(&object).unwrap();
    eventually(GIVE_UP, "a-gw drops the outsider", || {
        sample(&gw, "isthmus_peers ") == 1.0
    });
}

#[test]
fn private_keys_never_appear_in_logs_or_help() {
    require_lab();
    let agent = lab::agent_binary().to_string_lossy().into_owned();
    let help: String = [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["pubkey", "--help"],
        vec!["cleanup", "--help"],
    ]
    .iter()
    .map(|args| run(&agent, args).unwrap())
    .collect();
    for gw in [A.gw(), B.gw()] {
        let private = fs::read_to_string(lab::key_file(&gw)).unwrap();
        let private = private.trim();
        assert_eq!(
            key_text::decode(private).map(|k| k.len()),
            Some(32),
            "{gw}'s key file"
        );
        let log = fs::read_to_string(lab::log_file(&gw)).unwrap();
        assert!(log.contains("tunnel up"), "{gw}'s log is not the tunnel's");
        assert!(!log.contains(private), "{gw}'s private key is in its log");
        assert!(!help.contains(private), "{gw}'s private key is in --help");
    }
}

#[test]
fn handshakes_beyond_the_limit_get_cookies() {
    let mut outsider = Outsider::new();
    let _expected = Impostor::of(&outsider);
    let cookies = || sample(&A.gw(), "isthmus_tunnel_cookies_sent_total");
    let before = cookies();
    let mut buf = vec![0u8; 256];
    let TunnResult::WriteToNetwork(init) =
        outsider.tunn.format_handshake_initiation(&mut buf, false)
    else {
        panic!("no initiation");
    };
    let init = init.to_vec();
    // Well above the 200 handshake messages a second a-gw counts, and
    // sustained: a-gw queues 8 initiations of one address at a time, and
    // counts those it opens. Bounded: about 3 s, 300 datagrams every 5 ms.
    outsider
        .socket
        .set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let mut reply = [0u8; 256];
    let mut cookie_replies = 0;
    let start = Instant::now();
    while cookie_replies == 0 && start.elapsed() < Duration::from_secs(3) {
        for _ in 0..300 {
            outsider.socket.send_to(&init, outsider.gateway).unwrap();
        }
        while let Ok((n, _)) = outsider.socket.recv_from(&mut reply) {
            // Message type 3 is a cookie reply.
            if n == 64 && reply[0] == 3 {
                cookie_replies += 1;
            }
        }
    }
    assert!(cookie_replies > 0, "no cookie reply to a handshake flood");
    assert!(cookies() > before, "cookies were not counted");
}

/// A known peer's packets reach our Pod networks, and nothing else of ours:
/// one to a node's address is dropped by a-gw's ingress NAT and counted for
/// that peer.
#[test]
fn a_known_peer_reaches_our_pods_but_not_our_nodes() {
    let (mut outsider, object) = known_outsider();
    let gw = A.gw();
    let port = next_port();
    let bind = |ns: &str| {
        let socket = netns::run_in(ns, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
            .unwrap()
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        socket
    };
    let (node, pod) = (bind(&A.node()), bind(&A.pod(1)));
    let to = |dst: Ipv4Addr| {
        Datagram::new(
            [10, 77, 0, 9],
            dst.octets(),
            L4::Udp {
                sport: 4000,
                dport: port,
                payload: b"from a peer".to_vec(),
                zero_csum: false,
            },
        )
        .bytes()
    };
    let denied = || {
        sample(
            &gw,
            "isthmus_peer_denied_packets_total{cluster_id=\"cluster-outsider\",cluster_name=\"tep-outsider\",reason=\"node_address\"}",
        )
    };
    let before = denied();
    outsider.send_inner(&to(A.lan_node()));
    eventually(GIVE_UP, "a-gw counts the denied packet", || {
        denied() > before
    });
    outsider.send_inner(&to(A.pod_addr(1)));
    let mut buf = [0u8; 64];
    let (n, _) = pod.recv_from(&mut buf).expect("a-pod1 got nothing");
    assert_eq!(&buf[..n], b"from a peer");
    assert!(
        node.recv_from(&mut buf).is_err(),
        "the peer's packet reached a-node's address"
    );
    fs::remove_file(&object).unwrap();
    eventually(GIVE_UP, "a-gw drops the outsider", || {
        sample(&gw, "isthmus_peers ") == 1.0
    });
}
