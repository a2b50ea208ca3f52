//! Names Liqo derives, which the agent reads and the lab's fixtures write:
//! defined here once.

extern crate std;

use sha2::{Digest, Sha256};
use std::{format, string::String};

/// The name Liqo (v0.5 on) gives a peer's NamespaceMap
/// (`foreignclusterutils.UniqueName`), which keys a NamespaceOffloading's
/// status: the cluster name, a dash and the first three bytes of the
/// SHA-256 of the cluster ID, in hex.
pub fn namespace_map_name(cluster_name: &str, cluster_id: &str) -> String {
    let digest = Sha256::digest(cluster_id.as_bytes());
    let hex: String = digest[..3].iter().map(|b| format!("{b:02x}")).collect();
    format!("{cluster_name}-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_maps_are_named_as_liqo_names_them() {
        // sha256("cluster-a") begins 34ab3e…; Liqo's UniqueName takes 3 bytes.
        assert_eq!(namespace_map_name("a", "cluster-a"), "a-34ab3e");
        assert_eq!(namespace_map_name("c", "cluster-c"), "c-9ad7dd");
    }
}
