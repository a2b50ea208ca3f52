//! The overlay between a cluster's nodes, end to end in the lab: workers
//! route peers' networks only into the overlay, for their own traffic,
//! which leaves masqueraded by the gateway; their pods reach remote worker
//! pods and back, through both clusters' overlays; what crosses the LAN is VXLAN of
//! the overlay's VNI and port between the two nodes; path MTU discovery
//! works through the overlay, the tunnel and the NAT; and 50 MB cross intact.

mod netfilter;
mod wire;

use std::{
    fs,
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    path::PathBuf,
    time::Duration,
};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};

use isthmus_common::{
    names,
    pins::{Direction, Pins},
};

use isthmus_lab::{
    cmd::ip,
    lab, netns,
    probe::{self, Proto, next_port},
    topology::{A, B, OVERLAY_PORT, OVERLAY_VNI, WAN_NS},
};

use isthmus_tests::{
    addrs::{A_POD2, A_POD2_AT_B},
    capture::{self, frames},
    eventually,
    metrics::sample,
    packet::{Datagram, L4, eth_ipv4, vxlan_payload},
    require_lab,
};

/// b-pod1 as a sees it.
const B_POD1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);

/// a-pod1 as b sees it.
const A_POD1: Ipv4Addr = Ipv4Addr::new(10, 0, 40, 5);

/// a's masquerade address as b sees it: a-gw masquerades a-node's own
/// traffic.
const A_MASQUERADE_AT_B: Ipv4Addr = Ipv4Addr::new(10, 0, 40, 254);

/// b-pod2 (on b-gw) as a sees it.
const B_POD2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 133);

/// The tunnel device's MTU on every gateway (the agent's default).
const TUNNEL_MTU: usize = 1420;

fn overlay(node: &str, event: &str) -> f64 {
    sample(
        node,
        &format!("isthmus_overlay_packets_total{{event=\"{event}\"}}"),
    )
}

#[test]
fn a_workers_own_traffic_reaches_peers_through_the_overlay_masqueraded() {
    require_lab();
    for target in [B_POD1, Ipv4Addr::new(10, 0, 1, 45)] {
        let route = ip(&A.node(), &["route", "get", &target.to_string()]).unwrap();
        let from = format!("dev isthmus.vx src {}", A.lan_node());
        assert!(route.contains(&from), "a-node routes {target}: {route}");
    }
    let link = ip(&A.node(), &["-d", "link", "show", "isthmus.vx"]).unwrap();
    assert!(
        link.contains("vxlan")
            && link.contains("NOARP")
            && link.contains("external")
            && link.contains(&format!("dstport {OVERLAY_PORT}")),
        "isthmus.vx is not a metadata VXLAN without ARP on port {OVERLAY_PORT}: {link}"
    );
    let sent = overlay(&A.node(), "to_gateway");
    for proto in [Proto::Tcp, Proto::Udp] {
        let seen = probe::exchange(proto, &A.node(), &B.pod(1), B_POD1)
            .unwrap_or_else(|e| panic!("a-node over {proto:?}: {e:#}"));
        assert_eq!(
            (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
            (A_MASQUERADE_AT_B.into(), B_POD1.into()),
            "a-node over {proto:?}"
        );
    }
    assert!(
        overlay(&A.node(), "to_gateway") > sent,
        "a-node's own packets did not go through overlay_own"
    );
}

#[test]
fn worker_pods_reach_remote_worker_pods_through_both_overlays() {
    require_lab();
    let nodes = [A.node(), A.gw(), B.gw(), B.node()];
    // A node takes a packet in on its uplink, or through the VXLAN device.
    let taken_in = |node: &str| overlay(node, "decapsulated") + overlay(node, "received");
    let counts = || {
        [
            overlay(&nodes[0], "to_gateway"),
            taken_in(&nodes[1]),
            overlay(&nodes[2], "to_node"),
            taken_in(&nodes[3]),
            overlay(&nodes[1], "decapsulated"),
            overlay(&nodes[3], "decapsulated"),
        ]
    };
    let before = counts();
    for proto in Proto::ALL {
        let there = probe::exchange(proto, &A.pod(1), &B.pod(1), B_POD1).unwrap();
        assert_eq!(there.client_as_seen_by_server, A_POD1, "{}", proto.as_str());
        assert_eq!(there.server_as_seen_by_client, B_POD1, "{}", proto.as_str());
        let back = probe::exchange(proto, &B.pod(1), &A.pod(1), A_POD1).unwrap();
        assert_eq!(back.client_as_seen_by_server, B_POD1, "{}", proto.as_str());
        assert_eq!(back.server_as_seen_by_client, A_POD1, "{}", proto.as_str());
    }
    let after = counts();
    // Every exchange is at least one packet each way, in each direction.
    let exchanges = 2.0 * Proto::ALL.len() as f64;
    // The uplink's decapsulation takes in what the FIB forwards in one
    // step: all but a flow's first packets, while a next hop is resolved.
    let decapsulated = exchanges / 2.0;
    for (i, (step, least)) in [
        ("a-node sent to a-gw", exchanges),
        ("a-gw took in from a-node", exchanges),
        ("b-gw sent to b-node", exchanges),
        ("b-node took in from b-gw", exchanges),
        ("a-gw decapsulated on its uplink", decapsulated),
        ("b-node decapsulated on its uplink", decapsulated),
    ]
    .iter()
    .enumerate()
    {
        assert!(
            after[i] - before[i] >= *least,
            "{step}: {} packets for {exchanges} exchanges",
            after[i] - before[i]
        );
    }
}

/// Pods on the gateway nodes: a-pod2's packets for b-pod2 go from its veth
/// towards the tunnel past a-gw's IP layer (its egress NAT still
/// translates them), and b-gw sends them from the tunnel straight into
/// b-pod2, past its own; the replies likewise. Each gateway's IP layer
/// forwards at most the flows' first packets, while next hops are resolved.
#[test]
fn gateway_pods_exchange_with_peers_past_both_gateways_ip_layers() {
    require_lab();
    let gateways = [A.gw(), B.gw()];
    for gw in &gateways {
        eventually(
            Duration::from_secs(5),
            &format!("{gw} forwards past netfilter"),
            || sample(gw, "isthmus_forward_past_netfilter") == 1.0,
        );
    }
    let counts = || {
        gateways
            .each_ref()
            .map(|gw| (overlay(gw, "forwarded"), ip_forwarded(gw)))
    };
    let before = counts();
    for proto in Proto::ALL {
        let there = probe::exchange(proto, &A.pod(2), &B.pod(2), B_POD2).unwrap();
        assert_eq!(
            there.client_as_seen_by_server,
            Ipv4Addr::from(A_POD2_AT_B),
            "{}",
            proto.as_str()
        );
        assert_eq!(there.server_as_seen_by_client, B_POD2, "{}", proto.as_str());
    }
    let after = counts();
    // Each exchange is a packet each way through each gateway.
    let packets = 2.0 * Proto::ALL.len() as f64;
    for (i, gw) in gateways.iter().enumerate() {
        let past_the_stack = after[i].0 - before[i].0;
        let through_the_stack = after[i].1 - before[i].1;
        assert!(
            past_the_stack >= packets / 2.0,
            "{gw} forwarded {past_the_stack} of {packets} packets past its IP layer"
        );
        assert!(
            through_the_stack <= packets / 2.0,
            "{gw}'s IP layer forwarded {through_the_stack} of {packets} packets"
        );
    }
}

/// A TCP exchange from b-pod2 to a-pod2 on `port`, through a-gw.
fn exchange_with_a_pod2(port: u16) -> anyhow::Result<probe::Seen> {
    probe::exchange_on(
        Proto::Tcp,
        &B.pod(2),
        &A.pod(2),
        Ipv4Addr::from(A_POD2_AT_B),
        port,
    )
}

/// Whether the overlay's decapsulation is pinned on `node`'s uplink.
fn decap_pinned(node: &str) -> bool {
    Pins::new(&lab::bpffs(node))
        .link("lan0", Direction::Ingress, names::PROG_DECAP)
        .exists()
}

/// Datagrams the IP layer of `ns` has forwarded (`IpForwDatagrams`).
fn ip_forwarded(ns: &str) -> f64 {
    let snmp = netns::run_in(ns, || fs::read_to_string("/proc/thread-self/net/snmp"))
        .unwrap()
        .unwrap();
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
    let column = names
        .split_whitespace()
        .position(|n| n == "ForwDatagrams")
        .expect("no ForwDatagrams in /proc/net/snmp");
    values
        .split_whitespace()
        .nth(column)
        .unwrap()
        .parse()
        .unwrap()
}
