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
    conntrack::{DIR_IN, FlowKey, TcpState, Timeouts},
    ipv4::PROTO_ICMP,
    ipv6::PROTO_ICMPV6,
    wire::{Be32, Be128},
};

/// [`crate::nat::PeerNat::flags`] bit: the peer is segregated.
pub const SEGREGATED: u32 = 1;

/// Key of an allowed table (one per address family): an address of ours
/// that a segregated peer may open connections to, on one protocol and
/// port, or on any.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllowKey<A = Be32> {
    /// [`crate::nat::PeerNat::peer_id`] of the peer.
    pub peer_id: u32,
    /// The address, real (after the ingress translation).
    pub addr: A,
    /// The destination port, host order; 0 with `proto` 0 for any.
    pub port: u16,
    /// The IP protocol; 0 for any.
    pub proto: u8,
    /// Zero.
    pub pad: u8,
}

assert_layout!(AllowKey, size = 12, align = 4);
assert_layout!(AllowKey<Be128>, size = 24, align = 4);

impl<A: Copy> AllowKey<A> {
    /// `addr`'s `port` on `proto`: an endpoint exported to the peer.
    pub const fn endpoint(peer_id: u32, addr: A, proto: u8, port: u16) -> Self {
        Self {
            peer_id,
            addr,
            port,
            proto,
            pad: 0,
        }
    }

    /// Every port of `addr`: a pod offloaded from the peer.
    pub const fn any_port(peer_id: u32, addr: A) -> Self {
        Self::endpoint(peer_id, addr, 0, 0)
    }
}

/// A flow our side opened towards a segregated peer, as the table of such
/// flows keeps it: what each direction said, so that a flow the peer never
/// answers lives only as long as an unanswered one, and when either last
/// spoke, and who was charged for its room.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerFlow {
    /// What our side's packets said: a [`TcpState`] as a byte.
    pub ours: u8,
    /// What the peer's replies said: [`TcpState::None`] until it answers.
    pub theirs: u8,
    /// Non-zero once the peer answered, whatever the protocol: a flow it
    /// never answered is the first evicted to make room.
    pub answered: u8,
    /// Zero.
    pub pad: u8,
    /// The [`crate::room`] owner charged: the peer.
    pub owner: u32,
    /// `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) of the last packet either way.
    pub last_seen: u64,
}

assert_layout!(PeerFlow, size = 16, align = 8);

impl PeerFlow {
    /// Whether the flow is dead at `now`, each direction judged by what it
    /// said itself.
    pub const fn expired(&self, proto: u8, timeouts: &Timeouts, now: u64) -> bool {
        timeouts.expired_since(
            proto,
            TcpState::from_u8(self.ours),
            TcpState::from_u8(self.theirs),
            self.last_seen,
            now,
        )
    }
}

/// Whether `proto` is ICMP or ICMPv6: an echo's identifier stands for our
/// port, either way.
pub const fn is_icmp(proto: u8) -> bool {
    proto == PROTO_ICMP || proto == PROTO_ICMPV6
}

/// The key under which the replies of a flow our side sends, from `ours`
/// (real) port `our_port` to the peer's `theirs` port `their_port`, arrive
/// from the peer once translated. An ICMP or ICMPv6 echo's identifier is
/// our port, and theirs is 0, as in the conntrack.
pub const fn reply_key<A: Copy>(
    proto: u8,
    ours: A,
    our_port: u16,
    theirs: A,
    their_port: u16,
) -> FlowKey<A> {
    let their_port = if is_icmp(proto) { 0 } else { their_port };
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
        // ICMPv6's echo, between IPv6 addresses, alike.
        let ours6 = Be128::from("fd00:10:244::5".parse::<core::net::Ipv6Addr>().unwrap());
        let theirs6 = Be128::from("fd00:10:0:40::5".parse::<core::net::Ipv6Addr>().unwrap());
        let echo6 = reply_key(PROTO_ICMPV6, ours6, 7, theirs6, 9);
        assert_eq!((echo6.saddr, echo6.daddr), (theirs6, ours6));
        assert_eq!((echo6.sport, echo6.dport), (0, 7));
    }

    #[test]
    fn a_flow_the_peer_never_answered_lives_as_an_unanswered_one() {
        let t = Timeouts::DEFAULT;
        let s = 1_000_000_000;
        let flow = |ours: TcpState, theirs: TcpState| PeerFlow {
            ours: ours as u8,
            theirs: theirs as u8,
            last_seen: 100 * s,
            ..PeerFlow::default()
        };
        // Our SYN-ACK or data, never answered: a SYN's 60 s, not six hours.
        let unanswered = flow(TcpState::Established, TcpState::None);
        assert!(!unanswered.expired(PROTO_TCP, &t, 160 * s));
        assert!(unanswered.expired(PROTO_TCP, &t, 161 * s));
        // Both sides spoke: established.
        let answered = flow(TcpState::Established, TcpState::Established);
        assert!(!answered.expired(PROTO_TCP, &t, (100 + 21599) * s));
        assert!(answered.expired(PROTO_UDP, &t, 161 * s));
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
