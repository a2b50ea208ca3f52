//! Helpers shared by the kernel-level tests.

pub mod metrics;
pub mod netns;
pub mod packet;

/// Fails the test unless the lab is up: lab tests never skip in silence.
pub fn require_lab() {
    assert!(
        xtask::lab::is_up(),
        "the lab is not up: run these tests through `cargo xtask test`, or `cargo xtask lab up` first"
    );
}

/// Fails the test unless it runs as root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test loads eBPF programs and needs root; run it through `cargo xtask test` as root"
    );
}
