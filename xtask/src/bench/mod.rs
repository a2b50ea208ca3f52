//! `cargo xtask bench`: this project against the peers named in the issues,
//! in one run, on the lab's own path.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

mod burner;
mod ceiling;
mod chart;
mod conntrack;
mod control;
mod crr;
mod failover;
mod gateways;
mod guard;
mod hub;
mod idle;
mod isolation;
mod kube;
mod liqo_v0_10;
mod nat;
mod nat6;
mod overlay;
mod packets;
mod program_run;
mod program_time;
mod stats;
mod tunnel;
mod tunnel6;
mod wg_peers;

use anyhow::{Context, Result};

use clap::Subcommand;

use isthmus_lab::{cmd::run, lab, netns, wait};

/// Which benchmark to run.
#[derive(Subcommand)]
pub enum Which {
    /// 64-byte UDP packets per second through the gateways: no NAT, Isthmus,
    /// and the iptables NETMAP rules Liqo installs, with 1 and 200 peers, on
    /// nodes with kube-proxy's rules and on bare ones; and Isthmus
    /// segregating a peer with 10,000 allowed endpoints.
    Nat {
        /// Another build of the agent (an earlier commit's
        /// `target/release/isthmus-agent`), measured with one peer in the
        /// same interleaved rounds: what a change costs.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// The smallest IPv6 UDP packets per second through the gateways of
    /// the dual-stack lab: plain IPv6 forwarding, Isthmus with 1 and 200
    /// peers, and the ip6tables NETMAP and MASQUERADE rules a user would
    /// write for 200 peers.
    Nat6,
    /// TCP and UDP throughput, round-trip time and CPU per gigabyte from
    /// a-pod1 to b-pod1 through the embedded tunnel, and through each other
    /// userspace WireGuard in its place: wireguard-go (bookworm and
    /// bookworm-backports), gotatun-cli and boringtun-cli.
    Tunnel,
    /// TCP from a-pod1 to b-pod1 through the embedded tunnel of the
    /// dual-stack lab, the a–b tunnel over the WAN's IPv6 addresses and
    /// over its IPv4 ones in turns.
    Tunnel6,
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
        Which::Nat6,
        Which::Tunnel,
        Which::Tunnel6,
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
            Which::Nat6 => "nat6",
            Which::Tunnel => "tunnel",
            Which::Tunnel6 => "tunnel6",
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
        Which::Nat6 => on_lab_setup(
            &lab::Setup {
                dual_stack: true,
                ..lab::Setup::with_tunnel(lab::LabTunnel::None)
            },
            nat6::run_nat6,
        ),
        Which::Tunnel => tunnel::run_tunnel(),
        Which::Tunnel6 => on_lab_setup(
            &lab::Setup {
                dual_stack: true,
                ..lab::Setup::default()
            },
            tunnel6::run_tunnel6,
        ),
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
    on_lab_setup(&lab::Setup::with_tunnel(tunnel), measure)
}

/// As [`on_lab`], with the lab of `setup`.
fn on_lab_setup<T>(setup: &lab::Setup, measure: impl FnOnce() -> Result<T>) -> Result<T> {
    lab::up(setup)?;
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
