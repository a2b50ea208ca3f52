//! Fair share of b-gw's conntrack, at the capacity the
//! DaemonSet ships: a pod of a floods the hub path through b with new UDP
//! flows that c never answers. a's flows fill only a's share; b-gw's own
//! flows still find room; a's connection that c answers lives on; and
//! a's next connection gets room within seconds, as the collector evicts
//! a's oldest unanswered flows, not after their 60 s.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    thread,
    time::{Duration, Instant},
};

use isthmus_agent::kernel::conntrack::{Conntrack, SweptTable, TrackedKey};
use isthmus_common::conntrack::{DIR_OUT, Timeouts};
use isthmus_lab::{
    lab, netns,
    probe::{self, Proto, next_port},
    topology::{A, B, C, PEERINGS},
};
use isthmus_tests::{eventually, require_lab};

/// How a reaches c-pod1 through b (docs/design.md#expected-reachability, row 5).
const HUB_TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 45);
/// The flood's destination ports: each datagram is a new flow.
const FLOOD_PORTS: std::ops::Range<u16> = 30_000..31_000;
/// More flows than a's share of a default conntrack (131,072 entries, 10%
/// kept for the gateway, the rest split between b's two peers: 29,491
/// flows).
const FLOOD_FLOWS: usize = 45_000;
const A_ID: &str = "cluster-a";

/// Removes the flood's flows from b-gw's conntrack on drop, so the tests
/// after this one find a's share as they would without it.
struct FloodCleanup;

impl Drop for FloodCleanup {
    fn drop(&mut self) {
        let Ok(mut table) = Conntrack::open(&lab::bpffs(&B.gw())) else {
            return;
        };
        let Ok(flows) = table.flows(0, &Timeouts::DEFAULT) else {
            return;
        };
        let flood: Vec<_> = flows
            .iter()
            .filter(|f| {
                f.keys()
                    .iter()
                    .any(|k| matches!(k, TrackedKey::V4(k) if k.dir == DIR_OUT && FLOOD_PORTS.contains(&k.dport)))
            })
            .flat_map(|f| f.keys().iter().copied())
            .collect();
        table.remove(&flood);
    }
}

/// Sends `flows` datagrams from a-pod1 to the hub target, each from a new
/// socket (a new source port): each a new flow through b's masquerade.
fn flood(flows: usize) {
    netns::run_in(&A.pod(1), || {
        for i in 0..flows {
            let port = FLOOD_PORTS.start + (i % FLOOD_PORTS.len()) as u16;
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
            // A full socket buffer only loses a datagram of the flood.
            let _ = socket.send_to(b"flood", (HUB_TARGET, port));
        }
    })
    .unwrap();
}

/// a's TCP connection to c-pod1 through the hub, echoed by c-pod1.
fn echoed_connection() -> TcpStream {
    let port = next_port();
    let listener = netns::run_in(&C.pod(1), || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
    })
    .unwrap()
    .unwrap();
    thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let mut buf = [0; 64];
        while let Ok(n @ 1..) = stream.read(&mut buf) {
            if stream.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let addr = SocketAddr::from((HUB_TARGET, port));
    let stream = netns::run_in(&A.pod(1), || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(2))
    })
    .unwrap()
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream
}

fn echo(stream: &mut TcpStream, text: &str) -> String {
    stream.write_all(text.as_bytes()).unwrap();
    let mut buf = vec![0; text.len()];
    stream.read_exact(&mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

/// b-gw's count of a's new flows refused for want of room in a's share.
fn a_refused() -> f64 {
    let labels = [
        ("table", "conntrack"),
        ("owner", A_ID),
        ("reason", "share_full"),
    ];
    lab::metric_sum(&B.gw(), "isthmus_flow_table_refusals_total", &labels).unwrap_or(0.0)
}

/// Log lines of b-gw's collector about a's refusals.
fn refusal_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("new flows refused for want of room") && l.contains(A_ID))
        .count()
}

#[test]
fn one_peers_flood_fills_only_its_share_of_a_default_conntrack() {
    require_lab();
    let _cleanup = FloodCleanup;
    let mut answered = echoed_connection();
    assert_eq!(echo(&mut answered, "before"), "before");
    let log = lab::log_file(&B.gw());
    let lines_before = refusal_lines(&std::fs::read_to_string(&log).unwrap_or_default());
    let refused_before = a_refused();
    let started = Instant::now();

    flood(FLOOD_FLOWS);
    eventually(
        Duration::from_secs(10),
        "b-gw refuses a's flows past its share",
        || a_refused() > refused_before,
    );
    let share = lab::metric_sum(
        &B.gw(),
        "isthmus_flow_table_entries",
        &[("table", "conntrack"), ("owner", A_ID)],
    )
    .unwrap();
    // Two entries a flow; a few flows of other CPUs may pass the last check.
    assert!(share <= 2.0 * 29_491.0 + 16.0, "a holds {share} entries");

    // b-gw's own flows find the room kept for it.
    let b_to_a = PEERINGS
        .iter()
        .find(|p| p.local.name == "b" && p.remote.name == "a")
        .unwrap();
    let a_pod1_at_b = Ipv4Addr::from(
        u32::from(b_to_a.remote_views()[0].network()) | (u32::from(A.pod_addr(1)) & 0xff),
    );
    for proto in [Proto::Udp, Proto::Tcp] {
        probe::exchange(proto, &B.gw(), &A.pod(1), a_pod1_at_b)
            .unwrap_or_else(|e| panic!("b-gw's own {} flow: {e:#}", proto.as_str()));
    }
    // a's flow that c answered is never evicted for room.
    assert_eq!(echo(&mut answered, "during"), "during");
    // a's next connection gets room from a's oldest unanswered flows.
    let waited = eventually(
        Duration::from_secs(5),
        "a's next connection crosses the hub",
        || probe::exchange(Proto::Tcp, &A.pod(1), &C.pod(1), HUB_TARGET).is_ok(),
    );
    eprintln!("a's next connection after the flood: {waited:?}");

    // Logged once per --conntrack-gc-interval (10 s), not per packet, however
    // long the sweeps' wait has grown.
    let elapsed = started.elapsed().as_secs() as usize;
    let lines = refusal_lines(&std::fs::read_to_string(&log).unwrap_or_default()) - lines_before;
    assert!(
        lines <= elapsed / 10 + 2,
        "{lines} log lines about a's refusals in {elapsed} s"
    );
    eventually(Duration::from_secs(12), "b-gw logs a's refusals", || {
        refusal_lines(&std::fs::read_to_string(&log).unwrap_or_default()) > lines_before
    });
}

/// b-gw's agent run with a conntrack of [`SMALL_CONNTRACK`] entries, and
/// restored as the lab runs it on drop.
struct SmallConntrack(u32);

/// a's share of it: 10% kept for b-gw, the rest split between b's two
/// peers: 1,800 entries, 900 flows.
const SMALL_CONNTRACK: u32 = 4000;
const SMALL_SHARE_FLOWS: usize = 900;

impl SmallConntrack {
    fn start() -> Self {
        let gw = B.gw();
        lab::stop_agent(&gw).unwrap();
        lab::clean_up_agent(&gw).unwrap();
        let mut args = lab::agent_args(&gw).unwrap();
        args.push(format!("--conntrack-capacity={SMALL_CONNTRACK}"));
        let log = lab::log_file(&format!("{gw}-small-conntrack"));
        let pid = lab::spawn_agent(&gw, &args, &log).unwrap();
        lab::wait_ready_in(&gw, pid, &log).unwrap();
        Self(pid)
    }
}

impl Drop for SmallConntrack {
    fn drop(&mut self) {
        let gw = B.gw();
        let restored = lab::stop_pid(self.0)
            .and_then(|()| lab::clean_up_agent(&gw).map(drop))
            .and_then(|()| lab::start_agent(&gw))
            .and_then(|_| lab::wait_ready(&gw));
        if let Err(e) = restored {
            eprintln!("restoring {gw}'s agent: {e:#}");
        }
    }
}

/// A connection both sides closed stays in b-gw's conntrack for stray
/// packets (10 s), charged to a; once a's share is a quarter full, the
/// collector takes a's connections that are over, so that a client
/// opening connection after connection, far more than a's share within
/// the close timeout, is never held up for long.
#[test]
fn a_peers_connections_that_are_over_leave_room_in_its_share() {
    require_lab();
    const CONNECTIONS: usize = 3 * SMALL_SHARE_FLOWS;
    let _small = SmallConntrack::start();
    let evictions = || {
        let labels = [("table", "conntrack"), ("owner", A_ID)];
        lab::metric_sum(&B.gw(), "isthmus_flow_table_evictions_total", &labels).unwrap_or(0.0)
    };
    let evicted_before = evictions();
    let port = next_port();
    let listener = netns::run_in(&C.pod(1), || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
    })
    .unwrap()
    .unwrap();
    let server = thread::spawn(move || {
        for _ in 0..CONNECTIONS {
            let (mut stream, _) = listener.accept().unwrap();
            let mut byte = [0; 1];
            if stream.read_exact(&mut byte).is_ok() {
                let _ = stream.write_all(&byte);
                let _ = stream.read(&mut byte);
            }
        }
    });
    let target = SocketAddr::from((HUB_TARGET, port));
    let started = Instant::now();
    let slowest = netns::run_in(&A.pod(1), || {
        (0..CONNECTIONS)
            .map(|i| {
                let began = Instant::now();
                // A refused SYN is sent again after 1 s, and again 2 s later.
                let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(3))
                    .unwrap_or_else(|e| panic!("connection {} of {CONNECTIONS}: {e}", i + 1));
                stream
                    .set_read_timeout(Some(Duration::from_secs(3)))
                    .unwrap();
                stream.write_all(b"?").unwrap();
                let mut byte = [0; 1];
                stream.read_exact(&mut byte).unwrap();
                began.elapsed()
            })
            .max()
            .unwrap()
    })
    .unwrap();
    let took = started.elapsed();
    server.join().unwrap();
    eprintln!("{CONNECTIONS} connections in {took:?}, the slowest {slowest:?}");
    assert!(
        took < Duration::from_secs(10),
        "{CONNECTIONS} connections took {took:?}: past the close timeout, \
         a's share could have emptied by expiry alone"
    );
    let evicted = evictions() - evicted_before;
    assert!(
        evicted >= (CONNECTIONS - SMALL_SHARE_FLOWS) as f64,
        "b-gw evicted {evicted} of a's flows: its connections that were over \
         did not make room"
    );
}
