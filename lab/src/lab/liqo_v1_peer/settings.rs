//! Which clusters play which part in the Liqo v1 lab, and which side of
//! the tunnel each takes: what the agents' command lines follow.

use std::net::Ipv4Addr;

use crate::topology::{A, B, Cluster};

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

    /// The side's name, as `--isthmus-side` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }

    /// The side named `name`, if one is.
    pub fn parse(name: &str) -> Option<Self> {
        [Side::Client, Side::Server]
            .into_iter()
            .find(|side| side.as_str() == name)
    }
}
