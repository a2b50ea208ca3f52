//! ExternalCIDR through the hub (docs/design.md#expected-reachability, row 5): a-pod1 reaches c-pod1
//! at 10.0.1.45 through b's NatMapping and masquerade, never a pod of b;
//! the entry's removal and return take effect live; and a gateway's own
//! traffic gets out through the masquerade.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use isthmus_agent::{kernel::maps::MappingMap, kernel::table::KernelTable};
use isthmus_lab::{
    cmd::ip,
    lab, netns,
    probe::{self, Proto, next_port},
    topology::{A, B, C, METRICS_PORT, NAT_MAPPING},
};
use isthmus_tests::{netns as test_netns, require_lab};

/// How a reaches c-pod1: b's externalIP 192.168.0.45 in a's view of b's ExternalCIDR.
const HUB_TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 45);
/// A pod of b that owns the host part .45 of b's PodCIDR: the wrong answer.
const IMPOSTOR_NS: &str = "ist-t-b45";
const IMPOSTOR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 45);
/// The new-connection cutoff the issue sets after a removal.
const CUTOFF: Duration = Duration::from_millis(100);
const CONNECT: Duration = Duration::from_millis(150);
const GIVE_UP: Duration = Duration::from_secs(10);

/// A pod of the test's own on b-node, wired like the lab's pods; removed on drop.
struct Impostor;

impl Impostor {
    fn new() -> Self {
        test_netns::fresh(&[IMPOSTOR_NS]);
        let _ = ip(&B.node(), &["link", "del", "t45"]);
        lab::wire_pod(IMPOSTOR_NS, &B.node(), "t45", IMPOSTOR).unwrap();
        Self
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        // Deleting the link now, not when the kernel gets round to freeing
        // the namespace, lets the next test create it again.
        let _ = ip(&B.node(), &["link", "del", "t45"]);
        test_netns::remove(&[IMPOSTOR_NS]);
    }
}

/// A TCP server in `ns` that answers every connection with `name` and
/// counts them, until dropped.
struct Server {
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    fn start(ns: &str, port: u16, name: &'static str) -> Self {
        let listener = netns::run_in(ns, || TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
            .unwrap()
            .unwrap();
        listener.set_nonblocking(true).unwrap();
        let (accepted, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (count, halt) = (accepted.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.write_all(name.as_bytes());
                    }
                    // Polling paces the accept loop; it waits for no condition.
                    Err(_) => thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Self {
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When a connection started, and who answered it.
/// A connection attempt: when it started, when it ended, and who answered.
type Attempt = (Duration, Duration, Option<String>);

/// Connects from a-pod1 to the hub target and returns who answered.
fn who_answers(port: u16) -> Option<String> {
    let addr = SocketAddr::from((HUB_TARGET, port));
    netns::run_in(&A.pod(1), || {
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut name = String::new();
        stream.read_to_string(&mut name).ok()?;
        Some(name)
    })
    .unwrap()
}

fn hub_entry_present() -> bool {
    let map = MappingMap::open(&lab::bpffs(&B.gw())).expect("b-gw's NatMapping table");
    let endpoint = isthmus_common::wire::Be32::from(NAT_MAPPING.endpoint);
    map.entries().unwrap().iter().any(|(_, to)| *to == endpoint)
}

/// Waits until b-gw's kernel table holds the entry (or not); returns how long it took.
fn until_entry(present: bool) -> Duration {
    let what = format!("b-gw's NatMapping entry present: {present}");
    // Every millisecond: these waits are timed.
    isthmus_lab::wait::until(GIVE_UP, Duration::from_millis(1), &what, || {
        hub_entry_present() == present
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The impostor pod, and servers on one port in c-pod1 and in it.
fn setup() -> (Impostor, u16, Server, Server) {
    require_lab();
    let impostor = Impostor::new();
    let port = next_port();
    let c = Server::start(&C.pod(1), port, "c-pod1");
    let b45 = Server::start(IMPOSTOR_NS, port, "b45");
    (impostor, port, c, b45)
}

#[test]
fn the_hub_target_reaches_c_and_never_a_pod_of_b() {
    let (_pod, port, c, impostor) = setup();
    for i in 0..20 {
        assert_eq!(
            who_answers(port).as_deref(),
            Some("c-pod1"),
            "connection {i}"
        );
    }
    // UDP too: the impostor listens on the same port and must hear nothing.
    let udp_port = next_port();
    let impostor_udp = netns::run_in(IMPOSTOR_NS, || {
        UdpSocket::bind((Ipv4Addr::UNSPECIFIED, udp_port))
    })
    .unwrap()
    .unwrap();
    impostor_udp.set_nonblocking(true).unwrap();
    let seen = probe::exchange(Proto::Udp, &A.pod(1), &C.pod(1), HUB_TARGET).unwrap();
    assert_eq!(seen.server_as_seen_by_client, HUB_TARGET);
    assert_eq!(c.accepted(), 20);
    assert_eq!(
        impostor.accepted(),
        0,
        "b's pod .45 got a connection meant for c-pod1"
    );
    assert!(
        impostor_udp.recv_from(&mut [0u8; 64]).is_err(),
        "b's pod .45 got a datagram"
    );
}

#[test]
fn removing_the_entry_stops_new_connections_within_100ms_and_restoring_it_brings_them_back() {
    let (_pod, port, c, impostor) = setup();
    // Traffic runs throughout: a connection every few milliseconds, each
    // noted with when it started and who answered. Bounded in count and time.
    let base = Instant::now();
    let attempts: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (attempts, stop) = (attempts.clone(), stop.clone());
        thread::spawn(move || {
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) || base.elapsed() > Duration::from_secs(30) {
                    break;
                }
                let started = base.elapsed();
                let answer = who_answers(port);
                attempts
                    .lock()
                    .unwrap()
                    .push((started, base.elapsed(), answer));
                thread::sleep(Duration::from_millis(3));
            }
        })
    };
    let successes_after = |from: Duration| {
        attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, a)| *t >= from && a.is_some())
            .count()
    };
    let attempts_after = |from: Duration| {
        attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, _)| *t >= from)
            .count()
    };
    let wait_for =
        |what: &str, done: &dyn Fn() -> bool| isthmus_tests::eventually(GIVE_UP, what, done);
    wait_for("traffic through the hub", &|| {
        successes_after(Duration::ZERO) >= 10
    });

    let removed_at = base.elapsed();
    lab::write_nat_mapping(&[]).unwrap();
    let removal = until_entry(false);
    let cutoff = removed_at + CUTOFF;
    wait_for("attempts after the removal", &|| {
        attempts_after(cutoff) >= 10
    });

    let restored_at = base.elapsed();
    lab::write_nat_mapping(&[NAT_MAPPING.entry()]).unwrap();
    let restore = until_entry(true);
    wait_for("traffic after the restore", &|| {
        successes_after(restored_at + restore) >= 5
    });
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();

    let attempts = attempts.lock().unwrap();
    // An attempt still in flight when the restore began may rightly get
    // through: only one that ended before it proves the removal leaked.
    let late_successes: Vec<_> = attempts
        .iter()
        .filter(|(started, ended, a)| *started >= cutoff && *ended < restored_at && a.is_some())
        .collect();
    assert!(
        removal < CUTOFF,
        "the entry left b-gw's kernel table {removal:?} after the file changed"
    );
    assert!(
        late_successes.is_empty(),
        "connections started more than {CUTOFF:?} after the removal still got through: {late_successes:?}"
    );
    assert!(
        attempts.iter().all(|(_, _, a)| a.as_deref() != Some("b45")),
        "a connection reached b's pod .45"
    );
    assert_eq!(impostor.accepted(), 0);
    // c-pod1 may accept a connection whose answer, caught by the removal,
    // never makes it back; it never has fewer.
    assert!(
        c.accepted() >= attempts.iter().filter(|(_, _, a)| a.is_some()).count(),
        "answered connections that c-pod1 never accepted"
    );
    println!("removal reached the kernel in {removal:?}, the restore in {restore:?}");
}

#[test]
fn a_gateways_own_traffic_gets_out_through_the_masquerade() {
    require_lab();
    // a-gw's masquerade address 10.244.0.254, as b sees a's PodCIDR.
    let masquerade_at_b = Ipv4Addr::new(10, 0, 40, 254);
    assert_eq!(A.masquerade_addr(), Ipv4Addr::new(10, 244, 0, 254));
    for proto in Proto::ALL {
        let seen = probe::exchange(proto, &A.gw(), &B.pod(1), Ipv4Addr::new(10, 0, 0, 5))
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(
            seen.client_as_seen_by_server,
            masquerade_at_b,
            "{}",
            proto.as_str()
        );
        assert_eq!(seen.server_as_seen_by_client, Ipv4Addr::new(10, 0, 0, 5));
    }
}

/// A datagram of 4,000 bytes from a-pod1 to c-pod1 through the hub crosses
/// in fragments, and b masquerades every one of them alike: c-pod1 gets it
/// whole, from an address of b.
#[test]
fn a_fragmented_datagram_crosses_the_hub_whole() {
    require_lab();
    let port = next_port();
    let server = netns::run_in(&C.pod(1), || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
        .unwrap()
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let payload: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    let client = netns::run_in(&A.pod(1), || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap()
        .unwrap();
    client.send_to(&payload, (HUB_TARGET, port)).unwrap();
    let mut buf = vec![0u8; 8192];
    let (n, from) = server
        .recv_from(&mut buf)
        .expect("c-pod1 never got the fragmented datagram whole");
    assert_eq!(&buf[..n], &payload[..], "the datagram arrived changed");
    let SocketAddr::V4(from) = from else {
        panic!("{from}")
    };
    assert!(
        B.pods().contains(from.ip()),
        "c-pod1 saw {from}, not an address of b"
    );
}

/// Puts b's NatMapping for a back as the lab writes it, even if the test fails.
struct RestoreNatMapping;

impl Drop for RestoreNatMapping {
    fn drop(&mut self) {
        let _ = lab::write_nat_mapping(&[NAT_MAPPING.entry()]);
        until_entry(true);
    }
}

/// An object author who adds `172.16.2.1: 10.0.1.77` (b-gw's own LAN
/// address) to b's NatMapping for a does not let a-pod1 read b-gw's
/// metrics at 10.0.1.77: the entry is rejected, named, in the agent's log
/// and by `check`; the object's other entries still apply.
#[test]
fn a_natmapping_entry_cannot_expose_a_node() {
    require_lab();
    let node_lan = B.lan_gw();
    let exposed = Ipv4Addr::new(10, 0, 1, 77);
    let log = lab::log_file(&B.gw());
    let logged_before = std::fs::read_to_string(&log).unwrap_or_default().len();
    let _restore = RestoreNatMapping;
    lab::write_nat_mapping(&[NAT_MAPPING.entry(), (node_lan, exposed)]).unwrap();
    let rejection = format!("field spec.clusterMappings.{node_lan}: endpoint {node_lan}");
    isthmus_tests::eventually(GIVE_UP, "b-gw's agent rejects the entry", || {
        std::fs::read_to_string(&log).unwrap_or_default()[logged_before..].contains(&rejection)
    });
    assert!(hub_entry_present(), "the object's other entry went too");
    let metrics = SocketAddr::from((exposed, METRICS_PORT));
    assert!(
        lab::http_get_at(&A.pod(1), metrics, "/metrics").is_err(),
        "a-pod1 read b-gw's metrics through the NatMapping"
    );
    // The hub row still holds.
    let seen = probe::exchange(Proto::Tcp, &A.pod(1), &C.pod(1), HUB_TARGET).unwrap();
    assert_eq!(seen.server_as_seen_by_client, HUB_TARGET);
    let check = std::process::Command::new(lab::agent_binary())
        .args([
            "check",
            &format!("--source=dir:{}", lab::object_dir(&B.gw()).display()),
        ])
        .output()
        .unwrap();
    let verdict = String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "check passed:\n{verdict}");
    assert!(
        verdict.contains(&rejection) && verdict.contains("is the address of node b-gw"),
        "check does not name the entry:\n{verdict}"
    );
}

/// b-gw's agent run with a NatMapping table of 8 entries, and restored as
/// the lab runs it (with c's NatMapping as the lab writes it) on drop.
struct SmallNatMappingTable {
    pid: u32,
    log: std::path::PathBuf,
}

impl SmallNatMappingTable {
    fn start() -> Self {
        let gw = B.gw();
        lab::stop_agent(&gw).unwrap();
        let mut args = lab::agent_args(&gw).unwrap();
        args.push("--nat-mapping-capacity=8".into());
        let log = lab::log_file(&format!("{gw}-share"));
        let _ = std::fs::remove_file(&log);
        let pid = lab::spawn_agent(&gw, &args, &log).unwrap();
        lab::wait_ready_in(&gw, pid, &log).unwrap();
        Self { pid, log }
    }
}

impl Drop for SmallNatMappingTable {
    fn drop(&mut self) {
        let gw = B.gw();
        let b_to_c = b_to_c();
        let restored = lab::write_object(
            &gw,
            &b_to_c.nat_mapping_file(),
            &b_to_c.nat_mapping_yaml(&[]),
        )
        .and_then(|()| lab::stop_pid(self.pid))
        .and_then(|()| lab::start_agent(&gw))
        .and_then(|_| lab::wait_ready(&gw));
        if let Err(e) = restored {
            eprintln!("restoring {gw}'s agent: {e:#}");
        }
    }
}

fn b_to_c() -> &'static isthmus_lab::topology::Peering {
    isthmus_lab::topology::PEERINGS
        .iter()
        .find(|p| p.local.name == "b" && p.remote.name == "c")
        .unwrap()
}

/// Cluster c's NatMapping on b grows to 51 entries while b-gw's table holds
/// 8: a's hub entry and conncheck entry keep their room, c keeps its
/// conncheck entry, and c's excess is refused, named, in one error.
#[test]
fn one_peers_large_natmapping_takes_no_other_peers_room() {
    require_lab();
    let small = SmallNatMappingTable::start();
    let b_to_c = b_to_c();
    let flood: Vec<(Ipv4Addr, Ipv4Addr)> = (100..150)
        .map(|i| (Ipv4Addr::new(10, 1, 0, i), Ipv4Addr::new(192, 168, 0, i)))
        .collect();
    lab::write_object(
        &B.gw(),
        &b_to_c.nat_mapping_file(),
        &b_to_c.nat_mapping_yaml(&flood),
    )
    .unwrap();
    isthmus_tests::eventually(GIVE_UP, "b-gw refuses c's excess", || {
        std::fs::read_to_string(&small.log)
            .unwrap_or_default()
            .contains("45 of its 51 entries are refused: this cluster's share of the IPv4 NatMapping table is 6 of 8")
    });
    let map = MappingMap::open(&lab::bpffs(&B.gw())).unwrap();
    let endpoints: Vec<Ipv4Addr> = map
        .entries()
        .unwrap()
        .iter()
        .map(|(_, endpoint)| Ipv4Addr::from(*endpoint))
        .collect();
    assert_eq!(endpoints.len(), 8, "{endpoints:?}");
    assert!(
        endpoints.contains(&NAT_MAPPING.endpoint),
        "a's hub entry: {endpoints:?}"
    );
    let conncheck = Ipv4Addr::new(169, 254, 0, 1);
    assert_eq!(
        endpoints.iter().filter(|e| **e == conncheck).count(),
        2,
        "a's and c's conncheck entries: {endpoints:?}"
    );
    // a's hub row still holds.
    let seen = probe::exchange(Proto::Tcp, &A.pod(1), &C.pod(1), HUB_TARGET).unwrap();
    assert_eq!(seen.server_as_seen_by_client, HUB_TARGET);
}
