//! The gateway role: the tunnel and its routes, kept in line with the
//! peers the reconciler accepted.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddrV4},
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use tracing::{error, info, warn};

pub mod conncheck;
pub mod endpoint;
pub mod guard;
pub mod liqo_v1;
mod plan;

use conncheck::{Checks, Health};
use endpoint::Resolver;
use guard::Guard;
use liqo_v1::DeviceOfPeer;
use plan::Plan;

use crate::{
    kernel::dataplane::PeerDevices,
    model::{
        key_text,
        object::ObjectKey,
        peer::{Endpoint, Peer, TunnelParams},
    },
    roles::routes::Routes,
    sync::Unpoisoned,
    tunnel::{Connection, PeerStatus, Tunnel, TunnelConfig, key::KeyPair},
};

/// The running tunnel of a gateway and what it has told the operator.
pub struct Gateway {
    /// The tunnel, shared with the metrics.
    pub tunnel: Arc<Tunnel>,
    routes: Routes,
    reported: BTreeSet<(String, String)>,
    states: BTreeMap<ObjectKey, Connection>,
    guard: Option<Guard>,
    /// Endpoints as the objects give them, before any roaming.
    configured: BTreeSet<SocketAddrV4>,
    /// The addresses of endpoint names.
    resolver: Resolver,
    /// Peers left out of the tunnel for want of an endpoint address, with why.
    unresolved: BTreeMap<ObjectKey, String>,
    /// The conncheck's state, shared with its socket's task and the metrics.
    pub checks: Arc<Mutex<Checks>>,
    /// What each peer's tunnel was given, and the cluster ID its PINGs carry.
    configured_peers: BTreeMap<ObjectKey, (String, Arc<BTreeMap<String, String>>)>,
    /// Where the gateway serves a Liqo v1 peer: the kernel's entry that
    /// names it as the tunnel device's peer.
    liqo_v1: Option<DeviceOfPeer>,
    /// The tunnel device's Liqo v1 address now, which follows our side.
    tunnel_address: Option<Ipv4Addr>,
    /// The UDP port the tunnel listens on, where peers we serve make contact.
    port: u16,
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
    /// Starts the tunnel with `key` and brings its device up. `guard`, if
    /// any, is kept allowing exactly the peers' endpoints and sessions.
    /// With `masquerading`, the conncheck's PINGs leave through the
    /// masquerade, as Liqo peers expect (see [`conncheck`]). With
    /// `liqo_v1`, the table that names the tunnel device's peer, the
    /// gateway serves a Liqo v1 peer, and takes Liqo v1's tunnel address.
    pub async fn start(
        config: &TunnelConfig,
        key: KeyPair,
        guard: Option<Guard>,
        resolve_every: std::time::Duration,
        masquerading: bool,
        liqo_v1: Option<PeerDevices>,
    ) -> Result<Self> {
        let public = key_text::encode(key.public.as_bytes());
        let tunnel = Tunnel::start(config, key).with_context(|| {
            format!(
                "starting the tunnel on {} and UDP port {}",
                config.dev, config.port
            )
        })?;
        let routes = Routes::up(&config.dev, config.mtu).await?;
        info!(dev = %config.dev, port = config.port, public_key = %public, workers = config.workers, "tunnel up");
        // The conncheck answers on an address of the tunnel device, as on
        // Liqo's: the NatMapping's 169.254.0.1 entry leads there, or for a
        // Liqo v1 peer, the tunnel's own address, which our side decides:
        // it answers on the device, whichever address that has.
        let responder = match &liqo_v1 {
            Some(_) => conncheck::bind_on_device(&config.dev)
                .with_context(|| format!("binding the conncheck to device {}", config.dev))?,
            None => conncheck_socket(&routes, conncheck::ADDR, conncheck::PORT).await?,
        };
        // A Liqo v1 peer is PINGed from our tunnel address, its route back.
        let pinger = match masquerading && liqo_v1.is_none() {
            true => Some(conncheck_socket(&routes, conncheck::SENDER_ADDR, 0).await?),
            false => None,
        };
        let checks = Arc::new(Mutex::new(Checks::default()));
        conncheck::spawn(responder, pinger, checks.clone());
        Ok(Self {
            tunnel: Arc::new(tunnel),
            routes,
            reported: BTreeSet::new(),
            states: BTreeMap::new(),
            guard,
            configured: BTreeSet::new(),
            resolver: Resolver::new(resolve_every),
            unresolved: BTreeMap::new(),
            checks,
            configured_peers: BTreeMap::new(),
            liqo_v1: liqo_v1.map(|devices| DeviceOfPeer::new(devices, &config.dev)),
            tunnel_address: None,
            port: config.port,
        })
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
                .tunnel
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
    /// packets would enter the tunnel); a server's port we do not listen on.
    fn address(&self, tunnel: &TunnelParams, peers: &[Peer]) -> Result<Option<Ipv4Addr>, String> {
        let name = match &tunnel.endpoint {
            Endpoint::Addr(addr) => return Ok(Some(*addr)),
            Endpoint::Learned if tunnel.port == self.port => return Ok(None),
            Endpoint::Learned => {
                return Err(format!(
                    "field spec.endpoint.port: {}, and this gateway listens on UDP port {} (--listen-port): the peer would make contact where nothing listens",
                    tunnel.port, self.port
                ));
            }
            Endpoint::Name(name) => name,
        };
        let addr = self
            .resolver
            .address(name)
            .map_err(|e| format!("field endpointIP: {name} does not resolve: {e}"))?;
        match peers
            .iter()
            .flat_map(|p| p.views().map(|view| (p, view)))
            .find(|(_, (_, net))| net.contains(&addr))
        {
            Some((other, (field, net))) => Err(format!(
                "field endpointIP: {name} resolves to {addr}, inside field {field} ({net}) of TunnelEndpoint {}: its WireGuard traffic would be routed into a tunnel",
                other.key
            )),
            None => Ok(Some(addr)),
        }
    }

    /// Routes the networks of the accepted peers that can have a tunnel
    /// into the device, in the tunnel's table; when `active`, also gives
    /// the tunnel exactly those peers and sends lookups to that table. A
    /// standby holds no peer (it sends nothing to them) and keeps its
    /// routes staged. Returns whether every route could be written; it logs
    /// why not.
    pub async fn sync(&mut self, peers: &[Peer], active: bool) -> bool {
        self.resolve(peers).await;
        let mut plan = Plan::new(peers, |params| self.address(params, peers));
        self.report_problems(std::mem::take(&mut plan.problems));
        self.unresolved = std::mem::take(&mut plan.unresolved);
        self.configured_peers = plan.configurations();
        let v1_peer = plan.liqo_v1_peer();
        // A standby holds no peer, so it sends nothing to them.
        let (targets, configs) = match active {
            true => (plan.conncheck_targets(), plan.tunnel_peers()),
            false => (BTreeMap::new(), Vec::new()),
        };
        self.checks
            .lock()
            .unpoisoned()
            .set_targets(&targets, Instant::now());
        self.configured = configs.iter().filter_map(|c| c.endpoint).collect();
        // A peer we serve makes contact from where we cannot know.
        self.open_guard(configs.iter().any(|c| c.endpoint.is_none()));
        // Allowed before the handshake goes out, so its answer gets through.
        self.follow_guard(&self.tunnel.status());
        for (object, change) in self.tunnel.set_peers(&configs) {
            info!(object = %object, change = ?change, "tunnel peer");
        }
        if let Some(device) = &mut self.liqo_v1 {
            device.sync(v1_peer.filter(|_| active));
        }
        self.follow_side(v1_peer).await;
        self.follow_guard(&self.tunnel.status());
        self.sync_routes(&plan.routed(), active).await
    }

    /// Logs each peer without a tunnel once, when it first has no tunnel.
    fn report_problems(&mut self, problems: BTreeSet<(String, String)>) {
        for (object, problem) in problems.difference(&self.reported) {
            error!(object, error = %problem, "peer without a tunnel");
        }
        self.reported = problems;
    }

    /// Lets handshake initiations through the XDP guard from any source
    /// while `open`, from peers' endpoints alone otherwise.
    fn open_guard(&mut self, open: bool) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        match guard.open_to_initiations(open) {
            Ok(true) if open => {
                info!("XDP guard: initiations pass from any source, for a peer we serve");
            }
            Ok(true) => info!("XDP guard: initiations pass from peers' endpoints alone"),
            Ok(false) => {}
            Err(e) => error!(error = %e, "opening the XDP guard to initiations; will retry"),
        }
    }

    /// Routes `desired` into the tunnel, in use when `active`. Returns
    /// whether every route could be written; it logs why not.
    async fn sync_routes(&mut self, desired: &BTreeSet<Ipv4Net>, active: bool) -> bool {
        let synced = self.routes.sync(desired, active).await;
        let (added, removed) = (synced.added, synced.removed);
        if added + removed > 0 {
            info!(added, removed, "routes into the tunnel updated");
        }
        match synced.activated {
            Some(true) => info!("routes into the tunnel in use"),
            Some(false) => info!("routes into the tunnel staged, not in use"),
            None => {}
        }
        let routed = synced.failures.is_empty();
        for e in synced.failures {
            error!(error = %e, "routing a peer's network into the tunnel; will retry");
        }
        routed
    }

    /// Gives the tunnel device our Liqo v1 address towards `peer`, by the
    /// side we have: the peer's conncheck PINGs it, and ours leave from it.
    /// A failure is logged and tried again at the next pass.
    async fn follow_side(&mut self, peer: Option<&Peer>) {
        let Some(ends) = peer.and_then(liqo_v1::TunnelAddresses::of) else {
            return;
        };
        if self.tunnel_address == Some(ends.ours) {
            return;
        }
        match self
            .routes
            .set_link_address(ends.ours, liqo_v1::PREFIX_LEN)
            .await
        {
            Ok(()) => {
                info!(address = %ends.ours, peer = %ends.theirs, "tunnel address set");
                self.tunnel_address = Some(ends.ours);
            }
            Err(e) => error!(error = %e, "setting the tunnel address; will retry"),
        }
    }

    /// Lets through the guard exactly the configured endpoints, the
    /// endpoints peers have roamed to, and the peers' sessions.
    fn follow_guard(&mut self, statuses: &[PeerStatus]) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        let endpoints: BTreeSet<SocketAddrV4> = statuses
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
        let statuses = self.tunnel.status();
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

/// A conncheck socket on `addr`, which the tunnel device gets.
async fn conncheck_socket(
    routes: &Routes,
    addr: Ipv4Addr,
    port: u16,
) -> Result<tokio::net::UdpSocket> {
    routes.add_address(addr).await?;
    bind_conncheck(addr, port).await
}

async fn bind_conncheck(addr: Ipv4Addr, port: u16) -> Result<tokio::net::UdpSocket> {
    tokio::net::UdpSocket::bind((addr, port))
        .await
        .with_context(|| format!("binding the conncheck to {addr}:{port}"))
}
