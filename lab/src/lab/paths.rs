//! Where the lab keeps what it makes: its state directory, bpffs, the
//! agents' objects, logs, PIDs and keys.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Where the lab keeps its state: PIDs, logs, objects, bpffs.
pub const STATE_DIR: &str = "/run/isthmus-lab";

pub(crate) fn state(sub: &str) -> PathBuf {
    Path::new(STATE_DIR).join(sub)
}

/// The lab's own bpffs instance. `ip netns exec` remounts /sys, hiding
/// /sys/fs/bpf, so the lab mounts one where every node can see it.
pub fn bpffs_root() -> PathBuf {
    state("bpffs")
}

/// Where node `node` pins its programs and maps.
pub fn bpffs(node: &str) -> PathBuf {
    bpffs_root().join(node)
}

/// The paths of what node `node` pinned.
pub fn pins(node: &str) -> isthmus_common::pins::Pins {
    isthmus_common::pins::Pins::new(&bpffs(node))
}

/// The directory node `node` reads its objects from.
pub fn object_dir(node: &str) -> PathBuf {
    state("objects").join(node)
}

/// The log file of node `node`'s agent.
pub fn log_file(node: &str) -> PathBuf {
    state("logs").join(format!("{node}.log"))
}

pub(super) fn pid_file(node: &str) -> PathBuf {
    state("pids").join(format!("{node}.pid"))
}

/// The agent binary the lab runs.
pub fn agent_binary() -> PathBuf {
    crate::target_dir().join("release/isthmus-agent")
}

/// The hosts file `ip netns exec` gives gateway `gw`'s processes: its
/// peers' endpoint names, and localhost.
pub fn hosts_file(gw: &str) -> PathBuf {
    Path::new("/etc/netns").join(gw).join("hosts")
}

/// The xtask binary, which runs the lab's background processes: `cargo
/// xtask` builds it.
pub(crate) fn xtask_binary() -> Result<PathBuf> {
    let binary = crate::target_dir().join("debug/xtask");
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo xtask build` first",
            binary.display()
        );
    }
    Ok(binary)
}
