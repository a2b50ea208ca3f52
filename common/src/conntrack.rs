//! Stateful source NAT (docs/design.md#masquerade), in the way of
//! Cilium's `bpf/lib/nat.h`: each masqueraded flow has two entries in one
//! hash, one per direction, each leading to the other side's addresses.
//!
//! Ports are always "ours" and "theirs": on the way out the source port is
//! ours, on the way back the destination port is. An ICMP echo's identifier
//! is our port, and theirs is 0.
//!
//! The kernel records each entry's state and when it last saw a packet; the
//! agent's garbage collector decides expiry, with a clock it is given, so
//! tests choose the time.

use core::{fmt, hash::Hash};

use crate::{
    ipv4::{PROTO_ICMP, PROTO_TCP},
    ipv6::PROTO_ICMPV6,
    tcp::{ACK as TCP_ACK, FIN as TCP_FIN, RST as TCP_RST, SYN as TCP_SYN},
    wire::{Address, Be16, Be32, Be128},
};

/// An entry keyed by a packet leaving towards a peer.
pub const DIR_OUT: u8 = 0;
/// An entry keyed by a reply arriving from a peer.
pub const DIR_IN: u8 = 1;

/// Our ports are taken from here when the original one is taken.
pub const PORT_MIN: u16 = 1024;

/// An address family's address as the masquerade's tables hold it, one
/// table per family. The kernel hashes a key's every byte and copies a
/// value's: the padding each family's entries need is a field, never a
/// hole left uninitialised.
pub trait TrackedAddr: Address + 'static {
    /// Fills [`FlowNat`] out to its 8-byte `last_seen`.
    type NatPad: Copy + Default + fmt::Debug + Eq;
    /// A datagram's identification: IPv4's 16 bits, the IPv6 Fragment
    /// header's 32.
    type FragmentId: Copy + Default + fmt::Debug + Eq + Ord + Hash;
    /// Fills [`FragKey`] out to its 4-byte alignment.
    type FragPad: Copy + Default + fmt::Debug + Eq + Ord + Hash;
}

impl TrackedAddr for Be32 {
    type NatPad = u32;
    type FragmentId = Be16;
    type FragPad = ();
}

impl TrackedAddr for Be128 {
    type NatPad = ();
    type FragmentId = Be32;
    type FragPad = u16;
}

/// A flow as one packet names it; ports in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey<A = Be32> {
    /// Source address.
    pub saddr: A,
    /// Destination address.
    pub daddr: A,
    /// Source port (ICMP echo: the identifier outbound, 0 inbound).
    pub sport: u16,
    /// Destination port (ICMP echo: 0 outbound, the identifier inbound).
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// [`DIR_OUT`] or [`DIR_IN`].
    pub dir: u8,
    /// Zero.
    pub pad: u16,
}

assert_layout!(FlowKey, size = 16, align = 4);
assert_layout!(FlowKey<Be128>, size = 40, align = 4);

impl<A: Copy> FlowKey<A> {
    /// The key of a packet from `saddr:sport` to `daddr:dport`, in direction `dir`.
    #[inline(always)]
    pub const fn new(saddr: A, daddr: A, sport: u16, dport: u16, proto: u8, dir: u8) -> Self {
        Self {
            saddr,
            daddr,
            sport,
            dport,
            proto,
            dir,
            pad: 0,
        }
    }
}

/// Where one direction of a flow is rewritten to, and its life so far.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowNat<A: TrackedAddr = Be32> {
    /// Outbound: the masquerade address; inbound: the original source.
    pub addr: A,
    /// Outbound: our port after SNAT; inbound: the original source port.
    pub port: u16,
    /// A [`TcpState`] as a byte.
    pub state: u8,
    /// Inbound: non-zero once a reply came. A flow never answered is the
    /// first evicted to make room (as Linux conntrack's early drop).
    pub answered: u8,
    /// The [`crate::room`] owner the flow's room was charged to.
    pub owner: u32,
    /// Zero.
    pub pad: A::NatPad,
    /// `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) when a packet last used it.
    pub last_seen: u64,
}

assert_layout!(FlowNat, size = 24, align = 8);
assert_layout!(FlowNat<Be128>, size = 32, align = 8);

/// What the packets of a TCP flow have said so far, in one direction.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TcpState {
    /// Not TCP.
    None = 0,
    /// A SYN and nothing else yet.
    Syn = 1,
    /// Data or acknowledgements.
    Established = 2,
    /// A FIN was seen.
    Fin = 3,
    /// A RST was seen.
    Rst = 4,
}

impl TcpState {
    /// From a stored byte.
    pub const fn from_u8(b: u8) -> Self {
        match b {
            1 => Self::Syn,
            2 => Self::Established,
            3 => Self::Fin,
            4 => Self::Rst,
            _ => Self::None,
        }
    }
}

/// The state after a packet with TCP `flags`. RST and FIN only move a flow
/// towards its end; a bare SYN keeps it opening. A SYN after the end (a
/// client reusing its port within the close timeout) opens a new
/// connection on the same addresses and ports, as Linux's conntrack
/// reopens one in `TIME_WAIT`.
#[inline(always)]
pub const fn next_tcp_state(current: TcpState, flags: u8) -> TcpState {
    let ended = matches!(current, TcpState::Fin | TcpState::Rst);
    if flags & TCP_RST != 0 {
        TcpState::Rst
    } else if ended && flags & (TCP_SYN | TCP_FIN) == TCP_SYN {
        if flags & TCP_ACK == 0 {
            TcpState::Syn
        } else {
            TcpState::Established
        }
    } else if flags & TCP_FIN != 0 {
        match current {
            TcpState::Rst => TcpState::Rst,
            _ => TcpState::Fin,
        }
    } else if flags & TCP_SYN != 0 && flags & TCP_ACK == 0 {
        match current {
            TcpState::None => TcpState::Syn,
            other => other,
        }
    } else {
        match current {
            TcpState::None | TcpState::Syn => TcpState::Established,
            other => other,
        }
    }
}

/// Whether a flow whose directions are in `out` and `back` is a TCP
/// connection that is over: both sides sent a FIN, or one a RST. Its
/// entries are kept only for stray packets, and are the first to go when
/// room is short, as Linux's conntrack drops closing connections first
/// (`tcp_can_early_drop`).
#[inline(always)]
pub const fn tcp_closed(proto: u8, out: TcpState, back: TcpState) -> bool {
    proto == PROTO_TCP
        && (matches!(out, TcpState::Rst)
            || matches!(back, TcpState::Rst)
            || (matches!(out, TcpState::Fin) && matches!(back, TcpState::Fin)))
}

/// The key under which the reply to an outbound flow `out`, masqueraded as
/// `nat`, arrives.
#[inline(always)]
pub const fn reply_key<A: TrackedAddr>(out: &FlowKey<A>, nat: &FlowNat<A>) -> FlowKey<A> {
    FlowKey::new(out.daddr, nat.addr, out.dport, nat.port, out.proto, DIR_IN)
}

/// A fragment of a masqueraded datagram, as its later fragments name it:
/// they carry no ports, so the translation of the first is kept under the
/// addresses, protocol and identification all fragments share.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FragKey<A: TrackedAddr = Be32> {
    /// Source address, as the fragment arrived.
    pub saddr: A,
    /// Destination address, as the fragment arrived.
    pub daddr: A,
    /// The datagram's identification.
    pub id: A::FragmentId,
    /// IP protocol.
    pub proto: u8,
    /// [`DIR_OUT`] or [`DIR_IN`].
    pub dir: u8,
    /// Zero.
    pub pad: A::FragPad,
}

assert_layout!(FragKey, size = 12, align = 4);
assert_layout!(FragKey<Be128>, size = 40, align = 4);

/// The masquerade settings of a gateway (a one-entry array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnatConfig<A = Be32> {
    /// The address flows are masqueraded to, in our own networks: each
    /// peer then sees it through its prefix remap.
    pub addr: A,
    /// Non-zero when masquerading is on.
    pub enabled: u32,
}

assert_layout!(SnatConfig, size = 8, align = 4);
assert_layout!(SnatConfig<Be128>, size = 20, align = 4);

/// How long an entry lives after its last packet, by state, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP that has only said SYN.
    pub tcp_syn: u64,
    /// TCP in use.
    pub tcp_established: u64,
    /// TCP after a FIN.
    pub tcp_fin: u64,
    /// TCP after a RST.
    pub tcp_rst: u64,
    /// UDP.
    pub udp: u64,
    /// ICMP echo.
    pub icmp: u64,
}

impl Timeouts {
    /// Cilium's defaults where it has them (`CT_SYN_TIMEOUT`,
    /// `CT_CONNECTION_LIFETIME_TCP`, `CT_CLOSE_TIMEOUT`, non-TCP lifetime).
    pub const DEFAULT: Self = Self {
        tcp_syn: 60,
        tcp_established: 21600,
        tcp_fin: 10,
        tcp_rst: 5,
        udp: 60,
        icmp: 30,
    };

    /// Seconds a flow lives after its last packet, given both directions.
    /// A TCP flow is established only once its reply direction has said
    /// something: a bare ACK from one side (anyone can send one) would
    /// otherwise hold an entry for six hours.
    pub const fn lifetime(&self, proto: u8, out: TcpState, back: TcpState) -> u64 {
        let state = if (out as u8) > (back as u8) {
            out
        } else {
            back
        };
        let answered = !matches!(back, TcpState::None);
        match (proto, state) {
            (PROTO_TCP, TcpState::Rst) => self.tcp_rst,
            (PROTO_TCP, TcpState::Fin) => self.tcp_fin,
            (PROTO_TCP, TcpState::Established) if answered => self.tcp_established,
            (PROTO_TCP, _) => self.tcp_syn,
            (PROTO_ICMP | PROTO_ICMPV6, _) => self.icmp,
            _ => self.udp,
        }
    }

    /// Whether the flow whose two entries are `out` and `back` is dead at
    /// `now` (nanoseconds on the kernel's monotonic clock).
    pub const fn expired<A: TrackedAddr>(
        &self,
        proto: u8,
        out: &FlowNat<A>,
        back: &FlowNat<A>,
        now: u64,
    ) -> bool {
        let last = if out.last_seen > back.last_seen {
            out.last_seen
        } else {
            back.last_seen
        };
        self.expired_since(
            proto,
            TcpState::from_u8(out.state),
            TcpState::from_u8(back.state),
            last,
            now,
        )
    }

    /// Whether a flow whose directions said `out` and `back`, and whose
    /// last packet either way was at `last`, is dead at `now`.
    pub const fn expired_since(
        &self,
        proto: u8,
        out: TcpState,
        back: TcpState,
        last: u64,
        now: u64,
    ) -> bool {
        now.saturating_sub(last) > self.lifetime(proto, out, back) * 1_000_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4::PROTO_UDP;

    #[test]
    fn tcp_states_follow_the_flags() {
        use TcpState::*;
        assert_eq!(next_tcp_state(None, TCP_SYN), Syn);
        assert_eq!(next_tcp_state(Syn, TCP_SYN | TCP_ACK), Established);
        assert_eq!(next_tcp_state(Syn, TCP_ACK), Established);
        assert_eq!(next_tcp_state(Established, TCP_SYN), Established);
        assert_eq!(next_tcp_state(Established, TCP_FIN | TCP_ACK), Fin);
        assert_eq!(next_tcp_state(Fin, TCP_ACK), Fin);
        assert_eq!(next_tcp_state(Fin, TCP_RST), Rst);
        assert_eq!(next_tcp_state(Rst, TCP_FIN), Rst);
        assert_eq!(next_tcp_state(Established, TCP_RST | TCP_ACK), Rst);
        // A port reused after the end: a new connection.
        assert_eq!(next_tcp_state(Fin, TCP_SYN), Syn);
        assert_eq!(next_tcp_state(Fin, TCP_SYN | TCP_ACK), Established);
        assert_eq!(next_tcp_state(Rst, TCP_SYN), Syn);
        assert_eq!(next_tcp_state(Fin, TCP_SYN | TCP_FIN), Fin);
    }

    #[test]
    fn a_connection_is_over_once_both_sides_fin_or_one_resets() {
        use TcpState::*;
        assert!(tcp_closed(PROTO_TCP, Fin, Fin));
        assert!(tcp_closed(PROTO_TCP, Established, Rst));
        assert!(tcp_closed(PROTO_TCP, Rst, None));
        assert!(!tcp_closed(PROTO_TCP, Fin, Established), "half closed");
        assert!(!tcp_closed(PROTO_TCP, Syn, Fin), "reopened");
        assert!(!tcp_closed(PROTO_UDP, Fin, Fin));
    }

    #[test]
    fn the_reply_key_mirrors_the_masqueraded_flow() {
        let [a, b, masq] = [1, 2, 9].map(|last| Be32::from_bytes([10, 0, 0, last]));
        let out = FlowKey::new(a, b, 40000, 80, PROTO_TCP, DIR_OUT);
        let nat = FlowNat {
            addr: masq,
            port: 1234,
            ..FlowNat::default()
        };
        let back = reply_key(&out, &nat);
        assert_eq!(
            (back.saddr, back.daddr, back.sport, back.dport),
            (b, masq, 80, 1234)
        );
        assert_eq!(back.dir, DIR_IN);
    }

    #[test]
    fn a_flow_expires_after_the_lifetime_of_its_most_final_state() {
        let t = Timeouts::DEFAULT;
        let at = |secs: u64, state: TcpState| FlowNat::<Be32> {
            last_seen: secs * 1_000_000_000,
            state: state as u8,
            ..FlowNat::default()
        };
        let s = 1_000_000_000;
        // A SYN never answered: 60 s from the SYN.
        let (out, back) = (at(100, TcpState::Syn), at(0, TcpState::None));
        assert!(!t.expired(PROTO_TCP, &out, &back, 160 * s));
        assert!(t.expired(PROTO_TCP, &out, &back, 161 * s));
        // A bare ACK never answered, as a flood from outside sends: the
        // same 60 s, not the six hours of an established flow.
        let (out, back) = (at(100, TcpState::Established), at(0, TcpState::None));
        assert!(t.expired(PROTO_TCP, &out, &back, 161 * s));
        // The later of the two directions counts.
        let (out, back) = (
            at(100, TcpState::Established),
            at(200, TcpState::Established),
        );
        assert!(!t.expired(PROTO_TCP, &out, &back, (200 + 21600) * s));
        // A FIN on either side shortens it to 10 s, a RST to 5 s.
        let back = at(200, TcpState::Fin);
        assert!(t.expired(PROTO_TCP, &out, &back, 211 * s));
        let back = at(200, TcpState::Rst);
        assert!(t.expired(PROTO_TCP, &out, &back, 206 * s));
        assert!(!t.expired(PROTO_TCP, &out, &back, 205 * s));
        // UDP and ICMP by protocol.
        let (out, back) = (at(0, TcpState::None), at(0, TcpState::None));
        assert!(!t.expired(PROTO_UDP, &out, &back, 60 * s));
        assert!(t.expired(PROTO_UDP, &out, &back, 61 * s));
        assert!(t.expired(PROTO_ICMP, &out, &back, 31 * s));
        assert!(t.expired(PROTO_ICMPV6, &out, &back, 31 * s));
    }
}
