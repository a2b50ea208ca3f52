//! What the `--ha` setup changes in cluster a's agents' command lines.

use std::path::PathBuf;

use crate::lab::{paths::state, setup::Setup};
use crate::topology::{A, Cluster, GW2};

/// The cluster with two gateways.
pub const CLUSTER: &Cluster = &A;

/// The kubeconfig a's agents use.
pub fn kubeconfig() -> PathBuf {
    state("a.kubeconfig")
}

/// Whether `node` is a node of the cluster with two gateways, in a lab
/// set up as `setup`.
pub fn is_ha_node(node: &str, setup: &Setup) -> bool {
    setup.ha && (node == CLUSTER.gw() || node == CLUSTER.node() || node == GW2)
}

/// The name of gateway `node`'s pod.
pub fn pod_name(node: &str) -> String {
    format!("isthmus-gateway-{node}")
}
