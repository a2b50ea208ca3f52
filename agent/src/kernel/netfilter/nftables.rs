//! nftables' base chains at the IPv4 forward hook, read over nfnetlink as
//! `nft list chains` and `nft list chain` do. iptables-nft's `ip filter
//! FORWARD` is one of them.

use std::io;

use netlink_packet_core::{
    DefaultNla, Emitable, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer,
    NlasIterator, parse_string, parse_u32_be,
};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use super::ForwardFilter;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
/// Netfilter families (`NFPROTO_*`): only `inet` and `ip` chains see IPv4.
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NF_INET_FORWARD: u32 = 2;
const NF_DROP: u32 = 0;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
/// `struct nfgenmsg`, before the attributes of every message.
const NFGENMSG_LEN: usize = 4;
const NLMSG_HDRLEN: usize = 16;

/// A chain, as a dump of chains describes it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Chain {
    family: u8,
    table: String,
    name: String,
    hook: Option<u32>,
    policy: Option<u32>,
}

impl Chain {
    fn at_ipv4_forward(&self) -> bool {
        matches!(self.family, NFPROTO_INET | NFPROTO_IPV4) && self.hook == Some(NF_INET_FORWARD)
    }
}

/// The base chains at the IPv4 forward hook, with their rule counts. A
/// kernel without `nf_tables` has none.
pub(super) fn forward_chains() -> io::Result<Vec<ForwardFilter>> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    let chains = match dump(&socket, NFT_MSG_GETCHAIN, NFPROTO_UNSPEC, &[]) {
        Err(e) if absent(&e) => return Ok(Vec::new()),
        other => other?,
    };
    let mut filters = Vec::new();
    for chain in chains.iter().filter_map(|m| parse_chain(m)) {
        if !chain.at_ipv4_forward() {
            continue;
        }
        let selector = [
            (NFTA_RULE_TABLE, &*chain.table),
            (NFTA_RULE_CHAIN, &*chain.name),
        ];
        // A chain removed since the first dump holds no rule.
        let rules = match dump(&socket, NFT_MSG_GETRULE, chain.family, &selector) {
            Err(e) if absent(&e) => 0,
            other => other?.iter().filter(|m| is_rule_of(m, &chain)).count(),
        };
        filters.push(ForwardFilter {
            backend: "nftables",
            table: format!("{} {}", family_name(chain.family), chain.table),
            drops: chain.policy == Some(NF_DROP),
            chain: chain.name,
            rules,
        });
    }
    Ok(filters)
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
        _ => "ip",
    }
}

/// Sends a dump request for `message` and returns the payload of every reply.
fn dump(
    socket: &Socket,
    message: u16,
    family: u8,
    attributes: &[(u16, &str)],
) -> io::Result<Vec<Vec<u8>>> {
    socket.send(&request(message, family, attributes), 0)?;
    let mut replies = Vec::new();
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        if collect(&datagram, &mut replies)? {
            return Ok(replies);
        }
    }
}

/// A dump request: the netlink header, `nfgenmsg`, and string attributes.
fn request(message: u16, family: u8, attributes: &[(u16, &str)]) -> Vec<u8> {
    let mut body = vec![family, 0, 0, 0];
    for (kind, value) in attributes {
        let nla = DefaultNla::new(*kind, [value.as_bytes(), &[0]].concat());
        let start = body.len();
        body.resize(start + nla.buffer_len(), 0);
        nla.emit(&mut body[start..]);
    }
    let length = (NLMSG_HDRLEN + body.len()) as u32;
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | message;
    let mut out = Vec::with_capacity(length as usize);
    out.extend(length.to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend((NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    out.extend([0; 8]);
    out.extend(body);
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
    NlasIterator::new(payload.get(NFGENMSG_LEN..).unwrap_or_default())
        .map_while(Result::ok)
        .map(|nla| {
            let (kind, end) = (nla.kind(), usize::from(nla.length()));
            let value = nla.into_inner().get(4..end).unwrap_or_default();
            (kind, value)
        })
}

/// A chain described by a reply to `NFT_MSG_GETCHAIN`; none if the reply
/// is too short to carry a family.
pub(super) fn parse_chain(payload: &[u8]) -> Option<Chain> {
    let mut chain = Chain {
        family: *payload.first()?,
        ..Chain::default()
    };
    for (kind, value) in attributes(payload) {
        match kind {
            NFTA_CHAIN_TABLE => chain.table = parse_string(value).ok()?,
            NFTA_CHAIN_NAME => chain.name = parse_string(value).ok()?,
            NFTA_CHAIN_POLICY => chain.policy = parse_u32_be(value).ok(),
            NFTA_CHAIN_HOOK => {
                chain.hook = NlasIterator::new(value)
                    .map_while(Result::ok)
                    .find(|nla| nla.kind() == NFTA_HOOK_HOOKNUM)
                    .and_then(|nla| parse_u32_be(nla.value()).ok());
            }
            _ => {}
        }
    }
    Some(chain)
}

/// Whether a reply to `NFT_MSG_GETRULE` is a rule of `chain`: a kernel
/// that ignores the dump's selector sends every rule.
fn is_rule_of(payload: &[u8], chain: &Chain) -> bool {
    let (mut table, mut name) = (None, None);
    for (kind, value) in attributes(payload) {
        match kind {
            NFTA_RULE_TABLE => table = parse_string(value).ok(),
            NFTA_RULE_CHAIN => name = parse_string(value).ok(),
            _ => {}
        }
    }
    payload.first() == Some(&chain.family)
        && table.as_deref() == Some(&*chain.table)
        && name.as_deref() == Some(&*chain.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attribute as the kernel writes it: length, type, value, padding.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    fn chain_reply(family: u8, table: &str, name: &str, hook: u32, policy: u32) -> Vec<u8> {
        let hook = [
            nla(NFTA_HOOK_HOOKNUM, &hook.to_be_bytes()),
            nla(2, &0i32.to_be_bytes()),
        ]
        .concat();
        [
            vec![family, 0, 0, 0],
            nla(NFTA_CHAIN_TABLE, &[table.as_bytes(), &[0]].concat()),
            nla(2, &7u64.to_be_bytes()),
            nla(NFTA_CHAIN_NAME, &[name.as_bytes(), &[0]].concat()),
            nla(NFTA_CHAIN_HOOK | 0x8000, &hook),
            nla(NFTA_CHAIN_POLICY, &policy.to_be_bytes()),
        ]
        .concat()
    }

    fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = ((NLMSG_HDRLEN + payload.len()) as u32)
            .to_ne_bytes()
            .to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend([0; 10]);
        out.extend(payload);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    #[test]
    fn a_forward_base_chain_is_read_with_its_hook_and_policy() {
        let chain = parse_chain(&chain_reply(NFPROTO_IPV4, "filter", "FORWARD", 2, 0)).unwrap();
        assert!(chain.at_ipv4_forward());
        assert_eq!(
            (chain.table.as_str(), chain.name.as_str(), chain.policy),
            ("filter", "FORWARD", Some(NF_DROP))
        );
        let input = parse_chain(&chain_reply(NFPROTO_INET, "fw", "in", 1, 1)).unwrap();
        assert!(!input.at_ipv4_forward(), "an input chain: {input:?}");
        let ipv6 = parse_chain(&chain_reply(10, "filter", "FORWARD", 2, 1)).unwrap();
        assert!(
            !ipv6.at_ipv4_forward(),
            "an ip6 chain sees no IPv4: {ipv6:?}"
        );
    }

    #[test]
    fn a_regular_chain_has_no_hook() {
        let reply = [
            vec![NFPROTO_IPV4, 0, 0, 0],
            nla(NFTA_CHAIN_TABLE, b"filter\0"),
            nla(NFTA_CHAIN_NAME, b"KUBE-FORWARD\0"),
        ]
        .concat();
        let chain = parse_chain(&reply).unwrap();
        assert_eq!((chain.hook, chain.policy), (None, None));
        assert!(!chain.at_ipv4_forward());
    }

    #[test]
    fn truncated_and_garbled_replies_do_not_panic() {
        let whole = chain_reply(NFPROTO_IPV4, "filter", "FORWARD", 2, 0);
        for cut in 0..whole.len() {
            let _ = parse_chain(&whole[..cut]);
        }
        let mut garbled = whole.clone();
        garbled[4] = 0xff;
        let _ = parse_chain(&garbled);
        assert_eq!(parse_chain(&[]), None);
    }

    #[test]
    fn a_dump_ends_at_done_and_an_error_is_the_kernels_errno() {
        let chain = chain_reply(NFPROTO_IPV4, "filter", "FORWARD", 2, 1);
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN;
        let mut replies = Vec::new();
        let first = [message(kind, &chain), message(kind, &chain)].concat();
        assert!(!collect(&first, &mut replies).unwrap());
        assert!(collect(&message(NLMSG_DONE, &[0; 4]), &mut replies).unwrap());
        assert_eq!(replies, vec![chain.clone(), chain]);
        let error = message(NLMSG_ERROR, &(-libc::ENOENT).to_ne_bytes());
        let e = collect(&error, &mut Vec::new()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert!(absent(&e));
        let short = &message(kind, &[2, 0, 0, 0])[..10];
        assert!(collect(short, &mut Vec::new()).is_err());
    }

    #[test]
    fn only_the_rules_of_the_chain_asked_for_are_counted() {
        let chain = parse_chain(&chain_reply(NFPROTO_IPV4, "filter", "FORWARD", 2, 1)).unwrap();
        let rule = |family, table: &[u8], name: &[u8]| {
            [
                vec![family, 0, 0, 0],
                nla(NFTA_RULE_TABLE, table),
                nla(NFTA_RULE_CHAIN, name),
            ]
            .concat()
        };
        assert!(is_rule_of(
            &rule(NFPROTO_IPV4, b"filter\0", b"FORWARD\0"),
            &chain
        ));
        assert!(!is_rule_of(
            &rule(NFPROTO_IPV4, b"filter\0", b"INPUT\0"),
            &chain
        ));
        assert!(!is_rule_of(
            &rule(NFPROTO_INET, b"filter\0", b"FORWARD\0"),
            &chain
        ));
    }

    #[test]
    fn the_request_names_the_table_and_chain() {
        let bytes = request(
            NFT_MSG_GETRULE,
            NFPROTO_IPV4,
            &[(NFTA_RULE_TABLE, "filter")],
        );
        let message = NetlinkBuffer::new_checked(&bytes[..]).unwrap();
        assert_eq!(message.length() as usize, bytes.len());
        assert_eq!(message.message_type(), 0x0a07);
        assert_eq!(message.flags(), NLM_F_REQUEST | NLM_F_DUMP);
        let fields: Vec<(u16, &[u8])> = attributes(message.payload()).collect();
        assert_eq!(fields, vec![(NFTA_RULE_TABLE, &b"filter\0"[..])]);
    }
}
