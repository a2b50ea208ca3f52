//! The TUN device's link state, and the routes that send every peer's
//! networks into it, kept as a diff over netlink.

use std::{collections::BTreeSet, net::Ipv4Addr};

use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    Handle, LinkUnspec, RouteMessageBuilder, new_connection, packet_route::link::LinkMessage,
};
use thiserror::Error;

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
}

/// The link named `dev`, or None if there is none.
pub(crate) async fn link_by_name(
    handle: &Handle,
    dev: &str,
) -> Result<Option<LinkMessage>, rtnetlink::Error> {
    match handle
        .link()
        .get()
        .match_name(dev.to_owned())
        .execute()
        .try_next()
        .await
    {
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        other => other,
    }
}

/// The device's routes, as installed by this agent.
pub struct Routes {
    handle: Handle,
    dev: String,
    index: u32,
    installed: BTreeSet<Ipv4Net>,
}

impl Routes {
    /// Sets `dev`'s MTU and brings it up.
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
        Ok(Self {
            handle,
            dev: dev.into(),
            index,
            installed: BTreeSet::new(),
        })
    }

    /// Routes exactly `desired` into the device: adds what is missing,
    /// removes what is no longer wanted. Returns (added, removed).
    pub async fn sync(
        &mut self,
        desired: &BTreeSet<Ipv4Net>,
    ) -> Result<(usize, usize), RouteError> {
        let added: Vec<Ipv4Net> = desired.difference(&self.installed).copied().collect();
        let removed: Vec<Ipv4Net> = self.installed.difference(desired).copied().collect();
        for net in &added {
            let route = self.message(*net);
            self.handle
                .route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(|source| RouteError::Request {
                    what: format!("route {net} dev {}", self.dev),
                    source,
                })?;
            self.installed.insert(*net);
        }
        for net in &removed {
            let route = self.message(*net);
            // Already gone (the device went down, say) is as good as removed.
            let _ = self.handle.route().del(route).execute().await;
            self.installed.remove(net);
        }
        Ok((added.len(), removed.len()))
    }

    fn message(&self, net: Ipv4Net) -> netlink_packet_route::route::RouteMessage {
        RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(net.network(), net.prefix_len())
            .output_interface(self.index)
            .build()
    }
}
