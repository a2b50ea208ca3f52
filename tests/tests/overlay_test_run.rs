//! The overlay's real programs, run by the kernel on crafted frames
//! (`BPF_PROG_TEST_RUN`): which packets a worker sends to the gateway node,
//! which ones a gateway sends on to another node after its ingress NAT, and
//! what each leaves in the frame; and that the receiving side refuses a
//! frame that did not come through the overlay.
//!
//! The kernel returns a redirect's verdict, not the tunnel key it set: the
//! key's VNI, port and remote node are checked on the wire in `lab_overlay`.

use std::net::Ipv4Addr;

use aya::{Ebpf, EbpfLoader, programs::SchedClassifier};
use isthmus_agent::{
    dataplane::OBJECT,
    maps::{Counters, NodeMap, OverlaySettings, PeerMap},
    object::{Object, parse_documents},
    peer::Peer,
    reconcile::KernelTable,
};
use isthmus_common::{
    names,
    nat::wire,
    overlay::{EVENTS, OverlayConfig, OverlayEvent},
};
use isthmus_tests::{
    packet::{Addr, ETH_P_ARP, eth_ipv4, ethernet, tcp, udp},
    require_root, test_run,
};
use xtask::topology::{A, PEERINGS};

const A_POD1: Addr = [10, 244, 0, 5];
const A_POD2: Addr = [10, 244, 0, 133];
const A_POD1_AT_B: Addr = [10, 0, 40, 5];
const A_POD2_AT_B: Addr = [10, 0, 40, 133];
const B_POD1: Addr = [10, 0, 0, 5];
const VNI: u32 = 18952;
/// TC verdicts as the kernel returns them.
const HAND_ON: u32 = u32::MAX;
const SHOT: u32 = 2;
const REDIRECT: u32 = 7;

/// The object loaded fresh, seen from cluster a: peer b, the gateway node
/// a-gw, and the worker a-node holding the lower half of the PodCIDR.
struct Harness {
    ebpf: Ebpf,
    settings: OverlaySettings,
    events: Counters,
}

impl Harness {
    fn new() -> Self {
        require_root();
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .expect("loading the eBPF object");
        for name in [
            names::PROG_STEER,
            names::PROG_ACCEPT,
            names::PROG_INGRESS_ETH,
        ] {
            let prog: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e}"));
        }
        let mut peers = PeerMap::new(
            ebpf.take_map(names::MAP_PEERS).unwrap(),
            ebpf.take_map(names::MAP_PREFIX_LENS).unwrap(),
        )
        .unwrap();
        let yaml = PEERINGS[0].tunnel_endpoint_yaml(None);
        let docs = parse_documents("test.yaml".as_ref(), &yaml);
        let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
            panic!("{docs:?}")
        };
        let peer = Peer::from_raw(raw, "test.yaml").unwrap();
        for (_, net) in peer.views() {
            peers.put(net, &peer.nat(1), None).unwrap();
        }
        let mut nodes = NodeMap::new(ebpf.take_map(names::MAP_NODES).unwrap()).unwrap();
        nodes
            .put(A.pod_half(1), &wire(A.lan_node().octets()), None)
            .unwrap();
        let settings = OverlaySettings::new(ebpf.take_map(names::MAP_OVERLAY).unwrap()).unwrap();
        let events = Counters::overlay(ebpf.take_map(names::MAP_OVERLAY_STATS).unwrap()).unwrap();
        let mut harness = Self {
            ebpf,
            settings,
            events,
        };
        harness.configure(Some(A.lan_gw()), 1);
        harness
    }

    /// Sets the gateway node workers send to, and the device's ifindex
    /// (0: no overlay device yet).
    fn configure(&mut self, gateway: Option<Ipv4Addr>, ifindex: u32) {
        let config = OverlayConfig {
            gateway: gateway.map_or(0, |g| wire(g.octets())),
            vni: VNI,
            ifindex,
            ..OverlayConfig::default()
        };
        self.settings.set(config).unwrap();
    }

    fn run(&self, program: &str, frame: &[u8]) -> (u32, Vec<u8>) {
        let prog: &SchedClassifier = self.ebpf.program(program).unwrap().try_into().unwrap();
        test_run(prog, frame)
    }

    fn count(&self, event: OverlayEvent) -> u64 {
        let sums = self.events.read().unwrap();
        assert_eq!(sums.len(), EVENTS.len());
        sums[event as usize]
    }
}

/// One case: its name, the program, the frame in, the verdict, the frame
/// out, and the event it must count.
type Row = (
    &'static str,
    &'static str,
    Vec<u8>,
    u32,
    Vec<u8>,
    Option<OverlayEvent>,
);

fn check(h: &Harness, rows: Vec<Row>) {
    for (name, program, input, want_verdict, want_out, want_event) in rows {
        let before: Vec<u64> = EVENTS.iter().map(|e| h.count(*e)).collect();
        let (verdict, out) = h.run(program, &input);
        assert_eq!(verdict, want_verdict, "{name}: verdict");
        assert_eq!(out, want_out, "{name}: frame");
        for (i, event) in EVENTS.iter().enumerate() {
            let want = before[i] + u64::from(want_event == Some(*event));
            assert_eq!(h.count(*event), want, "{}: {} events", name, event.as_str());
        }
    }
}

#[test]
fn the_overlay_programs_decide_and_leave_frames_as_they_should() {
    let mut h = Harness::new();
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
                Some(ToGateway),
            ),
            (
                "worker: a packet for our own pods stays with the stack",
                names::PROG_STEER,
                local.clone(),
                HAND_ON,
                local.clone(),
                None,
            ),
            (
                "worker: not IPv4",
                names::PROG_STEER,
                arp.clone(),
                HAND_ON,
                arp.clone(),
                None,
            ),
            (
                "gateway: from the tunnel, NATed, for a pod of a-node: sent to it",
                names::PROG_INGRESS_ETH,
                from_b(A_POD1_AT_B),
                REDIRECT,
                from_b(A_POD1),
                Some(ToNode),
            ),
            (
                "gateway: from the tunnel, NATed, for a pod of its own: to the stack",
                names::PROG_INGRESS_ETH,
                from_b(A_POD2_AT_B),
                HAND_ON,
                from_b(A_POD2),
                None,
            ),
            (
                "any node: a frame that did not come through the overlay",
                names::PROG_ACCEPT,
                to_peer.clone(),
                SHOT,
                to_peer.clone(),
                Some(WrongVni),
            ),
        ],
    );

    h.configure(None, 1);
    check(
        &h,
        vec![(
            "worker: no gateway node known yet",
            names::PROG_STEER,
            to_peer.clone(),
            HAND_ON,
            to_peer.clone(),
            Some(NoGateway),
        )],
    );

    h.configure(Some(A.lan_gw()), 0);
    check(
        &h,
        vec![
            (
                "worker: no overlay device yet",
                names::PROG_STEER,
                to_peer.clone(),
                HAND_ON,
                to_peer,
                None,
            ),
            (
                "gateway: no overlay device yet",
                names::PROG_INGRESS_ETH,
                from_b(A_POD1_AT_B),
                HAND_ON,
                from_b(A_POD1),
                None,
            ),
        ],
    );
}
