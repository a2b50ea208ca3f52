//! The real NAT programs, run by the kernel on crafted packets
//! (`BPF_PROG_TEST_RUN`). Every output frame is compared whole, byte for
//! byte, with one built from scratch with full checksums.
//!
//! The kernel runs `SCHED_CLS` test programs on Ethernet frames only, so this
//! table drives the `_eth` programs; the `_ip` ones share their code and
//! differ only in the header offset, and are exercised on tun in the lab.

mod ipv6;
mod isolation;
mod isolation6;
mod liqo_v1;
mod liqo_v1_ipv6;
mod masquerade;
mod masquerade6;
mod packet_shapes;
mod shares;
mod tail_calls;

use aya::{Ebpf, EbpfLoader, programs::SchedClassifier};

use isthmus_agent::{
    kernel::conntrack::{Conntrack, Masquerade, PeerFlows, SweptTable},
    kernel::dataplane::{OBJECT, load_nat_stages},
    kernel::maps::{ByteHash, Counters, MappingMap},
    kernel::peer_table::PeerMap,
    kernel::room::Rooms,
    kernel::table::KernelTable,
    model::isolation::SecurityMode,
    model::object::{Object, parse_documents},
    model::peer::Peer,
    observe::metrics::{BuildInfo, Metrics},
    roles::flows::{FragmentBudgets, Share, Sharing, Sweeper},
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
    packet::{Addr, Datagram, ETH_P_ARP, ETH_P_IPV6, L4, eth_ipv4, ethernet, tcp, udp, with_id},
    require_root, test_run,
};

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

/// A NatMapping for peer b (id 1) exposes `S_POD` to b at this externalIP of ours...
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

/// `TC_ACT_UNSPEC`: the programs always hand the packet on.
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
    allowed: ByteHash<AllowKey>,
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
            .map_max_entries(names::MAP_CONNTRACK6, capacity)
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
        // What the ingress NAT goes on in, as the agent loads it.
        load_nat_stages(&mut ebpf).unwrap();
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
        let conntrack = Conntrack::new(
            ebpf.take_map(names::MAP_CONNTRACK).unwrap(),
            ebpf.take_map(names::MAP_CONNTRACK6).unwrap(),
        )
        .unwrap();
        Masquerade::<Be32>::new(ebpf.take_map(names::MAP_SNAT).unwrap())
            .unwrap()
            .set(masquerade.map(Be32::from_bytes))
            .unwrap();
        let mut nodes: ByteHash<Be32> =
            ByteHash::new(ebpf.take_map(names::MAP_NODE_ADDRS).unwrap()).unwrap();
        for node in [NODE, NODE2, NODE3] {
            nodes.put(Be32::from_bytes(node), &1, None).unwrap();
        }
        let mut mss =
            aya::maps::Array::<_, u32>::try_from(ebpf.map_mut(names::MAP_TCP_MSS).unwrap())
                .unwrap();
        mss.set(0, u32::from(TUNNEL_MSS), 0).unwrap();
        let counters = Counters::new(ebpf.take_map(names::MAP_COUNTERS).unwrap()).unwrap();
        let denied = Counters::denied(ebpf.take_map(names::MAP_PEER_DENIED).unwrap()).unwrap();
        let allowed = ByteHash::new(ebpf.take_map(names::MAP_ALLOWED).unwrap()).unwrap();
        let peer_flows = PeerFlows::new(
            ebpf.take_map(names::MAP_PEER_FLOWS).unwrap(),
            ebpf.take_map(names::MAP_PEER_FLOWS6).unwrap(),
        )
        .unwrap();
        let rooms = Rooms::new(
            ebpf.take_map(names::MAP_ROOM).unwrap(),
            ebpf.take_map(names::MAP_ROOM_REFUSED).unwrap(),
            ebpf.take_map(names::MAP_FRAGMENT_BUDGET).unwrap(),
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

/// a-gw's masquerade address, and how b sees it.
const A_MASQ: Addr = [10, 244, 0, 254];

const A_MASQ_AT_B: Addr = [10, 0, 40, 254];

/// Addresses of none of a's networks: the node's own, and a transit source.
const NODE: Addr = [172, 16, 1, 1];

const NODE2: Addr = [172, 16, 1, 2];

/// A node no test sends from: a forged NatMapping entry leads to it.
const NODE3: Addr = [172, 16, 1, 3];

const TRANSIT: Addr = [10, 1, 0, 6];

/// `TC_ACT_SHOT`.
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

/// A UDP datagram of 72 bytes, which [`Datagram::fragment`] cuts at 32.
fn udp_in_fragments(src: Addr, dst: Addr, sport: u16, dport: u16) -> Datagram {
    udp_carrying(src, dst, (sport, dport), (0..64).collect())
}

fn udp_ports(src: Addr, dst: Addr, sport: u16, dport: u16) -> Datagram {
    udp_carrying(src, dst, (sport, dport), b"dns?".to_vec())
}

fn udp_carrying(src: Addr, dst: Addr, (sport, dport): (u16, u16), payload: Vec<u8>) -> Datagram {
    Datagram::new(
        src,
        dst,
        L4::Udp {
            sport,
            dport,
            payload,
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
        want.sort_unstable();
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

/// The collector as the agent runs it, with no clock of its own to wait on.
fn sharing() -> Sharing {
    Sharing {
        every: std::time::Duration::ZERO,
        longest: std::time::Duration::ZERO,
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

/// A TCP datagram whose IP total length admits only `keep` bytes of TCP.
fn tcp_header_cut_at(keep: usize) -> Vec<u8> {
    cut_at(tcp(A_POD1, B_POD1), keep)
}

/// `packet` with an IP total length that admits only `keep` bytes past
/// its header.
fn cut_at(packet: Datagram, keep: usize) -> Vec<u8> {
    let mut bytes = packet.bytes();
    bytes.truncate(20 + keep);
    let total = (bytes.len() as u16).to_be_bytes();
    bytes[2..4].copy_from_slice(&total);
    bytes[10..12].fill(0);
    let check = isthmus_common::csum::checksum(&bytes[..20]);
    bytes[10..12].copy_from_slice(&check.bytes());
    bytes
}
