//! The netlink side of the routes: the connection, the dumps of what is
//! ours, the removal of it all, and the readers of the messages' fields.

use std::net::{Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_route::{
    address::{AddressAttribute, AddressMessage},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol},
    rule::{RuleAttribute, RuleMessage},
};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder, new_connection};

use super::{ROUTE_PROTOCOL, RouteError, TUNNEL_TABLE};
use crate::kernel::link::link_by_name;

/// A netlink connection, served on a task of its own.
pub(super) fn connect() -> Result<Handle, RouteError> {
    let (connection, handle, _) = new_connection()?;
    tokio::spawn(connection);
    Ok(handle)
}

/// Removes every route and rule of ours, blackholes included. Returns
/// what it removed, for the operator.
pub async fn cleanup() -> Result<Vec<String>, RouteError> {
    let handle = connect()?;
    let mut removed = Vec::new();
    let routes = ours(&handle).await?;
    for route in &routes {
        let what = format!("deleting route {:?}", destination(route));
        handle
            .route()
            .del(route.clone())
            .execute()
            .await
            .map_err(|source| RouteError::Request { what, source })?;
    }
    if !routes.is_empty() {
        removed.push(format!(
            "{} route(s) of protocol {ROUTE_PROTOCOL}",
            routes.len()
        ));
    }
    removed.extend(remove_rules(&handle).await?);
    Ok(removed)
}

/// Deletes the persistent TUN device `dev` (and with it every route into
/// it); returns whether it existed.
pub async fn delete_device(dev: &str) -> Result<bool, RouteError> {
    let handle = connect()?;
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

/// Every route of both families, of every table: without strict
/// checking, the kernel ignores the table of a dump request.
pub(super) async fn dump(handle: &Handle) -> Result<Vec<RouteMessage>, RouteError> {
    let mut routes = dump_one(handle, RouteMessageBuilder::<Ipv4Addr>::new().build()).await?;
    // A kernel without IPv6 has no IPv6 routes to list.
    let ipv6 = RouteMessageBuilder::<Ipv6Addr>::new().build();
    match dump_one(handle, ipv6).await {
        Ok(more) => routes.extend(more),
        Err(RouteError::Request {
            source: rtnetlink::Error::NetlinkError(e),
            ..
        }) if e.raw_code() == -libc::EAFNOSUPPORT => {}
        Err(e) => return Err(e),
    }
    Ok(routes)
}

/// Every route of the family `request` asks for.
async fn dump_one(handle: &Handle, request: RouteMessage) -> Result<Vec<RouteMessage>, RouteError> {
    handle
        .route()
        .get(request)
        .execute()
        .try_collect()
        .await
        .map_err(|source| RouteError::Request {
            what: "listing routes".into(),
            source,
        })
}

/// Every route carrying our protocol number.
pub(super) async fn ours(handle: &Handle) -> Result<Vec<RouteMessage>, RouteError> {
    let mut routes = dump(handle).await?;
    routes.retain(is_ours);
    Ok(routes)
}

pub(super) fn is_ours(route: &RouteMessage) -> bool {
    route.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL)
}

/// Removes the rules of older agents, which sent lookups to the tunnel's
/// table; returns what it removed.
pub(super) async fn remove_rules(handle: &Handle) -> Result<Vec<String>, RouteError> {
    let listed = |source| RouteError::Request {
        what: "listing rules".into(),
        source,
    };
    let rules: Vec<RuleMessage> = handle
        .rule()
        .get(IpVersion::V4)
        .execute()
        .try_collect()
        .await
        .map_err(listed)?;
    let mut removed = Vec::new();
    for rule in rules.into_iter().filter(looks_up_tunnel_table) {
        let what = match priority(&rule) {
            Some(priority) => format!("rule {priority} lookup {TUNNEL_TABLE}"),
            None => format!("rule lookup {TUNNEL_TABLE}"),
        };
        handle
            .rule()
            .del(rule)
            .execute()
            .await
            .map_err(|source| RouteError::Request {
                what: format!("deleting {what}"),
                source,
            })?;
        removed.push(what);
    }
    Ok(removed)
}

fn looks_up_tunnel_table(rule: &RuleMessage) -> bool {
    let table = rule.attributes.iter().find_map(|a| match a {
        RuleAttribute::Table(id) => Some(*id),
        _ => None,
    });
    table.unwrap_or(u32::from(rule.header.table)) == TUNNEL_TABLE
}

fn priority(rule: &RuleMessage) -> Option<u32> {
    rule.attributes.iter().find_map(|a| match a {
        RuleAttribute::Priority(p) => Some(*p),
        _ => None,
    })
}

/// The table a route is in: the attribute, which holds ids beyond 255,
/// or else the header's.
pub(super) fn table(route: &RouteMessage) -> u32 {
    route
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(id) => Some(*id),
            _ => None,
        })
        .unwrap_or(u32::from(route.header.table))
}

pub(super) fn destination(route: &RouteMessage) -> Option<IpNet> {
    let len = route.header.destination_prefix_length;
    route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(addr)) => {
            Ipv4Net::new(*addr, len).ok().map(IpNet::V4)
        }
        RouteAttribute::Destination(RouteAddress::Inet6(addr)) => {
            Ipv6Net::new(*addr, len).ok().map(IpNet::V6)
        }
        _ => None,
    })
}

pub(super) fn preferred_source(route: &RouteMessage) -> Option<Ipv4Addr> {
    route.attributes.iter().find_map(|a| match a {
        RouteAttribute::PrefSource(RouteAddress::Inet(addr)) => Some(*addr),
        _ => None,
    })
}

pub(super) fn out_of(route: &RouteMessage) -> Option<u32> {
    route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(index) => Some(*index),
        _ => None,
    })
}

/// The IPv4 address an address message gives the device.
pub(super) fn address_of(message: &AddressMessage) -> Option<Ipv4Addr> {
    message
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            AddressAttribute::Local(std::net::IpAddr::V4(addr)) => Some(*addr),
            _ => None,
        })
}
