//! The networks of both address families, read the one way: an object's
//! field holds an IPv4 or an IPv6 network, and the model reads each where
//! its family is expected.

use std::fmt;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A network of one address family.
pub trait Cidr: Copy + Eq + fmt::Display + fmt::Debug {
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
}

impl Cidr for Ipv4Net {
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
}

impl Cidr for Ipv6Net {
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
