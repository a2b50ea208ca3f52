//! The overlay between a cluster's nodes, end to end in the lab: workers
//! have no route to any peer, yet their pods reach remote worker pods and
//! back, through both clusters' overlays; what crosses the LAN is VXLAN of
//! the overlay's VNI and port between the two nodes; path MTU discovery
//! works through the overlay, the tunnel and the NAT; and 50 MB cross intact.

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
fn workers_have_no_route_to_any_peer() {
    require_lab();
    for target in [B_POD1, Ipv4Addr::new(10, 0, 1, 45)] {
        let out = ip(&A.node(), &["route", "get", &target.to_string()]);
        assert!(out.is_err(), "a-node routes {target}: {out:?}");
    }
    let link = ip(&A.node(), &["-d", "link", "show", "isthmus.vx"]).unwrap();
    assert!(
        link.contains("vxlan")
            && link.contains("external")
            && link.contains(&format!("dstport {OVERLAY_PORT}")),
        "isthmus.vx is not a metadata VXLAN on port {OVERLAY_PORT}: {link}"
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

/// A NetworkPolicy of a CNI that enforces it in netfilter, as Calico's
/// iptables dataplane does, stood in for by a FORWARD rule on a-gw that
/// drops TCP to a-pod2 on one port. With `--forward-past-netfilter=off`,
/// b's packets for a-pod2 cross a-gw's FORWARD chain, and the rule stops
/// them; with `on`, they go past the chain, as the option's help says. A
/// worker's uplink has the decapsulation only when it forwards past
/// netfilter: an agent that does not takes away the one its predecessor left.
#[test]
fn a_forward_rule_on_the_gateway_applies_to_peers_packets_for_its_pods_unless_past_netfilter() {
    require_lab();
    let decap = || decap_pinned(&A.node());
    eventually(Duration::from_secs(5), "a-node decapsulates on lan0", decap);
    let policy = ForwardPolicy::new(Tool::Iptables, next_port());
    lab::set_forward_past_netfilter(Some("off")).unwrap();
    assert!(
        !decap(),
        "a-node's new agent left the decapsulation on lan0"
    );
    exchange_with_a_pod2(next_port()).expect("another port: not the policy's");
    assert!(
        exchange_with_a_pod2(policy.port).is_err(),
        "through netfilter, the policy's port was reached"
    );
    let dropped = policy.dropped();
    assert!(dropped >= 1.0, "the FORWARD rule saw {dropped} packets");

    lab::set_forward_past_netfilter(Some("on")).unwrap();
    exchange_with_a_pod2(next_port()).expect("another port, past netfilter");
    exchange_with_a_pod2(policy.port).expect("past netfilter, the policy's port");
    assert_eq!(
        policy.dropped(),
        dropped,
        "past netfilter, the FORWARD rule saw b's packets"
    );
    eventually(
        Duration::from_secs(5),
        "a-node decapsulates on lan0 again",
        decap,
    );
}

/// `auto`, the DaemonSets' setting and the lab's: a-gw forwards b's packets
/// for a-pod2 through its netfilter while a forward-hook chain holds a rule,
/// whichever tool wrote it, so the rule applies; once the rule is gone, it
/// forwards them past its IP layer again.
#[test]
fn auto_forwards_through_netfilter_while_a_forward_rule_exists_and_past_it_once_it_goes() {
    require_lab();
    assert_eq!(
        lab::past_netfilter_mode(),
        None,
        "the lab runs the DaemonSets' setting"
    );
    let gw = A.gw();
    let past = || sample(&gw, "isthmus_forward_past_netfilter") == 1.0;
    eventually(Duration::from_secs(5), "a-gw forwards past netfilter", past);
    for tool in Tool::ALL {
        let policy = ForwardPolicy::new(tool, next_port());
        eventually(
            Duration::from_secs(5),
            &format!("a-gw forwards through netfilter while {tool:?}'s rule exists"),
            || !past(),
        );
        exchange_with_a_pod2(next_port()).expect("another port: not the rule's");
        assert!(
            exchange_with_a_pod2(policy.port).is_err(),
            "{tool:?}: the rule's port was reached while the rule existed"
        );
        let port = policy.port;
        drop(policy);
        eventually(
            Duration::from_secs(5),
            &format!("a-gw forwards past netfilter once {tool:?}'s rule is gone"),
            past,
        );
        let before = (overlay(&gw, "forwarded"), ip_forwarded(&gw));
        exchange_with_a_pod2(port).expect("the rule gone, its port");
        let (past_the_stack, through_the_stack) = (
            overlay(&gw, "forwarded") - before.0,
            ip_forwarded(&gw) - before.1,
        );
        assert!(
            past_the_stack >= 2.0 && through_the_stack < past_the_stack,
            "{tool:?}'s rule gone, a-gw forwarded {past_the_stack} packets past its IP layer \
             and {through_the_stack} through it"
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

/// What writes a forward-hook rule.
#[derive(Clone, Copy, Debug)]
enum Tool {
    /// Debian's `iptables`: iptables-nft.
    Iptables,
    IptablesLegacy,
    /// Native nftables, in a table of its own.
    Nft,
}

impl Tool {
    const ALL: [Tool; 3] = [Tool::Iptables, Tool::IptablesLegacy, Tool::Nft];

    /// The iptables program of the tool, if it is one.
    fn xtables(self) -> Option<&'static str> {
        match self {
            Tool::Iptables => Some("iptables"),
            Tool::IptablesLegacy => Some("iptables-legacy"),
            Tool::Nft => None,
        }
    }
}

/// A rule at a-gw's forward hook that drops TCP to a-pod2 on one port, while
/// it lives; the lab runs its default setting again after it.
struct ForwardPolicy {
    tool: Tool,
    port: u16,
}

/// The nftables table [`Tool::Nft`] writes its chain in.
const NFT_TABLE: &str = "isthmus_test";

impl ForwardPolicy {
    fn new(tool: Tool, port: u16) -> Self {
        let policy = Self { tool, port };
        policy.add().unwrap();
        policy
    }

    fn add(&self) -> anyhow::Result<()> {
        let Some(program) = self.tool.xtables() else {
            let (a_pod2, port) = (Ipv4Addr::from(A_POD2).to_string(), self.port.to_string());
            let chain = "{ type filter hook forward priority 0; }";
            in_a_gw(&["nft", "add", "table", "inet", NFT_TABLE])?;
            in_a_gw(&["nft", "add", "chain", "inet", NFT_TABLE, "drop_tcp", chain])?;
            return in_a_gw(&[
                "nft", "add", "rule", "inet", NFT_TABLE, "drop_tcp", "ip", "daddr", &a_pod2, "tcp",
                "dport", &port, "drop",
            ])
            .map(drop);
        };
        self.xtables(program, "-I")
    }

    fn remove(&self) -> anyhow::Result<()> {
        match self.tool.xtables() {
            Some(program) => self.xtables(program, "-D"),
            None => in_a_gw(&["nft", "delete", "table", "inet", NFT_TABLE]).map(drop),
        }
    }

    /// Inserts (`-I`) or deletes (`-D`) the rule with iptables `program`.
    fn xtables(&self, program: &str, action: &str) -> anyhow::Result<()> {
        let (a_pod2, port) = (Ipv4Addr::from(A_POD2).to_string(), self.port.to_string());
        in_a_gw(&[
            program, "-w", action, "FORWARD", "-p", "tcp", "-d", &a_pod2, "--dport", &port, "-j",
            "DROP",
        ])
        .map(drop)
    }

    /// Packets the rule dropped (iptables only).
    fn dropped(&self) -> f64 {
        let listing = isthmus_lab::cmd::iptables(&A.gw(), &["-nvxL", "FORWARD"]).unwrap();
        let port = format!("dpt:{}", self.port);
        let line = listing
            .lines()
            .find(|l| l.contains(&port))
            .unwrap_or_else(|| panic!("no rule for {port} in a-gw's FORWARD chain:\n{listing}"));
        line.split_whitespace().next().unwrap().parse().unwrap()
    }
}

/// Runs `command` in a-gw.
fn in_a_gw(command: &[&str]) -> anyhow::Result<String> {
    isthmus_lab::cmd::run("ip", &[&["netns", "exec", &A.gw()][..], command].concat())
}

impl Drop for ForwardPolicy {
    fn drop(&mut self) {
        let _ = self.remove();
        if lab::past_netfilter_mode().is_some() {
            let _ = lab::set_forward_past_netfilter(None);
        }
    }
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

/// The LAN carries the worker's pod traffic as VXLAN from the worker to the
/// gateway node, with the overlay's VNI and port, and the pod's packet
/// unchanged inside: the tunnel key the steering program set.
#[test]
fn the_lan_carries_the_overlay_with_its_vni_port_and_nodes() {
    require_lab();
    let pcap = PathBuf::from(lab::STATE_DIR).join("a-lan.pcap");
    let filter = format!("udp port {OVERLAY_PORT}");
    let tcpdump = capture::start(
        &A.lan(),
        "br0",
        &["-s", "200", "-w", pcap.to_str().unwrap(), &filter],
        "a-lan",
    );
    probe::exchange(Proto::Udp, &A.pod(1), &B.pod(1), B_POD1).unwrap();
    capture::stop(tcpdump);
    let bytes = fs::read(&pcap).unwrap();
    let mut outbound = 0;
    let mut inbound = 0;
    for frame in frames(&bytes) {
        let outer = SlicedPacket::from_ethernet(frame).unwrap();
        let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(udp))) =
            (&outer.net, &outer.transport)
        else {
            panic!("not UDP over IPv4 on the overlay port: {outer:?}");
        };
        assert_eq!(udp.destination_port(), OVERLAY_PORT);
        let vxlan = udp.payload();
        assert_eq!(vxlan[0], 0x08, "VXLAN flags: VNI present");
        let vni = u32::from_be_bytes([0, vxlan[4], vxlan[5], vxlan[6]]);
        assert_eq!(vni, OVERLAY_VNI);
        let inner = SlicedPacket::from_ethernet(&vxlan[8..]).unwrap();
        let Some(NetSlice::Ipv4(inner_ip)) = &inner.net else {
            panic!("no IPv4 inside the overlay");
        };
        let outer_ends = (ip.header().source_addr(), ip.header().destination_addr());
        let inner_ends = (
            inner_ip.header().source_addr(),
            inner_ip.header().destination_addr(),
        );
        if outer_ends == (A.lan_node(), A.lan_gw()) {
            assert_eq!(inner_ends, (A.pod_addr(1), B_POD1), "a-node to a-gw");
            outbound += 1;
        } else if outer_ends == (A.lan_gw(), A.lan_node()) {
            // The gateway's ingress NAT already gave the reply its real destination.
            assert_eq!(inner_ends, (B_POD1, A.pod_addr(1)), "a-gw to a-node");
            inbound += 1;
        } else {
            panic!("overlay between {outer_ends:?}");
        }
    }
    assert!(
        outbound >= 1 && inbound >= 1,
        "out {outbound}, in {inbound}"
    );
    fs::remove_file(&pcap).unwrap();
}

const IP_MTU_DISCOVER: libc::c_int = 10;
const IP_PMTUDISC_DO: libc::c_int = 2;
const IP_MTU: libc::c_int = 14;

/// Sends datagrams of `size` bytes (IP) with DF set from `ns` to `target`
/// until the kernel refuses one as too big, and returns the path MTU it
/// learnt from the ICMP "fragmentation needed" that came back; 10 s at most.
fn path_mtu(ns: &str, target: Ipv4Addr, size: usize) -> usize {
    netns::run_in(ns, || {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let fd = socket.as_raw_fd();
        let set = |option, value: libc::c_int| {
            // SAFETY: a valid socket and an int option.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_IP,
                    option,
                    (&value as *const libc::c_int).cast(),
                    4,
                )
            };
            assert_eq!(rc, 0, "setsockopt {option}");
        };
        set(IP_MTU_DISCOVER, IP_PMTUDISC_DO);
        socket.connect((target, next_port())).unwrap();
        let payload = vec![0x5a; size - 28];
        let what = format!("fragmentation needed for {size} bytes to {target}");
        // A datagram every 20 ms until the kernel learns the path's MTU.
        let told = || match socket.send(&payload) {
            Ok(_) => false,
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => true,
            // The ICMP error itself is reported once, on a connected socket.
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => false,
            Err(e) => panic!("sending to {target}: {e}"),
        };
        isthmus_lab::wait::until(
            Duration::from_secs(10),
            Duration::from_millis(20),
            &what,
            told,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut mtu: libc::c_int = 0;
        let mut len: libc::socklen_t = 4;
        // SAFETY: a valid socket and an int out-parameter.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_IP,
                IP_MTU,
                (&mut mtu as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt IP_MTU");
        mtu as usize
    })
    .unwrap()
}

/// A full-size DF packet from a worker's pod is too big for the tunnel:
/// the gateway's "fragmentation needed" reaches the pod, which then knows
/// the path MTU. And where the limit is beyond the remote gateway (a pod
/// link narrower than the tunnel), the error crosses the remote NAT, the
/// tunnel and our NAT, and still names the pod's own packet.
#[test]
fn path_mtu_discovery_works_through_the_overlay_the_tunnel_and_the_nat() {
    require_lab();
    assert_eq!(path_mtu(&A.pod(1), B_POD1, 1500), TUNNEL_MTU);

    let narrow = 1300;
    ip(
        &B.gw(),
        &["link", "set", "pod2", "mtu", &narrow.to_string()],
    )
    .unwrap();
    let learnt = path_mtu(&A.pod(1), B_POD2, 1400);
    ip(&B.gw(), &["link", "set", "pod2", "mtu", "1500"]).unwrap();
    assert_eq!(learnt, narrow);
}

/// 50 MB from a-pod1 to b-pod1 over TCP, through both overlays and the
/// tunnel, arrive complete and unchanged: the receiver's digest of the
/// stream equals the sender's.
#[test]
fn fifty_megabytes_cross_between_worker_pods_intact() {
    require_lab();
    const SIZE: usize = 50 * 1024 * 1024;
    let port = next_port();
    let listener = netns::run_in(&B.pod(1), || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
    })
    .unwrap()
    .unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut digest = Digest::default();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = stream.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            digest.update(&buf[..n]);
        }
        digest
    });
    let sent = netns::run_in(&A.pod(1), || {
        let mut stream =
            TcpStream::connect_timeout(&(B_POD1, port).into(), Duration::from_secs(5)).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut digest = Digest::default();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut chunk = vec![0u8; 1 << 16];
        for _ in 0..SIZE / chunk.len() {
            for word in chunk.chunks_mut(8) {
                // xorshift: cheap bytes that no link could get right by chance.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.copy_from_slice(&state.to_le_bytes());
            }
            stream.write_all(&chunk).unwrap();
            digest.update(&chunk);
        }
        digest
    })
    .unwrap();
    let received = receiver.join().unwrap();
    assert_eq!(received.len, SIZE as u64);
    assert_eq!(received, sent, "the stream arrived altered");
}

/// FNV-1a over the stream, and its length.
#[derive(Debug, PartialEq, Eq)]
struct Digest {
    hash: u64,
    len: u64,
}

impl Default for Digest {
    fn default() -> Self {
        Self {
            hash: 0xcbf2_9ce4_8422_2325,
            len: 0,
        }
    }
}

impl Digest {
    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.hash = (self.hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.len += bytes.len() as u64;
    }
}

#[test]
fn neither_a_pod_nor_a_wan_host_can_forge_the_overlay_to_pose_as_a_peer() {
    require_lab();
    let gw = A.gw();
    let port = next_port();
    let listener = netns::run_in(&A.pod(2), || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
        .unwrap()
        .unwrap();
    listener
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let pod = netns::run_in(&A.pod(1), || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap()
        .unwrap();
    // A WAN host of the test's own, on the WAN bridge.
    let stranger = "203.0.113.98";
    let _ = ip(
        WAN_NS,
        &["addr", "del", &format!("{stranger}/24"), "dev", "br0"],
    );
    ip(
        WAN_NS,
        &["addr", "add", &format!("{stranger}/24"), "dev", "br0"],
    )
    .unwrap();
    let wan = netns::run_in(WAN_NS, || UdpSocket::bind((stranger, 0)))
        .unwrap()
        .unwrap();
    let dropped_before = overlay(&gw, "unknown_node");
    // An inner packet that claims to come from peer b's 10.0.0.99, to
    // a-pod2 on a-gw: from a pod, small (taken off the uplink) and large
    // enough to be fragmented on the LAN (reassembled, then through the
    // VXLAN device); and from the WAN, to a-gw's WAN address.
    let sends = [
        (&pod, A.lan_gw(), 32),
        (&pod, A.lan_gw(), 2000),
        (&wan, A.wan_addr(), 32),
    ];
    for (sender, to, len) in sends {
        let inner = Datagram::new(
            [10, 0, 0, 99],
            A_POD2,
            L4::Udp {
                sport: 4000,
                dport: port,
                payload: vec![0x5a; len],
                zero_csum: false,
            },
        );
        let payload = vxlan_payload(OVERLAY_VNI, &eth_ipv4(&inner.bytes()));
        sender.send_to(&payload, (to, OVERLAY_PORT)).unwrap();
    }
    eventually(
        Duration::from_secs(5),
        "a-gw drops every forged overlay packet as from no node",
        || overlay(&gw, "unknown_node") >= dropped_before + sends.len() as f64,
    );
    let mut buf = [0u8; 4096];
    let reached = listener.recv_from(&mut buf);
    let _ = ip(
        WAN_NS,
        &["addr", "del", &format!("{stranger}/24"), "dev", "br0"],
    );
    assert!(reached.is_err(), "a forged overlay packet reached a-pod2");
}
