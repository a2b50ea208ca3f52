//! What the gateway does with datagrams from the WAN, up to boringtun and
//! back: a peer with a session up, then any datagrams from its endpoint or
//! a stranger's, some of them sealed by the peer itself around any bytes.
//! Nothing may panic, a packet is delivered only from the peer's networks
//! (of either family) and never to a link's own IPv6 addresses, and the
//! peer moves only to where an authenticated datagram came from. The
//! stranger sends over IPv6, the peer over IPv4, to one dual-stack socket.
#![no_main]

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    sync::{Arc, OnceLock},
};

use arbitrary::Arbitrary;
use boringtun::{
    noise::{Tunn, TunnResult},
    x25519::{PublicKey, StaticSecret},
};
use isthmus_agent::{
    model::object::ObjectKey,
    tunnel::{
        Shared,
        datapath::{MAX_DATAGRAM, Receiver},
        key::KeyPair,
        offload::VNET_HDR_LEN,
        peers::{PeerConfig, PeerSet, TunnelPeer},
    },
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Datagram {
    /// Sealed by the peer (a transport message around these bytes), or sent
    /// as they are.
    sealed: bool,
    /// From the stranger's address rather than the peer's.
    stranger: bool,
    bytes: Vec<u8>,
}

/// Sockets bound once: ours (both families), the peer's on IPv4
/// loopback and a stranger's on IPv6 loopback.
fn sockets() -> &'static [UdpSocket; 3] {
    static SOCKETS: OnceLock<[UdpSocket; 3]> = OnceLock::new();
    SOCKETS.get_or_init(|| {
        ["[::]:0", "127.0.0.1:0", "[::1]:0"].map(|at| {
            let s = UdpSocket::bind(at).expect("a loopback socket");
            s.set_nonblocking(true).expect("non-blocking");
            s
        })
    })
}

fn addr(socket: &UdpSocket) -> SocketAddr {
    socket.local_addr().expect("bound")
}

/// The source and destination of a delivered packet, of either family.
fn addresses(packet: &[u8]) -> (IpAddr, IpAddr) {
    if packet[0] >> 4 == 4 {
        let at = |i: usize| Ipv4Addr::new(packet[i], packet[i + 1], packet[i + 2], packet[i + 3]);
        return (at(12).into(), at(16).into());
    }
    let at = |i: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&packet[i..i + 16]).unwrap());
    (at(8).into(), at(24).into())
}

/// Everything waiting on `socket`, dropped.
fn drain(socket: &UdpSocket) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 2048];
    while let Ok(n) = socket.recv(&mut buf) {
        got.push(buf[..n].to_vec());
    }
    got
}

fuzz_target!(|datagrams: Vec<Datagram>| {
    let [ours, theirs, stranger] = sockets();
    let (home, away) = (addr(theirs), addr(stranger));
    let our_secret = StaticSecret::from([1u8; 32]);
    let their_secret = StaticSecret::from([2u8; 32]);
    let key = KeyPair {
        private: our_secret.clone(),
        public: PublicKey::from(&our_secret),
    };
    let shared = Shared::new(key, 1420);
    let config = PeerConfig {
        key: ObjectKey {
            namespace: "liqo-tenant-b".into(),
            name: "b".into(),
        },
        label: "b".into(),
        cluster_name: "b".into(),
        public: *PublicKey::from(&their_secret).as_bytes(),
        endpoint: Some(home),
        networks: ["10.77.0.0/24", "fd00:77::/64"]
            .map(|n| n.parse().expect("a CIDR"))
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
    shared.set_snapshot(PeerSet::new([(peer.clone(), networks)]));
    let mut remote = Tunn::new(
        their_secret,
        PublicKey::from(&our_secret),
        None,
        None,
        9,
        None,
    );
    let (mut packet, mut scratch) = (
        vec![0u8; VNET_HDR_LEN + MAX_DATAGRAM],
        vec![0u8; MAX_DATAGRAM],
    );
    let mut receive = |datagram: &[u8], source: SocketAddr| {
        let peers = shared.snapshot();
        let receiver = Receiver {
            shared: &shared,
            peers: &peers,
            udp: ours,
        };
        receiver
            .receive(datagram, source, &mut packet, &mut scratch)
            .map(|len| packet[VNET_HDR_LEN..VNET_HDR_LEN + len].to_vec())
    };
    drain(theirs);
    // The peer initiates and our answer completes its handshake.
    let mut buf = vec![0u8; MAX_DATAGRAM + 64];
    if let TunnResult::WriteToNetwork(init) = remote.format_handshake_initiation(&mut buf, false) {
        let init = init.to_vec();
        receive(&init, home);
    }
    for response in drain(theirs) {
        if let TunnResult::WriteToNetwork(keepalive) = remote.decapsulate(None, &response, &mut buf)
        {
            let keepalive = keepalive.to_vec();
            receive(&keepalive, home);
        }
    }

    for datagram in datagrams.into_iter().take(64) {
        let source = if datagram.stranger { away } else { home };
        let bytes = match datagram.sealed {
            true => match remote.encapsulate(&datagram.bytes, &mut buf) {
                TunnResult::WriteToNetwork(sealed) => sealed.to_vec(),
                _ => continue,
            },
            false => datagram.bytes,
        };
        let before = peer.endpoint();
        let delivered = receive(&bytes, source);
        if let Some(inner) = delivered {
            // Delivered: from the peer's networks, authenticated, and the
            // peer is now where it came from.
            let (src, dst) = addresses(&inner);
            let from_peer = match src {
                IpAddr::V4(src) => src.octets()[..3] == [10, 77, 0],
                IpAddr::V6(src) => src.segments()[..4] == [0xfd00, 0x77, 0, 0],
            };
            assert!(from_peer, "delivered from {src}");
            if let IpAddr::V6(dst) = dst {
                assert!(
                    !dst.is_multicast() && !dst.is_unicast_link_local(),
                    "to {dst}"
                );
            }
            assert_eq!(peer.endpoint(), Some(source));
        } else if !datagram.sealed {
            // Bytes nobody sealed: the peer may move only if they happen to
            // be a valid message, which random bytes are not.
            assert_eq!(peer.endpoint(), before, "unsealed bytes moved the peer");
        }
    }
    drain(theirs);
    drain(stranger);
});
