//! What crosses the WAN while pods of a and b talk: only WireGuard between
//! the two gateways, never a pod or remapped address in clear, not even
//! while a gateway's agent is stopped.

use std::{
    fs,
    io::{BufRead, BufReader},
    net::{Ipv4Addr, UdpSocket},
    path::PathBuf,
    process::Child,
    time::Duration,
};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use isthmus_lab::{
    cmd::ip,
    lab::{self, LabTunnel},
    probe::{self, Proto},
    topology::{A, B, CLUSTERS, TUNNEL_PORT, reachability},
};
use isthmus_tests::{
    capture::{self, frames},
    eventually, require_lab,
};

const ETH_P_ARP: u16 = 0x0806;

/// Starts tcpdump on a-gw's `wan0` with `args`.
fn capture_on_wan(args: &[&str], name: &str) -> Child {
    capture::start(&A.gw(), "wan0", args, name)
}

#[test]
fn only_wireguard_between_the_gateways_crosses_the_wan() {
    require_lab();
    assert_eq!(
        lab::Setup::current().unwrap().tunnel,
        LabTunnel::Userspace,
        "the lab must run the tunnel"
    );
    let pcap = PathBuf::from(lab::STATE_DIR).join("wan0.pcap");
    let tcpdump = capture_on_wan(&["-s", "256", "-w", pcap.to_str().unwrap()], "pcap");

    let rows = reachability();
    for row in &rows {
        for proto in Proto::ALL {
            let seen = probe::exchange(proto, &row.from, &row.answered_by, row.target).unwrap();
            assert_eq!(seen.client_as_seen_by_server, row.client_seen_as);
        }
    }
    capture::stop(tcpdump);

    let gateways: Vec<Ipv4Addr> = CLUSTERS.iter().map(|c| c.wan_addr()).collect();
    let bytes = fs::read(&pcap).unwrap();
    let mut tunnel_packets = 0;
    for frame in frames(&bytes) {
        let packet = SlicedPacket::from_ethernet(frame)
            .unwrap_or_else(|e| panic!("unparseable frame on wan0: {e:?}"));
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        match (&packet.net, &packet.transport) {
            (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(udp))) => {
                let (src, dst) = (
                    Ipv4Addr::from(ip.header().source()),
                    Ipv4Addr::from(ip.header().destination()),
                );
                assert!(
                    gateways.contains(&src) && gateways.contains(&dst) && src != dst,
                    "UDP {src} → {dst} crossed the WAN"
                );
                assert_eq!(
                    (udp.source_port(), udp.destination_port()),
                    (TUNNEL_PORT, TUNNEL_PORT),
                    "{src} → {dst}"
                );
                tunnel_packets += 1;
            }
            _ if ethertype == ETH_P_ARP => {}
            (net, transport) => {
                panic!("not WireGuard on wan0: ethertype {ethertype:04x}, {net:?}, {transport:?}")
            }
        }
    }
    // Each exchange through a-gw is at least a request and a reply.
    let exchanges = rows
        .iter()
        .filter(|r| r.clusters_crossed().iter().any(|c| c.name == A.name))
        .count()
        * Proto::ALL.len();
    assert!(
        tunnel_packets >= 2 * exchanges,
        "only {tunnel_packets} WireGuard packets for {exchanges} exchanges"
    );
    fs::remove_file(&pcap).unwrap();
}

/// An idle session still carries a keepalive every 10 s (the default), so
/// NAT state between the gateways never expires. A keepalive is a data
/// message with no payload: 32 bytes of UDP payload. Traffic of an
/// earlier test may still draw one passive keepalive (sent when data was
/// received and nothing answered it), so the schedule is read from the gap
/// between the second and third.
#[test]
fn an_idle_gateway_sends_a_keepalive_every_ten_seconds() {
    require_lab();
    let filter = format!(
        "src host {} and dst host {} and udp dst port {TUNNEL_PORT} and udp[4:2] = 40",
        A.wan_addr(),
        B.wan_addr()
    );
    // Three keepalives; tcpdump stops by itself after them, or `timeout`
    // stops it.
    let mut tcpdump = capture_on_wan(&["-tt", "-l", "-c", "3", &filter], "keepalive");
    let times: Vec<f64> = BufReader::new(tcpdump.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    tcpdump.wait().unwrap();
    assert_eq!(times.len(), 3, "keepalives seen: {times:?}");
    let gap = times[2] - times[1];
    assert!(
        (9.5..=11.0).contains(&gap),
        "keepalives {gap:.2} s apart, not 10 s"
    );
}

/// The frames of a capture file so far (tcpdump writes them as they come).
fn captured(pcap: &PathBuf) -> Vec<Vec<u8>> {
    let bytes = fs::read(pcap).unwrap_or_default();
    match bytes.len() >= 24 {
        true => frames(&bytes).into_iter().map(<[u8]>::to_vec).collect(),
        false => Vec::new(),
    }
}

/// The IPv4 addresses of a frame, if it carries IPv4.
fn addresses(frame: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    match SlicedPacket::from_ethernet(frame).ok()?.net? {
        NetSlice::Ipv4(ip) => Some((
            Ipv4Addr::from(ip.header().source()),
            Ipv4Addr::from(ip.header().destination()),
        )),
        _ => None,
    }
}

/// When a gateway's agent stops, its TUN device and the routes into it go;
/// the blackhole routes behind them stay, so peer-bound traffic is dropped
/// rather than sent down the default route in clear.
#[test]
fn a_stopped_gateway_sends_no_pod_address_to_the_wan() {
    gateway_down_sends_no_pod_address_to_the_wan(|gw| lab::stop_agent(gw).unwrap());
}

/// The same with the agent killed (SIGKILL), as a crash or the OOM killer
/// ends it: nothing with a cluster address leaves in clear, and the agent
/// started again with the same command line leaves the node's routes,
/// rules, addresses and programs as they were, nothing doubled, nothing
/// left behind.
#[test]
fn a_killed_gateway_sends_nothing_in_clear_and_comes_back_as_it_was() {
    require_lab();
    let gw = A.gw();
    let before = footprint(&gw);
    gateway_down_sends_no_pod_address_to_the_wan(kill_agent);
    eventually(
        Duration::from_secs(5),
        "a-gw's routes, rules, addresses and programs as before",
        || footprint(&gw) == before,
    );
}

/// Kills node `node`'s agent with SIGKILL and waits until it is gone.
fn kill_agent(node: &str) {
    let pid = lab::agent_pid(node).expect("the agent runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(Duration::from_secs(5), "the agent gone", || {
        lab::agent_pid(node).is_none()
    });
}

/// What an agent leaves on node `node`: its routes (every table), the
/// rules, the addresses, and how many programs of each of its names the
/// kernel holds (every node's, so a program doubled or left behind shows).
fn footprint(node: &str) -> (String, String, String, Vec<(String, usize)>) {
    let show = |args: &[&str]| ip(node, args).unwrap();
    let out = std::process::Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .expect("bpftool");
    let progs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut names = std::collections::BTreeMap::<String, usize>::new();
    for name in progs.iter().filter_map(|p| p["name"].as_str()) {
        if isthmus_common::names::tc_programs().any(|p| p == name) {
            *names.entry(name.to_owned()).or_default() += 1;
        }
    }
    (
        show(&["route", "show", "table", "all", "proto", "153"]),
        show(&["rule", "show"]),
        without_states(&show(&["-brief", "address", "show"])),
        names.into_iter().collect(),
    )
}

/// Each device of `brief` (`ip -brief address` output) with its
/// addresses, without its state: a TUN device reads UNKNOWN when the
/// agent that made it first opens it, and UP when the next one takes it
/// over, though nothing else about it differs.
fn without_states(brief: &str) -> String {
    brief
        .lines()
        .map(|line| {
            let mut fields = line.split_whitespace();
            let device = fields.next().unwrap_or_default();
            let addresses: Vec<&str> = fields.skip(1).collect();
            format!("{device} {}\n", addresses.join(" "))
        })
        .collect()
}

fn gateway_down_sends_no_pod_address_to_the_wan(stop: impl Fn(&str)) {
    require_lab();
    assert_eq!(
        lab::Setup::current().unwrap().tunnel,
        LabTunnel::Userspace,
        "the lab must run the tunnel"
    );
    let gw = A.gw();
    let blackholes = ip(&gw, &["route", "show", "type", "blackhole", "proto", "153"]).unwrap();
    for view in ["10.0.0.0/24", "10.0.1.0/24"] {
        assert!(
            blackholes.contains(view),
            "no blackhole for {view}: {blackholes}"
        );
    }
    let pcap = |name: &str| PathBuf::from(lab::STATE_DIR).join(format!("stopped-{name}.pcap"));
    let (wan_pcap, in_pcap) = (pcap("wan"), pcap("in"));
    let wan = capture_on_wan(
        &["-s", "128", "-w", wan_pcap.to_str().unwrap()],
        "stopped-wan",
    );
    // What a-gw takes in from its pods: a-pod2 directly, a-pod1 through the overlay.
    let taken_in = capture::start(
        &gw,
        "any",
        &[
            "-s",
            "128",
            "-w",
            in_pcap.to_str().unwrap(),
            "udp port 4879 or (udp and dst net 10.0.0.0/24)",
        ],
        "stopped-in",
    );
    stop(&gw);
    let port = probe::next_port();
    for (pod, target) in [(A.pod(1), "10.0.0.5"), (A.pod(2), "10.0.0.133")] {
        let socket =
            isthmus_lab::netns::run_in(&pod, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
                .unwrap()
                .unwrap();
        for _ in 0..5 {
            // Refused sends are fine: a-gw may answer unreachable.
            let _ = socket.send_to(b"must not leak", (target, port));
        }
    }
    eventually(
        Duration::from_secs(10),
        "a-gw gets the pods' packets",
        || captured(&in_pcap).len() >= 10,
    );
    capture::stop(taken_in);
    capture::stop(wan);
    let restarted = std::time::Instant::now();
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();
    let lab_nets: [ipnet::Ipv4Net; 2] = [
        "10.0.0.0/8".parse().unwrap(),
        "192.168.0.0/16".parse().unwrap(),
    ];
    for frame in captured(&wan_pcap) {
        if let Some((src, dst)) = addresses(&frame) {
            assert!(
                !lab_nets
                    .iter()
                    .any(|n| n.contains(&src) || n.contains(&dst)),
                "{src} → {dst} left a-gw on the WAN in clear while its agent was down"
            );
        }
    }
    probe::exchange(
        Proto::Udp,
        &A.pod(1),
        &B.pod(1),
        "10.0.0.5".parse::<std::net::Ipv4Addr>().unwrap(),
    )
    .expect("a-pod1 does not reach b-pod1 once a-gw's agent is back");
    assert!(
        restarted.elapsed() < Duration::from_secs(5),
        "traffic resumed {:?} after the restart",
        restarted.elapsed()
    );
    let _ = fs::remove_file(&wan_pcap);
    let _ = fs::remove_file(&in_pcap);
}

/// A pod created on a-node while its agent is down, with a-node's default
/// route towards a router of the LAN as real workers have; all removed, and
/// the agent started again, on drop.
struct WorkerDown {
    node: String,
}

/// The late pod: its netns, host end and address.
const LATE_NS: &str = "ist-t-late";
const LATE_DEV: &str = "podlate";
const LATE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 77);
/// The LAN's router in the worker's default route: no node, no gateway.
const LAN_ROUTER: &str = "172.16.1.254";

impl WorkerDown {
    /// Kills a-node's agent with SIGKILL, as a crash would.
    fn kill() -> Self {
        let node = A.node();
        kill_agent(&node);
        ip(
            &node,
            &["route", "add", "default", "via", LAN_ROUTER, "dev", "lan0"],
        )
        .unwrap();
        ip(
            &node,
            &[
                "neigh",
                "replace",
                LAN_ROUTER,
                "lladdr",
                "02:00:00:00:01:fe",
                "dev",
                "lan0",
            ],
        )
        .unwrap();
        isthmus_tests::netns::fresh(&[LATE_NS]);
        lab::wire_pod(LATE_NS, &node, LATE_DEV, LATE_ADDR).unwrap();
        Self { node }
    }
}

impl Drop for WorkerDown {
    fn drop(&mut self) {
        let _ = ip(&self.node, &["route", "del", "default"]);
        let _ = ip(&self.node, &["neigh", "del", LAN_ROUTER, "dev", "lan0"]);
        let _ = ip(&self.node, &["link", "del", LATE_DEV]);
        isthmus_tests::netns::remove(&[LATE_NS]);
        if lab::agent_pid(&self.node).is_none() {
            let restarted = lab::start_agent(&self.node).and_then(|_| lab::wait_ready(&self.node));
            if let Err(e) = restarted {
                eprintln!("restarting {}'s agent: {e:#}", self.node);
            }
        }
    }
}

/// A worker's agent killed with SIGKILL leaves a blackhole behind every
/// peer's network, so a pod created meanwhile (no steering program on its
/// veth) sends nothing for a peer in clear on the node's default route;
/// what is for no peer still goes there. The agent started again with the
/// same command line steers the new pod's traffic to b within 5 s.
#[test]
fn a_worker_whose_agent_is_down_sends_no_peer_bound_packet_in_clear() {
    require_lab();
    let node = A.node();
    let blackholes = ip(
        &node,
        &["route", "show", "type", "blackhole", "proto", "153"],
    )
    .unwrap();
    for view in ["10.0.0.0/24", "10.0.1.0/24"] {
        assert!(
            blackholes.contains(view),
            "no blackhole for {view} on {node}: {blackholes}"
        );
    }
    let ours = || ip(&node, &["route", "show", "proto", "153"]).unwrap();
    let routes_before = ours();
    let down = WorkerDown::kill();
    let pcap = PathBuf::from(lab::STATE_DIR).join("worker-down.pcap");
    let lan = capture::start(
        &node,
        "lan0",
        &[
            "-s",
            "128",
            "-w",
            pcap.to_str().unwrap(),
            "udp and not port 4879",
        ],
        "worker-down",
    );
    // Not a peer's: the control, which the default route takes.
    let control = Ipv4Addr::new(198, 51, 100, 7);
    let socket =
        isthmus_lab::netns::run_in(LATE_NS, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
            .unwrap()
            .unwrap();
    let port = probe::next_port();
    for target in ["10.0.0.5", "10.0.1.45", "10.0.0.133"] {
        for _ in 0..5 {
            // Refused sends are fine: the node may answer unreachable.
            let _ = socket.send_to(b"must not leak", (target, port));
        }
    }
    let _ = socket.send_to(b"control", (control, port));
    eventually(
        Duration::from_secs(10),
        "the control on a-node's LAN",
        || {
            captured(&pcap)
                .iter()
                .any(|f| addresses(f).is_some_and(|(_, dst)| dst == control))
        },
    );
    capture::stop(lan);
    let leaked: Vec<(Ipv4Addr, Ipv4Addr)> = captured(&pcap)
        .iter()
        .filter_map(|f| addresses(f))
        .filter(|(_, dst)| *dst != control)
        .collect();
    assert!(
        leaked.is_empty(),
        "a-node sent peer-bound packets in clear: {leaked:?}"
    );
    // The same command line again: the new pod's traffic reaches b.
    lab::start_agent(&node).unwrap();
    lab::wait_ready(&node).unwrap();
    let started = std::time::Instant::now();
    let mut seen = None;
    while seen.is_none() && started.elapsed() < Duration::from_secs(5) {
        seen = probe::exchange(Proto::Udp, LATE_NS, &B.pod(1), Ipv4Addr::new(10, 0, 0, 5)).ok();
    }
    let seen = seen.expect("the new pod reached no b-pod1 within 5 s of the restart");
    assert_eq!(seen.client_as_seen_by_server, Ipv4Addr::new(10, 0, 40, 77));
    assert_eq!(ours(), routes_before, "the restart changed a-node's routes");
    drop(down);
}
