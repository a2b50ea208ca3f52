//! What the `--segregation` setup changes in b's gateway's command line,
//! and whether it is on.

use std::path::PathBuf;

use crate::lab::paths::state;
use crate::topology::{B, Cluster};

/// The cluster whose gateway segregates its peers.
pub const CLUSTER: &Cluster = &B;

/// The mode b's gateway runs in.
pub const MODE: &str = "IntraClusterTrafficSegregation";

pub(super) fn marker() -> PathBuf {
    state("segregation")
}

/// Whether the lab's b gateway segregates its peers.
pub fn is_on() -> bool {
    marker().exists()
}
