//! The Liqo v1 lab (`cargo xtask lab up --liqo-v1-peer b`): cluster b's
//! gateway runs the way Liqo v1.2 runs one when the kernel has no
//! WireGuard, and cluster a serves it with Isthmus from Liqo v1's objects
//! (docs/design.md#liqo-v1-peers). From liqotech/liqo at v1.2.0:
//! - wireguard-go on the tunnel device, MTU 1340, the peer's key with
//!   `AllowedIPs 0.0.0.0/0` (`pkg/gateway/tunnel/wireguard/device.go:33-60`):
//!   by default the server side, listening on port 51840 with
//!   169.254.18.1/30 (`pkg/gateway/tunnel/netlink.go:27-29`,
//!   `forge/gatewayserver.go:35`); with `--isthmus-side server`, the client
//!   side, with a's endpoint and 169.254.18.2/30;
//! - the nftables its FirewallConfigurations render: `remap-podcidr` and
//!   `remap-externalcidr` (`remapping/cidr.go:95-230`: DNAT of our view of
//!   the peer back to its real network for what does not come from the
//!   uplink or the tunnel, SNAT of its real network to our view for what
//!   comes from the tunnel), and `mss-clamping`
//!   (`liqo-gw-mssclamp-firewallconfiguration.yaml`, value 0: the route's
//!   MTU);
//! - its conncheck, `PINGing` Isthmus' tunnel address.
//!
//! Liqo v1 routes the peer's real networks into the tunnel for what enters
//! its gateway pod from the cluster's nodes (`route/k8s.go:97-125`). Here
//! the gateway is also a node with pods of its own, whose addresses are
//! the peer's real ones, so the lab marks the connections that cross (by
//! our view of the peer before the DNAT, by the tunnel for those the peer
//! opens) and routes the marked ones into the tunnel instead.

pub mod settings;

use std::{fs, net::Ipv4Addr};

use anyhow::Result;

use super::{
    external_tunnel, keys,
    liqo_conncheck::{self, Api},
    liqo_v0_10_peer, node_objects, paths,
};
use crate::{
    cmd::{ip, run},
    liqo_v1::{MTU, PORT},
    topology::{Cluster, PEERINGS, Peering},
};

pub use settings::{ISTHMUS, LIQO, Side};
/// The mark of connections that cross the tunnel, and its routing table.
const CROSSING: u32 = 0x1818;
/// The uplink, Liqo's `DefaultInterfaceName` (the gateway pod's eth0).
const UPLINK: &str = "wan0";
/// The address an `IP` object of a exposes to b (`status.ip`), in a's
/// ExternalCIDR, and what it leads to (`spec.ip`): a-pod2.
pub const IP_EXPOSED: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 20);
/// `spec.ip` of that `IP`.
pub const IP_TARGET: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 133);
/// The `IP`'s file in a's nodes' object directories.
const IP_FILE: &str = "ip-a-pod2.yaml";

/// a's peering with b, from a's side and from b's.
fn peerings() -> (&'static Peering, &'static Peering) {
    let find = |local: &Cluster, remote: &Cluster| {
        PEERINGS
            .iter()
            .find(|p| p.local.name == local.name && p.remote.name == remote.name)
            .expect("a and b peer")
    };
    (find(ISTHMUS, LIQO), find(LIQO, ISTHMUS))
}

/// Gives a's nodes b as Liqo v1 writes it, in place of b's TunnelEndpoint
/// and NatMapping, with a on `side` of the tunnel.
pub fn write_objects(side: Side) -> Result<()> {
    let (a_to_b, _) = peerings();
    let objects = [
        a_to_b.configuration_yaml(),
        a_to_b.public_key_yaml(&keys::public_key(&LIQO.gw())?),
        a_to_b.isthmus_gateway_yaml(side),
    ]
    .join("---\n");
    for (node, _) in ISTHMUS.nodes() {
        let dir = paths::object_dir(&node);
        let _ = fs::remove_file(dir.join(format!("peer-{}.yaml", LIQO.name)));
        let _ = fs::remove_file(dir.join(a_to_b.nat_mapping_file()));
        node_objects::write_object(&node, &format!("liqo-v1-{}.yaml", LIQO.name), &objects)?;
    }
    Ok(())
}

/// Writes (`true`) or removes an `IP` of a's that exposes a-pod2 to b at
/// [`IP_EXPOSED`]; the agents pick it up live. Not there by default: the
/// gateway also gives a-pod2's own packets towards b that address, which
/// reachability row 2 does not expect.
pub fn expose_ip(on: bool) -> Result<()> {
    let ip = format!(
        "apiVersion: ipam.liqo.io/v1alpha1\nkind: IP\nmetadata:\n  name: a-pod2\n  namespace: default\nspec:\n  ip: {IP_TARGET}\nstatus:\n  ip: {IP_EXPOSED}\n  cidr: {}\n",
        ISTHMUS.external_cidr
    );
    for (node, _) in ISTHMUS.nodes() {
        match on {
            true => node_objects::write_object(&node, IP_FILE, &ip)?,
            false => {
                let _ = fs::remove_file(paths::object_dir(&node).join(IP_FILE));
            }
        }
    }
    Ok(())
}

/// Sets up b's gateway and worker as Liqo v1.2 would, on the side of the
/// tunnel Isthmus, on `side`, leaves it.
pub fn start(side: Side) -> Result<()> {
    let gw = LIQO.gw();
    let dev = external_tunnel::launch(external_tunnel::Implementation::WireguardGoBookworm, LIQO)?;
    // A server listens; a client has the server's endpoint, and no port
    // of its own (device.go:33-60).
    let listen = match side {
        Side::Client => format!("listen-port {PORT}"),
        Side::Server => String::new(),
    };
    let endpoint = match side {
        Side::Client => String::new(),
        Side::Server => format!("endpoint {}:{PORT}", ISTHMUS.wan_addr()),
    };
    let script = format!(
        "wg set {dev} private-key {key} {listen} peer {isthmus} {endpoint} allowed-ips 0.0.0.0/0",
        key = keys::key_file(&gw).display(),
        isthmus = keys::public_key(&ISTHMUS.gw())?,
    );
    run("ip", &["netns", "exec", &gw, "sh", "-c", &script])?;
    let (isthmus_addr, liqo_addr) = side.addresses();
    ip(
        &gw,
        &["addr", "add", &format!("{liqo_addr}/30"), "dev", &dev],
    )?;
    ip(&gw, &["link", "set", &dev, "mtu", &MTU.to_string(), "up"])?;
    install_nftables(&gw, &dev)?;
    route_crossing(&gw, &dev, isthmus_addr)?;
    liqo_v0_10_peer::route_worker(LIQO, "add")?;
    let peer = Api::V1 {
        peer: ISTHMUS,
        addr: isthmus_addr,
    };
    liqo_conncheck::start(LIQO, peer)
}

/// The tables Liqo's FirewallConfigurations render for peer a, and the
/// lab's marks of what crosses.
fn install_nftables(gw: &str, dev: &str) -> Result<()> {
    let (_, b_to_a) = peerings();
    let [pod_view, external_view] = b_to_a.remote_views();
    let remap = |table: &str, view: &ipnet::Ipv4Net, real: &str| {
        format!(
            "table ip {table} {{
  chain outgoing {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {view} iifname != \"{UPLINK}\" iifname != \"{dev}\" dnat ip prefix to {real}
  }}
  chain incoming {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname != \"{UPLINK}\" ip saddr {real} iifname \"{dev}\" snat ip prefix to {view}
  }}
}}
"
        )
    };
    let rules = [
        remap("remap-podcidr", &pod_view, ISTHMUS.pod_cidr),
        remap("remap-externalcidr", &external_view, ISTHMUS.external_cidr),
        format!(
            "table ip mss-clamping {{
  chain mss-clamping {{
    type filter hook forward priority 0; policy accept;
    oifname \"{dev}\" tcp flags syn tcp option maxseg size set rt mtu
  }}
}}
table ip isthmus-lab-crossing {{
  chain crossing {{
    type filter hook prerouting priority mangle; policy accept;
    ct state new iifname \"{dev}\" ct mark set {CROSSING:#x}
    ct state new ip daddr {{ {pod_view}, {external_view} }} ct mark set {CROSSING:#x}
    meta mark set ct mark
  }}
}}
"
        ),
    ]
    .concat();
    let file = paths::state("liqo-v1-nftables.nft");
    fs::write(&file, rules)?;
    run(
        "ip",
        &["netns", "exec", gw, "nft", "-f", &file.to_string_lossy()],
    )?;
    Ok(())
}

/// Sends the marked connections into the tunnel, to Isthmus at `peer`, but
/// what comes out of it to b's own pods.
fn route_crossing(gw: &str, dev: &str, peer: Ipv4Addr) -> Result<()> {
    let table = CROSSING.to_string();
    let peer = peer.to_string();
    ip(
        gw,
        &["rule", "add", "pref", "100", "iif", dev, "lookup", "main"],
    )?;
    ip(
        gw,
        &[
            "rule",
            "add",
            "pref",
            "101",
            "fwmark",
            &format!("{CROSSING:#x}"),
            "lookup",
            &table,
        ],
    )?;
    for real in [ISTHMUS.pod_cidr, ISTHMUS.external_cidr] {
        ip(
            gw,
            &[
                "route", "add", real, "via", &peer, "dev", dev, "table", &table,
            ],
        )?;
    }
    for conf in ["all", dev] {
        run(
            "ip",
            &[
                "netns",
                "exec",
                gw,
                "sysctl",
                "-qw",
                &format!("net.ipv4.conf.{conf}.rp_filter=0"),
            ],
        )?;
    }
    Ok(())
}
