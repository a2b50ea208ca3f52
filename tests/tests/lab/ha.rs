//! Gateway high availability in the `--ha` lab: cluster a's two
//! gateways elect the active one, and traffic a-pod1 ↔ b-pod1 (a numbered
//! UDP stream and a TCP transfer) survives the active one's death, whether
//! its agent is killed or its node's links go down. The stream's longest
//! silence is the failover's gap; b's objects never change. A gateway's
//! agent restarted in place (no failover) keeps the gap under 200 ms, and
//! stops promptly even while it verifies its programs. An active gateway
//! cut off from the API server stands down before its standby acts.

use std::{
    collections::BTreeMap,
    fs,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use isthmus_lab::{
    cmd::ip,
    lab::{self, ha},
    stream::{TcpTransfer, UdpStream},
    topology::{B, reachability},
};
use isthmus_tests::require_lab;
use serde_json::{Value, json};

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

/// A numbered UDP stream and a TCP transfer a-pod1 → b-pod1, flowing.
pub(crate) struct Traffic {
    udp: UdpStream,
    tcp: TcpTransfer,
}

impl Traffic {
    pub(crate) fn start() -> Self {
        let row = &reachability()[0];
        let bind = B.pod_addr(1);
        let udp = UdpStream::start(&row.from, &row.answered_by, bind, row.target).unwrap();
        let tcp = TcpTransfer::start(&row.from, &row.answered_by, bind, row.target).unwrap();
        udp.wait_more(300, GIVE_UP)
            .expect("the stream flows before");
        Traffic { udp, tcp }
    }

    /// Waits for the stream to flow again.
    pub(crate) fn flows_again(&self) {
        self.udp
            .wait_more(500, GIVE_UP)
            .expect("the stream flows after");
    }

    /// Ends both and checks them: the stream's longest silence under
    /// `bound`, and every TCP byte delivered.
    pub(crate) fn check(self, event: &str, bound: Duration) {
        let stream = self.udp.finish().unwrap();
        let transfer = self.tcp.finish().unwrap();
        eprintln!("{event}: {stream:?}, {transfer:?}");
        assert!(
            stream.longest_gap < bound,
            "the stream was silent {:?} (bound {bound:?})",
            stream.longest_gap
        );
        assert_eq!(
            transfer.verified, transfer.sent,
            "the TCP transfer lost bytes"
        );
    }
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
    assert!(
        routes_in_use(&active),
        "the active gateway's routes are used"
    );
    assert!(!routes_in_use(standby), "the standby's routes are used");
    let traffic = Traffic::start();

    let _killed = kill(&active);
    isthmus_lab::wait::until(
        GIVE_UP,
        Duration::from_millis(20),
        "the standby takes a's endpoint",
        || ha::endpoint_holder().as_deref() == Some(standby),
    )
    .unwrap();
    traffic.flows_again();
    assert!(
        routes_in_use(standby),
        "the new active gateway's routes are used"
    );
    let sent_after = traffic.tcp.sent();
    isthmus_lab::wait::until(
        GIVE_UP,
        Duration::from_millis(20),
        "TCP writes again",
        || traffic.tcp.sent() > sent_after + (1 << 20),
    )
    .unwrap();
    traffic.check(&format!("failover {active} → {standby}"), MAX_GAP);
    assert_eq!(objects_of_b(), b_objects, "b's objects changed");
}

/// Whether `node` routes into the tunnel from main, after checking that
/// its table 153 holds a's views of its peers' networks, staged, whether
/// it is active or not.
fn routes_in_use(node: &str) -> bool {
    let table = ip(node, &["route", "show", "table", "153"]).unwrap();
    for view in ["10.0.0.0/24", "10.0.1.0/24"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(view) && l.contains("dev isthmus0")),
            "{node} has no route for {view} in table 153: {table}"
        );
    }
    ip(node, &["route", "show", "table", "main", "10.0.0.0/24"])
        .unwrap()
        .contains("dev isthmus0")
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
    let traffic = Traffic::start();
    lab::restart_agent(&gw).unwrap();
    traffic.flows_again();
    traffic.check(&format!("restart of {gw}"), MAX_RESTART_GAP);
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
    let started = Instant::now();
    let stopped = lab::stop_agent(&gw);
    let took = started.elapsed();
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();
    stopped.expect("the agent stops on SIGTERM");
    assert!(took < MAX_STOP, "the agent took {took:?} to stop");
}

/// The agents' default Lease, in the agents' namespace.
const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/isthmus-system/leases/isthmus-gateway";
/// The gauge that says a gateway acts as the active one.
const ACTIVE_GAUGE: &str = "isthmus_gateway_active";

/// An HTTP request to the lab's API server stand-in, made from a-lan:
/// the status code and the body.
fn api(method: &str, body: Option<&Value>) -> (u16, Value) {
    let url = format!("http://{}{LEASE_PATH}", ha::API_ADDR);
    let mut args = vec![
        "netns",
        "exec",
        "a-lan",
        "curl",
        "-s",
        "-m",
        "5",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ];
    let data = body.map(Value::to_string);
    if let Some(data) = &data {
        args.extend([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            data,
        ]);
    }
    args.push(&url);
    let out = isthmus_lab::cmd::run("ip", &args).expect("the API server answers");
    let (body, code) = out.trim_end().rsplit_once('\n').expect("a status code");
    (
        code.parse().expect("a numeric status"),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// The API server out of `node`'s reach until dropped: its packets to it
/// vanish, as behind a partition.
struct Partitioned(String);

impl Partitioned {
    fn from_api(node: &str) -> Self {
        let api = format!("{}/32", ha::API_ADDR.ip());
        ip(node, &["route", "add", "blackhole", &api]).expect("a blackhole route");
        Partitioned(node.to_owned())
    }
}

impl Drop for Partitioned {
    fn drop(&mut self) {
        let api = format!("{}/32", ha::API_ADDR.ip());
        let _ = ip(&self.0, &["route", "del", "blackhole", &api]);
    }
}

/// Samples both gateways' active gauges until stopped (or a bound), and
/// returns every pair read.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(f64, f64)>>,
}

impl Sampler {
    const BOUND: Duration = Duration::from_mins(1);

    fn start(first: &'static str, second: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut pairs = Vec::new();
            while !stopping.load(Ordering::Relaxed) && started.elapsed() < Self::BOUND {
                let a = lab::metric(first, ACTIVE_GAUGE).unwrap_or(0.0);
                let b = lab::metric(second, ACTIVE_GAUGE).unwrap_or(0.0);
                pairs.push((a, b));
            }
            pairs
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Vec<(f64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler")
    }
}

/// The active gateway behind a partition from the API server: it stands
/// down before the standby takes the Lease, a write it makes with the
/// `resourceVersion` it last saw is refused with a conflict, and once the
/// partition heals it stays a standby. At no sample do both act as active.
#[test]
fn a_partitioned_active_gateway_and_its_standby_never_both_act() {
    let _ha = Ha::on();
    let active = ha::endpoint_holder().expect("an active gateway");
    let [first, second] = ha::gateways();
    let (active, standby) = if active == first {
        (first, second)
    } else {
        (second, first)
    };
    let (code, lease) = api("GET", None);
    assert_eq!(code, 200, "the Lease: {lease}");
    assert_eq!(lease["spec"]["holderIdentity"], active);
    let sampler = Sampler::start(active, standby);

    let partition = Partitioned::from_api(active);
    isthmus_lab::wait::until(
        GIVE_UP,
        Duration::from_millis(20),
        "the standby acts",
        || lab::metric(standby, ACTIVE_GAUGE).unwrap_or(0.0) == 1.0,
    )
    .unwrap();
    // What the deposed holder would write, had its renewal been delayed
    // past the takeover: its own name, on the version it read.
    let mut stale = lease.clone();
    stale["spec"]["renewTime"] = json!("2026-01-01T00:00:00.000000Z");
    let (code, refusal) = api("PUT", Some(&stale));
    assert_eq!(code, 409, "a stale write is refused: {refusal}");
    drop(partition);

    // The standby renews a few times while the healed one watches.
    let renewals_after = |n: usize| {
        let mut seen = std::collections::BTreeSet::new();
        move || {
            let (_, now) = api("GET", None);
            seen.insert(now["metadata"]["resourceVersion"].to_string());
            seen.len() > n
        }
    };
    isthmus_lab::wait::until(
        GIVE_UP,
        Duration::from_millis(50),
        "the standby renews",
        renewals_after(5),
    )
    .unwrap();
    let pairs = sampler.finish();

    let (_, now) = api("GET", None);
    assert_eq!(
        now["spec"]["holderIdentity"], standby,
        "the Lease stays taken"
    );
    assert_eq!(
        lab::metric(active, ACTIVE_GAUGE).unwrap(),
        0.0,
        "the healed one stands by"
    );
    let both = pairs.iter().filter(|(a, b)| *a == 1.0 && *b == 1.0).count();
    eprintln!(
        "{} samples of both gauges; both active in {both}",
        pairs.len()
    );
    assert!(pairs.len() > 20, "too few samples: {}", pairs.len());
    assert_eq!(both, 0, "both gateways acted as active");
}
