//! The IPv4 header, read one way by every program: the NAT's parser, the
//! overlay's forwarding and decapsulation, and the tunnel port's guard.
//!
//! [`Header`] is a view over the fixed 20 bytes that a program has already
//! bounds-checked against the packet; it reads fields, never the packet.

use crate::wire::{Be16, Be32};

/// Length of a header without options.
pub const MIN_HLEN: usize = 20;
/// Offset of the type of service.
pub const TOS: usize = 1;
/// Offset of the total length.
pub const TOT_LEN: usize = 2;
/// Offset of the identification.
pub const ID: usize = 4;
/// Offset of the flags and fragment offset.
pub const FRAG: usize = 6;
/// Offset of the time to live.
pub const TTL: usize = 8;
/// Offset of the protocol.
pub const PROTO: usize = 9;
/// Offset of the header checksum.
pub const CHECK: usize = 10;
/// Offset of the source address.
pub const SRC: usize = 12;
/// Offset of the destination address.
pub const DST: usize = 16;

/// The "more fragments" flag, in the flags and fragment offset field.
pub const MF: u16 = 0x2000;
/// The fragment offset alone, in that field.
pub const OFFSET: u16 = 0x1fff;

/// IP protocol numbers the programs handle.
pub const PROTO_ICMP: u8 = 1;
/// TCP.
pub const PROTO_TCP: u8 = 6;
/// UDP.
pub const PROTO_UDP: u8 = 17;
/// SCTP, which a Service's port may name.
pub const PROTO_SCTP: u8 = 132;

/// The first 20 bytes of an IPv4 header.
#[derive(Clone, Copy)]
pub struct Header<'a>(pub &'a [u8; MIN_HLEN]);

impl Header<'_> {
    /// Whether it says IPv4 and a length that holds the fixed part.
    #[inline(always)]
    pub const fn is_valid(&self) -> bool {
        self.0[0] >> 4 == 4 && self.header_len() >= MIN_HLEN
    }

    /// The header's length with options (IHL × 4).
    #[inline(always)]
    pub const fn header_len(&self) -> usize {
        ((self.0[0] & 0x0f) as usize) * 4
    }

    /// The header has no options.
    #[inline(always)]
    pub const fn is_minimal(&self) -> bool {
        self.0[0] == 0x45
    }

    /// The type of service.
    #[inline(always)]
    pub const fn tos(&self) -> u8 {
        self.0[TOS]
    }

    /// The datagram's total length, header included.
    #[inline(always)]
    pub const fn total_len(&self) -> u16 {
        u16::from_be_bytes([self.0[TOT_LEN], self.0[TOT_LEN + 1]])
    }

    /// The identification all fragments of a datagram share.
    #[inline(always)]
    pub const fn id(&self) -> Be16 {
        Be16::from_bytes([self.0[ID], self.0[ID + 1]])
    }

    #[allow(
        clippy::trivially_copy_pass_by_ref,
        reason = "the receiver of every getter of the header, as the verifier has seen them"
    )]
    const fn frag(&self) -> u16 {
        u16::from_be_bytes([self.0[FRAG], self.0[FRAG + 1]])
    }

    /// The datagram is in fragments and this is one of them.
    #[inline(always)]
    pub const fn is_fragment(&self) -> bool {
        self.frag() & (MF | OFFSET) != 0
    }

    /// Not a later fragment: the packet starts its datagram, and carries
    /// the L4 header if there is one.
    #[inline(always)]
    pub const fn is_first_fragment(&self) -> bool {
        self.frag() & OFFSET == 0
    }

    /// The time to live.
    #[inline(always)]
    pub const fn ttl(&self) -> u8 {
        self.0[TTL]
    }

    /// The L4 protocol.
    #[inline(always)]
    pub const fn proto(&self) -> u8 {
        self.0[PROTO]
    }

    /// The source address.
    #[inline(always)]
    pub const fn src(&self) -> Be32 {
        self.addr(SRC)
    }

    /// The destination address.
    #[inline(always)]
    pub const fn dst(&self) -> Be32 {
        self.addr(DST)
    }

    #[allow(
        clippy::trivially_copy_pass_by_ref,
        reason = "the receiver of every getter of the header, as the verifier has seen them"
    )]
    const fn addr(&self, at: usize) -> Be32 {
        Be32::from_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10.244.0.5 → 10.0.0.5, UDP, identification 0x1234, TTL 64.
    const UDP: [u8; MIN_HLEN] = [
        0x45, 0x10, 0x05, 0xdc, 0x12, 0x34, 0x00, 0x00, 64, 17, 0, 0, 10, 244, 0, 5, 10, 0, 0, 5,
    ];

    #[test]
    fn every_field_is_read_where_rfc_791_puts_it() {
        let h = Header(&UDP);
        assert!(h.is_valid() && h.is_minimal());
        assert_eq!(h.header_len(), 20);
        assert_eq!(h.tos(), 0x10);
        assert_eq!(h.total_len(), 1500);
        assert_eq!(h.id().to_host(), 0x1234);
        assert_eq!((h.ttl(), h.proto()), (64, PROTO_UDP));
        assert_eq!(h.src().bytes(), [10, 244, 0, 5]);
        assert_eq!(h.dst().bytes(), [10, 0, 0, 5]);
        assert!(!h.is_fragment() && h.is_first_fragment());
    }

    #[test]
    fn fragments_are_told_apart() {
        let mut first = UDP;
        first[FRAG] = 0x20; // MF, offset 0
        let mut later = UDP;
        later[FRAG..FRAG + 2].copy_from_slice(&[0x00, 0xb9]); // last, offset 185
        let mut dont_fragment = UDP;
        dont_fragment[FRAG] = 0x40;
        let first = Header(&first);
        assert!(first.is_fragment() && first.is_first_fragment());
        let later = Header(&later);
        assert!(later.is_fragment() && !later.is_first_fragment());
        assert!(!Header(&dont_fragment).is_fragment());
    }

    #[test]
    fn a_header_that_is_not_ipv4_or_too_short_is_invalid() {
        let mut options = UDP;
        options[0] = 0x46;
        assert!(Header(&options).is_valid() && !Header(&options).is_minimal());
        assert_eq!(Header(&options).header_len(), 24);
        let mut short = UDP;
        short[0] = 0x44;
        assert!(!Header(&short).is_valid());
        let mut v6 = UDP;
        v6[0] = 0x65;
        assert!(!Header(&v6).is_valid());
    }
}
