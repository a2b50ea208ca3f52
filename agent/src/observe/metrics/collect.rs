//! The collectors that read the kernel at scrape time: the dataplane's
//! counters, map occupancy, and peers' denied packets.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use isthmus_common::counters::{DENY_REASONS, deny_slot};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};
use tracing::warn;

use crate::{
    kernel::maps::{Counters, Occupancy, PinnedMaps},
    observe::samples::DataplaneCounters,
    sync::Unpoisoned,
};

use super::PeerIds;

/// The time this agent has spent loading programs, the verifier's work.
#[derive(Debug)]
pub(super) struct ProgramLoadTime;

impl Collector for ProgramLoadTime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let seconds = ConstCounter::new(crate::kernel::dataplane::loading_time().as_secs_f64());
        let metric = encoder.encode_descriptor(
            "program_load_seconds",
            "Time spent loading eBPF programs since the agent started, nearly all of it the verifier's",
            None,
            seconds.metric_type(),
        )?;
        seconds.encode(metric)
    }
}

/// The dataplane's counters, read at scrape time, and how full each map
/// is, as last counted.
#[derive(Debug)]
pub(super) struct DataplaneMetrics {
    pub(super) counters: DataplaneCounters,
    pub(super) occupancy: Occupancies,
}

/// How full each map was when last counted: walking a big hash map's keys
/// takes a while, so it is done on a timer, off the async runtime, and a
/// scrape reads the result.
pub(super) type Occupancies = Arc<std::sync::Mutex<Vec<Occupancy>>>;

/// How often map occupancy is counted, at most.
const OCCUPANCY_EVERY: Duration = Duration::from_secs(5);
/// The waits between two counts, as a multiple of how long the last one
/// took: a walk of large tables costs at most a hundredth of a core.
const OCCUPANCY_COST_SHARE: u32 = 100;

/// Counts map occupancy now, then again after [`next_count`], on a thread
/// of its own.
pub(super) fn count_occupancy(maps: PinnedMaps, into: Occupancies) {
    let counter = std::thread::Builder::new()
        .name("map-occupancy".into())
        .spawn(move || {
            loop {
                let started = Instant::now();
                match maps.occupancy() {
                    Ok(counted) => *into.lock().unpoisoned() = counted,
                    Err(e) => warn!(error = %e, "counting map entries"),
                }
                std::thread::sleep(next_count(started.elapsed()));
            }
        });
    if let Err(e) = counter {
        warn!(error = %e, "starting the map occupancy counter: map occupancy will not be reported");
    }
}

/// The wait after a count that took `took`.
fn next_count(took: Duration) -> Duration {
    OCCUPANCY_EVERY.max(took * OCCUPANCY_COST_SHARE)
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
        let occupancy = self.occupancy.lock().unpoisoned().clone();
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
pub(super) type PeerLabels = [(&'static str, String); 2];

pub(super) fn peer_labels(cluster_id: &str, cluster_name: &str) -> PeerLabels {
    [
        ("cluster_id", cluster_id.to_owned()),
        ("cluster_name", cluster_name.to_owned()),
    ]
}

/// Peers' packets the ingress NAT dropped for where they were headed, read
/// at scrape time.
#[derive(Debug)]
pub(super) struct DeniedMetrics {
    pub(super) counters: Counters,
    pub(super) peers: PeerIds,
}

impl Collector for DeniedMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Only the slots of peers in use: the map has room for thousands,
        // and each slot read is a system call, on every scrape.
        let peers = self.peers.read().unpoisoned().clone();
        // ID 0 collects the peers beyond the map's reach.
        let ids = peers.keys().copied().chain([0]);
        let mut sums = std::collections::BTreeMap::new();
        for slot in ids.flat_map(|id| DENY_REASONS.map(|r| deny_slot(id, r))) {
            match self.counters.slot(slot) {
                Ok(sum) => sums.insert(slot, sum),
                Err(e) => {
                    warn!(error = %e, "reading the denied-packet counters");
                    return Ok(());
                }
            };
        }
        let sum = |id, reason| sums.get(&deny_slot(id, reason)).copied().unwrap_or(0);
        let beyond = DENY_REASONS.iter().any(|r| sum(0, *r) > 0);
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
                ConstCounter::new(sum(id, reason)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Encodes one metric family: a descriptor, then one sample per label set.
pub(super) fn family<L: EncodeLabelSet, M: EncodeMetric>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_that_took_long_waits_a_hundred_times_as_long() {
        assert_eq!(next_count(Duration::from_millis(1)), OCCUPANCY_EVERY);
        assert_eq!(
            next_count(Duration::from_millis(300)),
            Duration::from_secs(30)
        );
    }
}
