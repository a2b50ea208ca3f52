//! Building and removing the reference lab (docs/design.md#the-reference-lab), and managing the
//! agents that run in it.
//!
//! Everything the lab makes is named: the namespaces of `topology`, the
//! state directory [`STATE_DIR`] and its own bpffs mount. `down` removes all
//! of it, by name, whatever state a crash left. No lab address or route is
//! ever added to the root namespace, and no lab namespace is linked to it.

pub mod clear_tunnel;
pub mod containers;
pub mod external_tunnel;
pub mod ha;
pub mod liqo_peer;
pub mod monitor;
pub mod segregation;

use std::{
    fs,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;

use crate::{
    cmd::{ip, run, sysctl},
    netns,
    topology::{
        CLUSTERS, Cluster, GW2, METRICS_PORT, NAT_MAPPING, PEERINGS, POD3, WAN_NS, WAN_ROUTER,
        node_addr,
    },
};

/// Where the lab keeps its state: PIDs, logs, objects, bpffs.
pub const STATE_DIR: &str = "/run/isthmus-lab";
/// How long an agent may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an agent may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Prefix of the namespaces tests build for themselves, beside the lab.
pub const TEST_NS_PREFIX: &str = "ist-t-";

/// Every netns name the lab may create, including ones of later issues and
/// the tests' own (`ist-t-*`), so that `down` removes whatever any run left.
fn all_namespaces() -> Vec<String> {
    let mut names = vec![
        WAN_NS.to_owned(),
        monitor::MON_NS.to_owned(),
        GW2.to_owned(),
        POD3.to_owned(),
    ];
    if let Ok(entries) = fs::read_dir("/run/netns") {
        names.extend(
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(TEST_NS_PREFIX)),
        );
    }
    for c in ["a", "b", "c"] {
        for suffix in ["gw", "node", "lan", "pod1", "pod2"] {
            names.push(format!("{c}-{suffix}"));
        }
    }
    names
}

pub(crate) fn state(sub: &str) -> PathBuf {
    Path::new(STATE_DIR).join(sub)
}

/// The lab's own bpffs instance. `ip netns exec` remounts /sys, hiding
/// /sys/fs/bpf, so the lab mounts one where every node can see it.
pub fn bpffs_root() -> PathBuf {
    state("bpffs")
}

/// Where node `node` pins its programs and maps.
pub fn bpffs(node: &str) -> PathBuf {
    bpffs_root().join(node)
}

/// The paths of what node `node` pinned.
pub fn pins(node: &str) -> isthmus_common::pins::Pins {
    isthmus_common::pins::Pins::new(&bpffs(node))
}

/// The directory node `node` reads its objects from.
pub fn object_dir(node: &str) -> PathBuf {
    state("objects").join(node)
}

/// The log file of node `node`'s agent.
pub fn log_file(node: &str) -> PathBuf {
    state("logs").join(format!("{node}.log"))
}

fn pid_file(node: &str) -> PathBuf {
    state("pids").join(format!("{node}.pid"))
}

/// The agent binary the lab runs.
pub fn agent_binary() -> PathBuf {
    crate::target_dir().join("release/isthmus-agent")
}

/// What carries traffic between the lab's gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabTunnel {
    /// The agents' embedded WireGuard, over `ist-wan`.
    Userspace,
    /// None: gateways route peers' networks over `wan0` in clear, and NAT there.
    None,
    /// Debian bookworm's wireguard-go, configured with `wg`, carries the
    /// traffic; the agents only NAT, on its device. Liqo v0.10's way.
    WireguardGo,
    /// wireguard-go from bookworm-backports in its place.
    WireguardGoCurrent,
    /// gotatun-cli in its place.
    Gotatun,
    /// boringtun-cli in its place.
    BoringtunCli,
    /// A kernel VXLAN tunnel in clear in its place: what the path costs
    /// without encryption.
    Clear,
}

impl LabTunnel {
    /// The other WireGuard that carries the traffic, if one does.
    pub fn external(self) -> Option<external_tunnel::Implementation> {
        use external_tunnel::Implementation as I;
        match self {
            LabTunnel::Userspace | LabTunnel::None | LabTunnel::Clear => None,
            LabTunnel::WireguardGo => Some(I::WireguardGoBookworm),
            LabTunnel::WireguardGoCurrent => Some(I::WireguardGoCurrent),
            LabTunnel::Gotatun => Some(I::Gotatun),
            LabTunnel::BoringtunCli => Some(I::BoringtunCli),
        }
    }

    /// The lab setup in which `imp` carries the traffic.
    pub fn running(imp: external_tunnel::Implementation) -> Self {
        use clap::ValueEnum;
        *Self::value_variants()
            .iter()
            .find(|t| t.external() == Some(imp))
            .expect("every implementation has a lab setup")
    }

    fn as_str(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .expect("no variant is skipped")
            .get_name()
            .to_owned()
    }
}

/// Starts on every gateway what carries traffic in `tunnel` besides the
/// agents: another WireGuard, or the VXLAN device in clear.
fn start_other_tunnel(tunnel: LabTunnel) -> Result<()> {
    if let Some(imp) = tunnel.external() {
        for cluster in CLUSTERS {
            external_tunnel::start_on(imp, cluster)?;
        }
    }
    if tunnel == LabTunnel::Clear {
        CLUSTERS
            .iter()
            .try_for_each(|c| clear_tunnel::start_on(c))?;
    }
    Ok(())
}

/// The tunnel mode the lab was brought up with.
pub fn tunnel_mode() -> LabTunnel {
    use clap::ValueEnum;
    fs::read_to_string(state("tunnel"))
        .ok()
        .and_then(|s| LabTunnel::from_str(&s, false).ok())
        .unwrap_or(LabTunnel::Userspace)
}

/// The WireGuard key file of gateway `node`.
pub fn key_file(node: &str) -> PathBuf {
    state("keys").join(format!("{node}.key"))
}

/// The lab state's marker files that turn an option of the agents off.
const NO_GUARD: &str = "no-guard";
/// The lab state's file that holds `--forward-past-netfilter`'s value when
/// a test sets one; without it, the agents run the DaemonSet's default.
const PAST_NETFILTER: &str = "past-netfilter";

/// Whether the embedded tunnel's gateways run the XDP guard on their
/// uplinks, as the lab starts them; [`set_guard`] turns it off.
pub fn guard_is_on() -> bool {
    !state(NO_GUARD).exists()
}

/// Turns the gateways' XDP guard on or off, restarting their agents;
/// returns once they are ready. The guard is an option of the agent, off
/// by default: the tunnel benchmark measures the tunnel with and without.
pub fn set_guard(on: bool) -> Result<()> {
    let gateways: Vec<String> = CLUSTERS.iter().map(|c| c.gw()).collect();
    set_option(NO_GUARD, on, &gateways)
}

/// Puts `tunnel` between the gateways in place of the one running, with
/// the embedded tunnel's XDP guard on or off, restarting the gateways'
/// agents only; returns once they are ready. The tunnel benchmark compares
/// setups round by round on one lab this way, so that a slow minute of
/// the shared machine falls on all of them. Not to or from
/// [`LabTunnel::None`], whose lab routes peers' networks itself.
pub fn set_gateway_tunnel(tunnel: LabTunnel, guard: bool) -> Result<()> {
    if tunnel == LabTunnel::None || tunnel_mode() == LabTunnel::None {
        bail!("a lab without a tunnel routes peers' networks itself: bring it up anew");
    }
    let gateways: Vec<String> = CLUSTERS.iter().map(|c| c.gw()).collect();
    // From a clean slate, as in a new lab: the embedded tunnel's device
    // and routes outlive its agent, for a restart in place.
    for gw in &gateways {
        stop_agent(gw)?;
        clean_up_agent(gw)?;
    }
    external_tunnel::stop_all()?;
    CLUSTERS.iter().try_for_each(|c| clear_tunnel::stop_on(c))?;
    fs::write(state("tunnel"), tunnel.as_str())?;
    set_marker(NO_GUARD, guard)?;
    start_other_tunnel(tunnel)?;
    for gw in &gateways {
        start_agent(gw)?;
    }
    gateways.iter().try_for_each(|gw| wait_ready(gw))
}

/// The `--forward-past-netfilter` value a test set (`on`, `off`, `auto`),
/// or none while the agents run the DaemonSet's default, `auto`.
pub fn past_netfilter_mode() -> Option<String> {
    fs::read_to_string(state(PAST_NETFILTER)).ok()
}

/// Sets `--forward-past-netfilter` to `mode` (none: the default) for the
/// agents started from now on.
pub fn write_past_netfilter_mode(mode: Option<&str>) -> Result<()> {
    match mode {
        Some(mode) => fs::write(state(PAST_NETFILTER), mode)?,
        None => {
            let _ = fs::remove_file(state(PAST_NETFILTER));
        }
    }
    Ok(())
}

/// Sets `--forward-past-netfilter` to `mode` (none: the default), restarting
/// every agent; returns once they are ready.
pub fn set_forward_past_netfilter(mode: Option<&str>) -> Result<()> {
    write_past_netfilter_mode(mode)?;
    CLUSTERS
        .iter()
        .flat_map(|c| c.nodes().map(|(name, _)| name))
        .try_for_each(|node| restart_agent(&node))
}

/// Turns an option of the agents on or off, as a marker file in the lab's
/// state says (present: off), and restarts the agents of `nodes`.
fn set_option(off_marker: &str, on: bool, nodes: &[String]) -> Result<()> {
    set_marker(off_marker, on)?;
    nodes.iter().try_for_each(|node| restart_agent(node))
}

/// Writes the marker file that turns an option of the agents off, or
/// removes it; the agents started next follow it.
fn set_marker(off_marker: &str, on: bool) -> Result<()> {
    match on {
        true => {
            let _ = fs::remove_file(state(off_marker));
        }
        false => fs::write(state(off_marker), "")?,
    }
    Ok(())
}

/// Whether the lab is up: its namespaces and state directory exist.
pub fn is_up() -> bool {
    netns::exists(WAN_NS) && Path::new(STATE_DIR).is_dir()
}

/// Builds the lab from nothing and starts every agent; returns once every
/// agent reports ready.
pub fn up(tunnel: LabTunnel) -> Result<()> {
    build(tunnel, None, Agents::Processes)
}

/// As [`up`], with every agent run from the agent's image under podman, as
/// the DaemonSets run it ([`containers`]).
pub fn up_in_containers(tunnel: LabTunnel) -> Result<()> {
    build(tunnel, None, Agents::Containers)
}

/// How the lab runs its agents.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Agents {
    /// The release binary, as root, in the node's namespace.
    Processes,
    /// The image, under the DaemonSets' container settings.
    Containers,
}

/// The lab with `liqo` run as Liqo v0.10 runs a cluster
/// ([`liqo_peer`]) and the others with Isthmus' embedded tunnel.
pub fn up_with_liqo_peer(liqo: &'static Cluster) -> Result<()> {
    build(LabTunnel::Userspace, Some(liqo), Agents::Processes)
}

fn build(tunnel: LabTunnel, liqo: Option<&'static Cluster>, agents: Agents) -> Result<()> {
    let agent = agent_binary();
    if !agent.exists() {
        bail!(
            "{} is missing: run `cargo xtask build` first",
            agent.display()
        );
    }
    down()?;
    for sub in ["pids", "logs", "objects", "bpffs", "keys"] {
        fs::create_dir_all(state(sub))?;
    }
    fs::write(state("tunnel"), tunnel.as_str())?;
    if agents == Agents::Containers {
        containers::turn_on()?;
    }
    if let Some(liqo) = liqo {
        liqo_peer::choose(liqo)?;
    }
    run(
        "mount",
        &["-t", "bpf", "isthmus-lab", &bpffs_root().to_string_lossy()],
    )?;
    println!("lab: building namespaces and links");
    build_wan()?;
    for cluster in CLUSTERS {
        build_cluster(cluster)?;
    }
    route_peers(tunnel)?;
    write_objects(tunnel)?;
    start_other_tunnel(tunnel)?;
    if let Some(liqo) = liqo {
        println!(
            "lab: cluster {} runs as Liqo v0.10 (wireguard-go, iptables, conncheck)",
            liqo.name
        );
        liqo_peer::start(liqo)?;
    }
    let isthmus = || {
        CLUSTERS
            .iter()
            .filter(|c| liqo.is_none_or(|l| l.name != c.name))
    };
    println!("lab: starting agents");
    for cluster in isthmus() {
        for (node, _) in cluster.nodes() {
            start_agent(&node)?;
        }
    }
    for cluster in isthmus() {
        for (node, _) in cluster.nodes() {
            wait_ready(&node)?;
        }
    }
    if liqo.is_some() {
        println!("lab: up; every Isthmus agent is ready");
        return Ok(());
    }
    println!("lab: starting Prometheus in {}", monitor::MON_NS);
    monitor::up()?;
    println!("lab: up; every agent is ready, and Prometheus scrapes them all");
    Ok(())
}

/// Creates netns `name` the way every lab namespace is: loopback up, loose
/// reverse-path filtering, no IPv6.
pub(crate) fn add_ns(name: &str) -> Result<()> {
    ip("", &["netns", "add", name])?;
    ip(name, &["link", "set", "lo", "up"])?;
    for key in [
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
    ] {
        sysctl(name, key, "0")?;
    }
    // The lab is IPv4: no router solicitations or MLD reports on its wires.
    for key in [
        "net.ipv6.conf.all.disable_ipv6",
        "net.ipv6.conf.default.disable_ipv6",
    ] {
        sysctl(name, key, "1")?;
    }
    Ok(())
}

/// A veth pair with one end in each netns, both up.
pub(crate) fn veth(ns_a: &str, name_a: &str, ns_b: &str, name_b: &str) -> Result<()> {
    ip(
        ns_a,
        &[
            "link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", ns_b,
        ],
    )?;
    ip(ns_a, &["link", "set", name_a, "up"])?;
    ip(ns_b, &["link", "set", name_b, "up"])?;
    Ok(())
}

fn bridge(ns: &str) -> Result<()> {
    // A bridge takes the lowest MAC of its ports unless given one, so
    // `--ha` adding a port would change it under the neighbours' caches
    // (the API server's and the router's address unreachable for ~30 s).
    let mac = bridge_mac(ns);
    ip(
        ns,
        &["link", "add", "br0", "address", &mac, "type", "bridge"],
    )?;
    ip(ns, &["link", "set", "br0", "up"])?;
    // Where br_netfilter is loaded, it would run iptables on bridged frames:
    // the lab's switches are plain switches.
    for table in ["iptables", "ip6tables", "arptables"] {
        let key = format!("net.bridge.bridge-nf-call-{table}");
        if std::path::Path::new(&format!("/proc/sys/{}", key.replace('.', "/"))).exists() {
            sysctl(ns, &key, "0")?;
        }
    }
    Ok(())
}

/// A locally administered MAC of its own for `ns`'s bridge.
fn bridge_mac(ns: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ns.hash(&mut hasher);
    let b = hasher.finish().to_be_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4]
    )
}

fn build_wan() -> Result<()> {
    add_ns(WAN_NS)?;
    bridge(WAN_NS)?;
    ip(
        WAN_NS,
        &["addr", "add", &format!("{WAN_ROUTER}/24"), "dev", "br0"],
    )?;
    Ok(())
}

fn build_cluster(c: &Cluster) -> Result<()> {
    let (gw, node, lan) = (c.gw(), c.node(), c.lan());
    for ns in [&gw, &node, &lan] {
        add_ns(ns)?;
    }
    for ns in [&gw, &node] {
        sysctl(ns, "net.ipv4.ip_forward", "1")?;
    }
    bridge(&lan)?;

    // Uplink of the gateway on the WAN bridge.
    veth(&gw, "wan0", WAN_NS, &gw)?;
    ip(WAN_NS, &["link", "set", &gw, "master", "br0"])?;
    ip(
        &gw,
        &[
            "addr",
            "add",
            &format!("{}/24", c.wan_addr()),
            "dev",
            "wan0",
        ],
    )?;
    ip(
        &gw,
        &["route", "add", "default", "via", WAN_ROUTER, "dev", "wan0"],
    )?;

    // Both nodes on the LAN bridge.
    for (ns, addr, port) in [(&gw, c.lan_gw(), "gw"), (&node, c.lan_node(), "node")] {
        veth(ns, "lan0", &lan, port)?;
        ip(&lan, &["link", "set", port, "master", "br0"])?;
        ip(ns, &["addr", "add", &format!("{addr}/24"), "dev", "lan0"])?;
    }

    // Pods: pod1 on the worker, pod2 on the gateway.
    add_pod(c, 1, &node)?;
    add_pod(c, 2, &gw)?;
    route_pod_halves(c)
}

/// The CNI stand-in's routes: each node routes the other's half of the
/// PodCIDR over the LAN. Idempotent, so that a node whose LAN link went
/// down (and took these routes with it) gets them back.
pub(crate) fn route_pod_halves(c: &Cluster) -> Result<()> {
    for (host, other_half, via) in [
        (c.node(), c.pod_half(2), c.lan_gw()),
        (c.gw(), c.pod_half(1), c.lan_node()),
    ] {
        ip(
            &host,
            &[
                "route",
                "replace",
                &other_half.to_string(),
                "via",
                &via.to_string(),
            ],
        )?;
    }
    Ok(())
}

/// A pod netns wired to its node like a routed CNI: a /32 address, a
/// link-local gateway on the node's end, and a host route back.
fn add_pod(c: &Cluster, i: u8, host: &str) -> Result<()> {
    let pod = c.pod(i);
    add_ns(&pod)?;
    wire_pod(&pod, host, &format!("pod{i}"), c.pod_addr(i))
}

/// Every pod's next hop, as Calico gives it: the node's end of the pod's
/// veth answers for it.
pub const POD_GATEWAY: &str = "169.254.1.1";

/// Wires the existing netns `pod` to node `host` as a pod with address
/// `addr`, through a veth whose node end is `host_end`.
pub fn wire_pod(pod: &str, host: &str, host_end: &str, addr: Ipv4Addr) -> Result<()> {
    veth(pod, "eth0", host, host_end)?;
    let gateway = POD_GATEWAY;
    ip(pod, &["addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
    ip(
        host,
        &["addr", "add", &format!("{gateway}/32"), "dev", host_end],
    )?;
    ip(
        pod,
        &["route", "add", gateway, "dev", "eth0", "scope", "link"],
    )?;
    ip(
        pod,
        &["route", "add", "default", "via", gateway, "dev", "eth0"],
    )?;
    ip(
        host,
        &["route", "add", &format!("{addr}/32"), "dev", host_end],
    )?;
    Ok(())
}

/// Without a tunnel, gateways route peers' networks over the WAN in clear;
/// with one, the gateway's agent (or wireguard-go's setup) routes them into
/// it. Workers have no route to peers: the overlay steers their pods'
/// traffic from the kernel.
fn route_peers(tunnel: LabTunnel) -> Result<()> {
    if tunnel != LabTunnel::None {
        return Ok(());
    }
    for p in &PEERINGS {
        for net in p.remote_views() {
            let via = p.remote.wan_addr().to_string();
            ip(
                &p.local.gw(),
                &["route", "add", &net.to_string(), "via", &via, "dev", "wan0"],
            )?;
        }
    }
    Ok(())
}

/// The public key of gateway `node`, creating its key file if needed.
pub fn public_key(node: &str) -> Result<String> {
    let key = key_file(node).to_string_lossy().into_owned();
    let out = run(
        &agent_binary().to_string_lossy(),
        &["pubkey", "--private-key-file", &key],
    )?;
    Ok(out.trim().to_owned())
}

/// The hosts file `ip netns exec` gives gateway `gw`'s processes: its
/// peers' endpoint names, and localhost.
pub fn hosts_file(gw: &str) -> PathBuf {
    Path::new("/etc/netns").join(gw).join("hosts")
}

/// Writes every gateway's hosts file, resolving the endpoint names of its
/// TunnelEndpoints to the peers' uplink addresses.
fn write_hosts() -> Result<()> {
    for cluster in CLUSTERS {
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for p in PEERINGS.iter().filter(|p| p.local.name == cluster.name) {
            if let Some(name) = p.endpoint_name {
                hosts.push_str(&format!("{} {name}\n", p.remote.wan_addr()));
            }
        }
        let path = hosts_file(&cluster.gw());
        fs::create_dir_all(path.parent().expect("a directory"))?;
        fs::write(path, hosts)?;
    }
    Ok(())
}

fn write_objects(tunnel: LabTunnel) -> Result<()> {
    write_hosts()?;
    for p in &PEERINGS {
        let key = match tunnel {
            LabTunnel::None => None,
            _ => Some(public_key(&p.remote.gw())?),
        };
        let yaml = p.tunnel_endpoint_yaml(key.as_deref());
        for (node, _) in p.local.nodes() {
            let dir = object_dir(&node);
            fs::create_dir_all(&dir)?;
            fs::write(dir.join(format!("peer-{}.yaml", p.remote.name)), &yaml)?;
        }
    }
    for cluster in CLUSTERS {
        for (node, _) in cluster.nodes() {
            write_object(&node, NODES_FILE, &cluster.nodes_yaml())?;
        }
    }
    for p in &PEERINGS {
        if !NAT_MAPPING.is_for(p) {
            for (node, _) in p.local.nodes() {
                write_object(&node, &p.nat_mapping_file(), &p.nat_mapping_yaml(&[]))?;
            }
        }
    }
    write_nat_mapping(&[NAT_MAPPING.entry()])
}

/// Seconds between the gateways' lookups of endpoint names.
pub const RESOLVE_INTERVAL: u64 = 2;

/// The nodes file in every node's object directory.
pub const NODES_FILE: &str = "nodes.yaml";

/// The host ends of the lab's pod veths, which workers steer from.
pub const POD_DEVS: &str = "pod*";

/// Writes the hub's NatMapping for its client with `entries` (endpoint,
/// externalIP) besides the conncheck's, on both of the hub's nodes; the
/// agents pick it up live. Every other peering's NatMapping holds only the
/// conncheck's entry, as Liqo's do.
pub fn write_nat_mapping(entries: &[(Ipv4Addr, Ipv4Addr)]) -> Result<()> {
    let yaml = NAT_MAPPING.yaml(entries);
    for (node, _) in NAT_MAPPING.hub.nodes() {
        write_object(&node, &NAT_MAPPING.file_name(), &yaml)?;
    }
    Ok(())
}

/// Puts `text` into `node`'s object directory as `name`. It is written
/// aside and renamed in, so the agent's watch never reads half a file.
pub fn write_object(node: &str, name: &str, text: &str) -> Result<()> {
    let dir = object_dir(node);
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

fn role_of(node: &str) -> &'static str {
    if node.ends_with("-gw") || node == GW2 {
        "gateway"
    } else {
        "worker"
    }
}

/// The cluster lab node `node` belongs to.
fn cluster_of(node: &str) -> Option<&'static Cluster> {
    CLUSTERS.iter().copied().find(|c| {
        node.strip_prefix(c.name)
            .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// Starts node `node`'s agent in its netns and records its PID. Does not
/// wait for it to be ready.
pub fn start_agent(node: &str) -> Result<u32> {
    let args = agent_args(node)?;
    let pid = match containers::is_on() {
        true => spawn_container(
            node,
            &args,
            &containers::Variant::default(),
            &log_file(node),
        )?,
        false => spawn_agent(node, &args, &log_file(node))?,
    };
    fs::write(pid_file(node), pid.to_string())?;
    Ok(pid)
}

/// Starts node `node`'s agent in a container, as `variant` of the
/// manifest says, with `args` from the lab and its output to `log`.
/// Returns the PID of `podman run`, which passes signals on to the agent
/// and exits with it.
pub fn spawn_container(
    node: &str,
    args: &[String],
    variant: &containers::Variant,
    log: &Path,
) -> Result<u32> {
    let command = containers::command(node, role_of(node), args, variant)?;
    spawn_logged(command, log).context("starting the agent's container")
}

/// The command line the lab runs node `node`'s agent with.
pub fn agent_args(node: &str) -> Result<Vec<String>> {
    let mut args: Vec<String> = vec![
        "run".into(),
        format!("--node={node}"),
        format!("--role={}", role_of(node)),
        // Metrics on the node's address, as the DaemonSet serves them.
        format!(
            "--node-ip={}",
            node_addr(node).context("a node of no cluster")?
        ),
        format!("--bpffs={}", bpffs(node).display()),
    ];
    if ha::is_ha_node(node) {
        args.extend([
            "--source=kube".into(),
            format!("--kubeconfig={}", ha::kubeconfig().display()),
            format!("--namespace={}", crate::topology::AGENT_NS),
        ]);
        if role_of(node) == "gateway" {
            args.push(format!("--pod-name={}", ha::pod_name(node)));
        }
    } else {
        args.push(format!("--source=dir:{}", object_dir(node).display()));
    }
    if role_of(node) == "gateway" {
        let cluster = cluster_of(node).context("a gateway of no cluster")?;
        args.push(format!("--masquerade-ip={}", cluster.masquerade_addr()));
        // Endpoint names are looked up again often, so a test sees a move.
        args.push(format!("--resolve-interval={RESOLVE_INTERVAL}"));
        if segregation::is_on() && node == segregation::CLUSTER.gw() {
            args.push(format!("--security-mode={}", segregation::MODE));
        }
    }
    args.push(format!("--pod-devs={POD_DEVS}"));
    if let Some(mode) = past_netfilter_mode() {
        args.push(format!("--forward-past-netfilter={mode}"));
    }
    match tunnel_mode() {
        LabTunnel::Userspace => {
            args.push(format!("--private-key-file={}", key_file(node).display()));
            if role_of(node) == "gateway" && guard_is_on() {
                args.push("--guard-dev=wan0".into());
            }
        }
        LabTunnel::None => args.extend(["--tunnel=none".into(), "--nat-dev=wan0".into()]),
        _ => args.extend([
            "--tunnel=none".into(),
            format!("--nat-dev={}", external_tunnel::dev(node)),
        ]),
    }
    Ok(args)
}

/// Starts the agent with `args` in netns `ns`, in a session of its own, its
/// output appended to `log`. Returns its PID.
pub fn spawn_agent(ns: &str, args: &[String], log: &Path) -> Result<u32> {
    spawn_agent_binary(&agent_binary(), ns, args, log)
}

/// As [`spawn_agent`], with another build of the agent.
pub fn spawn_agent_binary(binary: &Path, ns: &str, args: &[String], log: &Path) -> Result<u32> {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(binary).args(args);
    // `ip netns exec` execs the agent, so this PID is the agent's.
    spawn_logged(command, log).context("starting the agent")
}

/// [`spawn_detached`], its output appended to the file `log`.
fn spawn_logged(command: Command, log: &Path) -> Result<u32> {
    let log = fs::OpenOptions::new().create(true).append(true).open(log)?;
    spawn_detached(command, log)
}

/// Starts a gateway agent without a tunnel of its own in netns `ns` (a
/// test's): its NAT on `nat_dev`, its objects read from `objects`, its
/// pins in the lab's bpffs, `extra` arguments after these. Waits until it
/// is ready; returns its PID.
pub fn start_tunnelless_gateway(
    ns: &str,
    nat_dev: &str,
    objects: &Path,
    extra: &[&str],
) -> Result<u32> {
    let mut args: Vec<String> = ["run", "--node=t", "--role=gateway", "--tunnel=none"]
        .map(str::to_owned)
        .into();
    args.extend([
        format!("--nat-dev={nat_dev}"),
        format!("--source=dir:{}", objects.display()),
        format!("--bpffs={}", bpffs(ns).display()),
        format!("--metrics-addr=127.0.0.1:{METRICS_PORT}"),
    ]);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let log = log_file(ns);
    let pid = spawn_agent(ns, &args, &log)?;
    wait_ready_in(ns, pid, &log)?;
    Ok(pid)
}

/// Starts `command` in a session of its own, with no input and its output
/// to `log`, so that it survives the terminal that ran `lab up`. Returns
/// its PID.
pub(crate) fn spawn_detached(mut command: Command, log: fs::File) -> Result<u32> {
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    Ok(command.spawn()?.id())
}

/// The PID of node `node`'s agent, if it runs: in a container, PID 1 of
/// the container, which a signal to kill the agent must reach.
pub fn agent_pid(node: &str) -> Option<u32> {
    if containers::is_on() {
        return containers::agent_pid(node).filter(|pid| alive(*pid));
    }
    let pid: u32 = fs::read_to_string(pid_file(node))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    is_lab_agent(pid).then_some(pid)
}

/// Stops node `node`'s agent with SIGTERM and waits for it to exit. The
/// dataplane it attached stays in place.
pub fn stop_agent(node: &str) -> Result<()> {
    if let Some(pid) = agent_pid(node) {
        stop_pid(pid)?;
    }
    let _ = fs::remove_file(pid_file(node));
    Ok(())
}

/// Opens the map `map` pinned under bpffs directory `root`.
pub fn pinned_hash<K: aya::Pod, V: aya::Pod>(
    root: &std::path::Path,
    map: &str,
) -> Result<aya::maps::HashMap<aya::maps::MapData, K, V>> {
    let path = isthmus_common::pins::Pins::new(root).map(map);
    let data = aya::maps::MapData::from_pin(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(aya::maps::Map::from_map_data(data)?.try_into()?)
}

/// Removes what the stopped agent of `node` left behind for a restart in
/// place, with its own `cleanup`: programs, pins, routes and its TUN
/// device. Returns what `cleanup` reported.
pub fn clean_up_agent(node: &str) -> Result<String> {
    let agent = agent_binary();
    run(
        "ip",
        &[
            "netns",
            "exec",
            node,
            &agent.to_string_lossy(),
            "cleanup",
            "--bpffs",
            &bpffs(node).to_string_lossy(),
        ],
    )
}

/// Stops and starts node `node`'s agent, and waits until it is ready.
pub fn restart_agent(node: &str) -> Result<()> {
    stop_agent(node)?;
    start_agent(node)?;
    wait_ready(node)
}

/// Stops an agent this process started, by PID, and waits for it to exit;
/// fails if it had to be killed.
pub fn stop_pid(pid: u32) -> Result<()> {
    if signal_and_wait(pid, Signal::SIGTERM, STOP_TIMEOUT) {
        return Ok(());
    }
    signal_and_wait(pid, Signal::SIGKILL, STOP_TIMEOUT);
    bail!("agent {pid} did not exit within {STOP_TIMEOUT:?} of SIGTERM: killed it")
}

/// Ends a process this process started, by PID, for sure: SIGTERM, and
/// SIGKILL once `grace` has passed.
pub fn end_pid(pid: u32, grace: Duration) -> Result<()> {
    if signal_and_wait(pid, Signal::SIGTERM, grace)
        || signal_and_wait(pid, Signal::SIGKILL, STOP_TIMEOUT)
    {
        return Ok(());
    }
    bail!("process {pid} is still there after SIGKILL")
}

/// Sends `signal` to `pid` and waits up to `timeout` for it to exit;
/// whether it did.
fn signal_and_wait(pid: u32, signal: Signal, timeout: Duration) -> bool {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(target, signal);
    crate::wait::until(
        timeout,
        Duration::from_millis(10),
        &format!("process {pid} exits on {signal}"),
        || {
            // Reap it if it is our child; harmless otherwise.
            let _ = nix::sys::wait::waitpid(target, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
            !alive(pid)
        },
    )
    .is_ok()
}

/// Whether `pid` runs and is not a zombie.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Whether `pid` is an agent the lab started: its command line names the
/// agent and the lab's bpffs. Only such processes are ever signalled.
fn is_lab_agent(pid: u32) -> bool {
    runs_with(pid, &["isthmus-agent", &bpffs_root().to_string_lossy()])
}

/// Whether `pid` runs, is not a zombie, and its command line names every word.
pub(crate) fn runs_with(pid: u32, words: &[&str]) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let cmdline = String::from_utf8_lossy(&cmdline);
    alive(pid) && words.iter().all(|w| cmdline.contains(w))
}

/// Every process whose command line names every word.
pub(crate) fn running_with(words: &[&str]) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| runs_with(*pid, words))
        .collect()
}

/// Lab agents found by their command line, for when PID files are lost.
fn stray_agents() -> Vec<u32> {
    running_with(&["isthmus-agent", &bpffs_root().to_string_lossy()])
}

/// Asks the agent in netns `ns` for a metrics path, from inside that netns:
/// a lab node's agent serves on the node's address, a test's own agent on
/// loopback.
pub fn http_get(ns: &str, path: &str) -> Result<(u16, String)> {
    let addr = node_addr(ns).unwrap_or(Ipv4Addr::LOCALHOST);
    http_get_at(ns, SocketAddr::from((addr, METRICS_PORT)), path)
}

/// An HTTP/1.0 GET of `path` from `addr`, from inside netns `ns`: the status
/// and the body.
pub fn http_get_at(ns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    netns::run_in(ns, move || -> Result<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("malformed HTTP response")?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    })?
}

/// The value of the first sample in node `node`'s metrics whose name and
/// labels start with `prefix`, e.g. `isthmus_peers ` or
/// `isthmus_guard_packets_total{verdict="dropped"}`.
pub fn metric(node: &str, prefix: &str) -> Result<f64> {
    let body = scrape(node)?;
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .with_context(|| format!("{node} exposes no sample {prefix}:\n{body}"))
}

/// The sum of the samples of metric `name` in node `node`'s metrics that
/// carry every label in `labels`, e.g. `isthmus_nat_packets_total` with
/// `direction="egress"` over every program. Fails if none does.
pub fn metric_sum(node: &str, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
    let body = scrape(node)?;
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let values: Vec<f64> = body
        .lines()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let pairs: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
            (metric == name && wanted.iter().all(|w| pairs.contains(&w.as_str())))
                .then(|| value.parse().ok())?
        })
        .collect();
    if values.is_empty() {
        bail!("{node} exposes no sample of {name} with {labels:?}:\n{body}");
    }
    Ok(values.iter().sum())
}

/// Node `node`'s metrics, in the text exposition format.
pub fn scrape(node: &str) -> Result<String> {
    let (status, body) = http_get(node, "/metrics")?;
    if status != 200 {
        bail!("{node}: /metrics answered {status}");
    }
    Ok(body)
}

/// Waits until node `node`'s agent answers `/readyz` with 200. Fails early,
/// with the end of its log, if the agent exits.
pub fn wait_ready(node: &str) -> Result<()> {
    // The recorded PID, not `agent_pid`: just after the fork, the child has
    // not yet exec'd into the agent, so its command line does not say so.
    let pid = fs::read_to_string(pid_file(node))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("agent of {node} was not started"))?;
    wait_ready_in(node, pid, &log_file(node))
}

/// Waits until the agent `pid` in netns `ns` answers `/readyz` with 200.
pub fn wait_ready_in(ns: &str, pid: u32, log: &Path) -> Result<()> {
    let ready = || {
        anyhow::ensure!(
            alive(pid),
            "agent {pid} in {ns} exited; end of {}:\n{}",
            log.display(),
            log_tail(log)
        );
        Ok(matches!(http_get(ns, "/readyz"), Ok((200, _))).then_some(()))
    };
    let what = format!("agent {pid} in {ns} ready");
    crate::wait::try_poll(READY_TIMEOUT, Duration::from_millis(20), &what, ready)
        .with_context(|| format!("end of its log:\n{}", log_tail(log)))
}

/// The last lines of an agent log.
pub fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Removes everything the lab created. Succeeds when nothing is up.
pub fn down() -> Result<()> {
    let mut pids: Vec<u32> = fs::read_dir(state("pids"))
        .into_iter()
        .flatten()
        .filter_map(|e| fs::read_to_string(e.ok()?.path()).ok()?.trim().parse().ok())
        .filter(|pid| is_lab_agent(*pid))
        .collect();
    pids.extend(stray_agents());
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        stop_pid(pid)?;
    }
    containers::remove_all()?;
    liqo_peer::stop()?;
    ha::stop_control()?;
    external_tunnel::stop_all()?;
    for gw in CLUSTERS.iter().map(|c| c.gw()).chain([GW2.to_owned()]) {
        let _ = fs::remove_dir_all(hosts_file(&gw).parent().expect("a directory"));
    }
    monitor::down()?;
    // Deleting a netns deletes its devices, and with them every TCX link
    // and clsact filter on them.
    for name in all_namespaces() {
        if netns::exists(&name) {
            ip("", &["netns", "del", &name])?;
        }
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    let bpf = bpffs_root();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*bpf.to_string_lossy()))
    {
        // Unmounting the lab's own bpffs instance drops every pin in it.
        run("umount", &[&bpf.to_string_lossy()])?;
    }
    if Path::new(STATE_DIR).exists() {
        fs::remove_dir_all(STATE_DIR).with_context(|| format!("removing {STATE_DIR}"))?;
    }
    Ok(())
}
