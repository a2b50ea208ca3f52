//! Cross-cluster isolation in the lab, over TCP, UDP and ICMP:
//! - the `--segregation` lab's table: b's gateway segregates its peers, a
//!   reaches the pod offloaded from it on any port and the service
//!   exported to it on its port alone, c reaches nothing, b's own
//!   connections and the hub path go on, and b-gw counts each denial per
//!   peer;
//! - a change of the objects cuts a's new connections within 100 ms;
//! - the TunnelEndpoint annotation segregates one peer of an agent that
//!   does not.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use isthmus_common::{isolation::AllowKey, names};
use isthmus_lab::{
    lab::{self, segregation},
    probe::{self, Proto},
    topology::{A, B, C, Cluster, PEERINGS, Reach, reachability},
};
use isthmus_tests::{eventually, require_lab};

const GIVE_UP: Duration = Duration::from_secs(30);
/// How soon a change of the objects must reach b-gw's kernel.
const CUT_OFF: Duration = Duration::from_millis(100);

/// b segregating (the `--segregation` lab) until dropped, even when an
/// assertion fails, for the tests after.
pub(crate) struct Segregated;

impl Segregated {
    /// b-gw restarted segregating, its isolation objects written.
    pub(crate) fn on() -> Self {
        segregation::set(true).expect("b-gw restarted segregating");
        Segregated
    }
}

impl Drop for Segregated {
    fn drop(&mut self) {
        segregation::set(false).expect("b-gw restarted as before");
    }
}

/// Whether `proto` from `from` to `target` (on `port`, if given) is
/// answered by `server`, who sees the client as `seen_as`.
fn answered(
    proto: Proto,
    from: &str,
    server: &str,
    target: Ipv4Addr,
    port: Option<u16>,
    seen_as: Ipv4Addr,
) -> bool {
    exchange(proto, from, server, target, port)
        .is_ok_and(|seen| seen.client_as_seen_by_server == seen_as)
}

/// An exchange on `port`, or on a port no other probe uses.
fn exchange(
    proto: Proto,
    from: &str,
    server: &str,
    target: Ipv4Addr,
    port: Option<u16>,
) -> anyhow::Result<probe::Seen> {
    let port = port.unwrap_or_else(probe::next_port);
    probe::exchange_on(proto, from, server, target, port)
}

fn row_answered(row: &Reach, proto: Proto) -> bool {
    answered(
        proto,
        &row.from,
        &row.answered_by,
        row.target,
        None,
        row.client_seen_as,
    )
}

/// b-gw's count of `peer`'s packets denied as not allowed.
fn denied(peer: &Cluster) -> f64 {
    lab::metric_sum(
        &B.gw(),
        "isthmus_peer_denied_packets_total",
        &[
            ("cluster_id", peer.cluster_id().as_str()),
            ("reason", "not_allowed"),
        ],
    )
    .unwrap_or(0.0)
}

/// Asserts that `proto` from `peer`'s pod `from` to b's pod `server` (at
/// `target`, on `port` if given) gets no answer, and that b-gw counted it.
fn assert_refused(
    proto: Proto,
    peer: &Cluster,
    from: &str,
    server: &str,
    target: Ipv4Addr,
    port: Option<u16>,
) {
    let before = denied(peer);
    let seen = exchange(proto, from, server, target, port);
    assert!(
        seen.is_err(),
        "{proto:?} from {from} to {target}:{port:?} was answered: {seen:?}"
    );
    assert!(
        denied(peer) > before,
        "{proto:?} from {from} to {target}:{port:?}: b-gw counted no denial for {}",
        peer.name
    );
}

#[test]
fn the_segregation_labs_table_holds() {
    require_lab();
    let rows = reachability();
    let (a_to_b_pod1, a_to_b_pod2, b_to_a, hub) = (&rows[0], &rows[1], &rows[2], &rows[4]);
    assert_eq!(
        (a_to_b_pod1.row, a_to_b_pod2.row, b_to_a.row, hub.row),
        (1, 2, 3, 5)
    );
    let _segregated = Segregated::on();
    let service = Some(segregation::SERVICE_PORT);
    // a-pod1 to b-pod1's service: answered on TCP, its protocol, only.
    assert!(answered(
        Proto::Tcp,
        &a_to_b_pod1.from,
        &a_to_b_pod1.answered_by,
        a_to_b_pod1.target,
        service,
        a_to_b_pod1.client_seen_as
    ));
    let (a_pod1, b_pod1) = (&a_to_b_pod1.from, &a_to_b_pod1.answered_by);
    assert_refused(Proto::Udp, &A, a_pod1, b_pod1, a_to_b_pod1.target, service);
    assert_refused(Proto::Icmp, &A, a_pod1, b_pod1, a_to_b_pod1.target, None);
    // Another port of b-pod1: refused.
    for proto in [Proto::Tcp, Proto::Udp] {
        let other = Some(segregation::SERVICE_PORT + 2);
        assert_refused(proto, &A, a_pod1, b_pod1, a_to_b_pod1.target, other);
    }
    // c reaches b-pod1 as 10.244.0.5, and was offloaded nothing.
    let c_view_of_b_pod1 = B.pod_addr(1);
    for proto in Proto::ALL {
        let port = (proto != Proto::Icmp).then_some(segregation::SERVICE_PORT);
        assert_refused(proto, &C, &C.pod(1), b_pod1, c_view_of_b_pod1, port);
    }
    for proto in Proto::ALL {
        // b-pod2, offloaded from a: any port.
        assert!(
            row_answered(a_to_b_pod2, proto),
            "{proto:?}: a-pod2 to b-pod2"
        );
        // b opens to a: the replies pass.
        assert!(row_answered(b_to_a, proto), "{proto:?}: b-pod1 to a-pod1");
        // a to c through b's NatMapping.
        assert!(
            row_answered(hub, proto),
            "{proto:?}: a-pod1 to c-pod1 through b"
        );
    }
}

/// Every key of b-gw's allowed table for `addr`.
fn allowed(addr: Ipv4Addr) -> Vec<AllowKey> {
    let table = lab::pinned_hash::<AllowKey, u8>(&lab::bpffs(&B.gw()), names::MAP_ALLOWED)
        .expect("b-gw's allowed table");
    table
        .keys()
        .filter_map(Result::ok)
        .filter(|key| Ipv4Addr::from(key.addr) == addr)
        .collect()
}

/// Asserts that `change`, timed from before its write (the file's trip is
/// part of the change's), empties b-gw's allowed table of `addr` within
/// [`CUT_OFF`].
fn cut_off(change: &str, addr: Ipv4Addr, write: impl FnOnce() -> anyhow::Result<()>) {
    let start = Instant::now();
    write().unwrap();
    eventually(
        GIVE_UP,
        &format!("{addr} leaving b-gw's allowed table"),
        || allowed(addr).is_empty(),
    );
    let took = start.elapsed();
    println!("{change} reached b-gw's kernel in {took:?}");
    assert!(took < CUT_OFF, "{change} took {took:?} to reach the kernel");
}

#[test]
fn a_pod_no_longer_offloaded_or_a_namespace_no_longer_offloaded_is_cut_within_100_ms() {
    require_lab();
    let rows = reachability();
    let (a_to_b_pod1, a_to_b_pod2) = (&rows[0], &rows[1]);
    let _segregated = Segregated::on();
    let service = Some(segregation::SERVICE_PORT);
    assert!(row_answered(a_to_b_pod2, Proto::Tcp));

    cut_off("the label's removal", B.pod_addr(2), || {
        segregation::write_pod(false)
    });
    let (from, to) = (&a_to_b_pod2.from, &a_to_b_pod2.answered_by);
    assert_refused(Proto::Tcp, &A, from, to, a_to_b_pod2.target, None);
    segregation::write_pod(true).unwrap();
    eventually(GIVE_UP, "a reaching b-pod2 again", || {
        row_answered(a_to_b_pod2, Proto::Tcp)
    });

    let a_to_service = || {
        answered(
            Proto::Tcp,
            &a_to_b_pod1.from,
            &a_to_b_pod1.answered_by,
            a_to_b_pod1.target,
            service,
            a_to_b_pod1.client_seen_as,
        )
    };
    assert!(a_to_service());
    cut_off("the namespace's offloading", B.pod_addr(1), || {
        segregation::write_offloading(false)
    });
    let (from, to) = (&a_to_b_pod1.from, &a_to_b_pod1.answered_by);
    assert_refused(Proto::Tcp, &A, from, to, a_to_b_pod1.target, service);
}

/// Writes b's TunnelEndpoint for a, with or without the annotation that
/// segregates a, on every node of b.
fn annotate_a(on: bool) {
    let peering = PEERINGS
        .iter()
        .find(|p| p.local.name == B.name && p.remote.name == A.name)
        .expect("b peers with a");
    let key = lab::public_key(&A.gw()).unwrap();
    let mut yaml = peering.tunnel_endpoint_yaml(Some(&key));
    if on {
        let annotation = format!(
            "  annotations:\n    isthmus.io/security-mode: {}\n",
            segregation::settings::MODE
        );
        yaml = yaml.replacen("metadata:\n", &format!("metadata:\n{annotation}"), 1);
    }
    for (node, _) in B.nodes() {
        lab::write_object(&node, &format!("peer-{}.yaml", A.name), &yaml).unwrap();
    }
}

/// Lifts the annotation even when an assertion fails.
struct Annotated;

impl Drop for Annotated {
    fn drop(&mut self) {
        annotate_a(false);
    }
}

#[test]
fn the_annotation_segregates_one_peer_of_an_agent_that_does_not() {
    require_lab();
    let rows = reachability();
    let (a_to_b, b_to_a, c_from_b) = (&rows[0], &rows[2], &rows[3]);
    let _annotated = Annotated;
    annotate_a(true);
    eventually(GIVE_UP, "b-gw refusing a's new connections", || {
        !row_answered(a_to_b, Proto::Udp)
    });
    // Nothing is offloaded from a or exported to it in this lab.
    for proto in Proto::ALL {
        assert_refused(
            proto,
            &A,
            &a_to_b.from,
            &a_to_b.answered_by,
            a_to_b.target,
            None,
        );
        assert!(
            row_answered(b_to_a, proto),
            "{proto:?}: b-pod1 opens to a-pod1"
        );
        assert!(
            row_answered(c_from_b, proto),
            "{proto:?}: b and c, not segregated"
        );
    }
    annotate_a(false);
    eventually(GIVE_UP, "a reaching b again", || {
        row_answered(a_to_b, Proto::Tcp)
    });
}

/// b-gw segregating, with room for 16 flows towards segregated peers (8
/// each for a and c), until dropped; then as the lab runs it.
struct SmallPeerFlowTable {
    pid: u32,
}

impl SmallPeerFlowTable {
    fn start() -> Self {
        segregation::set(true).expect("b-gw restarted segregating");
        let gw = B.gw();
        lab::stop_agent(&gw).unwrap();
        let mut args = lab::agent_args(&gw).unwrap();
        args.push("--peer-flow-capacity=16".into());
        let log = lab::log_file(&gw);
        let pid = lab::spawn_agent(&gw, &args, &log).unwrap();
        lab::wait_ready_in(&gw, pid, &log).unwrap();
        Self { pid }
    }
}

impl Drop for SmallPeerFlowTable {
    fn drop(&mut self) {
        let _ = lab::stop_pid(self.pid);
        segregation::set(false).expect("b-gw restarted as before");
    }
}

/// A segregated peer that holds connections open to the service exported
/// to it fills only its own share of b-gw's table of flows towards
/// segregated peers: past it, b's side of a's next connection is dropped
/// and counted against a, while b's connections towards c, the other
/// segregated peer, still get room.
#[test]
fn a_segregated_peers_open_connections_fill_only_its_share() {
    require_lab();
    let _small = SmallPeerFlowTable::start();
    let rows = reachability();
    let (a_to_b_pod1, b_to_c) = (&rows[0], &rows[3]);
    assert_eq!((a_to_b_pod1.row, b_to_c.row), (1, 4));
    let port = segregation::SERVICE_PORT;
    // b-pod1's service answers each connection with a byte, and holds it,
    // for at most 20 s.
    let listener = isthmus_lab::netns::run_in(&B.pod(1), || {
        std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
    })
    .unwrap()
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let server = std::thread::spawn(move || {
        let (mut held, until) = (Vec::new(), Instant::now() + Duration::from_secs(20));
        while held.len() < 12 && Instant::now() < until {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = std::io::Write::write_all(&mut stream, b"!");
                    held.push(stream);
                }
                // Polling paces the accept loop; it waits for no condition.
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        held
    });
    let target = std::net::SocketAddr::from((a_to_b_pod1.target, port));
    // Held open until the end of the test, as an attacker would.
    let connections: Vec<Option<std::net::TcpStream>> = (0..12)
        .map(|_| {
            isthmus_lab::netns::run_in(&A.pod(1), || {
                let mut stream =
                    std::net::TcpStream::connect_timeout(&target, Duration::from_secs(1)).ok()?;
                stream
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .ok()?;
                let mut byte = [0u8];
                std::io::Read::read_exact(&mut stream, &mut byte).ok()?;
                Some(stream)
            })
            .unwrap()
        })
        .collect();
    let answered: Vec<bool> = connections.iter().map(Option::is_some).collect();
    let served = answered.iter().filter(|a| **a).count();
    assert!(
        (1..=9).contains(&served),
        "a's connections b answered: {served} of 12 with room for 8: {answered:?}"
    );
    let refused = lab::metric_sum(
        &B.gw(),
        "isthmus_flow_table_refusals_total",
        &[
            ("table", "peer_flows"),
            ("owner", A.cluster_id().as_str()),
            ("reason", "share_full"),
        ],
    )
    .unwrap();
    assert!(refused > 0.0, "b-gw counted no refusal against a");
    // c's share is its own: b-pod1's connections to c-pod1 still cross.
    for proto in [Proto::Tcp, Proto::Udp] {
        assert!(row_answered(b_to_c, proto), "{proto:?}: b-pod1 to c-pod1");
    }
    drop(connections);
    let _ = server.join();
}
