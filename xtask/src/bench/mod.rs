//! `cargo xtask bench`: this project against the peers named in the issues,
//! in one run, on the lab's own path.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

mod burner;
mod ceiling;
mod chart;
mod conntrack;
mod control;
mod crr;
mod failover;
mod guard;
mod hub;
mod idle;
mod isolation;
mod kube;
mod liqo_v010;
mod nat;
mod overlay;
mod tunnel;
mod wg_peers;

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap, MapData};
use clap::Subcommand;
use isthmus_common::{
    nat::{MappingKey, PeerKey, PeerNat},
    wire::Be32,
};
use isthmus_lab::{
    cmd::{ip, run},
    lab, netns,
    objects::TunnelEndpoint,
    topology::{A, B, Cluster, PEERINGS, Peering, synthetic_peer_views},
    wait,
};

/// Which benchmark to run.
#[derive(Subcommand)]
pub enum Which {
    /// 64-byte UDP packets per second through the gateways: no NAT, Isthmus,
    /// and the iptables NETMAP rules Liqo installs, with 1 and 200 peers;
    /// and Isthmus segregating a peer with 10,000 allowed endpoints.
    Nat {
        /// Another build of the agent (an earlier commit's
        /// `target/release/isthmus-agent`), measured with one peer in the
        /// same interleaved rounds: what a change costs.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// TCP and UDP throughput, round-trip time and CPU per gigabyte from
    /// a-pod1 to b-pod1 through the embedded tunnel, and through each other
    /// userspace WireGuard in its place: wireguard-go (bookworm and
    /// bookworm-backports), gotatun-cli and boringtun-cli.
    Tunnel,
    /// A handshake flood at the tunnel port: the XDP guard's drop rate,
    /// and the CPU the agent spends with and without it.
    Guard,
    /// 64-byte UDP packets per second and TCP throughput from a worker pod
    /// to a remote worker pod, through the Isthmus overlay and through one
    /// built the Liqo way (VXLAN, `ip rule` to table 18952, routes).
    Overlay,
    /// NatMapping apply time and update latency against iptables, pps
    /// through the hub with 10 and 10,000 entries, and 200 TunnelEndpoints
    /// and 10,000 entries delivered by the Kubernetes API.
    Control {
        /// Run only the Kubernetes API part.
        #[arg(long)]
        kube_only: bool,
    },
    /// Packets and connections per second through the hub's masquerade, its
    /// table's memory and the agent's CPU, with the conntrack empty and
    /// holding 100,000 and 1,000,000 entries.
    Conntrack,
    /// TCP connections and packets per second through the hub (a to c
    /// through b's NatMapping and masquerade): Isthmus against Liqo
    /// v0.10.3's complete rule set, with 1 and 200 peers.
    Hub,
    /// A gateway agent idle with 1, 100 and 1,000 live WireGuard peers: CPU,
    /// resident and map memory; then its start with 1,000 peers and 100,000
    /// NatMapping entries.
    Idle,
    /// How long traffic stops when the active gateway dies (the `--ha`
    /// lab), when a gateway agent restarts in place, and when wireguard-go
    /// restarts, as Liqo's gateway does.
    Failover,
    /// Draw `docs/benchmarks.png` from the results already in
    /// `docs/benchmarks.md`, running nothing (every benchmark redraws it).
    Chart,
}

/// Runs every benchmark, one after the other; each brings the lab up in
/// the shape it needs and takes it down.
pub fn run_all() -> Result<()> {
    let all = [
        Which::Nat { baseline: None },
        Which::Tunnel,
        Which::Overlay,
        Which::Guard,
        Which::Control { kube_only: false },
        Which::Conntrack,
        Which::Hub,
        Which::Idle,
        Which::Failover,
    ];
    let count = all.len();
    for (i, which) in all.into_iter().enumerate() {
        println!("bench: {} of {count}: {}", i + 1, which.name());
        run_bench(which)?;
    }
    Ok(())
}

impl Which {
    fn name(&self) -> &'static str {
        match self {
            Which::Nat { .. } => "nat",
            Which::Tunnel => "tunnel",
            Which::Overlay => "overlay",
            Which::Guard => "guard",
            Which::Control { .. } => "control",
            Which::Conntrack => "conntrack",
            Which::Hub => "hub",
            Which::Idle => "idle",
            Which::Failover => "failover",
            Which::Chart => "chart",
        }
    }
}

/// Runs one benchmark.
pub fn run_bench(which: Which) -> Result<()> {
    match which {
        // NAT alone: gateways route over the WAN in clear.
        Which::Nat { baseline } => on_lab(lab::LabTunnel::None, || nat::run_nat(baseline)),
        Which::Tunnel => tunnel::run_tunnel(),
        Which::Guard => guard::run_guard(),
        Which::Overlay => overlay::run_overlay(),
        Which::Control { kube_only } => control::run_control(kube_only),
        Which::Conntrack => on_lab(lab::LabTunnel::None, conntrack::run_conntrack),
        Which::Hub => on_lab(lab::LabTunnel::None, hub::run_hub),
        Which::Idle => idle::run_idle(),
        Which::Failover => failover::run_failover(),
        Which::Chart => chart::render(),
    }
}

/// Brings the lab up with `tunnel`, runs `measure`, and takes it down
/// whatever `measure` gave. The lab's Prometheus, which scrapes every agent
/// each second for the tests, is stopped first: the benches read what they
/// need themselves, and its bursts would fall on some setups' windows.
fn on_lab<T>(tunnel: lab::LabTunnel, measure: impl FnOnce() -> Result<T>) -> Result<T> {
    lab::up(tunnel)?;
    let result = lab::monitor::down().and_then(|()| measure());
    lab::down()?;
    result
}

/// How long each iperf3 run lasts, in seconds.
const IPERF_SECONDS: &str = "8";

/// Whether a TCP socket listens on `port` in netns `ns` (IPv4 or dual-stack).
fn listening(ns: &str, port: u16) -> Result<bool> {
    let tables = netns::run_in(ns, || {
        ["tcp", "tcp6"]
            .map(|t| fs::read_to_string(format!("/proc/thread-self/net/{t}")).unwrap_or_default())
    })?;
    let wanted = format!(":{port:04X}");
    Ok(tables.iter().flat_map(|t| t.lines()).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3 && fields[1].ends_with(&wanted) && fields[3] == "0A"
    }))
}

/// iperf3 TCP throughput from `client` to `target` (served in `server`), in Gbit/s.
fn iperf(client: &str, server: &str, target: std::net::Ipv4Addr, streams: u8) -> Result<f64> {
    let report = iperf3(client, server, target, &["-P", &streams.to_string()])?;
    let bps = report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received in iperf3's report")?;
    Ok(bps / 1e9)
}

/// The JSON report of an iperf3 run of [`IPERF_SECONDS`] from `client` to
/// `target` (served in `server`), with `args` for the client.
fn iperf3(
    client: &str,
    server: &str,
    target: std::net::Ipv4Addr,
    args: &[&str],
) -> Result<serde_json::Value> {
    let port = isthmus_lab::probe::next_port().to_string();
    let mut daemon = Command::new("timeout")
        .args([
            "60", "ip", "netns", "exec", server, "iperf3", "-s", "-1", "-p", &port,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s")?;
    let port_number = port.parse()?;
    let listens = || Ok(listening(server, port_number)?.then_some(()));
    let waited = wait::try_poll(
        Duration::from_secs(10),
        Duration::from_millis(10),
        "the iperf3 server listening",
        listens,
    );
    if waited.is_err() {
        let _ = daemon.kill();
    }
    waited?;
    let target = target.to_string();
    let mut full = vec![
        "60",
        "ip",
        "netns",
        "exec",
        client,
        "iperf3",
        "-c",
        &target,
        "-p",
        &port,
        "-t",
        IPERF_SECONDS,
        "-J",
    ];
    full.extend_from_slice(args);
    let out = run("timeout", &full);
    let _ = daemon.wait();
    Ok(serde_json::from_str(&out?)?)
}

/// Replaces (or adds) the section `name` of docs/benchmarks.md, so each
/// benchmark keeps its own results.
fn write_section(name: &str, body: &str) -> Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/benchmarks.md");
    let text = fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".to_owned());
    let (begin, end) = (
        format!("<!-- bench:{name} -->"),
        format!("<!-- /bench:{name} -->"),
    );
    let block = format!("{begin}\n{body}{end}\n");
    let updated = match (text.find(&begin), text.find(&end)) {
        (Some(a), Some(b)) => format!(
            "{}{block}{}",
            &text[..a],
            text[b + end.len()..].trim_start_matches('\n')
        ),
        _ => format!("{}\n{block}", text.trim_end()),
    };
    fs::write(&path, updated)?;
    println!("bench: wrote {}", path.display());
    chart::render()
}

/// Rounds over every setup: interleaving them spreads the drift of a
/// shared, virtualised machine over all setups alike.
const ROUNDS: usize = 5;
/// Measurement windows per setup and round; the median of all is reported.
const WINDOWS: usize = 2;
const WINDOW: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_secs(1);
/// Hard bounds on the generator, whatever happens to this process.
const GENERATOR_MAX_PACKETS: &str = "300000000";
const GENERATOR_MAX_SECONDS: &str = "60";

/// A flow under test, from a client pod to a server pod.
struct Flow {
    client: String,
    /// The client's node and the node's end of the client's veth: its
    /// next hop.
    next_hop: (String, &'static str),
    server: String,
    src: [u8; 4],
    dst: [u8; 4],
    /// Where the server answers each of the flow's source ports once
    /// before the measurement (the client as the server sees it), so that
    /// conntrack on the way holds every flow as answered, as it does a
    /// request/response or TCP flow; none leaves the flows one-way.
    answer_to: Option<std::net::Ipv4Addr>,
}

/// How a reaches c-pod1 through the hub b (reachability row 5).
const HUB_TARGET: [u8; 4] = [10, 0, 1, 45];

/// a-pod2, on a's gateway node, to c-pod1 through the hub, answered at
/// `answer_to` (b's masquerade address, as c-pod1 sees a) or not.
fn hub_flow(answer_to: Option<std::net::Ipv4Addr>) -> Flow {
    Flow {
        client: A.pod(2),
        next_hop: (A.gw(), "pod2"),
        server: isthmus_lab::topology::C.pod(1),
        src: A.pod_addr(2).octets(),
        dst: HUB_TARGET,
        answer_to,
    }
}

/// The source ports of a flow's packets (trafgen's `c8(0x80), dinc(0, 255)`)
/// and its destination port.
const FIRST_SOURCE_PORT: u16 = 0x8000;
const SOURCE_PORTS: u16 = 256;
const DESTINATION_PORT: u16 = 9;

/// One datagram from the server's side of `flow` to each of its source
/// ports at `to`.
fn answer(flow: &Flow, to: std::net::Ipv4Addr) -> Result<()> {
    netns::run_in(&flow.server, || -> Result<()> {
        let socket = std::net::UdpSocket::bind(("0.0.0.0", DESTINATION_PORT))?;
        for port in FIRST_SOURCE_PORT..FIRST_SOURCE_PORT + SOURCE_PORTS {
            socket.send_to(b"answer", (to, port))?;
        }
        Ok(())
    })?
    .context("answering the flow's source ports")
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The gateways of the double NAT between a and b.
fn nat_gateways() -> [String; 2] {
    [A.gw(), B.gw()]
}

/// Starts the agents of `nodes` that are not running.
fn enable_isthmus(nodes: &[String]) -> Result<()> {
    for node in nodes {
        if lab::agent_pid(node).is_none() {
            lab::start_agent(node)?;
            lab::wait_ready(node)?;
        }
    }
    Ok(())
}

/// Stops the agents of `nodes` and removes their programs: no Isthmus
/// there.
fn disable_isthmus(nodes: &[String]) -> Result<()> {
    for node in nodes {
        if lab::agent_pid(node).is_none() && !lab::bpffs(node).exists() {
            continue;
        }
        lab::stop_agent(node)?;
        lab::clean_up_agent(node)?;
    }
    Ok(())
}

/// The peers of `local` in a run with `count` peers: `count - 1` synthetic
/// ones (10.128.i.0/24 and 10.129.i.0/24), then the real one, last.
fn synthetic_peers(local: &Cluster, count: usize) -> Vec<String> {
    (1..count)
        .map(|i| {
            let [local_pod, local_ext, remote_pod, remote_ext] =
                synthetic_peer_views(i).map(|net| net.to_string());
            TunnelEndpoint::new(&format!("tep-bench-{i}"), &format!("liqo-tenant-bench-{i}"))
                .local([local.pod_cidr, &local_pod, local.external_cidr, &local_ext])
                .remote(["10.50.0.0/24", &remote_pod, "192.168.50.0/24", &remote_ext])
                .endpoint("203.0.113.200")
                .port(5871)
                .public_key(&synthetic_key(i))
                .to_string()
        })
        .collect()
}

/// A distinct public key for synthetic peer `i`: any 32 bytes are one.
fn synthetic_key(i: usize) -> String {
    let mut key = [0x5au8; 32];
    key[..8].copy_from_slice(&(i as u64).to_le_bytes());
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key)
}

/// Writes the synthetic peers into both gateways' directories and waits
/// until both agents have programmed all of them.
fn set_isthmus_peers(count: usize) -> Result<()> {
    for p in gateway_peerings() {
        let dir = lab::object_dir(&p.local.gw());
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bench-"))
            {
                fs::remove_file(path)?;
            }
        }
        for (i, yaml) in synthetic_peers(p.local, count).iter().enumerate() {
            fs::write(dir.join(format!("bench-{i}.yaml")), yaml)?;
        }
    }
    for p in gateway_peerings() {
        let gw = p.local.gw();
        // The synthetic peers replace the measured one's count, not the others'.
        let others = PEERINGS
            .iter()
            .filter(|q| q.local.name == p.local.name)
            .count()
            - 1;
        wait::try_poll(
            Duration::from_secs(30),
            Duration::from_millis(20),
            &format!("{gw} programs {count} peers"),
            || Ok((peers_programmed(&gw)? == (count + others) as f64).then_some(())),
        )?;
    }
    Ok(())
}

/// The a–b peerings, both sides: the double NAT the NAT bench measures.
fn gateway_peerings() -> impl Iterator<Item = &'static Peering> {
    PEERINGS.iter().filter(|p| {
        [A.name, B.name].contains(&p.local.name) && [A.name, B.name].contains(&p.remote.name)
    })
}

fn peers_programmed(gw: &str) -> Result<f64> {
    lab::metric(gw, "isthmus_peers ")
}

/// A trafgen configuration: 64-byte frames (60 without FCS) from the client
/// pod to `dst`, over 256 source ports so conntrack sees real flows.
/// The MAC address of `dev` in netns `ns`, as trafgen bytes.
fn mac_bytes(ns: &str, dev: &str) -> Result<String> {
    let out = ip(ns, &["-o", "link", "show", dev])?;
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .context("no MAC")?;
    Ok(mac
        .split(':')
        .map(|b| format!("0x{b}"))
        .collect::<Vec<_>>()
        .join(", "))
}

fn trafgen_config(flow: &Flow) -> Result<String> {
    let octets = |a: [u8; 4]| a.map(|o| o.to_string()).join(", ");
    Ok(format!(
        "{{
  {dst_mac}, {src_mac}, c16(0x0800),
  0x45, 0x00, c16(46), c16(0), c16(0), 64, 17, csumip(14, 33),
  {src}, {dst},
  c8({port_high:#x}), dinc(0, {last_port_low}), c16({DESTINATION_PORT}), c16(26), csumudp(14, 34),
  fill(0x42, 18)
}}
",
        dst_mac = mac_bytes(&flow.next_hop.0, flow.next_hop.1)?,
        src_mac = mac_bytes(&flow.client, "eth0")?,
        src = octets(flow.src),
        dst = octets(flow.dst),
        port_high = FIRST_SOURCE_PORT >> 8,
        last_port_low = SOURCE_PORTS - 1,
    ))
}

/// Packets received on the server pod's eth0.
fn rx_packets(ns: &str) -> Result<u64> {
    rx_counter(ns, 1)
}

/// Bytes received on the server pod's eth0: unlike packets, the same
/// whether the sender's stack merged segments (GSO) or not.
fn rx_bytes(ns: &str) -> Result<u64> {
    rx_counter(ns, 0)
}

/// Receive counter `field` (0 bytes, 1 packets) of eth0 in netns `ns`.
fn rx_counter(ns: &str, field: usize) -> Result<u64> {
    // /proc/thread-self/net follows the calling thread's netns.
    let dev = netns::run_in(ns, || fs::read_to_string("/proc/thread-self/net/dev"))??;
    let line = dev
        .lines()
        .find(|l| l.trim_start().starts_with("eth0:"))
        .context("no eth0")?;
    let fields: Vec<&str> = line
        .split(':')
        .nth(1)
        .context("malformed")?
        .split_whitespace()
        .collect();
    fields
        .get(field)
        .context("no receive counter")?
        .parse()
        .context("a receive counter")
}

/// Runs the generator and returns the median rate seen at the server.
/// The server pod drops every frame at its netdev ingress hook, after its
/// interface counted it: the sink then costs the same in every setup (a UDP
/// socket or an ICMP error would not, and the no-NAT setup would drop them
/// as martians).
fn measure(flow: &Flow) -> Result<Vec<f64>> {
    let sink = format!("{}/sink.nft", lab::STATE_DIR);
    fs::write(
        &sink,
        "table netdev isthmus_bench_sink {\n  chain in {\n    type filter hook ingress device \"eth0\" priority 0;\n    meta protocol ip ip protocol udp drop\n  }\n}\n",
    )?;
    run("ip", &["netns", "exec", &flow.server, "nft", "-f", &sink])?;
    let rate = generate(flow);
    run(
        "ip",
        &[
            "netns",
            "exec",
            &flow.server,
            "nft",
            "delete table netdev isthmus_bench_sink",
        ],
    )?;
    rate
}

fn generate(flow: &Flow) -> Result<Vec<f64>> {
    let conf = format!("{}/bench.trafgen", lab::STATE_DIR);
    fs::write(&conf, trafgen_config(flow)?)?;
    let mut generator = Command::new("timeout")
        .args([GENERATOR_MAX_SECONDS, "ip", "netns", "exec", &flow.client])
        .args([
            "trafgen",
            "--dev",
            "eth0",
            "--conf",
            &conf,
            "--cpus",
            "1",
            "--num",
            GENERATOR_MAX_PACKETS,
        ])
        .stdout(Stdio::null())
        .stderr(fs::File::create(format!("{}/trafgen.log", lab::STATE_DIR))?)
        .spawn()
        .context("starting trafgen")?;
    let result = windows(flow, &mut generator);
    // Ends only the generator this function started, by PID.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(generator.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = generator.wait();
    let rates = result?;
    let shown: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    println!("bench:   {} pps", shown.join(", "));
    Ok(rates)
}

/// Packets that must arrive before measuring: proof the path carries the flow.
const PATH_PROOF: u64 = 1000;

fn windows(flow: &Flow, generator: &mut std::process::Child) -> Result<Vec<f64>> {
    let start = rx_packets(&flow.server)?;
    let proven = || {
        if let Some(status) = generator.try_wait()? {
            let log =
                fs::read_to_string(format!("{}/trafgen.log", lab::STATE_DIR)).unwrap_or_default();
            bail!("trafgen exited ({status}): {log}");
        }
        Ok((rx_packets(&flow.server)? >= start + PATH_PROOF).then_some(()))
    };
    let what = format!("{PATH_PROOF} packets reach {}", flow.server);
    wait::try_poll(
        Duration::from_secs(5),
        Duration::from_millis(10),
        &what,
        proven,
    )
    .context("the path is broken")?;
    if let Some(to) = flow.answer_to {
        answer(flow, to)?;
    }
    std::thread::sleep(WARMUP);
    (0..WINDOWS)
        .map(|_| {
            let (t0, n0) = (Instant::now(), rx_packets(&flow.server)?);
            std::thread::sleep(WINDOW);
            let (t1, n1) = (Instant::now(), rx_packets(&flow.server)?);
            Ok((n1 - n0) as f64 / (t1 - t0).as_secs_f64())
        })
        .collect()
}

fn agent_rss_mib(node: &str) -> Result<f64> {
    rss_mib(lab::agent_pid(node).context("agent not running")?)
}

/// CPU seconds (user and system, every thread) process `pid` has used.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which may hold spaces: state is
    // the first, utime and stime (fields 14 and 15) the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .context("an unreadable /proc/PID/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let per_second =
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("no clock tick rate")?;
    Ok(ticks / per_second as f64)
}

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> Result<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kib / 1024.0)
}

/// The peer ID the kernel's peer table holds for network `view`.
fn peer_id(peers: &HashMap<MapData, PeerKey, PeerNat>, view: ipnet::Ipv4Net) -> Option<u32> {
    let key = PeerKey::of(Be32::from(view.network()), view.prefix_len());
    peers.get(&key, 0).ok().map(|nat| nat.peer_id)
}

/// Whether the NatMapping table sends peer `peer_id`'s `external` to `endpoint`.
fn maps_to(
    table: &HashMap<MapData, MappingKey, Be32>,
    peer_id: u32,
    external: std::net::Ipv4Addr,
    endpoint: std::net::Ipv4Addr,
) -> bool {
    let key = MappingKey {
        peer_id,
        addr: Be32::from(external),
    };
    table.get(&key, 0).ok() == Some(Be32::from(endpoint))
}

/// A RESULT line comparing `ours` with `peer` round by round (`ours[i]`
/// and `peer[i]` measured in round `i`): the median of each, and the
/// median, least and greatest of the per-round ratios. Prints it and
/// returns it for the report.
fn ratio_line(name: &str, ours: &[f64], peer: &[f64], decimals: usize) -> String {
    let ratios: Vec<f64> = ours.iter().zip(peer).map(|(o, p)| o / p).collect();
    let (lo, hi) = ratios
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
            (lo.min(*r), hi.max(*r))
        });
    let line = format!(
        "RESULT name={name} isthmus={:.decimals$} peer={:.decimals$} ratio={} min={} max={} rounds={}\n",
        median(ours),
        median(peer),
        format_ratio(median(&ratios)),
        format_ratio(lo),
        format_ratio(hi),
        ratios.len()
    );
    print!("{line}");
    line
}

/// A ratio with three decimals, or in scientific notation where three
/// decimals would print a thousandfold speed-up as 0.000.
fn format_ratio(ratio: f64) -> String {
    if ratio.abs() < 0.01 {
        format!("{ratio:.3e}")
    } else {
        format!("{ratio:.3}")
    }
}

/// The `p`th percentile of `values`, by rank.
fn percentile(values: &[f64], p: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}
