//! What a gateway exports: Liqo's own metric families, under Liqo's names
//! and labels, and the embedded tunnel's state.

use crate::sync::Unpoisoned;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Instant,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::{
    model::peer::LiqoApi,
    roles::gateway::conncheck::{Checks, Health},
    tunnel::{Connection, PeerStatus, Tunnel},
};

use super::collect::{PeerLabels, family, peer_labels};

/// Where a gateway learns whether each peer answers.
#[derive(Clone)]
pub enum PeerHealth {
    /// Our own conncheck.
    Conncheck(Arc<Mutex<Checks>>),
    /// What another's conncheck reported, by cluster ID: as the pod of
    /// Liqo's gateway that runs our tunnel reads its `Connection`.
    Reported(Arc<Mutex<BTreeMap<String, Health>>>),
}

impl PeerHealth {
    /// How the peer whose cluster ID is `cluster_id` fares at `now`.
    fn of(&self, cluster_id: &str, now: Instant) -> Option<Health> {
        match self {
            Self::Conncheck(checks) => checks.lock().unpoisoned().health(cluster_id, now),
            Self::Reported(reported) => reported.lock().unpoisoned().get(cluster_id).copied(),
        }
    }
}

/// What a gateway's metrics read at scrape time.
pub struct GatewayState {
    /// The embedded tunnel.
    pub tunnel: Arc<Tunnel>,
    /// Whether each peer answers.
    pub health: PeerHealth,
    /// The tunnel's device, Liqo v0.10's `device` label.
    pub device: String,
    /// Whose labels the peers' families carry: Liqo v1 dropped `device`
    /// and `cluster_name` (`pkg/gateway/tunnel/metrics.go:37` at v1.2.0).
    pub liqo_api: LiqoApi,
}

/// Liqo's `pkg/liqonet/tunnel/metrics`, with its names and labels
/// (`driver`, `device`, `cluster_id`, `cluster_name`; Liqo v1's
/// `driver` and `cluster_id`): whether the conncheck answers, its round
/// trip, and the bytes of peers it answers.
pub(super) struct LiqoMetrics(pub(super) GatewayState);

impl std::fmt::Debug for LiqoMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiqoMetrics")
    }
}

/// Liqo's labels of one peer.
type LiqoLabels = Vec<(&'static str, String)>;

impl Collector for LiqoMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let peers = self.0.tunnel.status();
        let now = std::time::Instant::now();
        let health: Vec<(LiqoLabels, &PeerStatus, Option<Health>)> = peers
            .iter()
            .map(|p| {
                let mut labels = vec![
                    ("driver", "wireguard".to_owned()),
                    ("cluster_id", p.label.clone()),
                ];
                if self.0.liqo_api == LiqoApi::V0_10 {
                    labels.insert(1, ("device", self.0.device.clone()));
                    labels.push(("cluster_name", p.cluster_name.clone()));
                }
                (labels, p, self.0.health.of(&p.label, now))
            })
            .collect();
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
pub(super) struct TunnelMetrics(pub(super) Arc<Tunnel>);

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
            ("no_endpoint", &c.no_endpoint),
            ("unknown_sender", &c.unknown_sender),
            ("rejected", &c.rejected),
            ("malformed", &c.malformed),
            ("oversized", &c.oversized),
            ("handshake_throttled", &c.throttled),
            ("handshake_queue_full", &c.handshake_queue_full),
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
