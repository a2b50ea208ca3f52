//! What the `--segregation` setup changes in b's gateway's command line.

use crate::topology::{B, Cluster};

/// The cluster whose gateway segregates its peers.
pub const CLUSTER: &Cluster = &B;

/// The mode b's gateway runs in.
pub const MODE: &str = "IntraClusterTrafficSegregation";
