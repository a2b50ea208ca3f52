//! `manifests/grafana-dashboard.json` against the lab's real Prometheus:
//! every panel's query parses and runs, and every metric it names exists.

use std::{collections::BTreeSet, path::PathBuf};

use isthmus_lab::lab::monitor;
use isthmus_tests::require_lab;
use serde_json::Value;

fn dashboard() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/grafana-dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel's title and queries, with the node variable set to all.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap().to_owned();
            panel["targets"].as_array().unwrap().iter().map(move |t| {
                let expr = t["expr"].as_str().unwrap().replace("$node", ".*");
                (title.clone(), expr)
            })
        })
        .collect()
}

/// The `isthmus_…` metric names in a query.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("isthmus_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_dashboard_covers_what_operators_watch() {
    let dashboard = dashboard();
    let titles: Vec<String> = queries(&dashboard).into_iter().map(|(t, _)| t).collect();
    for wanted in [
        "Peers",
        "Throughput",
        "Round-trip",
        "NAT",
        "Drops",
        "Map pressure",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(wanted)),
            "no panel on {wanted}: {titles:?}"
        );
    }
}

#[test]
fn every_dashboard_query_runs_in_the_labs_prometheus() {
    require_lab();
    monitor::wait_until_every_agent_is_up().unwrap();
    for (title, expr) in queries(&dashboard()) {
        monitor::query(&expr).unwrap_or_else(|e| panic!("panel {title}: {expr}: {e:#}"));
        for name in metric_names(&expr) {
            let series = monitor::query(&format!("count({name})")).unwrap();
            assert!(
                series.iter().any(|(_, n)| *n > 0.0),
                "panel {title}: no agent exports {name}"
            );
        }
    }
}
