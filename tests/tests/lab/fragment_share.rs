//! Fair share of b-gw's fragment table, at the budget the DaemonSet
//! ships: a pod of a floods the hub path through b with fragmented
//! datagrams. The first fragments of a's past its budget per second are
//! not remembered, so only a's datagrams lose their later fragments, and
//! the refusals are counted and logged against a. Meanwhile c's
//! fragmented replies through b still cross whole, and once the flood
//! stops, a's own datagrams cross whole again.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::Duration,
};

use isthmus_lab::{
    lab, netns,
    probe::next_port,
    topology::{A, B, C},
};
use isthmus_tests::{
    eventually,
    packet::{Datagram, L4, with_id},
    require_lab,
};
use socket2::{Domain, Protocol, Socket, Type};

/// How a reaches c-pod1 through b (docs/design.md#expected-reachability, row 5).
const HUB_TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 45);
/// The flood's datagrams: ten times a's budget per second at b-gw (8,192
/// entries, 10% kept for the gateway, the rest split between b's two
/// peers: 3,686), each in two fragments.
const FLOOD_DATAGRAMS: u16 = 36_000;
/// The flood's UDP port, which nothing listens on.
const FLOOD_PORT: u16 = 9;
/// What a reply of c-pod1 carries: three fragments on the way.
const REPLY_LEN: usize = 4000;
const GIVE_UP: Duration = Duration::from_secs(10);
/// How often the agents log refusals: their `--conntrack-gc-interval`.
const LOG_PERIOD: Duration = Duration::from_secs(10);

/// c-pod1 gives up on an incomplete datagram after a second, not 30, for
/// as long as it lives: the flood's datagrams whose later fragments b
/// dropped would otherwise hold all of c-pod1's reassembly memory, and
/// c-pod1's kernel would take no new fragmented datagram until they
/// expire, whatever b does.
struct ShortReassembly {
    before: String,
}

const REASSEMBLY_TIME: &str = "/proc/sys/net/ipv4/ipfrag_time";

impl ShortReassembly {
    fn set() -> Self {
        let before = netns::run_in(&C.pod(1), || {
            let before = std::fs::read_to_string(REASSEMBLY_TIME)?;
            std::fs::write(REASSEMBLY_TIME, "1")?;
            std::io::Result::Ok(before)
        })
        .unwrap()
        .expect("c-pod1's reassembly time");
        Self { before }
    }
}

impl Drop for ShortReassembly {
    fn drop(&mut self) {
        let _ = netns::run_in(&C.pod(1), || std::fs::write(REASSEMBLY_TIME, &self.before));
    }
}

/// b-gw's count of first fragments of `owner`'s refused for want of
/// budget.
fn refused(owner: &str) -> f64 {
    let labels = [
        ("table", "fragments"),
        ("owner", owner),
        ("reason", "share_full"),
    ];
    lab::metric_sum(&B.gw(), "isthmus_flow_table_refusals_total", &labels).unwrap_or(0.0)
}

/// Sends the flood from a-pod1, through a raw socket: each datagram its
/// own identification, each in two fragments.
fn flood() {
    let datagram = Datagram::new(
        A.pod_addr(1).octets(),
        HUB_TARGET.octets(),
        L4::Udp {
            sport: FLOOD_PORT,
            dport: FLOOD_PORT,
            payload: vec![0; 24],
            zero_csum: false,
        },
    );
    let to = SocketAddrV4::new(HUB_TARGET, 0).into();
    netns::run_in(&A.pod(1), || {
        let raw = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )
        .expect("a raw socket in a-pod1");
        for id in 1..=FLOOD_DATAGRAMS {
            for (from, until) in [(0, 16), (16, 32)] {
                // A full queue only loses a packet of the flood.
                let _ = raw.send_to(&with_id(datagram.fragment(from, until), id), &to);
            }
        }
    })
    .unwrap();
}

/// A UDP socket in namespace `ns` on `port` (0: any), whose reads wait at
/// most `wait`.
fn udp_socket(ns: &str, port: u16, wait: Duration) -> UdpSocket {
    let socket = netns::run_in(ns, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
        .unwrap()
        .unwrap();
    socket.set_read_timeout(Some(wait)).unwrap();
    socket
}

/// c-pod1 answers every datagram with [`REPLY_LEN`] bytes, until `done`.
fn replying_server(port: u16, done: &'static AtomicBool) -> thread::JoinHandle<()> {
    let server = udp_socket(&C.pod(1), port, Duration::from_millis(200));
    thread::spawn(move || {
        let reply = reply_payload();
        let mut buf = [0u8; 64];
        while !done.load(Ordering::Relaxed) {
            if let Ok((_, from)) = server.recv_from(&mut buf) {
                let _ = server.send_to(&reply, from);
            }
        }
    })
}

fn reply_payload() -> Vec<u8> {
    (0..REPLY_LEN).map(|i| (i * 13) as u8).collect()
}

/// Asks c-pod1 from a-pod1 for a reply, and whether it came whole.
fn reply_crosses(client: &UdpSocket, port: u16) -> bool {
    if client.send_to(b"ask", (HUB_TARGET, port)).is_err() {
        return false;
    }
    let mut buf = vec![0u8; 2 * REPLY_LEN];
    matches!(client.recv_from(&mut buf), Ok((n, _)) if buf[..n] == reply_payload()[..])
}

/// Sends a datagram of [`REPLY_LEN`] bytes from a-pod1 to c-pod1 through
/// the hub, and whether c-pod1 got it whole.
fn datagram_crosses(client: &UdpSocket, server: &UdpSocket, port: u16) -> bool {
    let payload = reply_payload();
    if client.send_to(&payload, (HUB_TARGET, port)).is_err() {
        return false;
    }
    let mut buf = vec![0u8; 2 * REPLY_LEN];
    matches!(server.recv_from(&mut buf), Ok((n, from)) if buf[..n] == payload[..] && matches!(from, SocketAddr::V4(from) if B.pods().contains(from.ip())))
}

#[test]
fn one_peers_fragment_flood_costs_only_its_own_datagrams() {
    require_lab();
    let _reassembly = ShortReassembly::set();
    static DONE: AtomicBool = AtomicBool::new(false);
    let log = lab::log_file(&B.gw());
    let logged_before = std::fs::read_to_string(&log).unwrap_or_default().len();
    let (a_before, c_before) = (refused("cluster-a"), refused("cluster-c"));
    let port = next_port();
    let server = replying_server(port, &DONE);
    let client = udp_socket(&A.pod(1), 0, Duration::from_millis(500));
    assert!(
        (0..5).any(|_| reply_crosses(&client, port)),
        "c-pod1's reply does not cross whole before the flood"
    );

    let flooding = thread::spawn(flood);
    // c's replies are charged to c: some cross whole while a floods (the
    // flood may take a request or a reply on its way, not every one).
    let mut whole_during = 0;
    loop {
        whole_during += usize::from(reply_crosses(&client, port));
        if flooding.is_finished() {
            break;
        }
    }
    flooding.join().unwrap();
    DONE.store(true, Ordering::Relaxed);
    server.join().unwrap();

    eventually(GIVE_UP, "b-gw counts a's first fragments refused", || {
        refused("cluster-a") > a_before
    });
    assert_eq!(refused("cluster-c"), c_before, "c's fragments were refused");
    assert!(
        whole_during > 0,
        "no reply of c's crossed whole during a's flood"
    );
    // The agent logs refusals once per `--conntrack-gc-interval` (10 s):
    // a whole period may pass before the line, on top of the usual wait.
    eventually(LOG_PERIOD + GIVE_UP, "b-gw logs a's refusals", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text[logged_before..]
            .lines()
            .any(|l| l.contains("first fragments not remembered") && l.contains("cluster-a"))
    });
    // The budget is per second: a's next datagrams cross whole again.
    let port = next_port();
    let server = udp_socket(&C.pod(1), port, Duration::from_millis(500));
    eventually(GIVE_UP, "a's datagram crosses the hub whole again", || {
        datagram_crosses(&client, &server, port)
    });
}
