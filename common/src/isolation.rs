//! Cross-cluster isolation: Liqo's security mode
//! `IntraClusterTrafficSegregation`, per peer, in the kernel.
//!
//! A segregated peer opens connections only to the endpoints of the
//! allowed table (pods offloaded from it, any port; endpoints exported to
//! it, by protocol and port), to its NatMapping endpoints and to the
//! conncheck. Replies to flows our side opened towards it pass: the egress
//! program records each such flow under the key its replies arrive with,
//! after the ingress translation. Everything else from it is dropped and
//! counted per peer.

use crate::{
    conntrack::{DIR_IN, FlowKey},
    ipv4::PROTO_ICMP,
    wire::Be32,
};

/// [`crate::nat::PeerNat::flags`] bit: the peer is segregated.
pub const SEGREGATED: u32 = 1;

/// Key of the allowed table: an address of ours that a segregated peer may
/// open connections to, on one protocol and port, or on any.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllowKey {
    /// [`crate::nat::PeerNat::peer_id`] of the peer.
    pub peer_id: u32,
    /// The address, real (after the ingress translation).
    pub addr: Be32,
    /// The destination port, host order; 0 with `proto` 0 for any.
    pub port: u16,
    /// The IP protocol; 0 for any.
    pub proto: u8,
    /// Zero.
    pub pad: u8,
}

assert_layout!(AllowKey, size = 12, align = 4);

impl AllowKey {
    /// `addr`'s `port` on `proto`: an endpoint exported to the peer.
    pub const fn endpoint(peer_id: u32, addr: Be32, proto: u8, port: u16) -> Self {
        Self {
            peer_id,
            addr,
            port,
            proto,
            pad: 0,
        }
    }

    /// Every port of `addr`: a pod offloaded from the peer.
    pub const fn any_port(peer_id: u32, addr: Be32) -> Self {
        Self::endpoint(peer_id, addr, 0, 0)
    }
}

/// The key under which the replies of a flow our side sends, from `ours`
/// (real) port `our_port` to the peer's `theirs` port `their_port`, arrive
/// from the peer once translated. An ICMP echo's identifier is our port,
/// and theirs is 0, as in the conntrack.
pub const fn reply_key(
    proto: u8,
    ours: Be32,
    our_port: u16,
    theirs: Be32,
    their_port: u16,
) -> FlowKey {
    let their_port = if proto == PROTO_ICMP { 0 } else { their_port };
    FlowKey::new(theirs, ours, their_port, our_port, proto, DIR_IN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4::{PROTO_TCP, PROTO_UDP};

    #[test]
    fn a_reply_key_is_the_flow_seen_from_the_peer() {
        let (ours, theirs) = (
            Be32::from_bytes([10, 244, 0, 5]),
            Be32::from_bytes([10, 0, 40, 5]),
        );
        let key = reply_key(PROTO_TCP, ours, 40000, theirs, 80);
        assert_eq!((key.saddr, key.daddr), (theirs, ours));
        assert_eq!((key.sport, key.dport, key.dir), (80, 40000, DIR_IN));
        // An echo's identifier is ours; the peer's side has none.
        let echo = reply_key(PROTO_ICMP, ours, 7, theirs, 0);
        assert_eq!((echo.sport, echo.dport), (0, 7));
        assert_ne!(reply_key(PROTO_UDP, ours, 40000, theirs, 80), key);
    }

    #[test]
    fn any_port_is_the_zero_protocol_and_port() {
        let addr = Be32::from_bytes([10, 244, 0, 133]);
        assert_eq!(
            AllowKey::any_port(1, addr),
            AllowKey::endpoint(1, addr, 0, 0)
        );
        assert_ne!(
            AllowKey::any_port(1, addr),
            AllowKey::endpoint(1, addr, PROTO_TCP, 18080)
        );
    }
}
