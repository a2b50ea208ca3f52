//! The gateway role: the tunnel devices and their routes, kept in line
//! with the peers the reconciler accepted. Peers of Liqo v0.10's API share
//! one device; each Liqo v1 peer has one of its own ([`lane`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::Result;
use ipnet::IpNet;
use isthmus_common::guard::Initiations;
use tracing::{error, info, warn};

pub mod conncheck;
pub mod endpoint;
pub mod guard;
pub mod lane;
pub mod liqo_v1;
mod plan;

use conncheck::{Checks, Health};
use endpoint::Resolver;
use guard::Guard;
use lane::{Lane, LaneSettings, LaneSpec};
use liqo_v1::DevicesOfPeers;
use plan::Plan;

use crate::{
    kernel::dataplane::PeerDevices,
    model::{
        key_text,
        object::ObjectKey,
        peer::{Endpoint, Peer, TunnelParams},
    },
    roles::routes::{self, Routes},
    sync::Unpoisoned,
    tunnel::{Connection, PeerStatus, set::TunnelSet},
};

/// The running tunnels of a gateway and what they have told the operator.
pub struct Gateway {
    /// The tunnels, one per device, shared with the metrics.
    pub tunnels: Arc<TunnelSet>,
    /// The running devices, by name.
    lanes: BTreeMap<String, Lane>,
    /// What a new device starts from.
    settings: LaneSettings,
    /// The device every peer of Liqo v0.10's API shares, always running;
    /// none where every peer is a Liqo v1 peer, with a device of its own.
    shared: Option<LaneSpec>,
    /// The blackholes behind every routed network, whichever the device.
    blackholes: Routes,
    /// The networks routed at the last pass, whose blackholes stay until
    /// their routes into a device are gone.
    routed: BTreeSet<IpNet>,
    reported: BTreeSet<(String, String)>,
    states: BTreeMap<ObjectKey, Connection>,
    guard: Option<Guard>,
    /// Endpoints as the objects give them, before any roaming.
    configured: BTreeSet<SocketAddr>,
    /// The addresses of endpoint names.
    resolver: Resolver,
    /// Peers left out of the tunnel for want of an endpoint address, or of
    /// a device, with why.
    unresolved: BTreeMap<ObjectKey, String>,
    /// The conncheck's state, shared with its sockets' tasks and the metrics.
    pub checks: Arc<Mutex<Checks>>,
    /// What each peer's tunnel was given, and the cluster ID its PINGs carry.
    configured_peers: BTreeMap<ObjectKey, (String, Arc<BTreeMap<String, String>>)>,
    /// Where the gateway serves Liqo v1 peers: the kernel's table that
    /// names each device's peer.
    devices_of_peers: Option<DevicesOfPeers>,
    /// Whether the devices of peers that went while no agent ran were
    /// deleted, after the first pass.
    swept: bool,
    /// The peers, and whether active, of the last pass that left nothing
    /// undone: a pass for the same (a NatMapping changed, say) has nothing
    /// to do here.
    followed: Option<(Arc<[Peer]>, bool)>,
}

/// What the gateway knows of each peer, for its TunnelEndpoint's status.
#[derive(Debug, Default)]
pub struct Report {
    /// The tunnel's sessions.
    pub sessions: Vec<PeerStatus>,
    /// The conncheck of each peer in the tunnel.
    pub health: BTreeMap<ObjectKey, Health>,
    /// Peers left out of the tunnel for want of an endpoint address, with why.
    pub unresolved: BTreeMap<ObjectKey, String>,
    /// What each peer's tunnel was given, as Liqo's `peerConfiguration`.
    pub configurations: BTreeMap<ObjectKey, Arc<BTreeMap<String, String>>>,
}

impl Gateway {
    /// Starts the gateway with `settings`. `guard`, if any, is kept
    /// allowing exactly the peers' endpoints and sessions on the tunnels'
    /// ports. With `liqo_v1`, the table that names each device's peer,
    /// the gateway serves Liqo v1 peers, each on a device of its own;
    /// otherwise it starts `shared`, the device every peer shares.
    pub async fn start(
        settings: LaneSettings,
        shared: LaneSpec,
        guard: Option<Guard>,
        resolve_every: std::time::Duration,
        liqo_v1: Option<PeerDevices>,
    ) -> Result<Self> {
        let public = key_text::encode(settings.key.public.as_bytes());
        info!(public_key = %public, "gateway key");
        let mut gateway = Self {
            tunnels: Arc::new(TunnelSet::default()),
            lanes: BTreeMap::new(),
            shared: liqo_v1.is_none().then_some(shared.clone()),
            settings,
            blackholes: Routes::blackholes_only().await?,
            routed: BTreeSet::new(),
            reported: BTreeSet::new(),
            states: BTreeMap::new(),
            guard,
            configured: BTreeSet::new(),
            resolver: Resolver::new(resolve_every),
            unresolved: BTreeMap::new(),
            checks: Arc::new(Mutex::new(Checks::default())),
            configured_peers: BTreeMap::new(),
            devices_of_peers: liqo_v1.map(DevicesOfPeers::new),
            swept: false,
            followed: None,
        };
        if gateway.shared.is_some() {
            gateway.open_lane(&shared).await?;
        }
        Ok(gateway)
    }

    /// Starts the device of `spec`.
    async fn open_lane(&mut self, spec: &LaneSpec) -> Result<()> {
        let lane = Lane::start(spec, &self.settings, &self.checks).await?;
        self.tunnels.insert(&spec.device, lane.tunnel.clone());
        self.lanes.insert(spec.device.clone(), lane);
        Ok(())
    }

    /// The tunnel devices running now, which the NAT programs attach to.
    pub fn devices(&self) -> Vec<String> {
        self.lanes.keys().cloned().collect()
    }

    /// Looks up again the endpoint names that are due: on the interval, or
    /// after the peer's handshakes failed. Returns whether an address changed.
    pub async fn resolve(&mut self, peers: &[Peer]) -> bool {
        let named: Vec<(&ObjectKey, &str)> = peers
            .iter()
            .filter_map(|p| match &p.tunnel.as_ref().ok()?.endpoint {
                Endpoint::Name(name) => Some((&p.key, name.as_str())),
                Endpoint::Addr(_) | Endpoint::Learned => None,
            })
            .collect();
        // Most gateways have no names: no status to read on every tick.
        let failures: BTreeMap<ObjectKey, u64> = match named.is_empty() {
            true => BTreeMap::new(),
            false => self
                .tunnels
                .status()
                .into_iter()
                .map(|s| (s.key, s.handshake_failures))
                .collect(),
        };
        let names: Vec<(&str, u64)> = named
            .into_iter()
            .map(|(key, name)| (name, failures.get(key).copied().unwrap_or_default()))
            .collect();
        self.resolver
            .retain(&names.iter().map(|(n, _)| *n).collect::<Vec<_>>());
        let now = Instant::now();
        let due: Vec<(&str, u64)> = names
            .into_iter()
            .filter(|(name, failures)| self.resolver.due(name, *failures, now))
            .collect();
        let answers =
            futures::future::join_all(due.iter().map(|(name, _)| endpoint::lookup(name))).await;
        let mut changed = false;
        for ((name, failures), answer) in due.into_iter().zip(answers) {
            let before = self.resolver.address(name);
            if before != answer {
                match &answer {
                    Ok(addr) => info!(name, %addr, "endpointIP resolved"),
                    Err(e) => warn!(name, error = %e, "endpointIP does not resolve"),
                }
            }
            changed |= before.ok() != answer.as_ref().ok().copied();
            self.resolver.record(name, answer, failures, now);
        }
        if changed {
            self.followed = None;
        }
        changed
    }

    /// Peers left out of the tunnel because their `endpointIP` gives no
    /// usable address, with why.
    pub fn unresolved(&self) -> &BTreeMap<ObjectKey, String> {
        &self.unresolved
    }

    /// The address to reach a peer's gateway at (`tunnel`), none for a
    /// peer we serve, or why the peer cannot be in the tunnel: a name that
    /// does not resolve, or resolves into a peer's view (the tunnel's own
    /// packets would enter the tunnel).
    fn address(&self, tunnel: &TunnelParams, peers: &[Peer]) -> Result<Option<IpAddr>, String> {
        let name = match &tunnel.endpoint {
            Endpoint::Addr(addr) => return Ok(Some(*addr)),
            // Its device listens on the port its object gives (see `lane`).
            Endpoint::Learned => return Ok(None),
            Endpoint::Name(name) => name,
        };
        let addr = self
            .resolver
            .address(name)
            .map_err(|e| format!("field endpointIP: {name} does not resolve: {e}"))?;
        match peers
            .iter()
            .flat_map(|p| p.all_views().into_iter().map(move |view| (p, view)))
            .find(|(_, (_, net))| net.contains(&addr))
        {
            Some((other, (field, net))) => Err(format!(
                "field endpointIP: {name} resolves to {addr}, inside field {field} ({net}) of TunnelEndpoint {}: its WireGuard traffic would be routed into a tunnel",
                other.key
            )),
            None => Ok(Some(addr)),
        }
    }

    /// Gives each accepted peer that can have a tunnel its device, routes
    /// its networks into it, in the tunnel's table; when `active`, also
    /// gives the tunnels exactly those peers and puts the routes in use. A
    /// standby holds no peer (it sends nothing to them) and keeps its
    /// routes staged. `attach` is given the devices running, before any
    /// peer is in their tunnels, so that what crosses them is translated
    /// from the first packet. Returns whether every route could be
    /// written; it logs why not. Where the last pass left nothing undone
    /// for the same peers, the same activity and the same endpoint
    /// addresses, it only gives `attach` the devices.
    pub async fn sync(
        &mut self,
        peers: &Arc<[Peer]>,
        active: bool,
        attach: impl FnOnce(&[String]),
    ) -> bool {
        self.resolve(peers).await;
        let followed = self.followed.take();
        if followed
            .as_ref()
            .is_some_and(|(followed, was)| *was == active && same_peers(followed, peers))
        {
            attach(&self.devices());
            self.followed = followed;
            return true;
        }
        let mut plan = Plan::new(peers, |params| self.address(params, peers));
        self.report_problems(std::mem::take(&mut plan.problems));
        let lanes = self.open_lanes(&mut plan).await;
        attach(&self.devices());
        self.unresolved = std::mem::take(&mut plan.unresolved);
        self.configured_peers = plan.configurations();
        // A standby holds no peer, so it sends nothing to them.
        let targets = match active {
            true => plan.conncheck_targets(&lanes),
            false => BTreeMap::new(),
        };
        self.checks
            .lock()
            .unpoisoned()
            .set_targets(&targets, Instant::now());
        // Between stretches of work over every peer, object changes that
        // came meanwhile reach the kernel tables: the run loop waits on
        // them beside this pass.
        tokio::task::yield_now().await;
        let configs = match active {
            true => plan.tunnel_peers(),
            false => Vec::new(),
        };
        self.configured = configs.iter().filter_map(|c| c.endpoint).collect();
        let mut done = self.guard_ports(&plan, &lanes);
        // Allowed before the handshake goes out, so its answer gets through.
        self.follow_guard(&self.tunnels.status());
        for (device, lane) in &self.lanes {
            let of_lane: Vec<_> = plan
                .on_device(&lanes, device)
                .filter(|_| active)
                .map(|c| c.config.clone())
                .collect();
            lane.set_peers(&of_lane);
        }
        tokio::task::yield_now().await;
        if let Some(devices) = &mut self.devices_of_peers {
            let named = plan
                .carried
                .iter()
                .filter(|_| active)
                .filter_map(|c| Some((lanes.get(&c.peer.key)?, c.peer)))
                .filter(|(spec, _)| spec.liqo_v1)
                .map(|(spec, peer)| (spec.device.as_str(), peer));
            done &= devices.sync(named);
        }
        self.follow_guard(&self.tunnels.status());
        let routed = self.sync_routes(&plan, &lanes, active).await;
        done &= routed && self.reported.is_empty();
        self.followed = done.then(|| (Arc::clone(peers), active));
        routed
    }

    /// Finds each carried peer's device, starting those not running yet
    /// and closing those no peer needs any more. A peer whose device
    /// cannot run (its port taken by another's, or refused by the kernel)
    /// is left out, with why. Returns each carried peer's device.
    async fn open_lanes(&mut self, plan: &mut Plan<'_>) -> BTreeMap<ObjectKey, LaneSpec> {
        let mut lanes: BTreeMap<ObjectKey, LaneSpec> = BTreeMap::new();
        let mut wanted: BTreeMap<String, LaneSpec> = self
            .shared
            .iter()
            .map(|spec| (spec.device.clone(), spec.clone()))
            .collect();
        let shared = self.shared.clone();
        for peer in plan.carried.iter().map(|c| c.peer).collect::<Vec<_>>() {
            let Some(spec) = LaneSpec::of(peer, shared.as_ref()) else {
                let why = "this gateway serves Liqo v1 peers, each on a tunnel device of its own, and has no device for a peer of Liqo v0.10's API";
                plan.leave_out(&peer.key, why.into());
                continue;
            };
            if let Err(why) = self.place(&spec, &wanted, &lanes).await {
                plan.leave_out(&peer.key, why);
                continue;
            }
            wanted.insert(spec.device.clone(), spec.clone());
            lanes.insert(peer.key.clone(), spec);
        }
        let gone: Vec<String> = self
            .lanes
            .keys()
            .filter(|device| !wanted.contains_key(*device))
            .cloned()
            .collect();
        for device in gone {
            self.close_lane(&device).await;
        }
        self.sweep().await;
        lanes
    }

    /// Deletes, once, the devices of Liqo v1 peers that went while no
    /// agent ran: a restarted agent finds its peers' devices, with their
    /// routes, and keeps those it still needs.
    async fn sweep(&mut self) {
        if std::mem::replace(&mut self.swept, true) || self.devices_of_peers.is_none() {
            return;
        }
        let stale = liqo_v1::peer_devices();
        for device in stale.iter().filter(|d| !self.lanes.contains_key(*d)) {
            match routes::delete_device(device).await {
                Ok(_) => {
                    info!(dev = %device, "deleted the tunnel device of a peer that went while no agent ran");
                }
                Err(e) => {
                    warn!(dev = %device, error = %e, "deleting the tunnel device of a peer that is gone");
                }
            }
        }
    }

    /// Makes sure the device of `spec` runs, for a peer of its own unless
    /// it is the shared one: refused where another peer of this pass has
    /// the device or the port, and where it cannot start.
    async fn place(
        &mut self,
        spec: &LaneSpec,
        wanted: &BTreeMap<String, LaneSpec>,
        lanes: &BTreeMap<ObjectKey, LaneSpec>,
    ) -> Result<(), String> {
        let taken_by = |clash: &dyn Fn(&LaneSpec) -> bool| {
            lanes
                .iter()
                .find(|(_, other)| clash(other))
                .map(|(key, _)| key.clone())
        };
        if spec.liqo_v1 {
            if let Some(other) = taken_by(&|other| other.device == spec.device) {
                return Err(format!(
                    "its tunnel device {} is already the device of {other}, whose cluster ID shares its first characters and hash",
                    spec.device
                ));
            }
            if let Some(other) = taken_by(&|other| spec.port != 0 && other.port == spec.port) {
                return Err(format!(
                    "field spec.endpoint.port: {} is the UDP port of the tunnel of {other}; each peer we serve needs a port of its own",
                    spec.port
                ));
            }
        }
        if wanted.contains_key(&spec.device) && !spec.liqo_v1 {
            return Ok(());
        }
        match self.lanes.get(&spec.device) {
            Some(lane) if lane.spec() == spec => return Ok(()),
            Some(_) => self.close_lane(&spec.device).await,
            None => {}
        }
        self.open_lane(spec)
            .await
            .map_err(|e| format!("its tunnel device {} cannot run: {e:#}", spec.device))
    }

    /// Stops the device `device` and deletes it.
    async fn close_lane(&mut self, device: &str) {
        self.tunnels.remove(device);
        if let Some(lane) = self.lanes.remove(device) {
            lane.close().await;
        }
    }

    /// Guards every device's port: open to initiations from anywhere where
    /// a peer we serve makes contact, from peers' endpoints alone
    /// elsewhere.
    /// Returns whether the guard took them; it logs why not.
    fn guard_ports(&mut self, plan: &Plan<'_>, lanes: &BTreeMap<ObjectKey, LaneSpec>) -> bool {
        let Some(guard) = &mut self.guard else {
            return true;
        };
        let mut ports: BTreeMap<u16, Initiations> = self
            .lanes
            .values()
            .map(|lane| (lane.port(), Initiations::FromEndpoints))
            .collect();
        for carried in plan.carried.iter().filter(|c| c.config.endpoint.is_none()) {
            if let Some(lane) = lanes
                .get(&carried.peer.key)
                .and_then(|s| self.lanes.get(&s.device))
            {
                ports.insert(lane.port(), Initiations::FromAnywhere);
            }
        }
        match guard.set_ports(&ports) {
            Ok(changed) => {
                for (port, initiations) in changed {
                    info!(port, initiations = ?initiations, "XDP guard: tunnel port guarded");
                }
                true
            }
            Err(e) => {
                error!(error = %e, "setting the XDP guard's ports; will retry");
                false
            }
        }
    }

    /// Routes each carried peer's views into its device, in use when
    /// `active`, each behind its blackhole: blackholes come before the
    /// routes they stand behind, and go after them. Returns whether every
    /// route could be written; it logs why not.
    async fn sync_routes(
        &mut self,
        plan: &Plan<'_>,
        lanes: &BTreeMap<ObjectKey, LaneSpec>,
        active: bool,
    ) -> bool {
        let desired = plan.routed();
        let before: BTreeSet<IpNet> = self.routed.union(&desired).copied().collect();
        let mut routed =
            lane::log_routes("blackholes", self.blackholes.sync(&before, active).await);
        for (device, lane) in &mut self.lanes {
            let peers: Vec<&Peer> = plan.on_device(lanes, device).map(|c| c.peer).collect();
            routed &= lane.follow(&peers, active).await;
        }
        routed &= lane::log_routes("blackholes", self.blackholes.sync(&desired, active).await);
        self.routed = desired;
        routed
    }

    /// Logs each peer without a tunnel once, when it first has no tunnel.
    fn report_problems(&mut self, problems: BTreeSet<(String, String)>) {
        for (object, problem) in problems.difference(&self.reported) {
            error!(object, error = %problem, "peer without a tunnel");
        }
        self.reported = problems;
    }

    /// Lets through the guard exactly the configured endpoints, the
    /// endpoints peers have roamed to, and the peers' sessions.
    fn follow_guard(&mut self, statuses: &[PeerStatus]) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        let endpoints: BTreeSet<SocketAddr> = statuses
            .iter()
            .filter_map(|s| s.endpoint)
            .chain(self.configured.iter().copied())
            .collect();
        let indexes: BTreeSet<u32> = statuses.iter().map(|s| s.index).collect();
        if let Err(e) = guard.sync(&endpoints, &indexes) {
            error!(error = %e, "updating the XDP guard's allowlist; will retry");
        }
    }

    /// What the gateway knows of every peer now, for the statuses; logs
    /// every change of a session's state.
    pub fn report(&mut self) -> Report {
        let sessions = self.report_states();
        let checks = self.checks.lock().unpoisoned();
        let now = Instant::now();
        Report {
            sessions,
            health: self
                .configured_peers
                .iter()
                .filter_map(|(key, (label, _))| Some((key.clone(), checks.health(label, now)?)))
                .collect(),
            unresolved: self.unresolved.clone(),
            configurations: self
                .configured_peers
                .iter()
                .map(|(key, (_, configuration))| (key.clone(), configuration.clone()))
                .collect(),
        }
    }

    /// Logs every peer whose connection state changed since the last call,
    /// lets roamed endpoints through the guard, and returns every peer's state.
    fn report_states(&mut self) -> Vec<PeerStatus> {
        let statuses = self.tunnels.status();
        self.follow_guard(&statuses);
        let mut now = BTreeMap::new();
        for status in &statuses {
            if self.states.get(&status.key) != Some(&status.connection) {
                match status.connection {
                    Connection::Connected => info!(
                        object = %status.key, peer = %status.label, endpoint = ?status.endpoint,
                        rtt_ms = ?status.rtt_ms, "peer connected"
                    ),
                    Connection::Connecting => {
                        warn!(object = %status.key, peer = %status.label, endpoint = ?status.endpoint, "peer connecting");
                    }
                }
            }
            now.insert(status.key.clone(), status.connection);
        }
        self.states = now;
        statuses
    }
}

/// Whether two selections of peers are the same: at once where the
/// reconciler kept its selection, by content where it selected again.
fn same_peers(a: &Arc<[Peer]>, b: &Arc<[Peer]>) -> bool {
    Arc::ptr_eq(a, b) || a[..] == b[..]
}
