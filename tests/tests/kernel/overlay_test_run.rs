//! The overlay's real programs, run by the kernel on crafted frames
//! (`BPF_PROG_TEST_RUN`): which packets a worker sends to the gateway node,
//! its pods' and its own, which ones a gateway sends on to another node
//! after its ingress NAT, and what each leaves in the frame; and that the
//! receiving side refuses a frame that did not come through the overlay.
//!
//! The kernel returns a redirect's verdict, not the tunnel key it set: the
//! key's VNI, port and remote node are checked on the wire in `lab_overlay`.

use std::net::{IpAddr, Ipv4Addr};

use aya::{Ebpf, EbpfLoader, programs::SchedClassifier};
use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_agent::{
    kernel::dataplane::{OBJECT, load_nat_stages},
    kernel::maps::{ByteHash, Counters, NodeMap, OverlaySettings, PrefixTrie},
    kernel::peer_table::{PeerMap, PeerMap6},
    kernel::table::KernelTable,
    model::isolation::SecurityMode,
    model::object::{Object, parse_documents},
    model::peer::Peer,
};
use isthmus_common::{
    names,
    overlay::{EVENTS, OverlayConfig, OverlayEvent, PAST_NETFILTER, PAST_NETFILTER6},
    wire::Be32,
};
use isthmus_lab::topology::{A, OVERLAY_PORT, PEERINGS};

use crate::forwarding_node::ForwardingNode;
use isthmus_tests::{
    addrs::{A_POD1, A_POD1_AT_B, A_POD2, A_POD2_AT_B, B_POD1},
    netns,
    packet::{Datagram, ETH_P_ARP, L4, eth_ipv4, ethernet, tcp, udp, vxlan},
    require_root, test_run_marked,
};

const VNI: u32 = 18952;
/// TC verdicts as the kernel returns them.
pub(crate) const HAND_ON: u32 = u32::MAX;
pub(crate) const SHOT: u32 = 2;
pub(crate) const REDIRECT: u32 = 7;

/// The object loaded fresh, seen from cluster a: peer b, of both families,
/// the gateway node a-gw, and the worker a-node holding the lower half of
/// the PodCIDR.
pub(crate) struct Harness {
    ebpf: Ebpf,
    settings: OverlaySettings,
    config: OverlayConfig,
    events: Counters,
    /// Destinations the node's rules act on, which take the stack.
    stack_destinations: PrefixTrie<u8>,
    /// The same, for IPv6.
    pub(crate) stack_destinations6: PrefixTrie<u8, Ipv6Net>,
    /// The netns the programs run in, and look the FIB up in.
    pub(crate) netns: Option<&'static str>,
    /// The packets' `skb->mark`.
    mark: u32,
}

impl Harness {
    pub(crate) fn new() -> Self {
        require_root();
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .expect("loading the eBPF object");
        for name in [
            names::PROG_STEER,
            names::PROG_OWN,
            names::PROG_ACCEPT,
            names::PROG_DECAP,
            names::PROG_INGRESS_ETH,
        ] {
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
        let endpoint = IpAddr::from(PEERINGS[0].remote.wan_addr());
        let yaml = PEERINGS[0]
            .dual_stack_tunnel_endpoint(None, endpoint)
            .to_string();
        let docs = parse_documents("test.yaml".as_ref(), &yaml);
        let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
            panic!("{docs:?}")
        };
        let peer = Peer::from_raw(raw, "test.yaml").unwrap();
        for (_, net) in peer.views() {
            peers
                .put(net, &peer.nat(1, SecurityMode::default()), None)
                .unwrap();
        }
        let mut peers6 = PeerMap6::new(
            ebpf.take_map(names::MAP_PEERS6).unwrap(),
            ebpf.take_map(names::MAP_PEER_OWNERS6).unwrap(),
            ebpf.take_map(names::MAP_PREFIX_LENS6).unwrap(),
        )
        .unwrap();
        let nat6 = peer.nat6(1, SecurityMode::default()).expect("IPv6 rules");
        for (_, net) in peer.ipv6.as_ref().unwrap().views(peer.layout) {
            peers6.put(net, &nat6, None).unwrap();
        }
        let mut nodes = NodeMap::new(ebpf.take_map(names::MAP_NODES).unwrap()).unwrap();
        nodes
            .put(A.pod_half(1), &Be32::from(A.lan_node()), None)
            .unwrap();
        let mut addresses: ByteHash<Be32> =
            ByteHash::new(ebpf.take_map(names::MAP_NODE_ADDRS).unwrap()).unwrap();
        for node in [A.lan_gw(), A.lan_node()] {
            addresses.put(Be32::from(node), &1, None).unwrap();
        }
        let settings = OverlaySettings::new(ebpf.take_map(names::MAP_OVERLAY).unwrap()).unwrap();
        let events = Counters::overlay(ebpf.take_map(names::MAP_OVERLAY_STATS).unwrap()).unwrap();
        let stack_destinations =
            PrefixTrie::new(ebpf.take_map(names::MAP_STACK_DESTINATIONS).unwrap()).unwrap();
        let stack_destinations6 =
            PrefixTrie::new(ebpf.take_map(names::MAP_STACK_DESTINATIONS6).unwrap()).unwrap();
        let mut harness = Self {
            ebpf,
            settings,
            config: OverlayConfig {
                gateway: Be32::from(A.lan_gw()),
                vni: VNI,
                ifindex: 1,
                local: Be32::from(A.lan_node()),
                port: OVERLAY_PORT,
                flags: PAST_NETFILTER | PAST_NETFILTER6,
            },
            events,
            stack_destinations,
            stack_destinations6,
            netns: None,
            mark: 0,
        };
        harness.configure(|_| ());
        harness
    }

    /// Changes the overlay's settings. `gateway` 0: none known; `ifindex`
    /// 0: no overlay device yet; `local` 0: this node's address unknown.
    pub(crate) fn configure(&mut self, change: impl FnOnce(&mut OverlayConfig)) {
        change(&mut self.config);
        self.settings.set(self.config).unwrap();
    }

    fn run(&self, program: &str, frame: &[u8]) -> (u32, Vec<u8>) {
        let prog: &SchedClassifier = self.ebpf.program(program).unwrap().try_into().unwrap();
        let run = || test_run_marked(prog, frame, self.mark);
        match self.netns {
            Some(ns) => isthmus_lab::netns::run_in(ns, run).unwrap(),
            None => run(),
        }
    }

    fn count(&self, event: OverlayEvent) -> u64 {
        let sums = self.events.read().unwrap();
        assert_eq!(sums.len(), EVENTS.len());
        sums[event as usize]
    }
}

/// One case: its name, the program, the frame in, the verdict, the frame
/// out, and the events it must count.
pub(crate) type Row = (
    &'static str,
    &'static str,
    Vec<u8>,
    u32,
    Vec<u8>,
    &'static [OverlayEvent],
);

pub(crate) fn check(h: &Harness, rows: Vec<Row>) {
    for (name, program, input, want_verdict, want_out, want_events) in rows {
        let before: Vec<u64> = EVENTS.iter().map(|e| h.count(*e)).collect();
        let (verdict, out) = h.run(program, &input);
        assert_eq!(verdict, want_verdict, "{name}: verdict");
        assert_eq!(out, want_out, "{name}: frame");
        for (i, event) in EVENTS.iter().enumerate() {
            let want = before[i] + u64::from(want_events.contains(event));
            assert_eq!(h.count(*event), want, "{}: {} events", name, event.as_str());
        }
    }
}

#[test]
fn the_overlay_programs_decide_and_leave_frames_as_they_should() {
    let mut h = Harness::new();
    // In a netns with no route at all, so that the FIB settles nothing
    // whatever the machine's own routes: in the root netns, its default
    // route with the gateway's neighbour entry resolved (after any apt or
    // cargo download) sent "a pod of its own" past netfilter to eth0.
    netns::fresh(&[NO_ROUTE_NS]);
    h.netns = Some(NO_ROUTE_NS);
    let to_peer = eth_ipv4(&udp(A_POD1, B_POD1).bytes());
    let local = eth_ipv4(&udp(A_POD1, A_POD2).bytes());
    let arp = ethernet(ETH_P_ARP, &[0; 28]);
    // Before the NAT, to a's pods as b sees them; after it, to them.
    let from_b = |dst| eth_ipv4(&tcp(B_POD1, dst).bytes());
    use OverlayEvent::*;
    check(
        &h,
        vec![
            (
                "worker: a pod's packet for a peer goes to the gateway node, unchanged",
                names::PROG_STEER,
                to_peer.clone(),
                REDIRECT,
                to_peer.clone(),
                &[ToGateway],
            ),
            (
                "worker: a packet for our own pods stays with the stack",
                names::PROG_STEER,
                local.clone(),
                HAND_ON,
                local.clone(),
                &[],
            ),
            (
                "worker: not IPv4",
                names::PROG_STEER,
                arp.clone(),
                HAND_ON,
                arp.clone(),
                &[],
            ),
            (
                "worker: its own packet for a peer, routed into the VXLAN device, gets the gateway node's key and goes on, unchanged",
                names::PROG_OWN,
                to_peer.clone(),
                HAND_ON,
                to_peer.clone(),
                &[ToGateway],
            ),
            (
                "worker: its own packet for no peer goes on without a key",
                names::PROG_OWN,
                local.clone(),
                HAND_ON,
                local.clone(),
                &[],
            ),
            (
                "worker: not IPv4, on the VXLAN device",
                names::PROG_OWN,
                arp.clone(),
                HAND_ON,
                arp.clone(),
                &[],
            ),
            (
                "gateway: from the tunnel, NATed, for a pod of a-node: sent to it",
                names::PROG_INGRESS_ETH,
                from_b(A_POD1_AT_B),
                REDIRECT,
                from_b(A_POD1),
                &[ToNode],
            ),
            (
                "gateway: from the tunnel, NATed, for a pod of its own: to the stack",
                names::PROG_INGRESS_ETH,
                from_b(A_POD2_AT_B),
                HAND_ON,
                from_b(A_POD2),
                &[],
            ),
            (
                "any node: a frame that did not come through the overlay",
                names::PROG_ACCEPT,
                to_peer.clone(),
                SHOT,
                to_peer.clone(),
                &[WrongVni],
            ),
        ],
    );

    h.configure(|c| c.gateway = Be32::ZERO);
    check(
        &h,
        vec![
            (
                "worker: no gateway node known yet",
                names::PROG_STEER,
                to_peer.clone(),
                HAND_ON,
                to_peer.clone(),
                &[NoGateway],
            ),
            (
                "worker: its own packet for a peer, with no gateway node known: the device could send it nowhere",
                names::PROG_OWN,
                to_peer.clone(),
                SHOT,
                to_peer.clone(),
                &[NoGateway],
            ),
        ],
    );

    h.configure(|c| {
        c.gateway = Be32::from(A.lan_gw());
        c.ifindex = 0;
    });
    check(
        &h,
        vec![
            (
                "worker: no overlay device yet",
                names::PROG_STEER,
                to_peer.clone(),
                HAND_ON,
                to_peer,
                &[],
            ),
            (
                "gateway: no overlay device yet",
                names::PROG_INGRESS_ETH,
                from_b(A_POD1_AT_B),
                HAND_ON,
                from_b(A_POD1),
                &[],
            ),
        ],
    );
    netns::remove(&[NO_ROUTE_NS]);
}

/// The netns of the test above: loopback only.
const NO_ROUTE_NS: &str = "ist-t-no-route";

/// Length of an Ethernet header, where the frames' IPv4 header starts.
const ETH_HLEN: usize = 14;

/// A test's node (`v0`, 192.0.2.1) and the next hop it forwards a's pods'
/// addresses to (`v1`, 192.0.2.2, with a permanent neighbour entry).
const NODE_NS: &str = "ist-t-decap";
const NEXT_HOP_NS: &str = "ist-t-decap-nh";
/// The same for the ingress NAT's test, which runs beside the other.
const GATEWAY_NS: &str = "ist-t-onward";
const GATEWAY_NEXT_HOP_NS: &str = "ist-t-onward-nh";

#[test]
fn the_uplink_decapsulates_only_what_the_fib_forwards_in_one_step() {
    let mut h = Harness::new();
    let node = ForwardingNode::new(NODE_NS, NEXT_HOP_NS);
    h.netns = Some(NODE_NS);
    let (gw, here) = (A.lan_gw().octets(), A.lan_node().octets());
    let inner = tcp(B_POD1, A_POD1);
    let overlay = |dport, vni, inner: &[u8]| vxlan(gw, here, dport, vni, inner);
    let ours = |inner: &[u8]| eth_ipv4(&overlay(OVERLAY_PORT, VNI, inner).bytes());
    let arrived = ours(&eth_ipv4(&inner.bytes()));
    let forwarded = node.to_next_hop(eth_ipv4(&inner.with_ttl(63).bytes()));
    let unchanged = |frame: Vec<u8>| (frame.clone(), HAND_ON, frame);
    let rows = |cases: Vec<(&'static str, Vec<u8>)>| -> Vec<Row> {
        cases
            .into_iter()
            .map(|(name, frame)| {
                let (input, verdict, out) = unchanged(frame);
                (name, names::PROG_DECAP, input, verdict, out, &[][..])
            })
            .collect()
    };
    use OverlayEvent::*;
    let mut table = vec![(
        "ours, to a-pod1: outer headers off, next hop's MACs, TTL 63",
        names::PROG_DECAP,
        arrived.clone(),
        REDIRECT,
        forwarded,
        &[Decapsulated, Forwarded][..],
    )];
    table.push((
        "ours, but from an address that is no node's (a pod forging the overlay): dropped",
        names::PROG_DECAP,
        eth_ipv4(&vxlan(A_POD1, here, OVERLAY_PORT, VNI, &eth_ipv4(&inner.bytes())).bytes()),
        SHOT,
        eth_ipv4(&vxlan(A_POD1, here, OVERLAY_PORT, VNI, &eth_ipv4(&inner.bytes())).bytes()),
        &[UnknownNode][..],
    ));
    table.extend(rows(vec![
        (
            "another VNI: for the VXLAN device",
            eth_ipv4(&overlay(OVERLAY_PORT, VNI + 1, &eth_ipv4(&inner.bytes())).bytes()),
        ),
        (
            "another port",
            eth_ipv4(&overlay(4789, VNI, &eth_ipv4(&inner.bytes())).bytes()),
        ),
        (
            "to another node's address",
            eth_ipv4(
                &vxlan(
                    gw,
                    [172, 16, 1, 9],
                    OVERLAY_PORT,
                    VNI,
                    &eth_ipv4(&inner.bytes()),
                )
                .bytes(),
            ),
        ),
        (
            "an outer fragment: for the stack to reassemble",
            eth_ipv4(&overlay(OVERLAY_PORT, VNI, &eth_ipv4(&inner.bytes())).fragment(0, 64)),
        ),
        ("inner ARP", ours(&ethernet(ETH_P_ARP, &[0; 28]))),
        (
            "inner destination the FIB has no route for",
            ours(&eth_ipv4(&tcp(B_POD1, [10, 99, 0, 1]).bytes())),
        ),
        (
            "inner TTL 1: the stack answers time-exceeded",
            ours(&eth_ipv4(&inner.with_ttl(1).bytes())),
        ),
        (
            "inner packet shorter than its header says: the stack drops it",
            ours(&eth_ipv4(&inner.bytes())[..ETH_HLEN + 24]),
        ),
        ("plain TCP on the uplink", eth_ipv4(&inner.bytes())),
    ]));
    check(&h, table);

    h.mark = 0x4000;
    check(
        &h,
        rows(vec![(
            "ours, to a-pod1, marked: for the VXLAN device, since rules may test the mark",
            arrived.clone(),
        )]),
    );
    h.mark = 0;

    let a_pod1 = Ipv4Net::from(Ipv4Addr::from(A_POD1));
    h.stack_destinations.put(a_pod1, &1, None).unwrap();
    check(
        &h,
        rows(vec![(
            "ours, to a-pod1, which the node's rules act on: for the VXLAN device",
            arrived.clone(),
        )]),
    );
    h.stack_destinations.delete(a_pod1, &1).unwrap();

    h.configure(|c| c.flags = 0);
    check(
        &h,
        rows(vec![(
            "ours, to a-pod1, not forwarding past netfilter: for the VXLAN device",
            arrived.clone(),
        )]),
    );

    h.configure(|c| {
        c.flags = PAST_NETFILTER;
        c.local = Be32::ZERO;
    });
    check(&h, rows(vec![("this node's address unknown", arrived)]));
    netns::remove(&[NODE_NS, NEXT_HOP_NS]);
}

/// The ingress NAT's onward step on the gateway node, where a's PodCIDR is
/// routed: a peer's packet for a pod of this node goes past the stack once
/// translated, and only such a packet. What a peer may not reach is
/// dropped though the FIB has a route for it, and what comes from no peer
/// stays with the stack (and its netfilter hooks). And the other way, the
/// steering of the gateway's own pods' packets for a peer.
#[test]
fn only_a_peers_translated_packet_for_a_pod_of_this_node_goes_past_the_stack() {
    const CLUSTER_IP: [u8; 4] = [10, 96, 0, 10];
    let mut h = Harness::new();
    let node = ForwardingNode::new(GATEWAY_NS, GATEWAY_NEXT_HOP_NS);
    node.route("10.96.0.0/12");
    h.netns = Some(GATEWAY_NS);
    let from_b = |dst, ttl| eth_ipv4(&tcp(B_POD1, dst).with_ttl(ttl).bytes());
    let forwarded = node.to_next_hop(from_b(A_POD2, 63));
    let big = |dst| {
        let payload = vec![0x5a; 1600];
        let l4 = L4::Udp {
            sport: 40000,
            dport: 53,
            payload,
            zero_csum: false,
        };
        eth_ipv4(&Datagram::new(B_POD1, dst, l4).bytes())
    };
    let stays = |name, input: Vec<u8>, out: Vec<u8>| -> Row {
        (name, names::PROG_INGRESS_ETH, input, HAND_ON, out, &[][..])
    };
    use OverlayEvent::*;
    check(
        &h,
        vec![
            (
                "b's packet for a-pod2: translated, next hop's MACs, TTL 63",
                names::PROG_INGRESS_ETH,
                from_b(A_POD2_AT_B, 64),
                REDIRECT,
                forwarded,
                &[Forwarded],
            ),
            stays(
                "b's packet for a-pod2 with TTL 1: translated, the stack answers time-exceeded",
                from_b(A_POD2_AT_B, 1),
                from_b(A_POD2, 1),
            ),
            stays(
                "b's packet for a-pod2, over the way out's MTU: translated, the stack answers frag-needed",
                big(A_POD2_AT_B),
                big(A_POD2),
            ),
            (
                "b's packet to a ClusterIP, which b may not reach: dropped, though routed",
                names::PROG_INGRESS_ETH,
                from_b(CLUSTER_IP, 64),
                SHOT,
                from_b(CLUSTER_IP, 64),
                &[],
            ),
            stays(
                "a packet from no peer for a-pod2: untouched, to the stack",
                eth_ipv4(&tcp([192, 0, 2, 77], A_POD2).bytes()),
                eth_ipv4(&tcp([192, 0, 2, 77], A_POD2).bytes()),
            ),
        ],
    );

    // The other way: on the active gateway node, its own pods' packets for
    // b go towards the NAT device by the FIB, here through v0.
    h.configure(|c| c.local = c.gateway);
    node.route("10.0.0.0/24");
    let to_b = |ttl| eth_ipv4(&udp(A_POD2, B_POD1).with_ttl(ttl).bytes());
    let steered = node.to_next_hop(to_b(63));
    check(
        &h,
        vec![
            (
                "active gateway: a-pod2's packet for b: next hop's MACs, TTL 63",
                names::PROG_STEER,
                to_b(64),
                REDIRECT,
                steered,
                &[Forwarded],
            ),
            (
                "active gateway: a-pod2's packet for b with TTL 1: to the stack",
                names::PROG_STEER,
                to_b(1),
                HAND_ON,
                to_b(1),
                &[],
            ),
            (
                "active gateway: a packet for b shorter than its header says: to the stack",
                names::PROG_STEER,
                to_b(64)[..ETH_HLEN + 24].to_vec(),
                HAND_ON,
                to_b(64)[..ETH_HLEN + 24].to_vec(),
                &[],
            ),
        ],
    );

    // Not forwarding past netfilter, both ways go through the stack.
    h.configure(|c| c.flags = 0);
    check(
        &h,
        vec![
            stays(
                "not past netfilter: b's packet for a-pod2, translated, to the stack",
                from_b(A_POD2_AT_B, 64),
                from_b(A_POD2, 64),
            ),
            (
                "not past netfilter: a-pod2's packet for b, to the stack",
                names::PROG_STEER,
                to_b(64),
                HAND_ON,
                to_b(64),
                &[],
            ),
        ],
    );
    netns::remove(&[GATEWAY_NS, GATEWAY_NEXT_HOP_NS]);
}
