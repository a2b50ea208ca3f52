//! What the `--ha` setup changes in cluster a's agents' command lines,
//! and whether it is on.

use std::path::PathBuf;

use crate::lab::paths::state;
use crate::topology::{A, Cluster, GW2};

/// The cluster with two gateways.
pub const CLUSTER: &Cluster = &A;

pub(super) fn marker() -> PathBuf {
    state("ha")
}

/// The kubeconfig a's agents use.
pub fn kubeconfig() -> PathBuf {
    state("a.kubeconfig")
}

/// Whether the lab runs cluster a with two gateways.
pub fn is_on() -> bool {
    marker().exists()
}

/// Whether `node` is a node of the `--ha` cluster.
pub fn is_ha_node(node: &str) -> bool {
    is_on() && (node == CLUSTER.gw() || node == CLUSTER.node() || node == GW2)
}

/// The name of gateway `node`'s pod.
pub fn pod_name(node: &str) -> String {
    format!("isthmus-gateway-{node}")
}
