//! `isthmus-agent inspect`: the kernel's tables, read straight from the
//! maps pinned under `--bpffs`, so it works while the agent is down. Each
//! view is a table of strings, printed aligned or as JSON.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use aya::maps::{HashMap, MapData, MapError};
use clap::ValueEnum;
use isthmus_common::{
    conntrack::{DIR_OUT, FlowKey, FlowNat, SnatConfig, TcpState, TrackedAddr},
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
    /// Each peer and the networks we see it under (`ist_peer_nets`,
    /// `ist_peer_nets6`).
    Peers,
    /// Each peer's prefix remaps, both ways, a Liqo v1 peer's remap of its
    /// own networks, and the masquerade address.
    Nat,
    /// NatMapping entries: externalIP to endpointIP, per peer (`ist_natmap`,
    /// `ist_natmap6`).
    Natmap,
    /// What segregated peers may open connections to, per peer
    /// (`ist_allowed`, `ist_allowed6`).
    Allowed,
    /// Masqueraded flows (`ist_conntrack`, `ist_conntrack6`).
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

/// An address of either family, as the views print it.
trait Shown: TrackedAddr + aya::Pod {
    /// The map of the peers' networks of its family.
    const PEERS: &'static str;
    /// Its NatMapping table.
    const NATMAP: &'static str;
    /// Its allowed table.
    const ALLOWED: &'static str;
    /// Its masquerade's flow table.
    const CONNTRACK: &'static str;
    /// Its masquerade's settings.
    const SNAT: &'static str;

    /// The address.
    fn ip(self) -> IpAddr;
    /// The length of the prefix of netmask `self`.
    fn prefix_len(self) -> u32;
}

impl Shown for Be32 {
    const PEERS: &'static str = names::MAP_PEERS;
    const NATMAP: &'static str = names::MAP_NATMAP;
    const ALLOWED: &'static str = names::MAP_ALLOWED;
    const CONNTRACK: &'static str = names::MAP_CONNTRACK;
    const SNAT: &'static str = names::MAP_SNAT;

    fn ip(self) -> IpAddr {
        Ipv4Addr::from(self).into()
    }

    fn prefix_len(self) -> u32 {
        self.to_bits().count_ones()
    }
}

impl Shown for Be128 {
    const PEERS: &'static str = names::MAP_PEERS6;
    const NATMAP: &'static str = names::MAP_NATMAP6;
    const ALLOWED: &'static str = names::MAP_ALLOWED6;
    const CONNTRACK: &'static str = names::MAP_CONNTRACK6;
    const SNAT: &'static str = names::MAP_SNAT6;

    fn ip(self) -> IpAddr {
        Ipv6Addr::from(self).into()
    }

    fn prefix_len(self) -> u32 {
        self.words().iter().map(|w| w.to_bits().count_ones()).sum()
    }
}

fn network<A: Shown>(net: A, mask: A) -> String {
    format!("{}/{}", net.ip(), mask.prefix_len())
}

/// An address and port: `[fd00::5]:80` for IPv6.
fn endpoint<A: Shown>(addr: A, port: u16) -> String {
    SocketAddr::new(addr.ip(), port).to_string()
}

/// The rows of both families, IPv4's (from `rows4`) first.
fn both<T>(
    root: &Path,
    rows4: fn(&Path) -> Result<Vec<T>, InspectError>,
    rows6: fn(&Path) -> Result<Vec<T>, InspectError>,
) -> Result<Vec<T>, InspectError> {
    let mut rows = rows4(root)?;
    rows.extend(rows6(root)?);
    Ok(rows)
}

fn peers(root: &Path) -> Result<Table, InspectError> {
    let mut by_peer = std::collections::BTreeMap::<u32, Vec<String>>::default();
    for (id, net) in both(root, peer_networks::<Be32>, peer_networks::<Be128>)? {
        by_peer.entry(id).or_default().push(net);
    }
    Ok(Table {
        columns: vec!["peer_id", "networks"],
        rows: by_peer
            .into_iter()
            .map(|(id, nets)| vec![id.to_string(), nets.join(",")])
            .collect(),
    })
}

/// Each peer ID with one of its networks of family `A`, sorted.
fn peer_networks<A: Shown>(root: &Path) -> Result<Vec<(u32, String)>, InspectError>
where
    PeerKey<A>: aya::Pod,
    PeerNat<A>: aya::Pod,
{
    let mut rows: Vec<(u32, String)> = entries::<PeerKey<A>, PeerNat<A>>(root, A::PEERS)?
        .into_iter()
        .map(|(key, nat)| (nat.peer_id, format!("{}/{}", key.addr.ip(), key.prefix_len)))
        .collect();
    rows.sort();
    Ok(rows)
}

fn nat(root: &Path) -> Result<Table, InspectError> {
    Ok(Table {
        columns: vec!["peer_id", "direction", "from", "to"],
        rows: both(root, nat_rows::<Be32>, nat_rows::<Be128>)?,
    })
}

/// Family `A`'s masquerade address and each peer's prefix remaps, sorted.
fn nat_rows<A: Shown>(root: &Path) -> Result<Vec<Vec<String>>, InspectError>
where
    PeerKey<A>: aya::Pod,
    PeerNat<A>: aya::Pod,
    SnatConfig<A>: aya::Pod,
{
    let mut rows = std::collections::BTreeSet::new();
    for (_, nat) in entries::<PeerKey<A>, PeerNat<A>>(root, A::PEERS)? {
        // `peer`: a Liqo v1 peer's own networks, from our view of them to
        // the real ones (the destination going out, reversed coming in).
        let directions = [
            ("egress", nat.egress),
            ("ingress", nat.ingress),
            ("peer", nat.theirs),
        ];
        for (direction, rules) in directions {
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
    if let Some(to) = masquerade::<A>(root)? {
        let others = ["*", "masquerade", "others"].map(str::to_owned);
        rows.insert(others.into_iter().chain([to.ip().to_string()]).collect());
    }
    Ok(rows.into_iter().collect())
}

/// Family `A`'s masquerade address, if it has one.
fn masquerade<A: Shown>(root: &Path) -> Result<Option<A>, InspectError>
where
    SnatConfig<A>: aya::Pod,
{
    let map = A::SNAT;
    let snat = open_pinned(root, map)
        .and_then(aya::maps::Array::<MapData, SnatConfig<A>>::try_from)
        .and_then(|a| a.get(&0, 0))
        .map_err(|source| InspectError::Map { map, source })?;
    Ok((snat.enabled != 0).then_some(snat.addr))
}

fn natmap(root: &Path) -> Result<Table, InspectError> {
    Ok(Table {
        columns: vec!["peer_id", "external_ip", "endpoint_ip"],
        rows: both(root, natmap_rows::<Be32>, natmap_rows::<Be128>)?,
    })
}

/// Family `A`'s NatMapping entries, sorted.
fn natmap_rows<A: Shown>(root: &Path) -> Result<Vec<Vec<String>>, InspectError>
where
    MappingKey<A>: aya::Pod,
{
    let mut rows: Vec<Vec<String>> = entries::<MappingKey<A>, A>(root, A::NATMAP)?
        .into_iter()
        .map(|(key, endpoint)| {
            let addresses = [key.addr, endpoint].map(|a| a.ip().to_string());
            [key.peer_id.to_string()]
                .into_iter()
                .chain(addresses)
                .collect()
        })
        .collect();
    rows.sort();
    Ok(rows)
}

fn allowed(root: &Path) -> Result<Table, InspectError> {
    Ok(Table {
        columns: vec!["peer_id", "address", "protocol", "port"],
        rows: both(root, allowed_rows::<Be32>, allowed_rows::<Be128>)?,
    })
}

/// Family `A`'s allowed entries, sorted.
fn allowed_rows<A: Shown>(root: &Path) -> Result<Vec<Vec<String>>, InspectError>
where
    AllowKey<A>: aya::Pod,
{
    let mut rows: Vec<Vec<String>> = entries::<AllowKey<A>, u8>(root, A::ALLOWED)?
        .into_iter()
        .map(|(key, _)| {
            let (proto, port) = match key.proto {
                0 => ("any".to_owned(), "any".to_owned()),
                proto => (protocol(proto).to_owned(), key.port.to_string()),
            };
            vec![
                key.peer_id.to_string(),
                key.addr.ip().to_string(),
                proto,
                port,
            ]
        })
        .collect();
    rows.sort();
    Ok(rows)
}

fn conntrack(root: &Path) -> Result<Table, InspectError> {
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
        rows: both(root, flow_rows::<Be32>, flow_rows::<Be128>)?,
    })
}

/// Family `A`'s masqueraded flows' entries, sorted, idle since their last
/// packet.
fn flow_rows<A: Shown>(root: &Path) -> Result<Vec<Vec<String>>, InspectError>
where
    FlowKey<A>: aya::Pod,
    FlowNat<A>: aya::Pod,
{
    let now = crate::kernel::conntrack::now();
    let mut rows: Vec<Vec<String>> = entries::<FlowKey<A>, FlowNat<A>>(root, A::CONNTRACK)?
        .into_iter()
        .map(|(key, nat)| {
            vec![
                protocol(key.proto).to_owned(),
                if key.dir == DIR_OUT { "out" } else { "in" }.to_owned(),
                endpoint(key.saddr, key.sport),
                endpoint(key.daddr, key.dport),
                endpoint(nat.addr, nat.port),
                format!("{:?}", TcpState::from_u8(nat.state)).to_lowercase(),
                format!("{:.1}", now.saturating_sub(nat.last_seen) as f64 / 1e9),
            ]
        })
        .collect();
    rows.sort();
    Ok(rows)
}

fn protocol(proto: u8) -> &'static str {
    match proto {
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        58 => "icmpv6",
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
