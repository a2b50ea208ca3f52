//! `cargo xtask bench control`: how fast NatMapping changes reach the
//! kernel, and what 10,000 entries cost a packet through the hub, against
//! the per-cluster iptables DNAT chain Liqo keeps.

mod iptables;

use iptables::{IptablesApply, apply_iptables, hub_pps};

use std::{
    fmt::Write as _,
    fs,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use aya::maps::{HashMap, MapData};

use isthmus_common::{
    names,
    nat::{MappingKey, PeerKey, PeerNat},
    wire::Be32,
};

use isthmus_lab::{
    lab::{self, LabTunnel},
    objects::TunnelEndpoint,
    topology::B,
    wait::poll,
};

use super::{
    burner::{Spread, quiet_and_busy, spread},
    gateways::{maps_to, peer_id},
    stats::{median, ratio_line},
    write_section,
};

/// Entries in the large table.
const ENTRIES: usize = 10_000;

/// Entries in the small table.
const FEW: usize = 10;

/// Single-entry changes timed from file to kernel.
const UPDATES: usize = 200;

/// How long iptables may take to insert the entries before it is stopped.
const IPTABLES_BUDGET: Duration = Duration::from_mins(15);

/// Rounds per setup, interleaved, for pps and for one-entry changes.
const ROUNDS: usize = 5;

/// Peers beside the bench peer, so that every pass weighs as many peers as
/// a large hub's.
const OTHER_PEERS: usize = 199;

/// The p99 target for a one-entry change on a quiet machine.
const P99_TARGET_MS: f64 = 10.0;

/// The p99 target for a one-entry change while one core is kept busy.
const BUSY_TARGET_MS: f64 = 25.0;

/// The synthetic cluster whose NatMapping fills b-gw's table: its
/// ExternalCIDR for us is large enough for 10,000 externalIPs.
const BENCH_CLUSTER: &str = "cluster-bench";

const BENCH_VIEW: &str = "10.50.0.0/24";

pub fn run_control(kube_only: bool) -> Result<()> {
    lab::up(&lab::Setup::with_tunnel(LabTunnel::None))?;
    let kube = super::kube::measure();
    let result = match kube {
        Ok(figures) if kube_only => super::kube::report(&figures),
        Ok(figures) => control().and_then(|()| super::kube::report(&figures)),
        Err(e) => Err(e),
    };
    lab::down()?;
    result
}

fn control() -> Result<()> {
    let measured = measure_all()?;
    let lines = result_lines(&measured);
    write_section("control", &report(&measured, &lines))
}

/// Everything `bench control` measures.
struct Measured {
    yaml: Applied,
    json: Applied,
    rss: f64,
    iptables: IptablesApply,
    /// (setup, entries, pps of each round) through the hub.
    pps: Vec<(&'static str, usize, Vec<f64>)>,
}

impl Measured {
    /// The hub's pps of each round for `setup` with `entries` entries.
    fn pps(&self, setup: &str, entries: usize) -> Vec<f64> {
        self.pps
            .iter()
            .find(|(s, c, _)| *s == setup && *c == entries)
            .map_or_else(Vec::new, |(_, _, v)| v.clone())
    }
}

fn measure_all() -> Result<Measured> {
    let gw = B.gw();
    lab::write_object(&gw, "bench-peer.yaml", &bench_peer())?;
    lab::write_object(&gw, "bench-other-peers.yaml", &other_peers())?;
    let peer_id = wait_for_peer(&gw)?;

    let mut applied = Vec::new();
    for format in [Format::Yaml, Format::Json] {
        println!("bench: applying {ENTRIES} NatMapping entries as {format:?}");
        let converge = apply_isthmus(&gw, peer_id, format)?;
        println!(
            "bench:   {:.1} ms to converge",
            converge.as_secs_f64() * 1e3
        );
        let (quiet, busy) = quiet_and_busy(&gw, ROUNDS, "one-entry change", || {
            update_spread(&gw, peer_id, format)
        })?;
        applied.push(Applied {
            converge_ms: converge.as_secs_f64() * 1e3,
            quiet,
            busy,
        });
        // Gone before the next format's file arrives: one NatMapping per cluster.
        fs::remove_file(lab::object_dir(&gw).join(format.file()))?;
        wait_entries(&gw, peer_id, 0)?;
    }
    let rss = super::stats::agent_rss_mib(&gw)?;
    let [yaml, json]: [Applied; 2] = applied
        .try_into()
        .map_err(|_| anyhow::anyhow!("two formats"))?;

    println!("bench: inserting {ENTRIES} DNAT rules as Liqo does (iptables -C, then -A)");
    let iptables = apply_iptables(&gw)?;
    println!(
        "bench:   {:.1} s for {} rules{}",
        iptables.elapsed.as_secs_f64(),
        iptables.inserted,
        if iptables.inserted < ENTRIES {
            " (stopped: over budget)"
        } else {
            ""
        }
    );
    Ok(Measured {
        yaml,
        json,
        rss,
        iptables,
        pps: hub_pps()?,
    })
}

/// The RESULT lines: medians of the rounds, with their ranges.
fn result_lines(m: &Measured) -> String {
    let target = |ms| vec![ms; ROUNDS];
    let mut lines = ratio_line(
        "natmapping-10k-converge-ms-vs-iptables",
        &[m.yaml.converge_ms],
        &[m.iptables.elapsed.as_secs_f64() * 1e3],
        2,
    );
    for (format, figures) in [("yaml", &m.yaml), ("json", &m.json)] {
        for (measure, rounds, target_ms) in [
            ("p50-ms", figures.p50(), P99_TARGET_MS),
            ("p99-ms", figures.p99(), P99_TARGET_MS),
            ("p99-ms-busy", figures.busy_p99(), BUSY_TARGET_MS),
        ] {
            lines += &ratio_line(
                &format!("natmapping-{format}-update-{measure}-vs-target"),
                &rounds,
                &target(target_ms),
                2,
            );
        }
    }
    for (name, ours, peer) in [
        (
            "hub-pps-10k-entries-vs-isthmus-10-entries",
            m.pps("isthmus", ENTRIES),
            m.pps("isthmus", FEW),
        ),
        (
            "hub-pps-10k-entries-vs-iptables-10k",
            m.pps("isthmus", ENTRIES),
            m.pps("iptables", ENTRIES),
        ),
        (
            "iptables-hub-pps-10k-entries-vs-iptables-10-entries",
            m.pps("iptables", ENTRIES),
            m.pps("iptables", FEW),
        ),
    ] {
        lines += &ratio_line(name, &ours, &peer, 2);
    }
    lines + &ratio_line("agent-rss-mib-10k-entries-vs-budget", &[m.rss], &[64.0], 2)
}

/// The section of docs/benchmarks.md: the method, the table, the lines.
fn report(m: &Measured, lines: &str) -> String {
    let (yaml, json, rss) = (&m.yaml, &m.json, m.rss);
    let (ms, json_ms) = (yaml.converge_ms, json.converge_ms);
    let (p50, p99, busy_p99) = (
        median(&yaml.p50()),
        median(&yaml.p99()),
        median(&yaml.busy_p99()),
    );
    let (json_p50, json_p99, json_busy_p99) = (
        median(&json.p50()),
        median(&json.p99()),
        median(&json.busy_p99()),
    );
    let mut section = format!(
        "## Control plane: NatMapping entries from file to kernel

`cargo xtask bench control` runs the lab with clear routing (`--tunnel none`)
and works on b-gw, the hub.

- **Apply.** One NatMapping of {ENTRIES} entries, for a synthetic cluster
  whose ExternalCIDR holds them, is renamed into b-gw's object directory. The
  clock stops when the last entry is in b-gw's kernel table, read from the
  pinned map.
- **Update.** {UPDATES} times, one entry of the same object changes its
  endpoint, and the whole object is rewritten. Each change is timed until the
  kernel holds the new value. {ROUNDS} rounds, each of {UPDATES} changes on
  a quiet machine, then {UPDATES} while a CPU burner (a shell loop in b-gw's
  netns, bounded by `timeout`) keeps one of the two cores busy. Beside the
  bench peer, b-gw holds {OTHER_PEERS} more TunnelEndpoints, so that each
  pass weighs as many peers as a large hub's.
- **Both as YAML and as JSON.** Most of a change's time is reading the
  object. The YAML scanner (libyaml, through serde_yaml_ng) needs about 9 ms
  for 10,000 entries on this machine, so the agent reads a plain
  `clusterMappings` block itself and gives the scanner the rest
  (`agent/src/model/object/plain.rs`, `plain_natmapping`). JSON, which is YAML too and
  what the Kubernetes API serves, goes to serde_json.
- **iptables.** The same entries, inserted as Liqo's network manager does:
  one `-d externalIP -j DNAT --to-destination endpointIP` rule per entry, in
  the cluster's `LIQO-PRRT-MAP-CLS-` chain, through go-iptables'
  `AppendUnique`, that is `iptables -C`, then `iptables -A`. The
  `iptables` here is Debian's, with the nft backend.
- **Packets.** 64-byte UDP from a-pod2 to 10.0.1.45, through b to c-pod1,
  over 256 flows. Isthmus holds the lab's entry plus {FEW} or {ENTRIES} in
  total, in the same hash. iptables has the lab's DNAT rule in the middle
  of a chain of {FEW} or {ENTRIES} rules, with Liqo's NETMAP and SNAT rules
  for the rest of the path. iptables walks the chain once per new flow and
  conntrack does the rest, so the chain length barely shows in pps.

| measure | Isthmus | iptables |
|---|---|---|
| {ENTRIES} entries applied (YAML) | {ms:.1} ms | {ipt:.1} s{ipt_note} |
| {ENTRIES} entries applied (JSON) | {json_ms:.1} ms | |
| one-entry change (YAML), p50 / p99, quiet | {p50:.2} / {p99:.2} ms | |
| one-entry change (YAML), p99, one core busy | {busy_p99:.2} ms | |
| one-entry change (JSON), p50 / p99, quiet | {json_p50:.2} / {json_p99:.2} ms | |
| one-entry change (JSON), p99, one core busy | {json_busy_p99:.2} ms | |
| pps through the hub, {FEW} entries | {i10:.0} | {t10:.0} |
| pps through the hub, {ENTRIES} entries | {i10k:.0} | {t10k:.0} |

Agent resident memory with {ENTRIES} entries: {rss:.1} MiB.

```
{lines}```
",
        ipt = m.iptables.elapsed.as_secs_f64(),
        ipt_note = if m.iptables.inserted < ENTRIES {
            format!(" (stopped after {} rules)", m.iptables.inserted)
        } else {
            String::new()
        },
        i10 = median(&m.pps("isthmus", FEW)),
        i10k = median(&m.pps("isthmus", ENTRIES)),
        t10 = median(&m.pps("iptables", FEW)),
        t10k = median(&m.pps("iptables", ENTRIES)),
    );
    if m.iptables.inserted < ENTRIES {
        let _ = writeln!(
            section,
            "\niptables was stopped at its budget; its figure is a lower bound."
        );
    }
    section
}

/// The other peers: views of their own, no tunnel (the lab's routing is
/// clear), no NatMapping.
fn other_peers() -> String {
    (1..=OTHER_PEERS)
        .map(|i| {
            TunnelEndpoint::new(&format!("tep-bench-{i}"), "liqo-tenant-bench")
                .cluster_id(&format!("{BENCH_CLUSTER}-{i}"))
                .local([B.pod_cidr, "None", "100.64.0.0/16", "None"])
                .remote([
                    &format!("10.51.{i}.0/24"),
                    "None",
                    &format!("10.52.{i}.0/24"),
                    "None",
                ])
                .endpoint(format!("203.0.114.{i}"))
                .port(5871)
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn bench_peer() -> String {
    TunnelEndpoint::new("tep-bench", "liqo-tenant-bench")
        .cluster_id(BENCH_CLUSTER)
        .local([B.pod_cidr, "None", "100.64.0.0/16", "None"])
        .remote([BENCH_VIEW, "None", "192.168.50.0/24", "None"])
        .endpoint("203.0.113.200")
        .port(5871)
        .to_string()
}

/// Entry `i` of the large table: (endpointIP, externalIP).
fn entry(i: usize, generation: u8) -> (Ipv4Addr, Ipv4Addr) {
    let (hi, lo) = ((i / 256) as u8, (i % 256) as u8);
    (
        Ipv4Addr::new(10, 61 + generation, hi, lo),
        Ipv4Addr::new(100, 64, hi, lo),
    )
}

/// How the NatMapping file is written: Liqo's YAML, or JSON (which is
/// YAML too, and takes the agent's fast parser).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Yaml,
    Json,
}

impl Format {
    fn file(self) -> &'static str {
        match self {
            Format::Yaml => "natmapping-bench.yaml",
            Format::Json => "natmapping-bench.json",
        }
    }
}

fn bench_mapping(count: usize, changed: Option<(usize, u8)>, format: Format) -> String {
    let endpoint_of = |i: usize| {
        let generation = match changed {
            Some((k, g)) if k == i => g,
            _ => 0,
        };
        entry(i, generation)
    };
    if format == Format::Json {
        let mappings: serde_json::Map<String, serde_json::Value> = (0..count)
            .map(|i| {
                let (endpoint, external) = endpoint_of(i);
                (endpoint.to_string(), external.to_string().into())
            })
            .collect();
        return serde_json::json!({
            "apiVersion": "net.liqo.io/v1alpha1",
            "kind": "NatMapping",
            "metadata": {"name": "natmapping-bench"},
            "spec": {"clusterID": BENCH_CLUSTER, "clusterMappings": mappings},
        })
        .to_string();
    }
    let mut yaml = format!(
        "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata: {{name: natmapping-bench}}\nspec:\n  clusterID: {BENCH_CLUSTER}\n  clusterMappings:\n"
    );
    for i in 0..count {
        let (endpoint, external) = endpoint_of(i);
        let _ = writeln!(yaml, "    {endpoint}: {external}");
    }
    yaml
}

/// Waits until `node` programs the synthetic peer; returns its peer ID.
fn wait_for_peer(node: &str) -> Result<u32> {
    let peers: HashMap<MapData, PeerKey, PeerNat> =
        lab::pinned_hash(&lab::bpffs(node), names::MAP_PEERS)?;
    let view = BENCH_VIEW.parse()?;
    poll(
        Duration::from_secs(10),
        Duration::from_millis(5),
        &format!("{node} programs the bench peer"),
        || peer_id(&peers, view),
    )
}

/// Waits until `node` holds exactly `count` entries for `peer_id`.
fn wait_entries(node: &str, peer_id: u32, count: usize) -> Result<()> {
    let table: HashMap<MapData, MappingKey, Be32> =
        lab::pinned_hash(&lab::bpffs(node), names::MAP_NATMAP)?;
    let held = || {
        table
            .keys()
            .filter(|k| k.as_ref().is_ok_and(|k| k.peer_id == peer_id))
            .count()
    };
    poll(
        Duration::from_secs(30),
        Duration::from_millis(10),
        &format!("{node} holds {count} bench entries"),
        || (held() == count).then_some(()),
    )
}

/// Polls `node`'s NatMapping table until entry `i` maps to its endpoint of
/// `generation`; returns when that was seen.
fn wait_entry(
    table: &HashMap<MapData, MappingKey, Be32>,
    peer_id: u32,
    i: usize,
    generation: u8,
) -> Result<Instant> {
    let (endpoint, external) = entry(i, generation);
    poll(
        Duration::from_secs(30),
        Duration::from_micros(100),
        &format!("entry {i} reaches the kernel"),
        || maps_to(table, peer_id, external, endpoint).then(Instant::now),
    )
}

fn apply_isthmus(node: &str, peer_id: u32, format: Format) -> Result<Duration> {
    let table: HashMap<MapData, MappingKey, Be32> =
        lab::pinned_hash(&lab::bpffs(node), names::MAP_NATMAP)?;
    let text = bench_mapping(ENTRIES, None, format);
    let start = Instant::now();
    lab::write_object(node, format.file(), &text)?;
    // The reconciler writes in key order (a [`Be32`] orders by its bytes): the
    // entry with the largest key goes last.
    let last = (0..ENTRIES)
        .max_by_key(|&i| Be32::from(entry(i, 0).1))
        .expect("entries");
    let done = wait_entry(&table, peer_id, last, 0)?;
    let held = table
        .keys()
        .filter(|k| k.as_ref().is_ok_and(|k| k.peer_id == peer_id))
        .count();
    if held != ENTRIES {
        bail!("{node} holds {held} bench entries, not {ENTRIES}");
    }
    Ok(done - start)
}

/// What one format measured: its apply, and (p50, p99) of each round's
/// one-entry changes, quiet and with one core busy.
struct Applied {
    converge_ms: f64,
    quiet: Vec<(f64, f64)>,
    busy: Vec<(f64, f64)>,
}

impl Applied {
    fn p50(&self) -> Vec<f64> {
        self.quiet.iter().map(|(p50, _)| *p50).collect()
    }

    fn p99(&self) -> Vec<f64> {
        self.quiet.iter().map(|(_, p99)| *p99).collect()
    }

    fn busy_p99(&self) -> Vec<f64> {
        self.busy.iter().map(|(_, p99)| *p99).collect()
    }
}

/// p50 and p99 of {UPDATES} one-entry changes, in ms.
fn update_spread(node: &str, peer_id: u32, format: Format) -> Result<Spread> {
    Ok(spread(&update_latencies(node, peer_id, format)?))
}

fn update_latencies(node: &str, peer_id: u32, format: Format) -> Result<Vec<f64>> {
    let table: HashMap<MapData, MappingKey, Be32> =
        lab::pinned_hash(&lab::bpffs(node), names::MAP_NATMAP)?;
    let mut latencies = Vec::with_capacity(UPDATES);
    for n in 0..UPDATES {
        let i = (n * 7919) % ENTRIES;
        let generation = 1 + (n % 2) as u8;
        let text = bench_mapping(ENTRIES, Some((i, generation)), format);
        let start = Instant::now();
        lab::write_object(node, format.file(), &text)?;
        let done = wait_entry(&table, peer_id, i, generation)?;
        latencies.push((done - start).as_secs_f64() * 1e3);
    }
    Ok(latencies)
}
