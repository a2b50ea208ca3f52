//! `cargo xtask bench overlay`: from a worker pod to a remote worker pod
//! (a-pod1 on a-node to b-pod1 on b-node), through the Isthmus overlay and
//! through the same path built the Liqo way: a VXLAN device on every node,
//! an `ip rule` to table 18952, and routes there via the other node.
//!
//! The gateways route between clusters in clear, with Isthmus' NAT on
//! their uplinks, so the overlay's own cost is what differs; a tunnel would
//! cost both setups alike and hide it. Pods get the MTU a VXLAN CNI gives
//! them (1450), so neither setup fragments.

use std::time::Duration;

use anyhow::Result;
use aya::maps::{LpmTrie, Map, MapData};
use isthmus_common::{
    names::{MAP_NODES, PROG_STEER},
    pins::Direction,
    wire::Be32,
};
use isthmus_lab::{
    cmd::{ip, run},
    lab::{self, LabTunnel},
    topology::{A, B, Cluster, OVERLAY_VNI},
    wait::poll,
};

use super::{
    ROUNDS, iperf,
    packets::{Flow, measure},
    stats::{median, ratio_line},
    write_section,
};

/// Liqo's routing table, which is also its VXLAN's VNI.
const LIQO_TABLE: &str = "18952";
/// Liqo's VXLAN device and port.
const LIQO_DEV: &str = "liqo.vxlan";
const LIQO_PORT: &str = "4789";
/// The MTU a VXLAN CNI gives pods on a 1500-byte underlay.
const POD_MTU: &str = "1450";
/// How the gateway's uplink is named: traffic from the other cluster.
const UPLINK: &str = "wan0";

pub fn run_overlay() -> Result<()> {
    lab::up(&lab::Setup::with_tunnel(LabTunnel::None))?;
    let result = overlay();
    lab::down()?;
    result
}

/// Which overlay carries worker traffic.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Isthmus,
    Liqo,
}

/// What one setup achieved, one figure per round.
#[derive(Default)]
struct Samples {
    pps: Vec<f64>,
    gbps: Vec<f64>,
}

/// b-pod1 as a sees it.
const B_POD1_AT_A: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 0, 5);

fn overlay() -> Result<()> {
    for pod in [A.pod(1), B.pod(1)] {
        ip(&pod, &["link", "set", "eth0", "mtu", POD_MTU])?;
    }
    let flow = Flow {
        client: A.pod(1),
        next_hop: (A.node(), "pod1"),
        server: B.pod(1),
        src: A.pod_addr(1).into(),
        dst: B_POD1_AT_A.into(),
        answer_to: None,
    };
    let mut samples = [
        (Setup::Isthmus, Samples::default()),
        (Setup::Liqo, Samples::default()),
    ];
    for round in 1..=ROUNDS {
        for (setup, got) in &mut samples {
            println!("bench: round {round}/{ROUNDS}, overlay {setup:?}");
            if *setup == Setup::Liqo {
                liqo(true)?;
            }
            let measured = measure(&flow).and_then(|pps| {
                let gbps = iperf(&flow.client, &flow.server, B_POD1_AT_A, 1)?;
                println!("bench:   {gbps:.2} Gbit/s");
                Ok((pps, gbps))
            });
            if *setup == Setup::Liqo {
                liqo(false)?;
            }
            let (pps, gbps) = measured?;
            got.pps.push(median(&pps));
            got.gbps.push(gbps);
        }
    }
    let (ours, theirs) = (&samples[0].1, &samples[1].1);
    let mut lines = ratio_line(
        "overlay-pps-worker-to-remote-worker-vs-liqo-vxlan",
        &ours.pps,
        &theirs.pps,
        2,
    );
    lines += &ratio_line(
        "overlay-tcp-gbps-worker-to-remote-worker-vs-liqo-vxlan",
        &ours.gbps,
        &theirs.gbps,
        2,
    );
    write_section(
        "overlay",
        &format!(
            "## Overlay: a-pod1 on a-node to b-pod1 on b-node

`cargo xtask bench overlay` brings the lab up with the gateways routing
between clusters in clear (Isthmus' NAT on `wan0`, no tunnel, which would
cost both setups alike), and the two pods' MTU at {POD_MTU}, as a VXLAN CNI
sets it. It then alternates {ROUNDS} rounds of two setups:

- **Isthmus**: the workers' `overlay_steer` and the gateways' ingress NAT
  set the tunnel key and redirect into `isthmus.vx`; every node's
  `overlay_decap` takes the packets in on `lan0` and forwards them by the
  FIB (into the pod's netns on b-node; the lab runs the agents with
  `--forward-past-netfilter`); no route, rule or FDB entry. TCP's
  GSO packets are taken in by `isthmus.vx` instead.
- **Liqo way**: the Isthmus overlay is off: no Node objects, and the
  steering program detached. Each node has `{LIQO_DEV}` (VNI
  {OVERLAY_VNI}, port {LIQO_PORT}), with an address and an all-zero FDB
  entry to the other node. The worker has an `ip rule` per remote network
  to table {LIQO_TABLE}, which routes it via the gateway's VXLAN address.
  The gateway has an `ip rule iif {UPLINK}` to table {LIQO_TABLE}, which
  routes the worker's pods via the worker's VXLAN address.

pps: trafgen sends 64-byte UDP frames from a-pod1 to 10.0.0.5 (b-pod1 as a
sees it) on one CPU, and b-pod1's `eth0` counts what arrives (each
round's median of its windows). Throughput: iperf3, one TCP stream, 8 s.
Each RESULT line gives the median over rounds of the two setups' ratio in
the same round, with the least and greatest of those ratios.

```
{lines}```
"
        ),
    )
}

/// Builds (or removes) the Liqo-way overlay in clusters a and b, and turns
/// the Isthmus overlay off (or back on).
fn liqo(on: bool) -> Result<()> {
    for cluster in [&A, &B] {
        if on {
            isthmus_overlay(cluster, false)?;
            liqo_overlay(cluster)?;
        } else {
            remove_liqo_overlay(cluster)?;
            isthmus_overlay(cluster, true)?;
        }
    }
    Ok(())
}

/// The VXLAN address of a node: 240.1.N.1 on the gateway, .2 on the worker.
fn vxlan_addr(cluster: &Cluster, gateway: bool) -> String {
    format!("240.1.{}.{}", cluster.index, if gateway { 1 } else { 2 })
}

fn liqo_overlay(c: &Cluster) -> Result<()> {
    for (node, lan, other_lan, gateway) in [
        (c.gw(), c.lan_gw(), c.lan_node(), true),
        (c.node(), c.lan_node(), c.lan_gw(), false),
    ] {
        let (lan, other_lan) = (lan.to_string(), other_lan.to_string());
        ip(
            &node,
            &[
                "link", "add", LIQO_DEV, "type", "vxlan", "id", LIQO_TABLE, "dstport", LIQO_PORT,
                "local", &lan, "dev", "lan0",
            ],
        )?;
        ip(
            &node,
            &[
                "addr",
                "add",
                &format!("{}/24", vxlan_addr(c, gateway)),
                "dev",
                LIQO_DEV,
            ],
        )?;
        ip(&node, &["link", "set", LIQO_DEV, "up"])?;
        run(
            "ip",
            &[
                "netns",
                "exec",
                &node,
                "bridge",
                "fdb",
                "append",
                "00:00:00:00:00:00",
                "dev",
                LIQO_DEV,
                "dst",
                &other_lan,
            ],
        )?;
    }
    let via_gw = vxlan_addr(c, true);
    for p in c.peerings() {
        for net in p.remote_views() {
            let net = net.to_string();
            ip(
                &c.node(),
                &["rule", "add", "to", &net, "lookup", LIQO_TABLE],
            )?;
            ip(
                &c.node(),
                &["route", "add", &net, "via", &via_gw, "table", LIQO_TABLE],
            )?;
        }
    }
    ip(
        &c.gw(),
        &["rule", "add", "iif", UPLINK, "lookup", LIQO_TABLE],
    )?;
    ip(
        &c.gw(),
        &[
            "route",
            "add",
            &c.pod_half(1).to_string(),
            "via",
            &vxlan_addr(c, false),
            "table",
            LIQO_TABLE,
        ],
    )?;
    Ok(())
}

fn remove_liqo_overlay(c: &Cluster) -> Result<()> {
    for node in [c.gw(), c.node()] {
        while ip(&node, &["rule", "del", "lookup", LIQO_TABLE]).is_ok() {}
        ip(&node, &["route", "flush", "table", LIQO_TABLE])?;
        ip(&node, &["link", "del", LIQO_DEV])?;
    }
    Ok(())
}

/// Turns the Isthmus overlay of cluster `c` off: no Node objects, so the
/// gateway sends nothing on, and the worker's steering program detached by
/// unpinning its link; or back on, restarting the worker's agent to attach
/// it again.
fn isthmus_overlay(c: &Cluster, on: bool) -> Result<()> {
    let nodes = [c.gw(), c.node()];
    if on {
        let dual_stack = lab::Setup::current()?.dual_stack;
        for node in &nodes {
            lab::write_object(node, lab::NODES_FILE, &c.nodes_yaml(dual_stack))?;
        }
        lab::restart_agent(&c.node())?;
    } else {
        for node in &nodes {
            std::fs::remove_file(lab::object_dir(node).join(lab::NODES_FILE))?;
        }
        let link = lab::pins(&c.node()).link("pod1", Direction::Ingress, PROG_STEER);
        std::fs::remove_file(&link)?;
    }
    // The gateway sends tunnel traffic on to the worker while it knows it.
    let want = usize::from(on);
    poll(
        Duration::from_secs(10),
        Duration::from_millis(20),
        &format!("{}'s node table holds {want} entries", c.gw()),
        || (node_entries(&c.gw()).ok()? == want).then_some(()),
    )
}

/// Entries of `node`'s pinned node table.
fn node_entries(node: &str) -> Result<usize> {
    let path = lab::pins(node).map(MAP_NODES);
    let trie: LpmTrie<MapData, Be32, Be32> =
        Map::from_map_data(MapData::from_pin(path)?)?.try_into()?;
    Ok(trie.keys().count())
}
