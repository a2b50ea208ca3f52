//! Whether the lab runs its Liqo v1 peer, which clusters play which part,
//! and which side of the tunnel each takes: what the agents' command lines
//! follow.

use std::{fs, net::Ipv4Addr, path::PathBuf};

use crate::{
    lab::paths::state,
    topology::{A, B, Cluster},
};

/// The cluster whose gateway runs as Liqo v1.2 runs one.
pub const LIQO: &Cluster = &B;
/// The cluster that serves it with Isthmus (`--liqo-api v1`).
pub const ISTHMUS: &Cluster = &A;

/// The side of the tunnel Isthmus takes (Liqo's gateway takes the other):
/// a `GatewayClient` in a's objects makes a the client, which contacts
/// b's gateway server; a `GatewayServer` makes a the server, which b's
/// gateway client contacts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// a contacts b.
    #[default]
    Client,
    /// b contacts a.
    Server,
}

impl Side {
    /// Isthmus' tunnel address, which Liqo's conncheck PINGs, and Liqo's:
    /// .1/30 for the server, .2/30 for the client
    /// (`pkg/gateway/tunnel/netlink.go:27-29`).
    pub fn addresses(self) -> (Ipv4Addr, Ipv4Addr) {
        let (server, client) = (
            Ipv4Addr::new(169, 254, 18, 1),
            Ipv4Addr::new(169, 254, 18, 2),
        );
        match self {
            Side::Client => (client, server),
            Side::Server => (server, client),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

fn marker() -> PathBuf {
    state("liqo-v1-peer")
}

/// Records that the lab runs its Liqo v1 peer, with Isthmus on `side`.
pub(super) fn choose(side: Side) -> std::io::Result<()> {
    fs::write(marker(), side.as_str())
}

/// Whether the lab runs cluster b as Liqo v1.
pub fn is_on() -> bool {
    marker().exists()
}

/// The side Isthmus takes in the Liqo v1 lab.
pub fn isthmus_side() -> Side {
    match fs::read_to_string(marker()) {
        Ok(side) if side == Side::Server.as_str() => Side::Server,
        _ => Side::Client,
    }
}

/// Isthmus' tunnel address, which Liqo's conncheck PINGs.
pub fn isthmus_addr() -> Ipv4Addr {
    isthmus_side().addresses().0
}
