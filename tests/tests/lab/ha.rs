//! Gateway high availability (issue 18) in the `--ha` lab: cluster a's two
//! gateways elect the active one, and traffic a-pod1 ↔ b-pod1 (a numbered
//! UDP stream and a TCP transfer) survives the active one's death, whether
//! its agent is killed or its node's links go down. The stream's longest
//! silence is the failover's gap; b's objects never change. A gateway's
//! agent restarted in place (no failover) keeps the gap under 200 ms, and
//! stops promptly even while it verifies its programs.

use std::{collections::BTreeMap, fs, path::PathBuf, time::Duration};

use isthmus_tests::require_lab;
use xtask::{
    cmd::ip,
    lab::{self, ha},
    stream::{TcpTransfer, UdpStream},
    topology::{B, reachability},
};

/// The bound on a failover's gap.
const MAX_GAP: Duration = Duration::from_secs(2);
const GIVE_UP: Duration = Duration::from_secs(15);

/// Cluster a with two gateways until dropped, even when an assertion fails.
struct Ha;

impl Ha {
    fn on() -> Self {
        require_lab();
        ha::set(true).expect("a's second gateway up");
        Ha
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        ha::set(false).expect("cluster a back on one gateway");
    }
}

/// A node's links, down until dropped.
struct LinksDown(String);

const LINKS: [&str; 2] = ["lan0", "wan0"];

impl LinksDown {
    fn take(node: &str) -> Self {
        for link in LINKS {
            ip(node, &["link", "set", link, "down"]).expect("link down");
        }
        LinksDown(node.to_owned())
    }
}

impl Drop for LinksDown {
    fn drop(&mut self) {
        for link in LINKS {
            let _ = ip(&self.0, &["link", "set", link, "up"]);
        }
    }
}

/// Every object file of cluster b's gateway, by name.
fn objects_of_b() -> BTreeMap<PathBuf, Vec<u8>> {
    fs::read_dir(lab::object_dir(&B.gw()))
        .expect("b's objects")
        .map(|e| {
            let path = e.expect("an entry").path();
            let bytes = fs::read(&path).expect("an object file");
            (path, bytes)
        })
        .collect()
}

/// Kills the active gateway with `kill` during a UDP stream and a TCP
/// transfer a-pod1 → b-pod1, and checks the failover: the standby takes
/// a's endpoint address, the stream's gap is under 2 s, every TCP byte
/// arrives, and b's objects are untouched.
fn fails_over<T>(kill: impl FnOnce(&str) -> T) {
    let _ha = Ha::on();
    let active = ha::endpoint_holder().expect("an active gateway");
    let standby = ha::gateways()
        .into_iter()
        .find(|g| *g != active)
        .expect("a standby gateway");
    let b_objects = objects_of_b();
    let row = &reachability()[0];
    let bind = B.pod_addr(1);
    let udp = UdpStream::start(&row.from, &row.answered_by, bind, row.target).unwrap();
    let tcp = TcpTransfer::start(&row.from, &row.answered_by, bind, row.target).unwrap();
    udp.wait_more(300, GIVE_UP)
        .expect("the stream flows before");

    let _killed = kill(&active);
    xtask::wait::until(
        GIVE_UP,
        Duration::from_millis(20),
        "the standby takes a's endpoint",
        || ha::endpoint_holder().as_deref() == Some(standby),
    )
    .unwrap();
    udp.wait_more(500, GIVE_UP).expect("the stream flows after");
    let sent_after = tcp.sent();
    xtask::wait::until(
        GIVE_UP,
        Duration::from_millis(20),
        "TCP writes again",
        || tcp.sent() > sent_after + (1 << 20),
    )
    .unwrap();

    let stream = udp.finish().unwrap();
    let transfer = tcp.finish().unwrap();
    eprintln!("failover {active} → {standby}: {stream:?}, {transfer:?}");
    assert!(
        stream.longest_gap < MAX_GAP,
        "the stream was silent {:?} (bound {MAX_GAP:?})",
        stream.longest_gap
    );
    assert_eq!(
        transfer.verified, transfer.sent,
        "the TCP transfer lost bytes"
    );
    assert_eq!(objects_of_b(), b_objects, "b's objects changed");
}

#[test]
fn killing_the_active_gateways_agent_fails_over_within_two_seconds() {
    fails_over(|active| {
        let pid = lab::agent_pid(active).expect("the active agent runs");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL");
    });
}

#[test]
fn the_active_gateway_node_dying_fails_over_within_two_seconds() {
    fails_over(LinksDown::take);
}

/// The bound on the gap of a restart in place.
const MAX_RESTART_GAP: Duration = Duration::from_millis(200);

#[test]
fn restarting_the_gateway_agent_in_place_keeps_the_gap_under_200_ms() {
    require_lab();
    let gw = reachability()[0].clusters_crossed()[0].gw();
    let row = &reachability()[0];
    let bind = B.pod_addr(1);
    let udp = UdpStream::start(&row.from, &row.answered_by, bind, row.target).unwrap();
    let tcp = TcpTransfer::start(&row.from, &row.answered_by, bind, row.target).unwrap();
    udp.wait_more(300, GIVE_UP)
        .expect("the stream flows before");
    lab::restart_agent(&gw).unwrap();
    udp.wait_more(500, GIVE_UP).expect("the stream flows after");
    let stream = udp.finish().unwrap();
    let transfer = tcp.finish().unwrap();
    eprintln!("restart of {gw}: {stream:?}, {transfer:?}");
    assert!(
        stream.longest_gap < MAX_RESTART_GAP,
        "the stream was silent {:?} (bound {MAX_RESTART_GAP:?})",
        stream.longest_gap
    );
    assert_eq!(
        transfer.verified, transfer.sent,
        "the TCP transfer lost bytes"
    );
}

/// How long a stop may take: well under the 10 s after which the lab
/// SIGKILLs an agent. A stop signal that interrupts the verifier once made
/// aya load the programs again with a verifier log, for minutes.
const MAX_STOP: Duration = Duration::from_secs(5);

#[test]
fn an_agent_stopped_while_it_verifies_its_programs_exits_promptly() {
    require_lab();
    let gw = reachability()[0].clusters_crossed()[0].gw();
    // Ready after its first pass, when it replaces the NAT programs its
    // predecessor left attached: the stop arrives during the verification.
    lab::restart_agent(&gw).unwrap();
    let started = std::time::Instant::now();
    let stopped = lab::stop_agent(&gw);
    let took = started.elapsed();
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();
    stopped.expect("the agent stops on SIGTERM");
    assert!(took < MAX_STOP, "the agent took {took:?} to stop");
}
