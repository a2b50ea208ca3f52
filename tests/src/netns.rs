//! Namespaces tests build for themselves beside the lab. Their names start
//! with `ist-t-`, which `cargo xtask lab down` also removes.

use isthmus_lab::{cmd::ip, netns};

/// Creates each of `names` afresh, deleting any leftover, with loopback up.
pub fn fresh(names: &[&str]) {
    for ns in names {
        assert!(
            ns.starts_with(isthmus_lab::lab::TEST_NS_PREFIX),
            "{ns}: test namespaces start with ist-t-"
        );
        if netns::exists(ns) {
            ip("", &["netns", "del", ns]).unwrap();
        }
        ip("", &["netns", "add", ns]).unwrap();
        ip(ns, &["link", "set", "lo", "up"]).unwrap();
    }
}

/// Joins `a` and `b` with a veth pair: `v0` with 192.0.2.1/24 in `a`, `v1`
/// with 192.0.2.2/24 in `b`.
pub fn link(a: &str, b: &str) {
    ip(
        a,
        &[
            "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", b,
        ],
    )
    .unwrap();
    for (ns, dev, addr) in [(a, "v0", "192.0.2.1/24"), (b, "v1", "192.0.2.2/24")] {
        ip(ns, &["link", "set", dev, "up"]).unwrap();
        ip(ns, &["addr", "add", addr, "dev", dev]).unwrap();
    }
}

/// Deletes `names`, ignoring any already gone.
pub fn remove(names: &[&str]) {
    for ns in names {
        let _ = ip("", &["netns", "del", ns]);
    }
}
