//! The XDP guard in front of the tunnel's ports: which sources may reach
//! the userspace tunnel, and what it counts.
//!
//! The guarded ports are the tunnel's, one per tunnel device, each with its
//! own setting. A datagram to one of them passes when its source (address
//! and port) is a peer's endpoint, or when it is a WireGuard message that names one
//! of our sessions (a handshake response, cookie reply or transport data
//! whose receiver index is ours): that is how a peer that roamed reaches
//! userspace, which authenticates it and then allows its new source.
//! On a port where the gateway serves a peer that makes contact itself (a
//! Liqo v1 `GatewayServer`), whose source nobody can know, a handshake
//! initiation also passes from anywhere: userspace bounds those (a queue of their own
//! and a share of handshake work per source) before it authenticates them.
//! Everything else aimed at a guarded port is dropped in XDP.

use crate::wire::{Be16, Be32, Be128};

/// A source allowed to reach the tunnel port: an IPv4 one in
/// [`crate::names::MAP_GUARD_SOURCES`], an IPv6 one (`A` = [`Be128`]) in
/// [`crate::names::MAP_GUARD_SOURCES6`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuardSource<A = Be32> {
    /// The address.
    pub addr: A,
    /// UDP port.
    pub port: Be16,
    /// Zero.
    pub pad: u16,
}

assert_layout!(GuardSource, size = 8, align = 4);
assert_layout!(GuardSource<Be128>, size = 20, align = 4);

impl<A> GuardSource<A> {
    /// The source `addr:port`.
    pub const fn new(addr: A, port: Be16) -> Self {
        Self { addr, port, pad: 0 }
    }
}

/// A guarded port's setting in [`crate::names::MAP_GUARD_PORTS`]: whether
/// a handshake initiation passes from any source there, while the gateway
/// serves a peer on that port that makes contact itself.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Initiations {
    /// From peers' endpoints alone.
    FromEndpoints = 0,
    /// From any source.
    FromAnywhere = 1,
}

/// What the guard did with a datagram aimed at the tunnel port.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Passed: from a peer's endpoint.
    KnownSource = 0,
    /// Passed: names one of our sessions, from a source not known yet.
    Session = 1,
    /// Dropped.
    Dropped = 2,
    /// Passed: a handshake initiation from a source not known yet, while
    /// the gateway serves a peer that makes contact itself.
    Initiation = 3,
}

/// Every verdict, in slot order.
pub const VERDICTS: [Verdict; 4] = [
    Verdict::KnownSource,
    Verdict::Session,
    Verdict::Dropped,
    Verdict::Initiation,
];

/// A WireGuard handshake initiation: its type, and its length in bytes.
pub const INITIATION: (u8, u16) = (1, 148);

impl Verdict {
    /// Lower-case name used in metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::KnownSource => "known_source",
            Verdict::Session => "session",
            Verdict::Dropped => "dropped",
            Verdict::Initiation => "initiation",
        }
    }
}

/// Where a WireGuard message carries the receiver index, which names one
/// of our sessions: bytes 8..12 of a handshake response (2), after the
/// sender's own index; bytes 4..8 of a cookie reply (3) and of transport
/// data (4). An initiation (1) names no session of ours.
pub const fn receiver_offset(message_type: u8) -> Option<usize> {
    match message_type {
        2 => Some(8),
        3 | 4 => Some(4),
        _ => None,
    }
}

/// boringtun keeps a peer's index in the top 24 bits of every receiver
/// index of its sessions; the guard's index table holds those.
pub const fn peer_index(receiver_index: u32) -> u32 {
    receiver_index >> 8
}
