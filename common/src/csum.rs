//! Incremental Internet checksum updates (RFC 1624), for fields the kernel
//! helpers cannot reach: the headers quoted inside an ICMP error; and the
//! full checksum (RFC 1071), which userspace and every test use as the one
//! oracle.
//!
//! Words are taken as they sit in memory; the one's-complement sum does
//! not depend on byte order as long as every word uses the same one.

use crate::wire::Be16;

/// Folds a 32-bit one's-complement accumulator to 16 bits.
#[inline(always)]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// `check` after a 16-bit word of the covered data changed from `old` to `new`.
#[inline(always)]
pub const fn replace2(check: u16, old: u16, new: u16) -> u16 {
    // HC' = ~(~HC + ~m + m')
    !fold(!check as u32 + !old as u32 + new as u32)
}

/// `check` after a 32-bit word of the covered data changed from `old` to `new`.
#[inline(always)]
pub const fn replace4(check: u16, old: u32, new: u32) -> u16 {
    let sum = !check as u32 + (!old & 0xffff) + (!old >> 16) + (new & 0xffff) + (new >> 16);
    !fold(sum)
}

/// The Internet checksum of `data` (RFC 1071), the plain way, a word at a
/// time: what a checksum field over `data` must hold. Over data that
/// includes a correct checksum field it is zero.
pub fn checksum(data: &[u8]) -> Be16 {
    checksum_of(&[data])
}

/// The checksum of a TCP or UDP `segment` from `src` to `dst`, over the
/// IPv4 pseudo-header (RFC 793, RFC 768) and the segment. Zero when the
/// segment's own checksum field is right.
pub fn ipv4_l4_checksum(src: [u8; 4], dst: [u8; 4], proto: u8, segment: &[u8]) -> Be16 {
    let len = (segment.len() as u16).to_be_bytes();
    let pseudo = [
        src[0], src[1], src[2], src[3], dst[0], dst[1], dst[2], dst[3], 0, proto, len[0], len[1],
    ];
    checksum_of(&[&pseudo, segment])
}

/// The checksum of an upper-layer `segment` (TCP, UDP, ICMPv6) from `src`
/// to `dst`, over the IPv6 pseudo-header (RFC 8200, 8.1) and the segment.
/// Zero when the segment's own checksum field is right.
pub fn ipv6_l4_checksum(src: [u8; 16], dst: [u8; 16], proto: u8, segment: &[u8]) -> Be16 {
    let len = (segment.len() as u32).to_be_bytes();
    let tail = [len[0], len[1], len[2], len[3], 0, 0, 0, proto];
    checksum_of(&[&src, &dst, &tail, segment])
}

/// The checksum of `parts` taken as one run of bytes: every part but the
/// last must have an even length.
fn checksum_of(parts: &[&[u8]]) -> Be16 {
    let mut sum = 0u32;
    for pair in parts.iter().flat_map(|part| part.chunks(2)) {
        let word = [pair[0], *pair.get(1).unwrap_or(&0)];
        // Folded as it goes, so no length overflows it.
        sum = (sum & 0xffff) + (sum >> 16) + u32::from(u16::from_be_bytes(word));
    }
    Be16::from_host(!fold(sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(data: &[u8]) -> u16 {
        checksum(data).to_bits()
    }

    #[test]
    fn the_full_checksum_is_rfc_1071s() {
        // RFC 1071's own example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), Be16::from_host(!0xddf2));
        // A captured IPv4 header (192.168.0.1 → 192.168.0.199, UDP): with
        // its checksum b861 in place it sums to zero.
        let header = [
            0x45, 0, 0, 0x73, 0, 0, 0x40, 0, 0x40, 0x11, 0xb8, 0x61, 192, 168, 0, 1, 192, 168, 0,
            0xc7,
        ];
        let mut blank = header;
        blank[10..12].fill(0);
        assert_eq!(checksum(&blank).bytes(), [header[10], header[11]]);
        assert_eq!(checksum(&header), Be16::ZERO);
        // An odd length pads with a zero byte.
        assert_eq!(checksum(&[0xab]), checksum(&[0xab, 0]));
    }

    #[test]
    fn the_pseudo_header_counts_in_a_segments_checksum() {
        // A UDP datagram 10.0.0.1:1000 → 10.0.0.2:2000 carrying "hi",
        // with its checksum field 0: the function gives the field's value,
        // and once it is in place, zero.
        let (src, dst) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let mut udp = [0x03, 0xe8, 0x07, 0xd0, 0, 10, 0, 0, b'h', b'i'];
        let field = ipv4_l4_checksum(src, dst, 17, &udp);
        let mut flat = [0u8; 22];
        flat[..12].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 10]);
        flat[12..].copy_from_slice(&udp);
        assert_eq!(field, checksum(&flat));
        udp[6..8].copy_from_slice(&field.bytes());
        assert_eq!(ipv4_l4_checksum(src, dst, 17, &udp), Be16::ZERO);
        assert_ne!(ipv4_l4_checksum(src, dst, 6, &udp), Be16::ZERO);
    }

    #[test]
    fn replace4_matches_full_recomputation() {
        let mut data = [
            0x45u8, 0, 0, 84, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0, 10, 244, 0, 5, 10, 0, 0, 5,
        ];
        let check = full(&data);
        let old = u32::from_ne_bytes([10, 244, 0, 5]);
        let new = u32::from_ne_bytes([10, 0, 40, 5]);
        data[12..16].copy_from_slice(&new.to_ne_bytes());
        assert_eq!(replace4(check, old, new), full(&data));
    }

    #[test]
    fn replace2_matches_full_recomputation() {
        let mut data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let check = full(&data);
        let old = u16::from_ne_bytes([3, 4]);
        let new = u16::from_ne_bytes([0xfe, 0xff]);
        data[2..4].copy_from_slice(&new.to_ne_bytes());
        assert_eq!(replace2(check, old, new), full(&data));
    }

    #[test]
    fn replace_many_random_words() {
        // A deterministic LCG keeps the test reproducible without a rand dependency.
        let mut seed = 0x1234_5678u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed
        };
        for _ in 0..10_000 {
            let mut data = [0u8; 16];
            for chunk in data.chunks_mut(4) {
                chunk.copy_from_slice(&next().to_ne_bytes());
            }
            let check = full(&data);
            let old = u32::from_ne_bytes(data[4..8].try_into().unwrap());
            let new = next();
            data[4..8].copy_from_slice(&new.to_ne_bytes());
            let got = replace4(check, old, new);
            // 0x0000 and 0xffff are the same one's-complement value.
            let want = full(&data);
            assert!(got == want || (got ^ want) == 0xffff && (got == 0 || want == 0));
        }
    }
}
