//! The TUN device's link state, and the routes that send every peer's
//! networks into it, kept as a diff over netlink.
//!
//! Every route the agent writes carries its own protocol number
//! ([`ROUTE_PROTOCOL`]), so that ours are told from anyone else's: a route
//! that exists and is not ours is an error, never replaced. Behind each
//! route into the tunnel lies a blackhole route for the same network, of a
//! lower priority, which outlives the agent: when the agent stops and the
//! TUN device and its routes go, peer-bound traffic is dropped instead of
//! following the default route in clear. Only a removed peer, or
//! `isthmus-agent cleanup`, removes it.

use std::{collections::BTreeSet, net::Ipv4Addr};

use futures::TryStreamExt;
use ipnet::Ipv4Net;
use netlink_packet_route::{
    address::AddressScope,
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType},
};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder, new_connection};
use thiserror::Error;

use crate::kernel::link::link_by_name;

/// The protocol number of Isthmus's routes (`ip route` prints `proto 153`).
pub const ROUTE_PROTOCOL: u8 = 153;
/// The metric of the blackhole routes: below any route into the tunnel.
pub const BLACKHOLE_METRIC: u32 = 1 << 30;

/// A netlink request that failed.
#[derive(Debug, Error)]
pub enum RouteError {
    /// Opening the netlink socket failed.
    #[error("netlink: {0}")]
    Connect(#[from] std::io::Error),
    /// The kernel refused a request.
    #[error("{what}: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// What the kernel said.
        source: rtnetlink::Error,
    },
    /// The device does not exist.
    #[error("device {0} not found")]
    NoDevice(String),
    /// A route for a peer's network exists and was not written by us.
    #[error(
        "route {net}{metric} exists and is not Isthmus's ({existing}); it is left alone, and this network is not routed into the tunnel"
    )]
    NotOurs {
        /// The network.
        net: Ipv4Net,
        /// ` metric N` for a blackhole route, empty otherwise.
        metric: String,
        /// How the kernel describes the route there.
        existing: String,
    },
}

/// One of the two routes of a network: into the device, or the blackhole
/// behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Tunnel,
    Blackhole,
}

/// The device's routes, and the blackholes behind them, as installed.
pub struct Routes {
    handle: Handle,
    dev: String,
    index: u32,
    installed: BTreeSet<(Ipv4Net, Kind)>,
}

impl Routes {
    /// Sets `dev`'s MTU and brings it up, and adopts the routes of ours a
    /// previous agent left: its blackholes, and routes into this device.
    pub async fn up(dev: &str, mtu: u32) -> Result<Self, RouteError> {
        let (connection, handle, _) = new_connection()?;
        tokio::spawn(connection);
        let request = |source| RouteError::Request {
            what: format!("link {dev}"),
            source,
        };
        let link = link_by_name(&handle, dev)
            .await
            .map_err(request)?
            .ok_or_else(|| RouteError::NoDevice(dev.into()))?;
        let index = link.header.index;
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).mtu(mtu).up().build())
            .execute()
            .await
            .map_err(request)?;
        let installed = ours(&handle)
            .await?
            .iter()
            .filter_map(|route| {
                let kind = match route.header.kind {
                    RouteType::BlackHole => Kind::Blackhole,
                    _ if out_of(route) == Some(index) => Kind::Tunnel,
                    _ => return None,
                };
                Some((destination(route)?, kind))
            })
            .collect();
        Ok(Self {
            handle,
            dev: dev.into(),
            index,
            installed,
        })
    }

    /// Gives the device the address `addr`/32 (kept if it has it already),
    /// of host scope: the node never picks it as the source of its own
    /// traffic, which goes out through the masquerade as before.
    pub async fn add_address(&self, addr: Ipv4Addr) -> Result<(), RouteError> {
        let mut request = self
            .handle
            .address()
            .add(self.index, addr.into(), 32)
            .replace();
        request.message_mut().header.scope = AddressScope::Host;
        request
            .execute()
            .await
            .map_err(|source| RouteError::Request {
                what: format!("address {addr}/32 on {}", self.dev),
                source,
            })
    }

    /// Routes exactly `desired` into the device, each behind its blackhole:
    /// adds what is missing, removes what is no longer wanted. A route that
    /// cannot be written does not stop the others. Returns (added, removed)
    /// and the failures.
    pub async fn sync(&mut self, desired: &BTreeSet<Ipv4Net>) -> (usize, usize, Vec<RouteError>) {
        let mut failures = Vec::new();
        let mut added = 0;
        for net in desired {
            for kind in [Kind::Blackhole, Kind::Tunnel] {
                if self.installed.contains(&(*net, kind)) {
                    continue;
                }
                match self.add(*net, kind).await {
                    Ok(()) => {
                        self.installed.insert((*net, kind));
                        added += usize::from(kind == Kind::Tunnel);
                    }
                    Err(e) => failures.push(e),
                }
            }
        }
        let stale: Vec<(Ipv4Net, Kind)> = self
            .installed
            .iter()
            .filter(|(net, _)| !desired.contains(net))
            .copied()
            .collect();
        for (net, kind) in &stale {
            // Already gone (the device went down, say) is as good as removed.
            let _ = self
                .handle
                .route()
                .del(self.message(*net, *kind))
                .execute()
                .await;
            self.installed.remove(&(*net, *kind));
        }
        let removed = stale
            .iter()
            .filter(|(_, kind)| *kind == Kind::Tunnel)
            .count();
        (added, removed, failures)
    }

    /// Creates the route, never replacing one: a route already there is
    /// someone else's (ours were adopted at start).
    async fn add(&self, net: Ipv4Net, kind: Kind) -> Result<(), RouteError> {
        let added = self
            .handle
            .route()
            .add(self.message(net, kind))
            .execute()
            .await;
        match added {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => {
                Err(RouteError::NotOurs {
                    net,
                    metric: match kind {
                        Kind::Blackhole => format!(" metric {BLACKHOLE_METRIC}"),
                        Kind::Tunnel => String::new(),
                    },
                    existing: self.describe(net).await,
                })
            }
            Err(source) => Err(RouteError::Request {
                what: format!("route {net} dev {}", self.dev),
                source,
            }),
        }
    }

    /// How the kernel's routes for exactly `net` look, for an error message.
    async fn describe(&self, net: Ipv4Net) -> String {
        let found: Vec<String> = dump(&self.handle)
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| destination(r) == Some(net))
            .map(|r| {
                format!(
                    "{:?} route, proto {}, oif {}",
                    r.header.kind,
                    u8::from(r.header.protocol),
                    out_of(r).map_or("none".into(), |i| i.to_string())
                )
            })
            .collect();
        match found.is_empty() {
            true => "the kernel says it exists".into(),
            false => found.join("; "),
        }
    }

    fn message(&self, net: Ipv4Net, kind: Kind) -> RouteMessage {
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(net.network(), net.prefix_len())
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
        match kind {
            Kind::Tunnel => route.output_interface(self.index).build(),
            Kind::Blackhole => route
                .kind(RouteType::BlackHole)
                .priority(BLACKHOLE_METRIC)
                .build(),
        }
    }
}

/// Removes every route of ours, blackholes included. Returns how many.
pub async fn cleanup() -> Result<usize, RouteError> {
    let (connection, handle, _) = new_connection()?;
    tokio::spawn(connection);
    let mut removed = 0;
    for route in ours(&handle).await? {
        let what = format!("deleting route {:?}", destination(&route));
        handle
            .route()
            .del(route)
            .execute()
            .await
            .map_err(|source| RouteError::Request { what, source })?;
        removed += 1;
    }
    Ok(removed)
}

/// Deletes the persistent TUN device `dev` (and with it every route into
/// it); returns whether it existed.
pub async fn delete_device(dev: &str) -> Result<bool, RouteError> {
    let (connection, handle, _) = new_connection()?;
    tokio::spawn(connection);
    let request = |source| RouteError::Request {
        what: format!("deleting link {dev}"),
        source,
    };
    let Some(link) = link_by_name(&handle, dev).await.map_err(request)? else {
        return Ok(false);
    };
    handle
        .link()
        .del(link.header.index)
        .execute()
        .await
        .map_err(request)?;
    Ok(true)
}

/// Every IPv4 route of the main table.
async fn dump(handle: &Handle) -> Result<Vec<RouteMessage>, RouteError> {
    handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(|source| RouteError::Request {
            what: "listing routes".into(),
            source,
        })
}

/// Every route carrying our protocol number.
async fn ours(handle: &Handle) -> Result<Vec<RouteMessage>, RouteError> {
    let mut routes = dump(handle).await?;
    routes.retain(|r| r.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL));
    Ok(routes)
}

fn destination(route: &RouteMessage) -> Option<Ipv4Net> {
    route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(addr)) => {
            Ipv4Net::new(*addr, route.header.destination_prefix_length).ok()
        }
        _ => None,
    })
}

fn out_of(route: &RouteMessage) -> Option<u32> {
    route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(index) => Some(*index),
        _ => None,
    })
}
