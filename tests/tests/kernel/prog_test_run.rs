//! The real NAT programs, run by the kernel on crafted packets
//! (`BPF_PROG_TEST_RUN`). Every output frame is compared whole, byte for
//! byte, with one built from scratch with full checksums.
//!
//! The kernel runs SCHED_CLS test programs on Ethernet frames only, so this
//! table drives the `_eth` programs; the `_ip` ones share their code and
//! differ only in the header offset, and are exercised on tun in the lab.

use aya::{Ebpf, EbpfLoader, programs::SchedClassifier};
use isthmus_agent::{
    control::flows::{Share, Sharing, Sweeper},
    kernel::conntrack::{Conntrack, PeerFlows, SweptTable},
    kernel::dataplane::OBJECT,
    kernel::maps::{Counters, MappingMap, PeerMap, PresenceSet},
    kernel::room::Rooms,
    kernel::table::KernelTable,
    model::isolation::SecurityMode,
    model::object::{Object, parse_documents},
    model::peer::Peer,
    observe::metrics::{BuildInfo, Metrics},
};
use isthmus_common::{
    conntrack::{DIR_IN, DIR_OUT, TcpState, Timeouts},
    counters::{self, DenyReason, Direction, DropReason, Kind, Link, Outcome},
    ipv4::PROTO_TCP,
    isolation::AllowKey,
    names,
    nat::MappingKey,
    room::{ALL_PEERS, FlowTable, OWNER_LOCAL, Short},
    wire::Be32,
};
use isthmus_tests::{
    addrs::{A_POD1, A_POD1_AT_B, A_POD2, A_POD2_AT_B, B_POD1},
    packet::{Addr, Datagram, ETH_P_ARP, ETH_P_IPV6, L4, eth_ipv4, ethernet, tcp, udp},
    require_root, test_run,
};
use std::net::Ipv4Addr;

use isthmus_lab::{objects::TunnelEndpoint, topology::PEERINGS};

const A_EXT: Addr = [192, 168, 0, 7];
/// How b sees a's externals.
const A_EXT_AT_B: Addr = [10, 0, 41, 7];
/// How a sees b's other pod and externals.
const B_POD2: Addr = [10, 0, 0, 133];
const B_EXT: Addr = [10, 0, 1, 45];
/// Peer s: we see it unremapped, it remaps our PodCIDR only (single NAT).
const S_POD: Addr = [10, 1, 0, 5];
const S_POD2: Addr = [10, 1, 0, 6];
const A_POD1_AT_S: Addr = [10, 0, 50, 5];
const B_GW_WAN: Addr = [203, 0, 113, 2];
/// A NatMapping for peer b (id 1) exposes S_POD to b at this externalIP of ours...
const MAPPED_EXT: Addr = [192, 168, 0, 45];
/// ...which b sees remapped.
const MAPPED_EXT_AT_B: Addr = [10, 0, 41, 45];
/// A NatMapping entry for b that names a node, as a forged object would,
/// and how b sees its externalIP: the kernel refuses it whatever the table says.
const NODE_EXT: Addr = [192, 168, 0, 77];
const NODE_EXT_AT_B: Addr = [10, 0, 41, 77];
/// Our ExternalCIDR's first host, how b sees it, and the conncheck's
/// address behind it.
const A_EXT_FIRST: Addr = [192, 168, 0, 1];
const A_EXT_FIRST_AT_B: Addr = [10, 0, 41, 1];
const CONNCHECK: Addr = [169, 254, 0, 1];
/// The MSS a 1,340-byte tunnel carries, as the agent sets it.
const TUNNEL_MSS: u16 = 1300;
/// TC_ACT_UNSPEC: the programs always hand the packet on.
const HAND_ON: i32 = -1;

/// A second peer, whose networks are its own (no remapping).
fn peer_s() -> TunnelEndpoint {
    TunnelEndpoint::new("tep-s", "liqo-tenant-s")
        .local(["10.244.0.0/24", "10.0.50.0/24", "192.168.0.0/24", "None"])
        .remote(["10.1.0.0/24", "None", "192.168.2.0/24", "None"])
}

/// The object loaded fresh (nothing pinned), with cluster a's peers and
/// nodes.
struct Harness {
    ebpf: Ebpf,
    counters: Counters,
    denied: Counters,
    conntrack: Conntrack,
    allowed: PresenceSet<AllowKey>,
    peer_flows: PeerFlows,
    rooms: Rooms,
}

impl Harness {
    /// Stateless NAT only.
    fn new() -> Self {
        Self::build(None, names::DEFAULT_CONNTRACK)
    }

    /// With masquerading to `masquerade`, in a conntrack of `capacity` entries.
    fn build(masquerade: Option<Addr>, capacity: u32) -> Self {
        Self::build_with(masquerade, capacity, None)
    }

    /// Peer b (id 1) segregated, with room for `peer_flows` flows towards it.
    fn segregated(peer_flows: u32) -> Self {
        Self::build_with(None, names::DEFAULT_CONNTRACK, Some(peer_flows))
    }

    fn build_with(masquerade: Option<Addr>, capacity: u32, peer_flows: Option<u32>) -> Self {
        require_root();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(names::MAP_CONNTRACK, capacity)
            .map_max_entries(
                names::MAP_PEER_FLOWS,
                peer_flows.unwrap_or(names::DEFAULT_PEER_FLOWS),
            )
            .load(OBJECT)
            .expect("loading the eBPF object");
        for name in [names::PROG_EGRESS_ETH, names::PROG_INGRESS_ETH] {
            let prog: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e}"));
        }
        let mut peers = PeerMap::new(
            ebpf.take_map(names::MAP_PEERS).unwrap(),
            ebpf.take_map(names::MAP_PEER_OWNERS).unwrap(),
            ebpf.take_map(names::MAP_PREFIX_LENS).unwrap(),
        )
        .unwrap();
        for (id, yaml) in [
            (1, PEERINGS[0].tunnel_endpoint_yaml(None)),
            (2, peer_s().to_string()),
        ] {
            let docs = parse_documents("test.yaml".as_ref(), &yaml);
            let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
                panic!("{docs:?}")
            };
            let peer = Peer::from_raw(raw, "test.yaml").unwrap();
            let mode = match (id, peer_flows) {
                (1, Some(_)) => SecurityMode::IntraClusterTrafficSegregation,
                _ => SecurityMode::FullPodToPod,
            };
            for (_, net) in peer.views() {
                peers.put(net, &peer.nat(id, mode), None).unwrap();
            }
        }
        let mut mappings = MappingMap::new(
            ebpf.take_map(names::MAP_NATMAP).unwrap(),
            ebpf.take_map(names::MAP_NATMAP_REV).unwrap(),
        )
        .unwrap();
        let key = MappingKey {
            peer_id: 1,
            addr: Be32::from_bytes(MAPPED_EXT),
        };
        mappings.put(key, &Be32::from_bytes(S_POD), None).unwrap();
        // The conncheck's entry of b's NatMapping: our ExternalCIDR's
        // first host leads to the gateway's conncheck address.
        let conncheck = MappingKey {
            peer_id: 1,
            addr: Be32::from_bytes(A_EXT_FIRST),
        };
        mappings
            .put(conncheck, &Be32::from_bytes(CONNCHECK), None)
            .unwrap();
        let to_node = MappingKey {
            peer_id: 1,
            addr: Be32::from_bytes(NODE_EXT),
        };
        mappings
            .put(to_node, &Be32::from_bytes(NODE3), None)
            .unwrap();
        let mut conntrack = Conntrack::new(
            ebpf.take_map(names::MAP_CONNTRACK).unwrap(),
            ebpf.take_map(names::MAP_SNAT).unwrap(),
        )
        .unwrap();
        conntrack
            .set_masquerade(masquerade.map(Ipv4Addr::from))
            .unwrap();
        let mut nodes: PresenceSet<Be32> =
            PresenceSet::new(ebpf.take_map(names::MAP_NODE_ADDRS).unwrap()).unwrap();
        for node in [NODE, NODE2, NODE3] {
            nodes.put(Be32::from_bytes(node), &1, None).unwrap();
        }
        let mut mss =
            aya::maps::Array::<_, u32>::try_from(ebpf.map_mut(names::MAP_TCP_MSS).unwrap())
                .unwrap();
        mss.set(0, u32::from(TUNNEL_MSS), 0).unwrap();
        let counters = Counters::new(ebpf.take_map(names::MAP_COUNTERS).unwrap()).unwrap();
        let denied = Counters::denied(ebpf.take_map(names::MAP_PEER_DENIED).unwrap()).unwrap();
        let allowed = PresenceSet::new(ebpf.take_map(names::MAP_ALLOWED).unwrap()).unwrap();
        let peer_flows = PeerFlows::new(ebpf.take_map(names::MAP_PEER_FLOWS).unwrap()).unwrap();
        let rooms = Rooms::new(
            ebpf.take_map(names::MAP_ROOM).unwrap(),
            ebpf.take_map(names::MAP_ROOM_REFUSED).unwrap(),
        )
        .unwrap();
        Self {
            ebpf,
            counters,
            denied,
            conntrack,
            allowed,
            peer_flows,
            rooms,
        }
    }

    fn run(&self, direction: Direction, frame: &[u8]) -> (i32, Vec<u8>) {
        let name = match direction {
            Direction::Egress => names::PROG_EGRESS_ETH,
            Direction::Ingress => names::PROG_INGRESS_ETH,
        };
        let prog: &SchedClassifier = self.ebpf.program(name).unwrap().try_into().unwrap();
        let (action, out) = test_run(prog, frame);
        (action as i32, out)
    }
}

struct Row {
    name: &'static str,
    direction: Direction,
    input: Vec<u8>,
    expected: Vec<u8>,
    outcome: Outcome,
    /// The kinds of rule that rewrote it, each counted once.
    kinds: &'static [Kind],
}

/// A row the prefix remap alone rewrites.
fn translated(
    name: &'static str,
    direction: Direction,
    input: &Datagram,
    expected: &Datagram,
) -> Row {
    Row {
        name,
        direction,
        input: eth_ipv4(&input.bytes()),
        expected: eth_ipv4(&expected.bytes()),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    }
}

/// A row the prefix remap and a NatMapping both rewrite.
fn mapped(name: &'static str, direction: Direction, input: &Datagram, expected: &Datagram) -> Row {
    Row {
        kinds: &[Kind::Prefix, Kind::NatMapping],
        ..translated(name, direction, input, expected)
    }
}

fn untouched(name: &'static str, direction: Direction, frame: Vec<u8>, outcome: Outcome) -> Row {
    Row {
        name,
        direction,
        expected: frame.clone(),
        input: frame,
        outcome,
        kinds: &[],
    }
}

fn icmp_error(
    icmp_type: u8,
    code: u8,
    src: Addr,
    dst: Addr,
    quoted: Datagram,
    quote_len: usize,
) -> Datagram {
    Datagram::new(
        src,
        dst,
        L4::IcmpError {
            icmp_type,
            code,
            quoted: Box::new(quoted),
            quote_len,
        },
    )
}

fn rows() -> Vec<Row> {
    use Direction::{Egress, Ingress};
    let mut rows = vec![
        translated(
            "udp egress, double NAT",
            Egress,
            &udp(A_POD1, B_POD1),
            &udp(A_POD1_AT_B, B_POD1),
        ),
        translated(
            "udp ingress, double NAT",
            Ingress,
            &udp(B_POD1, A_POD1_AT_B),
            &udp(B_POD1, A_POD1),
        ),
        translated(
            "tcp egress",
            Egress,
            &tcp(A_POD2, B_POD2),
            &tcp(A_POD2_AT_B, B_POD2),
        ),
        translated(
            "tcp ingress",
            Ingress,
            &tcp(B_POD2, A_POD2_AT_B),
            &tcp(B_POD2, A_POD2),
        ),
        translated(
            "external egress",
            Egress,
            &udp(A_EXT, B_EXT),
            &udp(A_EXT_AT_B, B_EXT),
        ),
        translated(
            "external ingress",
            Ingress,
            &tcp(B_EXT, A_EXT_AT_B),
            &tcp(B_EXT, A_EXT),
        ),
        translated(
            "single NAT egress",
            Egress,
            &tcp(A_POD1, S_POD),
            &tcp(A_POD1_AT_S, S_POD),
        ),
        translated(
            "single NAT ingress",
            Ingress,
            &udp(S_POD, A_POD1_AT_S),
            &udp(S_POD, A_POD1),
        ),
    ];

    // MSS clamping: a SYN or SYN-ACK, either way, advertises no more than
    // the tunnel carries; one below that is left alone.
    let syn = |src, dst, ack, mss| {
        Datagram::new(
            src,
            dst,
            L4::TcpSyn {
                sport: 40100,
                dport: 80,
                ack,
                mss,
            },
        )
    };
    let clamped = |name, direction, input: Datagram, expected: Datagram| Row {
        kinds: &[Kind::Prefix, Kind::MssClamp],
        ..translated(name, direction, &input, &expected)
    };
    rows.extend([
        clamped(
            "mss clamp, syn egress",
            Egress,
            syn(A_POD1, B_POD1, false, 1460),
            syn(A_POD1_AT_B, B_POD1, false, TUNNEL_MSS),
        ),
        clamped(
            "mss clamp, syn-ack egress",
            Egress,
            syn(A_POD2, B_POD2, true, 8960),
            syn(A_POD2_AT_B, B_POD2, true, TUNNEL_MSS),
        ),
        clamped(
            "mss clamp, syn-ack ingress",
            Ingress,
            syn(B_POD1, A_POD1_AT_B, true, 1460),
            syn(B_POD1, A_POD1, true, TUNNEL_MSS),
        ),
        translated(
            "mss below the clamp left alone",
            Egress,
            &syn(A_POD1, B_POD1, false, 1200),
            &syn(A_POD1_AT_B, B_POD1, false, 1200),
        ),
        untouched(
            "a syn of no peer keeps its mss",
            Egress,
            eth_ipv4(&syn(A_POD1, [198, 51, 100, 7], false, 1460).bytes()),
            Outcome::Passed,
        ),
    ]);

    // NatMapping: after the prefix step, b's packets to the externalIP go to
    // the endpoint behind it; the endpoint's packets to b carry it back.
    rows.extend([
        mapped(
            "natmapping DNAT ingress, tcp",
            Ingress,
            &tcp(B_POD1, MAPPED_EXT_AT_B),
            &tcp(B_POD1, S_POD),
        ),
        mapped(
            "natmapping reverse egress, tcp",
            Egress,
            &tcp(S_POD, B_POD1),
            &tcp(MAPPED_EXT_AT_B, B_POD1),
        ),
        mapped(
            "natmapping DNAT ingress, udp",
            Ingress,
            &udp(B_POD2, MAPPED_EXT_AT_B),
            &udp(B_POD2, S_POD),
        ),
    ]);
    let echo = Datagram::new(B_POD1, MAPPED_EXT_AT_B, L4::Echo { id: 9, seq: 1 });
    rows.push(mapped(
        "natmapping DNAT ingress, icmp echo",
        Ingress,
        &echo,
        &echo.between(B_POD1, S_POD),
    ));
    let reply = Datagram::new(S_POD, B_POD1, L4::Echo { id: 9, seq: 1 });
    rows.push(mapped(
        "natmapping reverse egress, icmp echo reply",
        Egress,
        &reply,
        &reply.between(MAPPED_EXT_AT_B, B_POD1),
    ));
    // b's router cannot forward what the endpoint sent b: the quote names the endpoint again.
    let quoted = udp(MAPPED_EXT_AT_B, B_POD1);
    let err = icmp_error(3, 4, B_GW_WAN, MAPPED_EXT_AT_B, quoted, 28);
    let want = err.between(B_GW_WAN, S_POD).quoting(S_POD, B_POD1);
    rows.push(mapped(
        "natmapping ingress icmp error, quote translated back",
        Ingress,
        &err,
        &want,
    ));
    let ping = |dst| {
        Datagram::new(
            B_POD1,
            dst,
            L4::Udp {
                sport: 40200,
                dport: 12345,
                payload: br#"{"msgType":"PING"}"#.to_vec(),
                zero_csum: false,
            },
        )
    };
    rows.push(mapped(
        "natmapping to the conncheck, udp 12345",
        Ingress,
        &ping(A_EXT_FIRST_AT_B),
        &ping(CONNCHECK),
    ));
    rows.push(untouched(
        "natmapping of b does not apply to peer s",
        Ingress,
        eth_ipv4(&udp(S_POD, MAPPED_EXT).bytes()),
        Outcome::Passed,
    ));

    let zero = Datagram::new(
        A_POD1,
        B_POD1,
        L4::Udp {
            sport: 1,
            dport: 2,
            payload: vec![7; 9],
            zero_csum: true,
        },
    );
    rows.push(translated(
        "udp checksum 0 stays 0",
        Egress,
        &zero,
        &zero.between(A_POD1_AT_B, B_POD1),
    ));

    let echo = Datagram::new(A_POD1, B_POD1, L4::Echo { id: 77, seq: 3 });
    rows.push(translated(
        "icmp echo egress",
        Egress,
        &echo,
        &echo.between(A_POD1_AT_B, B_POD1),
    ));
    let echo_in = echo.between(B_POD1, A_POD1_AT_B);
    rows.push(translated(
        "icmp echo ingress",
        Ingress,
        &echo_in,
        &echo_in.between(B_POD1, A_POD1),
    ));

    // a-pod1 refuses a datagram from b: the quoted packet travelled towards a.
    let quoted = udp(B_POD1, A_POD1);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 3, A_POD1, B_POD1, quoted, len);
    let want = err
        .between(A_POD1_AT_B, B_POD1)
        .quoting(B_POD1, A_POD1_AT_B);
    rows.push(translated(
        "icmp port unreachable egress, quoted udp",
        Egress,
        &err,
        &want,
    ));

    // b's gateway (an address of no peer) says TTL exceeded for a-pod1's SYN;
    // the peer is found through the quoted packet, whose TCP checksum is quoted too.
    let quoted = tcp(A_POD1_AT_B, B_POD1);
    let err = icmp_error(11, 0, B_GW_WAN, A_POD1_AT_B, quoted.clone(), 40);
    let want = err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1);
    rows.push(translated(
        "icmp time exceeded ingress from a router, quoted tcp",
        Ingress,
        &err,
        &want,
    ));
    // RFC 792 minimum quote: 8 bytes of TCP, no checksum to update.
    let err = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, 28);
    let want = err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1);
    rows.push(translated(
        "icmp frag needed ingress, 8-byte quote",
        Ingress,
        &err,
        &want,
    ));

    let mut with_options = tcp(A_POD1, B_POD1);
    with_options.options = vec![1, 1, 1, 0];
    rows.push(translated(
        "ip options, tcp egress",
        Egress,
        &with_options,
        &with_options.between(A_POD1_AT_B, B_POD1),
    ));

    let big = Datagram::new(
        A_POD1,
        B_POD1,
        L4::Udp {
            sport: 5,
            dport: 6,
            payload: (0..64).collect(),
            zero_csum: false,
        },
    );
    let big_out = big.between(A_POD1_AT_B, B_POD1);
    rows.push(Row {
        name: "first fragment: udp checksum over the whole datagram",
        direction: Egress,
        input: eth_ipv4(&big.fragment(0, 32)),
        expected: eth_ipv4(&big_out.fragment(0, 32)),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    });
    rows.push(Row {
        name: "later fragment: L3 only",
        direction: Egress,
        input: eth_ipv4(&big.fragment(32, 72)),
        expected: eth_ipv4(&big_out.fragment(32, 72)),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    });

    let short = Datagram::new(
        A_POD1,
        B_POD1,
        L4::Udp {
            sport: 5,
            dport: 6,
            payload: vec![1, 2],
            zero_csum: false,
        },
    );
    let pad = |mut frame: Vec<u8>| {
        frame.resize(60, 0xee);
        frame
    };
    rows.push(Row {
        name: "ethernet padding after the datagram is left alone",
        direction: Egress,
        input: pad(eth_ipv4(&short.bytes())),
        expected: pad(eth_ipv4(&short.between(A_POD1_AT_B, B_POD1).bytes())),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    });

    // Nothing to do: handed on untouched, counted as passed.
    rows.push(untouched(
        "no peer for the destination",
        Egress,
        eth_ipv4(&udp(A_POD1, [10, 9, 9, 9]).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "source not ours (node traffic)",
        Egress,
        eth_ipv4(&udp([172, 16, 1, 1], B_POD1).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "destination not remapped",
        Ingress,
        eth_ipv4(&udp(B_POD1, [10, 244, 0, 9]).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "external not remapped by a single-NAT peer",
        Egress,
        eth_ipv4(&udp(A_EXT, S_POD).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "ipv6",
        Egress,
        ethernet(ETH_P_IPV6, &[0x60; 48]),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "arp",
        Ingress,
        ethernet(ETH_P_ARP, &[0; 28]),
        Outcome::Passed,
    ));

    // Cannot be parsed: handed on untouched, counted as unparseable.
    let mut cut = udp(A_POD1, B_POD1).bytes();
    cut.truncate(cut.len() - 6);
    rows.push(untouched(
        "truncated datagram",
        Egress,
        eth_ipv4(&cut),
        Outcome::Unparseable,
    ));
    rows.push(untouched(
        "truncated tcp header",
        Egress,
        eth_ipv4(&tcp_header_cut_at(10)),
        Outcome::Unparseable,
    ));
    let mut bad_ihl = udp(A_POD1, B_POD1).bytes();
    bad_ihl[0] = 0x44;
    rows.push(untouched(
        "header length below 20",
        Egress,
        eth_ipv4(&bad_ihl),
        Outcome::Unparseable,
    ));
    let quoted = udp(B_POD1, A_POD1);
    rows.push(untouched(
        "icmp error quoting less than an IP header",
        Egress,
        eth_ipv4(&icmp_error(3, 3, A_POD1, B_POD1, quoted, 12).bytes()),
        Outcome::Unparseable,
    ));
    rows
}

/// A TCP datagram whose IP total length admits only `keep` bytes of TCP.
fn tcp_header_cut_at(keep: usize) -> Vec<u8> {
    let mut bytes = tcp(A_POD1, B_POD1).bytes();
    bytes.truncate(20 + keep);
    let total = (bytes.len() as u16).to_be_bytes();
    bytes[2..4].copy_from_slice(&total);
    bytes[10..12].fill(0);
    let check = isthmus_common::csum::checksum(&bytes[..20]);
    bytes[10..12].copy_from_slice(&check.bytes());
    bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|c| {
            c.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_packet_shape_comes_out_byte_exact() {
    let harness = Harness::new();
    let mut failures = Vec::new();
    for row in rows() {
        let before = harness.counters.read().unwrap();
        let (ret, out) = harness.run(row.direction, &row.input);
        let after = harness.counters.read().unwrap();
        let slot = |s: u32| s as usize;
        let mut want: Vec<usize> = row
            .kinds
            .iter()
            .map(|k| slot(counters::kind_slot(Link::Eth, row.direction, *k)))
            .collect();
        want.push(slot(counters::outcome_slot(
            Link::Eth,
            row.direction,
            row.outcome,
        )));
        want.sort();
        let moved: Vec<usize> = (0..before.len())
            .filter(|i| after[*i] != before[*i])
            .collect();
        if ret != HAND_ON {
            failures.push(format!("{}: returned {ret}, want {HAND_ON}", row.name));
        }
        if out != row.expected {
            failures.push(format!(
                "{}: output differs\n got:\n{}\nwant:\n{}",
                row.name,
                hex(&out),
                hex(&row.expected)
            ));
        }
        if moved != want || want.iter().any(|s| after[*s] != before[*s] + 1) {
            failures.push(format!(
                "{}: counters moved at {moved:?}, want only slots {want:?} ({:?}, {:?}) by one",
                row.name, row.outcome, row.kinds
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} row(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// a-gw's masquerade address, and how b sees it.
const A_MASQ: Addr = [10, 244, 0, 254];
const A_MASQ_AT_B: Addr = [10, 0, 40, 254];
/// Addresses of none of a's networks: the node's own, and a transit source.
const NODE: Addr = [172, 16, 1, 1];
const NODE2: Addr = [172, 16, 1, 2];
/// A node no test sends from: a forged NatMapping entry leads to it.
const NODE3: Addr = [172, 16, 1, 3];
const TRANSIT: Addr = [10, 1, 0, 6];
/// TC_ACT_SHOT.
const DROP: i32 = 2;
const SECOND: u64 = 1_000_000_000;

fn tcp_ports(src: Addr, dst: Addr, sport: u16, dport: u16) -> Datagram {
    Datagram::new(
        src,
        dst,
        L4::Tcp {
            sport,
            dport,
            payload: b"hello".to_vec(),
        },
    )
}

fn udp_ports(src: Addr, dst: Addr, sport: u16, dport: u16) -> Datagram {
    Datagram::new(
        src,
        dst,
        L4::Udp {
            sport,
            dport,
            payload: b"dns?".to_vec(),
            zero_csum: false,
        },
    )
}

/// The source port of a frame's IPv4 TCP or UDP datagram (no IP options).
fn sport_of(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[34], frame[35]])
}

impl Harness {
    /// Runs `input` and asserts the program handed on exactly `want`.
    fn expect(&self, direction: Direction, input: &Datagram, want: &Datagram) {
        let (ret, out) = self.run(direction, &eth_ipv4(&input.bytes()));
        assert_eq!(ret, HAND_ON, "{direction:?} {input:?}");
        assert_eq!(
            hex(&out),
            hex(&eth_ipv4(&want.bytes())),
            "{direction:?} {input:?}"
        );
    }

    /// Runs `packet` and asserts the program dropped it untouched, counted
    /// once for `reason`, and for a denied peer's packet, once for that
    /// peer and its deny reason.
    fn expect_dropped(
        &self,
        name: &str,
        direction: Direction,
        packet: &[u8],
        reason: DropReason,
        denied: Option<(u32, DenyReason)>,
    ) {
        let frame = eth_ipv4(packet);
        let before = (self.counters.read().unwrap(), self.denied.read().unwrap());
        let (ret, out) = self.run(direction, &frame);
        let after = (self.counters.read().unwrap(), self.denied.read().unwrap());
        assert_eq!((ret, out), (DROP, frame), "{name}: dropped, untouched");
        let moved = |b: &[u64], a: &[u64]| -> Vec<usize> {
            (0..b.len()).filter(|i| a[*i] != b[*i]).collect()
        };
        let mut want = vec![
            counters::outcome_slot(Link::Eth, direction, Outcome::Dropped) as usize,
            counters::drop_slot(Link::Eth, direction, reason) as usize,
        ];
        want.sort();
        assert_eq!(moved(&before.0, &after.0), want, "{name}: NAT counters");
        let want_denied: Vec<usize> = denied
            .map(|(peer, why)| counters::deny_slot(peer, why) as usize)
            .into_iter()
            .collect();
        assert_eq!(
            moved(&before.1, &after.1),
            want_denied,
            "{name}: counted as {denied:?}"
        );
    }

    /// The NAT counter at `slot`, summed over CPUs.
    fn counter(&self, slot: u32) -> u64 {
        self.counters.read().unwrap()[slot as usize]
    }
}

#[test]
fn masquerade_allocates_ports_and_brings_replies_back() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let masqueraded = |d| h.counter(counters::kind_slot(Link::Eth, d, Kind::Masquerade));
    let before = [masqueraded(Egress), masqueraded(Ingress)];
    // The node's own flow keeps its port while it is free.
    h.expect(
        Egress,
        &tcp_ports(NODE, B_POD1, 40001, 80),
        &tcp_ports(A_MASQ_AT_B, B_POD1, 40001, 80),
    );
    assert_eq!(masqueraded(Egress), before[0] + 1, "counted as masquerade");
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40001),
        &tcp_ports(B_POD1, NODE, 80, 40001),
    );
    assert_eq!(masqueraded(Ingress), before[1] + 1, "counted as masquerade");
    // Another source, same port, same server: the port is taken, so another.
    let (ret, out) = h.run(
        Egress,
        &eth_ipv4(&tcp_ports(NODE2, B_POD1, 40001, 80).bytes()),
    );
    let port = sport_of(&out);
    assert_eq!(ret, HAND_ON);
    assert!(port != 40001 && port >= 1024, "allocated port {port}");
    assert_eq!(
        hex(&out),
        hex(&eth_ipv4(&tcp_ports(A_MASQ_AT_B, B_POD1, port, 80).bytes()))
    );
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, port),
        &tcp_ports(B_POD1, NODE2, 80, 40001),
    );
    // The first flow is undisturbed, and its next packet reuses its entry.
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40001),
        &tcp_ports(B_POD1, NODE, 80, 40001),
    );
    h.expect(
        Egress,
        &tcp_ports(NODE, B_POD1, 40001, 80),
        &tcp_ports(A_MASQ_AT_B, B_POD1, 40001, 80),
    );
    // UDP, and transit from another peer's network.
    h.expect(
        Egress,
        &udp_ports(TRANSIT, B_POD2, 5353, 53),
        &udp_ports(A_MASQ_AT_B, B_POD2, 5353, 53),
    );
    h.expect(
        Ingress,
        &udp_ports(B_POD2, A_MASQ_AT_B, 53, 5353),
        &udp_ports(B_POD2, TRANSIT, 53, 5353),
    );
    // ICMP echo: the identifier is the port.
    let echo = Datagram::new(NODE, B_POD1, L4::Echo { id: 77, seq: 1 });
    h.expect(Egress, &echo, &echo.between(A_MASQ_AT_B, B_POD1));
    let reply = Datagram::new(B_POD1, A_MASQ_AT_B, L4::EchoReply { id: 77, seq: 1 });
    h.expect(Ingress, &reply, &reply.between(B_POD1, NODE));
    let second = Datagram::new(NODE2, B_POD1, L4::Echo { id: 77, seq: 1 });
    let (_, out) = h.run(Egress, &eth_ipv4(&second.bytes()));
    let id = u16::from_be_bytes([out[38], out[39]]);
    assert_ne!(
        id, 77,
        "a second echo with the same identifier needs another"
    );
    let want = Datagram::new(A_MASQ_AT_B, B_POD1, L4::Echo { id, seq: 1 });
    assert_eq!(hex(&out), hex(&eth_ipv4(&want.bytes())));
    let reply = Datagram::new(B_POD1, A_MASQ_AT_B, L4::EchoReply { id, seq: 1 });
    let want = Datagram::new(B_POD1, NODE2, L4::EchoReply { id: 77, seq: 1 });
    h.expect(Ingress, &reply, &want);
    // The node says "fragmentation needed" for b's datagram to a pod whose
    // link is narrower: the error takes the masquerade address, without
    // state, and its quote the stateless rules.
    let quoted = udp(B_POD1, A_POD1);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 4, NODE, B_POD1, quoted, len);
    let want = err
        .between(A_MASQ_AT_B, B_POD1)
        .quoting(B_POD1, A_POD1_AT_B);
    h.expect(Egress, &err, &want);
    // A reply to no flow gets the stateless step only.
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 999),
        &tcp_ports(B_POD1, A_MASQ, 80, 999),
    );
    // Our own pods are never masqueraded.
    h.expect(
        Egress,
        &tcp_ports(A_POD1, B_POD1, 40001, 80),
        &tcp_ports(A_POD1_AT_B, B_POD1, 40001, 80),
    );
}

#[test]
fn a_full_table_drops_new_flows_evicts_none_and_dead_flows_are_collected() {
    use Direction::{Egress, Ingress};
    // Room for two flows.
    let mut h = Harness::build(Some(A_MASQ), 4);
    let udp_flow = udp_ports(NODE, B_POD1, 1000, 53);
    let tcp_flow = tcp_ports(NODE, B_POD1, 2000, 80);
    h.expect(Egress, &udp_flow, &udp_flow.between(A_MASQ_AT_B, B_POD1));
    h.expect(Egress, &tcp_flow, &tcp_flow.between(A_MASQ_AT_B, B_POD1));
    let third = udp_ports(NODE, B_POD1, 3000, 53);
    let dropped = || {
        [
            counters::outcome_slot(Link::Eth, Egress, Outcome::Dropped),
            counters::drop_slot(Link::Eth, Egress, DropReason::ConntrackFull),
        ]
        .map(|slot| h.counter(slot))
    };
    let before = dropped();
    let (ret, _) = h.run(Egress, &eth_ipv4(&third.bytes()));
    assert_eq!(ret, DROP, "a flow that cannot be tracked must not leave");
    assert_eq!(
        dropped(),
        before.map(|n| n + 1),
        "dropped, for a full table"
    );
    // Both live flows still work.
    h.expect(
        Ingress,
        &udp_ports(B_POD1, A_MASQ_AT_B, 53, 1000),
        &udp_ports(B_POD1, NODE, 53, 1000),
    );
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 2000),
        &tcp_ports(B_POD1, NODE, 80, 2000),
    );

    // The collector's clock: UDP and an unanswered SYN both live 60 s.
    let last = h
        .conntrack
        .entries()
        .unwrap()
        .iter()
        .map(|(_, nat)| nat.last_seen)
        .max()
        .unwrap();
    let timeouts = Timeouts::DEFAULT;
    let kept = h
        .conntrack
        .remove_dead(last + 59 * SECOND, &timeouts)
        .unwrap();
    assert_eq!((kept.live, kept.removed), (4, 0));
    let gone = h
        .conntrack
        .remove_dead(last + 61 * SECOND, &timeouts)
        .unwrap();
    assert_eq!((gone.live, gone.removed), (0, 4));
    h.expect(Egress, &third, &third.between(A_MASQ_AT_B, B_POD1));
}

/// A connection both sides closed is over, and the collector sees it so;
/// a SYN from the same port (a client reusing it within the close
/// timeout) opens a new one on the same masquerade, which is not.
#[test]
fn a_closed_connection_is_over_until_a_syn_from_its_port_opens_it_anew() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let fin = |src, dst, sport, dport| Datagram::new(src, dst, L4::TcpFin { sport, dport });
    let syn_ack = |src, dst, sport, dport| {
        let l4 = L4::TcpSyn {
            sport,
            dport,
            ack: true,
            mss: TUNNEL_MSS,
        };
        Datagram::new(src, dst, l4)
    };
    let open = || {
        let syn = tcp_ports(NODE, B_POD1, 40001, 80);
        h.expect(Egress, &syn, &syn.between(A_MASQ_AT_B, B_POD1));
        let answer = syn_ack(B_POD1, A_MASQ_AT_B, 80, 40001);
        h.expect(Ingress, &answer, &answer.between(B_POD1, NODE));
    };
    let states = || {
        let entries = h.conntrack.entries().unwrap();
        let state = |dir| {
            let (_, nat) = entries.iter().find(|(k, _)| k.dir == dir).unwrap();
            TcpState::from_u8(nat.state)
        };
        let flows = h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap();
        assert_eq!((entries.len(), flows.len()), (2, 1), "one flow");
        (state(DIR_OUT), state(DIR_IN), flows[0].closed)
    };
    open();
    assert_eq!(states(), (TcpState::Syn, TcpState::Established, false));
    let ours = fin(NODE, B_POD1, 40001, 80);
    h.expect(Egress, &ours, &ours.between(A_MASQ_AT_B, B_POD1));
    assert_eq!(states(), (TcpState::Fin, TcpState::Established, false));
    let theirs = fin(B_POD1, A_MASQ_AT_B, 80, 40001);
    h.expect(Ingress, &theirs, &theirs.between(B_POD1, NODE));
    assert_eq!(states(), (TcpState::Fin, TcpState::Fin, true));
    let read = h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap()[0];
    assert!(h.conntrack.still_closed(&read));
    open();
    assert_eq!(states(), (TcpState::Syn, TcpState::Established, false));
    // The collector read it closed, but it is open now: it stays.
    assert!(!h.conntrack.still_closed(&read));
    let mut h = h;
    assert_eq!(h.conntrack.remove_closed(&[read]), 0);
    assert_eq!(h.conntrack.entries().unwrap().len(), 2);
}

/// The collector removes a flow's reply entry before its outbound one:
/// between the two, a packet out still leaves by the flow's port. Removed
/// the other way round, the packet would find the port held by the reply's
/// entry and take another, and the far side would see a stranger.
#[test]
fn a_flow_half_removed_by_the_collector_keeps_its_port() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let data = |sport| {
        let l4 = L4::TcpData {
            sport,
            dport: 80,
            payload: b"more".to_vec(),
        };
        Datagram::new(NODE, B_POD1, l4)
    };
    let open = |h: &Harness, sport| {
        let syn = tcp_ports(NODE, B_POD1, sport, 80);
        h.expect(Egress, &syn, &syn.between(A_MASQ_AT_B, B_POD1));
        let answer = tcp_ports(B_POD1, A_MASQ_AT_B, 80, sport);
        h.expect(Ingress, &answer, &answer.between(B_POD1, NODE));
        h.conntrack.flows(0, &Timeouts::DEFAULT).unwrap()[0]
    };
    let out_port = |h: &Harness| {
        let entries = h.conntrack.entries().unwrap();
        let (_, nat) = entries.iter().find(|(k, _)| k.dir == DIR_OUT).unwrap();
        nat.port
    };

    let flow = open(&h, 40001);
    let [first, second] = flow.keys() else {
        panic!("a masqueraded flow has two entries: {flow:?}")
    };
    assert_eq!((first.dir, second.dir), (DIR_IN, DIR_OUT), "reply first");
    assert_eq!(h.conntrack.remove(&[*first]), 1);
    let more = data(40001);
    h.expect(Egress, &more, &more.between(A_MASQ_AT_B, B_POD1));
    assert_eq!(h.conntrack.remove(&[*second]), 1);

    // The hazard the order avoids: the outbound entry gone first.
    let flow = open(&h, 40002);
    assert_eq!(h.conntrack.remove(&flow.keys()[1..]), 1);
    let (ret, _) = h.run(Egress, &eth_ipv4(&data(40002).bytes()));
    assert_eq!(ret, HAND_ON);
    assert_ne!(out_port(&h), 40002, "the reply's entry still holds 40002");
}

/// The collector reads a table of many thousand entries whole, though the
/// kernel hands them over a few thousand at a time.
#[test]
fn the_collector_reads_every_entry_of_a_table_larger_than_one_batch() {
    const FLOWS: u16 = 10_000;
    let h = Harness::build(Some(A_MASQ), 4 * u32::from(FLOWS));
    for port in 1..=FLOWS {
        let flow = udp_ports(NODE, B_POD1, port, 53);
        let (ret, _) = h.run(Direction::Egress, &eth_ipv4(&flow.bytes()));
        assert_ne!(ret, DROP, "flow {port} was not tracked");
    }
    let entries = h.conntrack.entries().unwrap();
    let keys: std::collections::HashSet<_> = entries.iter().map(|(key, _)| *key).collect();
    assert_eq!(
        entries.len(),
        2 * usize::from(FLOWS),
        "an entry per direction"
    );
    assert_eq!(keys.len(), entries.len(), "no entry read twice");
    let outbound = entries
        .iter()
        .filter(|(key, _)| key.dir == isthmus_common::conntrack::DIR_OUT)
        .count();
    assert_eq!(outbound, usize::from(FLOWS));
}

/// The collector as the agent runs it, with no clock of its own to wait on.
fn sharing() -> Sharing {
    Sharing {
        every: std::time::Duration::ZERO,
        reserve_percent: 25,
        share: Share::Equal,
    }
}

fn test_metrics() -> std::sync::Arc<Metrics> {
    let build = BuildInfo {
        node: "test",
        role: "gateway",
        attach_mode: "tcx",
        xdp_mode: "none",
    };
    Metrics::new(None, None, build).unwrap()
}

/// A peer's transit flows fill only that peer's share of the conntrack:
/// the next one is dropped and counted against that peer, while the other
/// peer's flows and the gateway's own still find room. The collector then
/// evicts that peer's oldest flow that was never answered, not its
/// answered one, and its next flow fits.
#[test]
fn a_peers_flows_fill_only_its_share_and_its_unanswered_ones_go_first() {
    use Direction::{Egress, Ingress};
    // 16 entries, 4 kept for the gateway: two peers, 6 entries (3 flows) each.
    let mut h = Harness::build(Some(A_MASQ), 16);
    let metrics = test_metrics();
    let mut sweeper = Sweeper::new(16, 4);
    let peers = [1, 2];
    sweeper.pass(
        &mut h.conntrack,
        &mut h.rooms,
        &peers,
        sharing(),
        true,
        &metrics,
    );
    // Peer s (ID 2) sends three transit flows towards b; b answers the first.
    // Not S_POD: a NatMapping exposes that one, and it is not masqueraded.
    let transit = |port| udp_ports(S_POD2, B_POD1, port, 53);
    for port in [5000, 5001, 5002] {
        h.expect(
            Egress,
            &transit(port),
            &transit(port).between(A_MASQ_AT_B, B_POD1),
        );
    }
    h.expect(
        Ingress,
        &udp_ports(B_POD1, A_MASQ_AT_B, 53, 5000),
        &udp_ports(B_POD1, S_POD2, 53, 5000),
    );
    let refused = |owner, short| h.rooms.refused(FlowTable::Conntrack, owner, short).unwrap();
    h.expect_dropped(
        "a fourth flow of peer s",
        Egress,
        &transit(5003).bytes(),
        DropReason::ConntrackFull,
        None,
    );
    assert_eq!(
        refused(2, Short::Share),
        1,
        "counted against peer s's share"
    );
    assert_eq!(refused(OWNER_LOCAL, Short::Share), 0);
    // The gateway's own flow, and flows of the other peer, still fit.
    let own = udp_ports(NODE, B_POD1, 6000, 53);
    h.expect(Egress, &own, &own.between(A_MASQ_AT_B, B_POD1));

    // The collector sees the refusal: s's oldest unanswered flow (5001)
    // goes; the answered one stays.
    sweeper.pass(
        &mut h.conntrack,
        &mut h.rooms,
        &peers,
        sharing(),
        false,
        &metrics,
    );
    let ports: Vec<u16> = h
        .conntrack
        .entries()
        .unwrap()
        .iter()
        .filter(|(k, nat)| k.dir == isthmus_common::conntrack::DIR_OUT && nat.owner == 2)
        .map(|(k, _)| k.sport)
        .collect();
    let mut ports = ports;
    ports.sort();
    assert_eq!(
        ports,
        [5000, 5002],
        "the oldest unanswered flow was evicted"
    );
    let room = h.rooms.room(FlowTable::Conntrack, 2).unwrap();
    assert_eq!((room.limit, room.used(room.charged)), (6, 4));
    let all = h.rooms.room(FlowTable::Conntrack, ALL_PEERS).unwrap();
    assert_eq!(all.limit, 12);
    h.expect(
        Egress,
        &transit(5003),
        &transit(5003).between(A_MASQ_AT_B, B_POD1),
    );
}

/// Flows towards a segregated peer are charged to that peer: past its
/// share, its next one is dropped and counted against it.
#[test]
fn flows_towards_a_segregated_peer_are_bounded_by_its_share() {
    use Direction::Egress;
    let mut h = Harness::segregated(8);
    let metrics = test_metrics();
    let mut sweeper = Sweeper::new(8, 0);
    // Two peers: b (ID 1, segregated) gets half the table.
    sweeper.pass(
        &mut h.peer_flows,
        &mut h.rooms,
        &[1, 2],
        sharing(),
        true,
        &metrics,
    );
    for port in 40000..40004 {
        let flow = tcp_ports(A_POD1, B_POD1, port, 443);
        h.expect(Egress, &flow, &tcp_ports(A_POD1_AT_B, B_POD1, port, 443));
    }
    h.expect_dropped(
        "a fifth flow towards b",
        Egress,
        &tcp_ports(A_POD1, B_POD1, 40004, 443).bytes(),
        DropReason::PeerFlowsFull,
        None,
    );
    let refused = h
        .rooms
        .refused(FlowTable::PeerFlows, 1, Short::Share)
        .unwrap();
    assert_eq!(refused, 1);
    // None answered: the collector evicts the oldest, and the next fits.
    sweeper.pass(
        &mut h.peer_flows,
        &mut h.rooms,
        &[1, 2],
        sharing(),
        false,
        &metrics,
    );
    assert_eq!(h.peer_flows.entries().unwrap().len(), 3);
    let flow = tcp_ports(A_POD1, B_POD1, 40004, 443);
    h.expect(Egress, &flow, &tcp_ports(A_POD1_AT_B, B_POD1, 40004, 443));
}

/// After the ingress translation, a peer reaches only our networks, its
/// NatMapping endpoints and the sources of flows we masqueraded. Anything
/// else it sends is dropped, and counted for that peer and reason; what we
/// send and cannot parse still goes.
#[test]
fn a_peer_reaches_only_our_networks_its_mappings_and_our_flows() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let mut truncated = tcp_header_cut_at(10);
    truncated[12..16].copy_from_slice(&B_POD1);
    truncated[16..20].copy_from_slice(&A_POD1_AT_B);
    truncated[10..12].fill(0);
    let check = isthmus_common::csum::checksum(&truncated[..20]);
    truncated[10..12].copy_from_slice(&check.bytes());
    let denied = [
        (
            "to a node address",
            udp(B_POD1, NODE).bytes(),
            1,
            DenyReason::NodeAddress,
        ),
        (
            "to a NatMapping entry that leads to a node",
            tcp(B_POD1, NODE_EXT_AT_B).bytes(),
            1,
            DenyReason::NodeAddress,
        ),
        (
            "to peer s, with no NatMapping",
            udp(B_POD1, S_POD).bytes(),
            1,
            DenyReason::OtherPeer,
        ),
        (
            "to a ClusterIP",
            tcp(B_POD2, [10, 96, 0, 10]).bytes(),
            1,
            DenyReason::OutsideOurNetworks,
        ),
        (
            "from s to b's pods",
            udp(S_POD, B_POD1).bytes(),
            2,
            DenyReason::OtherPeer,
        ),
        (
            "to the conncheck's address, not its port",
            tcp(B_POD1, A_EXT_FIRST_AT_B).bytes(),
            1,
            DenyReason::NodeAddress,
        ),
        (
            "that cannot be parsed",
            truncated.clone(),
            1,
            DenyReason::Unparseable,
        ),
    ];
    for (name, packet, peer, reason) in denied {
        h.expect_dropped(
            name,
            Ingress,
            &packet,
            DropReason::Denied,
            Some((peer, reason)),
        );
    }
    // Allowed: our pods, the endpoint b's NatMapping names, a flow we masqueraded.
    h.expect(Ingress, &udp(B_POD1, A_POD1_AT_B), &udp(B_POD1, A_POD1));
    h.expect(Ingress, &udp(B_POD1, MAPPED_EXT_AT_B), &udp(B_POD1, S_POD));
    h.expect(
        Egress,
        &tcp_ports(NODE, B_POD1, 40100, 80),
        &tcp_ports(A_MASQ_AT_B, B_POD1, 40100, 80),
    );
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_MASQ_AT_B, 80, 40100),
        &tcp_ports(B_POD1, NODE, 80, 40100),
    );
    // What we send and cannot parse goes on, as before.
    let mut ours = truncated;
    ours[12..20].copy_from_slice(&[A_POD1, B_POD1].concat());
    assert_eq!(
        h.run(Egress, &eth_ipv4(&ours)).0,
        HAND_ON,
        "our own unparseable packet"
    );
}

/// The same packet with IPv4 identification `id`, its header checksum
/// computed again.
fn with_id(mut packet: Vec<u8>, id: u16) -> Vec<u8> {
    packet[4..6].copy_from_slice(&id.to_be_bytes());
    packet[10..12].fill(0);
    let check = isthmus_common::csum::checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&check.bytes());
    packet
}

/// A masqueraded datagram in fragments: the first gets the flow's address
/// and port, the later ones (no ports) the same address, both ways; a later
/// fragment whose first was never seen is dropped and counted, never sent
/// with an address the far side cannot answer.
#[test]
fn the_fragments_of_a_masqueraded_datagram_go_where_the_first_went() {
    use Direction::{Egress, Ingress};
    let h = Harness::build(Some(A_MASQ), names::DEFAULT_CONNTRACK);
    let datagram = |src, dst, sport, dport| {
        Datagram::new(
            src,
            dst,
            L4::Udp {
                sport,
                dport,
                payload: (0..64).collect(),
                zero_csum: false,
            },
        )
    };
    let out = datagram(NODE, B_POD1, 5353, 53);
    let out_nat = out.between(A_MASQ_AT_B, B_POD1);
    let back = datagram(B_POD1, A_MASQ_AT_B, 53, 5353);
    let back_nat = back.between(B_POD1, NODE);
    for (direction, whole, translated) in [(Egress, &out, &out_nat), (Ingress, &back, &back_nat)] {
        for (from, to) in [(0, 32), (32, 72)] {
            let (ret, got) = h.run(direction, &eth_ipv4(&whole.fragment(from, to)));
            assert_eq!(ret, HAND_ON, "{direction:?} fragment at {from}");
            assert_eq!(
                hex(&got),
                hex(&eth_ipv4(&translated.fragment(from, to))),
                "{direction:?} fragment at {from}"
            );
        }
        let unknown = |h: &Harness| {
            h.counter(counters::drop_slot(
                Link::Eth,
                direction,
                DropReason::UnknownFragment,
            ))
        };
        let before = unknown(&h);
        let stray = eth_ipv4(&with_id(whole.fragment(32, 72), 0x4321));
        assert_eq!(
            h.run(direction, &stray),
            (DROP, stray.clone()),
            "{direction:?} stray"
        );
        assert_eq!(unknown(&h), before + 1, "{direction:?}: counted");
    }
}

#[test]
fn a_segregated_peer_reaches_only_what_it_is_allowed_and_our_flows() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::segregated(names::DEFAULT_PEER_FLOWS);
    let not_allowed = Some((1, DenyReason::NotAllowed));
    let allow = |h: &mut Harness, key| h.allowed.put(key, &1, None).unwrap();
    // Nothing allowed yet: b opens nothing in our networks.
    let to_pod1 = tcp_ports(B_POD1, A_POD1_AT_B, 40000, 18080);
    h.expect_dropped(
        "before any allow",
        Ingress,
        &to_pod1.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // An endpoint exported to b: that protocol and port alone.
    allow(
        &mut h,
        AllowKey::endpoint(1, Be32::from_bytes(A_POD1), PROTO_TCP, 18080),
    );
    h.expect(Ingress, &to_pod1, &tcp_ports(B_POD1, A_POD1, 40000, 18080));
    let other_port = tcp_ports(B_POD1, A_POD1_AT_B, 40000, 18082);
    h.expect_dropped(
        "another port",
        Ingress,
        &other_port.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    let udp_same_port = udp_ports(B_POD1, A_POD1_AT_B, 40000, 18080);
    h.expect_dropped(
        "udp on that port",
        Ingress,
        &udp_same_port.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // A pod offloaded from b: any port, any protocol, pings too.
    allow(&mut h, AllowKey::any_port(1, Be32::from_bytes(A_POD2)));
    h.expect(Ingress, &udp(B_POD1, A_POD2_AT_B), &udp(B_POD1, A_POD2));
    let echo = Datagram::new(B_POD1, A_POD2_AT_B, L4::Echo { id: 5, seq: 1 });
    h.expect(Ingress, &echo, &echo.between(B_POD1, A_POD2));
    // b's NatMapping endpoint, as before.
    h.expect(Ingress, &udp(B_POD1, MAPPED_EXT_AT_B), &udp(B_POD1, S_POD));
    // A flow a-pod1 opens towards b: its replies pass, a flow b opens does not.
    let out = tcp_ports(A_POD1, B_POD1, 40200, 443);
    h.expect(Egress, &out, &tcp_ports(A_POD1_AT_B, B_POD1, 40200, 443));
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_POD1_AT_B, 443, 40200),
        &tcp_ports(B_POD1, A_POD1, 443, 40200),
    );
    let other_flow = tcp_ports(B_POD1, A_POD1_AT_B, 443, 40201);
    h.expect_dropped(
        "not our flow",
        Ingress,
        &other_flow.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    let ping = Datagram::new(A_POD1, B_POD1, L4::Echo { id: 31, seq: 1 });
    h.expect(Egress, &ping, &ping.between(A_POD1_AT_B, B_POD1));
    let pong = Datagram::new(B_POD1, A_POD1_AT_B, L4::EchoReply { id: 31, seq: 1 });
    h.expect(Ingress, &pong, &pong.between(B_POD1, A_POD1));
    // ICMP errors about our flow pass, quoting it as it left; about another, not.
    let quoted = tcp_ports(A_POD1_AT_B, B_POD1, 40200, 443);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, len);
    let want = err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1);
    h.expect(Ingress, &err, &want);
    let stray = icmp_error(
        3,
        4,
        B_GW_WAN,
        A_POD1_AT_B,
        tcp_ports(A_POD1_AT_B, B_POD1, 40999, 443),
        len,
    );
    h.expect_dropped(
        "an error about no flow of ours",
        Ingress,
        &stray.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // A forged error that quotes too little of our flow to name it: the
    // quote ends inside the ports, so nothing vouches for it.
    let quoted = tcp_ports(A_POD1_AT_B, B_POD1, 40200, 443);
    let short = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, 20 + 4);
    h.expect_dropped(
        "an error quoting 4 bytes of our flow",
        Ingress,
        &short.bytes(),
        DropReason::Denied,
        not_allowed,
    );
    // Peer s is not segregated: it reaches our pods as ever.
    h.expect(Ingress, &udp(S_POD, A_POD1_AT_S), &udp(S_POD, A_POD1));
}

#[test]
fn a_full_table_of_flows_towards_a_segregated_peer_drops_new_ones_and_keeps_the_rest() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::segregated(1);
    let first = tcp_ports(A_POD1, B_POD1, 40300, 443);
    h.expect(Egress, &first, &tcp_ports(A_POD1_AT_B, B_POD1, 40300, 443));
    let second = tcp_ports(A_POD1, B_POD1, 40301, 443);
    h.expect_dropped(
        "a second flow",
        Egress,
        &second.bytes(),
        DropReason::PeerFlowsFull,
        None,
    );
    // The first flow's packets and replies go on.
    h.expect(Egress, &first, &tcp_ports(A_POD1_AT_B, B_POD1, 40300, 443));
    h.expect(
        Ingress,
        &tcp_ports(B_POD1, A_POD1_AT_B, 443, 40300),
        &tcp_ports(B_POD1, A_POD1, 443, 40300),
    );
    // Once collected past the lifetime of its state, as the conntrack's
    // flows are, the room goes to the next flow.
    let [(_, life)] = h.peer_flows.entries().unwrap()[..] else {
        panic!("one flow recorded")
    };
    let (ours, theirs) = (TcpState::from_u8(life.ours), TcpState::from_u8(life.theirs));
    let lifetime = Timeouts::DEFAULT.lifetime(PROTO_TCP, ours, theirs) * SECOND;
    let kept = h
        .peer_flows
        .remove_dead(life.last_seen + lifetime - SECOND, &Timeouts::DEFAULT);
    assert_eq!(kept.map(|c| (c.live, c.removed)).unwrap(), (1, 0));
    let gone = h
        .peer_flows
        .remove_dead(life.last_seen + lifetime + SECOND, &Timeouts::DEFAULT);
    assert_eq!(gone.map(|c| (c.live, c.removed)).unwrap(), (0, 1));
    h.expect(Egress, &second, &tcp_ports(A_POD1_AT_B, B_POD1, 40301, 443));
}

/// Each direction of a flow towards a segregated peer is judged by what it
/// said itself: our SYN-ACK to the peer's SYN (on an exported port) starts
/// no flow of ours; our data the peer never answers lives a SYN's 60 s; a
/// flow it answered, an established one's six hours. An ICMP error quoting
/// our flow is no answer.
#[test]
fn a_flow_towards_a_segregated_peer_lives_long_only_once_both_sides_spoke() {
    use Direction::{Egress, Ingress};
    let mut h = Harness::segregated(names::DEFAULT_PEER_FLOWS);
    h.allowed
        .put(
            AllowKey::endpoint(1, Be32::from_bytes(A_POD1), PROTO_TCP, 18080),
            &1,
            None,
        )
        .unwrap();
    let segment = |src, dst, sport, dport, ack| {
        let l4 = L4::TcpSyn {
            sport,
            dport,
            ack,
            mss: TUNNEL_MSS,
        };
        Datagram::new(src, dst, l4)
    };
    let data = |src, dst, sport, dport| {
        let payload = b"data".to_vec();
        Datagram::new(
            src,
            dst,
            L4::TcpData {
                sport,
                dport,
                payload,
            },
        )
    };
    // b opens a connection to the exported port; our pod answers SYN-ACK.
    let syn = segment(B_POD1, A_POD1_AT_B, 41000, 18080, false);
    h.expect(Ingress, &syn, &syn.between(B_POD1, A_POD1));
    let syn_ack = segment(A_POD1, B_POD1, 18080, 41000, true);
    h.expect(Egress, &syn_ack, &syn_ack.between(A_POD1_AT_B, B_POD1));
    assert!(
        h.peer_flows.entries().unwrap().is_empty(),
        "our SYN-ACK started a flow of ours"
    );
    // Our own flows: one b answers, one it never does (an ICMP error
    // quoting it does not count).
    let answered = data(A_POD1, B_POD1, 40500, 443);
    h.expect(Egress, &answered, &answered.between(A_POD1_AT_B, B_POD1));
    let answer = data(B_POD1, A_POD1_AT_B, 443, 40500);
    h.expect(Ingress, &answer, &answer.between(B_POD1, A_POD1));
    let ignored = data(A_POD1, B_POD1, 40501, 443);
    h.expect(Egress, &ignored, &ignored.between(A_POD1_AT_B, B_POD1));
    let quoted = data(A_POD1_AT_B, B_POD1, 40501, 443);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, len);
    h.expect(
        Ingress,
        &err,
        &err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1),
    );
    let flows = h.peer_flows.entries().unwrap();
    let theirs = |port: u16| {
        let (_, flow) = flows.iter().find(|(k, _)| k.dport == port).unwrap();
        (TcpState::from_u8(flow.ours), TcpState::from_u8(flow.theirs))
    };
    assert_eq!(
        theirs(40500),
        (TcpState::Established, TcpState::Established)
    );
    assert_eq!(theirs(40501), (TcpState::Established, TcpState::None));
    let last = flows.iter().map(|(_, f)| f.last_seen).max().unwrap();
    let collected = h
        .peer_flows
        .remove_dead(last + 61 * SECOND, &Timeouts::DEFAULT)
        .unwrap();
    assert_eq!((collected.live, collected.removed), (1, 1));
    let [(key, _)] = h.peer_flows.entries().unwrap()[..] else {
        panic!("one flow left")
    };
    assert_eq!(
        key.dport, 40500,
        "the unanswered flow outlived a SYN's lifetime"
    );
}
