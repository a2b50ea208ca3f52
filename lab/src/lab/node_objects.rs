//! What the lab writes for its agents to read: each node's objects
//! (TunnelEndpoints, NatMappings, its cluster's nodes) and each gateway's
//! hosts file.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::Result;

use super::{
    keys::public_key,
    options::LabTunnel,
    paths::{hosts_file, object_dir},
};
use crate::topology::{CLUSTERS, NAT_MAPPING, PEERINGS, Peering};

/// Writes every gateway's hosts file, resolving the endpoint names of its
/// TunnelEndpoints to the peers' uplink addresses: in the dual-stack lab,
/// to the IPv6 one where the peering's tunnel runs over IPv6.
fn write_hosts(dual_stack: bool) -> Result<()> {
    for cluster in CLUSTERS {
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for p in cluster.peerings() {
            if let Some(name) = p.endpoint_name {
                hosts.push_str(&format!("{} {name}\n", endpoint_addr(p, dual_stack)));
            }
        }
        let path = hosts_file(&cluster.gw());
        fs::create_dir_all(path.parent().expect("a directory"))?;
        fs::write(path, hosts)?;
    }
    Ok(())
}

/// The address `p`'s tunnel reaches the peer's gateway at.
fn endpoint_addr(p: &Peering, dual_stack: bool) -> IpAddr {
    match dual_stack && p.over_ipv6_wan() {
        true => p.remote.wan_addr6().into(),
        false => p.remote.wan_addr().into(),
    }
}

pub(super) fn write_objects(tunnel: LabTunnel, dual_stack: bool) -> Result<()> {
    write_hosts(dual_stack)?;
    for p in &PEERINGS {
        let key = match tunnel {
            LabTunnel::None => None,
            _ => Some(public_key(&p.remote.gw())?),
        };
        let yaml = match dual_stack {
            true => p
                .dual_stack_tunnel_endpoint(key.as_deref(), endpoint_addr(p, true))
                .to_string(),
            false => p.tunnel_endpoint_yaml(key.as_deref()),
        };
        for (node, _) in p.local.nodes() {
            let dir = object_dir(&node);
            fs::create_dir_all(&dir)?;
            fs::write(dir.join(format!("peer-{}.yaml", p.remote.name)), &yaml)?;
        }
    }
    for cluster in CLUSTERS {
        for (node, _) in cluster.nodes() {
            write_object(&node, NODES_FILE, &cluster.nodes_yaml(dual_stack))?;
        }
    }
    for p in &PEERINGS {
        if !NAT_MAPPING.is_for(p) {
            for (node, _) in p.local.nodes() {
                write_object(&node, &p.nat_mapping_file(), &p.nat_mapping_yaml(&[]))?;
            }
        }
    }
    match dual_stack {
        true => write_dual_stack_nat_mapping(),
        false => write_nat_mapping(&[NAT_MAPPING.entry()]),
    }
}

/// The nodes file in every node's object directory.
pub const NODES_FILE: &str = "nodes.yaml";

/// Writes the hub's NatMapping for its client with `entries` (endpoint,
/// externalIP) besides the conncheck's, on both of the hub's nodes; the
/// agents pick it up live. Every other peering's NatMapping holds only the
/// conncheck's entry, as Liqo's do.
pub fn write_nat_mapping(entries: &[(Ipv4Addr, Ipv4Addr)]) -> Result<()> {
    let yaml = NAT_MAPPING.yaml(entries);
    for (node, _) in NAT_MAPPING.hub.nodes() {
        write_object(&node, &NAT_MAPPING.file_name(), &yaml)?;
    }
    Ok(())
}

/// Writes the hub's NatMapping of the dual-stack lab: the lab's entry of
/// each family.
fn write_dual_stack_nat_mapping() -> Result<()> {
    let yaml = NAT_MAPPING.dual_stack_yaml(&[NAT_MAPPING.entry()], &[NAT_MAPPING.entry6()]);
    for (node, _) in NAT_MAPPING.hub.nodes() {
        write_object(&node, &NAT_MAPPING.file_name(), &yaml)?;
    }
    Ok(())
}

/// Puts `text` into `node`'s object directory as `name`. It is written
/// aside and renamed in, so the agent's watch never reads half a file.
pub fn write_object(node: &str, name: &str, text: &str) -> Result<()> {
    let dir = object_dir(node);
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, dir.join(name))?;
    Ok(())
}
