//! `cargo xtask bench conntrack`: b-gw's masquerade, on the hub path
//! a-pod2 → c-pod1 (reachability row 5, from a's gateway node), with its
//! conntrack empty, and holding 100,000 and 1,000,000 entries, at
//! capacities set by flag. For each: packets per second and connection rate
//! through the hub, the table's kernel memory as `bpftool map show` prints
//! it, and, for a full table, the agent's CPU in the steady state its
//! collector settles in, beside the targets.
//!
//! The entries are written straight into the pinned map: established TCP
//! flows, answered, of an owner that is no peer, so the collector neither
//! expires nor evicts them and a's share stays free for the measured flows.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::maps::{HashMap, MapData};
use isthmus_common::{
    conntrack::{DIR_OUT, FlowKey, FlowNat, TcpState, reply_key},
    names::{DEFAULT_CONNTRACK, MAP_CONNTRACK},
    wire::Be32,
};
use isthmus_lab::{
    cmd::run,
    lab,
    topology::{A, B, C},
};
use serde_json::Value;

use super::{
    ROUNDS, crr,
    packets::{HUB_TARGET, hub_flow},
    stats::{median, ratio_line},
    write_section,
};

/// One state of b-gw's table.
#[derive(Clone, Copy)]
struct Fill {
    /// Entries written before measuring (two per flow).
    entries: u32,
    /// `--conntrack-capacity`.
    capacity: u32,
    name: &'static str,
    /// The most of a core the agent may take holding them, in percent;
    /// the empty table's CPU is not measured.
    cpu_target: Option<f64>,
}

/// The empty table has the shipped capacity.
const FILLS: [Fill; 3] = [
    Fill {
        entries: 0,
        capacity: DEFAULT_CONNTRACK,
        name: "empty",
        cpu_target: None,
    },
    Fill {
        entries: 100_000,
        capacity: 262_144,
        name: "100k-entries",
        cpu_target: Some(0.5),
    },
    Fill {
        entries: 1_000_000,
        capacity: 2_097_152,
        name: "1m-entries",
        cpu_target: Some(2.0),
    },
];

/// The owner of the written flows: no peer has this ID.
const NO_PEER: u32 = 4000;
/// The shipped `--conntrack-gc-max-interval`: the wait between sweeps the
/// collector settles at while it finds nothing dead.
const SETTLED_INTERVAL: f64 = 60.0;
/// How long the collector may take to settle: its wait doubles from 10 s
/// at each sweep that finds nothing dead (10, 20, 40, then 60 s), and the
/// next sweep then comes within a settled interval.
const SETTLING: Duration = Duration::from_secs(200);
/// The CPU window past a settled interval: the sweep it holds ends in it.
const SWEEP_MARGIN: Duration = Duration::from_secs(2);

/// One figure of a round.
type Figure = fn(&Measured) -> f64;

/// The figures compared with the empty table: name, figure, decimals.
const FIGURES: [(&str, Figure, usize); 3] = [
    ("pps", |m| m.pps, 0),
    ("crr", |m| m.crr, 0),
    ("map-mib", |m| m.map_mib, 1),
];

/// What one fill measured in one round.
struct Measured {
    pps: f64,
    crr: f64,
    /// Connections that did not complete within 2 s.
    failed: usize,
    map_mib: f64,
    cpu_percent: f64,
}

/// Runs the bench on a lab that is up, and writes its section.
pub fn run_conntrack() -> Result<()> {
    let mut samples: Vec<Vec<Measured>> = FILLS.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        for (fill, rounds) in FILLS.iter().zip(&mut samples) {
            println!(
                "bench: round {round}/{ROUNDS}, b-gw's conntrack {}",
                fill.name
            );
            rounds.push(measure(fill)?);
        }
    }
    restore_b_gw()?;
    let mut lines = String::new();
    let empty = &samples[0];
    for (fill, rounds) in FILLS.iter().zip(&samples).skip(1) {
        for (what, figure, decimals) in FIGURES {
            let series = |set: &[Measured]| set.iter().map(figure).collect::<Vec<_>>();
            let name = format!("conntrack-{what}-{}-vs-empty", fill.name);
            lines += &ratio_line(&name, &series(rounds), &series(empty), decimals);
        }
        if let Some(target) = fill.cpu_target {
            let cpu: Vec<f64> = rounds.iter().map(|m| m.cpu_percent).collect();
            let name = format!("conntrack-agent-cpu-percent-{}-vs-target", fill.name);
            lines += &ratio_line(&name, &cpu, &vec![target; cpu.len()], 2);
        }
    }
    write_section("conntrack", &report(&samples, &lines))
}

/// Restarts b-gw's agent with the fill's capacity, writes its entries and
/// measures.
fn measure(fill: &Fill) -> Result<Measured> {
    let gw = B.gw();
    lab::stop_agent(&gw)?;
    lab::clean_up_agent(&gw)?;
    let mut args = lab::agent_args(&gw)?;
    args.push(format!("--conntrack-capacity={}", fill.capacity));
    let log = lab::log_file(&gw);
    let pid = lab::spawn_agent(&gw, &args, &log)?;
    let agent = Agent(pid);
    lab::wait_ready_in(&gw, pid, &log)?;
    write_flows(fill.entries)?;
    let cpu_percent = match fill.cpu_target {
        Some(_) => settled_cpu_percent(agent.0)?,
        None => f64::NAN,
    };
    let pps = median(&super::packets::measure(&hub_flow(Some(
        B.masquerade_addr(),
    )))?);
    let target = SocketAddrV4::new(HUB_TARGET, crr::PORT);
    let connections = crr::measure(&A.pod(2), &C.pod(1), target)?;
    let (crr, failed) = (connections.per_second, connections.failed);
    let map_mib = map_mib()?;
    println!(
        "bench:   {pps:.0} pps, {crr:.0} connections/s ({failed} failed), table {map_mib:.1} MiB, agent {cpu_percent:.2}% of a core"
    );
    Ok(Measured {
        pps,
        crr,
        failed,
        map_mib,
        cpu_percent,
    })
}

/// b-gw's agent this bench started, stopped by PID when dropped.
struct Agent(u32);

impl Drop for Agent {
    fn drop(&mut self) {
        if let Err(e) = lab::stop_pid(self.0) {
            eprintln!("bench: stopping b-gw's agent {}: {e:#}", self.0);
        }
    }
}

/// b-gw's agent as the lab runs it, for whatever follows.
fn restore_b_gw() -> Result<()> {
    lab::clean_up_agent(&B.gw())?;
    lab::start_agent(&B.gw())?;
    lab::wait_ready(&B.gw())
}

/// Writes `entries` entries (half as many flows) into b-gw's table.
fn write_flows(entries: u32) -> Result<()> {
    if entries == 0 {
        return Ok(());
    }
    let mut table: HashMap<MapData, FlowKey, FlowNat> =
        lab::pinned_hash(&lab::bpffs(&B.gw()), MAP_CONNTRACK)?;
    let now = monotonic_ns()?;
    let started = Instant::now();
    let flows = entries / 2;
    for i in 0..flows {
        let (out, nat, back) = flow(i, now);
        table.insert(out, nat, 0)?;
        table.insert(reply_key(&out, &nat), back, 0)?;
        if (i + 1) % 100_000 == 0 {
            println!("bench:   {} of {flows} flows written", i + 1);
        }
    }
    println!(
        "bench:   {entries} entries written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Flow `i`: from 10.77.x.y:port to 10.78.x.y:443, masqueraded to b's
/// address and the same port; the outbound entry, what it rewrites to, and
/// what the reply's entry restores.
fn flow(i: u32, now: u64) -> (FlowKey, FlowNat, FlowNat) {
    const PORTS: u32 = 50_000;
    let host = i / PORTS;
    let port = (10_000 + i % PORTS) as u16;
    let source = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 77, 0, 0)) + host);
    let destination = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 78, 0, 0)) + host);
    let tcp = 6;
    let out = FlowKey::new(
        Be32::from(source),
        Be32::from(destination),
        port,
        443,
        tcp,
        DIR_OUT,
    );
    let nat = |addr: Ipv4Addr| FlowNat {
        addr: Be32::from(addr),
        port,
        state: TcpState::Established as u8,
        answered: 1,
        owner: NO_PEER,
        pad: 0,
        last_seen: now,
    };
    (out, nat(B.masquerade_addr()), nat(source))
}

fn monotonic_ns() -> Result<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    Ok(now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64)
}

/// The agent's CPU, as a percentage of one core, once its collector has
/// settled: from the end of a sweep at the settled interval, over that
/// interval and [`SWEEP_MARGIN`], a window that holds exactly one whole
/// sweep and the idle time between two.
fn settled_cpu_percent(pid: u32) -> Result<f64> {
    let gw = B.gw();
    let runs = || lab::metric(&gw, "isthmus_conntrack_gc_runs_total ");
    let interval = || lab::metric(&gw, "isthmus_conntrack_gc_interval_seconds ");
    let settled = Instant::now();
    let mut seen = None;
    loop {
        let (now, wait) = (runs()?, interval()?);
        if wait >= SETTLED_INTERVAL && seen.is_some_and(|before| now > before) {
            break;
        }
        if wait >= SETTLED_INTERVAL && seen.is_none() {
            seen = Some(now);
        }
        anyhow::ensure!(
            settled.elapsed() < SETTLING,
            "b-gw's collector did not settle at a {SETTLED_INTERVAL} s interval within {SETTLING:?} (its wait is {wait} s)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let window = Duration::from_secs_f64(SETTLED_INTERVAL) + SWEEP_MARGIN;
    println!(
        "bench:   collector settled after {:.0} s; CPU over {} s",
        settled.elapsed().as_secs_f64(),
        window.as_secs()
    );
    let before = super::stats::cpu_seconds(pid)?;
    std::thread::sleep(window);
    let used = super::stats::cpu_seconds(pid)? - before;
    Ok(100.0 * used / window.as_secs_f64())
}

/// b-gw's conntrack map's memory, as `bpftool map show` prints it.
fn map_mib() -> Result<f64> {
    let pin = lab::pins(&B.gw()).map(MAP_CONNTRACK);
    let out = run(
        "bpftool",
        &["-j", "map", "show", "pinned", &pin.to_string_lossy()],
    )?;
    let shown: Value = serde_json::from_str(&out).context("bpftool's JSON")?;
    let bytes = shown["bytes_memlock"]
        .as_f64()
        .context("no bytes_memlock in bpftool's map show")?;
    Ok(bytes / (1024.0 * 1024.0))
}

fn report(samples: &[Vec<Measured>], lines: &str) -> String {
    let mut table = String::new();
    for (fill, rounds) in FILLS.iter().zip(samples) {
        let of = |f: fn(&Measured) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
        let failed: usize = rounds.iter().map(|m| m.failed).sum();
        let cpu = match fill.cpu_target {
            Some(target) => format!("{:.2} (target {target})", of(|m| m.cpu_percent)),
            None => "not measured".to_owned(),
        };
        table += &format!(
            "| {} | {} | {:.0} | {:.0} | {failed} | {:.1} | {cpu} |\n",
            fill.entries,
            fill.capacity,
            of(|m| m.pps),
            of(|m| m.crr),
            of(|m| m.map_mib),
        );
    }
    format!(
        "## Conntrack with many flows\n\n\
`cargo xtask bench conntrack`: the hub path a-pod2 → c-pod1 (10.0.1.45),
masqueraded by b-gw, in {ROUNDS} interleaved rounds. Each round restarts b-gw's agent as the lab runs it, with
`--conntrack-capacity` set. It writes the entries into its pinned table:
established TCP flows, answered, of an owner that is no peer, so that the
collector keeps them. With a full table, it then reads the agent's CPU
in the steady state its collector settles in. The collector's wait
between sweeps doubles from 10 s while it finds nothing dead, up to the
shipped `--conntrack-gc-max-interval` of {settled} s. Once a sweep ends at
that wait, the bench reads the CPU over {window} s, which hold exactly one
sweep. Then it measures 64-byte UDP packets per second through
the hub (trafgen, 256 flows), and TCP connections per second
(`bench/crr.rs`). The
table's memory is the `bytes_memlock` of `bpftool map show`; entries are
allocated as they are written. The empty table has the shipped capacity,
131,072 entries: a's share of it (29,491 flows, b having two peers) would
be full within 3 s of the connection test if its closed connections
stayed their 10 s, but b's agent evicts them once a holds a quarter of
its share. A connection that does not complete within 2 s counts as
failed (all rounds summed); the time it took counts in the rate.

| entries | capacity | pps | connections/s | failed connections | table MiB | agent CPU % |
|---|---|---|---|---|---|---|
{table}
```
{lines}```
",
        settled = SETTLED_INTERVAL,
        window = SETTLED_INTERVAL + SWEEP_MARGIN.as_secs_f64(),
    )
}
