//! Whether the lab runs its Liqo v1 peer, and which clusters play which
//! part: what the agents' command lines follow.

use std::path::PathBuf;

use crate::{
    lab::paths::state,
    topology::{A, B, Cluster},
};

/// The cluster whose gateway runs as Liqo v1.2 runs one.
pub const LIQO: &Cluster = &B;
/// The cluster that serves it with Isthmus (`--liqo-api v1`).
pub const ISTHMUS: &Cluster = &A;

/// The client's tunnel address, Isthmus', which Liqo's conncheck PINGs.
pub const CLIENT_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 18, 2);

pub(super) fn marker() -> PathBuf {
    state("liqo-v1-peer")
}

/// Whether the lab runs cluster b as Liqo v1.
pub fn is_on() -> bool {
    marker().exists()
}
