//! The TCP header fields the programs read: flags, and the MSS option that
//! the tunnel path clamps (Liqo v1 clamps by default): a SYN or SYN-ACK
//! crossing the tunnel advertises no larger segment than the tunnel
//! carries, so a path that filters ICMP (no PMTU discovery) still works.

/// FIN.
pub const FIN: u8 = 0x01;
/// SYN.
pub const SYN: u8 = 0x02;
/// RST.
pub const RST: u8 = 0x04;
/// ACK.
pub const ACK: u8 = 0x10;

/// Offset of the data offset (header length) byte in a TCP header.
pub const DATA_OFFSET: usize = 12;
/// Length of a TCP header without options.
pub const MIN_HEADER: usize = 20;
/// Longest options a TCP header holds.
pub const MAX_OPTIONS: usize = 40;
/// IPv4 and TCP headers without options: what the MTU holds besides a
/// segment.
pub const IPV4_TCP_HEADERS: u32 = 40;

const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;
const OPT_MSS_LEN: u8 = 4;

/// Where the MSS option's 16-bit value lies, counted from the start of the
/// options, in options `len` bytes long read by `byte` (offset from the
/// start of the options). None when there is none, or the options are
/// malformed (a length below 2, or running past the end).
#[inline(always)]
pub fn mss_value_offset(len: usize, byte: impl Fn(usize) -> Option<u8>) -> Option<usize> {
    let len = if len > MAX_OPTIONS { MAX_OPTIONS } else { len };
    let mut at = 0;
    // At most one step per byte: a bound the verifier sees.
    for _ in 0..MAX_OPTIONS {
        if at >= len {
            return None;
        }
        let kind = byte(at)?;
        if kind == OPT_END {
            return None;
        }
        if kind == OPT_NOP {
            at += 1;
            continue;
        }
        let opt_len = usize::from(byte(at + 1)?);
        if opt_len < 2 || at + opt_len > len {
            return None;
        }
        if kind == OPT_MSS && opt_len == usize::from(OPT_MSS_LEN) {
            return Some(at + 2);
        }
        at += opt_len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(options: &[u8]) -> Option<usize> {
        mss_value_offset(options.len(), |i| options.get(i).copied())
    }

    #[test]
    fn finds_the_mss_among_the_options_linux_and_others_send() {
        // Linux's SYN: MSS, SACK permitted, timestamps, NOP, window scale.
        let linux = [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        assert_eq!(find(&linux), Some(2));
        // NOPs first, the MSS last.
        assert_eq!(find(&[1, 1, 4, 2, 2, 4, 5, 0x78]), Some(6));
        // No MSS, an end of options before one, and no options at all.
        assert_eq!(find(&[1, 1, 4, 2]), None);
        assert_eq!(find(&[0, 0, 2, 4, 5, 0x78]), None);
        assert_eq!(find(&[]), None);
    }

    #[test]
    fn malformed_options_give_nothing_to_rewrite() {
        for bad in [
            &[2, 4, 5][..],         // truncated MSS
            &[4, 0, 2, 4, 5, 0x78], // a length of 0 would loop
            &[4, 1, 2, 4, 5, 0x78], // a length of 1 as well
            &[8, 10, 0, 0],         // runs past the end
            &[2, 3, 5, 0x78],       // an MSS of the wrong length
        ] {
            assert_eq!(find(bad), None, "{bad:?}");
        }
        // Forty NOPs: the walk ends, within its bound.
        assert_eq!(find(&[1; 40]), None);
    }
}
