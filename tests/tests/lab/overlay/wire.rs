//! The overlay on the LAN: its VNI, port and nodes, path MTU discovery
//! through it, bulk data intact, and forged overlay packets refused.

use super::*;

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
                libc::setsockopt(fd, libc::IPPROTO_IP, option, (&raw const value).cast(), 4)
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
                (&raw mut mtu).cast(),
                &raw mut len,
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
            .set_read_timeout(Some(Duration::from_mins(1)))
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
            .set_write_timeout(Some(Duration::from_mins(1)))
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
