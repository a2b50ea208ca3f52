//! Network byte order as a type.
//!
//! A [`Be32`] or [`Be16`] holds its bytes as they sit in the packet, in a
//! native integer, so the kernel programs copy header fields into map keys
//! with no byte swaps, and masks and prefixes work byte-wise. Only the
//! constructors and accessors say which order a number is in; the rest of
//! the code cannot mix the two up. A [`Be128`], an IPv6 address, is four
//! such words: the programs mask and compare it a word at a time.

use core::{
    fmt,
    hash::Hash,
    net::{Ipv4Addr, Ipv6Addr},
    ops::{BitAnd, BitOr, Not},
};

macro_rules! network_order {
    ($(#[$doc:meta])* $name:ident, $int:ty, $len:literal) => {
        $(#[$doc])*
        ///
        /// The one field's name is what `bpftool` shows in a map dump. Values
        /// order by their memory, as the kernel's hash keys do, not by number.
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name {
            network_order: $int,
        }

        impl $name {
            /// Zero, in either order.
            pub const ZERO: Self = Self { network_order: 0 };

            /// The value whose bytes, most significant first, are `bytes`.
            #[inline(always)]
            pub const fn from_bytes(bytes: [u8; $len]) -> Self {
                Self { network_order: <$int>::from_ne_bytes(bytes) }
            }

            /// Its bytes, most significant first: as on the wire.
            #[inline(always)]
            pub const fn bytes(self) -> [u8; $len] {
                self.network_order.to_ne_bytes()
            }

            /// The number `value`, given in the host's order.
            #[inline(always)]
            pub const fn from_host(value: $int) -> Self {
                Self { network_order: value.to_be() }
            }

            /// The number, in the host's order.
            #[inline(always)]
            pub const fn to_host(self) -> $int {
                <$int>::from_be(self.network_order)
            }

            /// The value whose memory holds `bits`: what a native load of
            /// the field from a packet gives.
            #[inline(always)]
            pub const fn from_bits(bits: $int) -> Self {
                Self { network_order: bits }
            }

            /// Its memory as a native integer: what a native store into a
            /// packet, or a kernel helper, takes.
            #[inline(always)]
            pub const fn to_bits(self) -> $int {
                self.network_order
            }

            /// Whether it is zero: an unset field.
            #[inline(always)]
            pub const fn is_zero(self) -> bool {
                self.network_order == 0
            }
        }

        impl BitAnd for $name {
            type Output = Self;
            #[inline(always)]
            fn bitand(self, rhs: Self) -> Self {
                Self::from_bits(self.network_order & rhs.network_order)
            }
        }

        impl BitOr for $name {
            type Output = Self;
            #[inline(always)]
            fn bitor(self, rhs: Self) -> Self {
                Self::from_bits(self.network_order | rhs.network_order)
            }
        }

        impl Not for $name {
            type Output = Self;
            #[inline(always)]
            fn not(self) -> Self {
                Self::from_bits(!self.network_order)
            }
        }
    };
}

network_order!(
    /// A 32-bit field in network byte order: an IPv4 address or netmask.
    Be32,
    u32,
    4
);

network_order!(
    /// A 16-bit field in network byte order: a port, an IPv4 identification.
    Be16,
    u16,
    2
);

impl Be32 {
    /// The netmask of a prefix length (0 to 32; longer counts as 32).
    #[inline(always)]
    pub const fn mask(prefix_len: u8) -> Self {
        let host = match prefix_len {
            0 => 0,
            len if len >= 32 => u32::MAX,
            len => u32::MAX << (32 - len as u32),
        };
        Self::from_host(host)
    }

    /// The address with every bit outside `mask` cleared: usable in `const`.
    #[inline(always)]
    #[must_use]
    pub const fn masked(self, mask: Be32) -> Self {
        Self::from_bits(self.to_bits() & mask.to_bits())
    }

    /// `map(ip, net)` of docs/design.md#prefix-remapping: the network bits of `net` under `mask`
    /// followed by the host bits of `self`.
    #[inline(always)]
    #[must_use]
    pub const fn remap(self, net: Be32, mask: Be32) -> Self {
        Self::from_bits((net.to_bits() & mask.to_bits()) | (self.to_bits() & !mask.to_bits()))
    }
}

/// An address of either family, as the NAT's prefix maths needs it: one
/// mechanism for both (docs/design.md#prefix-remapping).
pub trait Address: Copy + Default + Eq + Ord + Hash + fmt::Debug {
    /// Its length in bits: the longest prefix.
    const BITS: u8;

    /// The netmask of a prefix length (longer than [`Self::BITS`] counts
    /// as [`Self::BITS`]).
    fn mask(prefix_len: u8) -> Self;

    /// The address with every bit outside `mask` cleared.
    #[must_use]
    fn masked(self, mask: Self) -> Self;

    /// `map(ip, net)`: the network bits of `net` under `mask` followed by
    /// the host bits of `self`.
    #[must_use]
    fn remap(self, net: Self, mask: Self) -> Self;
}

impl Address for Be32 {
    const BITS: u8 = 32;

    #[inline(always)]
    fn mask(prefix_len: u8) -> Self {
        Be32::mask(prefix_len)
    }

    #[inline(always)]
    fn masked(self, mask: Self) -> Self {
        Be32::masked(self, mask)
    }

    #[inline(always)]
    fn remap(self, net: Self, mask: Self) -> Self {
        Be32::remap(self, net, mask)
    }
}

/// A 128-bit field in network byte order: an IPv6 address or netmask, as
/// four [`Be32`] words, most significant first.
///
/// The one field's name is what `bpftool` shows in a map dump.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Be128 {
    network_order: [Be32; 4],
}

impl Be128 {
    /// Zero.
    pub const ZERO: Self = Self {
        network_order: [Be32::ZERO; 4],
    };

    /// The address whose bytes, most significant first, are `bytes`.
    #[inline(always)]
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        let b = bytes;
        Self {
            network_order: [
                Be32::from_bytes([b[0], b[1], b[2], b[3]]),
                Be32::from_bytes([b[4], b[5], b[6], b[7]]),
                Be32::from_bytes([b[8], b[9], b[10], b[11]]),
                Be32::from_bytes([b[12], b[13], b[14], b[15]]),
            ],
        }
    }

    /// Its bytes, most significant first: as on the wire.
    pub fn bytes(self) -> [u8; 16] {
        let mut bytes = [0; 16];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(self.network_order) {
            chunk.copy_from_slice(&word.bytes());
        }
        bytes
    }

    /// The address whose memory holds `words`: what four native loads of
    /// the field from a packet give.
    #[inline(always)]
    pub const fn from_words(words: [Be32; 4]) -> Self {
        Self {
            network_order: words,
        }
    }

    /// Its four words, most significant first.
    #[inline(always)]
    pub const fn words(self) -> [Be32; 4] {
        self.network_order
    }

    /// Whether it is zero: an unset field.
    #[inline(always)]
    pub const fn is_zero(self) -> bool {
        let [a, b, c, d] = self.network_order;
        a.to_bits() | b.to_bits() | c.to_bits() | d.to_bits() == 0
    }

    #[inline(always)]
    fn each(self, other: Self, op: impl Fn(Be32, Be32) -> Be32) -> Self {
        let [x0, x1, x2, x3] = self.network_order;
        let [y0, y1, y2, y3] = other.network_order;
        Self::from_words([op(x0, y0), op(x1, y1), op(x2, y2), op(x3, y3)])
    }
}

impl Address for Be128 {
    const BITS: u8 = 128;

    #[inline(always)]
    fn mask(prefix_len: u8) -> Self {
        // Each word takes what is left of the prefix, up to its 32 bits.
        let word = |i: u8| Be32::mask(prefix_len.saturating_sub(32 * i));
        Self::from_words([word(0), word(1), word(2), word(3)])
    }

    #[inline(always)]
    fn masked(self, mask: Self) -> Self {
        self.each(mask, Be32::masked)
    }

    #[inline(always)]
    fn remap(self, net: Self, mask: Self) -> Self {
        let [n0, n1, n2, n3] = net.network_order;
        let [m0, m1, m2, m3] = mask.network_order;
        let [a0, a1, a2, a3] = self.network_order;
        Self::from_words([
            a0.remap(n0, m0),
            a1.remap(n1, m1),
            a2.remap(n2, m2),
            a3.remap(n3, m3),
        ])
    }
}

impl From<Ipv6Addr> for Be128 {
    fn from(addr: Ipv6Addr) -> Self {
        Self::from_bytes(addr.octets())
    }
}

impl From<Be128> for Ipv6Addr {
    fn from(addr: Be128) -> Self {
        Ipv6Addr::from(addr.bytes())
    }
}

impl fmt::Debug for Be128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(*self), f)
    }
}

impl From<Ipv4Addr> for Be32 {
    fn from(addr: Ipv4Addr) -> Self {
        Self::from_bytes(addr.octets())
    }
}

impl From<Be32> for Ipv4Addr {
    fn from(addr: Be32) -> Self {
        Ipv4Addr::from(addr.bytes())
    }
}

impl fmt::Debug for Be32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv4Addr::from(*self), f)
    }
}

impl fmt::Debug for Be16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_host(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_kept_as_on_the_wire() {
        let addr = Be32::from_bytes([10, 244, 0, 5]);
        assert_eq!(addr.bytes(), [10, 244, 0, 5]);
        assert_eq!(addr.to_host(), 0x0af4_0005);
        assert_eq!(Be32::from_host(0x0af4_0005), addr);
        assert_eq!(Ipv4Addr::from(addr), Ipv4Addr::new(10, 244, 0, 5));
        assert_eq!(Be16::from_host(51820).bytes(), [0xca, 0x6c]);
        assert_eq!(Be16::from_bytes([0xca, 0x6c]).to_host(), 51820);
    }

    #[test]
    fn bits_are_the_memory_a_native_load_gives() {
        let addr = Be32::from_bytes([192, 168, 0, 1]);
        assert_eq!(addr.to_bits(), u32::from_ne_bytes([192, 168, 0, 1]));
        assert_eq!(Be32::from_bits(addr.to_bits()), addr);
    }

    #[test]
    fn masks_and_remaps_work_byte_wise() {
        assert_eq!(Be32::mask(0), Be32::ZERO);
        assert_eq!(Be32::mask(19).bytes(), [255, 255, 224, 0]);
        assert_eq!(Be32::mask(32).bytes(), [255; 4]);
        assert_eq!(Be32::mask(40), Be32::mask(32));
        let a = Be32::from_bytes([172, 16, 31, 255]);
        let net = Be32::from_bytes([192, 168, 64, 0]);
        assert_eq!(a.remap(net, Be32::mask(19)).bytes(), [192, 168, 95, 255]);
        assert_eq!(a & Be32::mask(16), a.masked(Be32::mask(16)));
        assert_eq!((a | !a), Be32::from_bytes([255; 4]));
    }

    #[test]
    fn an_ipv6_address_masks_and_remaps_a_word_at_a_time() {
        extern crate std;
        use std::format;
        let addr = |text: &str| Be128::from(text.parse::<Ipv6Addr>().unwrap());
        let a = addr("fd00:10:244::8000:0:0:133");
        assert_eq!(
            Ipv6Addr::from(a),
            "fd00:10:244:0:8000::133".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(Be128::from_bytes(a.bytes()), a);
        assert_eq!(Be128::mask(0), Be128::ZERO);
        assert_eq!(Be128::mask(64), addr("ffff:ffff:ffff:ffff::"));
        assert_eq!(Be128::mask(72), addr("ffff:ffff:ffff:ffff:ff00::"));
        assert_eq!(
            Be128::mask(200),
            addr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
        );
        assert_eq!(a.masked(Be128::mask(48)), addr("fd00:10:244::"));
        // DESIGN's a-pod2 as b sees it: the /64's prefix swapped, the host
        // part kept.
        let seen = a.remap(addr("fd00:10:0:40::"), Be128::mask(64));
        assert_eq!(seen, addr("fd00:10:0:40:8000::133"));
        assert!(!a.is_zero() && Be128::ZERO.is_zero());
        assert_eq!(format!("{:?}", addr("fd00:10::5")), "fd00:10::5");
    }

    #[test]
    fn debug_prints_an_address_and_a_number() {
        extern crate std;
        use std::format;
        assert_eq!(
            format!("{:?}", Be32::from_bytes([10, 0, 40, 5])),
            "10.0.40.5"
        );
        assert_eq!(format!("{:?}", Be16::from_host(8080)), "8080");
    }
}
