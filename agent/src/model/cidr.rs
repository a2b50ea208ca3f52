//! The networks of both address families, read the one way: an object's
//! field holds an IPv4 or an IPv6 network, and the model reads each where
//! its family is expected.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use isthmus_common::wire::{Address, Be32, Be128};

/// A network of one address family.
pub trait Cidr: Copy + Eq + fmt::Display + fmt::Debug + Into<IpNet> {
    /// Its addresses as the kernel's tables hold them.
    type Wire: Address + From<Self::Addr> + Into<Self::Addr>;
    /// Its addresses.
    type Addr: Copy + Ord + fmt::Display + fmt::Debug + Into<IpAddr>;
    /// The family's name, for errors: "IPv4" or "IPv6".
    const FAMILY: &'static str;
    /// Whether the family is IPv6: its fields may have names of their own.
    const IPV6: bool;

    /// The network written `text`, host bits cleared; None if it is no
    /// network of this family.
    fn parse_network(text: &str) -> Option<Self>;

    /// Its prefix length.
    fn prefix(&self) -> u8;

    /// This family's network of `net`, if it is of this family.
    fn of(net: IpNet) -> Option<Self>;

    /// Its network address, as the kernel's tables hold it.
    fn wire(&self) -> Self::Wire;

    /// The network of `prefix_len` bits at `addr`, as a kernel table's key
    /// holds it (a longer length counts as the family's longest).
    fn from_wire(addr: Self::Wire, prefix_len: u8) -> Self;

    /// Whether it holds `addr`.
    fn holds(&self, addr: Self::Addr) -> bool;

    /// `addr`, if it is of this family.
    fn addr_of(addr: IpAddr) -> Option<Self::Addr>;
}

impl Cidr for Ipv4Net {
    type Wire = Be32;
    type Addr = Ipv4Addr;
    const FAMILY: &'static str = "IPv4";
    const IPV6: bool = false;

    fn parse_network(text: &str) -> Option<Self> {
        text.parse::<Ipv4Net>().ok().map(|net| net.trunc())
    }

    fn prefix(&self) -> u8 {
        self.prefix_len()
    }

    fn of(net: IpNet) -> Option<Self> {
        match net {
            IpNet::V4(net) => Some(net),
            IpNet::V6(_) => None,
        }
    }

    fn wire(&self) -> Be32 {
        Be32::from(self.network())
    }

    fn from_wire(addr: Be32, prefix_len: u8) -> Self {
        Ipv4Net::new(addr.into(), prefix_len.min(32)).expect("prefix length within 32")
    }

    fn holds(&self, addr: Ipv4Addr) -> bool {
        self.contains(&addr)
    }

    fn addr_of(addr: IpAddr) -> Option<Ipv4Addr> {
        match addr {
            IpAddr::V4(addr) => Some(addr),
            IpAddr::V6(_) => None,
        }
    }
}

impl Cidr for Ipv6Net {
    type Wire = Be128;
    type Addr = Ipv6Addr;
    const FAMILY: &'static str = "IPv6";
    const IPV6: bool = true;

    fn parse_network(text: &str) -> Option<Self> {
        text.parse::<Ipv6Net>().ok().map(|net| net.trunc())
    }

    fn prefix(&self) -> u8 {
        self.prefix_len()
    }

    fn of(net: IpNet) -> Option<Self> {
        match net {
            IpNet::V6(net) => Some(net),
            IpNet::V4(_) => None,
        }
    }

    fn wire(&self) -> Be128 {
        Be128::from(self.network())
    }

    fn from_wire(addr: Be128, prefix_len: u8) -> Self {
        Ipv6Net::new(addr.into(), prefix_len.min(128)).expect("prefix length within 128")
    }

    fn holds(&self, addr: Ipv6Addr) -> bool {
        self.contains(&addr)
    }

    fn addr_of(addr: IpAddr) -> Option<Ipv6Addr> {
        match addr {
            IpAddr::V6(addr) => Some(addr),
            IpAddr::V4(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_reads_only_its_own_networks_with_host_bits_cleared() {
        assert_eq!(
            Ipv4Net::parse_network("10.0.40.7/24"),
            Some("10.0.40.0/24".parse().unwrap())
        );
        assert_eq!(
            Ipv6Net::parse_network("fd00:10:0:40::5/64"),
            Some("fd00:10:0:40::/64".parse().unwrap())
        );
        assert_eq!(Ipv4Net::parse_network("fd00:10::/64"), None);
        assert_eq!(Ipv6Net::parse_network("10.0.40.0/24"), None);
        assert_eq!(Ipv6Net::parse_network("fd00::/129"), None);
    }
}
