//! Reading what a running agent exposes: its HTTP endpoints, its metrics,
//! and its pinned maps.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    netns,
    topology::{METRICS_PORT, node_addr},
};

/// Asks the agent in netns `ns` for a metrics path, from inside that netns:
/// a lab node's agent serves on the node's address, a test's own agent on
/// loopback.
pub fn http_get(ns: &str, path: &str) -> Result<(u16, String)> {
    let addr = node_addr(ns).unwrap_or(Ipv4Addr::LOCALHOST);
    http_get_at(ns, SocketAddr::from((addr, METRICS_PORT)), path)
}

/// An HTTP/1.0 GET of `path` from `addr`, from inside netns `ns`: the status
/// and the body.
pub fn http_get_at(ns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    netns::run_in(ns, move || -> Result<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("malformed HTTP response")?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    })?
}

/// The value of the first sample in node `node`'s metrics whose name and
/// labels start with `prefix`, e.g. `isthmus_peers ` or
/// `isthmus_guard_packets_total{verdict="dropped"}`.
pub fn metric(node: &str, prefix: &str) -> Result<f64> {
    let body = scrape(node)?;
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .with_context(|| format!("{node} exposes no sample {prefix}:\n{body}"))
}

/// The sum of the samples of metric `name` in node `node`'s metrics that
/// carry every label in `labels`, e.g. `isthmus_nat_packets_total` with
/// `direction="egress"` over every program. Fails if none does.
pub fn metric_sum(node: &str, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
    let body = scrape(node)?;
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let values: Vec<f64> = body
        .lines()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let pairs: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
            (metric == name && wanted.iter().all(|w| pairs.contains(&w.as_str())))
                .then(|| value.parse().ok())?
        })
        .collect();
    if values.is_empty() {
        bail!("{node} exposes no sample of {name} with {labels:?}:\n{body}");
    }
    Ok(values.iter().sum())
}

/// Node `node`'s metrics, in the text exposition format.
pub fn scrape(node: &str) -> Result<String> {
    let (status, body) = http_get(node, "/metrics")?;
    if status != 200 {
        bail!("{node}: /metrics answered {status}");
    }
    Ok(body)
}

/// Opens the map `map` pinned under bpffs directory `root`.
pub fn pinned_hash<K: aya::Pod, V: aya::Pod>(
    root: &std::path::Path,
    map: &str,
) -> Result<aya::maps::HashMap<aya::maps::MapData, K, V>> {
    let path = isthmus_common::pins::Pins::new(root).map(map);
    let data = aya::maps::MapData::from_pin(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(aya::maps::Map::from_map_data(data)?.try_into()?)
}
