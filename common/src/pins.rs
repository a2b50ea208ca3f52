//! Where the agent pins its maps, programs and links under one bpffs
//! directory: the contract between the agent, `inspect`, `bpftool` users,
//! the tests and xtask, defined here once.

extern crate std;

use std::{
    format,
    path::{Path, PathBuf},
};

/// The subdirectory of pinned maps.
pub const MAPS: &str = "maps";
/// The subdirectory of pinned programs.
pub const PROGRAMS: &str = "progs";
/// The subdirectory of pinned TCX links.
pub const LINKS: &str = "links";

/// Which hook of a device a link is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Packets arriving on the device.
    Ingress,
    /// Packets leaving through the device.
    Egress,
}

impl Direction {
    /// As it appears in a link's pin name.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// The paths of everything pinned under one root.
#[derive(Clone, Debug)]
pub struct Pins {
    root: PathBuf,
}

impl Pins {
    /// The layout under `root`.
    pub fn new(root: &Path) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Pin path of a map.
    pub fn map(&self, name: &str) -> PathBuf {
        self.root.join(MAPS).join(name)
    }

    /// Pin path of a program.
    pub fn program(&self, name: &str) -> PathBuf {
        self.root.join(PROGRAMS).join(name)
    }

    /// The directory of the TCX links.
    pub fn links(&self) -> PathBuf {
        self.root.join(LINKS)
    }

    /// Pin path of a program's TCX link on a device. bpffs refuses names
    /// with a `.`, which device names may hold (`isthmus.vx`); it becomes a
    /// `:`, which they may not, so two devices never share a pin.
    pub fn link(&self, dev: &str, direction: Direction, program: &str) -> PathBuf {
        self.links().join(format!(
            "{}-{}-{program}",
            dev.replace('.', ":"),
            direction.as_str()
        ))
    }

    /// The three subdirectories.
    pub fn dirs(&self) -> [PathBuf; 3] {
        [MAPS, PROGRAMS, LINKS].map(|d| self.root.join(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dot_in_a_device_name_never_reaches_bpffs() {
        let pins = Pins::new(Path::new("/sys/fs/bpf/isthmus"));
        assert_eq!(
            pins.link("isthmus.vx", Direction::Ingress, "ist_decap"),
            Path::new("/sys/fs/bpf/isthmus/links/isthmus:vx-ingress-ist_decap")
        );
        assert_eq!(
            pins.map("ist_peer_nets"),
            Path::new("/sys/fs/bpf/isthmus/maps/ist_peer_nets")
        );
    }
}
