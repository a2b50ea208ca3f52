//! The XDP guard's decisions, by the real program on crafted frames
//! (`BPF_PROG_TEST_RUN`): what passes, what is dropped, and what is counted.
//! A frame that passes must come out unchanged, byte for byte.

use aya::{Ebpf, programs::Xdp};
use isthmus_agent::{
    kernel::dataplane::OBJECT,
    kernel::maps::{ByteHash, Counters, GuardMaps},
    roles::gateway::guard::Guard,
};
use isthmus_common::{
    guard::{Initiations, VERDICTS},
    names,
};
use isthmus_tests::{
    packet::{Datagram, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, L4, eth_ipv4, ethernet},
    packet6::{Packet6, addr6, udp6},
    require_root, test_run,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const PORT: u16 = 5871;
/// The port of another tunnel device, for another peer.
const OTHER_PORT: u16 = 5872;
const GATEWAY: [u8; 4] = [203, 0, 113, 1];
const PEER: [u8; 4] = [203, 0, 113, 2];
const STRANGER: [u8; 4] = [198, 51, 100, 7];
const GATEWAY6: &str = "2001:db8:ffff::1";
const PEER6: &str = "2001:db8:ffff::2";
const STRANGER6: &str = "2001:db8:7::7";
/// Our index for the one peer: its sessions' receiver indexes are 0x000101xx.
const PEER_INDEX: u32 = 0x101;

struct Harness {
    ebpf: Ebpf,
    stats: Counters,
    guard: Guard,
}

impl Harness {
    fn new() -> Self {
        let mut ebpf = loaded_guard();
        let maps = GuardMaps {
            sources: ByteHash::new(ebpf.take_map(names::MAP_GUARD_SOURCES).unwrap()).unwrap(),
            sources6: ByteHash::new(ebpf.take_map(names::MAP_GUARD_SOURCES6).unwrap()).unwrap(),
            indexes: ByteHash::new(ebpf.take_map(names::MAP_GUARD_INDEXES).unwrap()).unwrap(),
            ports: ByteHash::new(ebpf.take_map(names::MAP_GUARD_PORTS).unwrap()).unwrap(),
        };
        let mut guard = Guard::new(maps).unwrap();
        guard
            .set_ports(&BTreeMap::from([(PORT, Initiations::FromEndpoints)]))
            .unwrap();
        let peer = SocketAddr::from((PEER, PORT));
        let peer6 = SocketAddr::new(PEER6.parse().unwrap(), PORT);
        guard
            .sync(
                &BTreeSet::from([peer, peer6]),
                &BTreeSet::from([PEER_INDEX]),
            )
            .unwrap();
        let stats = Counters::guard(ebpf.take_map(names::MAP_GUARD_STATS).unwrap()).unwrap();
        Self { ebpf, stats, guard }
    }

    fn run(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        test_run(guard_program(&self.ebpf), frame)
    }

    /// Runs each row's frame: it must get the row's action and add one to
    /// the row's verdict alone, and a frame that passes come out unchanged.
    fn check(&self, rows: Vec<(&str, Vec<u8>, u32, Option<usize>)>) {
        let mut failures = Vec::new();
        for (name, frame, action, verdict) in rows {
            let before = self.stats.read().unwrap();
            let (got, out) = self.run(&frame);
            let after = self.stats.read().unwrap();
            let counted: Vec<usize> = (0..VERDICTS.len())
                .filter(|v| after[*v] != before[*v])
                .collect();
            if got != action || counted != verdict.into_iter().collect::<Vec<_>>() {
                failures.push(format!(
                    "{name}: action {got} (want {action}), counted {counted:?} (want {verdict:?})"
                ));
            }
            if got == XDP_PASS && out != frame {
                failures.push(format!("{name}: the frame was changed"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// The object, with the guard through the verifier.
fn loaded_guard() -> Ebpf {
    require_root();
    let mut ebpf = Ebpf::load(OBJECT).expect("loading the eBPF object");
    let prog: &mut Xdp = ebpf
        .program_mut(names::PROG_GUARD)
        .unwrap()
        .try_into()
        .unwrap();
    prog.load()
        .unwrap_or_else(|e| panic!("verifier rejected the guard: {e}"));
    ebpf
}

fn guard_program(ebpf: &Ebpf) -> &Xdp {
    ebpf.program(names::PROG_GUARD).unwrap().try_into().unwrap()
}

/// A WireGuard message of `kind` whose first index field (the sender's in
/// an initiation or a response, the receiver's otherwise) is `first`, and
/// a response's receiver index `second`, padded to `len` bytes.
fn message(kind: u8, first: u32, second: u32, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[0] = kind;
    m[4..8].copy_from_slice(&first.to_le_bytes());
    m[8..12].copy_from_slice(&second.to_le_bytes());
    m
}

fn udp(src: [u8; 4], sport: u16, dport: u16, payload: Vec<u8>) -> Vec<u8> {
    let l4 = L4::Udp {
        sport,
        dport,
        payload,
        zero_csum: false,
    };
    eth_ipv4(&Datagram::new(src, GATEWAY, l4).bytes())
}

/// An IPv6 datagram from `src` to the gateway, in a frame.
fn udp_ipv6(src: &str, sport: u16, dport: u16, payload: &[u8]) -> Packet6 {
    Packet6::new(addr6(src), addr6(GATEWAY6), udp6(sport, dport, payload))
}

fn eth_ipv6(packet: &Packet6) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &packet.bytes())
}

#[test]
fn the_guard_judges_ipv6_datagrams_as_ipv4_ones_past_their_extension_headers() {
    let harness = Harness::new();
    let initiation = message(1, 0, 0, 148);
    let ours = (PEER_INDEX << 8) | 0x2a;
    let data = message(4, ours, 0, 64);
    let stranger = |payload: &[u8]| udp_ipv6(STRANGER6, 40000, PORT, payload);
    harness.check(vec![
        (
            "a peer's initiation over IPv6",
            eth_ipv6(&udp_ipv6(PEER6, PORT, PORT, &initiation)),
            XDP_PASS,
            Some(0),
        ),
        (
            "a stranger's initiation over IPv6",
            eth_ipv6(&stranger(&initiation)),
            XDP_DROP,
            Some(2),
        ),
        (
            "the peer's IPv4 address written as IPv6",
            eth_ipv6(&udp_ipv6("::ffff:203.0.113.2", PORT, PORT, &initiation)),
            XDP_DROP,
            Some(2),
        ),
        (
            "data for our session from a new IPv6 source",
            eth_ipv6(&stranger(&data)),
            XDP_PASS,
            Some(1),
        ),
        (
            "a stranger's initiation behind 3 extension headers",
            eth_ipv6(&stranger(&initiation).with_options(3)),
            XDP_DROP,
            Some(2),
        ),
        (
            "a peer's initiation behind 8 extension headers",
            eth_ipv6(&udp_ipv6(PEER6, PORT, PORT, &initiation).with_options(8)),
            XDP_PASS,
            Some(0),
        ),
        (
            "9 extension headers, hiding the port",
            eth_ipv6(&udp_ipv6(PEER6, PORT, PORT, &initiation).with_options(9)),
            XDP_DROP,
            Some(2),
        ),
        (
            "a stranger's first fragment",
            eth_ipv6(&stranger(&initiation).in_fragment(0, true, 7)),
            XDP_DROP,
            Some(2),
        ),
        (
            "a later fragment: no port to judge by",
            eth_ipv6(&stranger(&initiation).in_fragment(2, false, 7)),
            XDP_PASS,
            None,
        ),
        (
            "another UDP port over IPv6",
            eth_ipv6(&udp_ipv6(STRANGER6, 40000, 53, &initiation)),
            XDP_PASS,
            None,
        ),
        (
            "a truncated IPv6 header",
            ethernet(ETH_P_IPV6, &[0x60, 0, 0]),
            XDP_PASS,
            None,
        ),
    ]);
}

#[test]
fn the_guard_passes_peers_and_sessions_and_drops_the_rest() {
    let harness = Harness::new();
    let initiation = message(1, 0, 0, 148);
    let data = |receiver| message(4, receiver, 0, 64);
    let ours = (PEER_INDEX << 8) | 0x2a;
    let rows: Vec<(&str, Vec<u8>, u32, Option<usize>)> = vec![
        (
            "a peer's initiation",
            udp(PEER, PORT, PORT, initiation.clone()),
            XDP_PASS,
            Some(0),
        ),
        (
            "a stranger's initiation",
            udp(STRANGER, 40000, PORT, initiation.clone()),
            XDP_DROP,
            Some(2),
        ),
        (
            "a peer's address from another port",
            udp(PEER, 40000, PORT, initiation.clone()),
            XDP_DROP,
            Some(2),
        ),
        (
            "data for our session from a new source",
            udp(STRANGER, 40000, PORT, data(ours)),
            XDP_PASS,
            Some(1),
        ),
        (
            "a response for our session from a new source",
            udp(STRANGER, 40000, PORT, message(2, 0x77, ours, 92)),
            XDP_PASS,
            Some(1),
        ),
        (
            "a response naming our index only as its sender's",
            udp(STRANGER, 40000, PORT, message(2, ours, 0x999 << 8, 92)),
            XDP_DROP,
            Some(2),
        ),
        (
            "a cookie reply for our session from a new source",
            udp(STRANGER, 40000, PORT, message(3, ours, 0, 64)),
            XDP_PASS,
            Some(1),
        ),
        (
            "data for a session not ours",
            udp(STRANGER, 40000, PORT, data(0x999 << 8)),
            XDP_DROP,
            Some(2),
        ),
        (
            "an initiation naming our index as its sender",
            udp(STRANGER, 40000, PORT, message(1, ours, ours, 148)),
            XDP_DROP,
            Some(2),
        ),
        (
            "a datagram too short to be a message",
            udp(STRANGER, 40000, PORT, vec![4, 0]),
            XDP_DROP,
            Some(2),
        ),
        (
            "another UDP port",
            udp(STRANGER, 40000, 53, initiation.clone()),
            XDP_PASS,
            None,
        ),
        (
            "TCP to the tunnel port",
            eth_ipv4(
                &Datagram::new(
                    STRANGER,
                    GATEWAY,
                    L4::Tcp {
                        sport: 40000,
                        dport: PORT,
                        payload: vec![],
                    },
                )
                .bytes(),
            ),
            XDP_PASS,
            None,
        ),
        ("ARP", ethernet(ETH_P_ARP, &[0u8; 28]), XDP_PASS, None),
        (
            "a truncated IPv4 header",
            ethernet(ETH_P_IP, &[0x45, 0, 0]),
            XDP_PASS,
            None,
        ),
    ];
    harness.check(rows);
}

#[test]
fn a_port_serving_a_peer_that_makes_contact_lets_initiations_alone_through_from_anywhere() {
    let mut harness = Harness::new();
    let initiation = message(1, 0, 0, 148);
    let stranger = || udp(STRANGER, 40000, PORT, initiation.clone());
    harness.check(vec![(
        "closed: a stranger's initiation",
        stranger(),
        XDP_DROP,
        Some(2),
    )]);
    let open = BTreeMap::from([
        (PORT, Initiations::FromAnywhere),
        (OTHER_PORT, Initiations::FromEndpoints),
    ]);
    assert_eq!(
        harness.guard.set_ports(&open).unwrap(),
        [
            (PORT, Initiations::FromAnywhere),
            (OTHER_PORT, Initiations::FromEndpoints)
        ]
    );
    assert_eq!(harness.guard.set_ports(&open).unwrap(), [], "written twice");
    harness.check(vec![
        (
            "open: a stranger's initiation",
            stranger(),
            XDP_PASS,
            Some(3),
        ),
        (
            "open: a peer's initiation, from its endpoint",
            udp(PEER, PORT, PORT, initiation.clone()),
            XDP_PASS,
            Some(0),
        ),
        (
            "open: an initiation a byte short",
            udp(STRANGER, 40000, PORT, message(1, 0, 0, 147)),
            XDP_DROP,
            Some(2),
        ),
        (
            "open: an initiation a byte long",
            udp(STRANGER, 40000, PORT, message(1, 0, 0, 149)),
            XDP_DROP,
            Some(2),
        ),
        (
            "open: data for a session not ours",
            udp(STRANGER, 40000, PORT, message(4, 0x999 << 8, 0, 64)),
            XDP_DROP,
            Some(2),
        ),
        (
            "open: a cookie reply for no session of ours",
            udp(STRANGER, 40000, PORT, message(3, 0x999 << 8, 0, 64)),
            XDP_DROP,
            Some(2),
        ),
        (
            "another tunnel port, closed: a stranger's initiation",
            udp(STRANGER, 40000, OTHER_PORT, initiation.clone()),
            XDP_DROP,
            Some(2),
        ),
        (
            "another tunnel port, closed: a peer's session",
            udp(
                STRANGER,
                40000,
                OTHER_PORT,
                message(4, PEER_INDEX << 8, 0, 64),
            ),
            XDP_PASS,
            Some(1),
        ),
    ]);
    let closed = BTreeMap::from([(PORT, Initiations::FromEndpoints)]);
    assert_eq!(
        harness.guard.set_ports(&closed).unwrap(),
        [(PORT, Initiations::FromEndpoints)]
    );
    harness.check(vec![(
        "a port no longer the tunnel's: not guarded",
        udp(STRANGER, 40000, OTHER_PORT, initiation.clone()),
        XDP_PASS,
        None,
    )]);
    harness.check(vec![(
        "closed again: a stranger's initiation",
        stranger(),
        XDP_DROP,
        Some(2),
    )]);
}

#[test]
fn no_port_set_lets_everything_pass() {
    let ebpf = loaded_guard();
    let frame = udp(STRANGER, 40000, PORT, message(1, 0, 0, 148));
    assert_eq!(test_run(guard_program(&ebpf), &frame).0, XDP_PASS);
}
