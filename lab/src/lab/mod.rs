//! Building and removing the reference lab (docs/design.md#the-reference-lab), and managing the
//! agents that run in it.
//!
//! Everything the lab makes is named: the namespaces of `topology`, the
//! state directory [`STATE_DIR`] and its own bpffs mount. `down` removes all
//! of it, by name, whatever state a crash left. No lab address or route is
//! ever added to the root namespace, and no lab namespace is linked to it.

pub mod clear_tunnel;
pub mod containers;
pub mod external_tunnel;
pub mod ha;
pub mod kube_proxy;
pub mod liqo_conncheck;
pub mod liqo_v0_10_peer;
pub mod liqo_v1_api;
pub mod liqo_v1_peer;
pub mod monitor;
pub mod segregation;

mod agents;
mod keys;
mod network;
mod node_objects;
mod options;
mod paths;
mod process;
mod scrape;
mod setup;
mod switch;

use std::{fs, path::Path};

use anyhow::{Context, Result, bail};

use agents::{is_lab_agent, start_agent_in, stray_agents};
use network::{build_cluster, build_wan, route_peers};
use node_objects::write_objects;
use switch::start_other_tunnel;

pub use agents::{
    GUARD_OPTION, POD_DEVS, RESOLVE_INTERVAL, agent_args, agent_pid, clean_up_agent, log_tail,
    restart_agent, spawn_agent, spawn_agent_binary, spawn_container, start_agent,
    start_agent_binary, start_gateway_in, start_tunnelless_gateway, stop_agent, wait_ready,
    wait_ready_in,
};
pub use keys::{key_file, public_key};
pub use network::{POD_GATEWAY, POD_GATEWAY6, wire_pod};
pub(crate) use network::{add_ns, veth};
pub use node_objects::{NODES_FILE, write_nat_mapping, write_object};
pub use options::LabTunnel;
pub(crate) use paths::state;
pub use paths::{
    STATE_DIR, agent_binary, bpffs, bpffs_root, hosts_file, log_file, object_dir, pins,
};
pub use process::{alive, end_pid, stop_pid};
pub(crate) use process::{running_with, runs_with};
pub use scrape::{http_get, http_get_at, metric, metric_sum, pinned_hash, scrape};
pub use setup::{LiqoPeer, Setup};
pub use switch::{set_forward_past_netfilter, set_gateway_tunnel, set_guard};

use crate::{
    cmd::{ip, run},
    netns,
    topology::{CLUSTERS, GW2, POD3, WAN_NS},
};

/// Prefix of the namespaces tests build for themselves, beside the lab.
pub const TEST_NS_PREFIX: &str = "ist-t-";

/// Every netns name the lab may create, including ones of later issues and
/// the tests' own (`ist-t-*`), so that `down` removes whatever any run left.
fn all_namespaces() -> Vec<String> {
    let mut names = vec![
        WAN_NS.to_owned(),
        monitor::MON_NS.to_owned(),
        GW2.to_owned(),
        POD3.to_owned(),
    ];
    if let Ok(entries) = fs::read_dir("/run/netns") {
        names.extend(
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(TEST_NS_PREFIX)),
        );
    }
    for c in ["a", "b", "c"] {
        for suffix in ["gw", "node", "lan", "pod1", "pod2"] {
            names.push(format!("{c}-{suffix}"));
        }
    }
    names
}

/// Whether the lab is up: its namespaces and state directory exist.
pub fn is_up() -> bool {
    netns::exists(WAN_NS) && Path::new(STATE_DIR).is_dir()
}

/// Builds the lab as `setup` says, from nothing, and starts every agent;
/// returns once every agent reports ready. A combination the lab cannot
/// build is refused before anything starts.
pub fn up(setup: &Setup) -> Result<()> {
    setup.check()?;
    let agent = agent_binary();
    if !agent.exists() {
        bail!(
            "{} is missing: run `cargo xtask build` first",
            agent.display()
        );
    }
    down()?;
    if setup.containers {
        println!("lab: image {}", crate::image::build()?);
    }
    for sub in ["pids", "logs", "objects", "bpffs", "keys"] {
        fs::create_dir_all(state(sub))?;
    }
    // The second gateway and segregation are switched on in the lab
    // built without them, as their tests switch them.
    let base = Setup {
        ha: false,
        segregation: false,
        ..setup.clone()
    };
    base.record()?;
    build_network(&base)?;
    start_liqo_peer(base.liqo)?;
    if base.liqo_api_v1 {
        println!(
            "lab: every cluster serves Liqo v1's objects, from an API server stand-in of its own"
        );
        liqo_v1_api::start()?;
    }
    start_isthmus_agents(&base)?;
    if base.liqo.is_none() {
        println!("lab: starting Prometheus in {}", monitor::MON_NS);
        monitor::up()?;
    }
    if setup.segregation {
        segregation::set(true)?;
        println!(
            "lab: {} segregates its peers ({})",
            segregation::settings::CLUSTER.gw(),
            segregation::settings::MODE
        );
    }
    if setup.ha {
        ha::set(true)?;
        println!(
            "lab: cluster a has two gateways ({}); {} is on {}",
            ha::gateways().join(", "),
            crate::topology::A.wan_addr(),
            ha::endpoint_holder().unwrap_or_default()
        );
    }
    println!("lab: up; every Isthmus agent is ready");
    Ok(())
}

/// The lab's bpffs, namespaces, links, routes and objects, and what
/// carries traffic between its gateways besides the agents.
fn build_network(setup: &Setup) -> Result<()> {
    let tunnel = setup.tunnel;
    run(
        "mount",
        &["-t", "bpf", "isthmus-lab", &bpffs_root().to_string_lossy()],
    )?;
    println!("lab: building namespaces and links");
    build_wan()?;
    if setup.dual_stack {
        println!("lab: dual stack: every network has its IPv6 network too");
    }
    for cluster in CLUSTERS {
        build_cluster(cluster, setup.dual_stack)?;
    }
    route_peers(tunnel, setup.dual_stack)?;
    write_objects(tunnel, setup.dual_stack)?;
    start_other_tunnel(tunnel)
}

/// Runs the cluster `liqo` names as Liqo runs it.
fn start_liqo_peer(liqo: Option<LiqoPeer>) -> Result<()> {
    match liqo {
        Some(LiqoPeer::V0_10(cluster)) => {
            println!(
                "lab: cluster {} runs as Liqo v0.10 (wireguard-go, iptables, conncheck)",
                cluster.name
            );
            liqo_v0_10_peer::start(cluster)
        }
        Some(LiqoPeer::V1(side)) => {
            println!(
                "lab: cluster {} runs as Liqo v1.2 (wireguard-go, nftables, conncheck); {} serves it from Liqo v1's objects, as the tunnel's {side:?}",
                liqo_v1_peer::LIQO.name,
                liqo_v1_peer::ISTHMUS.name
            );
            liqo_v1_peer::write_objects(side)?;
            liqo_v1_peer::start(side)
        }
        None => Ok(()),
    }
}

/// Starts the agents of every cluster that runs Isthmus, then waits until
/// each is ready.
fn start_isthmus_agents(setup: &Setup) -> Result<()> {
    let nodes: Vec<String> = CLUSTERS
        .iter()
        .filter(|c| setup.runs_isthmus(c))
        .flat_map(|c| c.nodes().map(|(node, _)| node))
        .collect();
    println!("lab: starting agents");
    for node in &nodes {
        start_agent_in(node, setup)?;
    }
    nodes.iter().try_for_each(|node| wait_ready(node))
}

/// Removes everything the lab created. Succeeds when nothing is up.
pub fn down() -> Result<()> {
    let mut pids: Vec<u32> = fs::read_dir(state("pids"))
        .into_iter()
        .flatten()
        .filter_map(|e| fs::read_to_string(e.ok()?.path()).ok()?.trim().parse().ok())
        .filter(|pid| is_lab_agent(*pid))
        .collect();
    pids.extend(stray_agents());
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        stop_pid(pid)?;
    }
    containers::remove_all()?;
    liqo_conncheck::stop()?;
    ha::stop_control()?;
    liqo_v1_api::stop()?;
    external_tunnel::stop_all()?;
    for gw in CLUSTERS.iter().map(|c| c.gw()).chain([GW2.to_owned()]) {
        let _ = fs::remove_dir_all(hosts_file(&gw).parent().expect("a directory"));
    }
    monitor::down()?;
    // Deleting a netns deletes its devices, and with them every TCX link
    // and clsact filter on them.
    for name in all_namespaces() {
        if netns::exists(&name) {
            ip("", &["netns", "del", &name])?;
        }
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    let bpf = bpffs_root();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*bpf.to_string_lossy()))
    {
        // Unmounting the lab's own bpffs instance drops every pin in it.
        run("umount", &[&bpf.to_string_lossy()])?;
    }
    if Path::new(STATE_DIR).exists() {
        fs::remove_dir_all(STATE_DIR).with_context(|| format!("removing {STATE_DIR}"))?;
    }
    Ok(())
}
