//! One tunnel device of a gateway and what goes with it: the tunnel that
//! reads it and listens on its UDP port, the routes into it, and its
//! conncheck socket. Peers of Liqo v0.10's API share one device; each
//! Liqo v1 peer has its own, since their real networks may overlap
//! (see [`super::liqo_v1`]).

use std::{
    net::Ipv4Addr,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use tracing::{error, info};

use super::{
    conncheck::{self, Checks},
    liqo_v1::{self, TunnelAddresses},
};
use crate::{
    model::peer::{Endpoint, Peer, Remaps},
    roles::routes::{self, Routes, Synced},
    tunnel::{Tunnel, TunnelConfig, key::KeyPair, peers::PeerConfig},
};

/// Which device a peer's tunnel runs on, and where it listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneSpec {
    /// The TUN device.
    pub device: String,
    /// The UDP port; 0 for one the kernel picks: the side that makes
    /// contact needs no port known in advance.
    pub port: u16,
    /// Whether the device carries one Liqo v1 peer, which it names to the
    /// kernel, and has Liqo v1's tunnel address.
    pub liqo_v1: bool,
    /// The device's MTU, where the peer's gateway object gives one; else
    /// the gateway's (`--mtu`).
    pub mtu: Option<u32>,
}

impl LaneSpec {
    /// The lane of `peer`: its own device for a Liqo v1 peer, listening on
    /// the port of the gateway object where we are its server; `shared`,
    /// every other peer's, otherwise, if the gateway has one.
    pub fn of(peer: &Peer, shared: Option<&LaneSpec>) -> Option<LaneSpec> {
        let params = peer.tunnel.as_ref().ok()?;
        if peer.remaps() != Remaps::Theirs {
            return shared.cloned();
        }
        Some(LaneSpec {
            device: liqo_v1::device_of(peer.label()),
            port: match params.endpoint {
                Endpoint::Learned => params.port,
                Endpoint::Addr(_) | Endpoint::Name(_) => 0,
            },
            liqo_v1: true,
            mtu: params.mtu.map(u32::from),
        })
    }
}

/// What every lane of a gateway starts from.
#[derive(Clone)]
pub struct LaneSettings {
    /// The tunnel's settings but for the device and port.
    pub tunnel: TunnelConfig,
    /// The gateway's key.
    pub key: KeyPair,
    /// Whether the conncheck's PINGs to Liqo v0.10 peers leave through the
    /// masquerade (see [`conncheck`]).
    pub masquerading: bool,
}

/// A running tunnel device.
pub struct Lane {
    spec: LaneSpec,
    /// The tunnel on the device.
    pub tunnel: Arc<Tunnel>,
    routes: Routes,
    conncheck: tokio::task::AbortHandle,
    /// The device's Liqo v1 address now, which follows our side.
    tunnel_address: Option<Ipv4Addr>,
}

impl Lane {
    /// Starts the tunnel on the device of `spec` and brings the device up,
    /// with its conncheck socket reporting to `checks`.
    pub async fn start(
        spec: &LaneSpec,
        settings: &LaneSettings,
        checks: &Arc<Mutex<Checks>>,
    ) -> Result<Self> {
        let config = TunnelConfig {
            dev: spec.device.clone(),
            port: spec.port,
            mtu: spec.mtu.unwrap_or(settings.tunnel.mtu),
            ..settings.tunnel.clone()
        };
        let tunnel = Tunnel::start(&config, settings.key.clone()).with_context(|| {
            format!(
                "starting the tunnel on {} and UDP port {}",
                config.dev, config.port
            )
        })?;
        let routes = Routes::into_device(&config.dev, config.mtu).await?;
        let (responder, pinger) = conncheck_sockets(spec, settings.masquerading, &routes).await?;
        let conncheck = conncheck::spawn(responder, pinger, checks.clone(), spec.device.clone());
        info!(dev = %config.dev, port = tunnel.port(), workers = config.workers, "tunnel up");
        Ok(Self {
            spec: spec.clone(),
            tunnel: Arc::new(tunnel),
            routes,
            conncheck,
            tunnel_address: None,
        })
    }

    /// What the lane was started for.
    pub fn spec(&self) -> &LaneSpec {
        &self.spec
    }

    /// The UDP port the tunnel listens on.
    pub fn port(&self) -> u16 {
        self.tunnel.port()
    }

    /// Gives the tunnel exactly `configs`, logging each change.
    pub fn set_peers(&self, configs: &[PeerConfig]) {
        for (object, change) in self.tunnel.set_peers(configs) {
            info!(dev = %self.spec.device, object = %object, change = ?change, "tunnel peer");
        }
    }

    /// Routes `peers`' views into the device, in use when `active`, and on
    /// a Liqo v1 peer's device takes our side's address. Returns whether
    /// every route, and the address, could be written; it logs why not.
    pub async fn follow(&mut self, peers: &[&Peer], active: bool) -> bool {
        let side = match peers.first().filter(|_| self.spec.liqo_v1) {
            Some(peer) => self.follow_side(peer).await,
            None => true,
        };
        let desired = peers
            .iter()
            .flat_map(|peer| peer.all_views().into_iter().map(|(_, net)| net))
            .collect();
        let synced = self.routes.sync(&desired, active).await;
        log_routes(&self.spec.device, synced) && side
    }

    /// Gives the device our Liqo v1 address towards `peer`, by the side we
    /// have: the peer's conncheck PINGs it, and ours leave from it. A
    /// failure is logged and tried again at the next pass. Returns
    /// whether the device has it.
    async fn follow_side(&mut self, peer: &Peer) -> bool {
        let Some(ends) = TunnelAddresses::of(peer) else {
            return true;
        };
        if self.tunnel_address == Some(ends.ours) {
            return true;
        }
        match self
            .routes
            .set_link_address(ends.ours, liqo_v1::PREFIX_LEN)
            .await
        {
            Ok(()) => {
                info!(dev = %self.spec.device, address = %ends.ours, peer = %ends.theirs, "tunnel address set");
                self.tunnel_address = Some(ends.ours);
                true
            }
            Err(e) => {
                error!(dev = %self.spec.device, error = %e, "setting the tunnel address; will retry");
                false
            }
        }
    }

    /// Stops the tunnel and deletes the device, with every route into it.
    pub async fn close(self) {
        self.conncheck.abort();
        let device = self.spec.device;
        // Stopping joins the tunnel's threads, which wake to notice it.
        let stopped = tokio::task::spawn_blocking(move || drop(self.tunnel)).await;
        if let Err(e) = stopped {
            error!(dev = %device, error = %e, "stopping a tunnel");
        }
        match routes::delete_device(&device).await {
            Ok(_) => info!(dev = %device, "tunnel device deleted: its peer is gone"),
            Err(e) => {
                error!(dev = %device, error = %e, "deleting a tunnel device whose peer is gone");
            }
        }
    }
}

/// The conncheck's sockets on `spec`'s device: on a Liqo v1 peer's, one
/// bound to the device, which answers on whatever address it has and
/// PINGs from there; on the shared device, one on Liqo v0.10's answering
/// address, which the NatMapping's `169.254.0.1` entry leads to, and one
/// to PING from through the masquerade where there is one.
async fn conncheck_sockets(
    spec: &LaneSpec,
    masquerading: bool,
    routes: &Routes,
) -> Result<(tokio::net::UdpSocket, Option<tokio::net::UdpSocket>)> {
    if spec.liqo_v1 {
        let socket = conncheck::bind_on_device(&spec.device)
            .with_context(|| format!("binding the conncheck to device {}", spec.device))?;
        return Ok((socket, None));
    }
    let responder = conncheck_socket(routes, conncheck::ADDR, conncheck::PORT).await?;
    let pinger = match masquerading {
        true => Some(conncheck_socket(routes, conncheck::SENDER_ADDR, 0).await?),
        false => None,
    };
    Ok((responder, pinger))
}

/// A conncheck socket on `addr`, which the tunnel device gets.
async fn conncheck_socket(
    routes: &Routes,
    addr: Ipv4Addr,
    port: u16,
) -> Result<tokio::net::UdpSocket> {
    routes.add_address(addr).await?;
    tokio::net::UdpSocket::bind((addr, port))
        .await
        .with_context(|| format!("binding the conncheck to {addr}:{port}"))
}

/// Logs what a sync of `device`'s routes changed, and why any failed.
/// Returns whether every route was written.
pub fn log_routes(device: &str, synced: Synced) -> bool {
    let (added, removed) = (synced.added, synced.removed);
    if added + removed > 0 {
        info!(
            dev = device,
            added, removed, "routes into the tunnel updated"
        );
    }
    match synced.activated {
        Some(true) => info!(dev = device, "routes into the tunnel in use"),
        Some(false) => info!(dev = device, "routes into the tunnel staged, not in use"),
        None => {}
    }
    let routed = synced.failures.is_empty();
    for e in synced.failures {
        error!(dev = device, error = %e, "routing a peer's network into the tunnel; will retry");
    }
    routed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{liqo_v1::fixtures, peer::GatewayRole};

    fn shared() -> LaneSpec {
        LaneSpec {
            device: "isthmus0".into(),
            port: 5871,
            liqo_v1: false,
            mtu: None,
        }
    }

    #[test]
    fn a_v1_peer_has_its_own_device_on_its_servers_port_or_a_port_the_kernel_picks_with_its_mtu() {
        let server = fixtures::rome(fixtures::SERVER, true);
        // Liqo's MTU, as the object gives it.
        let own = LaneSpec {
            device: "ist-rome".into(),
            port: 51840,
            liqo_v1: true,
            mtu: Some(1340),
        };
        assert_eq!(LaneSpec::of(&server, Some(&shared())), Some(own.clone()));
        assert_eq!(LaneSpec::of(&server, None), Some(own.clone()));
        let client = fixtures::rome(fixtures::CLIENT, true);
        assert_eq!(
            client.liqo_gateway.as_ref().map(|g| g.role),
            Some(GatewayRole::Client)
        );
        assert_eq!(
            LaneSpec::of(&client, None),
            Some(LaneSpec { port: 0, ..own })
        );
        // Without its key there is no tunnel, and so no device.
        assert_eq!(
            LaneSpec::of(&fixtures::rome(fixtures::SERVER, false), None),
            None
        );
    }
}
