//! The TUN device's link state, and the routes that send every peer's
//! networks into it, kept as a diff over netlink. A worker routes them
//! into the overlay's device instead, for its own traffic.
//!
//! Every route the agent writes carries its own protocol number
//! ([`ROUTE_PROTOCOL`]), so that ours are told from anyone else's: a route
//! that exists and is not ours is an error, never replaced.
//!
//! Every gateway, active or standby, keeps the routes into the tunnel
//! staged in their own table ([`TUNNEL_TABLE`]), which no lookup consults;
//! the active gateway also has them in main, where they are used. A rule
//! sending lookups to the staged table would make every route lookup on
//! the node walk the policy rules, a cost on every packet the gateway
//! forwards; copying a few routes at a failover costs once. Behind each
//! network, in main, lies a blackhole route, which outlives the agent: on
//! a standby, and when the agent stops and the TUN device and its routes
//! go, peer-bound traffic is dropped instead of following the default
//! route in clear. Only a removed peer, or `isthmus-agent cleanup`,
//! removes it.

mod netlink;

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, Ipv6Addr},
};

use futures::TryStreamExt;
use ipnet::{IpNet, Ipv4Net};
use netlink_packet_route::{
    address::{AddressMessage, AddressScope},
    route::{RouteHeader, RouteMessage, RouteProtocol, RouteType},
};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use thiserror::Error;

use self::netlink::{
    address_of, connect, destination, dump, is_ours, ours, out_of, preferred_source, remove_rules,
    table,
};
pub use self::netlink::{cleanup, delete_device};
use crate::kernel::link::link_by_name;

/// The protocol number of Isthmus's routes (`ip route` prints `proto 153`).
pub const ROUTE_PROTOCOL: u8 = 153;
/// The metric of the blackhole routes: below any route into the tunnel.
pub const BLACKHOLE_METRIC: u32 = 1 << 30;
/// The table of the staged routes into the tunnel (`ip route show table 153`).
pub const TUNNEL_TABLE: u32 = 153;
const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;
/// The ifindex of a worker's [`Routes`], which have no device: the kernel
/// numbers devices from 1.
const NO_DEVICE: u32 = 0;

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
        net: IpNet,
        /// ` metric N` for a blackhole route, empty otherwise.
        metric: String,
        /// How the kernel describes the route there.
        existing: String,
    },
}

/// One of the three routes of a network, in the order they are added: the
/// blackhole (in main), the staged route into the device (in the tunnel's
/// table), and the route in use (in main, on the active gateway).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Blackhole,
    Staged,
    Live,
}

/// The device's routes, and the blackholes behind them, as installed.
pub struct Routes {
    handle: Handle,
    dev: String,
    index: u32,
    /// Whether these routes keep the blackholes: where a gateway has
    /// several devices, one set of routes keeps them for all.
    blackholes: bool,
    /// Whether routes into the device are staged for a failover: a
    /// tunnel's are, a worker's into the overlay are simply in use.
    staged: bool,
    /// The source address the routes in use give the node's own traffic,
    /// where one is set.
    source: Option<Ipv4Addr>,
    /// Networks of both families, each with its kind of route.
    installed: BTreeSet<(IpNet, Kind)>,
    /// Whether the routes are in use (the active gateway).
    active: bool,
}

/// What a [`Routes::sync`] changed.
#[derive(Debug, Default)]
pub struct Synced {
    /// Networks newly routed into the tunnel (staged).
    pub added: usize,
    /// Networks no longer routed into it.
    pub removed: usize,
    /// `Some(true)` when the routes were put in use, `Some(false)` when
    /// they were taken out of use.
    pub activated: Option<bool>,
    /// Routes that could not be written; the others were.
    pub failures: Vec<RouteError>,
}

impl Routes {
    /// Sets `dev`'s MTU and brings it up, and adopts what of ours a
    /// previous agent left: its blackholes and its routes into this device,
    /// staged or in use. The rule of agents that sent lookups to the
    /// tunnel's table instead is removed.
    pub async fn up(dev: &str, mtu: u32) -> Result<Self, RouteError> {
        Self::open_device(dev, mtu, true).await
    }

    /// As [`Routes::up`], without the blackholes: those of a gateway with
    /// several devices are kept apart ([`Routes::blackholes_only`]).
    pub async fn into_device(dev: &str, mtu: u32) -> Result<Self, RouteError> {
        Self::open_device(dev, mtu, false).await
    }

    async fn open_device(dev: &str, mtu: u32, blackholes: bool) -> Result<Self, RouteError> {
        let handle = connect()?;
        let index = index_of(&handle, dev).await?;
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).mtu(mtu).up().build())
            .execute()
            .await
            .map_err(|source| RouteError::Request {
                what: format!("link {dev}"),
                source,
            })?;
        let routes = Self::adopt(handle, dev, index, blackholes, true).await?;
        remove_rules(&routes.handle).await?;
        Ok(routes)
    }

    /// A worker's: every peer's networks into the overlay's device `dev`,
    /// which sends what the node itself sends there to the gateway node
    /// (the `overlay_own` program), behind the blackholes. Pods' packets are
    /// steered before any route is looked up; these routes serve the
    /// node's own traffic, which the gateway masquerades.
    pub async fn into_overlay(dev: &str) -> Result<Self, RouteError> {
        let handle = connect()?;
        let index = index_of(&handle, dev).await?;
        Self::adopt(handle, dev, index, true, false).await
    }

    /// A worker's: no device, only the blackholes behind every peer's
    /// networks, adopted from a previous agent as a gateway's are. The
    /// overlay steers pods' peer-bound packets before any route is looked
    /// up; what it does not steer (a pod created while the agent was down,
    /// no gateway known) is dropped here instead of following the node's
    /// default route in clear.
    pub async fn blackholes_only() -> Result<Self, RouteError> {
        Self::adopt(connect()?, "", NO_DEVICE, true, false).await
    }

    /// Takes over what of ours a previous agent left: its blackholes, if
    /// these routes keep them, and its routes into device `index`, staged
    /// or in use (none where there is no device).
    async fn adopt(
        handle: Handle,
        dev: &str,
        index: u32,
        blackholes: bool,
        staged: bool,
    ) -> Result<Self, RouteError> {
        let mut installed = BTreeSet::new();
        let mut source = None;
        for route in ours(&handle).await? {
            let into_device = index != NO_DEVICE && out_of(&route) == Some(index);
            let kind = match (route.header.kind, table(&route)) {
                (RouteType::BlackHole, MAIN_TABLE) if blackholes => Kind::Blackhole,
                (_, TUNNEL_TABLE) if into_device => Kind::Staged,
                (_, MAIN_TABLE) if into_device => Kind::Live,
                _ => continue,
            };
            if kind == Kind::Live {
                source = source.or(preferred_source(&route));
            }
            installed.extend(destination(&route).map(|net| (net, kind)));
        }
        let active = installed.iter().any(|(_, kind)| *kind == Kind::Live);
        Ok(Self {
            handle,
            dev: dev.into(),
            index,
            blackholes,
            staged,
            source,
            installed,
            active,
        })
    }

    /// Makes `source` the source address of the node's own traffic along
    /// the routes in use. Those written with another are taken away, for
    /// the next [`Routes::sync`] to write anew.
    pub async fn set_source(&mut self, source: Option<Ipv4Addr>) {
        if source == self.source {
            return;
        }
        let live: Vec<IpNet> = self
            .installed
            .iter()
            .filter(|(_, kind)| *kind == Kind::Live)
            .map(|(net, _)| *net)
            .collect();
        for net in live {
            let _ = self
                .handle
                .route()
                .del(self.message(net, Kind::Live))
                .execute()
                .await;
            self.installed.remove(&(net, Kind::Live));
        }
        self.source = source;
    }

    /// Gives the device the address `addr`/32 (kept if it has it already),
    /// of host scope: the node never picks it as the source of its own
    /// traffic, which goes out through the masquerade as before.
    pub async fn add_address(&self, addr: Ipv4Addr) -> Result<(), RouteError> {
        self.add_network_address(addr, 32, AddressScope::Host).await
    }

    /// Gives the device `addr` in the point-to-point network `addr/prefix_len`
    /// (kept if it has it already), whose other end is then reached
    /// through the device: Liqo v1's tunnel addressing. Any other address
    /// the device has in that network goes: it was ours when we had the
    /// other side of the tunnel, and is now the peer's.
    pub async fn set_link_address(&self, addr: Ipv4Addr, prefix_len: u8) -> Result<(), RouteError> {
        let network = Ipv4Net::new(addr, prefix_len).ok();
        let request = |what: String| move |source| RouteError::Request { what, source };
        let held: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(self.index)
            .set_prefix_length_filter(prefix_len)
            .execute()
            .try_collect()
            .await
            .map_err(request(format!("addresses of {}", self.dev)))?;
        for message in held {
            let Some(other) = address_of(&message) else {
                continue;
            };
            if other != addr && network.is_some_and(|net| net.contains(&other)) {
                self.handle
                    .address()
                    .del(message)
                    .execute()
                    .await
                    .map_err(request(format!(
                        "address {other}/{prefix_len} on {}",
                        self.dev
                    )))?;
            }
        }
        self.add_network_address(addr, prefix_len, AddressScope::Universe)
            .await
    }

    async fn add_network_address(
        &self,
        addr: Ipv4Addr,
        prefix_len: u8,
        scope: AddressScope,
    ) -> Result<(), RouteError> {
        let mut request = self
            .handle
            .address()
            .add(self.index, addr.into(), prefix_len)
            .replace();
        request.message_mut().header.scope = scope;
        request
            .execute()
            .await
            .map_err(|source| RouteError::Request {
                what: format!("address {addr}/{prefix_len} on {}", self.dev),
                source,
            })
    }

    /// Routes exactly `desired` into the device, each behind its
    /// blackhole: staged on every gateway, and in use where `active`; a
    /// worker, with no device, keeps the blackholes alone. On a kernel
    /// without IPv6, IPv6 networks are left out. Adds
    /// what is missing and removes what is no longer wanted; a route that
    /// cannot be written does not stop the others.
    pub async fn sync(&mut self, desired: &BTreeSet<IpNet>, active: bool) -> Synced {
        let kinds: &[Kind] = match (self.index, self.staged, active) {
            (NO_DEVICE, ..) => &[Kind::Blackhole],
            (_, false, _) => &[Kind::Blackhole, Kind::Live],
            (_, true, true) => &[Kind::Blackhole, Kind::Staged, Kind::Live],
            (_, true, false) => &[Kind::Blackhole, Kind::Staged],
        };
        let mut synced = Synced::default();
        let wanted: BTreeSet<(IpNet, Kind)> = desired
            .iter()
            .filter(|net| matches!(net, IpNet::V4(_)) || kernel_has_ipv6())
            .flat_map(|net| kinds.iter().map(|kind| (*net, *kind)))
            .filter(|(_, kind)| self.blackholes || *kind != Kind::Blackhole)
            .collect();
        let missing: Vec<(IpNet, Kind)> = wanted.difference(&self.installed).copied().collect();
        for (net, kind) in missing {
            match self.add(net, kind).await {
                Ok(()) => {
                    self.installed.insert((net, kind));
                    synced.added += usize::from(kind == self.counted());
                }
                Err(e) => synced.failures.push(e),
            }
        }
        let stale: Vec<(IpNet, Kind)> = self.installed.difference(&wanted).copied().collect();
        // In reverse: a network's route in use goes before its blackhole.
        for (net, kind) in stale.iter().rev() {
            // Already gone (the device went down, say) is as good as removed.
            let _ = self
                .handle
                .route()
                .del(self.message(*net, *kind))
                .execute()
                .await;
            self.installed.remove(&(*net, *kind));
            synced.removed += usize::from(*kind == self.counted());
        }
        if self.active != active {
            self.active = active;
            synced.activated = Some(active);
        }
        synced
    }

    /// The kind of route a network is counted by in [`Synced`]: the one
    /// every network into the device has.
    fn counted(&self) -> Kind {
        match self.staged {
            true => Kind::Staged,
            false => Kind::Live,
        }
    }

    /// Creates the route, never replacing one: a route already there is
    /// someone else's (ours were adopted at start). A route in use is also
    /// refused where main has someone else's route for the same network
    /// with another metric, which it would silently override.
    async fn add(&self, net: IpNet, kind: Kind) -> Result<(), RouteError> {
        if kind == Kind::Live {
            let foreign = self.routes_for(net, MAIN_TABLE).await;
            if !foreign.is_empty() {
                return Err(not_ours(net, kind, &foreign));
            }
        }
        let added = self
            .handle
            .route()
            .add(self.message(net, kind))
            .execute()
            .await;
        match added {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => {
                let there = self.routes_for(net, kind.table()).await;
                Err(not_ours(net, kind, &there))
            }
            Err(source) => Err(RouteError::Request {
                what: format!("route {net} dev {}", self.dev),
                source,
            }),
        }
    }

    /// The routes of `table` for exactly `net` that are not ours.
    async fn routes_for(&self, net: IpNet, table_id: u32) -> Vec<RouteMessage> {
        let mut routes = dump(&self.handle).await.unwrap_or_default();
        routes.retain(|r| destination(r) == Some(net) && table(r) == table_id && !is_ours(r));
        routes
    }

    fn message(&self, net: IpNet, kind: Kind) -> RouteMessage {
        match net {
            IpNet::V4(net) => {
                let route = RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(net.network(), net.prefix_len());
                match (kind, self.source) {
                    (Kind::Live, Some(source)) => self.shape(route.pref_source(source), kind),
                    _ => self.shape(route, kind),
                }
            }
            IpNet::V6(net) => {
                let route = RouteMessageBuilder::<Ipv6Addr>::new()
                    .destination_prefix(net.network(), net.prefix_len());
                self.shape(route, kind)
            }
        }
    }

    /// A route of `kind` for the destination `route` holds: ours, in its
    /// table, into the device or a blackhole.
    fn shape<T>(&self, route: RouteMessageBuilder<T>, kind: Kind) -> RouteMessage {
        let route = route
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
            .table_id(kind.table());
        match kind {
            Kind::Staged | Kind::Live => route.output_interface(self.index).build(),
            Kind::Blackhole => route
                .kind(RouteType::BlackHole)
                .priority(BLACKHOLE_METRIC)
                .build(),
        }
    }
}

impl Kind {
    fn table(self) -> u32 {
        match self {
            Kind::Staged => TUNNEL_TABLE,
            Kind::Blackhole | Kind::Live => MAIN_TABLE,
        }
    }
}

/// Whether the kernel has IPv6: one booted without it takes no IPv6 route,
/// and has no IPv6 packet to route.
fn kernel_has_ipv6() -> bool {
    static IPV6: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| std::path::Path::new("/proc/net/if_inet6").exists());
    *IPV6
}

/// The ifindex of device `dev`, which must exist.
async fn index_of(handle: &Handle, dev: &str) -> Result<u32, RouteError> {
    let link = link_by_name(handle, dev)
        .await
        .map_err(|source| RouteError::Request {
            what: format!("link {dev}"),
            source,
        })?
        .ok_or_else(|| RouteError::NoDevice(dev.into()))?;
    Ok(link.header.index)
}

/// The refusal of a route for `net` because of the routes `there`.
fn not_ours(net: IpNet, kind: Kind, there: &[RouteMessage]) -> RouteError {
    let found: Vec<String> = there
        .iter()
        .map(|r| {
            format!(
                "{:?} route, proto {}, oif {}",
                r.header.kind,
                u8::from(r.header.protocol),
                out_of(r).map_or("none".into(), |i| i.to_string())
            )
        })
        .collect();
    RouteError::NotOurs {
        net,
        metric: match kind {
            Kind::Blackhole => format!(" metric {BLACKHOLE_METRIC}"),
            Kind::Staged | Kind::Live => String::new(),
        },
        existing: match found.is_empty() {
            true => "the kernel says it exists".into(),
            false => found.join("; "),
        },
    }
}
