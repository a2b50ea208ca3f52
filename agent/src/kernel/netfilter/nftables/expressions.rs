//! A rule's expressions, as `NFT_MSG_GETRULE` describes them, reduced to
//! the conditions, effects and verdict the proof reads ([`Rule`]). Loads
//! into registers are followed to the comparison that tests them, so that
//! `ip daddr 10.96.0.1`, `ip6 daddr fd00:10:96::1`,
//! `meta mark & 0x4000 == 0x4000` and
//! `ct state invalid` are recognised, whether nft or iptables-nft wrote
//! them, and iptables-nft's xtables matches are read from their own
//! structures.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_core::{parse_string, parse_u32_be};

use super::nested;
use crate::kernel::netfilter::rules::{Condition, Rule, Verdict};

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// The verdict register; the others hold data.
const NFT_REG_VERDICT: u32 = 0;

/// Verdict codes (`NF_*` and `NFT_*`).
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_CONTINUE: i32 = -1;
const NFT_BREAK: i32 = -2;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
/// Where an IPv4 header holds its destination.
const IPV4_DST_OFFSET: u32 = 16;
/// Where an IPv6 header holds its destination.
const IPV6_DST_OFFSET: u32 = 24;
const NFT_META_PROTOCOL: u32 = 1;
const NFT_META_MARK: u32 = 3;
const NFT_META_NFPROTO: u32 = 15;
const NFT_CT_STATE: u32 = 0;
/// Conntrack's invalid state, as `ct state` and xtables' matches write it.
const CT_STATE_INVALID: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;

/// Expressions that load into a register and write nothing else. Where
/// their destination register is differs from one to the next, so after
/// one, nothing the proof knew of any register holds.
const LOADS: [&str; 9] = [
    "byteorder",
    "exthdr",
    "fib",
    "hash",
    "numgen",
    "osf",
    "rt",
    "socket",
    "xfrm",
];

/// Expressions that touch no register: they count, or test a rate or a
/// quota (a test the proof cannot decide).
const COUNTS: [&str; 2] = ["counter", "last"];
const TESTS: [&str; 3] = ["limit", "quota", "range"];

/// Expressions that write when they carry a source register, and the
/// attribute that names it: `payload set`, `meta set`, `ct set`, and
/// `exthdr set` (`tcp option maxseg size set`, MSS clamping).
const WRITERS: [(&str, u16); 4] = [("payload", 5), ("meta", 3), ("ct", 4), ("exthdr", 7)];

/// xtables matches that only read the packet or its connection.
const READ_ONLY_MATCHES: [&str; 20] = [
    "addrtype",
    "comment",
    "connmark",
    "conntrack",
    "dscp",
    "icmp",
    "iprange",
    "length",
    "limit",
    "mark",
    "multiport",
    "nfacct",
    "physdev",
    "pkttype",
    "set",
    "state",
    "statistic",
    "tcp",
    "tos",
    "udp",
];

/// What a register holds, as far as the proof cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Register {
    /// The first `len` bytes of the destination, masked, where an IPv6
    /// header holds it when `ipv6`, where an IPv4 one does otherwise.
    Destination {
        ipv6: bool,
        len: usize,
        mask: [u8; 16],
    },
    /// The packet's mark, masked.
    Mark {
        mask: u32,
    },
    /// Conntrack's state bits, masked.
    ConntrackState {
        mask: u32,
    },
    /// The packet's family: `meta nfproto` (one byte) or `meta protocol`.
    Family {
        ethertype: bool,
    },
    Other,
}

/// One expression: its name and its attributes.
struct Expression<'a> {
    name: String,
    data: HashMap<u16, &'a [u8]>,
}

impl Expression<'_> {
    fn u32(&self, kind: u16) -> Option<u32> {
        self.data.get(&kind).and_then(|v| parse_u32_be(v).ok())
    }

    fn has(&self, kind: u16) -> bool {
        self.data.contains_key(&kind)
    }

    /// A nested data attribute's value (`NFTA_DATA_VALUE`).
    fn value(&self, kind: u16) -> Option<&[u8]> {
        nested(self.data.get(&kind)?)
            .find(|(k, _)| *k == NFTA_DATA_VALUE)
            .map(|(_, v)| v)
    }
}

/// Reads a rule's `NFTA_RULE_EXPRESSIONS` into `rule`.
pub(super) fn read(expressions: &[u8], rule: &mut Rule) {
    let mut registers: HashMap<u32, Register> = HashMap::new();
    for (kind, element) in nested(expressions) {
        if kind != NFTA_LIST_ELEM {
            continue;
        }
        let Some(expression) = expression(element) else {
            rule.effects
                .push("an expression that could not be read".into());
            continue;
        };
        apply(&expression, &mut registers, rule);
    }
}

fn expression(element: &[u8]) -> Option<Expression<'_>> {
    let (mut name, mut data) = (None, HashMap::new());
    for (kind, value) in nested(element) {
        match kind {
            NFTA_EXPR_NAME => name = parse_string(value).ok(),
            NFTA_EXPR_DATA => data = nested(value).collect(),
            _ => {}
        }
    }
    Some(Expression { name: name?, data })
}

/// What one expression does to the registers and the rule.
fn apply(e: &Expression, registers: &mut HashMap<u32, Register>, rule: &mut Rule) {
    match e.name.as_str() {
        _ if writes(e) => rule.effects.push(format!("{} set", e.name)),
        "payload" => load(e, registers, payload(e)),
        "meta" => load(e, registers, meta(e)),
        "ct" => load(e, registers, ct(e)),
        "bitwise" => bitwise(e, registers),
        "cmp" => rule.conditions.push(compare(e, registers)),
        "immediate" => immediate(e, registers, rule),
        "lookup" => lookup(e, registers, rule),
        "match" => xt_match(e, rule),
        "target" => {
            let name = e.data.get(&1).and_then(|v| parse_string(v).ok());
            rule.effects
                .push(format!("target {}", name.unwrap_or_default()));
        }
        name if LOADS.contains(&name) => registers.clear(),
        name if TESTS.contains(&name) => rule.conditions.push(Condition::Other),
        name if COUNTS.contains(&name) => {}
        name => rule.effects.push(name.to_owned()),
    }
}

/// Whether an expression that may write does: it carries a source register.
fn writes(e: &Expression) -> bool {
    WRITERS
        .iter()
        .any(|(name, sreg)| e.name == *name && e.has(*sreg))
}

fn load(e: &Expression, registers: &mut HashMap<u32, Register>, what: Register) {
    if let Some(dreg) = e.u32(1) {
        registers.insert(dreg, what);
    }
}

fn payload(e: &Expression) -> Register {
    let (base, offset, len) = (e.u32(2), e.u32(3), e.u32(4));
    let ipv6 = match (base, offset, len) {
        (Some(NFT_PAYLOAD_NETWORK_HEADER), Some(IPV4_DST_OFFSET), Some(1..=4)) => false,
        (Some(NFT_PAYLOAD_NETWORK_HEADER), Some(IPV6_DST_OFFSET), Some(1..=16)) => true,
        _ => return Register::Other,
    };
    Register::Destination {
        ipv6,
        len: len.unwrap_or_default() as usize,
        mask: [0xff; 16],
    }
}

fn meta(e: &Expression) -> Register {
    match e.u32(2) {
        Some(NFT_META_MARK) => Register::Mark { mask: u32::MAX },
        Some(NFT_META_NFPROTO) => Register::Family { ethertype: false },
        Some(NFT_META_PROTOCOL) => Register::Family { ethertype: true },
        _ => Register::Other,
    }
}

fn ct(e: &Expression) -> Register {
    match e.u32(2) {
        Some(NFT_CT_STATE) => Register::ConntrackState { mask: u32::MAX },
        _ => Register::Other,
    }
}

/// `dreg = (sreg & mask) ^ xor`: a mask narrows what is compared; an xor
/// that is not zero makes it something else.
fn bitwise(e: &Expression, registers: &mut HashMap<u32, Register>) {
    let (Some(sreg), Some(dreg)) = (e.u32(1), e.u32(2)) else {
        return;
    };
    let source = registers.get(&sreg).copied().unwrap_or(Register::Other);
    let (mask, xor) = (e.value(4), e.value(5));
    let plain_mask = xor.is_some_and(|x| x.iter().all(|b| *b == 0)) && e.u32(6).unwrap_or(0) == 0;
    let masked = match (source, mask.filter(|_| plain_mask)) {
        (Register::Destination { ipv6, len, .. }, Some(m)) if m.len() == len => {
            let mut mask = [0; 16];
            mask[..len].copy_from_slice(m);
            Register::Destination { ipv6, len, mask }
        }
        (Register::Mark { .. }, Some(m)) => {
            word(m).map_or(Register::Other, |mask| Register::Mark { mask })
        }
        (Register::ConntrackState { .. }, Some(m)) => {
            word(m).map_or(Register::Other, |mask| Register::ConntrackState { mask })
        }
        _ => Register::Other,
    };
    registers.insert(dreg, masked);
}

/// A register value in host order, as meta and ct load them.
fn word(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

/// What a comparison tests, given what its register holds.
fn compare(e: &Expression, registers: &HashMap<u32, Register>) -> Condition {
    let (Some(sreg), Some(op), Some(data)) = (e.u32(1), e.u32(2), e.value(3)) else {
        return Condition::Other;
    };
    let held = registers.get(&sreg).copied().unwrap_or(Register::Other);
    match (held, op) {
        (Register::Destination { ipv6, len, mask }, NFT_CMP_EQ) if data.len() == len => {
            destination(data, &mask[..len], ipv6).map_or(Condition::Other, Condition::DestinationIn)
        }
        (Register::Mark { mask }, NFT_CMP_EQ | NFT_CMP_NEQ) => {
            word(data).map_or(Condition::Other, |value| Condition::Mark {
                mask,
                value,
                negated: op == NFT_CMP_NEQ,
            })
        }
        (Register::ConntrackState { mask }, NFT_CMP_NEQ)
            if mask == CT_STATE_INVALID && word(data) == Some(0) =>
        {
            Condition::ConntrackInvalid
        }
        (Register::Family { ethertype }, NFT_CMP_EQ | NFT_CMP_NEQ) => {
            let (ipv4, ipv6) = match ethertype {
                true => (
                    data == ETH_P_IP.to_be_bytes(),
                    data == ETH_P_IPV6.to_be_bytes(),
                ),
                false => (data == [NFPROTO_IPV4], data == [NFPROTO_IPV6]),
            };
            let equal = op == NFT_CMP_EQ;
            Condition::FamilyIn {
                ipv4: ipv4 == equal,
                ipv6: ipv6 == equal,
            }
        }
        _ => Condition::Other,
    }
}

/// The prefix a masked comparison of the destination's first bytes asks
/// for, in IPv6 when `ipv6`; none if the mask is not a prefix.
fn destination(data: &[u8], mask: &[u8], ipv6: bool) -> Option<IpNet> {
    let mut bits = [0u8; 16];
    bits[..mask.len()].copy_from_slice(mask);
    let mask = u128::from_be_bytes(bits);
    let len = mask.leading_ones();
    if mask.count_ones() != len {
        return None;
    }
    let mut address = [0u8; 16];
    address[..data.len()].copy_from_slice(data);
    let net = if ipv6 {
        IpNet::V6(Ipv6Net::new(Ipv6Addr::from(address), len as u8).ok()?)
    } else {
        let [a, b, c, d, ..] = address;
        IpNet::V4(Ipv4Net::new(Ipv4Addr::new(a, b, c, d), len.min(32) as u8).ok()?)
    };
    Some(net.trunc())
}

fn immediate(e: &Expression, registers: &mut HashMap<u32, Register>, rule: &mut Rule) {
    let Some(dreg) = e.u32(1) else { return };
    if dreg != NFT_REG_VERDICT {
        registers.insert(dreg, Register::Other);
        return;
    }
    let Some(verdict) = e
        .data
        .get(&2)
        .and_then(|d| nested(d).find(|(k, _)| *k == NFTA_DATA_VERDICT))
    else {
        rule.verdict = Verdict::Other("a verdict that could not be read".into());
        return;
    };
    let (mut code, mut chain) = (None, String::new());
    for (kind, value) in nested(verdict.1) {
        match kind {
            NFTA_VERDICT_CODE => code = parse_u32_be(value).ok().map(|c| c as i32),
            NFTA_VERDICT_CHAIN => chain = parse_string(value).unwrap_or_default(),
            _ => {}
        }
    }
    rule.verdict = match code {
        Some(NF_DROP) => Verdict::Drop,
        Some(NF_ACCEPT) => Verdict::Accept,
        Some(NFT_CONTINUE | NFT_BREAK) => Verdict::Continue,
        Some(NFT_RETURN) => Verdict::Return,
        Some(NFT_JUMP) => Verdict::Jump(chain),
        Some(NFT_GOTO) => Verdict::Goto(chain),
        other => Verdict::Other(format!("verdict {other:?}")),
    };
}

/// A set lookup: a test, unless it writes a verdict (a verdict map) or
/// data the proof cannot follow.
fn lookup(e: &Expression, registers: &mut HashMap<u32, Register>, rule: &mut Rule) {
    match e.u32(3) {
        Some(NFT_REG_VERDICT) => rule.verdict = Verdict::Other("a verdict map".into()),
        Some(dreg) => {
            registers.insert(dreg, Register::Other);
        }
        None => rule.conditions.push(Condition::Other),
    }
}

/// An xtables match, as iptables-nft writes those it has no native form for.
fn xt_match(e: &Expression, rule: &mut Rule) {
    let name = e
        .data
        .get(&1)
        .and_then(|v| parse_string(v).ok())
        .unwrap_or_default();
    let revision = e.u32(2).unwrap_or(0);
    let info = e.data.get(&3).copied().unwrap_or_default();
    if !READ_ONLY_MATCHES.contains(&name.as_str()) {
        rule.effects.push(format!("match {name}"));
        return;
    }
    let condition = match name.as_str() {
        "comment" | "nfacct" => return,
        "conntrack" => conntrack_match(info, revision),
        "state" => state_match(info),
        "addrtype" => addrtype_match(info, revision),
        "mark" => mark_match(info, revision),
        _ => None,
    };
    rule.conditions.push(condition.unwrap_or(Condition::Other));
}

/// In `struct xt_conntrack_mtinfo{1,2,3}`: after eight addresses and
/// masks (128 bytes), two timeouts, the protocol and four ports.
const CONNTRACK_FLAGS: usize = 146;
const XT_CONNTRACK_STATE: u16 = 1;

fn conntrack_match(info: &[u8], revision: u32) -> Option<Condition> {
    let half = |at: usize| Some(u16::from_ne_bytes(info.get(at..at + 2)?.try_into().ok()?));
    let (flags, invert, state) = match revision {
        1 => (
            u16::from(*info.get(CONNTRACK_FLAGS)?),
            u16::from(*info.get(CONNTRACK_FLAGS + 1)?),
            half(CONNTRACK_FLAGS + 2)?,
        ),
        2 | 3 => (
            half(CONNTRACK_FLAGS)?,
            half(CONNTRACK_FLAGS + 2)?,
            half(CONNTRACK_FLAGS + 4)?,
        ),
        _ => return None,
    };
    (flags == XT_CONNTRACK_STATE && invert == 0 && u32::from(state) == CT_STATE_INVALID)
        .then_some(Condition::ConntrackInvalid)
}

/// `struct xt_state_info`: the state mask alone.
fn state_match(info: &[u8]) -> Option<Condition> {
    (word(info.get(..4)?)? == CT_STATE_INVALID).then_some(Condition::ConntrackInvalid)
}

/// `struct xt_addrtype_info_v1`: source and destination types, flags.
const XT_ADDRTYPE_LOCAL: u16 = 1 << 2;
const XT_ADDRTYPE_INVERT_DEST: u32 = 2;

fn addrtype_match(info: &[u8], revision: u32) -> Option<Condition> {
    let dest = u16::from_ne_bytes(info.get(2..4)?.try_into().ok()?);
    let flags = word(info.get(4..8)?)?;
    (revision == 1 && dest == XT_ADDRTYPE_LOCAL && flags & XT_ADDRTYPE_INVERT_DEST == 0)
        .then_some(Condition::DestinationLocal)
}

/// `struct xt_mark_mtinfo1`: mark, mask, invert.
fn mark_match(info: &[u8], revision: u32) -> Option<Condition> {
    if revision != 1 {
        return None;
    }
    Some(Condition::Mark {
        value: word(info.get(..4)?)?,
        mask: word(info.get(4..8)?)?,
        negated: *info.get(8)? != 0,
    })
}
