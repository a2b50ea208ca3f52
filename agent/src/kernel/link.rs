//! The host's network devices, as the loader and the roles need them:
//! which exist, their ifindex and link type, and lookups over netlink.

use std::{fs, net::Ipv4Addr, path::Path};

use futures::{FutureExt, StreamExt, TryStreamExt};
use netlink_packet_route::link::LinkMessage;
use rtnetlink::Handle;
use thiserror::Error;
use tracing::warn;

/// `ARPHRD_ETHER`: an Ethernet device.
pub const ARPHRD_ETHER: u32 = 1;
/// `ARPHRD_NONE`: a raw L3 device, such as a TUN.
pub const ARPHRD_NONE: u32 = 0xfffe;

/// Where the kernel lists this netns's devices.
pub const SYS_CLASS_NET: &str = "/sys/class/net";

/// A device that cannot be used, or read.
#[derive(Debug, Error)]
#[error("device {dev}: {reason}")]
pub struct DeviceError {
    /// The device.
    pub dev: String,
    /// Why it cannot be used.
    pub reason: String,
}

/// The names of this netns's network devices.
pub fn devices() -> std::io::Result<Vec<String>> {
    Ok(fs::read_dir(SYS_CLASS_NET)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect())
}

/// Whether device `dev` is a TUN device.
pub fn is_tun(dev: &str) -> bool {
    Path::new(SYS_CLASS_NET)
        .join(dev)
        .join("tun_flags")
        .exists()
}

/// The link type (`ARPHRD_*`) of device `dev`.
pub fn link_type(dev: &str) -> Result<u32, DeviceError> {
    device_number(dev, "type")
}

/// The ifindex of device `dev`.
pub fn ifindex(dev: &str) -> Result<u32, DeviceError> {
    device_number(dev, "ifindex")
}

/// A number the kernel shows in `/sys/class/net/<dev>/<file>`.
fn device_number(dev: &str, file: &str) -> Result<u32, DeviceError> {
    let path = Path::new(SYS_CLASS_NET).join(dev).join(file);
    let text = fs::read_to_string(&path).map_err(|e| DeviceError {
        dev: dev.into(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    text.trim().parse().map_err(|_| DeviceError {
        dev: dev.into(),
        reason: format!("unexpected {file} {text:?}"),
    })
}

/// The link named `dev`, or None if there is none.
pub async fn link_by_name(
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

/// The device that holds IPv4 address `address`, if any.
pub fn device_holding(address: Ipv4Addr) -> Option<String> {
    let addresses = match nix::ifaddrs::getifaddrs() {
        Ok(addresses) => addresses,
        Err(e) => {
            warn!(error = %e, "listing this node's addresses");
            return None;
        }
    };
    addresses
        .filter(|a| {
            a.address
                .as_ref()
                .and_then(|s| s.as_sockaddr_in())
                .is_some_and(|s| s.ip() == address)
        })
        .map(|a| a.interface_name)
        .next()
}

/// The kernel's announcements of link changes (a device created, deleted,
/// renamed, brought up or down), so that devices are followed when they
/// change rather than on the next tick.
pub struct LinkEvents {
    announcements: futures::stream::BoxStream<'static, ()>,
}

impl LinkEvents {
    /// Subscribes to the link group of rtnetlink in this netns; the
    /// connection runs on the current tokio runtime.
    pub fn subscribe() -> std::io::Result<Self> {
        let (connection, _, messages) =
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])?;
        tokio::spawn(connection);
        Ok(Self {
            announcements: messages.map(drop).boxed(),
        })
    }

    /// Waits for the next change, folding in those already announced. If
    /// the subscription ends, never returns: the tick still follows devices.
    pub async fn changed(&mut self) {
        if self.announcements.next().await.is_none() {
            warn!("the kernel's link announcements stopped; devices are followed on the tick");
            std::future::pending::<()>().await;
        }
        while let Some(Some(())) = self.announcements.next().now_or_never() {}
    }
}
