//! The agent's metrics, in the lab: the set a gateway exposes after traffic,
//! `promtool check metrics` on every agent, and the lab's real Prometheus
//! scraping them all and seeing what was sent.

use std::{
    io::Write,
    net::{Ipv4Addr, UdpSocket},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use isthmus_lab::{
    lab::{self, monitor},
    netns,
    probe::{self, Proto},
    topology::{self, A, B, CLUSTERS},
};
use isthmus_tests::require_lab;

/// b-pod2 as cluster a sees it.
const B_POD2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 133);
const DATAGRAMS: usize = 200;
const PAYLOAD: usize = 1000;
/// An IPv4 packet of the traffic: header, UDP header, payload.
const PACKET_BYTES: usize = 20 + 8 + PAYLOAD;

/// Sends the test's datagrams from a-pod2 (on a-gw) to b-pod2, through
/// a-gw's NAT and tunnel. Nothing listens there; b-pod2's ICMP errors do
/// not matter.
fn send_traffic() {
    netns::run_in(&A.pod(2), || -> std::io::Result<()> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..DATAGRAMS {
            socket.send_to(&[0x5a; PAYLOAD], (B_POD2, 9))?;
        }
        Ok(())
    })
    .unwrap()
    .unwrap();
}

fn sum(node: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    lab::metric_sum(node, name, labels).unwrap_or_else(|e| panic!("{e:#}"))
}

/// What a-gw says of its traffic to b: peer bytes and packets sent, and
/// egress packets the NAT translated by prefix remap.
fn a_to_b() -> [(&'static str, Vec<(&'static str, &'static str)>); 3] {
    let peer = vec![("cluster_id", "cluster-b"), ("cluster_name", "b")];
    [
        ("isthmus_peer_transmit_bytes_total", peer.clone()),
        ("isthmus_peer_transmit_packets_total", peer),
        (
            "isthmus_nat_translated_packets_total",
            vec![
                ("program", "nat_egress_ip"),
                ("direction", "egress"),
                ("kind", "prefix"),
            ],
        ),
    ]
}

/// Waits until each of `read()` has risen from `before` by at least
/// [`SENT`]: `send_traffic` returns once the tun device has queued the
/// packets, and the agent counts them as it encrypts them (and Prometheus
/// as it scrapes). Fails after 15 s, naming what fell short.
fn wait_until_risen(names: &[String; 3], before: [f64; 3], read: impl Fn() -> [f64; 3]) {
    let mut short = Vec::new();
    let risen = || {
        short = names
            .iter()
            .zip(read().iter().zip(before))
            .zip(SENT)
            .filter(|((_, (n, b)), sent)| *n - b < *sent)
            .map(|((name, (n, b)), sent)| format!("{name} rose by {}, not {sent}", n - b))
            .collect();
        short.is_empty()
    };
    // Every 100 ms: each try is a scrape.
    let waited = isthmus_lab::wait::until(
        Duration::from_secs(15),
        Duration::from_millis(100),
        "every counter risen",
        risen,
    );
    waited.unwrap_or_else(|e| panic!("{e}: {}", short.join("; ")));
}

/// What `a_to_b` must rise by at least.
const SENT: [f64; 3] = [
    (DATAGRAMS * PACKET_BYTES) as f64,
    DATAGRAMS as f64,
    DATAGRAMS as f64,
];

#[test]
fn a_gateway_exposes_the_whole_metric_set_and_counts_what_it_sent() {
    require_lab();
    let gw = A.gw();
    let read = || a_to_b().map(|(name, labels)| sum(&gw, name, &labels));
    let before = read();
    send_traffic();
    wait_until_risen(&a_to_b().map(|(name, _)| name.to_owned()), before, read);

    // An earlier test may have restarted a-gw: its conncheck answers
    // within a few PINGs.
    isthmus_tests::eventually(
        Duration::from_secs(20),
        "a-gw's conncheck reaches b",
        || {
            lab::metric_sum(
                &gw,
                "liqo_peer_is_connected",
                &[("cluster_id", "cluster-b")],
            )
            .is_ok_and(|v| v == 1.0)
        },
    );
    let (_, body) = lab::http_get(&gw, "/metrics").unwrap();
    for family in [
        "isthmus_peer_connected",
        "isthmus_peer_last_handshake_seconds",
        // The handshake's RTT exists only on the side that initiated it;
        // the conncheck's is measured by both.
        "liqo_peer_latency_us",
        "liqo_peer_is_connected",
        "liqo_peer_receive_bytes_total",
        "liqo_peer_transmit_bytes_total",
        "isthmus_peer_receive_bytes_total",
        "isthmus_peer_transmit_bytes_total",
        "isthmus_peer_receive_packets_total",
        "isthmus_peer_transmit_packets_total",
        "isthmus_peer_handshake_failures_total",
        "isthmus_nat_packets_total",
        "isthmus_nat_translated_packets_total",
        "isthmus_nat_dropped_packets_total",
        "isthmus_conntrack_entries",
        "isthmus_conntrack_gc_interval_seconds",
        "isthmus_conntrack_gc_runs_total",
        "isthmus_map_entries",
        "isthmus_map_capacity_entries",
        "isthmus_build_info",
        "isthmus_reconcile_errors_total",
        "isthmus_last_reconcile_timestamp_seconds",
        "isthmus_program_load_seconds_total",
    ] {
        assert!(
            body.lines()
                .any(|l| l.starts_with(&format!("{family}{{"))
                    || l.starts_with(&format!("{family} "))),
            "a-gw has no {family}:\n{body}"
        );
    }
    let loading = lab::metric(&gw, "isthmus_program_load_seconds_total ").unwrap();
    assert!(
        loading > 0.0,
        "a-gw loaded its programs in no time: {loading}"
    );
    let peer = [("cluster_id", "cluster-b"), ("cluster_name", "b")];
    assert_eq!(sum(&gw, "isthmus_peer_connected", &peer), 1.0);
    // Its value depends on earlier tests' restarts; the series must exist.
    sum(&gw, "isthmus_peer_handshake_failures_total", &peer);
    // The XDP guard is an option, off as the DaemonSet ships it.
    let xdp_mode = if lab::Setup::current().unwrap().guard {
        "native"
    } else {
        "none"
    };
    let build = [
        ("attach_mode", "tcx"),
        ("xdp_mode", xdp_mode),
        ("role", "gateway"),
    ];
    assert_eq!(sum(&gw, "isthmus_build_info", &build), 1.0);
    // Every peer has two networks in the peer table.
    let peers = sum(&gw, "isthmus_peers", &[]);
    let nets = [("map", "ist_peer_nets")];
    assert_eq!(sum(&gw, "isthmus_map_entries", &nets), 2.0 * peers);
    assert_eq!(sum(&gw, "isthmus_map_capacity_entries", &nets), 8192.0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let reconciled = sum(&gw, "isthmus_last_reconcile_timestamp_seconds", &[]);
    assert!(
        reconciled <= now && now - reconciled < 3600.0,
        "last reconcile at {reconciled}, now {now}"
    );
}

#[test]
fn promtool_finds_nothing_to_report_in_any_agents_metrics() {
    require_lab();
    for c in CLUSTERS {
        for (node, _) in c.nodes() {
            let (_, body) = lab::http_get(&node, "/metrics").unwrap();
            let mut promtool = Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("promtool (Debian prometheus) is installed by the build");
            promtool
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = promtool.wait_with_output().unwrap();
            let said = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
            // Liqo's dashboards read this name; it is Liqo's, not ours to fix.
            let liqos = "liqo_peer_latency_us metric names should not contain abbreviated units";
            let ours: Vec<&str> = said.lines().filter(|l| *l != liqos).collect();
            assert!(
                (out.status.success() || said.contains(liqos)) && ours.is_empty(),
                "promtool on {node}'s metrics ({}): {said}",
                out.status,
            );
        }
    }
}

/// The value of PromQL `expr` in the lab's Prometheus: the sum of what it
/// gives, 0 when it gives nothing.
fn prometheus(expr: &str) -> f64 {
    monitor::query(expr)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .iter()
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn prometheus_scrapes_every_agent_and_sees_what_was_sent() {
    require_lab();
    monitor::wait_until_every_agent_is_up().unwrap();
    let up = monitor::query("up{job=\"isthmus\"}").unwrap();
    let mut nodes: Vec<&str> = up.iter().map(|(l, _)| l["node"].as_str()).collect();
    nodes.sort_unstable();
    let mut want: Vec<String> = CLUSTERS
        .iter()
        .flat_map(|c| c.nodes().map(|(n, _)| n))
        .collect();
    want.sort();
    assert_eq!(nodes, want, "targets Prometheus scrapes");
    assert!(up.iter().all(|(_, v)| *v == 1.0), "every agent up: {up:?}");

    let exprs = a_to_b().map(|(name, labels)| {
        let matchers: Vec<String> = labels
            .iter()
            .chain(&[("node", "a-gw")])
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        format!("sum({name}{{{}}})", matchers.join(","))
    });
    let read = || exprs.clone().map(|e| prometheus(&e));
    let before = read();
    send_traffic();
    wait_until_risen(&exprs, before, read);
}

#[test]
fn the_hub_counts_its_natmapping_and_masquerade_translations() {
    require_lab();
    // Row 5: a-pod1 reaches c-pod1 through the hub b by an externalIP that
    // b's NatMapping resolves, masqueraded towards c.
    let row5 = &topology::reachability()[4];
    let hub = B.gw();
    let translated = |kind: &str| {
        sum(
            &hub,
            "isthmus_nat_translated_packets_total",
            &[("kind", kind)],
        )
    };
    let kinds = ["natmapping", "masquerade"];
    let before = kinds.map(translated);
    probe::exchange(Proto::Udp, &row5.from, &row5.answered_by, row5.target).unwrap();
    let after = kinds.map(translated);
    for ((kind, b), a) in kinds.iter().zip(before).zip(after) {
        // At least the request and the reply.
        assert!(a - b >= 2.0, "{hub}: {kind} translations rose by {}", a - b);
    }
}

/// The metrics are served on the node's address only, and a burst of 50
/// scrapes at once leaves `/healthz` answering within a second.
#[test]
fn fifty_scrapes_at_once_leave_healthz_prompt_and_only_the_node_address_serves() {
    require_lab();
    let gw = A.gw();
    let elsewhere = std::net::SocketAddr::from((A.wan_addr(), topology::METRICS_PORT));
    assert!(
        lab::http_get_at(&gw, elsewhere, "/healthz").is_err(),
        "a-gw serves its metrics on its WAN address too"
    );
    let scrapers: Vec<_> = (0..50)
        .map(|_| {
            let gw = gw.clone();
            std::thread::spawn(move || lab::http_get(&gw, "/metrics").map(|(status, _)| status))
        })
        .collect();
    let start = Instant::now();
    let (status, _) = lab::http_get(&gw, "/healthz").unwrap();
    let took = start.elapsed();
    for scraper in scrapers {
        assert_eq!(scraper.join().unwrap().unwrap(), 200, "a scrape failed");
    }
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(1),
        "/healthz took {took:?} during the burst"
    );
    eprintln!("/healthz answered in {took:?} during 50 concurrent scrapes");
}
