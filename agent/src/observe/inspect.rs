//! `isthmus-agent inspect`: the kernel's tables, read straight from the
//! maps pinned under `--bpffs`, so it works while the agent is down. Each
//! view is a table of strings, printed aligned or as JSON.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::maps::{HashMap, MapData, MapError};
use clap::ValueEnum;
use isthmus_common::{
    conntrack::{DIR_OUT, FlowKey, FlowNat, SnatConfig, TcpState},
    isolation::AllowKey,
    names,
    nat::{MappingKey, PeerKey, PeerNat, PrefixRewrite},
    pins::Pins,
    wire::{Be32, Be128},
};
use thiserror::Error;

use crate::{kernel::maps::open_pinned, observe::samples::DataplaneCounters};

/// What to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum View {
    /// Each peer and the networks we see it under (`ist_peer_nets`).
    Peers,
    /// Each peer's prefix remaps, both ways, and the masquerade address.
    Nat,
    /// NatMapping entries: externalIP to endpointIP, per peer (`ist_natmap`).
    Natmap,
    /// What segregated peers may open connections to, per peer
    /// (`ist_allowed`, `ist_allowed6`).
    Allowed,
    /// Masqueraded flows (`ist_conntrack`).
    Conntrack,
    /// Every per-CPU counter, summed.
    Counters,
}

/// Failures reading the pins.
#[derive(Debug, Error)]
pub enum InspectError {
    /// The bpffs directory holds no maps.
    #[error(
        "nothing is pinned under {0}: no agent has run with this --bpffs, or `isthmus-agent cleanup` removed it"
    )]
    NothingPinned(String),
    /// A map could not be read.
    #[error("map {map}: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// What failed.
        source: MapError,
    },
}

/// Rows of strings under named columns.
#[derive(Debug, PartialEq, Eq)]
pub struct Table {
    /// Column names.
    pub columns: Vec<&'static str>,
    /// One vector per row, a cell per column.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// The table aligned in columns, with a header.
    pub fn aligned(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].len())
                    .chain([self.columns[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let header: Vec<String> = self.columns.iter().map(|c| c.to_uppercase()).collect();
        [&header]
            .into_iter()
            .chain(&self.rows)
            .map(|cells| {
                let line: Vec<String> = cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                line.join("  ").trim_end().to_owned() + "\n"
            })
            .collect()
    }

    /// The table as a JSON array of objects, one per row.
    pub fn json(&self) -> serde_json::Value {
        self.rows
            .iter()
            .map(|row| {
                self.columns
                    .iter()
                    .zip(row)
                    .map(|(c, v)| ((*c).to_owned(), serde_json::Value::from(v.as_str())))
                    .collect::<serde_json::Map<_, _>>()
            })
            .collect()
    }
}

/// Reads `view` from the maps pinned under `root`.
pub fn read(root: &Path, view: View) -> Result<Table, InspectError> {
    if !Pins::new(root).map(names::MAP_PEERS).exists() {
        return Err(InspectError::NothingPinned(root.display().to_string()));
    }
    match view {
        View::Peers => peers(root),
        View::Nat => nat(root),
        View::Natmap => natmap(root),
        View::Allowed => allowed(root),
        View::Conntrack => conntrack(root),
        View::Counters => counters(root),
    }
}

/// Every entry of a pinned hash map.
fn entries<K: aya::Pod, V: aya::Pod>(
    root: &Path,
    map: &'static str,
) -> Result<Vec<(K, V)>, InspectError> {
    open_pinned(root, map)
        .and_then(HashMap::<MapData, K, V>::try_from)
        .and_then(|hash| hash.iter().collect())
        .map_err(|source| InspectError::Map { map, source })
}

fn addr(addr: Be32) -> Ipv4Addr {
    addr.into()
}

fn network(net: Be32, mask: Be32) -> String {
    format!("{}/{}", addr(net), mask.to_bits().count_ones())
}

fn peers(root: &Path) -> Result<Table, InspectError> {
    let mut by_peer = std::collections::BTreeMap::<u32, Vec<String>>::default();
    for (key, nat) in entries::<PeerKey, PeerNat>(root, names::MAP_PEERS)? {
        by_peer.entry(nat.peer_id).or_default().push(format!(
            "{}/{}",
            addr(key.addr),
            key.prefix_len
        ));
    }
    Ok(Table {
        columns: vec!["peer_id", "networks"],
        rows: by_peer
            .into_iter()
            .map(|(id, mut nets)| {
                nets.sort();
                vec![id.to_string(), nets.join(",")]
            })
            .collect(),
    })
}

fn nat(root: &Path) -> Result<Table, InspectError> {
    let mut rows = std::collections::BTreeSet::new();
    for (_, nat) in entries::<PeerKey, PeerNat>(root, names::MAP_PEERS)? {
        for (direction, rules) in [("egress", nat.egress), ("ingress", nat.ingress)] {
            for PrefixRewrite {
                from,
                to,
                mask,
                active,
            } in rules
            {
                if active != 0 {
                    rows.insert(vec![
                        nat.peer_id.to_string(),
                        direction.to_owned(),
                        network(from, mask),
                        network(to, mask),
                    ]);
                }
            }
        }
    }
    let snat = open_pinned(root, names::MAP_SNAT)
        .and_then(aya::maps::Array::<MapData, SnatConfig>::try_from)
        .and_then(|a| a.get(&0, 0))
        .map_err(|source| InspectError::Map {
            map: names::MAP_SNAT,
            source,
        })?;
    if snat.enabled != 0 {
        rows.insert(vec![
            "*".into(),
            "masquerade".into(),
            "others".into(),
            addr(snat.addr).to_string(),
        ]);
    }
    Ok(Table {
        columns: vec!["peer_id", "direction", "from", "to"],
        rows: rows.into_iter().collect(),
    })
}

fn natmap(root: &Path) -> Result<Table, InspectError> {
    let mut rows: Vec<Vec<String>> = entries::<MappingKey, Be32>(root, names::MAP_NATMAP)?
        .into_iter()
        .map(|(key, endpoint)| {
            vec![
                key.peer_id.to_string(),
                addr(key.addr).to_string(),
                addr(endpoint).to_string(),
            ]
        })
        .collect();
    rows.sort();
    Ok(Table {
        columns: vec!["peer_id", "external_ip", "endpoint_ip"],
        rows,
    })
}

fn allowed(root: &Path) -> Result<Table, InspectError> {
    let ipv4 = entries::<AllowKey, u8>(root, names::MAP_ALLOWED)?;
    let ipv6 = entries::<AllowKey<Be128>, u8>(root, names::MAP_ALLOWED6)?;
    let mut rows: Vec<Vec<String>> = ipv4
        .into_iter()
        .map(|(key, _)| allowed_row(key, addr(key.addr).to_string()))
        .chain(
            ipv6.into_iter()
                .map(|(key, _)| allowed_row(key, Ipv6Addr::from(key.addr).to_string())),
        )
        .collect();
    rows.sort();
    Ok(Table {
        columns: vec!["peer_id", "address", "protocol", "port"],
        rows,
    })
}

/// An allowed entry of either family, its address shown as `address`.
fn allowed_row<A>(key: AllowKey<A>, address: String) -> Vec<String> {
    let (proto, port) = match key.proto {
        0 => ("any".to_owned(), "any".to_owned()),
        proto => (protocol(proto).to_owned(), key.port.to_string()),
    };
    vec![key.peer_id.to_string(), address, proto, port]
}

fn conntrack(root: &Path) -> Result<Table, InspectError> {
    let now = crate::kernel::conntrack::now();
    let mut rows: Vec<Vec<String>> = entries::<FlowKey, FlowNat>(root, names::MAP_CONNTRACK)?
        .into_iter()
        .map(|(key, nat)| {
            vec![
                protocol(key.proto).to_owned(),
                if key.dir == DIR_OUT { "out" } else { "in" }.to_owned(),
                format!("{}:{}", addr(key.saddr), key.sport),
                format!("{}:{}", addr(key.daddr), key.dport),
                format!("{}:{}", addr(nat.addr), nat.port),
                format!("{:?}", TcpState::from_u8(nat.state)).to_lowercase(),
                format!("{:.1}", now.saturating_sub(nat.last_seen) as f64 / 1e9),
            ]
        })
        .collect();
    rows.sort();
    Ok(Table {
        columns: vec![
            "proto",
            "dir",
            "source",
            "destination",
            "nat",
            "state",
            "idle_s",
        ],
        rows,
    })
}

fn protocol(proto: u8) -> &'static str {
    match proto {
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        _ => "other",
    }
}

fn counters(root: &Path) -> Result<Table, InspectError> {
    let failed = |source| InspectError::Map {
        map: names::MAP_COUNTERS,
        source,
    };
    let families = DataplaneCounters::open(root)
        .and_then(|c| c.families())
        .map_err(failed)?;
    Ok(Table {
        columns: vec!["counter", "labels", "value"],
        rows: families
            .iter()
            .flat_map(|f| {
                f.samples.iter().map(|(labels, value)| {
                    let labels: Vec<String> =
                        labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    vec![f.name.to_owned(), labels.join(","), value.to_string()]
                })
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_become_json() {
        let table = Table {
            columns: vec!["peer_id", "networks"],
            rows: vec![
                vec!["1".into(), "10.0.0.0/24".into()],
                vec!["12".into(), "x".into()],
            ],
        };
        assert_eq!(
            table.aligned(),
            "PEER_ID  NETWORKS\n1        10.0.0.0/24\n12       x\n"
        );
        assert_eq!(
            table.json().to_string(),
            r#"[{"networks":"10.0.0.0/24","peer_id":"1"},{"networks":"x","peer_id":"12"}]"#
        );
    }
}
