//! `cargo xtask bench idle`: a gateway agent, as the DaemonSet runs it,
//! holding live WireGuard sessions with 1, 100 and 1,000 peers
//! (`wg_peers`: handshakes answered, keepalives running, conncheck PINGs
//! answered), idle: its CPU, its resident memory and its BPF map memory.
//! Then its start with 1,000 peers and 100,000 NatMapping entries, and the
//! verifier's share of it. Last, the same with 1,000 peers whose endpoints
//! never answer.

use std::{
    collections::HashMap,
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use isthmus_lab::{
    cmd::ip,
    kube_lab::{Networks, nat_mapping, tunnel_endpoint},
    lab::{self, LabTunnel},
    netns,
    wait::poll,
};
use serde_json::{Value, json};

use super::{
    on_lab,
    stats::{median, ratio_line, rss_mib},
    wg_peers::Peers,
    write_section,
};

/// The gateway's netns, and the peers'.
const NS: &str = "ist-t-bench-idle";
const PEERS_NS: &str = "ist-t-bench-peers";
const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The peers' port.
const PEER_PORT: u16 = 5871;
/// The peer counts measured, in this order.
const STEPS: [usize; 3] = [1, 100, 1000];
/// Idle windows per peer count.
const ROUNDS: usize = 5;
const WINDOW: Duration = Duration::from_secs(10);
/// The longest the sessions may take to come up.
const SESSIONS_UP: Duration = Duration::from_mins(3);
const CPU_BUDGET_PERCENT: f64 = 3.0;
const MEMORY_BUDGET_MIB: f64 = 64.0;
/// Where the silent peers' endpoints are: routed into the peers' netns,
/// which does not forward, so their datagrams vanish without an answer.
const SILENT_NET: &str = "198.19.0.0/16";
/// Rounds of handshakes each silent peer gives up before the measure:
/// the first, of WireGuard's retries every 5 s, and one of the rounds
/// that follow a silence, further apart.
const SILENT_ROUNDS: usize = 2;
/// The longest those rounds may take: WireGuard's Rekey-Attempt-Time
/// (90 s) each, the wait between them, and some.
const SILENT_GIVEN_UP: Duration = Duration::from_mins(5);
/// WireGuard's Rekey-Timeout: no peer gets initiations more often.
const REKEY_TIMEOUT_S: f64 = 5.0;
/// NatMapping entries per peer for the start: 100,000 in all.
const ENTRIES_PER_PEER: usize = 100;
/// Above the default (65,536), as a cluster that large sets it.
const MAPPING_CAPACITY: u32 = 131_072;

/// One peer count's idle figures, one per round.
struct Idle {
    /// What the row measures: `1000-peers`, `1000-silent-peers`.
    name: String,
    cpu_percent: Vec<f64>,
    rss_mib: Vec<f64>,
    map_mib: Vec<f64>,
    connected: f64,
    /// Handshake initiations sent to each peer per second, over the rounds.
    initiations_per_peer_s: f64,
}

/// The start with every peer and entry already there.
struct Start {
    ready: Duration,
    loading: Duration,
}

pub fn run_idle() -> Result<()> {
    on_lab(LabTunnel::None, || {
        let result = idle();
        for ns in [NS, PEERS_NS] {
            let _ = ip("", &["netns", "del", ns]);
        }
        result
    })
}

fn idle() -> Result<()> {
    let node = Node::new()?;
    let key = lab::public_key(NS)?;
    let peers = Peers::start(PEERS_NS, endpoint, 0..STEPS[2], &key)?;
    let mut agent = node.start(&[])?;
    let mut figures = Vec::new();
    for count in STEPS {
        println!("bench: {count} peer(s): waiting for every session");
        node.write_peers(count, endpoint)?;
        node.write_mappings(count, 1)?;
        let started = Instant::now();
        poll(
            SESSIONS_UP,
            Duration::from_millis(200),
            &format!("{count} live sessions"),
            || (peers.established() >= count).then_some(()),
        )
        .with_context(|| {
            format!(
                "{} sessions up; end of the agent's log:\n{}",
                peers.established(),
                lab::log_tail(&lab::log_file(NS))
            )
        })?;
        println!("bench:   up in {:.1} s", started.elapsed().as_secs_f64());
        figures.push(measure_idle(agent, &format!("{count}-peers"), count)?);
    }
    lab::stop_pid(agent)?;
    lab::clean_up_agent(NS)?;

    println!(
        "bench: starting with {} peers and {} NatMapping entries",
        STEPS[2],
        STEPS[2] * ENTRIES_PER_PEER
    );
    node.write_mappings(STEPS[2], ENTRIES_PER_PEER)?;
    let capacity = format!("--nat-mapping-capacity={MAPPING_CAPACITY}");
    let began = Instant::now();
    agent = node.start(&[&capacity])?;
    let ready = began.elapsed();
    let loading = Duration::from_secs_f64(lab::metric(NS, "isthmus_program_load_seconds_total ")?);
    let entries = lab::metric(NS, "isthmus_nat_mappings ")?;
    ensure!(
        entries == (STEPS[2] * ENTRIES_PER_PEER) as f64,
        "the agent was ready with {entries} NatMapping entries"
    );
    println!(
        "bench:   ready in {:.2} s, {:.2} s of it loading programs",
        ready.as_secs_f64(),
        loading.as_secs_f64()
    );
    lab::stop_pid(agent)?;
    lab::clean_up_agent(NS)?;
    peers.stop()?;
    figures.push(silent(&node)?);
    report(&figures, &Start { ready, loading })
}

/// The agent, started afresh with `STEPS[2]` peers that never answer, idle
/// once every peer has given up [`SILENT_ROUNDS`] rounds of handshakes.
fn silent(node: &Node) -> Result<Idle> {
    let count = STEPS[2];
    println!(
        "bench: {count} silent peers: waiting for {SILENT_ROUNDS} rounds of handshakes each to be given up"
    );
    node.write_peers(count, silent_endpoint)?;
    node.write_mappings(count, 1)?;
    let agent = node.start(&[])?;
    let failures = || lab::metric_sum(NS, "isthmus_peer_handshake_failures_total", &[]);
    let started = Instant::now();
    let mut shown = 0;
    poll(
        SILENT_GIVEN_UP,
        Duration::from_secs(1),
        &format!("{SILENT_ROUNDS} rounds given up by each of {count} peers"),
        || {
            let given_up = failures().unwrap_or(0.0) as usize;
            let elapsed = started.elapsed().as_secs();
            if elapsed >= shown + 15 {
                shown = elapsed;
                println!(
                    "bench:   {elapsed} s: {given_up} of {} rounds given up",
                    count * SILENT_ROUNDS
                );
            }
            (given_up >= count * SILENT_ROUNDS).then_some(())
        },
    )?;
    let idle = measure_idle(agent, &format!("{count}-silent-peers"), count);
    lab::stop_pid(agent)?;
    lab::clean_up_agent(NS)?;
    idle
}

/// The agent's idle CPU, memory and map memory, `ROUNDS` windows, and the
/// handshake initiations it sent its `peers` peers meanwhile.
fn measure_idle(pid: u32, name: &str, peers: usize) -> Result<Idle> {
    let mut idle = Idle {
        name: name.to_owned(),
        cpu_percent: Vec::new(),
        rss_mib: Vec::new(),
        map_mib: Vec::new(),
        connected: 0.0,
        initiations_per_peer_s: 0.0,
    };
    let initiations = || lab::metric_sum(NS, "isthmus_peer_handshake_initiations_total", &[]);
    let (sent_before, began) = (initiations()?, Instant::now());
    for round in 1..=ROUNDS {
        let (cpu, start) = (thread_cpu_ns(pid)?, Instant::now());
        std::thread::sleep(WINDOW);
        let used = cpu_ns_since(pid, &cpu)? as f64 / start.elapsed().as_nanos() as f64;
        idle.cpu_percent.push(used * 100.0);
        idle.rss_mib.push(rss_mib(pid)?);
        idle.map_mib.push(map_mib(pid)?);
        println!(
            "bench:   round {round}/{ROUNDS}: {:.2}% of a core, {:.1} MiB resident, {:.1} MiB of maps",
            used * 100.0,
            idle.rss_mib[round - 1],
            idle.map_mib[round - 1]
        );
    }
    let sent = initiations()? - sent_before;
    idle.initiations_per_peer_s = sent / peers as f64 / began.elapsed().as_secs_f64();
    println!(
        "bench:   {:.3} handshake initiations per peer per second (at most {:.3}: one per Rekey-Timeout)",
        idle.initiations_per_peer_s,
        1.0 / REKEY_TIMEOUT_S
    );
    idle.connected = lab::metric_sum(NS, "liqo_peer_is_connected", &[])?;
    Ok(idle)
}

/// CPU time each thread of `pid` has run, in ns, by the scheduler's
/// clock (not sampled ticks), by thread ID.
fn thread_cpu_ns(pid: u32) -> Result<HashMap<String, u64>> {
    let mut threads = HashMap::new();
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?;
        let stat = fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let ran = stat.split_whitespace().next().and_then(|t| t.parse().ok());
        threads.insert(
            task.file_name().to_string_lossy().into_owned(),
            ran.unwrap_or(0),
        );
    }
    Ok(threads)
}

/// CPU time the threads of `pid` ran since `before` was read. A thread
/// that ended meanwhile (the runtime ends idle blocking threads) takes
/// its time with it; one that started counts whole.
fn cpu_ns_since(pid: u32, before: &HashMap<String, u64>) -> Result<u64> {
    Ok(thread_cpu_ns(pid)?
        .iter()
        .map(|(tid, ran)| ran.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum())
}

/// The memory of the BPF maps `pid` holds, as the kernel charges it (the
/// `memlock` that `bpftool map show` prints), in MiB.
fn map_mib(pid: u32) -> Result<f64> {
    let mut bytes = 0u64;
    for fd in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let info = fs::read_to_string(fd?.path()).unwrap_or_default();
        if info.contains("map_type:") {
            bytes += info
                .lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(bytes as f64 / (1024.0 * 1024.0))
}

/// The gateway's netns, linked by a veth pair to the peers' netns.
struct Node {
    objects: PathBuf,
}

impl Node {
    fn new() -> Result<Self> {
        for ns in [NS, PEERS_NS] {
            if netns::exists(ns) {
                ip("", &["netns", "del", ns])?;
            }
            ip("", &["netns", "add", ns])?;
            ip(ns, &["link", "set", "lo", "up"])?;
        }
        ip(
            NS,
            &[
                "link", "add", "wan0", "type", "veth", "peer", "name", "wan1", "netns", PEERS_NS,
            ],
        )?;
        ip(
            NS,
            &["addr", "add", &format!("{GATEWAY_ADDR}/16"), "dev", "wan0"],
        )?;
        // Each peer from an address of its own, as peer gateways are: the
        // gateway throttles handshakes per source address.
        let batch = PathBuf::from(lab::STATE_DIR).join("bench-idle-peers.ip");
        let commands: String = (0..STEPS[2])
            .map(|i| format!("addr add {}/16 dev wan1\n", endpoint(i).ip()))
            .collect();
        fs::write(&batch, commands)?;
        ip(PEERS_NS, &["-batch", &batch.to_string_lossy()])?;
        ip(NS, &["link", "set", "wan0", "up"])?;
        ip(PEERS_NS, &["link", "set", "wan1", "up"])?;
        let peers_side = endpoint(0).ip().to_string();
        ip(NS, &["route", "add", SILENT_NET, "via", &peers_side])?;
        let objects = PathBuf::from(lab::STATE_DIR).join("bench-idle-objects");
        let _ = fs::remove_dir_all(&objects);
        fs::create_dir_all(&objects)?;
        Ok(Self { objects })
    }

    /// Starts the gateway agent as the DaemonSet does, with `extra`
    /// flags; returns its PID once ready.
    fn start(&self, extra: &[&str]) -> Result<u32> {
        lab::start_gateway_in(NS, &self.objects, extra).context("the idle bench's gateway")
    }

    /// Gives the agent the first `count` peers, peer `i` at `endpoint(i)`.
    fn write_peers(&self, count: usize, endpoint: fn(usize) -> SocketAddrV4) -> Result<()> {
        let docs: Vec<String> = (0..count)
            .map(|i| peer(i, endpoint(i)).to_string())
            .collect();
        write_objects(&self.objects, "peer", &docs)
    }

    /// Gives each of the first `count` peers a NatMapping of `entries`
    /// entries, the conncheck's first, as Liqo writes it.
    fn write_mappings(&self, count: usize, entries: usize) -> Result<()> {
        let docs: Vec<String> = (0..count)
            .map(|i| {
                let entries: Vec<(Ipv4Addr, Ipv4Addr)> = std::iter::once(CONNCHECK_ENTRY)
                    .chain((1..entries).map(|k| entry(i, k)))
                    .collect();
                nat_mapping(&cluster(i), &entries).to_string()
            })
            .collect();
        write_objects(&self.objects, "natmapping", &docs)
    }
}

/// Writes each of `docs` as a file of its own, `{kind}-{i}.json`, as an
/// object directory holds them; each is renamed into place, so the agent
/// never reads half of one. Files that hold the same already are left
/// alone.
fn write_objects(dir: &std::path::Path, kind: &str, docs: &[String]) -> Result<()> {
    let staging = dir.with_extension("staging");
    for (i, doc) in docs.iter().enumerate() {
        let path = dir.join(format!("{kind}-{i}.json"));
        if fs::read_to_string(&path).ok().as_ref() != Some(doc) {
            fs::write(&staging, doc)?;
            fs::rename(&staging, path)?;
        }
    }
    Ok(())
}

/// Peer `i`'s WireGuard endpoint.
fn endpoint(i: usize) -> SocketAddrV4 {
    let (hi, lo) = (i / 250, i % 250);
    SocketAddrV4::new(
        Ipv4Addr::new(198, 18, 10 + hi as u8, 1 + lo as u8),
        PEER_PORT,
    )
}

/// Silent peer `i`'s endpoint, in [`SILENT_NET`].
fn silent_endpoint(i: usize) -> SocketAddrV4 {
    let (hi, lo) = (i / 250, i % 250);
    SocketAddrV4::new(
        Ipv4Addr::new(198, 19, 10 + hi as u8, 1 + lo as u8),
        PEER_PORT,
    )
}

fn cluster(i: usize) -> String {
    format!("cluster-idle-{i}")
}

/// Peer `i`'s TunnelEndpoint: networks of its own, its socket at
/// `endpoint` and its key.
fn peer(i: usize, endpoint: SocketAddrV4) -> Value {
    let (hi, lo) = (i / 256, i % 256);
    let (pod, external) = (
        format!("10.{}.{lo}.0/24", 64 + hi),
        format!("10.{}.{lo}.0/24", 72 + hi),
    );
    let nets = Networks {
        local_pod: "10.244.0.0/16",
        local_external: "10.128.0.0/16",
        remote_pod: &pod,
        remote_external: &external,
    };
    tunnel_endpoint(
        &format!("tep-idle-{i}"),
        &cluster(i),
        &nets,
        json!({
            "endpointIP": endpoint.ip().to_string(),
            "backend_config": {
                "port": PEER_PORT.to_string(),
                "publicKey": super::wg_peers::public_key(i),
            },
        }),
    )
}

/// Entry `k` of peer `i`'s NatMapping: (endpointIP, externalIP), outside
/// the conncheck's.
fn entry(i: usize, k: usize) -> (Ipv4Addr, Ipv4Addr) {
    (
        Ipv4Addr::new(10, 244, (k / 256) as u8, (k % 256) as u8),
        Ipv4Addr::new(10, 128, 1 + (i % 250) as u8, k as u8),
    )
}

/// The conncheck's entry: the first host of our ExternalCIDR, as every
/// peer sees it, leads to the gateway's conncheck address.
const CONNCHECK_ENTRY: (Ipv4Addr, Ipv4Addr) =
    (Ipv4Addr::new(169, 254, 0, 1), Ipv4Addr::new(10, 128, 0, 1));

fn report(figures: &[Idle], start: &Start) -> Result<()> {
    let mut lines = String::new();
    let mut table = String::new();
    for f in figures {
        let memory: Vec<f64> = f
            .rss_mib
            .iter()
            .zip(&f.map_mib)
            .map(|(r, m)| r + m)
            .collect();
        lines += &ratio_line(
            &format!("idle-cpu-percent-{}-vs-budget", f.name),
            &f.cpu_percent,
            &vec![CPU_BUDGET_PERCENT; f.cpu_percent.len()],
            3,
        );
        lines += &ratio_line(
            &format!("idle-memory-mib-{}-vs-budget", f.name),
            &memory,
            &vec![MEMORY_BUDGET_MIB; memory.len()],
            1,
        );
        table += &format!(
            "| {} | {:.2}% | {:.1} MiB | {:.1} MiB | {} | {:.3} |\n",
            f.name.replace('-', " "),
            median(&f.cpu_percent),
            median(&f.rss_mib),
            median(&f.map_mib),
            f.connected,
            f.initiations_per_peer_s,
        );
    }
    let (ready, loading) = (start.ready.as_secs_f64(), start.loading.as_secs_f64());
    lines += &ratio_line(
        "startup-ms-1000-peers-100k-entries-vs-program-load-ms",
        &[ready * 1e3],
        &[loading * 1e3],
        1,
    );
    let section = format!(
        "## Idle gateway: 1, 100 and 1,000 live peers

`cargo xtask bench idle` runs a gateway agent in a netns of its own, with the DaemonSet's flags:
keepalive every 10 s, the conncheck every 2 s, the XDP guard on. Its peers
are in another netns of the lab: one boringtun session per peer, each on a
UDP socket of its own address (`xtask/src/bench/wg_peers.rs`). Each answers
the gateway's handshakes and keepalives and the conncheck's PINGs. The peers
are given 1, then 100, then 1,000 at a time. Once every session is up,
{ROUNDS} windows of {window} s read the agent's CPU time, its resident
memory, and the memory of the BPF maps it holds. CPU time counts every
thread, by the scheduler's clock (`/proc/PID/task/*/schedstat`). Map memory
is the `memlock` of each map fd, the figure `bpftool map show` prints. Memory is resident
plus maps. The budgets: under {CPU_BUDGET_PERCENT}% of a core and
{MEMORY_BUDGET_MIB} MiB with 1,000 peers.

| peers | CPU (median) | resident | maps | conncheck connected | initiations per peer per s |
|---|---|---|---|---|---|
{table}
**Start.** The agent is stopped, given a NatMapping of {ENTRIES_PER_PEER} entries
for each of the 1,000 peers ({total} in all, with
`--nat-mapping-capacity={MAPPING_CAPACITY}`), and started again: {ready:.2} s
from process start to ready (`/readyz`: every object read, every table and
route written), of which {loading:.2} s loading the programs, the
verifier's work (`isthmus_program_load_seconds_total`).

**Silent peers.** Last, the agent starts afresh with 1,000 peers whose
endpoints never answer: their datagrams are routed into a netns that drops
them ({SILENT_NET}). Each peer's rounds of handshakes last 90 s
(WireGuard's Rekey-Attempt-Time). Once every peer has given up
{SILENT_ROUNDS}, the same windows measure the agent. The first round
retries every Rekey-Timeout ({REKEY_TIMEOUT_S} s), as WireGuard does; the
rounds after a silence are further apart (see
[operating.md](operating.md#the-gateway-and-its-tunnel)). The last column
gives the initiations sent meanwhile.

```
{lines}```
",
        window = WINDOW.as_secs(),
        total = STEPS[2] * ENTRIES_PER_PEER,
    );
    write_section("idle", &section)
}
