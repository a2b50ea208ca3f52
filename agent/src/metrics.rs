//! Prometheus metrics and health endpoints, served on `--metrics-addr`.
//!
//! Dataplane counters are read from the per-CPU map at scrape time, so the
//! packet path never waits on the agent.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use isthmus_common::counters::{self, DIRECTIONS, OUTCOMES};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        info::Info,
    },
    registry::Registry,
};
use tracing::warn;

use isthmus_common::{guard::VERDICTS, overlay::EVENTS};

use crate::{
    maps::Counters,
    tunnel::{Connection, PeerStatus, Tunnel},
};

/// The metrics one agent exposes.
pub struct Metrics {
    registry: Registry,
    ready: AtomicBool,
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
}

impl Metrics {
    /// Registers every metric. `attach` is how the NAT programs were attached,
    /// if this node attaches them.
    pub fn new(
        counters: Counters,
        guard: Counters,
        overlay: Counters,
        tunnel: Option<Arc<Tunnel>>,
        node: &str,
        role: &str,
        attach: Option<&str>,
    ) -> Arc<Self> {
        let mut registry = Registry::with_prefix("isthmus");
        let peers = Gauge::default();
        let rejected_objects = Gauge::default();
        let map_updates = Family::default();
        let reconcile_errors = Family::default();
        let map_full = Counter::default();
        let nat_mappings = Gauge::default();
        let conntrack_entries = Gauge::default();
        let status_writes = Family::default();
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
        registry.register(
            "reconcile_errors",
            "Reconcile passes that failed to update the kernel",
            reconcile_errors.clone(),
        );
        registry.register(
            "agent",
            "The agent's node, role and attach mode",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("node", node.to_owned()),
                ("role", role.to_owned()),
                ("attach_mode", attach.unwrap_or("none").to_owned()),
            ]),
        );
        registry.register_collector(Box::new(DataplaneCounters {
            nat: counters,
            guard,
            overlay,
        }));
        if let Some(tunnel) = tunnel {
            registry.register_collector(Box::new(TunnelMetrics(tunnel)));
        }
        Arc::new(Self {
            registry,
            ready: AtomicBool::new(false),
            peers,
            rejected_objects,
            map_updates,
            reconcile_errors,
            map_full,
            nat_mappings,
            conntrack_entries,
            status_writes,
        })
    }

    /// Marks the agent ready: the dataplane is attached and the source synced.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    fn text(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Packet counters summed over CPUs at scrape time.
#[derive(Debug)]
struct DataplaneCounters {
    nat: Counters,
    guard: Counters,
    overlay: Counters,
}

impl Collector for DataplaneCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sums = match self.nat.read() {
            Ok(sums) => sums,
            Err(e) => {
                warn!(error = %e, "reading the packet counters");
                return Ok(());
            }
        };
        let mut family = encoder.encode_descriptor(
            "nat_packets",
            "Packets seen by the NAT programs, by direction and outcome",
            None,
            MetricType::Counter,
        )?;
        for direction in DIRECTIONS {
            for outcome in OUTCOMES {
                let labels = [
                    ("direction", direction.as_str()),
                    ("outcome", outcome.as_str()),
                ];
                let value = sums[counters::slot(direction, outcome) as usize];
                ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        let verdicts = VERDICTS.map(|v| v.as_str());
        let events = EVENTS.map(|e| e.as_str());
        for (counters, name, help, label, values) in [
            (
                &self.guard,
                "guard_packets",
                "Datagrams to the tunnel port seen by the XDP guard, by verdict",
                "verdict",
                &verdicts[..],
            ),
            (
                &self.overlay,
                "overlay_packets",
                "Packets the overlay sent to the gateway or another node, took in, or could not handle, by event",
                "event",
                &events[..],
            ),
        ] {
            match counters.read() {
                Ok(sums) => {
                    let mut family =
                        encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                    for (value, sum) in values.iter().zip(sums) {
                        ConstCounter::new(sum).encode(family.encode_family(&[(label, *value)])?)?;
                    }
                }
                Err(e) => warn!(error = %e, metric = name, "reading per-CPU counters"),
            }
        }
        Ok(())
    }
}

/// Labels of a per-peer sample.
type PeerLabels = [(&'static str, String); 2];

/// Encodes one metric family: a descriptor, then one sample per label set.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    samples: impl IntoIterator<Item = (PeerLabels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
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
        let label = |p: &PeerStatus| {
            [
                ("cluster_id", p.label.clone()),
                ("object", p.key.to_string()),
            ]
        };
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

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until the
/// process exits. Binding happens before returning, so a busy port fails here.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    match metrics.text() {
        Ok(body) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn ready(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
