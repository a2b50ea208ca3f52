//! `cargo xtask bench control`, the Kubernetes part: 200 TunnelEndpoints
//! and 10,000 NatMapping entries delivered as watch events by the fake API
//! server (`isthmus_lab::fake_api`) to a gateway agent run with `--source kube`.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use ipnet::Ipv4Net;

use anyhow::{Result, ensure};
use aya::maps::{HashMap, MapData};
use isthmus_common::{
    names,
    nat::{MappingKey, PeerKey, PeerNat},
    wire::Be32,
};
use isthmus_lab::{
    cmd::ip,
    fake_api::FakeApi,
    kube_lab::{KubeNode, Networks, nat_mapping, tunnel_endpoint},
    wait::poll,
};
use serde_json::{Value, json};

use super::{
    burner::{quiet_and_busy, spread},
    gateways::{maps_to, peer_id, synthetic_key},
    stats::{median, ratio_line, rss_mib},
    write_section,
};

/// TunnelEndpoints delivered.
const PEERS: usize = 200;
/// NatMapping entries per peer: 10,000 in all.
const ENTRIES_PER_PEER: usize = 50;
/// Single-object changes timed from event to kernel, per round and setting.
const UPDATES: usize = 200;
/// Rounds, each timing changes on a quiet machine, then with a core busy.
const ROUNDS: usize = 5;
const NS: &str = "ist-t-bench-kube";
const CONVERGE_TARGET_MS: f64 = 2000.0;
const P99_TARGET_MS: f64 = 10.0;
/// The p99 target while a CPU burner keeps one core busy.
const BUSY_P99_TARGET_MS: f64 = 25.0;
const RSS_BUDGET_MIB: f64 = 64.0;
/// Longest any one wait may take before the bench gives up.
const GIVE_UP: Duration = Duration::from_mins(1);

/// Peer `i`'s PodCIDR as we see it: remapped or not.
fn pod_view(i: usize, remapped: bool) -> Ipv4Net {
    Ipv4Net::new(
        Ipv4Addr::new(10, if remapped { 102 } else { 100 }, i as u8, 0),
        24,
    )
    .expect("a /24")
}

fn peer(i: usize, remapped: bool) -> Value {
    let (pod, external) = (format!("10.100.{i}.0/24"), format!("10.101.{i}.0/24"));
    let nets = Networks {
        local_pod: "10.244.0.0/16",
        local_external: "10.128.0.0/16",
        remote_pod: &pod,
        remote_external: &external,
    };
    let remote_nat_pod = if remapped {
        pod_view(i, true).to_string()
    } else {
        "None".into()
    };
    tunnel_endpoint(
        &format!("tep-{i}"),
        &format!("cluster-{i}"),
        &nets,
        json!({
            "remoteNATPodCIDR": remote_nat_pod,
            "endpointIP": format!("198.18.1.{}", i + 1),
            "backend_config": {"port": "5871", "publicKey": synthetic_key(i)},
        }),
    )
}

/// Entry `k` of peer `i`'s NatMapping: (endpointIP, externalIP). The
/// endpoint moves with `generation`.
fn entry(i: usize, k: usize, generation: usize) -> (Ipv4Addr, Ipv4Addr) {
    let (i, k) = (i as u8, k as u8);
    (
        Ipv4Addr::new(10, 244, i, k + (ENTRIES_PER_PEER * generation) as u8),
        Ipv4Addr::new(10, 128, i, k),
    )
}

/// Peer `i`'s NatMapping, with entry `changed.0` at generation `changed.1`.
fn mapping(i: usize, changed: Option<(usize, usize)>) -> Value {
    let entries: Vec<(Ipv4Addr, Ipv4Addr)> = (0..ENTRIES_PER_PEER)
        .map(|k| match changed {
            Some((c, generation)) if c == k => entry(i, k, generation),
            _ => entry(i, k, 0),
        })
        .collect();
    nat_mapping(&format!("cluster-{i}"), &entries)
}

/// What the kube part measured.
pub struct KubeFigures {
    converge_ms: f64,
    /// (p50, p99) of each round's changes on a quiet machine.
    quiet: Vec<(f64, f64)>,
    /// (p50, p99) of each round's changes with one core kept busy.
    busy: Vec<(f64, f64)>,
    rss_mib: f64,
}

/// How often a wait reads the kernel maps.
const NAP: Duration = Duration::from_micros(100);

/// Runs the kube part on a node of its own; the lab must be up.
pub fn measure() -> Result<KubeFigures> {
    let mut node = KubeNode::new(NS, true)?;
    // The tunnel's handshakes leave through a veth whose other end answers
    // nothing (this kernel has no dummy devices).
    ip(
        NS,
        &[
            "link", "add", "wan0", "type", "veth", "peer", "name", "wan1",
        ],
    )?;
    ip(NS, &["addr", "add", "198.18.0.1/15", "dev", "wan0"])?;
    for dev in ["wan0", "wan1"] {
        ip(NS, &["link", "set", dev, "up"])?;
    }
    let pid = node.start_agent(&[])?;
    let peers: HashMap<MapData, PeerKey, PeerNat> =
        crate::lab::pinned_hash(&node.bpffs(), names::MAP_PEERS)?;
    let mappings: HashMap<MapData, MappingKey, Be32> =
        crate::lab::pinned_hash(&node.bpffs(), names::MAP_NATMAP)?;
    let holds = |id, (endpoint, external)| maps_to(&mappings, id, external, endpoint);

    println!(
        "bench: delivering {PEERS} TunnelEndpoints and {PEERS} NatMappings of {ENTRIES_PER_PEER} entries as watch events"
    );
    let start = Instant::now();
    for i in 0..PEERS {
        node.api.apply(peer(i, false));
    }
    for i in 0..PEERS {
        node.api.apply(mapping(i, None));
    }
    // Events arrive in order, and each pass writes everything before it:
    // the last object's last entry is the last to land.
    let last = PEERS - 1;
    let mut last_id = None;
    let done = poll(GIVE_UP, NAP, "the last NatMapping in the kernel", || {
        last_id = last_id.or_else(|| peer_id(&peers, pod_view(last, false)));
        let id = last_id?;
        holds(id, entry(last, ENTRIES_PER_PEER - 1, 0)).then(Instant::now)
    })?;
    let converge_ms = (done - start).as_secs_f64() * 1e3;
    let (networks, entries) = (peers.keys().count(), mappings.keys().count());
    ensure!(
        networks == 2 * PEERS && entries == PEERS * ENTRIES_PER_PEER,
        "the kernel holds {networks} peer networks and {entries} entries"
    );
    println!("bench:   converged in {converge_ms:.1} ms");

    let mut changes = Changes {
        api: &node.api,
        peers: &peers,
        mappings: &mappings,
        done: 0,
        remapped: [false; PEERS],
    };
    let (quiet, busy) = quiet_and_busy(NS, ROUNDS, "event to kernel", || {
        Ok(spread(&changes.time(UPDATES)?))
    })?;
    let rss_mib = rss_mib(pid)?;
    Ok(KubeFigures {
        converge_ms,
        quiet,
        busy,
        rss_mib,
    })
}

/// The single-object changes, alternating: one NatMapping entry moves to
/// another endpoint, or one TunnelEndpoint's PodCIDR is remapped (or back).
struct Changes<'a> {
    api: &'a FakeApi,
    peers: &'a HashMap<MapData, PeerKey, PeerNat>,
    mappings: &'a HashMap<MapData, MappingKey, Be32>,
    /// Changes made so far: the next one follows from it.
    done: usize,
    remapped: [bool; PEERS],
}

impl Changes<'_> {
    /// Makes `count` changes one after the other; how long each took from
    /// the API server to the kernel, in ms.
    fn time(&mut self, count: usize) -> Result<Vec<f64>> {
        (0..count).map(|_| self.next()).collect()
    }

    fn next(&mut self) -> Result<f64> {
        let n = self.done;
        self.done += 1;
        let i = (n * 37) % PEERS;
        let start = Instant::now();
        let done = if n.is_multiple_of(2) {
            let (k, generation) = ((n * 13) % ENTRIES_PER_PEER, 1 + n % 4 / 2);
            let id = peer_id(self.peers, pod_view(i, self.remapped[i]))
                .ok_or_else(|| anyhow::anyhow!("peer {i} is not programmed"))?;
            self.api.apply(mapping(i, Some((k, generation))));
            poll(GIVE_UP, NAP, "a NatMapping change in the kernel", || {
                let (endpoint, external) = entry(i, k, generation);
                maps_to(self.mappings, id, external, endpoint).then(Instant::now)
            })?
        } else {
            self.remapped[i] = !self.remapped[i];
            self.api.apply(peer(i, self.remapped[i]));
            let view = pod_view(i, self.remapped[i]);
            poll(
                GIVE_UP,
                NAP,
                "a TunnelEndpoint change in the kernel",
                || peer_id(self.peers, view).map(|_| Instant::now()),
            )?
        };
        Ok((done - start).as_secs_f64() * 1e3)
    }
}

/// Prints the RESULT lines and writes the `kube` section of the report.
pub fn report(f: &KubeFigures) -> Result<()> {
    let rounds = f.quiet.len();
    let p50 = |r: &[(f64, f64)]| r.iter().map(|(p50, _)| *p50).collect::<Vec<_>>();
    let p99 = |r: &[(f64, f64)]| r.iter().map(|(_, p99)| *p99).collect::<Vec<_>>();
    let target = |ms| vec![ms; rounds];
    let lines = [
        ratio_line(
            "kube-200-teps-10k-entries-converge-ms-vs-target",
            &[f.converge_ms],
            &[CONVERGE_TARGET_MS],
            2,
        ),
        ratio_line(
            "kube-event-to-map-p50-ms-vs-target",
            &p50(&f.quiet),
            &target(P99_TARGET_MS),
            2,
        ),
        ratio_line(
            "kube-event-to-map-p99-ms-vs-target",
            &p99(&f.quiet),
            &target(P99_TARGET_MS),
            2,
        ),
        ratio_line(
            "kube-event-to-map-p99-ms-busy-vs-target",
            &p99(&f.busy),
            &target(BUSY_P99_TARGET_MS),
            2,
        ),
        ratio_line(
            "agent-rss-mib-kube-200-teps-10k-entries-vs-budget",
            &[f.rss_mib],
            &[RSS_BUDGET_MIB],
            2,
        ),
    ]
    .concat();
    let (quiet_p50, quiet_p99) = (median(&p50(&f.quiet)), median(&p99(&f.quiet)));
    let (busy_p50, busy_p99) = (median(&p50(&f.busy)), median(&p99(&f.busy)));
    let section = format!(
        "## Control plane: objects from the Kubernetes API to the kernel

Also part of `cargo xtask bench control` (`--kube-only` runs this part
alone). A gateway agent runs with `--source kube` in a netns of its own,
against the fake API server of the tests (`lab/src/fake_api.rs`), which
speaks the list/watch protocol. Its tunnel is on, and handshakes go to
nowhere, so it also writes `Connecting` for every TunnelEndpoint, which
comes back as watch events.

- **Converge.** {PEERS} TunnelEndpoints, then {PEERS} NatMappings of
  {ENTRIES_PER_PEER} entries ({total} in all), are created in the API
  server as fast as it takes them; each reaches the agent as an `ADDED`
  event. The clock stops when the last entry of the last NatMapping is in
  the kernel, read from the pinned map; then every count is checked.
- **Event to kernel.** {UPDATES} single-object changes, alternating: one
  NatMapping entry moves to another endpoint, or one TunnelEndpoint's
  PodCIDR is remapped (or back). Each is timed from the change in the API
  server until the kernel shows it. {ROUNDS} rounds, each of {UPDATES}
  changes on a quiet machine, then {UPDATES} while a CPU burner (a shell
  loop in the agent's netns, bounded by `timeout`) keeps one of the two
  cores busy; the table gives the medians over rounds, the RESULT lines
  the spread.

| measure | Isthmus | target |
|---|---|---|
| {PEERS} TunnelEndpoints and {total} entries converge | {converge:.1} ms | < {CONVERGE_TARGET_MS:.0} ms |
| event to kernel, p50 / p99, quiet | {quiet_p50:.2} / {quiet_p99:.2} ms | p99 < {P99_TARGET_MS:.0} ms |
| event to kernel, p50 / p99, one core busy | {busy_p50:.2} / {busy_p99:.2} ms | p99 < {BUSY_P99_TARGET_MS:.0} ms |
| agent resident memory | {rss:.1} MiB | ≤ {RSS_BUDGET_MIB:.0} MiB |

```
{lines}```
",
        total = PEERS * ENTRIES_PER_PEER,
        converge = f.converge_ms,
        rss = f.rss_mib,
    );
    write_section("kube", &section)
}
