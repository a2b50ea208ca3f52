//! The overlay between the cluster's nodes (see `isthmus_common::overlay`):
//! the VXLAN device, the gateway node workers send to, and the table of
//! other nodes the gateway sends to, by their PodCIDRs and addresses. Both
//! follow the Node objects of the source; no rule or FDB entry is written.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use aya::maps::MapError;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use isthmus_common::{
    overlay::{OverlayConfig, PAST_NETFILTER, PAST_NETFILTER6},
    wire::{Be32, Be128},
};
use rtnetlink::{
    Handle, LinkUnspec, LinkVxlan, new_connection,
    packet_core::{DefaultNla, Emitable, NLA_F_NESTED},
    packet_route::link::{
        AfSpecInet, AfSpecUnspec, InfoData, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage,
    },
};
use thiserror::Error;
use tracing::{info, warn};

use crate::{
    kernel::dataplane::{AttachMode, Dataplane},
    kernel::link::{self, device_holding, link_by_name},
    kernel::maps::{ByteHash, NodeMap, OverlayMaps, OverlaySettings, PrefixTrie},
    kernel::netfilter::rules::IpFamily,
    kernel::table::{KernelTable, Mirror},
    model::{cidr::Cidr, node::Node},
};

/// What the operator chose for the overlay.
#[derive(Clone, Debug)]
pub struct OverlayOptions {
    /// The VXLAN device's name.
    pub dev: String,
    /// The VNI of overlay packets.
    pub vni: u32,
    /// The UDP port of the overlay.
    pub port: u16,
    /// The gateway node's address, if fixed by configuration; otherwise
    /// it is the address of the node carrying `gateway_label`.
    pub gateway: Option<Ipv4Addr>,
    /// The label (`key=value`) of the gateway node.
    pub gateway_label: String,
    /// This node's name: its own PodCIDRs are not overlay destinations.
    pub node: String,
    /// The families forwarded past netfilter ([`PAST_NETFILTER`],
    /// [`PAST_NETFILTER6`]) from the start; [`Overlay::set_past_netfilter`]
    /// changes them.
    pub past_netfilter: Vec<IpFamily>,
}

/// Failures setting the overlay up.
#[derive(Debug, Error)]
pub enum OverlayError {
    /// Opening the netlink socket failed.
    #[error("netlink: {0}")]
    Connect(#[from] std::io::Error),
    /// The kernel refused a request about the device.
    #[error("overlay device {dev}: {what}: {source}")]
    Device {
        /// The device.
        dev: String,
        /// What was asked.
        what: &'static str,
        /// What the kernel said.
        source: rtnetlink::Error,
    },
    /// The device vanished between creation and lookup.
    #[error("overlay device {0} not found after creating it")]
    Missing(String),
    /// A map could not be written.
    #[error("overlay map: {0}")]
    Map(#[from] MapError),
}

/// The overlay's kernel state on this node.
pub struct Overlay {
    options: OverlayOptions,
    settings: OverlaySettings,
    config: OverlayConfig,
    nodes: Mirror<NodeMap>,
    /// Every node's address: the overlay takes packets from nowhere else.
    addresses: Mirror<ByteHash<Be32>>,
    /// Every node's IPv6 address: the NAT leads no peer's packet there.
    addresses6: Mirror<ByteHash<Be128>>,
    /// Destinations whose packets take the stack while others skip it.
    stack_destinations: Mirror<PrefixTrie<u8>>,
    /// The same, for IPv6.
    stack_destinations6: Mirror<PrefixTrie<u8, Ipv6Net>>,
    /// The device the decapsulation is attached to: the one holding this
    /// node's address.
    uplink: Option<String>,
}

impl Overlay {
    /// Writes the settings for the VXLAN device `ifindex`, keeping the
    /// gateway a previous agent found until the source says otherwise, so a
    /// restart does not interrupt the overlay.
    pub fn new(
        options: OverlayOptions,
        maps: OverlayMaps,
        ifindex: u32,
    ) -> Result<Self, OverlayError> {
        let OverlayMaps {
            mut settings,
            nodes,
            addresses,
            addresses6,
            stack_destinations,
            stack_destinations6,
        } = maps;
        let previous = settings.get()?;
        let config = OverlayConfig {
            gateway: options.gateway.map_or(previous.gateway, Be32::from),
            vni: options.vni,
            ifindex,
            local: previous.local,
            port: options.port,
            flags: (options.past_netfilter.iter()).fold(0, |flags, f| flags | past_flag(*f)),
        };
        settings.set(config)?;
        Ok(Self {
            options,
            settings,
            config,
            nodes: Mirror::new(nodes)?,
            addresses: Mirror::new(addresses)?,
            addresses6: Mirror::new(addresses6)?,
            stack_destinations: Mirror::new(stack_destinations)?,
            stack_destinations6: Mirror::new(stack_destinations6)?,
            uplink: None,
        })
    }

    /// Follows the cluster's nodes: the gateway workers send to, every
    /// other node's PodCIDRs, and every node's addresses of both families.
    /// Returns the first failure after trying every change.
    pub fn sync(&mut self, nodes: &[Node], active: Option<&str>) -> Result<(), MapError> {
        // A node's address is there for the replies to its own traffic,
        // which the gateway masquerades: they come back over the overlay,
        // where the node's route to the peer leads, so a strict
        // reverse-path filter lets them in.
        let desired: BTreeMap<Ipv4Net, Be32> = nodes
            .iter()
            .filter(|n| n.name != self.options.node)
            .flat_map(|n| {
                let node = Be32::from(n.address);
                n.pod_cidrs
                    .iter()
                    .copied()
                    .chain([Ipv4Net::from(n.address)])
                    .map(move |c| (c, node))
            })
            .collect();
        let addresses: BTreeMap<Be32, u8> = nodes
            .iter()
            .map(|n| n.address)
            .chain(self.options.gateway)
            .map(|a| (Be32::from(a), 1))
            .collect();
        let addresses6: BTreeMap<Be128, u8> = nodes
            .iter()
            .filter_map(|n| n.address6)
            .map(|a| (Be128::from(a), 1))
            .collect();
        let (_, _, address_failure) = self.addresses.apply(&addresses);
        let (_, _, address6_failure) = self.addresses6.apply(&addresses6);
        let (written, removed, failure) = self.nodes.apply(&desired);
        if written + removed > 0 {
            info!(
                written,
                removed,
                entries = desired.len(),
                "overlay node table programmed"
            );
        }
        let config = OverlayConfig {
            gateway: self.gateway(nodes, active),
            local: nodes
                .iter()
                .find(|n| n.name == self.options.node)
                .map_or(Be32::ZERO, |n| Be32::from(n.address)),
            ..self.config
        };
        if config != self.config {
            self.settings.set(config)?;
            if config.gateway != self.config.gateway {
                let address = Ipv4Addr::from(config.gateway);
                info!(gateway = %address, "overlay sends remote-bound traffic to this gateway node");
            }
            self.config = config;
        }
        failure
            .or(address_failure)
            .or(address6_failure)
            .map_or(Ok(()), Err)
    }

    /// Takes away the decapsulation a previous agent that forwarded past
    /// netfilter left pinned on the uplink, when this one does not: an
    /// older agent's program does not read the setting, and would go on
    /// forwarding past netfilter.
    pub fn drop_stale_decap(&self, dataplane: &mut Dataplane) {
        if self.past_netfilter(IpFamily::Ipv4) {
            return;
        }
        let Some(dev) = self.uplink_now() else {
            return;
        };
        if let Err(e) = dataplane.detach_decap(&dev) {
            warn!(dev = %dev, error = %e, "detaching a previous agent's decapsulation");
        }
    }

    /// This node's address, once the source has given it.
    pub fn local_address(&self) -> Option<Ipv4Addr> {
        let local = Ipv4Addr::from(self.config.local);
        (!local.is_unspecified()).then_some(local)
    }

    /// Whether the programs forward `family`'s packets past netfilter now.
    pub fn past_netfilter(&self, family: IpFamily) -> bool {
        self.config.flags & past_flag(family) != 0
    }

    /// Starts or stops forwarding `family`'s packets past netfilter; the
    /// decapsulation on the uplink, which takes IPv4 alone, follows at the
    /// next [`Overlay::refresh_uplink`]. Returns whether that changed
    /// anything.
    pub fn set_past_netfilter(&mut self, family: IpFamily, on: bool) -> Result<bool, MapError> {
        if on == self.past_netfilter(family) {
            return Ok(false);
        }
        let config = OverlayConfig {
            flags: self.config.flags ^ past_flag(family),
            ..self.config
        };
        self.settings.set(config)?;
        self.config = config;
        Ok(true)
    }

    /// Sends `family`'s packets to `destinations` (its own; any of the
    /// other family are left out) through the stack while the others
    /// forward past netfilter. Returns whether that changed anything.
    pub fn set_stack_destinations(
        &mut self,
        family: IpFamily,
        destinations: &[IpNet],
    ) -> Result<bool, MapError> {
        match family {
            IpFamily::Ipv4 => write_destinations(&mut self.stack_destinations, destinations),
            IpFamily::Ipv6 => write_destinations(&mut self.stack_destinations6, destinations),
        }
    }

    /// How many destinations of `family` take the stack, as written.
    pub fn stack_destinations(&self, family: IpFamily) -> usize {
        match family {
            IpFamily::Ipv4 => self.stack_destinations.applied().len(),
            IpFamily::Ipv6 => self.stack_destinations6.applied().len(),
        }
    }

    /// The device holding this node's address now, if it is known.
    fn uplink_now(&self) -> Option<String> {
        self.local_address().and_then(device_holding)
    }

    /// Keeps the decapsulation on the device holding this node's address,
    /// found again on every call, so an address that appears late or moves
    /// is followed. Without it, the VXLAN device takes every packet in, as
    /// it does when the node does not forward past netfilter: then the
    /// decapsulation could forward nothing.
    pub fn refresh_uplink(&mut self, dataplane: &mut Dataplane, mode: AttachMode) {
        let wanted = self
            .uplink_now()
            .filter(|_| self.past_netfilter(IpFamily::Ipv4));
        if wanted == self.uplink {
            return;
        }
        if let Some(old) = self.uplink.take()
            && let Err(e) = dataplane.detach_decap(&old)
        {
            warn!(dev = %old, error = %e, "detaching the overlay's decapsulation from a former uplink");
        }
        let Some(dev) = wanted else {
            return;
        };
        match dataplane.attach_decap(&dev, mode) {
            Ok(()) => {
                let address = Ipv4Addr::from(self.config.local);
                info!(dev = %dev, %address, "overlay decapsulation attached to the uplink");
                self.uplink = Some(dev);
            }
            Err(e) => {
                warn!(dev = %dev, error = %e, "attaching the overlay's decapsulation; will retry");
            }
        }
    }

    /// The gateway node's address workers send to (its own on the gateway
    /// itself), or 0 while none is known. Where several nodes carry the
    /// gateway label, the one holding the election's Lease (`active`).
    fn gateway(&self, nodes: &[Node], active: Option<&str>) -> Be32 {
        if let Some(fixed) = self.options.gateway {
            return Be32::from(fixed);
        }
        let labelled: Vec<&Node> = nodes
            .iter()
            .filter(|n| n.has_label(&self.options.gateway_label))
            .collect();
        let elected = labelled.iter().find(|n| Some(n.name.as_str()) == active);
        let Some(gateway) = elected.or(labelled.first()) else {
            return Be32::ZERO;
        };
        if elected.is_none() && labelled.len() > 1 {
            warn!(chosen = %gateway.name, label = %self.options.gateway_label, "several nodes carry the gateway label and none holds the election's Lease; the first by name is used");
        }
        Be32::from(gateway.address)
    }
}

/// Creates the collect-metadata VXLAN device `options.dev`, or keeps the
/// one a previous agent created if it is configured alike, and brings it up.
/// Returns its ifindex.
pub async fn ensure_device(options: &OverlayOptions) -> Result<u32, OverlayError> {
    let (connection, handle, _) = new_connection()?;
    tokio::spawn(connection);
    let dev = &options.dev;
    let failed = |what| {
        move |source| OverlayError::Device {
            dev: dev.clone(),
            what,
            source,
        }
    };
    if let Some(link) = link_by_name(&handle, dev).await.map_err(failed("lookup"))? {
        if is_ours(&link, options.port) {
            return up(&handle, link.header.index)
                .await
                .map_err(failed("bringing it up"));
        }
        warn!(dev = %dev, "replacing a device of that name that is not a metadata VXLAN on the overlay port");
        handle
            .link()
            .del(link.header.index)
            .execute()
            .await
            .map_err(failed("deleting the old device"))?;
    }
    // The kernel maps every packet of a metadata device to VNI 0 when it
    // looks for the receiving device, so the device itself must have VNI 0;
    // the VNI travels in the tunnel key.
    let device = LinkVxlan::new(dev, 0)
        .port(options.port)
        .collect_metadata(true)
        .learning(false)
        .build();
    handle
        .link()
        .add(device)
        .execute()
        .await
        .map_err(failed("creating it"))?;
    let link = link_by_name(&handle, dev)
        .await
        .map_err(failed("lookup"))?
        .ok_or_else(|| OverlayError::Missing(dev.clone()))?;
    info!(dev = %dev, vni = options.vni, port = options.port, "overlay device created");
    accept_any_source(&handle, link.header.index)
        .await
        .map_err(failed("turning reverse-path filtering off"))?;
    up(&handle, link.header.index)
        .await
        .map_err(failed("bringing it up"))
}

/// Packets from other nodes' pods arrive on the device while the route
/// back to them leads elsewhere; strict reverse-path filtering on the
/// device would drop them. (`all` still applies where it is stricter.)
/// Set through netlink, not /proc/sys, which container runtimes mount
/// read-only.
async fn accept_any_source(handle: &Handle, index: u32) -> Result<(), rtnetlink::Error> {
    const IFLA_INET_CONF: u16 = 1;
    const IPV4_DEVCONF_RP_FILTER: u16 = 8;
    // One nested attribute, the setting's index and its value: the
    // library's `DevConfRequest` leaves out settings whose value is 0.
    let rp_filter_off = DefaultNla::new(IPV4_DEVCONF_RP_FILTER, 0u32.to_ne_bytes().to_vec());
    let mut nested = vec![0; rp_filter_off.buffer_len()];
    rp_filter_off.emit(&mut nested);
    let conf = DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, nested);
    let mut message = LinkUnspec::new_with_index(index).build();
    message
        .attributes
        .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
            AfSpecInet::Other(conf),
        ])]));
    handle.link().set(message).execute().await
}

/// Brings the device up without ARP: the node's own packets routed into
/// it get the device's own address as their destination MAC, which the
/// receiving node's `overlay_accept` takes in, where ARP would ask a
/// device that sends nothing without a tunnel key.
async fn up(handle: &Handle, index: u32) -> Result<u32, rtnetlink::Error> {
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).arp(false).up().build())
        .execute()
        .await?;
    Ok(index)
}

/// Whether `link` is a collect-metadata VXLAN device of VNI 0 on `port`.
fn is_ours(link: &LinkMessage, port: u16) -> bool {
    let infos = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => Some(infos),
        _ => None,
    });
    let vxlan = infos.into_iter().flatten().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vxlan(vxlan)) => Some(vxlan),
        _ => None,
    });
    vxlan.is_some_and(|v| {
        v.contains(&InfoVxlan::CollectMetadata(true))
            && v.contains(&InfoVxlan::Port(port))
            && v.contains(&InfoVxlan::Id(0))
    })
}

/// Worker: the pod-facing devices the steering program is attached to,
/// found by name as pods come and go, and their ifindexes in the kernel's
/// table of pod veths.
pub struct PodDevices {
    patterns: Vec<String>,
    attached: BTreeMap<String, u32>,
    table: ByteHash<u32>,
}

impl PodDevices {
    /// Devices named by `patterns`: exact names, or prefixes ending in `*`.
    /// The table starts empty: a previous agent's ifindexes may have been
    /// reused by other devices since.
    pub fn new(patterns: Vec<String>, mut table: ByteHash<u32>) -> Result<Self, MapError> {
        for (ifindex, old) in table.entries()? {
            table.delete(ifindex, &old)?;
        }
        Ok(Self {
            patterns,
            attached: BTreeMap::new(),
            table,
        })
    }

    /// Attaches the steering program to every new matching device and
    /// forgets devices that are gone. A device that refuses is retried on
    /// the next call; the others are unaffected.
    pub fn refresh(&mut self, dataplane: &mut Dataplane, mode: AttachMode) {
        let Ok(present) = link::devices() else {
            return;
        };
        let present: BTreeSet<String> = present
            .into_iter()
            .filter(|dev| self.patterns.iter().any(|p| matches(p, dev)))
            .collect();
        let new: Vec<&String> = present
            .iter()
            .filter(|d| !self.attached.contains_key(*d))
            .collect();
        for dev in new {
            match self.attach(dataplane, dev, mode) {
                Ok(ifindex) => {
                    info!(dev = %dev, ifindex, "steering program attached to pod device");
                    self.attached.insert(dev.clone(), ifindex);
                }
                Err(e) => {
                    warn!(dev = %dev, error = %e, "attaching the steering program; will retry");
                }
            }
        }
        let gone: Vec<(String, u32)> = self
            .attached
            .iter()
            .filter(|(dev, _)| !present.contains(*dev))
            .map(|(dev, ifindex)| (dev.clone(), *ifindex))
            .collect();
        for (dev, ifindex) in gone {
            if let Err(e) = self.table.delete(ifindex, &1) {
                warn!(dev = %dev, error = %e, "removing a vanished pod device from the kernel's table");
            }
            if let Err(e) = dataplane.forget_device(&dev) {
                warn!(dev = %dev, error = %e, "removing the link pins of a vanished pod device");
            }
            self.attached.remove(&dev);
        }
    }

    fn attach(
        &mut self,
        dataplane: &mut Dataplane,
        dev: &str,
        mode: AttachMode,
    ) -> Result<u32, Box<dyn std::error::Error>> {
        dataplane.attach_steer(dev, mode)?;
        let ifindex = link::ifindex(dev)?;
        self.table.put(ifindex, &1, None)?;
        Ok(ifindex)
    }
}

/// Whether device `dev` matches `pattern`: equal, or starting with what
/// precedes a final `*`.
fn matches(pattern: &str, dev: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => dev.starts_with(prefix),
        None => dev == pattern,
    }
}

/// The flag of [`OverlayConfig::flags`] that sends `family`'s packets past
/// netfilter.
fn past_flag(family: IpFamily) -> u16 {
    match family {
        IpFamily::Ipv4 => PAST_NETFILTER,
        IpFamily::Ipv6 => PAST_NETFILTER6,
    }
}

/// Brings one family's table of destinations that take the stack to those
/// of `destinations` of its family. Returns whether that changed anything.
fn write_destinations<N: Cidr + Ord>(
    table: &mut Mirror<PrefixTrie<u8, N>>,
    destinations: &[IpNet],
) -> Result<bool, MapError>
where
    N::Wire: aya::Pod,
{
    let desired: BTreeMap<N, u8> = destinations
        .iter()
        .filter_map(|d| N::of(*d))
        .map(|d| (d, 1))
        .collect();
    if table.applied().len() == desired.len()
        && desired.keys().all(|d| table.applied().contains_key(d))
    {
        return Ok(false);
    }
    let (written, removed, failure) = table.apply(&desired);
    failure.map_or(Ok(written + removed > 0), Err)
}
