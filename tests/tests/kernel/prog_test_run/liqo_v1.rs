//! A Liqo v1 peer (docs/design.md#liqo-v1-peers): cluster a serves b the
//! v1 way, so a rewrites b's addresses and b rewrites a's. Egress runs
//! `nat_egress_eth`, which goes on in `peer_dnat_eth`; ingress runs
//! `peer_snat_eth`, which goes on in `nat_ingress_eth`, as on the tunnel
//! device of a gateway. Each output frame is compared whole.

use aya::maps::{HashMap as BpfHashMap, ProgramArray};
use isthmus_agent::model::{
    liqo_v1::{Companions, PeerNetworks},
    object::ObjectKey,
};
use isthmus_common::{
    counters::{OUTCOMES, Outcome},
    nat::PeerKey,
    wire::Be32,
};

use super::*;

/// b-pod1 as it really is, and as a sees it: the same real address as
/// a-pod1's.
pub(super) const B_POD1_REAL: Addr = [10, 244, 0, 5];

/// An address of b's ExternalCIDR, in a's view and as it really is.
const B_EXT_REAL: Addr = [192, 168, 0, 45];

/// An IP object of a: `status.ip` in our ExternalCIDR, exposing `spec.ip`,
/// a host of a's LAN.
const IP_EXPOSED: Addr = [192, 168, 0, 20];

const IP_TARGET: Addr = [172, 16, 1, 20];

/// The loopback device, which `BPF_PROG_TEST_RUN` runs packets on: here
/// the tunnel device that carries b alone.
const TEST_RUN_IFINDEX: u32 = 1;

/// The programs of a gateway that serves b the Liqo v1 way.
pub(super) struct V1 {
    pub(super) ebpf: Ebpf,
    pub(super) counters: Counters,
    denied: Counters,
}

impl V1 {
    pub(super) fn new() -> Self {
        require_root();
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .expect("loading the eBPF object");
        // What the ingress NAT goes on in, as the agent loads it.
        load_nat_stages(&mut ebpf).unwrap();
        let slot6 = |direction| Link::Eth.icmp_error_slot(direction);
        for (array, slot, program) in [
            (names::MAP_PEER_DNAT, Link::Eth as u32, "peer_dnat_eth"),
            (names::MAP_NAT_IN, Link::Eth as u32, names::PROG_INGRESS_ETH),
            (
                names::MAP_PEER_REMAP6,
                slot6(Direction::Egress),
                "peer_dnat6_eth",
            ),
            (
                names::MAP_PEER_REMAP6,
                slot6(Direction::Ingress),
                "peer_snat6_eth",
            ),
        ] {
            let prog: &mut SchedClassifier = ebpf.program_mut(program).unwrap().try_into().unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {program}: {e}"));
            let fd = prog.fd().unwrap().try_clone().unwrap();
            let mut map = ProgramArray::try_from(ebpf.map_mut(array).unwrap()).unwrap();
            map.set(slot, &fd, 0).unwrap();
        }
        for program in [names::PROG_EGRESS_ETH, names::PROG_PEER_SNAT_ETH] {
            let prog: &mut SchedClassifier = ebpf.program_mut(program).unwrap().try_into().unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {program}: {e}"));
        }
        let peer = a_serving_b();
        let mut peers = PeerMap::new(
            ebpf.take_map(names::MAP_PEERS).unwrap(),
            ebpf.take_map(names::MAP_PEER_OWNERS).unwrap(),
            ebpf.take_map(names::MAP_PREFIX_LENS).unwrap(),
        )
        .unwrap();
        for (_, net) in peer.views() {
            peers
                .put(net, &peer.nat(1, SecurityMode::FullPodToPod), None)
                .unwrap();
        }
        let (_, pod_view) = peer.views()[0];
        let mut devices: BpfHashMap<_, u32, PeerKey> =
            BpfHashMap::try_from(ebpf.map_mut(names::MAP_PEER_DEVS).unwrap()).unwrap();
        let key = PeerKey::of(Be32::from(pod_view.network()), pod_view.prefix_len());
        devices.insert(TEST_RUN_IFINDEX, key, 0).unwrap();
        liqo_v1_ipv6::add_peer(&mut ebpf, &peer, TEST_RUN_IFINDEX);
        let mut mappings = MappingMap::new(
            ebpf.take_map(names::MAP_NATMAP).unwrap(),
            ebpf.take_map(names::MAP_NATMAP_REV).unwrap(),
        )
        .unwrap();
        let exposed = MappingKey {
            peer_id: 1,
            addr: Be32::from_bytes(IP_EXPOSED),
        };
        mappings
            .put(exposed, &Be32::from_bytes(IP_TARGET), None)
            .unwrap();
        let mut nodes: ByteHash<Be32> =
            ByteHash::new(ebpf.take_map(names::MAP_NODE_ADDRS).unwrap()).unwrap();
        nodes.put(Be32::from_bytes(NODE), &1, None).unwrap();
        let counters = Counters::new(ebpf.take_map(names::MAP_COUNTERS).unwrap()).unwrap();
        let denied = Counters::denied(ebpf.take_map(names::MAP_PEER_DENIED).unwrap()).unwrap();
        Self {
            ebpf,
            counters,
            denied,
        }
    }

    pub(super) fn run(&self, direction: Direction, packet: &Datagram) -> (i32, Vec<u8>) {
        self.run_frame(direction, &eth_ipv4(&packet.bytes()))
    }

    /// Runs the Ethernet frame `frame` through the gateway's programs for
    /// `direction`: the egress NAT, or the tunnel device's peer SNAT.
    pub(super) fn run_frame(&self, direction: Direction, frame: &[u8]) -> (i32, Vec<u8>) {
        let name = match direction {
            Direction::Egress => names::PROG_EGRESS_ETH,
            Direction::Ingress => names::PROG_PEER_SNAT_ETH,
        };
        let prog: &SchedClassifier = self.ebpf.program(name).unwrap().try_into().unwrap();
        let (action, out) = test_run(prog, frame);
        (action as i32, out)
    }

    /// Runs `input` and asserts the packet went on as exactly `want`, and
    /// that the kinds of rule counted moved by `kinds`.
    fn expect(
        &self,
        name: &str,
        direction: Direction,
        input: &Datagram,
        want: &Datagram,
        kinds: &[Kind],
    ) {
        let [input, want] = [input, want].map(|d| eth_ipv4(&d.bytes()));
        self.expect_frame(name, direction, &input, &want, kinds);
    }

    /// As [`V1::expect`], of Ethernet frames.
    pub(super) fn expect_frame(
        &self,
        name: &str,
        direction: Direction,
        input: &[u8],
        want: &[u8],
        kinds: &[Kind],
    ) {
        let before = self.counters.read().unwrap();
        let (ret, out) = self.run_frame(direction, input);
        assert_eq!(ret, HAND_ON, "{name}");
        assert_eq!(hex(&out), hex(want), "{name}");
        let after = self.counters.read().unwrap();
        for kind in [
            Kind::Prefix,
            Kind::NatMapping,
            Kind::Masquerade,
            Kind::MssClamp,
        ] {
            let slot = counters::kind_slot(Link::Eth, direction, kind) as usize;
            let want = u64::from(kinds.contains(&kind));
            assert_eq!(after[slot] - before[slot], want, "{name}: {kind:?} counted");
        }
    }

    /// Runs `input` and asserts it was dropped, counted as denied to b for
    /// `reason`, and given one outcome: dropped.
    fn expect_denied(&self, name: &str, input: &[u8], reason: DenyReason) {
        self.expect_denied_frame(name, &eth_ipv4(input), reason);
    }

    /// As [`V1::expect_denied`], of an Ethernet frame.
    pub(super) fn expect_denied_frame(&self, name: &str, frame: &[u8], reason: DenyReason) {
        let before = self.denied.read().unwrap();
        let outcomes_before = self.counters.read().unwrap();
        let prog: &SchedClassifier = self
            .ebpf
            .program(names::PROG_PEER_SNAT_ETH)
            .unwrap()
            .try_into()
            .unwrap();
        let (ret, _) = test_run(prog, frame);
        assert_eq!(ret as i32, DROP, "{name}");
        let after = self.denied.read().unwrap();
        let slot = counters::deny_slot(1, reason) as usize;
        assert_eq!(
            after[slot] - before[slot],
            1,
            "{name}: denied for {reason:?}"
        );
        let outcomes = self.counters.read().unwrap();
        let moved: Vec<Outcome> = OUTCOMES
            .into_iter()
            .filter(|o| {
                let slot = counters::outcome_slot(Link::Eth, Direction::Ingress, *o) as usize;
                outcomes[slot] != outcomes_before[slot]
            })
            .collect();
        assert_eq!(moved, [Outcome::Dropped], "{name}: its outcome");
    }
}

/// Cluster a's peer b, from a `Configuration` as Liqo v1 writes it for the
/// dual-stack lab's peering: b's networks are a's own, seen as
/// `10.0.0.0/24` and `10.0.1.0/24`, and `fd00:10::/64` and `fd00:10:0:1::/64`.
fn a_serving_b() -> Peer {
    let yaml = serde_yaml_ng::to_string(&PEERINGS[0].dual_stack_configuration()).unwrap();
    let docs = parse_documents("configuration.yaml".as_ref(), &yaml);
    let Ok(Object::Configuration(raw)) = &docs[0] else {
        panic!("{docs:?}")
    };
    let networks = PeerNetworks::from_configuration(raw, "configuration.yaml").unwrap();
    let key = ObjectKey::clone(&raw.key);
    networks.peer(&key, "configuration.yaml", Companions::default())
}

#[test]
fn towards_a_v1_peer_its_address_goes_back_to_the_real_one_and_ours_stays() {
    use Direction::Egress;
    let v1 = V1::new();
    v1.expect(
        "tcp to b-pod1",
        Egress,
        &tcp(A_POD1, B_POD1),
        &tcp(A_POD1, B_POD1_REAL),
        &[Kind::Prefix],
    );
    v1.expect(
        "udp to b's ExternalCIDR",
        Egress,
        &udp(A_POD1, B_EXT),
        &udp(A_POD1, B_EXT_REAL),
        &[Kind::Prefix],
    );
    v1.expect(
        "a reply from what an IP object exposes",
        Egress,
        &tcp(IP_TARGET, B_POD1),
        &tcp(IP_EXPOSED, B_POD1_REAL),
        &[Kind::Prefix, Kind::NatMapping],
    );
    v1.expect(
        "our ICMP error quotes b's packet: its source goes back too",
        Egress,
        &icmp_error(3, 3, A_POD1, B_POD1, udp(B_POD1, A_POD1), 28),
        &icmp_error(3, 3, A_POD1, B_POD1_REAL, udp(B_POD1_REAL, A_POD1), 28),
        &[Kind::Prefix],
    );
    v1.expect(
        "not a peer's",
        Egress,
        &tcp(A_POD1, [8, 8, 8, 8]),
        &tcp(A_POD1, [8, 8, 8, 8]),
        &[],
    );
}

#[test]
fn from_a_v1_peer_its_real_source_goes_to_our_view_before_the_nat() {
    use Direction::Ingress;
    let v1 = V1::new();
    v1.expect(
        "b-pod1 to a-pod1: the same real address on both ends",
        Ingress,
        &tcp(B_POD1_REAL, A_POD1),
        &tcp(B_POD1, A_POD1),
        &[Kind::Prefix],
    );
    v1.expect(
        "b to what an IP object exposes",
        Ingress,
        &udp(B_POD1_REAL, IP_EXPOSED),
        &udp(B_POD1, IP_TARGET),
        &[Kind::Prefix, Kind::NatMapping],
    );
    v1.expect(
        "a router of b's quotes our packet: its destination goes to our view",
        Ingress,
        &icmp_error(3, 4, B_GW_WAN, A_POD1, tcp(A_POD1, B_POD1_REAL), 28),
        &icmp_error(3, 4, B_GW_WAN, A_POD1, tcp(A_POD1, B_POD1), 28),
        &[Kind::Prefix],
    );
}

#[test]
fn a_v1_peer_reaches_no_node_and_sends_nothing_unreadable() {
    let v1 = V1::new();
    v1.expect_denied(
        "b to a node",
        &tcp(B_POD1_REAL, NODE).bytes(),
        DenyReason::NodeAddress,
    );
    let cut = cut_at(tcp(B_POD1_REAL, A_POD1), 8);
    v1.expect_denied("a cut TCP header", &cut, DenyReason::Unparseable);
}
