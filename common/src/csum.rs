//! Incremental Internet checksum updates (RFC 1624), for fields the kernel
//! helpers cannot reach: the headers quoted inside an ICMP error.
//!
//! Values are in wire order; the one's-complement sum does not depend on
//! byte order as long as every word uses the same one.

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Full RFC 1071 checksum of `data`, in wire order.
    fn full(data: &[u8]) -> u16 {
        let mut sum = 0u32;
        for pair in data.chunks(2) {
            let word = [pair[0], *pair.get(1).unwrap_or(&0)];
            sum += u16::from_ne_bytes(word) as u32;
        }
        !fold(sum)
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
