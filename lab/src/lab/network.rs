//! The lab's namespaces and wires: the WAN, each cluster's LAN, its nodes
//! and pods, and the routes a CNI would add.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::Result;

use super::options::LabTunnel;
use crate::{
    cmd::{ip, sysctl},
    topology::{Cluster, PEERINGS, WAN_NS, WAN_ROUTER},
};

/// Creates netns `name` the way every lab namespace is: loopback up, loose
/// reverse-path filtering, no IPv6.
pub(crate) fn add_ns(name: &str) -> Result<()> {
    ip("", &["netns", "add", name])?;
    ip(name, &["link", "set", "lo", "up"])?;
    for key in [
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
    ] {
        sysctl(name, key, "0")?;
    }
    // The lab is IPv4: no router solicitations or MLD reports on its wires.
    for key in [
        "net.ipv6.conf.all.disable_ipv6",
        "net.ipv6.conf.default.disable_ipv6",
    ] {
        sysctl(name, key, "1")?;
    }
    Ok(())
}

/// Turns IPv6 on in netns `name`, for the devices made there from now on
/// and those it has: no duplicate address detection, which would hold
/// every address back for a second, and no router solicitations or
/// advertisements taken.
fn enable_ipv6(name: &str) -> Result<()> {
    for scope in ["all", "default"] {
        for (key, value) in [
            ("accept_dad", "0"),
            ("accept_ra", "0"),
            ("router_solicitations", "0"),
            ("disable_ipv6", "0"),
        ] {
            sysctl(name, &format!("net.ipv6.conf.{scope}.{key}"), value)?;
        }
    }
    Ok(())
}

/// Adds IPv6 address `addr`/`prefix_len` to `dev` in `ns`, usable at once.
fn add_addr6(ns: &str, addr: Ipv6Addr, prefix_len: u8, dev: &str) -> Result<()> {
    let addr = format!("{addr}/{prefix_len}");
    ip(ns, &["-6", "addr", "add", &addr, "dev", dev, "nodad"])?;
    Ok(())
}

/// A veth pair with one end in each netns, both up.
pub(crate) fn veth(ns_a: &str, name_a: &str, ns_b: &str, name_b: &str) -> Result<()> {
    ip(
        ns_a,
        &[
            "link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", ns_b,
        ],
    )?;
    ip(ns_a, &["link", "set", name_a, "up"])?;
    ip(ns_b, &["link", "set", name_b, "up"])?;
    Ok(())
}

fn bridge(ns: &str) -> Result<()> {
    // A bridge takes the lowest MAC of its ports unless given one, so
    // `--ha` adding a port would change it under the neighbours' caches
    // (the API server's and the router's address unreachable for ~30 s).
    let mac = bridge_mac(ns);
    ip(
        ns,
        &["link", "add", "br0", "address", &mac, "type", "bridge"],
    )?;
    ip(ns, &["link", "set", "br0", "up"])?;
    // Where br_netfilter is loaded, it would run iptables on bridged frames:
    // the lab's switches are plain switches.
    for table in ["iptables", "ip6tables", "arptables"] {
        let key = format!("net.bridge.bridge-nf-call-{table}");
        if std::path::Path::new(&format!("/proc/sys/{}", key.replace('.', "/"))).exists() {
            sysctl(ns, &key, "0")?;
        }
    }
    Ok(())
}

/// A locally administered MAC of its own for `ns`'s bridge.
fn bridge_mac(ns: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ns.hash(&mut hasher);
    let b = hasher.finish().to_be_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4]
    )
}

pub(super) fn build_wan() -> Result<()> {
    add_ns(WAN_NS)?;
    bridge(WAN_NS)?;
    ip(
        WAN_NS,
        &["addr", "add", &format!("{WAN_ROUTER}/24"), "dev", "br0"],
    )?;
    Ok(())
}

pub(super) fn build_cluster(c: &Cluster, dual_stack: bool) -> Result<()> {
    let (gw, node, lan) = (c.gw(), c.node(), c.lan());
    for ns in [&gw, &node, &lan] {
        add_ns(ns)?;
        if dual_stack {
            enable_ipv6(ns)?;
        }
    }
    for ns in [&gw, &node] {
        sysctl(ns, "net.ipv4.ip_forward", "1")?;
        if dual_stack {
            sysctl(ns, "net.ipv6.conf.all.forwarding", "1")?;
        }
    }
    bridge(&lan)?;

    // Uplink of the gateway on the WAN bridge.
    veth(&gw, "wan0", WAN_NS, &gw)?;
    ip(WAN_NS, &["link", "set", &gw, "master", "br0"])?;
    ip(
        &gw,
        &[
            "addr",
            "add",
            &format!("{}/24", c.wan_addr()),
            "dev",
            "wan0",
        ],
    )?;
    ip(
        &gw,
        &["route", "add", "default", "via", WAN_ROUTER, "dev", "wan0"],
    )?;

    // Both nodes on the LAN bridge.
    for (ns, addr, port) in [(&gw, c.lan_gw(), "gw"), (&node, c.lan_node(), "node")] {
        veth(ns, "lan0", &lan, port)?;
        ip(&lan, &["link", "set", port, "master", "br0"])?;
        ip(ns, &["addr", "add", &format!("{addr}/24"), "dev", "lan0"])?;
    }

    // Pods: pod1 on the worker, pod2 on the gateway.
    add_pod(c, 1, &node, dual_stack)?;
    add_pod(c, 2, &gw, dual_stack)?;
    route_pod_halves(c)?;
    if dual_stack {
        address_cluster6(c)?;
    }
    Ok(())
}

/// The dual-stack lab's IPv6 addresses and routes of cluster `c`
/// (docs/design.md#dual-stack), beside the IPv4 ones: the uplink, the
/// LAN, the pods and the CNI's routes between the PodCIDR's halves.
fn address_cluster6(c: &Cluster) -> Result<()> {
    let (gw, node) = (c.gw(), c.node());
    add_addr6(&gw, c.wan_addr6(), 64, "wan0")?;
    add_addr6(&gw, c.lan_gw6(), 64, "lan0")?;
    add_addr6(&node, c.lan_node6(), 64, "lan0")?;
    for (pod, host) in [(1, &node), (2, &gw)] {
        wire_pod6(&c.pod(pod), host, &format!("pod{pod}"), c.pod_addr6(pod))?;
    }
    for (host, other_half, via) in [
        (&node, c.pod_half6(2), c.lan_gw6()),
        (&gw, c.pod_half6(1), c.lan_node6()),
    ] {
        let (half, via) = (other_half.to_string(), via.to_string());
        ip(host, &["-6", "route", "replace", &half, "via", &via])?;
    }
    Ok(())
}

/// The CNI stand-in's routes: each node routes the other's half of the
/// PodCIDR over the LAN. Idempotent, so that a node whose LAN link went
/// down (and took these routes with it) gets them back.
pub(crate) fn route_pod_halves(c: &Cluster) -> Result<()> {
    for (host, other_half, via) in [
        (c.node(), c.pod_half(2), c.lan_gw()),
        (c.gw(), c.pod_half(1), c.lan_node()),
    ] {
        ip(
            &host,
            &[
                "route",
                "replace",
                &other_half.to_string(),
                "via",
                &via.to_string(),
            ],
        )?;
    }
    Ok(())
}

/// A pod netns wired to its node like a routed CNI: a /32 address, a
/// link-local gateway on the node's end, and a host route back.
fn add_pod(c: &Cluster, i: u8, host: &str, dual_stack: bool) -> Result<()> {
    let pod = c.pod(i);
    add_ns(&pod)?;
    if dual_stack {
        enable_ipv6(&pod)?;
    }
    wire_pod(&pod, host, &format!("pod{i}"), c.pod_addr(i))
}

/// Every pod's IPv6 next hop, as Calico gives it: the node's end of the
/// pod's veth answers for it.
pub const POD_GATEWAY6: &str = "fe80::1";

/// Gives the pod `pod`, wired to `host` through `host_end`, its IPv6
/// address `addr` as [`wire_pod`] gives its IPv4 one: a /128, a
/// link-local gateway on the node's end, and a host route back.
fn wire_pod6(pod: &str, host: &str, host_end: &str, addr: Ipv6Addr) -> Result<()> {
    add_addr6(pod, addr, 128, "eth0")?;
    let gateway: Ipv6Addr = POD_GATEWAY6.parse().expect("an IPv6 address");
    add_addr6(host, gateway, 64, host_end)?;
    ip(
        pod,
        &[
            "-6",
            "route",
            "add",
            "default",
            "via",
            POD_GATEWAY6,
            "dev",
            "eth0",
        ],
    )?;
    ip(
        host,
        &[
            "-6",
            "route",
            "add",
            &format!("{addr}/128"),
            "dev",
            host_end,
        ],
    )?;
    Ok(())
}

/// Every pod's next hop, as Calico gives it: the node's end of the pod's
/// veth answers for it.
pub const POD_GATEWAY: &str = "169.254.1.1";

/// Wires the existing netns `pod` to node `host` as a pod with address
/// `addr`, through a veth whose node end is `host_end`.
pub fn wire_pod(pod: &str, host: &str, host_end: &str, addr: Ipv4Addr) -> Result<()> {
    veth(pod, "eth0", host, host_end)?;
    let gateway = POD_GATEWAY;
    ip(pod, &["addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
    ip(
        host,
        &["addr", "add", &format!("{gateway}/32"), "dev", host_end],
    )?;
    ip(
        pod,
        &["route", "add", gateway, "dev", "eth0", "scope", "link"],
    )?;
    ip(
        pod,
        &["route", "add", "default", "via", gateway, "dev", "eth0"],
    )?;
    ip(
        host,
        &["route", "add", &format!("{addr}/32"), "dev", host_end],
    )?;
    Ok(())
}

/// Without a tunnel, gateways route peers' networks over the WAN in clear,
/// those of both families in the dual-stack lab; with one, the gateway's
/// agent (or wireguard-go's setup) routes them into it. Workers have no
/// route to peers: the overlay steers their pods' traffic from the kernel.
pub(super) fn route_peers(tunnel: LabTunnel, dual_stack: bool) -> Result<()> {
    if tunnel != LabTunnel::None {
        return Ok(());
    }
    for p in &PEERINGS {
        let gw = p.local.gw();
        for net in p.remote_views() {
            let via = p.remote.wan_addr().to_string();
            ip(
                &gw,
                &["route", "add", &net.to_string(), "via", &via, "dev", "wan0"],
            )?;
        }
        if !dual_stack {
            continue;
        }
        for net in p.remote_views6() {
            let via = p.remote.wan_addr6().to_string();
            let net = net.to_string();
            ip(
                &gw,
                &["-6", "route", "add", &net, "via", &via, "dev", "wan0"],
            )?;
        }
    }
    Ok(())
}
