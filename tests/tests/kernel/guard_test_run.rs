//! The XDP guard's decisions, by the real program on crafted frames
//! (`BPF_PROG_TEST_RUN`): what passes, what is dropped, and what is counted.
//! A frame that passes must come out unchanged, byte for byte.

use aya::{Ebpf, programs::Xdp};
use isthmus_agent::{
    kernel::dataplane::OBJECT,
    kernel::maps::{ByteHash, Counters, GuardMaps},
    roles::gateway::guard::{Guard, source},
};
use isthmus_common::{
    guard::{Initiations, VERDICTS},
    names,
};
use isthmus_tests::{
    packet::{Datagram, ETH_P_ARP, ETH_P_IP, L4, eth_ipv4, ethernet},
    require_root, test_run,
};
use std::collections::{BTreeMap, BTreeSet};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const PORT: u16 = 5871;
/// The port of another tunnel device, for another peer.
const OTHER_PORT: u16 = 5872;
const GATEWAY: [u8; 4] = [203, 0, 113, 1];
const PEER: [u8; 4] = [203, 0, 113, 2];
const STRANGER: [u8; 4] = [198, 51, 100, 7];
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
            indexes: ByteHash::new(ebpf.take_map(names::MAP_GUARD_INDEXES).unwrap()).unwrap(),
            ports: ByteHash::new(ebpf.take_map(names::MAP_GUARD_PORTS).unwrap()).unwrap(),
        };
        let mut guard = Guard::new(maps).unwrap();
        guard
            .set_ports(&BTreeMap::from([(PORT, Initiations::FromEndpoints)]))
            .unwrap();
        let peer = std::net::SocketAddrV4::new(PEER.into(), PORT);
        guard
            .sync(&BTreeSet::from([peer]), &BTreeSet::from([PEER_INDEX]))
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
fn the_guard_keys_sources_by_address_and_port_in_wire_order() {
    let key = source(std::net::SocketAddrV4::new(PEER.into(), PORT));
    assert_eq!(key.addr.bytes(), PEER);
    assert_eq!(key.port.bytes(), PORT.to_be_bytes());
}

#[test]
fn no_port_set_lets_everything_pass() {
    let ebpf = loaded_guard();
    let frame = udp(STRANGER, 40000, PORT, message(1, 0, 0, 148));
    assert_eq!(test_run(guard_program(&ebpf), &frame).0, XDP_PASS);
}
