//! The gateway role: the tunnel and its routes, kept in line with the
//! peers the reconciler accepted.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddrV4,
    sync::Arc,
    time::Instant,
};

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use tracing::{error, info, warn};

use crate::{
    guard::Guard,
    object::ObjectKey,
    peer::{Endpoint, Peer, PeerError, Problem},
    tunnel::{
        Connection, PeerStatus, Tunnel, TunnelConfig,
        endpoint::{self, Resolver},
        key::{self, KeyPair},
        peers::PeerConfig,
        route::Routes,
    },
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
}

impl Gateway {
    /// Starts the tunnel with `key` and brings its device up. `guard`, if
    /// any, is kept allowing exactly the peers' endpoints and sessions.
    pub async fn start(
        config: &TunnelConfig,
        key: KeyPair,
        guard: Option<Guard>,
        resolve_every: std::time::Duration,
    ) -> Result<Self> {
        let public = key::encode(key.public.as_bytes());
        let tunnel = Tunnel::start(config, key).with_context(|| {
            format!(
                "starting the tunnel on {} and UDP port {}",
                config.dev, config.port
            )
        })?;
        let routes = Routes::up(&config.dev, config.mtu).await?;
        info!(dev = %config.dev, port = config.port, public_key = %public, workers = config.workers, "tunnel up");
        Ok(Self {
            tunnel: Arc::new(tunnel),
            routes,
            reported: BTreeSet::new(),
            states: BTreeMap::new(),
            guard,
            configured: BTreeSet::new(),
            resolver: Resolver::new(resolve_every),
            unresolved: BTreeMap::new(),
        })
    }

    /// Looks up again the endpoint names that are due: on the interval, or
    /// after the peer's handshakes failed. Returns whether an address changed.
    pub async fn resolve(&mut self, peers: &[Peer]) -> bool {
        let failures: BTreeMap<ObjectKey, u64> = self
            .tunnel
            .status()
            .into_iter()
            .map(|s| (s.key, s.handshake_failures))
            .collect();
        let names: Vec<(&str, u64)> = peers
            .iter()
            .filter_map(|p| match &p.tunnel.as_ref().ok()?.endpoint {
                Endpoint::Name(name) => Some((
                    name.as_str(),
                    failures.get(&p.key).copied().unwrap_or_default(),
                )),
                Endpoint::Addr(_) => None,
            })
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

    /// The address to reach `peer`'s gateway at, or why there is none: a
    /// name that does not resolve, or resolves into a peer's view (the
    /// tunnel's own packets would enter the tunnel).
    fn address(&self, endpoint: &Endpoint, peers: &[Peer]) -> Result<std::net::Ipv4Addr, String> {
        let name = match endpoint {
            Endpoint::Addr(addr) => return Ok(*addr),
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
            None => Ok(addr),
        }
    }

    /// Gives the tunnel exactly the accepted peers that can have one, and
    /// routes their networks into the device. Returns whether every route
    /// could be written; it logs why not.
    pub async fn sync(&mut self, peers: &[Peer]) -> bool {
        self.resolve(peers).await;
        let mut configs = Vec::new();
        let mut problems = BTreeSet::new();
        let mut unresolved = BTreeMap::new();
        for peer in peers {
            match &peer.tunnel {
                Ok(params) => match self.address(&params.endpoint, peers) {
                    Ok(addr) => configs.push(PeerConfig {
                        key: peer.key.clone(),
                        label: peer.label().to_owned(),
                        cluster_name: peer.name().to_owned(),
                        public: params.public_key,
                        endpoint: SocketAddrV4::new(addr, params.port),
                        networks: peer.views().iter().map(|(_, net)| *net).collect(),
                    }),
                    Err(why) => {
                        unresolved.insert(peer.key.clone(), why);
                    }
                },
                Err(field) => {
                    problems.insert((
                        peer.key.to_string(),
                        PeerError::new(
                            &peer.origin,
                            &peer.key,
                            Problem::NoTunnel { field },
                        )
                        .to_string(),
                    ));
                }
            }
        }
        for (object, problem) in problems.difference(&self.reported) {
            error!(object, error = %problem, "peer without a tunnel");
        }
        self.reported = problems;
        self.unresolved = unresolved;
        self.configured = configs.iter().map(|c| c.endpoint).collect();
        // Allowed before the handshake goes out, so its answer gets through.
        self.follow_guard(&self.tunnel.status());
        for (object, change) in self.tunnel.set_peers(&configs) {
            info!(object = %object, change = ?change, "tunnel peer");
        }
        self.follow_guard(&self.tunnel.status());
        let desired: BTreeSet<Ipv4Net> = configs
            .iter()
            .flat_map(|c| c.networks.iter().copied())
            .collect();
        let (added, removed, failures) = self.routes.sync(&desired).await;
        if added + removed > 0 {
            info!(added, removed, "routes into the tunnel updated");
        }
        let routed = failures.is_empty();
        for e in failures {
            error!(error = %e, "routing a peer's network into the tunnel; will retry");
        }
        routed
    }

    /// Lets through the guard exactly the configured endpoints, the
    /// endpoints peers have roamed to, and the peers' sessions.
    fn follow_guard(&mut self, statuses: &[PeerStatus]) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        let endpoints: BTreeSet<SocketAddrV4> = statuses
            .iter()
            .map(|s| s.endpoint)
            .chain(self.configured.iter().copied())
            .collect();
        let indexes: BTreeSet<u32> = statuses.iter().map(|s| s.index).collect();
        if let Err(e) = guard.sync(&endpoints, &indexes) {
            error!(error = %e, "updating the XDP guard's allowlist; will retry");
        }
    }

    /// Logs every peer whose connection state changed since the last call,
    /// lets roamed endpoints through the guard, and returns every peer's state.
    pub fn report_states(&mut self) -> Vec<PeerStatus> {
        let statuses = self.tunnel.status();
        self.follow_guard(&statuses);
        let mut now = BTreeMap::new();
        for status in &statuses {
            if self.states.get(&status.key) != Some(&status.connection) {
                match status.connection {
                    Connection::Connected => info!(
                        object = %status.key, peer = %status.label, endpoint = %status.endpoint,
                        rtt_ms = ?status.rtt_ms, "peer connected"
                    ),
                    Connection::Connecting => {
                        warn!(object = %status.key, peer = %status.label, endpoint = %status.endpoint, "peer connecting")
                    }
                }
            }
            now.insert(status.key.clone(), status.connection);
        }
        self.states = now;
        statuses
    }
}
