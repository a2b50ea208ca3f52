//! Prometheus metrics and health endpoints, served on `--metrics-addr`.
//!
//! Dataplane counters are read from the per-CPU map at scrape time, so the
//! packet path never waits on the agent.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use aya::maps::MapError;

use axum::{
    Router,
    extract::State,
    http::{
        HeaderMap, StatusCode,
        header::{ACCEPT, CONTENT_TYPE},
    },
    response::IntoResponse,
    routing::get,
};
use isthmus_common::counters::{DENY_REASONS, deny_slot};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
    },
    registry::Registry,
};
use tracing::warn;

use crate::{
    kernel::maps::{Counters, Occupancy, PinnedMaps},
    model::object::{KIND_NAT_MAPPING, KIND_NODE, KIND_TUNNEL_ENDPOINT},
    model::peer::Peer,
    observe::samples::DataplaneCounters,
    roles::gateway::conncheck::{Checks, Health},
    tunnel::{Connection, PeerStatus, Tunnel},
};

/// The metrics one agent exposes.
pub struct Metrics {
    registry: Registry,
    /// The metrics Liqo's gateway exports, under Liqo's names, for the
    /// dashboards that read them.
    liqo: Registry,
    ready: AtomicBool,
    /// The embedded tunnel, whose threads `/healthz` vouches for.
    tunnel: Option<Arc<Tunnel>>,
    /// Peers programmed into the kernel.
    pub peers: Gauge,
    /// Objects currently rejected.
    pub rejected_objects: Gauge,
    /// Kernel map elements written or removed, by operation.
    pub map_updates: Family<[(&'static str, &'static str); 1], Counter>,
    /// Reconcile passes that failed to write the kernel, by object kind.
    pub reconcile_errors: Family<[(&'static str, &'static str); 1], Counter>,
    /// Reconcile passes that found a kernel table full.
    pub map_full: Counter,
    /// NatMapping entries programmed into the kernel.
    pub nat_mappings: Gauge,
    /// Conntrack entries in use after the last collection (two per flow).
    pub conntrack_entries: Gauge,
    /// TunnelEndpoint status decisions, by outcome: written, skipped
    /// (already shown, or not due), failed.
    pub status_writes: Family<[(&'static str, &'static str); 1], Counter>,
    /// When the last reconcile pass brought every kernel table up to date.
    last_reconcile: Gauge<f64, AtomicU64>,
    /// The labels of each peer, by the ID the kernel counts it under.
    peer_labels: PeerIds,
}

/// Each peer's labels by its ID in the kernel, shared with a collector.
type PeerIds = Arc<std::sync::RwLock<BTreeMap<u32, PeerLabels>>>;

/// What `isthmus_build_info` says of this agent.
pub struct BuildInfo<'a> {
    /// The node it runs on.
    pub node: &'a str,
    /// `gateway` or `worker`.
    pub role: &'a str,
    /// How the TC programs are attached: `tcx` or `clsact`.
    pub attach_mode: &'a str,
    /// How the XDP guard is attached (`native`), or `none`.
    pub xdp_mode: &'a str,
}

impl Metrics {
    /// Registers every metric, reading the dataplane's maps pinned under
    /// `bpffs` (none without it: the tables are then not the kernel's), and
    /// the embedded tunnel's state if this node has one.
    pub fn new(
        bpffs: Option<&Path>,
        gateway: Option<GatewayState>,
        build: BuildInfo,
    ) -> Result<Arc<Self>, MapError> {
        let mut registry = Registry::with_prefix("isthmus");
        let mut liqo = Registry::with_prefix("liqo");
        let tunnel = gateway.as_ref().map(|g| g.tunnel.clone());
        let peers = Gauge::default();
        let rejected_objects = Gauge::default();
        let map_updates = Family::default();
        let reconcile_errors = Family::default();
        let map_full = Counter::default();
        let nat_mappings = Gauge::default();
        let conntrack_entries = Gauge::default();
        let status_writes = Family::default();
        let last_reconcile = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "last_reconcile_timestamp_seconds",
            "When a reconcile pass last brought every kernel table up to date (Unix time)",
            last_reconcile.clone(),
        );
        registry.register(
            "status_writes",
            "TunnelEndpoint status decisions of the gateway, by outcome",
            status_writes.clone(),
        );
        registry.register(
            "conntrack_entries",
            "Conntrack entries in use after the last garbage collection, two per masqueraded flow",
            conntrack_entries.clone(),
        );
        registry.register("peers", "Peers programmed into the kernel", peers.clone());
        registry.register(
            "nat_mappings",
            "NatMapping entries programmed into the kernel",
            nat_mappings.clone(),
        );
        registry.register(
            "map_full",
            "Reconcile passes that found a kernel table full; nothing is evicted",
            map_full.clone(),
        );
        registry.register(
            "rejected_objects",
            "Objects rejected by validation",
            rejected_objects.clone(),
        );
        registry.register(
            "map_updates",
            "Kernel map elements written or removed",
            map_updates.clone(),
        );
        // Every kind's series exists from the start, so a rate over it works
        // before the first failure.
        for kind in [KIND_TUNNEL_ENDPOINT, KIND_NAT_MAPPING, KIND_NODE] {
            let _ = reconcile_errors.get_or_create(&[("kind", kind)]);
        }
        registry.register(
            "reconcile_errors",
            "Reconcile passes that failed to update a kernel table, by the kind of object it holds",
            reconcile_errors.clone(),
        );
        let kernel = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        // A gauge of 1, not an OpenMetrics info: the Prometheus text format
        // that promtool checks has no info type.
        let build_info = Family::<[(&'static str, String); 6], Gauge>::default();
        build_info
            .get_or_create(&[
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("kernel", kernel),
                ("attach_mode", build.attach_mode.to_owned()),
                ("xdp_mode", build.xdp_mode.to_owned()),
                ("node", build.node.to_owned()),
                ("role", build.role.to_owned()),
            ])
            .set(1);
        registry.register(
            "build_info",
            "The agent's version, the kernel, how its programs are attached, its node and role; always 1",
            build_info,
        );
        if let Some(gateway) = gateway {
            registry.register_collector(Box::new(TunnelMetrics(gateway.tunnel.clone())));
            liqo.register_collector(Box::new(LiqoMetrics(gateway)));
        }
        let peer_labels = PeerIds::default();
        if let Some(bpffs) = bpffs {
            let occupancy = Occupancies::default();
            count_occupancy(PinnedMaps::open(bpffs)?, occupancy.clone());
            registry.register_collector(Box::new(DataplaneMetrics {
                counters: DataplaneCounters::open(bpffs)?,
                occupancy,
            }));
            registry.register_collector(Box::new(DeniedMetrics {
                counters: Counters::open_denied(bpffs)?,
                peers: peer_labels.clone(),
            }));
        }
        Ok(Arc::new(Self {
            registry,
            liqo,
            ready: AtomicBool::new(false),
            tunnel,
            peers,
            rejected_objects,
            map_updates,
            reconcile_errors,
            map_full,
            nat_mappings,
            conntrack_entries,
            status_writes,
            last_reconcile,
            peer_labels,
        }))
    }

    /// Names the peers the kernel counts by ID.
    pub fn set_peer_ids<'a>(&self, peers: impl IntoIterator<Item = (u32, &'a Peer)>) {
        let labels = peers
            .into_iter()
            .map(|(id, p)| (id, peer_labels(p.label(), p.name())))
            .collect();
        *self.peer_labels.write().unwrap_or_else(|p| p.into_inner()) = labels;
    }

    /// Records a reconcile pass that brought every kernel table up to date.
    pub fn reconciled(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_reconcile.set(now);
    }

    /// Records a reconcile pass that failed to update the table of `kind`.
    pub fn reconcile_failed(&self, kind: &'static str) {
        self.reconcile_errors.get_or_create(&[("kind", kind)]).inc();
    }

    /// Marks the agent ready: the dataplane is attached and the source synced.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    fn text(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.liqo)?;
        // One exposition: the first registry's end marker goes.
        out.truncate(out.len() - "# EOF\n".len());
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The dataplane's counters, read at scrape time, and how full each map
/// is, as last counted.
#[derive(Debug)]
struct DataplaneMetrics {
    counters: DataplaneCounters,
    occupancy: Occupancies,
}

/// How full each map was when last counted: walking a big hash map's keys
/// takes a while, so it is done on a timer, off the async runtime, and a
/// scrape reads the result.
type Occupancies = Arc<std::sync::Mutex<Vec<Occupancy>>>;

/// How often map occupancy is counted.
const OCCUPANCY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Counts map occupancy now, then every [`OCCUPANCY_EVERY`], on a thread
/// of its own.
fn count_occupancy(maps: PinnedMaps, into: Occupancies) {
    let counter = std::thread::Builder::new()
        .name("map-occupancy".into())
        .spawn(move || {
            loop {
                match maps.occupancy() {
                    Ok(counted) => *into.lock().unwrap_or_else(|p| p.into_inner()) = counted,
                    Err(e) => warn!(error = %e, "counting map entries"),
                }
                std::thread::sleep(OCCUPANCY_EVERY);
            }
        });
    if let Err(e) = counter {
        warn!(error = %e, "starting the map occupancy counter: map occupancy will not be reported");
    }
}

impl Collector for DataplaneMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.counters.families() {
            Ok(families) => {
                for f in families {
                    let mut family =
                        encoder.encode_descriptor(f.name, f.help, None, MetricType::Counter)?;
                    for (labels, value) in f.samples {
                        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
                    }
                }
            }
            Err(e) => warn!(error = %e, "reading the per-CPU counters"),
        }
        let occupancy = self
            .occupancy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        occupancy_families(&mut encoder, &occupancy)
    }
}

/// How full each map is against its capacity.
fn occupancy_families(
    encoder: &mut DescriptorEncoder,
    maps: &[Occupancy],
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        (
            "map_entries",
            "Entries in use in each pinned map (an array's slots always are)",
            (|o: &Occupancy| o.entries) as fn(&Occupancy) -> u32,
        ),
        (
            "map_capacity_entries",
            "Entries each pinned map can hold",
            |o: &Occupancy| o.capacity,
        ),
    ] {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for o in maps {
            ConstGauge::new(i64::from(value(o)))
                .encode(family.encode_family(&[("map", o.map)])?)?;
        }
    }
    Ok(())
}

/// Labels of a per-peer sample.
type PeerLabels = [(&'static str, String); 2];

fn peer_labels(cluster_id: &str, cluster_name: &str) -> PeerLabels {
    [
        ("cluster_id", cluster_id.to_owned()),
        ("cluster_name", cluster_name.to_owned()),
    ]
}

/// Peers' packets the ingress NAT dropped for where they were headed, read
/// at scrape time.
#[derive(Debug)]
struct DeniedMetrics {
    counters: Counters,
    peers: PeerIds,
}

impl Collector for DeniedMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sums = match self.counters.read() {
            Ok(sums) => sums,
            Err(e) => {
                warn!(error = %e, "reading the denied-packet counters");
                return Ok(());
            }
        };
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner()).clone();
        // ID 0 collects the peers beyond the map's reach.
        let beyond = DENY_REASONS
            .iter()
            .any(|r| sums[deny_slot(0, *r) as usize] > 0);
        let named = peers
            .into_iter()
            .chain(beyond.then(|| (0, peer_labels("other", "other"))));
        let mut family = encoder.encode_descriptor(
            "peer_denied_packets",
            "Packets from the peer dropped for where they were headed, by reason: a peer reaches only our Pod and External networks, its NatMapping endpoints and flows we masqueraded",
            None,
            MetricType::Counter,
        )?;
        for (id, [cluster_id, cluster_name]) in named {
            for reason in DENY_REASONS {
                let labels = [
                    cluster_id.clone(),
                    cluster_name.clone(),
                    ("reason", reason.as_str().to_owned()),
                ];
                ConstCounter::new(sums[deny_slot(id, reason) as usize])
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Encodes one metric family: a descriptor, then one sample per label set.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// What a gateway's metrics read at scrape time.
pub struct GatewayState {
    /// The embedded tunnel.
    pub tunnel: Arc<Tunnel>,
    /// The conncheck.
    pub checks: Arc<Mutex<Checks>>,
    /// The tunnel's device, Liqo's `device` label.
    pub device: String,
}

/// Liqo's `pkg/liqonet/tunnel/metrics`, with its names and labels
/// (`driver`, `device`, `cluster_id`, `cluster_name`): whether the
/// conncheck answers, its round trip, and the bytes of peers it answers.
struct LiqoMetrics(GatewayState);

impl std::fmt::Debug for LiqoMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiqoMetrics")
    }
}

/// Liqo's labels of one peer.
type LiqoLabels = [(&'static str, String); 4];

impl Collector for LiqoMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let peers = self.0.tunnel.status();
        let now = std::time::Instant::now();
        let checks = self.0.checks.lock().unwrap_or_else(|p| p.into_inner());
        let health: Vec<(LiqoLabels, &PeerStatus, Option<Health>)> = peers
            .iter()
            .map(|p| {
                let labels = [
                    ("driver", "wireguard".to_owned()),
                    ("device", self.0.device.clone()),
                    ("cluster_id", p.label.clone()),
                    ("cluster_name", p.cluster_name.clone()),
                ];
                (labels, p, checks.health(&p.label, now))
            })
            .collect();
        drop(checks);
        let connected = |h: &Option<Health>| h.is_some_and(|h| h.connected);
        family(
            &mut encoder,
            "peer_is_connected",
            "Status of the connectivity to a given peer (true = the tunnel is up and gateways are pinging each other)",
            MetricType::Gauge,
            health
                .iter()
                .map(|(l, _, h)| (l.clone(), ConstGauge::new(i64::from(connected(h))))),
        )?;
        // As Liqo: the other three only for peers the conncheck reaches.
        let up = || health.iter().filter(|(_, _, h)| connected(h));
        family(
            &mut encoder,
            "peer_latency_us",
            "Round-trip latency of a given peer in microseconds",
            MetricType::Gauge,
            up().map(|(l, _, h)| {
                let rtt = h.and_then(|h| h.rtt).unwrap_or_default();
                (l.clone(), ConstGauge::new(rtt.as_micros() as f64))
            }),
        )?;
        family(
            &mut encoder,
            "peer_receive_bytes",
            "Number of bytes received from a given peer",
            MetricType::Counter,
            up().map(|(l, p, _)| (l.clone(), ConstCounter::new(p.rx_bytes))),
        )?;
        family(
            &mut encoder,
            "peer_transmit_bytes",
            "Number of bytes transmitted to a given peer",
            MetricType::Counter,
            up().map(|(l, p, _)| (l.clone(), ConstCounter::new(p.tx_bytes))),
        )
    }
}

/// Per-peer and tunnel-wide state of the embedded WireGuard, read at scrape time.
struct TunnelMetrics(Arc<Tunnel>);

impl std::fmt::Debug for TunnelMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelMetrics")
    }
}

impl Collector for TunnelMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let peers = self.0.status();
        let label = |p: &PeerStatus| peer_labels(&p.label, &p.cluster_name);
        let gauge = |encoder: &mut DescriptorEncoder,
                     name: &str,
                     help: &str,
                     values: Vec<(PeerLabels, f64)>| {
            family(
                encoder,
                name,
                help,
                MetricType::Gauge,
                values.into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
            )
        };
        let counter = |encoder: &mut DescriptorEncoder,
                       name: &str,
                       help: &str,
                       values: Vec<(PeerLabels, u64)>| {
            family(
                encoder,
                name,
                help,
                MetricType::Counter,
                values.into_iter().map(|(l, v)| (l, ConstCounter::new(v))),
            )
        };
        gauge(
            &mut encoder,
            "peer_connected",
            "Whether a WireGuard session with the peer is up (1) or not (0)",
            peers
                .iter()
                .map(|p| {
                    (
                        label(p),
                        f64::from(u8::from(p.connection == Connection::Connected)),
                    )
                })
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "peer_last_handshake_seconds",
            "Seconds since the last completed handshake with the peer",
            peers
                .iter()
                .filter_map(|p| Some((label(p), p.last_handshake?.as_secs_f64())))
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "peer_rtt_seconds",
            "Round-trip time to the peer, estimated at the last handshake",
            peers
                .iter()
                .filter_map(|p| Some((label(p), f64::from(p.rtt_ms?) / 1000.0)))
                .collect(),
        )?;
        counter(
            &mut encoder,
            "peer_receive_bytes",
            "Bytes received from the peer, after decryption",
            peers.iter().map(|p| (label(p), p.rx_bytes)).collect(),
        )?;
        counter(
            &mut encoder,
            "peer_transmit_bytes",
            "Bytes sent to the peer, before encryption",
            peers.iter().map(|p| (label(p), p.tx_bytes)).collect(),
        )?;
        counter(
            &mut encoder,
            "peer_receive_packets",
            "Packets received from the peer and delivered",
            peers.iter().map(|p| (label(p), p.rx_packets)).collect(),
        )?;
        counter(
            &mut encoder,
            "peer_transmit_packets",
            "Packets sent to the peer",
            peers.iter().map(|p| (label(p), p.tx_packets)).collect(),
        )?;
        counter(
            &mut encoder,
            "peer_source_violations",
            "Authenticated packets from the peer dropped because their inner source lay outside its networks",
            peers.iter().map(|p| (label(p), p.dropped_source)).collect(),
        )?;
        counter(
            &mut encoder,
            "peer_handshake_failures",
            "Handshake messages from the peer that failed to authenticate, and handshakes with it given up after retrying",
            peers
                .iter()
                .map(|p| (label(p), p.handshake_failures))
                .collect(),
        )?;
        let c = self.0.counters();
        let mut family = encoder.encode_descriptor(
            "tunnel_dropped_packets",
            "Packets the tunnel dropped, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, value) in [
            ("no_route", &c.no_route),
            ("unknown_sender", &c.unknown_sender),
            ("rejected", &c.rejected),
            ("malformed", &c.malformed),
            ("oversized", &c.oversized),
        ] {
            ConstCounter::new(value.load(Ordering::Relaxed))
                .encode(family.encode_family(&[("reason", reason)])?)?;
        }
        let family = encoder.encode_descriptor(
            "tunnel_cookies_sent",
            "Cookie replies sent to handshake initiations under load",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(c.cookies.load(Ordering::Relaxed)).encode(family)?;
        let family = encoder.encode_descriptor(
            "tunnel_thread_restarts",
            "Datapath threads of the tunnel restarted after a panic",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(c.thread_restarts.load(Ordering::Relaxed)).encode(family)?;
        let mut family = encoder.encode_descriptor(
            "tunnel_offload_batches",
            "Packets that crossed a device as one batch of several, by offload",
            None,
            MetricType::Counter,
        )?;
        for (offload, value) in [
            ("tso_split", &c.tso_split),
            ("gro_written", &c.gro_written),
            ("udp_gso_sent", &c.udp_gso_sent),
            ("udp_gro_received", &c.udp_gro_received),
        ] {
            ConstCounter::new(value.load(Ordering::Relaxed))
                .encode(family.encode_family(&[("offload", offload)])?)?;
        }
        Ok(())
    }
}

/// The port of the metrics and health endpoints unless told otherwise.
pub const DEFAULT_PORT: u16 = 9873;

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until the
/// process exits. Binding happens before returning, so a busy port fails here.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .with_state(metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

/// Serves OpenMetrics to a scraper that asks for it (Prometheus does), and
/// the classic text format to anything else (`curl`, `promtool`). Reading
/// the kernel's counters takes system calls: done on a blocking thread, so
/// that scrapes, however many, never hold up `/healthz`.
async fn scrape(State(metrics): State<Arc<Metrics>>, headers: HeaderMap) -> impl IntoResponse {
    let Ok(Ok(body)) = tokio::task::spawn_blocking(move || metrics.text()).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let openmetrics = headers
        .get(ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains(OPENMETRICS));
    let (content_type, body) = match openmetrics {
        true => (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        ),
        false => (
            "text/plain; version=0.0.4; charset=utf-8",
            classic_text(&body),
        ),
    };
    (StatusCode::OK, [(CONTENT_TYPE, content_type)], body).into_response()
}

const OPENMETRICS: &str = "application/openmetrics-text";

/// The classic Prometheus text format of an OpenMetrics exposition: a
/// counter's HELP and TYPE lines name it with its `_total` suffix, as its
/// samples do, and the `# EOF` and `# UNIT` lines go.
fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(described.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Healthy unless a datapath thread of the tunnel is down: Kubernetes then
/// restarts the agent if the thread does not come back.
async fn health(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    match metrics.tunnel.as_ref().is_none_or(|t| t.healthy()) {
        true => (StatusCode::OK, "ok"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "a tunnel thread is down"),
    }
}

async fn ready(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_with_their_samples_suffix() {
        let openmetrics = "# HELP isthmus_peers Peers.\n# TYPE isthmus_peers gauge\nisthmus_peers 2\n\
            # HELP isthmus_map_full Full passes.\n# TYPE isthmus_map_full counter\n# UNIT isthmus_map_full passes\n\
            isthmus_map_full_total 0\n# EOF\n";
        assert_eq!(
            classic_text(openmetrics),
            "# HELP isthmus_peers Peers.\n# TYPE isthmus_peers gauge\nisthmus_peers 2\n\
             # HELP isthmus_map_full_total Full passes.\n# TYPE isthmus_map_full_total counter\n\
             isthmus_map_full_total 0\n"
        );
    }
}
