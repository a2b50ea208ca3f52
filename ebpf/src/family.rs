//! docs/design.md#dual-stack: the two address families the NAT serves.
//! What differs between them (the header and its parser, where the
//! addresses sit, how a write keeps the checksums, the peer tables) is
//! here, behind [`Family`]; the masquerade's tables are behind
//! `conntrack::Tables`. The NAT is one code, compiled once for each.

use aya_ebpf::programs::TcContext;
use isthmus_common::{
    ipv4::{self, PROTO_ICMP},
    ipv6::{self, ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST, PROTO_ICMPV6},
    nat::{CONNCHECK_ADDR, PeerNat},
    wire::{Address, Be32, Be128},
};

use crate::{
    conntrack,
    csum::{self, RewriteFailed},
    isolation, maps,
    parse::{
        self, ETH_P_IP, ETH_P_IPV6, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IcmpError, Ip, Malformed,
        Parsed, Reading,
    },
};

/// One address family, as the NAT sees it.
pub trait Family {
    /// Its addresses, which name their masquerade and isolation tables.
    type Addr: Address + conntrack::Tables + isolation::Tables;
    /// Whether it is IPv6: its programs go on in arrays of their own.
    const IPV6: bool;
    /// `skb->protocol` of its packets.
    const PROTOCOL: u32;
    /// Offset of the source address in its header.
    const SRC: usize;
    /// Offset of the destination address in its header.
    const DST: usize;
    /// Its ICMP's protocol number.
    const ICMP: u8;
    /// Its ICMP echo request's type.
    const ECHO_REQUEST: u8;
    /// Its ICMP echo reply's type.
    const ECHO_REPLY: u8;

    /// Parses the packet at `off`, as `reading` says.
    fn parse(
        ctx: &TcContext,
        off: usize,
        reading: Reading,
    ) -> Result<Parsed<Self::Addr>, Malformed>;
    /// The address at `field` ([`Family::SRC`] or [`Family::DST`]) of the
    /// packet at `off`, read alone: before the packet is parsed, or when it
    /// cannot be.
    fn address(ctx: &TcContext, off: usize, field: usize) -> Option<Self::Addr>;
    /// The peer whose networks, as we see them, hold `addr`.
    fn peer(addr: Self::Addr) -> Option<&'static PeerNat<Self::Addr>>;
    /// The networks of this family of the Liqo v1 peer that the tunnel
    /// device `ifindex` carries alone.
    fn peer_of_device(ifindex: u32) -> Option<&'static PeerNat<Self::Addr>>;
    /// The endpoint that peer `peer_id` reaches at `external`.
    fn endpoint_of(peer_id: u32, external: Self::Addr) -> Option<Self::Addr>;
    /// The externalIP under which peer `peer_id` knows `endpoint`.
    fn external_of(peer_id: u32, endpoint: Self::Addr) -> Option<Self::Addr>;
    /// Whether `addr` is one of the cluster's nodes' addresses.
    fn is_node(addr: Self::Addr) -> bool;
    /// Whether `addr` is the conncheck's, which answers on every gateway.
    fn is_conncheck(addr: Self::Addr) -> bool;
    /// The largest MSS a SYN may advertise, when an IPv4 one may advertise
    /// `ipv4`: the tunnel's MTU less this family's headers.
    fn mss(ipv4: u16) -> u16;
    /// Writes `new` over the address at `field` of `hdr`, keeping every
    /// checksum that covers it.
    fn set_addr(
        ctx: &TcContext,
        hdr: &Ip<Self::Addr>,
        field: usize,
        old: Self::Addr,
        new: Self::Addr,
    ) -> Result<(), RewriteFailed>;
    /// Writes `new` over the address at `field` of the header `err` quotes.
    fn set_quoted_addr(
        ctx: &TcContext,
        err: &IcmpError<Self::Addr>,
        field: usize,
        old: Self::Addr,
        new: Self::Addr,
    ) -> Result<(), RewriteFailed>;
}

/// IPv4.
pub struct V4;

/// IPv6.
pub struct V6;

impl Family for V4 {
    type Addr = Be32;
    const IPV6: bool = false;
    const PROTOCOL: u32 = ETH_P_IP;
    const SRC: usize = ipv4::SRC;
    const DST: usize = ipv4::DST;
    const ICMP: u8 = PROTO_ICMP;
    const ECHO_REQUEST: u8 = ICMP_ECHO_REQUEST;
    const ECHO_REPLY: u8 = ICMP_ECHO_REPLY;

    #[inline(always)]
    fn parse(ctx: &TcContext, off: usize, reading: Reading) -> Result<Parsed<Be32>, Malformed> {
        match reading {
            Reading::Either => parse::ipv4::any_packet(ctx, off).map(Parsed::Packet),
            _ => parse::ipv4::packet(ctx, off, reading == Reading::IcmpError),
        }
    }

    #[inline(always)]
    fn address(ctx: &TcContext, off: usize, field: usize) -> Option<Be32> {
        ctx.load::<u32>(off + field).ok().map(Be32::from_bits)
    }

    #[inline(always)]
    fn peer(addr: Be32) -> Option<&'static PeerNat> {
        maps::peer(addr)
    }

    #[inline(always)]
    fn peer_of_device(ifindex: u32) -> Option<&'static PeerNat> {
        maps::peer_of_device(ifindex)
    }

    #[inline(always)]
    fn endpoint_of(peer_id: u32, external: Be32) -> Option<Be32> {
        maps::endpoint_of(peer_id, external)
    }

    #[inline(always)]
    fn external_of(peer_id: u32, endpoint: Be32) -> Option<Be32> {
        maps::external_of(peer_id, endpoint)
    }

    #[inline(always)]
    fn is_node(addr: Be32) -> bool {
        maps::is_node(addr)
    }

    #[inline(always)]
    fn is_conncheck(addr: Be32) -> bool {
        addr == CONNCHECK_ADDR
    }

    #[inline(always)]
    fn mss(ipv4: u16) -> u16 {
        ipv4
    }

    #[inline(always)]
    fn set_addr(
        ctx: &TcContext,
        hdr: &Ip<Be32>,
        field: usize,
        old: Be32,
        new: Be32,
    ) -> Result<(), RewriteFailed> {
        csum::set_addr(ctx, hdr, field, old, new)
    }

    #[inline(always)]
    fn set_quoted_addr(
        ctx: &TcContext,
        err: &IcmpError<Be32>,
        field: usize,
        old: Be32,
        new: Be32,
    ) -> Result<(), RewriteFailed> {
        csum::set_quoted_addr(ctx, err, field, old, new)
    }
}

impl Family for V6 {
    type Addr = Be128;
    const IPV6: bool = true;
    const PROTOCOL: u32 = ETH_P_IPV6;
    const SRC: usize = ipv6::SRC;
    const DST: usize = ipv6::DST;
    const ICMP: u8 = PROTO_ICMPV6;
    const ECHO_REQUEST: u8 = ICMPV6_ECHO_REQUEST;
    const ECHO_REPLY: u8 = ICMPV6_ECHO_REPLY;

    #[inline(always)]
    fn parse(ctx: &TcContext, off: usize, reading: Reading) -> Result<Parsed<Be128>, Malformed> {
        parse::ipv6::packet(ctx, off, reading)
    }

    #[inline(always)]
    fn address(ctx: &TcContext, off: usize, field: usize) -> Option<Be128> {
        parse::ipv6::address(ctx, off, field)
    }

    #[inline(always)]
    fn peer(addr: Be128) -> Option<&'static PeerNat<Be128>> {
        maps::peer6(addr)
    }

    #[inline(always)]
    fn peer_of_device(ifindex: u32) -> Option<&'static PeerNat<Be128>> {
        maps::peer6_of_device(ifindex)
    }

    #[inline(always)]
    fn endpoint_of(peer_id: u32, external: Be128) -> Option<Be128> {
        maps::endpoint6_of(peer_id, external)
    }

    #[inline(always)]
    fn external_of(peer_id: u32, endpoint: Be128) -> Option<Be128> {
        maps::external6_of(peer_id, endpoint)
    }

    #[inline(always)]
    fn is_node(addr: Be128) -> bool {
        maps::is_node6(addr)
    }

    #[inline(always)]
    fn is_conncheck(_: Be128) -> bool {
        false
    }

    #[inline(always)]
    fn mss(ipv4: u16) -> u16 {
        // The IPv6 header is 20 bytes longer than IPv4's.
        ipv4.saturating_sub(20)
    }

    #[inline(always)]
    fn set_addr(
        ctx: &TcContext,
        hdr: &Ip<Be128>,
        field: usize,
        old: Be128,
        new: Be128,
    ) -> Result<(), RewriteFailed> {
        csum::set_addr6(ctx, hdr, field, old, new)
    }

    #[inline(always)]
    fn set_quoted_addr(
        ctx: &TcContext,
        err: &IcmpError<Be128>,
        field: usize,
        old: Be128,
        new: Be128,
    ) -> Result<(), RewriteFailed> {
        csum::set_quoted_addr6(ctx, err, field, old, new)
    }
}
