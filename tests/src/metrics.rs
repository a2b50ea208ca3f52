//! Reading an agent's Prometheus counters from inside its netns.

use isthmus_lab::lab;

/// The value of the sample whose name and labels start with `prefix`,
/// e.g. `isthmus_nat_packets_total{direction="egress",outcome="translated"}`.
pub fn sample(node: &str, prefix: &str) -> f64 {
    lab::metric(node, prefix).unwrap_or_else(|e| panic!("scraping {node}: {e:#}"))
}

/// NAT packets of one direction and outcome on `node`, over its programs.
pub fn nat_packets(node: &str, direction: &str, outcome: &str) -> f64 {
    lab::metric_sum(
        node,
        "isthmus_nat_packets_total",
        &[("direction", direction), ("outcome", outcome)],
    )
    .unwrap_or_else(|e| panic!("scraping {node}: {e:#}"))
}
