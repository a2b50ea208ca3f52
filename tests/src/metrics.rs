//! Reading an agent's Prometheus counters from inside its netns.

use xtask::lab;

/// The value of the sample whose name and labels start with `prefix`,
/// e.g. `isthmus_nat_packets_total{direction="egress",outcome="translated"}`.
pub fn sample(node: &str, prefix: &str) -> f64 {
    let (status, body) =
        lab::http_get(node, "/metrics").unwrap_or_else(|e| panic!("scraping {node}: {e:#}"));
    assert_eq!(status, 200, "scraping {node}");
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("{node} exposes no sample {prefix}:\n{body}"))
}

/// NAT packets of one direction and outcome on `node`.
pub fn nat_packets(node: &str, direction: &str, outcome: &str) -> f64 {
    sample(
        node,
        &format!("isthmus_nat_packets_total{{direction=\"{direction}\",outcome=\"{outcome}\"}}"),
    )
}
