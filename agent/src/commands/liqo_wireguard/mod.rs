//! `isthmus-agent liqo-wireguard`: Isthmus's tunnel as the `wireguard`
//! container of a Liqo v1 gateway pod, which Liqo starts from a gateway
//! template (docs/design.md#liqo-v1-gateway-templates).
//!
//! It does what Liqo v1.2's container does (`cmd/gateway/wireguard/main.go`):
//! the device `liqo-tunnel` with our side's address and the MTU, the
//! private key from the Secret Liqo mounts, one WireGuard peer from the
//! `PublicKey` labelled with the peer's cluster ID (AllowedIPs 0.0.0.0/0),
//! the `Connection` created and set Connecting, and `liqo_peer_*` read
//! from that Connection. Liqo's `gateway` container beside it keeps the
//! rest: the routes, the nftables that remap, the conncheck and the
//! Connection's status.

mod options;
mod peer;

pub use options::{Implementation, LiqoWireguardArgs, Mode, OptionError, Settings};

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use futures::{FutureExt, Stream, StreamExt, stream::BoxStream};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tracing::{info, warn};

use crate::{
    control::{kubernetes, source::api_resource, status::liqo_connection},
    model::{
        liqo_v1::CLUSTER_ID_LABEL,
        object::ObjectKind,
        peer::{Endpoint, GatewayRole, LiqoApi},
    },
    observe::metrics::{self, BuildInfo, GatewayState, Metrics, PeerHealth},
    roles::{
        gateway::{
            conncheck::Health,
            endpoint,
            liqo_v1::{PREFIX_LEN, TunnelAddresses},
        },
        routes::Routes,
    },
    sync::Unpoisoned,
    tunnel::{Tunnel, TunnelConfig, key::KeyPair, peers::PeerConfig, set::TunnelSet},
};

/// How often work the API server refused is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Runs the container until the process ends.
pub async fn run(args: LiqoWireguardArgs) -> Result<()> {
    let settings = args.settings()?;
    if args.implementation == Implementation::Kernel {
        info!(
            "--implementation=kernel: Isthmus carries the tunnel itself (boringtun) whatever the kernel has"
        );
    }
    let key = read_key(&settings.key_file)?;
    let config = TunnelConfig {
        dev: settings.dev.clone(),
        mtu: settings.mtu,
        port: settings.listen_port,
        // Liqo configures no keepalive; its conncheck keeps the tunnel busy.
        keepalive: 0,
        workers: settings.workers,
    };
    let tunnel = Arc::new(Tunnel::start(&config, key).with_context(|| {
        format!(
            "starting the tunnel on {} and UDP port {}",
            config.dev, config.port
        )
    })?);
    let routes = Routes::up(&settings.dev, settings.mtu).await?;
    let ends = TunnelAddresses::of_side(settings.gateway.role == GatewayRole::Server);
    routes
        .set_link_address(ends.ours, PREFIX_LEN)
        .await
        .with_context(|| format!("giving {} the address {}", settings.dev, ends.ours))?;
    info!(dev = %settings.dev, port = config.port, address = %ends.ours, peer = %ends.theirs, "tunnel up");
    let reported = Arc::new(Mutex::new(BTreeMap::new()));
    let metrics = serve_metrics(&settings, &args.node, &tunnel, &reported).await?;
    let client = kubernetes::client(args.kubeconfig.as_deref()).await?;
    let (public_keys, key_events) = watch(&client, &settings, api_resource(ObjectKind::PublicKey));
    let (connections, connection_events) =
        watch(&client, &settings, liqo_connection::api_resource());
    metrics.set_ready();
    let container = Container {
        client,
        settings,
        tunnel,
        reported,
        public_keys,
        connections,
        address: None,
        lookup_due: Instant::now(),
        configured: None,
        problems: Vec::new(),
        write_error: None,
    };
    let events = futures::stream::select(
        key_events.map(|e| (Watched::PublicKeys, e)),
        connection_events.map(|e| (Watched::Connections, e)),
    );
    container.follow(events).await
}

/// Watches `resource` in the gateway's namespace, keeping a store of it:
/// PublicKeys, or Connections. The label selector is the peer's cluster
/// ID; the objects are checked again on reading.
fn watch(
    client: &Client,
    settings: &Settings,
    resource: ApiResource,
) -> (Store<DynamicObject>, Events) {
    let api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &settings.gateway.key.namespace,
        &resource,
    );
    let selector = format!("{CLUSTER_ID_LABEL}={}", settings.gateway.cluster_id);
    let writer = reflector::store::Writer::new(resource);
    let store = writer.as_reader();
    let events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer)
        .boxed();
    (store, events)
}

/// The private key in the file Liqo mounts from the gateway's Secret.
fn read_key(path: &Path) -> Result<KeyPair> {
    let data = std::fs::read(path).with_context(|| {
        format!(
            "reading the private key {}: Liqo's template mounts the gateway's key Secret there (--keys-dir)",
            path.display()
        )
    })?;
    kubernetes::key_pair(&data).with_context(|| {
        format!(
            "{}: not a WireGuard private key (32 bytes, or their base64)",
            path.display()
        )
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` where the flags say.
async fn serve_metrics(
    settings: &Settings,
    node: &str,
    tunnel: &Arc<Tunnel>,
    reported: &Arc<Mutex<BTreeMap<String, Health>>>,
) -> Result<Arc<Metrics>> {
    let metrics = Metrics::new(
        None,
        Some(GatewayState {
            tunnels: Arc::new(TunnelSet::of(&settings.dev, tunnel.clone())),
            health: PeerHealth::Reported(reported.clone()),
            device: settings.dev.clone(),
            liqo_api: LiqoApi::V1,
        }),
        BuildInfo {
            node,
            role: "gateway",
            attach_mode: "none",
            xdp_mode: "none",
        },
    )?;
    for addr in &settings.serve_on {
        metrics::serve(*addr, metrics.clone())
            .await
            .with_context(|| format!("serving metrics and health on {addr}"))?;
    }
    Ok(metrics)
}

/// Whether `store` holds a complete first listing.
fn listed(store: &Store<DynamicObject>) -> bool {
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|ready| ready.is_ok())
}

/// The container's state between events.
struct Container {
    client: Client,
    settings: Settings,
    tunnel: Arc<Tunnel>,
    reported: Arc<Mutex<BTreeMap<String, Health>>>,
    public_keys: Store<DynamicObject>,
    connections: Store<DynamicObject>,
    /// The peer's gateway address, for a client whose endpoint is a name.
    address: Option<IpAddr>,
    /// When the name is looked up next.
    lookup_due: Instant,
    /// The peer the tunnel was last given.
    configured: Option<PeerConfig>,
    /// The problems last logged, so that each is logged once.
    problems: Vec<String>,
    /// The last write of the Connection that failed, logged once.
    write_error: Option<String>,
}

/// Which watch an event came from.
#[derive(Clone, Copy)]
enum Watched {
    PublicKeys,
    Connections,
}

type WatchResult = watcher::Result<watcher::Event<DynamicObject>>;
type Events = BoxStream<'static, WatchResult>;

impl Container {
    /// Follows the namespace's PublicKeys and Connections, and the
    /// endpoint's name, until the process ends.
    async fn follow(
        mut self,
        mut events: impl Stream<Item = (Watched, WatchResult)> + Unpin,
    ) -> Result<()> {
        let mut retry = tokio::time::interval(RETRY);
        // What changed since the last pass: the PublicKeys are read again,
        // and the Connection's health taken again, only when theirs did.
        let (mut keys_changed, mut connection_changed) = (true, true);
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some((watched, Ok(_))) => match watched {
                        Watched::PublicKeys => keys_changed = true,
                        Watched::Connections => connection_changed = true,
                    },
                    Some((_, Err(e))) => warn!(error = %e, "watching the API server; retrying with backoff, and the tunnel keeps its peer"),
                    None => bail!("the API server's watch ended"),
                },
                _ = retry.tick() => {}
            }
            // Until both are listed, an empty store says nothing.
            if !listed(&self.public_keys) || !listed(&self.connections) {
                continue;
            }
            if self.look_up_endpoint().await || std::mem::take(&mut keys_changed) {
                self.configure_tunnel();
            }
            if std::mem::take(&mut connection_changed) {
                self.report();
            }
            let written = self.ensure_connection().await.map_err(|e| e.to_string());
            if written.as_ref().err() != self.write_error.as_ref() {
                if let Err(e) = &written {
                    warn!(error = %e, connection = %self.settings.gateway.connection(), "writing the Connection; will retry");
                }
                self.write_error = written.err();
            }
        }
    }

    /// Looks the endpoint's name up when due; a failed lookup keeps the
    /// address it had, as Liqo's DNS routine does. Returns whether the
    /// address changed.
    async fn look_up_endpoint(&mut self) -> bool {
        let Endpoint::Name(name) = &self.settings.endpoint else {
            return false;
        };
        let now = Instant::now();
        if now < self.lookup_due {
            return false;
        }
        // Until it has an address, a name is tried on every retry.
        self.lookup_due = match self.address {
            Some(_) => now + self.settings.dns_check_interval,
            None => now + RETRY,
        };
        match endpoint::lookup(name).await {
            Ok(address) if Some(address) != self.address => {
                info!(name = %name, %address, "--endpoint-address resolved");
                self.address = Some(address);
                self.lookup_due = now + self.settings.dns_check_interval;
                true
            }
            Ok(_) => false,
            Err(e) => {
                warn!(name = %name, error = %e, "--endpoint-address does not resolve");
                false
            }
        }
    }

    /// Gives the tunnel its peer, if the objects changed it.
    fn configure_tunnel(&mut self) {
        let desired = peer::desired(&self.settings, &self.public_keys.state(), self.address);
        for problem in desired
            .problems
            .iter()
            .filter(|p| !self.problems.contains(p))
        {
            warn!(problem = %problem, "the tunnel's peer");
        }
        self.problems = desired.problems;
        if self.configured == desired.peer {
            return;
        }
        let peers: Vec<PeerConfig> = desired.peer.iter().cloned().collect();
        for (key, change) in self.tunnel.set_peers(&peers) {
            info!(peer = %key, ?change, "tunnel peer");
        }
        self.configured = desired.peer;
    }

    /// Takes how the peer fares from its Connection, for `liqo_peer_*`.
    fn report(&self) {
        let health = self.connection().as_deref().and_then(peer::reported_health);
        let mut reported = self.reported.lock().unpoisoned();
        reported.clear();
        if let Some(health) = health {
            reported.insert(self.settings.gateway.cluster_id.clone(), health);
        }
    }

    /// Creates the Connection once the tunnel has its peer, and sets it
    /// Connecting while it has no value, as Liqo's container does after
    /// configuring the device.
    async fn ensure_connection(&self) -> kube::Result<()> {
        if self.configured.is_none() {
            return Ok(());
        }
        let key = self.settings.gateway.connection();
        let existing = self.connection();
        // Liqo's rights for a gateway pod let it create a Connection, not
        // patch one: if another made it first, the watch shows it.
        if existing.is_none() {
            liqo_connection::create(
                &self.client,
                &key,
                &self.settings.gateway,
                self.settings.gateway_uid.as_deref(),
            )
            .await?;
        }
        // Set from what the watch shows, on its version: a status that
        // Liqo's gateway wrote since is never overwritten.
        let Some(existing) = existing.filter(|c| peer::needs_initial_status(c)) else {
            return Ok(());
        };
        let patch = liqo_connection::initial_status_patch(existing.resource_version());
        liqo_connection::api(&self.client, &key)
            .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(drop)
    }

    /// The peer's Connection, `gw-<gateway>`, as last watched.
    fn connection(&self) -> Option<Arc<DynamicObject>> {
        let key = self.settings.gateway.connection();
        self.connections.get(
            &reflector::ObjectRef::new_with(&key.name, liqo_connection::api_resource())
                .within(&key.namespace),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mounted_key_is_read_raw_or_as_text_and_anything_else_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("privateKey");
        let private = [7u8; 32];
        std::fs::write(&path, private).unwrap();
        let raw = read_key(&path).unwrap();
        std::fs::write(&path, crate::model::key_text::encode(&private)).unwrap();
        assert_eq!(read_key(&path).unwrap().public, raw.public);
        // Short, garbled and oversized files are refused, naming the file.
        for forged in [vec![7u8; 31], b"not a key".to_vec(), vec![b'A'; 1 << 20]] {
            std::fs::write(&path, forged).unwrap();
            let error = format!("{:#}", read_key(&path).unwrap_err());
            assert!(error.contains("not a WireGuard private key"), "{error}");
            assert!(error.contains(&path.display().to_string()), "{error}");
        }
        let missing = format!("{:#}", read_key(&dir.path().join("absent")).unwrap_err());
        assert!(missing.contains("--keys-dir"), "{missing}");
    }
}
