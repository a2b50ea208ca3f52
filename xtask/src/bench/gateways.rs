//! Isthmus on and off on the lab's gateways for the benchmarks that
//! compare it with a peer in turns, and the synthetic peers that load
//! its tables.

use std::{fs, time::Duration};

use anyhow::Result;
use aya::maps::{HashMap, MapData};
use isthmus_common::{
    nat::{MappingKey, PeerKey, PeerNat},
    wire::Be32,
};
use isthmus_lab::{
    lab,
    objects::TunnelEndpoint,
    topology::{A, B, Cluster, PEERINGS, Peering, synthetic_peer_views, synthetic_peer_views6},
    wait,
};

/// The gateways of the double NAT between a and b.
pub(super) fn nat_gateways() -> [String; 2] {
    [A.gw(), B.gw()]
}

/// Starts the agents of `nodes` that are not running.
pub(super) fn enable_isthmus(nodes: &[String]) -> Result<()> {
    for node in nodes {
        if lab::agent_pid(node).is_none() {
            lab::start_agent(node)?;
            lab::wait_ready(node)?;
        }
    }
    Ok(())
}

/// Waits until gateway `gw`'s agent reports each metric of `expected` at
/// its value, as `setup` needs: the agents read the node's rules once a
/// second. Its log says why not, when it does not.
pub(super) fn await_gauges(gw: &str, expected: &[(&str, f64)], setup: &str) -> Result<()> {
    let what = format!("{gw}'s agent reports {expected:?}, as the setup '{setup}' needs");
    wait::poll(
        Duration::from_secs(5),
        Duration::from_millis(50),
        &what,
        || {
            (expected.iter())
                .all(|(metric, value)| lab::metric(gw, metric).ok() == Some(*value))
                .then_some(())
        },
    )
}

/// Stops the agents of `nodes` and removes their programs: no Isthmus
/// there.
pub(super) fn disable_isthmus(nodes: &[String]) -> Result<()> {
    for node in nodes {
        if lab::agent_pid(node).is_none() && !lab::bpffs(node).exists() {
            continue;
        }
        lab::stop_agent(node)?;
        lab::clean_up_agent(node)?;
    }
    Ok(())
}

/// The peers of `local` in a run with `count` peers: `count - 1` synthetic
/// ones (10.128.i.0/24 and 10.129.i.0/24; in the dual-stack lab, also
/// `fd00:128:i::/64` and `fd00:129:i::/64`), then the real one, last.
pub(super) fn synthetic_peers(local: &Cluster, count: usize) -> Result<Vec<String>> {
    let dual_stack = lab::Setup::current()?.dual_stack;
    Ok((1..count)
        .map(|i| {
            let [local_pod, local_ext, remote_pod, remote_ext] =
                synthetic_peer_views(i).map(|net| net.to_string());
            let tep =
                TunnelEndpoint::new(&format!("tep-bench-{i}"), &format!("liqo-tenant-bench-{i}"))
                    .local([local.pod_cidr, &local_pod, local.external_cidr, &local_ext])
                    .remote(["10.50.0.0/24", &remote_pod, "192.168.50.0/24", &remote_ext])
                    .endpoint("203.0.113.200")
                    .port(5871)
                    .public_key(&synthetic_key(i));
            match dual_stack {
                true => with_ipv6(tep, local, i).to_string(),
                false => tep.to_string(),
            }
        })
        .collect())
}

/// `tep`, synthetic peer `i` of `local`, with its IPv6 networks.
fn with_ipv6(tep: TunnelEndpoint, local: &Cluster, i: usize) -> TunnelEndpoint {
    let [local_pod, local_ext, remote_pod, remote_ext] =
        synthetic_peer_views6(i).map(|net| net.to_string());
    tep.ipv6(
        [
            local.pod_cidr6,
            &local_pod,
            local.external_cidr6,
            &local_ext,
        ],
        [
            "fd00:50::/64",
            &remote_pod,
            "fd00:192:168:50::/64",
            &remote_ext,
        ],
    )
}

/// A distinct public key for synthetic peer `i`: any 32 bytes are one.
pub(super) fn synthetic_key(i: usize) -> String {
    let mut key = [0x5au8; 32];
    key[..8].copy_from_slice(&(i as u64).to_le_bytes());
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key)
}

/// Writes the synthetic peers into both gateways' directories and waits
/// until both agents have programmed all of them.
pub(super) fn set_isthmus_peers(count: usize) -> Result<()> {
    for p in gateway_peerings() {
        let dir = lab::object_dir(&p.local.gw());
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bench-"))
            {
                fs::remove_file(path)?;
            }
        }
        for (i, yaml) in synthetic_peers(p.local, count)?.iter().enumerate() {
            fs::write(dir.join(format!("bench-{i}.yaml")), yaml)?;
        }
    }
    for p in gateway_peerings() {
        let gw = p.local.gw();
        // The synthetic peers replace the measured one's count, not the others'.
        let others = PEERINGS
            .iter()
            .filter(|q| q.local.name == p.local.name)
            .count()
            - 1;
        wait::try_poll(
            Duration::from_secs(30),
            Duration::from_millis(20),
            &format!("{gw} programs {count} peers"),
            || Ok((peers_programmed(&gw)? == (count + others) as f64).then_some(())),
        )?;
    }
    Ok(())
}

/// The a–b peerings, both sides: the double NAT the NAT bench measures.
fn gateway_peerings() -> impl Iterator<Item = &'static Peering> {
    PEERINGS.iter().filter(|p| {
        [A.name, B.name].contains(&p.local.name) && [A.name, B.name].contains(&p.remote.name)
    })
}

pub(super) fn peers_programmed(gw: &str) -> Result<f64> {
    lab::metric(gw, "isthmus_peers ")
}

/// The peer ID the kernel's peer table holds for network `view`.
pub(super) fn peer_id(
    peers: &HashMap<MapData, PeerKey, PeerNat>,
    view: ipnet::Ipv4Net,
) -> Option<u32> {
    let key = PeerKey::of(Be32::from(view.network()), view.prefix_len());
    peers.get(&key, 0).ok().map(|nat| nat.peer_id)
}

/// Whether the NatMapping table sends peer `peer_id`'s `external` to `endpoint`.
pub(super) fn maps_to(
    table: &HashMap<MapData, MappingKey, Be32>,
    peer_id: u32,
    external: std::net::Ipv4Addr,
    endpoint: std::net::Ipv4Addr,
) -> bool {
    let key = MappingKey {
        peer_id,
        addr: Be32::from(external),
    };
    table.get(&key, 0).ok() == Some(Be32::from(endpoint))
}
