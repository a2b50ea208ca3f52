//! `cargo xtask bench tunnel`: a-pod1 → b-pod1 through the gateways, with
//! the agents' embedded WireGuard and with each other userspace WireGuard
//! in its place ([`Implementation::ALL`]), on one lab, with the same pods,
//! MTU and iperf3 settings. The setups take turns round by round, so that
//! a slow minute of the shared machine falls on all of them.

use std::{fs, time::Duration};

use anyhow::{Context, Result};
use xtask::{
    lab::{self, LabTunnel, external_tunnel::Implementation},
    topology::{A, B, Cluster},
    wait,
};

use super::{
    IPERF_SECONDS, agent_rss_mib, cpu_seconds, iperf, iperf3, median, on_lab, peers_programmed,
    result_lines, synthetic_peers, write_section,
};

/// Idle memory budget of a gateway agent with 100 tunnel peers.
const TUNNEL_RSS_BUDGET_MIB: f64 = 64.0;
/// Rounds in which every setup takes its turn; each figure is the median
/// of its rounds.
const ROUNDS: usize = 3;
/// Rounds of UDP ping-pongs per turn, each from a socket of its own: a
/// round's source port decides which TUN queue, and so which of a
/// multi-queue tunnel's threads, carries it.
const RTT_ROUNDS_PER_TURN: usize = 3;
/// Ping-pongs per RTT round.
const RTT_SAMPLES: usize = 1000;
/// The UDP test's packets: 1,400 bytes on the pods' wire, which the
/// tunnels' MTU of 1,420 carries whole.
const UDP_PAYLOAD: &str = "1372";

/// One tunnel between the gateways.
#[derive(Clone, Copy)]
enum Setup {
    /// The agents' embedded WireGuard, with the XDP guard of the tunnel
    /// port on the uplink or without.
    Embedded { guard: bool },
    /// Another userspace WireGuard in its place.
    Other(Implementation),
}

impl Setup {
    /// Every setup, in the order of their turns.
    fn all() -> Vec<Setup> {
        [false, true]
            .map(|guard| Setup::Embedded { guard })
            .into_iter()
            .chain(Implementation::ALL.map(Setup::Other))
            .collect()
    }

    fn name(self) -> Result<String> {
        Ok(match self {
            Setup::Embedded { guard: false } => "embedded tunnel".into(),
            Setup::Embedded { guard: true } => "embedded tunnel, XDP guard on the uplink".into(),
            Setup::Other(imp) => imp.version()?,
        })
    }

    /// Puts this tunnel between the gateways.
    fn apply(self) -> Result<()> {
        match self {
            Setup::Embedded { guard } => lab::set_gateway_tunnel(LabTunnel::Userspace, guard),
            Setup::Other(imp) => lab::set_gateway_tunnel(LabTunnel::running(imp), false),
        }
    }

    /// The process that carries the tunnel on `cluster`'s gateway.
    fn pid_on(self, cluster: &Cluster) -> Result<u32> {
        match self {
            Setup::Embedded { .. } => lab::agent_pid(&cluster.gw()),
            Setup::Other(_) => lab::external_tunnel::pid_on(cluster),
        }
        .with_context(|| format!("no tunnel runs on {}", cluster.gw()))
    }
}

/// What one setup's turns measured.
#[derive(Default)]
struct Samples {
    /// TCP throughput in Gbit/s with 1 and with 4 streams.
    gbps: [Vec<f64>; 2],
    /// UDP: thousands of packets per second received, and the share lost.
    udp: Vec<[f64; 2]>,
    /// p50 and p99 of each RTT round, in microseconds.
    rtt: Vec<[f64; 2]>,
    /// CPU seconds of the tunnel's process on a-gw and on b-gw during the
    /// TCP runs, and the gigabytes those carried.
    cpu_s: [f64; 2],
    gigabytes: f64,
}

/// What one tunnel setup achieved: the medians of its rounds.
struct TunnelFigures {
    gbps_1: f64,
    gbps_4: f64,
    udp_kpps: f64,
    udp_loss_percent: f64,
    rtt_p50_us: f64,
    rtt_p99_us: f64,
    /// CPU seconds the tunnel's process on a-gw and on b-gw spent per
    /// gigabyte of the TCP runs.
    cpu_s_per_gb: [f64; 2],
}

impl TunnelFigures {
    /// Both gateways' CPU per gigabyte: the cost of carrying it end to end.
    fn cpu_total(&self) -> f64 {
        self.cpu_s_per_gb.iter().sum()
    }
}

impl Samples {
    fn figures(&self) -> TunnelFigures {
        TunnelFigures {
            gbps_1: median(&self.gbps[0]),
            gbps_4: median(&self.gbps[1]),
            udp_kpps: median(&column(0, &self.udp)),
            udp_loss_percent: median(&column(1, &self.udp)),
            rtt_p50_us: median(&column(0, &self.rtt)),
            rtt_p99_us: median(&column(1, &self.rtt)),
            cpu_s_per_gb: self.cpu_s.map(|s| s / self.gigabytes),
        }
    }
}

/// Field `i` of each sample.
fn column(i: usize, samples: &[[f64; 2]]) -> Vec<f64> {
    samples.iter().map(|s| s[i]).collect()
}

/// Figures rounded to whole units, as a line of the output lists them.
fn listed(values: &[f64]) -> String {
    let shown: Vec<String> = values.iter().map(|v| format!("{v:.0}")).collect();
    shown.join(" ")
}

/// Runs the benchmark and records it.
pub fn run_tunnel() -> Result<()> {
    // Installing the peers takes minutes the first time: not in a lab.
    for imp in Implementation::ALL {
        imp.install()?;
    }
    let setups = Setup::all();
    on_lab(LabTunnel::Userspace, || {
        let mut samples: Vec<Samples> = setups.iter().map(|_| Samples::default()).collect();
        for round in 1..=ROUNDS {
            for (setup, samples) in setups.iter().zip(&mut samples) {
                println!("bench: round {round}/{ROUNDS}, {}", setup.name()?);
                setup.apply()?;
                take_turn(*setup, samples)?;
            }
        }
        let mut figures = Vec::new();
        for (setup, samples) in setups.iter().zip(&samples) {
            println!(
                "bench: {}: RTT rounds, p50 µs: {}; p99 µs: {}",
                setup.name()?,
                listed(&column(0, &samples.rtt)),
                listed(&column(1, &samples.rtt))
            );
            figures.push((*setup, samples.figures()));
        }
        Setup::Embedded { guard: false }.apply()?;
        let rss = tunnel_rss_with_peers(100)?;
        report(&figures, rss)
    })
}

/// One turn of `setup`, which carries the traffic now: a TCP run with 1
/// and with 4 streams, a UDP run and [`RTT_ROUNDS_PER_TURN`] RTT rounds.
fn take_turn(setup: Setup, samples: &mut Samples) -> Result<()> {
    let row = &xtask::topology::reachability()[0];
    let (client, server, target) = (&row.from, &row.answered_by, row.target);
    let pids = [setup.pid_on(&A)?, setup.pid_on(&B)?];
    let cpu = || -> Result<[f64; 2]> { Ok([cpu_seconds(pids[0])?, cpu_seconds(pids[1])?]) };
    let before = cpu()?;
    let mut gbps = [0.0; 2];
    for (i, streams) in [1, 4].into_iter().enumerate() {
        gbps[i] = iperf(client, server, target, streams)?;
        samples.gbps[i].push(gbps[i]);
    }
    let after = cpu()?;
    for i in 0..2 {
        samples.cpu_s[i] += after[i] - before[i];
    }
    samples.gigabytes += gbps.iter().sum::<f64>() * IPERF_SECONDS.parse::<f64>()? / 8.0;
    let (kpps, loss) = udp(client, server, target)?;
    samples.udp.push([kpps, loss]);
    let rtt = rtt(client, server, target)?;
    println!(
        "bench:   TCP {:.2} / {:.2} Gbit/s, UDP {kpps:.0} kpps ({loss:.1}% lost), RTT p50 {} µs",
        gbps[0],
        gbps[1],
        listed(&column(0, &rtt)),
    );
    samples.rtt.extend(rtt);
    Ok(())
}

/// UDP of 1,400-byte packets from `client` to `target` as fast as iperf3
/// sends: packets per second received, in thousands, and the share lost.
fn udp(client: &str, server: &str, target: std::net::Ipv4Addr) -> Result<(f64, f64)> {
    let report = iperf3(
        client,
        server,
        target,
        &["-u", "-b", "0", "-l", UDP_PAYLOAD],
    )?;
    let sum = &report["end"]["sum"];
    let field = |name: &str| {
        sum[name]
            .as_f64()
            .with_context(|| format!("no end.sum.{name} in iperf3's UDP report"))
    };
    let received = field("packets")? - field("lost_packets")?;
    Ok((received / field("seconds")? / 1e3, field("lost_percent")?))
}

/// [`RTT_ROUNDS_PER_TURN`] rounds of [`RTT_SAMPLES`] UDP ping-pongs: each
/// round's p50 and p99, in microseconds.
fn rtt(client: &str, server: &str, target: std::net::Ipv4Addr) -> Result<Vec<[f64; 2]>> {
    xtask::probe::round_trips(client, server, target, RTT_ROUNDS_PER_TURN, RTT_SAMPLES)
}

/// Resident memory of a-gw's agent once it runs `count` tunnel peers.
fn tunnel_rss_with_peers(count: usize) -> Result<f64> {
    let dir = lab::object_dir(&A.gw());
    for (i, yaml) in synthetic_peers(&A, count).iter().enumerate() {
        fs::write(dir.join(format!("bench-{i}.yaml")), yaml)?;
    }
    wait::try_poll(
        Duration::from_secs(30),
        Duration::from_millis(20),
        &format!("a-gw programs {count} peers"),
        || Ok((peers_programmed(&A.gw())? == count as f64).then_some(())),
    )?;
    agent_rss_mib(&A.gw())
}

/// One figure of a setup.
type Metric = fn(&TunnelFigures) -> f64;

/// The best `metric` among the other implementations: the highest, or the
/// lowest where `lower_is_better`.
fn best(peers: &[(Implementation, &TunnelFigures)], metric: Metric, lower_is_better: bool) -> f64 {
    let values = peers.iter().map(|(_, f)| metric(f));
    let pick = if lower_is_better { f64::min } else { f64::max };
    values.reduce(pick).unwrap_or(f64::NAN)
}

/// Prints the `RESULT` lines and writes the section of docs/benchmarks.md.
fn report(figures: &[(Setup, TunnelFigures)], rss: f64) -> Result<()> {
    let embedded = |with_guard: bool| {
        figures
            .iter()
            .find(|(s, _)| matches!(s, Setup::Embedded { guard } if *guard == with_guard))
            .map(|(_, f)| f)
            .context("the embedded tunnel was not measured")
    };
    let (ours, guarded) = (embedded(false)?, embedded(true)?);
    let peers: Vec<(Implementation, &TunnelFigures)> = figures
        .iter()
        .filter_map(|(s, f)| match s {
            Setup::Other(imp) => Some((*imp, f)),
            Setup::Embedded { .. } => None,
        })
        .collect();
    let peers = &peers[..];
    let mut results: Vec<(String, f64, f64)> = Vec::new();
    for (imp, theirs) in peers {
        let name = imp.name();
        results.push((
            format!("tunnel-tcp-1stream-gbps-vs-{name}"),
            ours.gbps_1,
            theirs.gbps_1,
        ));
        results.push((
            format!("tunnel-tcp-4streams-gbps-vs-{name}"),
            ours.gbps_4,
            theirs.gbps_4,
        ));
    }
    let metrics: [(&str, Metric, bool); 6] = [
        ("tunnel-tcp-1stream-gbps", |f| f.gbps_1, false),
        ("tunnel-tcp-4streams-gbps", |f| f.gbps_4, false),
        ("tunnel-udp-1400b-kpps", |f| f.udp_kpps, false),
        ("tunnel-rtt-p50-us", |f| f.rtt_p50_us, true),
        ("tunnel-rtt-p99-us", |f| f.rtt_p99_us, true),
        ("tunnel-cpu-s-per-gb", TunnelFigures::cpu_total, true),
    ];
    for (name, metric, lower_is_better) in metrics {
        results.push((
            format!("{name}-vs-best"),
            metric(ours),
            best(peers, metric, lower_is_better),
        ));
    }
    results.push((
        "tunnel-tcp-1stream-gbps-xdp-guard-vs-none".into(),
        guarded.gbps_1,
        ours.gbps_1,
    ));
    results.push((
        "agent-rss-mib-100-tunnel-peers-vs-budget".into(),
        rss,
        TUNNEL_RSS_BUDGET_MIB,
    ));
    let lines = result_lines(&results, 3);
    let mut table = String::from(
        "| setup | TCP 1 stream | TCP 4 streams | UDP 1,400 B | UDP lost | RTT p50 | RTT p99 | CPU a-gw | CPU b-gw |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let rows = figures
        .iter()
        .map(|(setup, f)| (setup.name().unwrap_or_default(), f));
    for (setup, f) in rows {
        table.push_str(&format!(
            "| {setup} | {:.2} Gbit/s | {:.2} Gbit/s | {:.0} kpps | {:.1} % | {:.0} µs | {:.0} µs | {:.2} s/GB | {:.2} s/GB |\n",
            f.gbps_1,
            f.gbps_4,
            f.udp_kpps,
            f.udp_loss_percent,
            f.rtt_p50_us,
            f.rtt_p99_us,
            f.cpu_s_per_gb[0],
            f.cpu_s_per_gb[1],
        ));
    }
    let section = format!(
        "## Tunnel: a-pod1 to b-pod1 through the gateways

`cargo xtask bench tunnel` compares the agents' embedded WireGuard
with each other userspace WireGuard in its place (configured with `wg`
from the same keys, the agents NATting on its device) on one lab, with
the same pods, MTU (1,420) and iperf3 settings. The setups take turns:
in each of {ROUNDS} rounds, each setup in turn gets the gateways (their
agents restarted, the other WireGuard started in place of the embedded
one), so that a slow minute of the shared machine falls on all of them.
A turn runs TCP over {IPERF_SECONDS} s with 1 and with 4 streams; UDP of
1,400-byte packets as fast as iperf3 sends them (packets per second
received, and the share lost); and {RTT_ROUNDS_PER_TURN} rounds of
{RTT_SAMPLES} UDP ping-pongs, one at a time, each from a socket of its
own (a round's source port decides which TUN queue, and so which
thread, carries it). Each figure is the median of the rounds (of the RTT
rounds' p50 and p99). CPU is the time of the tunnel's process on each
gateway (`/proc/PID/stat`, every thread, user and system) per gigabyte
of all the TCP runs. Both gateways, both pods and the generator share
the machine's 2 CPUs, so throughput is bounded by CPU, and CPU per
gigabyte says what each byte costs.

{table}
Gateway agent resident memory with 100 tunnel peers: {rss:.1} MiB.

The embedded tunnel is compared as the agent runs by default, without
the XDP guard of the tunnel port (`--guard-dev`), which none of the
others has; its row with the guard shows what the guard costs here. On a
veth, as the lab's uplinks are, a native XDP program turns the device's
receive path into NAPI and copies every UDP GSO train into page-pool
pages before the program sees it (`veth_xdp_rcv_skb`,
`skb_pp_cow_data`).

The issue's targets, against the best of the others: TCP at least 1.5×,
CPU per gigabyte at most 0.7×, RTT p50 no worse.

```
{lines}```
"
    );
    write_section("tunnel", &section)
}
