//! nftables' chains that see forwarded IPv4 or IPv6 packets, with their
//! rules, read over nfnetlink as `nft list ruleset` does. iptables-nft's
//! tables (`ip filter`, `ip6 nat`, ...) are among them.

mod expressions;

use std::{collections::BTreeMap, io, os::fd::AsRawFd};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NlasIterator, parse_string,
    parse_u32_be, parse_u64_be,
};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use super::rules::{Chain, IpFamily, Rule};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETGEN: u16 = 16;
/// Netfilter families (`NFPROTO_*`) whose chains see IP packets.
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_NETDEV: u8 = 5;
const NFPROTO_IPV6: u8 = 10;
/// The hooks a forwarded packet crosses in the stack and skips past it.
const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_FORWARD: u32 = 2;
const NF_INET_POST_ROUTING: u32 = 4;
const NF_INET_INGRESS: u32 = 5;
const NF_NETDEV_INGRESS: u32 = 0;
const NF_DROP: u32 = 0;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_GEN_ID: u16 = 1;
/// `struct nfgenmsg`, before the attributes of every message.
const NFGENMSG_LEN: usize = 4;
const NLMSG_HDRLEN: usize = 16;

/// A chain, as a dump of chains describes it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ChainHeader {
    family: u8,
    table: String,
    name: String,
    hook: Option<u32>,
    policy: Option<u32>,
}

impl ChainHeader {
    /// Whether it sees IP packets of either family: not an `arp` or
    /// `bridge` table's.
    fn sees_ip(&self) -> bool {
        matches!(
            self.family,
            NFPROTO_INET | NFPROTO_IPV4 | NFPROTO_IPV6 | NFPROTO_NETDEV
        )
    }

    /// The one family it sees; None where it sees both.
    fn ip_family(&self) -> Option<IpFamily> {
        match self.family {
            NFPROTO_IPV4 => Some(IpFamily::Ipv4),
            NFPROTO_IPV6 => Some(IpFamily::Ipv6),
            _ => None,
        }
    }

    /// Whether the kernel runs it for a forwarded packet in the stack that
    /// TC would have sent past it.
    fn hooked(&self) -> bool {
        match (self.family, self.hook) {
            (NFPROTO_NETDEV, Some(hook)) => hook == NF_NETDEV_INGRESS,
            (NFPROTO_INET, Some(NF_INET_INGRESS)) => true,
            (_, Some(hook)) => matches!(
                hook,
                NF_INET_PRE_ROUTING | NF_INET_FORWARD | NF_INET_POST_ROUTING
            ),
            (_, None) => false,
        }
    }

    fn key(&self) -> (u8, String, String) {
        (self.family, self.table.clone(), self.name.clone())
    }
}

/// nftables' ruleset generation: it changes with every change of a table,
/// chain or rule. None without `nf_tables`.
pub(super) fn generation() -> io::Result<Option<u32>> {
    let socket = socket()?;
    // Not a dump: one reply, and no end-of-dump after it.
    socket.send(&request(NFT_MSG_GETGEN, NFPROTO_UNSPEC, NLM_F_REQUEST), 0)?;
    let (datagram, _) = socket.recv_from_full()?;
    let mut replies = Vec::new();
    match collect(&datagram, &mut replies) {
        Err(e) if absent(&e) => return Ok(None),
        other => other?,
    };
    Ok(replies.iter().find_map(|reply| {
        attributes(reply)
            .find(|(kind, _)| *kind == NFTA_GEN_ID)
            .and_then(|(_, value)| parse_u32_be(value).ok())
    }))
}

/// Every chain of the tables that see IP packets, with its rules in order.
/// A kernel without `nf_tables` has none.
pub(super) fn chains() -> io::Result<Vec<Chain>> {
    let socket = socket()?;
    let headers = match dump(&socket, NFT_MSG_GETCHAIN, NFPROTO_UNSPEC) {
        Err(e) if absent(&e) => return Ok(Vec::new()),
        other => other?,
    };
    let headers: Vec<ChainHeader> = headers
        .iter()
        .filter_map(|m| parse_chain(m))
        .filter(ChainHeader::sees_ip)
        .collect();
    // Rules of a chain created since the first dump are not asked for.
    let mut rules: BTreeMap<(u8, String, String), Vec<Rule>> =
        headers.iter().map(|h| (h.key(), Vec::new())).collect();
    let replies = match dump(&socket, NFT_MSG_GETRULE, NFPROTO_UNSPEC) {
        Err(e) if absent(&e) => Vec::new(),
        other => other?,
    };
    for reply in &replies {
        if let Some((family, table, chain, rule)) = parse_rule(reply)
            && let Some(held) = rules.get_mut(&(family, table, chain))
        {
            held.push(rule);
        }
    }
    Ok(headers
        .iter()
        .map(|header| Chain {
            table: format!("nftables {} {}", family_name(header.family), header.table),
            family: header.ip_family(),
            name: header.name.clone(),
            hooked: header.hooked(),
            drops: header.hooked() && header.policy == Some(NF_DROP),
            rules: rules.remove(&header.key()).unwrap_or_default(),
        })
        .collect())
}

/// How long a reply may take: past it, the read fails, and the node's
/// rules count as unknown, rather than the watch waiting for ever.
const REPLY_TIMEOUT: libc::timeval = libc::timeval {
    tv_sec: 5,
    tv_usec: 0,
};

fn socket() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    let timeout = REPLY_TIMEOUT;
    // SAFETY: a valid socket, and a timeval of the size given.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// Whether `nf_tables`, or the object asked for, does not exist.
fn absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EINVAL | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT)
    )
}

fn family_name(family: u8) -> &'static str {
    match family {
        NFPROTO_INET => "inet",
        NFPROTO_NETDEV => "netdev",
        NFPROTO_IPV6 => "ip6",
        _ => "ip",
    }
}

/// Sends a dump request for `message` and returns the payload of every reply.
fn dump(socket: &Socket, message: u16, family: u8) -> io::Result<Vec<Vec<u8>>> {
    socket.send(&request(message, family, NLM_F_REQUEST | NLM_F_DUMP), 0)?;
    let mut replies = Vec::new();
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        if collect(&datagram, &mut replies)? {
            return Ok(replies);
        }
    }
}

/// A request with `flags`: the netlink header and `nfgenmsg`.
fn request(message: u16, family: u8, flags: u16) -> Vec<u8> {
    let length = (NLMSG_HDRLEN + NFGENMSG_LEN) as u32;
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | message;
    let mut out = Vec::with_capacity(length as usize);
    out.extend(length.to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    out.extend([0; 8]);
    out.extend([family, 0, 0, 0]);
    out
}

/// Appends the payloads of the messages in `datagram` to `replies`;
/// returns whether the dump is complete.
fn collect(datagram: &[u8], replies: &mut Vec<Vec<u8>>) -> io::Result<bool> {
    let mut rest = datagram;
    while !rest.is_empty() {
        let message = NetlinkBuffer::new_checked(rest)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        match message.message_type() {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = message.payload().get(..4).map_or(-libc::EPROTO, |c| {
                    i32::from_ne_bytes(c.try_into().expect("four bytes"))
                });
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
            }
            _ => replies.push(message.payload().to_vec()),
        }
        let aligned = (message.length() as usize).next_multiple_of(4);
        rest = rest.get(aligned..).unwrap_or_default();
    }
    Ok(false)
}

/// The attributes of a reply, after its `nfgenmsg`; none if it has none.
fn attributes(payload: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    nested(payload.get(NFGENMSG_LEN..).unwrap_or_default())
}

/// The (kind, value) pairs of a nested attribute's value; none past the
/// first that does not hold together.
fn nested(value: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    NlasIterator::new(value).map_while(Result::ok).map(|nla| {
        let (kind, end) = (nla.kind(), usize::from(nla.length()));
        (kind, nla.into_inner().get(4..end).unwrap_or_default())
    })
}

/// A chain described by a reply to `NFT_MSG_GETCHAIN`; none if the reply
/// is too short to carry a family.
pub(super) fn parse_chain(payload: &[u8]) -> Option<ChainHeader> {
    let mut chain = ChainHeader {
        family: *payload.first()?,
        ..ChainHeader::default()
    };
    for (kind, value) in attributes(payload) {
        match kind {
            NFTA_CHAIN_TABLE => chain.table = parse_string(value).ok()?,
            NFTA_CHAIN_NAME => chain.name = parse_string(value).ok()?,
            NFTA_CHAIN_POLICY => chain.policy = parse_u32_be(value).ok(),
            NFTA_CHAIN_HOOK => {
                chain.hook = nested(value)
                    .find(|(kind, _)| *kind == NFTA_HOOK_HOOKNUM)
                    .and_then(|(_, hook)| parse_u32_be(hook).ok());
            }
            _ => {}
        }
    }
    Some(chain)
}

/// A rule described by a reply to `NFT_MSG_GETRULE`, with its family,
/// table and chain; none if the reply is too short to carry a family.
fn parse_rule(payload: &[u8]) -> Option<(u8, String, String, Rule)> {
    let family = *payload.first()?;
    let (mut table, mut chain, mut rule) = (String::new(), String::new(), Rule::default());
    for (kind, value) in attributes(payload) {
        match kind {
            NFTA_RULE_TABLE => table = parse_string(value).ok()?,
            NFTA_RULE_CHAIN => chain = parse_string(value).ok()?,
            NFTA_RULE_HANDLE => rule.handle = parse_u64_be(value).unwrap_or_default(),
            NFTA_RULE_EXPRESSIONS => expressions::read(value, &mut rule),
            _ => {}
        }
    }
    Some((family, table, chain, rule))
}

#[cfg(test)]
mod tests;
