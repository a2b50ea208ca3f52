//! Prometheus metrics and health endpoints, served on `--metrics-addr`.
//!
//! Dataplane counters are read from the per-CPU map at scrape time, so the
//! packet path never waits on the agent.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use aya::maps::MapError;

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Metric, Registry},
};

use crate::{
    kernel::maps::{Counters, PinnedMaps},
    model::object::{ObjectKey, ObjectKind},
    model::peer::Peer,
    observe::samples::DataplaneCounters,
    sync::Unpoisoned,
    tunnel::set::TunnelSet,
};

mod collect;
mod flows;
mod gateway;
mod http;

use collect::{
    DataplaneMetrics, DeniedMetrics, Occupancies, PeerLabels, ProgramLoadTime, count_occupancy,
    peer_labels,
};
pub use gateway::{GatewayState, PeerHealth};
use gateway::{LiqoMetrics, TunnelMetrics};
pub use http::{DEFAULT_PORT, serve};

/// The metrics one agent exposes.
pub struct Metrics {
    registry: Registry,
    /// The metrics Liqo's gateway exports, under Liqo's names, for the
    /// dashboards that read them.
    liqo: Registry,
    ready: AtomicBool,
    /// The Liqo v1 gateways this agent serves now, whose readiness it
    /// vouches for: none unless it is the active gateway.
    gateways_served: RwLock<BTreeSet<ObjectKey>>,
    /// The embedded tunnels, whose threads `/healthz` vouches for.
    tunnels: Option<Arc<TunnelSet>>,
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
    /// The wait before the next collection of dead flows, as the last one
    /// adapted it.
    pub conntrack_gc_interval: Gauge<f64, AtomicU64>,
    /// Collections of dead flows run on the interval.
    pub conntrack_gc_runs: Counter,
    /// Entries each owner (a peer, or the gateway) holds in each flow
    /// table after the last collection.
    pub flow_entries: Family<OwnerLabels, Gauge>,
    /// New flows the kernel refused for want of room, by table, owner and
    /// reason; and first fragments past their owner's budget.
    pub flow_refusals: Family<RefusalLabels, Counter>,
    /// Flows never answered, evicted to make room, by table and owner.
    pub flow_evictions: Family<OwnerLabels, Counter>,
    /// 1 while this gateway is the active one (or the only one), else 0.
    pub gateway_active: Gauge,
    /// 1 while the programs forward IPv4 past netfilter, else 0.
    pub forward_past_netfilter: Gauge,
    /// IPv4 destinations the node's netfilter rules act on, which take the
    /// stack.
    pub forward_stack_destinations: Gauge,
    /// The same for IPv6, whose rules are proved apart.
    pub forward_past_netfilter_ipv6: Gauge,
    /// IPv6 destinations the node's netfilter rules act on.
    pub forward_stack_destinations_ipv6: Gauge,
    /// TunnelEndpoint status decisions, by outcome: written, skipped
    /// (already shown, or not due), failed.
    pub status_writes: Family<[(&'static str, &'static str); 1], Counter>,
    /// Time the control loop spent in each stage of its runs: an object
    /// change that arrives meanwhile waits for the stage to end.
    pub loop_stages: StageHistograms,
    /// When the last reconcile pass brought every kernel table up to date.
    last_reconcile: Gauge<f64, AtomicU64>,
    /// The labels of each peer, by the ID the kernel counts it under.
    peer_labels: PeerIds,
}

/// One histogram per stage of the control loop.
pub type StageHistograms = Family<[(&'static str, &'static str); 1], Histogram, fn() -> Histogram>;

/// Labels of a flow table and the owner of entries in it.
pub type OwnerLabels = [(&'static str, String); 2];
/// [`OwnerLabels`] and a reason.
pub type RefusalLabels = [(&'static str, String); 3];

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
        let tunnels = gateway.as_ref().map(|g| g.tunnels.clone());
        let peer_labels = PeerIds::default();
        registry.register_collector(Box::new(ProgramLoadTime));
        if let Some(gateway) = gateway {
            registry.register_collector(Box::new(TunnelMetrics(gateway.tunnels.clone())));
            liqo.register_collector(Box::new(LiqoMetrics(gateway)));
        }
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
        let r = &mut registry;
        registered(
            r,
            "build_info",
            "The agent's version, the kernel, how its programs are attached, its node and role; always 1",
            build_info(&build),
        );
        let reconcile_errors = Family::default();
        // Every kind's series exists from the start, so a rate over it works
        // before the first failure.
        for kind in ObjectKind::ALL {
            let _ = reconcile_errors.get_or_create(&[("kind", kind.as_str())]);
        }
        Ok(Arc::new(Self {
            last_reconcile: registered(
                r,
                "last_reconcile_timestamp_seconds",
                "When a reconcile pass last brought every kernel table up to date (Unix time)",
                Gauge::default(),
            ),
            status_writes: registered(
                r,
                "status_writes",
                "TunnelEndpoint status decisions of the gateway, by outcome",
                Family::default(),
            ),
            loop_stages: registered(
                r,
                "control_loop_stage_seconds",
                "Time the control loop spent in each stage of its passes and periodic ticks; an object change that arrives meanwhile waits for the stage to end",
                Family::new_with_constructor(stage_histogram),
            ),
            conntrack_entries: registered(
                r,
                "conntrack_entries",
                "Conntrack entries in use after the last garbage collection, two per masqueraded flow",
                Gauge::default(),
            ),
            conntrack_gc_interval: registered(
                r,
                "conntrack_gc_interval_seconds",
                "The wait before the next collection of dead flows, between --conntrack-gc-interval and --conntrack-gc-max-interval, as the last collection adapted it",
                Gauge::default(),
            ),
            conntrack_gc_runs: registered(
                r,
                "conntrack_gc_runs",
                "Collections of dead flows run on their interval (not those a refusal or a filling share brought)",
                Counter::default(),
            ),
            flow_entries: registered(
                r,
                "flow_table_entries",
                "Entries each owner (a peer's cluster ID, or gateway) holds in each flow table after the last collection",
                Family::default(),
            ),
            flow_refusals: registered(
                r,
                "flow_table_refusals",
                "New flows refused for want of room, by table, owner and reason: share_full (the owner's share) or table_full (the peers' room or the table); for table fragments, first fragments not remembered past the owner's budget per second",
                Family::default(),
            ),
            flow_evictions: registered(
                r,
                "flow_table_evictions",
                "Flows never answered, evicted oldest first to make room, by table and owner",
                Family::default(),
            ),
            peers: registered(
                r,
                "peers",
                "Peers programmed into the kernel",
                Gauge::default(),
            ),
            gateway_active: registered(
                r,
                "gateway_active",
                "1 while this gateway is the active one, or the only one; 0 on a standby gateway and on workers",
                Gauge::default(),
            ),
            forward_past_netfilter: registered(
                r,
                "forward_past_netfilter",
                "1 while the programs forward IPv4 packets the FIB settles in one step past netfilter (--forward-past-netfilter), else 0",
                Gauge::default(),
            ),
            forward_stack_destinations: registered(
                r,
                "forward_stack_destinations",
                "Destination prefixes the node's netfilter rules act on, whose packets take the stack while the rest go past it",
                Gauge::default(),
            ),
            forward_past_netfilter_ipv6: registered(
                r,
                "forward_past_netfilter_ipv6",
                "1 while the programs forward IPv6 packets the FIB settles in one step past netfilter, else 0",
                Gauge::default(),
            ),
            forward_stack_destinations_ipv6: registered(
                r,
                "forward_stack_destinations_ipv6",
                "IPv6 destination prefixes the node's netfilter rules act on, whose packets take the stack while the rest go past it",
                Gauge::default(),
            ),
            nat_mappings: registered(
                r,
                "nat_mappings",
                "NatMapping entries programmed into the kernel",
                Gauge::default(),
            ),
            map_full: registered(
                r,
                "map_full",
                "Reconcile passes that found a kernel table full; nothing is evicted",
                Counter::default(),
            ),
            rejected_objects: registered(
                r,
                "rejected_objects",
                "Objects rejected by validation",
                Gauge::default(),
            ),
            map_updates: registered(
                r,
                "map_updates",
                "Kernel map elements written or removed",
                Family::default(),
            ),
            reconcile_errors: registered(
                r,
                "reconcile_errors",
                "Reconcile passes that failed to update a kernel table, by the kind of object it holds",
                reconcile_errors,
            ),
            ready: AtomicBool::new(false),
            gateways_served: RwLock::default(),
            tunnels,
            peer_labels,
            registry,
            liqo,
        }))
    }

    /// Names the peers the kernel counts by ID.
    pub fn set_peer_ids<'a>(&self, peers: impl IntoIterator<Item = (u32, &'a Peer)>) {
        let labels = peers
            .into_iter()
            .map(|(id, p)| (id, peer_labels(p.label(), p.name())))
            .collect();
        *self.peer_labels.write().unpoisoned() = labels;
    }

    /// The name of flow-table owner `owner` in metrics and logs: the
    /// peer's cluster ID, or `gateway` for the gateway's own flows.
    pub fn owner_name(&self, owner: u32) -> String {
        if owner == isthmus_common::room::OWNER_LOCAL {
            return "gateway".to_owned();
        }
        let peers = self.peer_labels.read().unpoisoned();
        peers
            .get(&owner)
            .map_or_else(|| format!("peer-{owner}"), |[id, _]| id.1.clone())
    }

    /// Records a reconcile pass that brought every kernel table up to date.
    pub fn reconciled(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_reconcile.set(now);
    }

    /// Records a reconcile pass that failed to update the table of `kind`.
    pub fn reconcile_failed(&self, kind: ObjectKind) {
        self.reconcile_errors
            .get_or_create(&[("kind", kind.as_str())])
            .inc();
    }

    /// Marks the agent ready: the dataplane is attached and the source synced.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Names the Liqo v1 gateways this agent serves now.
    pub fn set_gateways_served(&self, gateways: BTreeSet<ObjectKey>) {
        *self.gateways_served.write().unpoisoned() = gateways;
    }

    /// Whether this agent serves the Liqo v1 gateway `key` now.
    pub fn serves_gateway(&self, key: &ObjectKey) -> bool {
        self.gateways_served.read().unpoisoned().contains(key)
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

/// The buckets of a control loop stage: 100 µs to about 3 s.
fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 15))
}

/// `metric`, registered in `registry` as `name` with `help`: a metric is
/// its field, and this one call.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// `isthmus_build_info`: a gauge of 1, not an OpenMetrics info, since the
/// Prometheus text format that promtool checks has no info type.
fn build_info(build: &BuildInfo) -> Family<[(&'static str, String); 6], Gauge> {
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let info = Family::<[(&'static str, String); 6], Gauge>::default();
    info.get_or_create(&[
        ("version", env!("CARGO_PKG_VERSION").to_owned()),
        ("kernel", kernel),
        ("attach_mode", build.attach_mode.to_owned()),
        ("xdp_mode", build.xdp_mode.to_owned()),
        ("node", build.node.to_owned()),
        ("role", build.role.to_owned()),
    ])
    .set(1);
    info
}
