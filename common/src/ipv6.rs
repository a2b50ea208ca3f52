//! The IPv6 header and its extension headers, read one way by every
//! program and by the agent's tests: the NAT's parser walks the chain with
//! [`Step`], one header at a time, within a bound.
//!
//! [`Header`] is a view over the fixed 40 bytes that a program has already
//! bounds-checked against the packet; it reads fields, never the packet.

use crate::{
    counters::DropReason,
    wire::{Be32, Be128},
};

/// Length of the fixed header.
pub const HLEN: usize = 40;
/// Offset of the payload length.
pub const PAYLOAD_LEN: usize = 4;
/// Offset of the next header.
pub const NEXT_HEADER: usize = 6;
/// Offset of the hop limit.
pub const HOP_LIMIT: usize = 7;
/// Offset of the source address.
pub const SRC: usize = 8;
/// Offset of the destination address.
pub const DST: usize = 24;

/// Hop-by-hop options.
pub const HOP_BY_HOP: u8 = 0;
/// Routing header.
pub const ROUTING: u8 = 43;
/// Fragment header.
pub const FRAGMENT: u8 = 44;
/// Encapsulating security payload: what follows is encrypted.
pub const ESP: u8 = 50;
/// Authentication header.
pub const AUTH: u8 = 51;
/// No next header.
pub const NO_NEXT: u8 = 59;
/// Destination options.
pub const DEST_OPTIONS: u8 = 60;
/// Mobility header.
pub const MOBILITY: u8 = 135;
/// Host identity protocol.
pub const HIP: u8 = 139;
/// Shim6.
pub const SHIM6: u8 = 140;

/// ICMPv6, whose checksum covers the pseudo-header.
pub const PROTO_ICMPV6: u8 = 58;
/// ICMPv6 echo request.
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
/// ICMPv6 echo reply's type.
pub const ICMPV6_ECHO_REPLY: u8 = 129;
/// ICMPv6 Packet Too Big, which must reach the sender: no IPv6 router
/// fragments.
pub const ICMPV6_PACKET_TOO_BIG: u8 = 2;

/// Most extension headers the NAT walks before the upper-layer header: a
/// packet with more is dropped and counted. RFC 8200 orders at most six
/// kinds, each once (destination options twice); more is no real traffic.
pub const MAX_EXTENSION_HEADERS: usize = 8;

/// Length of the fragment header, and the least any extension header
/// takes.
pub const FRAGMENT_HLEN: usize = 8;
/// The bytes of extension headers the NAT reads before the upper-layer
/// header: a fragment header and a few options, or a routing header of a
/// few segments.
pub const CHAIN_MAX: usize = 256;
/// The fragment offset, in its header's third and fourth bytes.
const FRAGMENT_OFFSET: u16 = 0xfff8;
/// "More fragments", in the same bytes.
const MORE_FRAGMENTS: u16 = 0x0001;

/// The fixed 40 bytes of an IPv6 header.
#[derive(Clone, Copy)]
pub struct Header<'a>(pub &'a [u8; HLEN]);

impl Header<'_> {
    /// Whether it says IPv6.
    #[inline(always)]
    pub const fn is_valid(&self) -> bool {
        self.0[0] >> 4 == 6
    }

    /// The length of what follows the fixed header.
    #[inline(always)]
    pub const fn payload_len(&self) -> u16 {
        u16::from_be_bytes([self.0[PAYLOAD_LEN], self.0[PAYLOAD_LEN + 1]])
    }

    /// The first header after the fixed one.
    #[inline(always)]
    pub const fn next_header(&self) -> u8 {
        self.0[NEXT_HEADER]
    }

    /// The hop limit.
    #[inline(always)]
    pub const fn hop_limit(&self) -> u8 {
        self.0[HOP_LIMIT]
    }

    /// The source address.
    #[inline(always)]
    pub fn src(&self) -> Be128 {
        address(self.0, SRC)
    }

    /// The destination address.
    #[inline(always)]
    pub fn dst(&self) -> Be128 {
        address(self.0, DST)
    }
}

/// The address at `at`, read a word at a time: no copy of its bytes on the
/// programs' small stack.
#[inline(always)]
fn address(header: &[u8; HLEN], at: usize) -> Be128 {
    let word = |i: usize| {
        let at = at + 4 * i;
        Be32::from_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    Be128::from_words([word(0), word(1), word(2), word(3)])
}

/// What a header of the chain is, as its kind (the previous header's
/// next-header field) says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An extension header whose length is counted in 8-byte units, less
    /// one: options, routing, mobility, HIP, shim6.
    Options,
    /// The authentication header, counted in 4-byte units, less two
    /// (RFC 4302).
    Auth,
    /// A fragment header (8 bytes).
    Fragment,
    /// The upper-layer header, or what cannot be walked past (ESP, no next
    /// header): the chain ends.
    Upper,
}

impl Step {
    /// The step of a header of kind `kind`.
    #[inline(always)]
    pub const fn of(kind: u8) -> Self {
        match kind {
            HOP_BY_HOP | ROUTING | DEST_OPTIONS | MOBILITY | HIP | SHIM6 => Step::Options,
            AUTH => Step::Auth,
            FRAGMENT => Step::Fragment,
            _ => Step::Upper,
        }
    }

    /// The length in bytes of a header of this step whose length field
    /// (its second byte) is `len`.
    #[inline(always)]
    pub const fn header_len(self, len: u8) -> usize {
        let len = len as usize;
        match self {
            Step::Options => (len + 1) * 8,
            Step::Auth => (len + 2) * 4,
            Step::Fragment => FRAGMENT_HLEN,
            Step::Upper => 0,
        }
    }
}

/// A fragment header's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentHeader {
    /// The header after it.
    pub next_header: u8,
    /// The offset of this fragment's data, in 8-byte units, as its bits.
    pub offset: u16,
    /// More fragments follow.
    pub more: bool,
    /// The identification all fragments of the datagram share, as its
    /// bits in memory.
    pub id: u32,
}

impl FragmentHeader {
    /// Reads a fragment header.
    #[inline(always)]
    pub const fn read(bytes: &[u8; FRAGMENT_HLEN]) -> Self {
        let field = u16::from_be_bytes([bytes[2], bytes[3]]);
        Self {
            next_header: bytes[0],
            offset: field & FRAGMENT_OFFSET,
            more: field & MORE_FRAGMENTS != 0,
            id: u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }

    /// Whether it starts its datagram: the upper-layer header is in it.
    #[inline(always)]
    pub const fn is_first(&self) -> bool {
        self.offset == 0
    }

    /// Whether the datagram is really in pieces: an atomic fragment
    /// (offset 0, no more) is whole (RFC 8021).
    #[inline(always)]
    pub const fn is_fragment(&self) -> bool {
        self.offset != 0 || self.more
    }
}

/// Where a packet stands in its datagram.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Not in fragments (an atomic fragment among them, RFC 8021).
    Whole = 0,
    /// The first of its fragments, which carries the upper-layer header.
    First = 1,
    /// A later fragment: data alone.
    Later = 2,
}

/// Where a chain of headers ends. Every field is set on every path: a
/// payload left unset, as an `Option`'s, is one LLVM may still copy, and
/// the verifier refuses to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The upper-layer protocol.
    pub proto: u8,
    /// Offset of the upper-layer header, or of a later fragment's data.
    pub l4: usize,
    /// Where the packet stands in its datagram.
    pub place: Place,
    /// The fragment header's identification, as its bits in memory, when
    /// it has one.
    pub id: u32,
}

impl Chain {
    /// The chain in two words, for a later stage of the NAT to read back
    /// with [`Chain::kept`] instead of walking it again: each walk is one
    /// path per chain's shape for the verifier, and a stage's every path
    /// after it is walked once per shape.
    #[inline(always)]
    pub const fn keep(&self) -> [u32; 2] {
        let l4 = self.l4 as u32 & 0xffff;
        [
            l4 | (self.proto as u32) << 16 | (self.place as u32) << 24,
            self.id,
        ]
    }

    /// The chain [`Chain::keep`] gave `words`, if they hold one whose
    /// upper-layer header is at most `max_l4` bytes in.
    #[inline(always)]
    pub const fn kept(words: [u32; 2], max_l4: usize) -> Option<Self> {
        let l4 = (words[0] & 0xffff) as usize;
        let place = match words[0] >> 24 {
            0 => Place::Whole,
            1 => Place::First,
            2 => Place::Later,
            _ => return None,
        };
        if l4 > max_l4 {
            return None;
        }
        Some(Self {
            proto: (words[0] >> 16) as u8,
            l4,
            place,
            id: words[1],
        })
    }
}

/// Why a walk stopped short of the upper-layer header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The chain is cut off, or not one chain.
    Cut,
    /// The NAT refuses the packet.
    Refused(DropReason),
}

/// Where a walk of the chain ended: at the upper-layer header, or short of
/// it, with `chain` then holding where it stopped. Every field is defined
/// however the walk ended. A `Result` would leave a chain undefined on its
/// error paths, which LLVM may still spill from a register never written
/// there, and the verifier refuses any read of such a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walked {
    /// The chain as walked.
    pub chain: Chain,
    /// Why the walk stopped short of the upper-layer header, if it did.
    pub stop: Option<Stop>,
}

impl Walked {
    /// The chain, or why there is none.
    pub fn result(self) -> Result<Chain, Stop> {
        match self.stop {
            Some(stop) => Err(stop),
            None => Ok(self.chain),
        }
    }
}

/// Walks the chain that starts with a header of kind `next` at `at`, up to
/// the upper-layer header, within `end`, reading each extension header's
/// first 8 bytes with `read`. At most [`MAX_EXTENSION_HEADERS`] headers
/// in at most [`CHAIN_MAX`] bytes: past either, the packet is refused. A
/// first fragment must hold the whole chain (RFC 7112).
#[inline(always)]
pub fn walk(
    next: u8,
    at: usize,
    end: usize,
    read: impl Fn(usize) -> Option<[u8; FRAGMENT_HLEN]>,
) -> Walked {
    let start = at;
    let mut chain = Chain {
        proto: next,
        l4: at,
        place: Place::Whole,
        id: 0,
    };
    let stopped = |chain, stop| Walked {
        chain,
        stop: Some(stop),
    };
    // One turn more than the headers allowed: the last finds the upper one.
    for _ in 0..=MAX_EXTENSION_HEADERS {
        let step = Step::of(chain.proto);
        if step == Step::Upper {
            return Walked { chain, stop: None };
        }
        if chain.l4 + FRAGMENT_HLEN > end {
            let stop = match chain.place {
                Place::First => Stop::Refused(DropReason::TinyFragment),
                _ => Stop::Cut,
            };
            return stopped(chain, stop);
        }
        let Some(bytes) = read(chain.l4) else {
            return stopped(chain, Stop::Cut);
        };
        if step == Step::Fragment {
            if chain.place != Place::Whole {
                return stopped(chain, Stop::Cut);
            }
            let header = FragmentHeader::read(&bytes);
            chain.id = header.id;
            chain.place = match (header.is_first(), header.is_fragment()) {
                (false, _) => Place::Later,
                (true, true) => Place::First,
                (true, false) => Place::Whole,
            };
            // What follows a later fragment's header is data.
            if chain.place == Place::Later {
                chain.proto = header.next_header;
                chain.l4 += FRAGMENT_HLEN;
                return Walked { chain, stop: None };
            }
        }
        chain.proto = bytes[0];
        chain.l4 += step.header_len(bytes[1]);
        if chain.l4 - start > CHAIN_MAX {
            break;
        }
    }
    stopped(chain, Stop::Refused(DropReason::ExtensionHeaders))
}

/// Whether an ICMPv6 message of `icmp_type` is an error, which quotes the
/// packet that caused it (types below 128, RFC 4443).
#[inline(always)]
pub const fn is_error(icmp_type: u8) -> bool {
    icmp_type < 128
}

#[cfg(test)]
mod tests {
    extern crate std;

    use core::net::Ipv6Addr;

    use super::*;

    /// `fd00:10:244::5` → `fd00:10::5`, TCP, payload 20, hop limit 64.
    fn tcp() -> [u8; HLEN] {
        let mut h = [0; HLEN];
        h[0] = 0x60;
        h[PAYLOAD_LEN + 1] = 20;
        h[NEXT_HEADER] = 6;
        h[HOP_LIMIT] = 64;
        let src: Ipv6Addr = "fd00:10:244::5".parse().unwrap();
        let dst: Ipv6Addr = "fd00:10::5".parse().unwrap();
        h[SRC..SRC + 16].copy_from_slice(&src.octets());
        h[DST..DST + 16].copy_from_slice(&dst.octets());
        h
    }

    #[test]
    fn every_field_is_read_where_rfc_8200_puts_it() {
        let bytes = tcp();
        let h = Header(&bytes);
        assert!(h.is_valid());
        assert_eq!(
            (h.payload_len(), h.next_header(), h.hop_limit()),
            (20, 6, 64)
        );
        assert_eq!(
            Ipv6Addr::from(h.src()),
            "fd00:10:244::5".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            Ipv6Addr::from(h.dst()),
            "fd00:10::5".parse::<Ipv6Addr>().unwrap()
        );
        let mut v4 = bytes;
        v4[0] = 0x45;
        assert!(!Header(&v4).is_valid());
    }

    #[test]
    fn each_extension_header_gives_its_length() {
        let len = |kind: u8, field: u8| Step::of(kind).header_len(field);
        assert_eq!(len(HOP_BY_HOP, 0), 8);
        assert_eq!(len(DEST_OPTIONS, 255), 2048);
        assert_eq!(len(ROUTING, 2), 24);
        assert_eq!(len(AUTH, 4), 24);
        assert_eq!(Step::of(FRAGMENT), Step::Fragment);
        assert_eq!(len(FRAGMENT, 0), FRAGMENT_HLEN);
        for upper in [6, 17, PROTO_ICMPV6, ESP, NO_NEXT, 4, 41] {
            assert_eq!(Step::of(upper), Step::Upper, "{upper}");
        }
    }

    #[test]
    fn a_fragment_header_says_whether_it_starts_its_datagram() {
        // UDP, offset 0, more; identification 0x01020304.
        let first = FragmentHeader::read(&[17, 0, 0x00, 0x01, 1, 2, 3, 4]);
        assert!(first.is_first() && first.is_fragment() && first.more);
        assert_eq!(first.next_header, 17);
        assert_eq!(first.id, u32::from_ne_bytes([1, 2, 3, 4]));
        // Offset 185 × 8, the last one.
        let later = FragmentHeader::read(&[17, 0, 0x05, 0xc8, 1, 2, 3, 4]);
        assert!(!later.is_first() && later.is_fragment() && !later.more);
        let atomic = FragmentHeader::read(&[17, 0, 0, 0, 1, 2, 3, 4]);
        assert!(atomic.is_first() && !atomic.is_fragment());
    }

    /// A chain of `kinds`, each an 8-byte extension header, then UDP.
    fn chain(kinds: &[u8]) -> std::vec::Vec<u8> {
        let mut bytes = std::vec::Vec::new();
        for (i, _) in kinds.iter().enumerate() {
            let next = kinds.get(i + 1).copied().unwrap_or(17);
            bytes.extend([next, 0, 0, 0, 0, 0, 0, 0]);
        }
        bytes.extend([0; 8]);
        bytes
    }

    fn walk_of(first: u8, bytes: &[u8]) -> Result<Chain, Stop> {
        walk(first, 0, bytes.len(), |at| {
            bytes.get(at..at + 8)?.try_into().ok()
        })
        .result()
    }

    #[test]
    fn the_walk_finds_the_upper_layer_within_its_bounds_and_refuses_past_them() {
        let eight = [DEST_OPTIONS; MAX_EXTENSION_HEADERS];
        let found = walk_of(DEST_OPTIONS, &chain(&eight)).unwrap();
        assert_eq!((found.proto, found.l4, found.place), (17, 64, Place::Whole));
        let nine = [DEST_OPTIONS; MAX_EXTENSION_HEADERS + 1];
        assert_eq!(
            walk_of(DEST_OPTIONS, &chain(&nine)),
            Err(Stop::Refused(DropReason::ExtensionHeaders))
        );
        // One header of 2,048 bytes: past the bytes walked.
        let mut long = chain(&[DEST_OPTIONS]);
        long[1] = 255;
        long.resize(2048 + 8, 0);
        assert_eq!(
            walk_of(DEST_OPTIONS, &long),
            Err(Stop::Refused(DropReason::ExtensionHeaders))
        );
        // Cut off mid-chain; a first fragment cut off is a tiny one.
        let cut = chain(&[DEST_OPTIONS, DEST_OPTIONS]);
        assert_eq!(walk_of(DEST_OPTIONS, &cut[..12]), Err(Stop::Cut));
        let mut first = chain(&[FRAGMENT, DEST_OPTIONS]);
        first[3] = 1; // offset 0, more fragments
        assert_eq!(
            walk_of(FRAGMENT, &first[..12]),
            Err(Stop::Refused(DropReason::TinyFragment))
        );
        // A later fragment ends the chain at its data.
        let mut later = chain(&[FRAGMENT]);
        later[2] = 0x05;
        let found = walk_of(FRAGMENT, &later).unwrap();
        assert_eq!((found.proto, found.l4, found.place), (17, 8, Place::Later));
    }

    #[test]
    fn icmpv6_errors_are_the_types_below_128() {
        assert!(is_error(ICMPV6_PACKET_TOO_BIG) && is_error(1) && is_error(4));
        assert!(!is_error(ICMPV6_ECHO_REQUEST) && !is_error(134));
    }

    #[test]
    fn a_kept_chain_reads_back_as_it_was_within_its_bound() {
        let chain = Chain {
            proto: 17,
            l4: 14 + HLEN + 8,
            place: Place::First,
            id: 0xdead_beef,
        };
        assert_eq!(
            Chain::kept(chain.keep(), 14 + HLEN + CHAIN_MAX),
            Some(chain)
        );
        assert_eq!(Chain::kept(chain.keep(), 14 + HLEN), None, "past the bound");
        let [w0, w1] = chain.keep();
        assert_eq!(
            Chain::kept([w0 | 3 << 24, w1], usize::MAX),
            None,
            "no such place"
        );
    }
}
