//! `cargo xtask bench tunnel`: a-pod1 → b-pod1 through the gateways, with
//! the agents' embedded WireGuard and with each other userspace WireGuard
//! in its place ([`Implementation::ALL`]), on one lab, with the same pods,
//! MTU and iperf3 settings. The setups take turns round by round, so that
//! a slow minute of the shared machine falls on all of them.

use std::{
    fs,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use isthmus_lab::{
    lab::{self, LabTunnel, external_tunnel::Implementation},
    probe::Lost,
    topology::A,
    wait,
};

use super::{
    IPERF_SECONDS, ceiling,
    gateways::{peers_programmed, synthetic_peers},
    iperf, iperf3, on_lab,
    packets::rx_bytes,
    stats::{agent_rss_mib, median, ratio_line},
    write_section,
};

/// Idle memory budget of a gateway agent with 100 tunnel peers.
const TUNNEL_RSS_BUDGET_MIB: f64 = 64.0;
/// Rounds in which every setup takes its turn; each figure is the median
/// of its rounds.
const ROUNDS: usize = 5;
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
    /// A kernel VXLAN tunnel in clear in its place: the path without
    /// encryption, the reference of the ceiling.
    Clear,
}

impl Setup {
    /// Every setup, in the order of their turns.
    fn all() -> Vec<Setup> {
        [false, true]
            .map(|guard| Setup::Embedded { guard })
            .into_iter()
            .chain(Implementation::ALL.map(Setup::Other))
            .chain([Setup::Clear])
            .collect()
    }

    fn name(self) -> Result<String> {
        Ok(match self {
            Setup::Embedded { guard: false } => "embedded tunnel".into(),
            Setup::Embedded { guard: true } => "embedded tunnel, XDP guard on the uplink".into(),
            Setup::Other(imp) => imp.version()?,
            Setup::Clear => "in clear (kernel VXLAN), no encryption".into(),
        })
    }

    /// Puts this tunnel between the gateways.
    fn apply(self) -> Result<()> {
        match self {
            Setup::Embedded { guard } => lab::set_gateway_tunnel(LabTunnel::Userspace, guard),
            Setup::Other(imp) => lab::set_gateway_tunnel(LabTunnel::running(imp), false),
            Setup::Clear => lab::set_gateway_tunnel(LabTunnel::Clear, false),
        }
    }
}

/// What one turn of a setup measured.
#[derive(Clone, Copy)]
struct Turn {
    /// TCP throughput in Gbit/s with 1 and with 4 streams.
    gbps: [f64; 2],
    /// UDP: thousands of packets per second received, and the share lost.
    udp: [f64; 2],
    /// The medians of the turn's RTT rounds' p50 and p99, in microseconds.
    rtt: [f64; 2],
    /// RTT p50 and p99 of another pod pair while the 1-stream TCP run
    /// fills the tunnel, in microseconds.
    loaded_rtt: [f64; 2],
    /// Busy CPU seconds of the whole machine (every core, softirq and irq
    /// included) per gigabyte of the turn's TCP runs, less what the idle
    /// lab uses in the same time.
    cpu_s_per_gb: f64,
}

/// One figure of a turn.
type Metric = fn(&Turn) -> f64;

/// The figures compared with the best of the others: name, figure, and
/// whether lower is better.
const METRICS: [(&str, Metric, bool); 8] = [
    ("tunnel-tcp-1stream-gbps", |t| t.gbps[0], false),
    ("tunnel-tcp-4streams-gbps", |t| t.gbps[1], false),
    ("tunnel-udp-1400b-kpps", |t| t.udp[0], false),
    ("tunnel-rtt-p50-us", |t| t.rtt[0], true),
    ("tunnel-rtt-p99-us", |t| t.rtt[1], true),
    ("tunnel-rtt-under-bulk-p50-us", |t| t.loaded_rtt[0], true),
    ("tunnel-rtt-under-bulk-p99-us", |t| t.loaded_rtt[1], true),
    ("tunnel-cpu-machine-s-per-gb", |t| t.cpu_s_per_gb, true),
];

/// `metric` of each of `turns`, round by round.
fn series(turns: &[Turn], metric: Metric) -> Vec<f64> {
    turns.iter().map(metric).collect()
}

/// The median over rounds of `metric`.
fn figure(turns: &[Turn], metric: Metric) -> f64 {
    median(&series(turns, metric))
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
        let idle = idle_busy_share()?;
        println!(
            "bench: the idle lab keeps {:.1}% of a CPU busy",
            idle * 100.0
        );
        let mut turns: Vec<Vec<Turn>> = setups.iter().map(|_| Vec::new()).collect();
        let mut seals = Vec::new();
        for round in 1..=ROUNDS {
            seals.push(ceiling::seal_gbps()?);
            println!(
                "bench: round {round}/{ROUNDS}: one core seals {:.2} Gbit/s of {}-byte packets",
                seals[round - 1],
                1420
            );
            for (setup, turns) in setups.iter().zip(&mut turns) {
                println!("bench: round {round}/{ROUNDS}, {}", setup.name()?);
                setup.apply()?;
                turns.push(take_turn(idle)?);
            }
        }
        Setup::Embedded { guard: false }.apply()?;
        let rss = tunnel_rss_with_peers(100)?;
        let measured: Vec<(Setup, Vec<Turn>)> = setups.into_iter().zip(turns).collect();
        report(&measured, rss, idle, &seals)
    })
}

/// How long the idle lab is watched for its own CPU use.
const IDLE_WINDOW: Duration = Duration::from_secs(3);

/// The share of a CPU the lab keeps busy with no traffic: agents,
/// keepalives, the machine's own work.
fn idle_busy_share() -> Result<f64> {
    let (t0, busy0) = (Instant::now(), machine_busy_seconds()?);
    std::thread::sleep(IDLE_WINDOW);
    Ok((machine_busy_seconds()? - busy0) / t0.elapsed().as_secs_f64())
}

/// Busy CPU seconds of the whole machine since boot, every core: user,
/// nice, system, irq, softirq and steal time (`/proc/stat`).
fn machine_busy_seconds() -> Result<f64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse::<f64>)
        .collect::<Result<_, _>>()?;
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: f64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| ticks.get(*i))
        .sum();
    let per_second =
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("no clock tick rate")?;
    Ok(busy / per_second as f64)
}

/// One turn of the tunnel that carries the traffic now: a TCP run with 1
/// and with 4 streams, a UDP run and [`RTT_ROUNDS_PER_TURN`] RTT rounds.
/// `idle` is the share of a CPU the idle lab keeps busy.
fn take_turn(idle: f64) -> Result<Turn> {
    let row = &isthmus_lab::topology::reachability()[0];
    let (client, server, target) = (&row.from, &row.answered_by, row.target);
    let (t0, busy0) = (Instant::now(), machine_busy_seconds()?);
    let (one_stream, loaded_rtt) = std::thread::scope(|scope| {
        let bulk = scope.spawn(|| iperf(client, server, target, 1));
        let loaded = rtt_under(&bulk, server);
        let bulk = bulk.join().expect("the iperf3 thread");
        (bulk, loaded)
    });
    let gbps = [one_stream?, iperf(client, server, target, 4)?];
    let loaded_rtt = loaded_rtt?;
    let busy = machine_busy_seconds()? - busy0 - idle * t0.elapsed().as_secs_f64();
    let gigabytes = gbps.iter().sum::<f64>() * IPERF_SECONDS.parse::<f64>()? / 8.0;
    let cpu_s_per_gb = busy / gigabytes;
    let (kpps, loss) = udp(client, server, target)?;
    let rtt = rtt(client, server, target)?;
    println!(
        "bench:   TCP {:.2} / {:.2} Gbit/s, UDP {kpps:.0} kpps ({loss:.1}% lost), RTT p50 {} µs, under bulk p50/p99 {:.0}/{:.0} µs, {:.2} CPU s/GB",
        gbps[0],
        gbps[1],
        listed(&column(0, &rtt)),
        loaded_rtt[0],
        loaded_rtt[1],
        cpu_s_per_gb,
    );
    Ok(Turn {
        gbps,
        udp: [kpps, loss],
        rtt: [median(&column(0, &rtt)), median(&column(1, &rtt))],
        loaded_rtt,
        cpu_s_per_gb,
    })
}

/// Bytes the bulk transfer's server must have received before the probe
/// starts (0.2 s at 1 Gbit/s): proof that the transfer fills the tunnel.
const BULK_UNDER_WAY: u64 = 25_000_000;
/// Ping-pongs under the bulk transfer: few enough to end within it, as
/// each waits behind the tunnel's queue.
const LOADED_SAMPLES: usize = 200;

/// One round of RTT ping-pongs from a-pod2 to b-pod2 (reachability row 2)
/// while `bulk` sends to `server` through the same tunnel: its p50 and p99.
/// Fails if the transfer ended before the probe did.
fn rtt_under(
    bulk: &std::thread::ScopedJoinHandle<'_, Result<f64>>,
    server: &str,
) -> Result<[f64; 2]> {
    let start = rx_bytes(server)?;
    wait::try_poll(
        Duration::from_secs(5),
        Duration::from_millis(10),
        "the bulk transfer under way",
        || Ok((rx_bytes(server)? >= start + BULK_UNDER_WAY).then_some(())),
    )?;
    let row = &isthmus_lab::topology::reachability()[1];
    let [round] = isthmus_lab::probe::round_trips(
        &row.from,
        &row.answered_by,
        row.target,
        1,
        LOADED_SAMPLES,
        Lost::Waited,
    )?[..] else {
        bail!("one RTT round asked for, another count given");
    };
    if bulk.is_finished() {
        bail!("the bulk transfer ended before the RTT probe under it did");
    }
    Ok(round)
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
    isthmus_lab::probe::round_trips(
        client,
        server,
        target,
        RTT_ROUNDS_PER_TURN,
        RTT_SAMPLES,
        Lost::Fails,
    )
}

/// Resident memory of a-gw's agent once it runs `count` tunnel peers.
fn tunnel_rss_with_peers(count: usize) -> Result<f64> {
    let dir = lab::object_dir(&A.gw());
    for (i, yaml) in synthetic_peers(&A, count)?.iter().enumerate() {
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

/// The other implementation with the best median of `metric`: the
/// highest, or the lowest where `lower_is_better`.
fn best<'a>(
    others: &[(Implementation, &'a [Turn])],
    metric: Metric,
    lower_is_better: bool,
) -> Option<(Implementation, &'a [Turn])> {
    let better = |a: &(Implementation, &[Turn]), b: &(Implementation, &[Turn])| {
        let (fa, fb) = (figure(a.1, metric), figure(b.1, metric));
        if lower_is_better {
            fb.total_cmp(&fa)
        } else {
            fa.total_cmp(&fb)
        }
    };
    others.iter().copied().max_by(better)
}

/// Prints the `RESULT` lines and writes the section of docs/benchmarks.md.
fn report(measured: &[(Setup, Vec<Turn>)], rss: f64, idle: f64, seals: &[f64]) -> Result<()> {
    let embedded = |with_guard: bool| {
        measured
            .iter()
            .find(|(s, _)| matches!(s, Setup::Embedded { guard } if *guard == with_guard))
            .map(|(_, t)| t.as_slice())
            .context("the embedded tunnel was not measured")
    };
    let (ours, guarded) = (embedded(false)?, embedded(true)?);
    let others: Vec<(Implementation, &[Turn])> = measured
        .iter()
        .filter_map(|(s, t)| match s {
            Setup::Other(imp) => Some((*imp, t.as_slice())),
            Setup::Embedded { .. } | Setup::Clear => None,
        })
        .collect();
    let mut lines = String::new();
    for (imp, theirs) in &others {
        for (name, metric, _) in &METRICS[..2] {
            lines += &ratio_line(
                &format!("{name}-vs-{}", imp.name()),
                &series(ours, *metric),
                &series(theirs, *metric),
                3,
            );
        }
    }
    let mut best_of = String::new();
    for (name, metric, lower_is_better) in METRICS {
        let Some((imp, theirs)) = best(&others, metric, lower_is_better) else {
            continue;
        };
        best_of += &format!("- `{name}`: {}\n", imp.name());
        lines += &ratio_line(
            &format!("{name}-vs-best"),
            &series(ours, metric),
            &series(theirs, metric),
            3,
        );
    }
    let tcp_1 = METRICS[0].1;
    let clear = measured
        .iter()
        .find(|(s, _)| matches!(s, Setup::Clear))
        .map(|(_, t)| series(t, tcp_1))
        .context("the path in clear was not measured")?;
    let ceilings: Vec<f64> = clear
        .iter()
        .zip(seals)
        .map(|(clear, seal)| ceiling::ceiling(*clear, *seal))
        .collect();
    lines += &ratio_line(
        "tunnel-tcp-1stream-vs-ceiling",
        &series(ours, tcp_1),
        &ceilings,
        3,
    );
    lines += &ratio_line(
        "tunnel-tcp-1stream-gbps-xdp-guard-vs-none",
        &series(guarded, tcp_1),
        &series(ours, tcp_1),
        3,
    );
    lines += &ratio_line(
        "agent-rss-mib-100-tunnel-peers-vs-budget",
        &[rss],
        &[TUNNEL_RSS_BUDGET_MIB],
        3,
    );
    let mut table = String::from(
        "| setup | TCP 1 stream | TCP 4 streams | UDP 1,400 B | UDP lost | RTT p50 | RTT p99 | RTT p50 / p99 under bulk | CPU, whole machine |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (setup, turns) in measured {
        let f = |metric: Metric| figure(turns, metric);
        table.push_str(&format!(
            "| {} | {:.2} Gbit/s | {:.2} Gbit/s | {:.0} kpps | {:.1} % | {:.0} µs | {:.0} µs | {:.0} / {:.0} µs | {:.2} s/GB |\n",
            setup.name().unwrap_or_default(),
            f(|t| t.gbps[0]),
            f(|t| t.gbps[1]),
            f(|t| t.udp[0]),
            f(|t| t.udp[1]),
            f(|t| t.rtt[0]),
            f(|t| t.rtt[1]),
            f(|t| t.loaded_rtt[0]),
            f(|t| t.loaded_rtt[1]),
            f(|t| t.cpu_s_per_gb),
        ));
    }
    let idle = idle * 100.0;
    let seal = median(seals);
    let bulk = BULK_UNDER_WAY;
    let timeout = isthmus_lab::probe::ECHO_TIMEOUT.as_millis();
    let most_lost = Lost::Waited.most_percent();
    let section = format!(
        "## Tunnel: a-pod1 to b-pod1 through the gateways

`cargo xtask bench tunnel` compares the agents' embedded WireGuard
with each other userspace WireGuard in its place (configured with `wg`
from the same keys, the agents NATting on its device) on one lab, with
the same pods, MTU (1,420) and iperf3 settings. The setups take turns:
in each of {ROUNDS} rounds, each setup in turn gets the gateways (their
agents restarted, the other WireGuard started in place of the embedded
one), so that a slow minute of the shared machine falls on all of them.
A turn runs TCP over {IPERF_SECONDS} s, with 1 and with 4 streams. It runs
UDP of 1,400-byte packets as fast as iperf3 sends them: packets per second
received, and the share lost. It runs {RTT_ROUNDS_PER_TURN} rounds of
{RTT_SAMPLES} UDP ping-pongs, one at a time, each from a socket of its
own. A round's source port decides which TUN queue, and so which thread,
carries it. Each figure is the median of the rounds (of the RTT
rounds' p50 and p99). Under bulk: a round of {LOADED_SAMPLES} ping-pongs, a-pod2 to
b-pod2 through the same tunnel, while the 1-stream TCP run is under way
(it has delivered {bulk} bytes, and still runs when the round ends); an
echo that does not come back within {timeout} ms counts as {timeout} ms, and
more than {most_lost}% lost fails the turn.
CPU is the whole machine's busy time during the
turn's TCP runs (`/proc/stat`: every core; user, system, irq, softirq and
steal, so softirq work counts wherever it lands), less what the idle lab
used in the same time ({idle:.1}% of a CPU, measured before the rounds),
per gigabyte carried. Both gateways, both pods and the generator share
the machine's 2 CPUs, so throughput is bounded by CPU, and CPU per
gigabyte says what each byte costs. Each RESULT line gives the median
over rounds of the ratio of the two setups' figures in the same round,
with the least and greatest of those ratios. The best of the others, by
median, for each `-vs-best` line:

{best_of}

{table}
Gateway agent resident memory with 100 tunnel peers: {rss:.1} MiB.

The row in clear is a kernel VXLAN tunnel in the WireGuards' place (same
device name, MTU 1,420, routes, pods and NAT, no encryption): what the
path itself allows. Before each round, one core seals 1,420-byte packets
with ChaCha20-Poly1305 (`ring`, as boringtun's data path does) for a
second; the median was {seal:.2} Gbit/s. Each round's ceiling is then
`1 / (1/clear + 2/seal)`, the path in clear plus one seal and one open per
packet, and `tunnel-tcp-1stream-vs-ceiling` says how far the
embedded tunnel is from it.

The embedded tunnel is compared as the agent runs by default, without
the XDP guard of the tunnel port (`--guard-dev`), which none of the
others has; its row with the guard shows what the guard costs here. On a
veth, as the lab's uplinks are, a native XDP program turns the device's
receive path into NAPI and copies every UDP GSO train into page-pool
pages before the program sees it (`veth_xdp_rcv_skb`,
`skb_pp_cow_data`).

The targets: TCP at least 2.0× wireguard-go 0.0.20231211,
1 and 4 streams; at least 0.8 of the ceiling; whole-machine CPU per
gigabyte at most 0.6× the best of the others.

```
{lines}```
"
    );
    write_section("tunnel", &section)
}
