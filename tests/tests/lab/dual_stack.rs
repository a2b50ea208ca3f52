//! The dual-stack lab (docs/design.md#dual-stack), which `cargo xtask
//! test` brings up for these tests alone: the IPv6 rows with real sockets
//! through the double NAT and the hub, the IPv6 masquerade, the IPv4 rows
//! in the same lab, the a–b tunnel over the WAN's IPv6 addresses, and what
//! a peer or a pod may not send over IPv6, segregation over IPv6, and the
//! nodes' IPv6 addresses in the gateways' node table. A payload length
//! longer than the packet is not among them:
//! the kernel of the sending pod rewrites it, and the gateway's drops it
//! before any program (the kernel tier sends it to the NAT itself).

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv6Addr, UdpSocket},
    time::Duration,
};

use isthmus_common::{names, wire::Be128};

use isthmus_lab::{
    lab::{self, segregation},
    netns,
    probe::{self, Proto, next_port},
    topology::{A, B, C, NAT_MAPPING, Reach, reachability6},
};
use isthmus_tests::{
    assert_row, eventually,
    inspect::{cell, inspect_on},
    metrics::{nat_packets, sample},
    packet6::{Packet6, addr6, icmp6, udp6},
    require_lab,
};

use isthmus_agent::kernel::conntrack::Conntrack;
use socket2::{Domain, Protocol, Socket, Type};

use crate::{reachability::check_rows, segregation::Segregated, tunnel_security::Outsider};

const GIVE_UP: Duration = Duration::from_secs(10);

fn require_dual_stack_lab() {
    require_lab();
    let setup = lab::Setup::current().unwrap();
    assert!(
        setup.dual_stack,
        "the lab is not dual-stack: `cargo xtask lab up --dual-stack` first"
    );
}

#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn the_ipv6_rows_cross_the_double_nat_over_tcp_udp_and_icmp() {
    require_dual_stack_lab();
    let translated = |gw: &str| {
        nat_packets(gw, "egress", "translated") + nat_packets(gw, "ingress", "translated")
    };
    let before = [translated(&A.gw()), translated(&B.gw())];
    for proto in Proto::ALL {
        for row in reachability6() {
            assert_row(proto, &row);
        }
    }
    // Rows 1 to 3 cross both a's and b's NAT, request and reply.
    let after = [translated(&A.gw()), translated(&B.gw())];
    for (gw, (before, after)) in ["a-gw", "b-gw"].iter().zip(before.iter().zip(after)) {
        let exchanges = 3 * Proto::ALL.len();
        assert!(
            after - before >= 2.0 * exchanges as f64,
            "{gw}: only {} packets translated for {exchanges} IPv6 exchanges",
            after - before
        );
    }
}

#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn the_ipv4_rows_keep_passing_in_the_dual_stack_lab() {
    require_dual_stack_lab();
    for proto in Proto::ALL {
        check_rows(proto);
    }
}

/// A counter of a netns's `/proc/net/snmp6` (`Udp6OutDatagrams`, …).
fn snmp6(ns: &str, counter: &str) -> u64 {
    let text = netns::run_in(ns, || {
        std::fs::read_to_string("/proc/thread-self/net/snmp6")
    })
    .unwrap()
    .unwrap();
    text.lines()
        .filter_map(|line| line.split_once(char::is_whitespace))
        .find(|(name, _)| *name == counter)
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{ns} has no {counter} in its snmp6"))
}

#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn the_a_b_tunnel_runs_over_the_wans_ipv6_addresses_and_b_c_over_ipv4() {
    require_dual_stack_lab();
    let sent6 = |ns: &str| snmp6(ns, "Udp6OutDatagrams");
    let (a_before, c_before) = (sent6(&A.gw()), sent6(&C.gw()));
    let rows = reachability6();
    for row in &rows {
        probe::exchange(Proto::Udp, &row.from, &row.answered_by, row.target)
            .unwrap_or_else(|e| panic!("IPv6 row {}: {e:#}", row.row));
    }
    // a's rows go to b over IPv6 datagrams; c's tunnel to b sends none.
    assert!(sent6(&A.gw()) > a_before, "a-gw sent b no IPv6 datagram");
    assert_eq!(sent6(&C.gw()), c_before, "c-gw sent IPv6 datagrams");
    let endpoint = format!("isthmus_peer_connected{{cluster_id=\"{}\"", B.cluster_id());
    assert_eq!(sample(&A.gw(), &endpoint), 1.0, "a-gw's session with b");
}

/// A UDP socket on `port` of every IPv6 address of netns `ns`, whose reads
/// give up after `wait`.
fn listener(ns: &str, port: u16, wait: Duration) -> UdpSocket {
    let socket = netns::run_in(ns, || UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port)))
        .unwrap()
        .unwrap();
    socket.set_read_timeout(Some(wait)).unwrap();
    socket
}

#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn a_peers_ipv6_packets_arrive_from_its_networks_and_its_router_advertisements_reach_no_device() {
    require_dual_stack_lab();
    let mut outsider = Outsider::new();
    let object = Outsider::register_dual_stack(outsider.port(), &outsider.public);
    eventually(GIVE_UP, "a-gw programs the outsider", || {
        sample(&A.gw(), "isthmus_peers ") == 2.0
    });
    assert!(outsider.handshake(GIVE_UP), "no handshake with a-gw");
    let port = next_port();
    let pod = A.pod_addr6(1);
    let listener = listener(&A.pod(1), port, Duration::from_secs(2));
    let violations = || {
        sample(
            &A.gw(),
            "isthmus_peer_source_violations_total{cluster_id=\"cluster-outsider\"",
        )
    };
    let before = violations();
    let udp = |src: &str, dst: &str, payload: &[u8]| {
        Packet6::new(addr6(src), addr6(dst), udp6(4000, port, payload)).bytes()
    };
    // A router advertisement from its router, and datagrams to every node
    // of a link and to a link-local address: none crosses.
    let advertisement = icmp6(134, [64, 0, 0x07, 0x08], &[0; 8]);
    outsider.send_inner(&Packet6::new(addr6("fe80::1"), addr6("ff02::1"), advertisement).bytes());
    outsider.send_inner(&udp("fd00:77::9", "ff02::1", b"to every node"));
    outsider.send_inner(&udp("fd00:77::9", "fe80::1", b"to a link-local address"));
    eventually(GIVE_UP, "the three packets are counted", || {
        violations() >= before + 3.0
    });
    // From its own IPv6 network, to a pod: delivered.
    outsider.send_inner(&udp("fd00:77::9", &pod.to_string(), b"allowed"));
    let mut buf = [0u8; 64];
    let (n, from) = listener
        .recv_from(&mut buf)
        .expect("the allowed packet never reached a-pod1");
    assert_eq!(&buf[..n], b"allowed");
    assert_eq!(from.ip(), IpAddr::from(addr6("fd00:77::9")));
    std::fs::remove_file(&object).unwrap();
    eventually(GIVE_UP, "a-gw drops the outsider", || {
        sample(&A.gw(), "isthmus_peers ") == 1.0
    });
}

/// Sends `packet`, a whole IPv6 packet, from netns `ns` as it is: a raw
/// socket of `IPPROTO_RAW` takes the header from us.
fn send_raw6(ns: &str, packet: &[u8]) {
    let dst: [u8; 16] = packet[24..40].try_into().unwrap();
    let to = std::net::SocketAddr::from((Ipv6Addr::from(dst), 0));
    netns::run_in(ns, || {
        let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::from(255)))?;
        socket.send_to(packet, &to.into())
    })
    .unwrap()
    .unwrap();
}

/// a-gw's count of IPv6 packets its NAT dropped for `reason`.
fn dropped(reason: &str) -> f64 {
    let labels = [("reason", reason)];
    lab::metric_sum(&A.gw(), "isthmus_nat_dropped_packets_total", &labels).unwrap_or(0.0)
}

#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn a_pods_hostile_ipv6_headers_stop_at_its_gateway_and_are_counted() {
    require_dual_stack_lab();
    let port = next_port();
    let listener = listener(&B.pod(2), port, Duration::from_millis(500));
    let received = || {
        let mut buf = [0u8; 64];
        listener.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
    };
    // a-pod2 to b-pod2, as a sees it: a-gw's NAT is the first to parse it.
    let (from, to) = (A.pod_addr6(2), "fd00:10::8000:0:0:133");
    let datagram = |payload: &[u8]| {
        Packet6::new(
            addr6(&from.to_string()),
            addr6(to),
            udp6(4000, port, payload),
        )
    };
    send_raw6(&A.pod(2), &datagram(b"eight").with_options(8).bytes());
    assert_eq!(
        received().as_deref(),
        Some(&b"eight"[..]),
        "8 headers: within the bound"
    );

    let chains = dropped("extension_headers");
    send_raw6(&A.pod(2), &datagram(b"nine").with_options(9).bytes());
    eventually(GIVE_UP, "nine extension headers counted at a-gw", || {
        dropped("extension_headers") > chains
    });
    // RFC 7112: a first fragment without the whole UDP header.
    let tiny = dropped("tiny_fragment");
    let first = datagram(b"tiny").in_fragment(0, true, 0x0102_0304);
    send_raw6(&A.pod(2), &first.with_segment(&[0x0f, 0xa0, 0, 53]));
    eventually(GIVE_UP, "the tiny first fragment counted at a-gw", || {
        dropped("tiny_fragment") > tiny
    });
    assert_eq!(received(), None, "a hostile packet reached b-pod2");
}

#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn a_gateways_own_ipv6_traffic_gets_out_through_the_ipv6_masquerade() {
    require_dual_stack_lab();
    // a-gw's IPv6 masquerade address, as b sees a's PodCIDR.
    assert_eq!(
        A.masquerade_addr6(),
        addr("fd00:10:244::ffff:ffff:ffff:fffe")
    );
    let masquerade_at_b = addr("fd00:10:0:40:ffff:ffff:ffff:fffe");
    let b_pod1 = addr("fd00:10::5");
    let masqueraded = || {
        lab::metric_sum(
            &A.gw(),
            "isthmus_nat_translated_packets_total",
            &[("kind", "masquerade")],
        )
        .unwrap_or_else(|e| panic!("scraping a-gw: {e:#}"))
    };
    let before = masqueraded();
    for proto in Proto::ALL {
        let seen =
            probe::exchange(proto, &A.gw(), &B.pod(1), b_pod1).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(
            seen.client_as_seen_by_server,
            IpAddr::V6(masquerade_at_b),
            "{}",
            proto.as_str()
        );
        assert_eq!(seen.server_as_seen_by_client, IpAddr::V6(b_pod1));
    }
    // Both ways of each exchange, on a-gw, in its IPv6 flow table.
    assert!(
        masqueraded() - before >= 2.0 * Proto::ALL.len() as f64,
        "a-gw counted {} masquerade translations",
        masqueraded() - before
    );
    let table = Conntrack::open(&lab::bpffs(&A.gw())).unwrap();
    assert!(
        table.entries6().unwrap().len() >= 2 * Proto::ALL.len(),
        "a-gw's IPv6 flow table: {:?}",
        table.entries6()
    );
    // `inspect` shows the IPv6 flows and the IPv6 masquerade address.
    let masquerade = format!("[{}]:", A.masquerade_addr6());
    let flows = inspect_on(&A.gw(), "conntrack");
    let ours = flows
        .iter()
        .filter(|row| cell(row, "dir") == "out" && cell(row, "nat").starts_with(&masquerade))
        .count();
    assert!(ours >= Proto::ALL.len(), "inspect conntrack: {flows:?}");
    let nat = inspect_on(&A.gw(), "nat");
    let addr6 = A.masquerade_addr6().to_string();
    assert!(
        nat.iter()
            .any(|row| cell(row, "direction") == "masquerade" && cell(row, "to") == addr6),
        "inspect nat: {nat:?}"
    );
}

fn addr(text: &str) -> Ipv6Addr {
    text.parse().expect("an IPv6 address")
}

/// A datagram of 4,000 bytes from a-pod1 to c-pod1 through the hub leaves
/// a-pod1 in IPv6 fragments (only the source fragments IPv6), and b
/// masquerades every one of them alike, the later ones by the first's
/// translation: c-pod1 gets it whole, from b's masquerade address. The
/// first try may meet the tunnel's smaller MTU: a-gw's Packet Too Big then
/// teaches a-pod1 the path's MTU, and the next try's fragments fit.
#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn a_fragmented_ipv6_datagram_crosses_the_hub_whole() {
    require_dual_stack_lab();
    const TRIES: usize = 3;
    let port = next_port();
    let server = listener(&C.pod(1), port, Duration::from_secs(2));
    let payload: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    let client = listener(&A.pod(1), 0, GIVE_UP);
    let (_, hub_target) = NAT_MAPPING.entry6();
    let mut buf = vec![0u8; 8192];
    let received = (1..=TRIES).find_map(|_| {
        client.send_to(&payload, (hub_target, port)).unwrap();
        server.recv_from(&mut buf).ok()
    });
    let (n, from) = received.expect("c-pod1 never got the fragmented datagram whole");
    assert_eq!(&buf[..n], &payload[..], "the datagram arrived changed");
    assert_eq!(
        from.ip(),
        IpAddr::V6(B.masquerade_addr6()),
        "c-pod1 saw {from}"
    );
}

/// Whether `proto` on `port` along `row` is answered by its server, who
/// sees the client as the row says.
fn answered_on(proto: Proto, row: &Reach<Ipv6Addr>, port: u16) -> bool {
    probe::exchange_on(proto, &row.from, &row.answered_by, row.target, port)
        .is_ok_and(|seen| seen.client_as_seen_by_server == IpAddr::from(row.client_seen_as))
}

/// b segregating its peers, over IPv6 as over IPv4: a reaches b-pod2,
/// offloaded from it (its Pod's IPv6 address), on any port, and b-pod1
/// only on the port of the service's IPv6 EndpointSlice; b's own flows'
/// replies come back.
#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn a_segregated_peer_reaches_over_ipv6_only_what_it_is_allowed() {
    require_dual_stack_lab();
    let rows = reachability6();
    let (to_b_pod1, to_b_pod2, b_to_a) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!((to_b_pod1.row, to_b_pod2.row, b_to_a.row), (1, 2, 3));
    let _segregated = Segregated::on();
    let service = segregation::SERVICE_PORT;
    assert!(
        answered_on(Proto::Tcp, to_b_pod1, service),
        "TCP to b-pod1's exported port over IPv6"
    );
    for (proto, port) in [
        (Proto::Udp, service),
        (Proto::Tcp, service + 2),
        (Proto::Icmp, next_port()),
    ] {
        assert!(
            !answered_on(proto, to_b_pod1, port),
            "{proto:?} to b-pod1 on {port} over IPv6 was answered"
        );
    }
    for proto in Proto::ALL {
        assert!(
            answered_on(proto, to_b_pod2, next_port()),
            "{proto:?}: a-pod2 to b-pod2, offloaded from a, over IPv6"
        );
        assert!(
            answered_on(proto, b_to_a, next_port()),
            "{proto:?}: b-pod1 to a-pod1 over IPv6, whose replies pass"
        );
    }
}

/// A dual-stack cluster's Node objects list an IPv6 `InternalIP`: each
/// gateway's agent writes its cluster's, which no peer's packet may reach.
#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn the_nodes_ipv6_addresses_are_in_the_gateways_node_table() {
    require_dual_stack_lab();
    for cluster in [&A, &B, &C] {
        let gw = cluster.gw();
        let want: BTreeSet<Ipv6Addr> = [cluster.lan_gw6(), cluster.lan_node6()].into();
        eventually(GIVE_UP, &format!("{gw}'s IPv6 node addresses"), || {
            let table =
                lab::pinned_hash::<Be128, u8>(&lab::bpffs(&gw), names::MAP_NODE_ADDRS6).unwrap();
            let held: BTreeSet<Ipv6Addr> = table
                .keys()
                .filter_map(Result::ok)
                .map(Ipv6Addr::from)
                .collect();
            held == want
        });
    }
}

/// `inspect` shows each table's IPv6 entries beside the IPv4 ones: a's
/// IPv6 view of b's pods, and b's IPv6 NatMapping entry of the hub row.
#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn inspect_shows_the_ipv6_tables() {
    require_dual_stack_lab();
    let b_pods_at_a = "fd00:10::/64";
    let peers = inspect_on(&A.gw(), "peers");
    assert!(
        peers
            .iter()
            .any(|row| cell(row, "networks").split(',').any(|n| n == b_pods_at_a)),
        "inspect peers on a-gw: {peers:?}"
    );
    let natmap = inspect_on(&B.gw(), "natmap");
    assert!(
        natmap
            .iter()
            .any(|row| cell(row, "external_ip").parse::<Ipv6Addr>().is_ok()),
        "inspect natmap on b-gw: {natmap:?}"
    );
}

/// A metric of a-gw's, by its exact name.
fn a_gw_gauge(name: &str) -> f64 {
    lab::metric_sum(&A.gw(), name, &[]).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `auto`, the DaemonSets' setting, proves each family's rules apart. On
/// a bare a-gw, b's IPv6 packets for a-pod2 go past its IP layer, as IPv4's
/// do. An ip6tables rule that drops TCP to a-pod2 on one port sends a-pod2's
/// IPv6 packets through the stack, where the rule applies, and changes
/// nothing for IPv4. Once it is gone, IPv6 goes past the IP layer again.
#[test]
#[ignore = "needs the dual-stack lab; `cargo xtask test` runs it there"]
fn ipv6_goes_past_a_gws_ip_layer_but_to_what_its_ip6tables_rules_act_on() {
    require_dual_stack_lab();
    let gw = A.gw();
    let a_pod2_at_b = addr("fd00:10:0:40:8000::133");
    let exchange = |port| probe::exchange_on(Proto::Tcp, &B.pod(2), &A.pod(2), a_pod2_at_b, port);
    let ipv6_past = |destinations: f64| {
        a_gw_gauge("isthmus_forward_past_netfilter_ipv6") == 1.0
            && a_gw_gauge("isthmus_forward_stack_destinations_ipv6") == destinations
    };
    eventually(GIVE_UP, "a-gw forwards IPv6 past netfilter", || {
        ipv6_past(0.0)
    });
    let ipv4 = || {
        (
            a_gw_gauge("isthmus_forward_past_netfilter"),
            a_gw_gauge("isthmus_forward_stack_destinations"),
        )
    };
    let ipv4_before = ipv4();
    let forwarded = || {
        let past = sample(&gw, "isthmus_overlay_packets_total{event=\"forwarded\"}");
        (past, snmp6(&gw, "Ip6OutForwDatagrams") as f64)
    };
    let before = forwarded();
    exchange(next_port()).expect("b-pod2 to a-pod2 over IPv6");
    let after = forwarded();
    let (past, through) = (after.0 - before.0, after.1 - before.1);
    assert!(
        past >= 2.0 && through < past,
        "a-gw forwarded {past} IPv6 packets past its IP layer and {through} through it"
    );

    let port = next_port().to_string();
    let rule = |op: &str| {
        let pod = "fd00:10:244:0:8000::133";
        let rule = [
            "FORWARD", "-d", pod, "-p", "tcp", "--dport", &port, "-j", "DROP",
        ];
        let args = [
            &["netns", "exec", gw.as_str(), "ip6tables", "-w", op][..],
            &rule,
        ]
        .concat();
        isthmus_lab::cmd::run("ip", &args)
    };
    rule("-A").unwrap();
    eventually(GIVE_UP, "a-pod2 takes the stack in IPv6", || ipv6_past(1.0));
    assert_eq!(ipv4(), ipv4_before, "IPv4 past netfilter, as it was");
    let blocked = exchange(port.parse().unwrap());
    let reached = exchange(next_port());
    rule("-D").unwrap();
    assert!(blocked.is_err(), "the ip6tables rule's port was reached");
    reached.expect("another port, through the stack");
    eventually(GIVE_UP, "a-gw forwards IPv6 past netfilter again", || {
        ipv6_past(0.0)
    });
    exchange(port.parse().unwrap()).expect("the rule gone, its port");
}
