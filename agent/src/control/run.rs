//! The run loop: source events in, kernel tables, tunnel, overlay, status
//! and metrics out. It holds no I/O of its own beyond what it is given, so
//! a test drives it with a directory source and tables in memory.

use std::{collections::BTreeSet, future::Future, net::Ipv4Addr, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::{
    control::{
        reconcile::{
            MemoryAllowedTable, MemoryAllowedTable6, MemoryMappingTable6, MemoryPeerTable6,
            Reconciler, Report,
        },
        source::SourceEvent,
        stages::Stages,
        status::{self, Feedback},
    },
    kernel::table::{
        AllowedTable, AllowedTable6, MappingTable, MappingTable6, PeerTable, PeerTable6,
        TableFailure,
    },
    model::{
        node::Node,
        object::{ObjectKey, ObjectKind},
        peer::{GatewayImplementation, Peer},
        policy::Policy,
    },
    observe::metrics::Metrics,
    roles::{
        gateway::{self, Gateway},
        routes::Routes,
    },
};

/// How often peers' connection states are checked for changes to log, and
/// a failed pass is considered for a retry.
const TICK: Duration = Duration::from_secs(1);

/// This node's side of the dataplane, as the loop drives it: the devices
/// programs attach to, the overlay's node table, and this node's networks.
pub trait Host {
    /// Follows devices that came or went.
    fn refresh_devices(&mut self);
    /// Brings the overlay's tables up to date, sending remote-bound
    /// traffic to `active` (the elected gateway node) where gateways elect.
    /// Returns whether it could; it logs why not.
    fn sync_nodes(&mut self, nodes: &[Node], active: Option<&str>) -> bool;
    /// What objects may ask of this node, with its networks as they are now.
    fn policy(&self) -> Policy;
    /// This node's address, once the source has given it: the source of
    /// its own traffic to peers.
    fn address(&self) -> Option<Ipv4Addr> {
        None
    }
    /// Follows what the accepted peers decide of this node: a gateway's
    /// masquerade address under Liqo v1.
    fn follow_peers(&mut self, _peers: &[Peer]) {}
    /// Attaches the NAT programs to the gateway's tunnel devices, where
    /// each Liqo v1 peer has its own.
    fn follow_tunnel_devices(&mut self, _devices: &[String]) {}
    /// Work that waits for the first pass, so that a restarted agent
    /// carries traffic before it does its slow work.
    fn after_first_pass(&mut self) {}
    /// Resolves when devices may have come, gone or been recreated.
    fn devices_changed(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Everything the loop drives.
pub struct RunLoop<
    P,
    M,
    H,
    A = MemoryAllowedTable,
    P6 = MemoryPeerTable6,
    M6 = MemoryMappingTable6,
    A6 = MemoryAllowedTable6,
> where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    H: Host,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    /// From objects to the kernel's peer, NatMapping and allowed tables.
    pub reconciler: Reconciler<P, M, A, P6, M6, A6>,
    /// The tunnel and its routes, on a gateway.
    pub gateway: Option<Gateway>,
    /// On a worker: every peer's networks into the overlay, for the node's
    /// own traffic, behind blackholes (or the blackholes alone, with no
    /// overlay).
    pub worker_routes: Option<Routes>,
    /// This node's devices, overlay and networks.
    pub host: H,
    /// Status and Events written back, by the gateway of a Kubernetes source.
    pub feedback: Option<Feedback>,
    /// Whether this gateway is the active one, where gateways elect one;
    /// None where it is the only one.
    pub active: Option<watch::Receiver<bool>>,
    /// Where every pass is counted.
    pub metrics: Arc<Metrics>,
    /// Told after every pass, so the tasks that read the tables a pass
    /// writes read them again only then.
    pub passed: watch::Sender<()>,
}

impl<P, M, H, A, P6, M6, A6> RunLoop<P, M, H, A, P6, M6, A6>
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    H: Host,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    /// Applies source events until `stop` completes. Nothing is written
    /// before the source has sent every existing object, so a restart never
    /// removes peers it has not read yet. A pass that leaves work undone is
    /// tried again on a tick, with backoff, even if no object changes.
    pub async fn follow(
        &mut self,
        mut events: mpsc::Receiver<SourceEvent>,
        stop: impl Future<Output = ()>,
    ) -> Result<()> {
        self.host.refresh_devices();
        let mut ticks = tokio::time::interval(TICK);
        let mut synced = false;
        let mut retry = Retry::default();
        let mut status_log = status::StatusLog::default();
        let mut stop = std::pin::pin!(stop);
        let mut first_pass = true;
        loop {
            tokio::select! {
                event = events.recv() => {
                    synced |= apply_event(&mut self.reconciler, event.context("the source stopped")?);
                }
                _ = ticks.tick() => {
                    let moved = self.tick(synced, &mut status_log).await;
                    if !moved && !retry.due() {
                        continue;
                    }
                }
                () = self.host.devices_changed() => {
                    self.host.refresh_devices();
                    continue;
                }
                // Becoming active or standing by takes or drops the peers at once.
                () = elected(&mut self.active) => {}
                () = &mut stop => break,
            };
            // Fold whatever else is already queued into the same pass.
            while let Ok(event) = events.try_recv() {
                synced |= apply_event(&mut self.reconciler, event);
            }
            if synced {
                // Changes that reach the tables while the tunnel follows
                // are followed by the next pass, at once.
                while self.pass(&mut retry, &mut events).await {}
                if std::mem::take(&mut first_pass) {
                    self.host.after_first_pass();
                }
                // Ready once the slow work of the start is done too, so
                // that whoever waits for readiness finds the loop free.
                self.metrics.set_ready();
            }
        }
        info!("stopping; the NAT programs stay attached (`isthmus-agent cleanup` removes them)");
        Ok(())
    }

    /// Whether this node acts as the gateway: it is one, and the active one
    /// where gateways elect.
    fn acting(&self) -> bool {
        self.gateway.is_some() && self.active.as_ref().is_none_or(|active| *active.borrow())
    }

    /// The periodic work: devices, statuses, this node's networks and
    /// peers' endpoint names. Returns whether a pass is needed.
    async fn tick(&mut self, synced: bool, status_log: &mut status::StatusLog) -> bool {
        let mut stages = Stages::start("tick");
        self.host.refresh_devices();
        stages.end("devices");
        // A standby gateway speaks for no tunnel: the active one writes.
        let acting = self.acting();
        let report = self
            .gateway
            .as_mut()
            .filter(|_| acting)
            .map(Gateway::report);
        let feedback = self.feedback.as_ref().filter(|_| acting);
        self.metrics
            .set_gateways_served(served_gateways(self.reconciler.peers(), report.as_ref()));
        if synced && (report.is_some() || feedback.is_some()) {
            let statuses = status::desired(
                self.reconciler.peers(),
                report.as_ref(),
                self.reconciler.rejections(),
            );
            status_log.record(&statuses);
            if let Some(feedback) = feedback {
                feedback.show(statuses, self.reconciler.peers(), self.reconciler.nodes());
            }
        }
        stages.end("statuses");
        // A node address that came or went may allow or refuse a view.
        let changed = self.reconciler.set_policy(self.host.policy());
        if changed {
            info!("this node's networks changed; checking every peer's views again");
        }
        stages.end("policy");
        let moved = match self.gateway.as_mut() {
            Some(gateway) if synced && acting => gateway.resolve(self.reconciler.peers()).await,
            _ => false,
        };
        stages.end("resolve");
        stages.finish(&self.metrics);
        changed || moved
    }

    /// One reconcile pass, followed by the overlay and the tunnel. While
    /// the tunnel and its routes follow (netlink, many milliseconds with
    /// hundreds of peers), object changes still reach the kernel tables:
    /// returns whether any did, so that the tunnel follows them too.
    async fn pass(&mut self, retry: &mut Retry, events: &mut mpsc::Receiver<SourceEvent>) -> bool {
        let mut stages = Stages::start("pass");
        // A standby gateway keeps its device, key, programs and staged
        // routes, and holds no peer: it sends nothing to them.
        let acting = self.acting();
        let feedback = self.feedback.as_ref().filter(|_| acting);
        let failure = Tables {
            reconciler: &mut self.reconciler,
            metrics: &self.metrics,
            feedback,
        }
        .write();
        stages.end("reconcile");
        self.host.follow_peers(self.reconciler.peers());
        stages.end("follow");
        let nodes_synced = self
            .host
            .sync_nodes(self.reconciler.nodes(), self.reconciler.active_gateway());
        stages.end("nodes");
        self.metrics.gateway_active.set(i64::from(acting));
        // The tunnel follows these peers; the reconciler is free meanwhile.
        let peers = self.reconciler.shared_peers();
        let following = follow_peers(
            self.gateway.as_mut(),
            self.worker_routes.as_mut(),
            &mut self.host,
            &peers,
            acting,
        );
        let tables = Tables {
            reconciler: &mut self.reconciler,
            metrics: &self.metrics,
            feedback,
        };
        let (routed, changed_meanwhile) = tables.while_following(following, events).await;
        stages.end(if self.gateway.is_some() {
            "tunnel"
        } else {
            "routes"
        });
        stages.finish(&self.metrics);
        self.passed.send_replace(());
        if let Some(e) = &failure {
            log_table_failure(e, &self.metrics);
        }
        let failed = [
            failure.map(|e| e.kind),
            (!nodes_synced).then_some(ObjectKind::Node),
            (!routed).then_some(ObjectKind::TunnelEndpoint),
        ];
        match failed.into_iter().flatten().next() {
            None => {
                self.metrics.reconciled();
                *retry = Retry::default();
            }
            Some(kind) => {
                self.metrics.reconcile_failed(kind);
                let wait = retry.failed();
                debug!(retry_in = ?wait, "a pass left work undone; trying it again");
            }
        }
        changed_meanwhile
    }
}

/// The kernel tables, as a pass writes them, with where it reports.
struct Tables<'a, P, M, A, P6, M6, A6>
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    reconciler: &'a mut Reconciler<P, M, A, P6, M6, A6>,
    metrics: &'a Metrics,
    /// Told of new rejections, where this gateway writes statuses.
    feedback: Option<&'a Feedback>,
}

impl<P, M, A, P6, M6, A6> Tables<'_, P, M, A, P6, M6, A6>
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    /// Brings the kernel tables in line with the objects, and logs and
    /// counts what changed. Returns the first table that failed.
    fn write(&mut self) -> Option<TableFailure<P::Error>> {
        let (report, failure) = self.reconciler.reconcile();
        record(&report, self.metrics);
        // A peer's ID is assigned when it is accepted and kept until it goes.
        if !report.added.is_empty() || !report.dropped.is_empty() {
            self.metrics.set_peer_ids(self.reconciler.peer_ids());
        }
        if let Some(feedback) = self.feedback {
            feedback.rejected(&report.new_errors);
        }
        failure
    }

    /// Waits for `following` (the tunnel or the routes), writing the
    /// tables for every object change that arrives meanwhile. Returns what
    /// `following` returned, and whether any change arrived.
    async fn while_following(
        mut self,
        following: impl Future<Output = bool>,
        events: &mut mpsc::Receiver<SourceEvent>,
    ) -> (bool, bool) {
        let mut following = std::pin::pin!(following);
        let mut changed = false;
        loop {
            tokio::select! {
                done = &mut following => return (done, changed),
                Some(event) = events.recv() => {
                    apply_event(self.reconciler, event);
                    while let Ok(event) = events.try_recv() {
                        apply_event(self.reconciler, event);
                    }
                    let mut stages = Stages::start("tables");
                    if let Some(e) = self.write() {
                        log_table_failure(&e, self.metrics);
                    }
                    stages.end("reconcile");
                    stages.finish(self.metrics);
                    changed = true;
                }
            }
        }
    }
}

/// Logs a table that failed, and counts it where it was full.
fn log_table_failure<E: std::error::Error>(e: &TableFailure<E>, metrics: &Metrics) {
    if e.full {
        metrics.map_full.inc();
        error!(kind = %e.kind, error = %e, "a kernel table is full: entries that did not fit are not programmed, and nothing was evicted; raise its capacity or remove objects");
    } else {
        error!(kind = %e.kind, error = %e, "updating the kernel tables; will retry");
    }
}

/// The tunnel and its routes on a gateway, or a worker's routes, follow
/// `peers`. Returns whether every route could be written.
async fn follow_peers<H: Host>(
    gateway: Option<&mut Gateway>,
    worker_routes: Option<&mut Routes>,
    host: &mut H,
    peers: &Arc<[Peer]>,
    acting: bool,
) -> bool {
    match (gateway, worker_routes) {
        (Some(gateway), _) => {
            let attach = |devices: &[String]| host.follow_tunnel_devices(devices);
            gateway.sync(peers, acting, attach).await
        }
        (None, Some(routes)) => sync_worker_routes(routes, peers, host.address()).await,
        (None, None) => true,
    }
}

/// The Liqo v1 gateways served through Isthmus's gateway objects: those
/// whose peers the tunnel carries, by the acting gateway's `report`; none
/// without one.
fn served_gateways(peers: &[Peer], report: Option<&gateway::Report>) -> BTreeSet<ObjectKey> {
    let Some(report) = report else {
        return BTreeSet::new();
    };
    peers
        .iter()
        .filter(|peer| report.configurations.contains_key(&peer.key))
        .filter_map(|peer| peer.liqo_gateway.as_ref())
        .filter(|gateway| gateway.implementation == GatewayImplementation::Isthmus)
        .map(|gateway| gateway.key.clone())
        .collect()
}

/// Completes when the election's verdict changes; never without an election.
async fn elected(active: &mut Option<watch::Receiver<bool>>) {
    let changed = match active {
        Some(active) => active.changed().await.is_ok(),
        None => false,
    };
    // Without an election, or once the elector is gone (the agent stops),
    // nothing changes any more.
    if !changed {
        std::future::pending::<()>().await;
    }
}

/// When a pass that failed to write a kernel table is tried again, without
/// waiting for an object to change: after 1 s, then twice as long each
/// time, up to a minute.
#[derive(Default)]
struct Retry {
    at: Option<std::time::Instant>,
    wait: Duration,
}

impl Retry {
    const FIRST: Duration = Duration::from_secs(1);
    const LONGEST: Duration = Duration::from_mins(1);

    /// Records a failed pass; returns how long until the next try.
    fn failed(&mut self) -> Duration {
        self.wait = (self.wait * 2).clamp(Self::FIRST, Self::LONGEST);
        self.at = Some(std::time::Instant::now() + self.wait);
        self.wait
    }

    /// Whether a failed pass is due to be tried again.
    fn due(&self) -> bool {
        self.at.is_some_and(|at| std::time::Instant::now() >= at)
    }
}

/// Feeds one event to the reconciler. Returns true for the end of the initial sync.
fn apply_event<P, M, A, P6, M6, A6>(
    reconciler: &mut Reconciler<P, M, A, P6, M6, A6>,
    event: SourceEvent,
) -> bool
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    match event {
        SourceEvent::Origin { origin, documents } => reconciler.set_origin(origin, documents),
        SourceEvent::Removed { origin } => reconciler.remove_origin(&origin),
        SourceEvent::Synced => return true,
    }
    false
}

/// Logs what a pass changed and counts it.
fn record(report: &Report, metrics: &Metrics) {
    for peer in &report.added {
        info!(
            object = %peer.key, peer = peer.label(), file = %peer.origin, fields_from = %peer.layout,
            pod = %peer.ipv4.remote_pod.seen(), external = %peer.ipv4.remote_external.seen(),
            "peer programmed"
        );
    }
    for key in &report.dropped {
        info!(object = %key, "peer removed");
    }
    for e in &report.new_errors {
        let (kind, object) = e.kind_and_key();
        error!(kind, object, error = %e, "object rejected");
    }
    for e in &report.cleared_errors {
        let (kind, object) = e.kind_and_key();
        warn!(kind, object, error = %e, "rejection cleared");
    }
    let tables = [
        (
            "allowed entries of segregated peers",
            report.allowed_written,
            report.allowed_removed,
            report.allowed,
        ),
        (
            "NatMapping entries",
            report.mappings_written,
            report.mappings_removed,
            report.mappings,
        ),
    ];
    for (what, written, removed, entries) in tables {
        if written + removed > 0 {
            info!(written, removed, entries, "{what} programmed");
        }
    }
    metrics.peers.set(report.peers as i64);
    metrics.nat_mappings.set(report.mappings as i64);
    metrics.rejected_objects.set(report.rejected as i64);
    metrics
        .map_updates
        .get_or_create(&[("op", "write")])
        .inc_by(report.written as u64);
    metrics
        .map_updates
        .get_or_create(&[("op", "remove")])
        .inc_by(report.removed as u64);
}

/// Routes every network of `peers` on a worker, from `source`, and takes
/// away those of peers gone. Returns whether every route could be written.
async fn sync_worker_routes(routes: &mut Routes, peers: &[Peer], source: Option<Ipv4Addr>) -> bool {
    let desired = peers
        .iter()
        .flat_map(|peer| peer.all_views().into_iter().map(|(_, net)| net))
        .collect();
    routes.set_source(source).await;
    let synced = routes.sync(&desired, true).await;
    for failure in &synced.failures {
        error!(error = %failure, "a worker's route to a peer's network; will retry");
    }
    synced.failures.is_empty()
}
