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
use isthmus_tests::{
    capture::{self, frames},
    eventually, require_lab,
};
use xtask::{
    cmd::ip,
    lab::{self, LabTunnel},
    probe::{self, Proto},
    topology::{A, B, CLUSTERS, TUNNEL_PORT, reachability},
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
        lab::tunnel_mode(),
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
    require_lab();
    assert_eq!(
        lab::tunnel_mode(),
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
    lab::stop_agent(&gw).unwrap();
    let port = probe::next_port();
    for (pod, target) in [(A.pod(1), "10.0.0.5"), (A.pod(2), "10.0.0.133")] {
        let socket = xtask::netns::run_in(&pod, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
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
        "10.0.0.5".parse().unwrap(),
    )
    .expect("a-pod1 does not reach b-pod1 once a-gw's agent is back");
    let _ = fs::remove_file(&wan_pcap);
    let _ = fs::remove_file(&in_pcap);
}
