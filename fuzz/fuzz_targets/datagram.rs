//! What the gateway does with datagrams from the WAN, up to boringtun and
//! back: a peer with a session up, then any datagrams from its endpoint or
//! a stranger's, some of them sealed by the peer itself around any bytes.
//! Nothing may panic, a packet is delivered only from the peer's networks,
//! and the peer moves only to where an authenticated datagram came from.
#![no_main]

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
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

/// Sockets on loopback, bound once: ours, the peer's and a stranger's.
fn sockets() -> &'static [UdpSocket; 3] {
    static SOCKETS: OnceLock<[UdpSocket; 3]> = OnceLock::new();
    SOCKETS.get_or_init(|| {
        [(); 3].map(|()| {
            let s = UdpSocket::bind("127.0.0.1:0").expect("a loopback socket");
            s.set_nonblocking(true).expect("non-blocking");
            s
        })
    })
}

fn addr(socket: &UdpSocket) -> SocketAddrV4 {
    match socket.local_addr().expect("bound") {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => unreachable!("bound to IPv4"),
    }
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
        networks: vec!["10.77.0.0/24".parse().expect("a CIDR")],
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
    let mut receive = |datagram: &[u8], source: SocketAddrV4| {
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
            let src = Ipv4Addr::new(inner[12], inner[13], inner[14], inner[15]);
            assert!(src.octets()[..3] == [10, 77, 0], "delivered from {src}");
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
