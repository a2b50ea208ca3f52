//! What a gateway exports: Liqo's own metric families, under Liqo's names
//! and labels, and the embedded tunnel's state.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
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
    sync::Unpoisoned,
    tunnel::{Connection, PeerStatus, TunnelCounters, set::TunnelSet},
};

use super::collect::{family, peer_labels};

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
    /// The embedded tunnels, one per tunnel device.
    pub tunnels: Arc<TunnelSet>,
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
        let peers = self.0.tunnels.status();
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
pub(super) struct TunnelMetrics(pub(super) Arc<TunnelSet>);

impl std::fmt::Debug for TunnelMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelMetrics")
    }
}

/// How a family reads each peer's value.
enum PeerValue {
    /// A gauge, for the peers that have a value.
    Gauge(fn(&PeerStatus) -> Option<f64>),
    /// A counter, for every peer.
    Counter(fn(&PeerStatus) -> u64),
}

/// One family of the tunnel's peers: a metric of a peer is one entry.
struct PeerFamily {
    name: &'static str,
    help: &'static str,
    value: PeerValue,
}

const PEER_FAMILIES: [PeerFamily; 11] = [
    PeerFamily {
        name: "peer_connected",
        help: "Whether a WireGuard session with the peer is up (1) or not (0)",
        value: PeerValue::Gauge(|p| {
            Some(f64::from(u8::from(p.connection == Connection::Connected)))
        }),
    },
    PeerFamily {
        name: "peer_last_handshake_seconds",
        help: "Seconds since the last completed handshake with the peer",
        value: PeerValue::Gauge(|p| Some(p.last_handshake?.as_secs_f64())),
    },
    PeerFamily {
        name: "peer_rtt_seconds",
        help: "Round-trip time to the peer, estimated at the last handshake",
        value: PeerValue::Gauge(|p| Some(f64::from(p.rtt_ms?) / 1000.0)),
    },
    PeerFamily {
        name: "peer_receive_bytes",
        help: "Bytes received from the peer, after decryption",
        value: PeerValue::Counter(|p| p.rx_bytes),
    },
    PeerFamily {
        name: "peer_transmit_bytes",
        help: "Bytes sent to the peer, before encryption",
        value: PeerValue::Counter(|p| p.tx_bytes),
    },
    PeerFamily {
        name: "peer_receive_packets",
        help: "Packets received from the peer and delivered",
        value: PeerValue::Counter(|p| p.rx_packets),
    },
    PeerFamily {
        name: "peer_transmit_packets",
        help: "Packets sent to the peer",
        value: PeerValue::Counter(|p| p.tx_packets),
    },
    PeerFamily {
        name: "peer_source_violations",
        help: "Authenticated packets from the peer dropped because their inner source lay outside its networks, or their destination was IPv6 multicast or link-local",
        value: PeerValue::Counter(|p| p.dropped_source),
    },
    PeerFamily {
        name: "peer_handshake_failures",
        help: "Handshake messages from the peer that failed to authenticate, and handshakes with it given up after retrying",
        value: PeerValue::Counter(|p| p.handshake_failures),
    },
    PeerFamily {
        name: "peer_handshake_initiations",
        help: "Handshake initiations sent to the peer: the first, retries while it does not answer, and rekeys",
        value: PeerValue::Counter(|p| p.initiations),
    },
    PeerFamily {
        name: "peer_silent_drops",
        help: "Packets for the peer dropped while it stays silent: it has no session, and its next round of handshakes waits",
        value: PeerValue::Counter(|p| p.dropped_silent),
    },
];

/// One counter family of the whole tunnel: a single series, or one per
/// value of its label.
struct TunnelFamily {
    name: &'static str,
    help: &'static str,
    series: TunnelSeries,
}

/// Reads one of the tunnel's counters.
type Count = fn(&TunnelCounters) -> &AtomicU64;

/// Where a tunnel family's counts are.
enum TunnelSeries {
    /// One counter.
    Single(Count),
    /// One counter per value of the label.
    ByLabel(&'static str, &'static [(&'static str, Count)]),
}

const TUNNEL_FAMILIES: [TunnelFamily; 4] = [
    TunnelFamily {
        name: "tunnel_dropped_packets",
        help: "Packets the tunnel dropped, by reason",
        series: TunnelSeries::ByLabel(
            "reason",
            &[
                ("no_route", |c| &c.no_route),
                ("no_endpoint", |c| &c.no_endpoint),
                ("unknown_sender", |c| &c.unknown_sender),
                ("rejected", |c| &c.rejected),
                ("malformed", |c| &c.malformed),
                ("oversized", |c| &c.oversized),
                ("handshake_throttled", |c| &c.throttled),
                ("handshake_queue_full", |c| &c.handshake_queue_full),
            ],
        ),
    },
    TunnelFamily {
        name: "tunnel_cookies_sent",
        help: "Cookie replies sent to handshake initiations under load",
        series: TunnelSeries::Single(|c| &c.cookies),
    },
    TunnelFamily {
        name: "tunnel_thread_restarts",
        help: "Datapath threads of the tunnel restarted after a panic",
        series: TunnelSeries::Single(|c| &c.thread_restarts),
    },
    TunnelFamily {
        name: "tunnel_offload_batches",
        help: "Packets that crossed a device as one batch of several, by offload",
        series: TunnelSeries::ByLabel(
            "offload",
            &[
                ("tso_split", |c| &c.tso_split),
                ("gro_written", |c| &c.gro_written),
                ("udp_gso_sent", |c| &c.udp_gso_sent),
                ("udp_gro_received", |c| &c.udp_gro_received),
            ],
        ),
    },
];

impl Collector for TunnelMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let peers = self.0.status();
        let labels = |p: &PeerStatus| peer_labels(&p.label, &p.cluster_name);
        for f in &PEER_FAMILIES {
            match f.value {
                PeerValue::Gauge(value) => {
                    let samples = peers
                        .iter()
                        .filter_map(|p| Some((labels(p), ConstGauge::new(value(p)?))));
                    family(&mut encoder, f.name, f.help, MetricType::Gauge, samples)
                }
                PeerValue::Counter(value) => {
                    let samples = peers
                        .iter()
                        .map(|p| (labels(p), ConstCounter::new(value(p))));
                    family(&mut encoder, f.name, f.help, MetricType::Counter, samples)
                }
            }?;
        }
        let count = |of: Count| ConstCounter::new(self.0.sum(of));
        for f in &TUNNEL_FAMILIES {
            let mut family =
                encoder.encode_descriptor(f.name, f.help, None, MetricType::Counter)?;
            match f.series {
                TunnelSeries::Single(of) => count(of).encode(family)?,
                TunnelSeries::ByLabel(label, series) => {
                    for (value, of) in series {
                        count(*of).encode(family.encode_family(&[(label, *value)])?)?;
                    }
                }
            }
        }
        Ok(())
    }
}
