//! The lab's `--ha` variant: cluster a gets a second gateway
//! node, and its two gateways elect the active one through a Lease.
//!
//! - `a-gw2` joins a's LAN (172.16.1.3) and the WAN (203.0.113.11), with a
//!   pod `a-pod3` (10.244.0.134). a-gw's own uplink address becomes
//!   203.0.113.10.
//! - a's three agents run `--source kube` against the API server stand-in
//!   ([`crate::fake_api`]), served from a-lan at [`API_ADDR`]. It holds what
//!   a's object directory held, the three Nodes, the gateways' pods and the
//!   WireGuard key Secret both gateways share; its Leases refuse stale
//!   writes with `409 Conflict`, as the real server's do.
//! - a's endpoint address, 203.0.113.1, floats: the lab moves it to the
//!   node of the pod labelled `net.liqo.io/gateway=active` and announces it
//!   with a gratuitous ARP, as a load balancer following that label would.
//!   The agents never touch it.
//!
//! The stand-in and the balancer live in a background process of their own
//! (`cargo xtask lab-control`), which `set(false)` and `lab down` end.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    path::PathBuf,
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{Value, json};

pub mod settings;

use super::{
    agents::{log_tail, restart_agent_in, start_agent_in, stop_agent, wait_ready},
    keys::key_file,
    network::{add_ns, route_pod_halves, veth, wire_pod},
    node_objects::NODES_FILE,
    paths::{bpffs, hosts_file, log_file, object_dir, state, xtask_binary},
    process::{spawn_detached, stop_xtask_process},
    setup::Setup,
};
use crate::{
    cmd::{ip, run, sysctl},
    fake_api::FakeApi,
    netns,
    topology::{
        AGENT_NS, GATEWAY_LABEL, GW1_WAN, GW2, GW2_LAN, GW2_WAN, POD3, POD3_ADDR, WAN_NS, node,
    },
};
use settings::{CLUSTER, kubeconfig, pod_name};

/// Where the API server stand-in listens, on a-lan's bridge.
pub const API_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(172, 16, 1, 254), 6443);
/// The label value of the active gateway's pod.
pub const ACTIVE: &str = "active";
/// The hidden xtask command that runs the stand-in and the balancer.
pub const CONTROL_COMMAND: &str = "lab-control";
/// How long the control process may take to serve.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// a's gateway nodes, with their LAN and own uplink addresses, and the
/// PodCIDR each Node object gives (the pod on each, alone in a /31).
const GATEWAYS: [(&str, Ipv4Addr, Ipv4Addr, &str); 2] = [
    (
        "a-gw",
        Ipv4Addr::new(172, 16, 1, 1),
        GW1_WAN,
        "10.244.0.132/31",
    ),
    (GW2, GW2_LAN, GW2_WAN, "10.244.0.134/31"),
];

fn pid_file() -> PathBuf {
    state("ha-control.pid")
}

/// Where the balancer writes the node holding a's endpoint address.
fn holder_file() -> PathBuf {
    state("ha-endpoint")
}

/// The gateway nodes of cluster a.
pub fn gateways() -> [&'static str; 2] {
    GATEWAYS.map(|(node, ..)| node)
}

/// The node that holds a's endpoint address now, as the balancer last
/// placed it.
pub fn endpoint_holder() -> Option<String> {
    fs::read_to_string(holder_file()).ok()
}

/// Turns the second gateway on (or off), restarting a's agents on the
/// kube source (or back on their directories); returns once every agent is
/// ready and the endpoint address sits on the active gateway. A failure to
/// turn it on turns it off again, so that no half-built cluster remains.
pub fn set(on: bool) -> Result<()> {
    match (on, Setup::current()?.ha) {
        (true, true) | (false, false) => Ok(()),
        (true, false) => turn_on().inspect_err(|_| {
            if let Err(e) = turn_off() {
                eprintln!("lab: taking the half-built second gateway down: {e:#}");
            }
        }),
        (false, true) => turn_off(),
    }
}

fn turn_on() -> Result<()> {
    build_nodes()?;
    let setup = Setup::change(|setup| setup.ha = true)?;
    start_control()?;
    restart_agent_in(&CLUSTER.gw(), &setup)?;
    restart_agent_in(&CLUSTER.node(), &setup)?;
    start_agent_in(GW2, &setup)?;
    wait_ready(GW2)?;
    crate::wait::until(
        START_TIMEOUT,
        Duration::from_millis(20),
        "a's endpoint address placed on the active gateway",
        || endpoint_holder().is_some(),
    )
    .map(drop)
}

fn turn_off() -> Result<()> {
    stop_agent(GW2)?;
    stop_control()?;
    let setup = Setup::change(|setup| setup.ha = false)?;
    remove_nodes()?;
    restart_agent_in(&CLUSTER.gw(), &setup)?;
    restart_agent_in(&CLUSTER.node(), &setup)
}

/// a-gw2 and a-pod3, the floating endpoint address, and the routes the
/// CNI stand-in needs for pods on three nodes.
fn build_nodes() -> Result<()> {
    let (gw, node, lan) = (CLUSTER.gw(), CLUSTER.node(), CLUSTER.lan());
    add_ns(GW2)?;
    sysctl(GW2, "net.ipv4.ip_forward", "1")?;
    veth(GW2, "wan0", WAN_NS, GW2)?;
    ip(WAN_NS, &["link", "set", GW2, "master", "br0"])?;
    veth(GW2, "lan0", &lan, "gw2")?;
    ip(&lan, &["link", "set", "gw2", "master", "br0"])?;
    ip(
        GW2,
        &["addr", "add", &format!("{GW2_LAN}/24"), "dev", "lan0"],
    )?;
    // Own uplink addresses are /32s: only the floating /24 gives a node
    // the WAN's connected route, so whatever it sends there leaves from
    // 203.0.113.1, the address peers know.
    ip(&gw, &["addr", "flush", "dev", "wan0"])?;
    for (node, _, wan, _) in GATEWAYS {
        ip(node, &["addr", "add", &format!("{wan}/32"), "dev", "wan0"])?;
        let router = crate::topology::WAN_ROUTER;
        ip(
            node,
            &[
                "route", "replace", "default", "via", router, "dev", "wan0", "onlink",
            ],
        )?;
    }
    add_ns(POD3)?;
    wire_pod(POD3, GW2, "pod3", POD3_ADDR)?;
    let pod3 = format!("{POD3_ADDR}/32");
    for host in [&gw, &node] {
        ip(host, &["route", "add", &pod3, "via", &GW2_LAN.to_string()])?;
    }
    let lower = CLUSTER.pod_half(1).to_string();
    ip(
        GW2,
        &[
            "route",
            "add",
            &lower,
            "via",
            &CLUSTER.lan_node().to_string(),
        ],
    )?;
    let pod2 = format!("{}/32", CLUSTER.pod_addr(2));
    ip(
        GW2,
        &["route", "add", &pod2, "via", &CLUSTER.lan_gw().to_string()],
    )?;
    ip(
        &lan,
        &[
            "addr",
            "add",
            &format!("{}/24", API_ADDR.ip()),
            "dev",
            "br0",
        ],
    )?;
    // a-gw2 resolves a's peers' endpoint names as a-gw does.
    let hosts = hosts_file(GW2);
    fs::create_dir_all(hosts.parent().context("a directory")?)?;
    fs::copy(hosts_file(&gw), hosts)?;
    Ok(())
}

/// Undoes [`build_nodes`]: a-gw's uplink is 203.0.113.1 alone again.
fn remove_nodes() -> Result<()> {
    let (gw, node, lan) = (CLUSTER.gw(), CLUSTER.node(), CLUSTER.lan());
    for ns in [GW2, POD3] {
        if netns::exists(ns) {
            ip("", &["netns", "del", ns])?;
        }
    }
    let _ = fs::remove_dir_all(bpffs(GW2));
    let _ = fs::remove_dir_all(hosts_file(GW2).parent().context("a directory")?);
    let pod3 = format!("{POD3_ADDR}/32");
    for host in [&gw, &node] {
        let _ = ip(host, &["route", "del", &pod3]);
    }
    let _ = ip(
        &lan,
        &[
            "addr",
            "del",
            &format!("{}/24", API_ADDR.ip()),
            "dev",
            "br0",
        ],
    );
    ip(&gw, &["addr", "flush", "dev", "wan0"])?;
    ip(
        &gw,
        &[
            "addr",
            "add",
            &format!("{}/24", CLUSTER.wan_addr()),
            "dev",
            "wan0",
        ],
    )?;
    let router = crate::topology::WAN_ROUTER;
    ip(
        &gw,
        &["route", "replace", "default", "via", router, "dev", "wan0"],
    )?;
    // The node-death test took a-gw's LAN down, and its routes with it.
    route_pod_halves(CLUSTER)?;
    let _ = fs::remove_file(holder_file());
    Ok(())
}

/// Starts the control process in a session of its own and waits until
/// its API server answers.
fn start_control() -> Result<()> {
    let log = fs::File::create(log_file("ha-control"))?;
    let mut command = Command::new(xtask_binary()?);
    command.arg(CONTROL_COMMAND);
    let pid = spawn_detached(command, log).context("starting the lab's control process")?;
    fs::write(pid_file(), pid.to_string())?;
    let lan = CLUSTER.lan();
    crate::wait::until(
        START_TIMEOUT,
        Duration::from_millis(20),
        "the API server stand-in answers in a-lan",
        || {
            netns::run_in(&lan, || {
                TcpStream::connect_timeout(&SocketAddr::V4(API_ADDR), Duration::from_secs(1))
            })
            .is_ok_and(|c| c.is_ok())
        },
    )
    .with_context(|| format!("its log:\n{}", log_tail(&log_file("ha-control"))))?;
    Ok(())
}

/// Ends the control process, if it runs.
pub fn stop_control() -> Result<()> {
    stop_xtask_process(CONTROL_COMMAND, &pid_file())
}

/// The control process: serves a's objects and moves a's endpoint address
/// after the active label, until it is signalled.
pub fn serve() -> Result<()> {
    let listener = netns::run_in(&CLUSTER.lan(), || TcpListener::bind(API_ADDR))??;
    let api = FakeApi::start(listener)?;
    fs::write(kubeconfig(), api.kubeconfig())?;
    seed(&api)?;
    println!("lab-control: serving cluster a's objects on {API_ADDR}");
    let mut changes = api.changes();
    let mut holder = None;
    loop {
        follow_active_label(&api, &mut holder)?;
        changes.wait();
    }
}

/// Cluster a's objects, as its API server would hold them.
fn seed(api: &FakeApi) -> Result<()> {
    let dir = object_dir(&CLUSTER.gw());
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != NODES_FILE))
        .collect();
    files.sort();
    for file in files {
        let text = fs::read_to_string(&file)?;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let object = Value::deserialize(document)
                .with_context(|| format!("parsing {}", file.display()))?;
            if !object.is_null() {
                api.apply(object);
            }
        }
    }
    for object in nodes().into_iter().chain(gateway_pods()) {
        api.apply(object);
    }
    let key = fs::read_to_string(key_file(&CLUSTER.gw()))?;
    api.apply(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "isthmus-wireguard", "namespace": AGENT_NS},
        "stringData": {"privateKey": key.trim()},
    }));
    Ok(())
}

/// a's three Nodes: the gateways labelled, each with its PodCIDR.
fn nodes() -> Vec<Value> {
    let worker = CLUSTER.pod_half(1).to_string();
    let mut all = vec![node(
        &CLUSTER.node(),
        CLUSTER.lan_node(),
        Some(&worker),
        false,
    )];
    all.extend(
        GATEWAYS
            .iter()
            .map(|(name, lan, _, pods)| node(name, *lan, Some(pods), true)),
    );
    all
}

/// The gateway agents' pods, which the agents label active or standby.
fn gateway_pods() -> Vec<Value> {
    GATEWAYS
        .iter()
        .map(|(node, lan, ..)| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name(node), "namespace": AGENT_NS,
                             "labels": {"app.kubernetes.io/name": "isthmus-gateway"}},
                "spec": {"nodeName": node, "hostNetwork": true},
                "status": {"phase": "Running", "podIP": lan.to_string()},
            })
        })
        .collect()
}

/// Moves a's endpoint address to the node whose gateway pod alone is
/// labelled active. While none or several are (a relabelling in flight),
/// the address stays where it is.
fn follow_active_label(api: &FakeApi, holder: &mut Option<String>) -> Result<()> {
    let active: Vec<String> = api
        .list("pods")
        .iter()
        .filter(|pod| pod["metadata"]["labels"][GATEWAY_LABEL] == ACTIVE)
        .filter_map(|pod| Some(pod["spec"]["nodeName"].as_str()?.to_owned()))
        .collect();
    let [node] = active.as_slice() else {
        return Ok(());
    };
    if holder.as_ref() == Some(node) {
        return Ok(());
    }
    move_endpoint(node)?;
    println!("lab-control: {} now on {node}", CLUSTER.wan_addr());
    fs::write(holder_file(), node)?;
    *holder = Some(node.clone());
    Ok(())
}

/// Takes a's endpoint address off every other gateway node, puts it on
/// `node`, and announces it there.
fn move_endpoint(node: &str) -> Result<()> {
    let endpoint = format!("{}/24", CLUSTER.wan_addr());
    for other in gateways().into_iter().filter(|g| *g != node) {
        // A node whose links are down (the failover test) still lets go.
        let _ = ip(other, &["addr", "del", &endpoint, "dev", "wan0"]);
    }
    ip(node, &["addr", "replace", &endpoint, "dev", "wan0"])?;
    let address = CLUSTER.wan_addr().to_string();
    run(
        "ip",
        &[
            "netns", "exec", node, "arping", "-q", "-U", "-c", "1", "-w", "1", "-I", "wan0", "-s",
            &address, &address,
        ],
    )
    .map(drop)
    .or_else(|e| {
        // arping exits 1 when no reply came, which a gratuitous ARP never gets.
        if e.to_string().contains("exit status: 1") {
            Ok(())
        } else {
            Err(e)
        }
    })
}
