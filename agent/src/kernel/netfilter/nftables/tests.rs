use super::*;
use crate::kernel::netfilter::rules::{Condition, Verdict};

const NESTED: u16 = 0x8000;

/// An attribute as the kernel writes it: length, type, value, padding.
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

fn string(kind: u16, value: &str) -> Vec<u8> {
    nla(kind, &[value.as_bytes(), &[0]].concat())
}

fn be32(kind: u16, value: u32) -> Vec<u8> {
    nla(kind, &value.to_be_bytes())
}

/// A nested `NFTA_DATA_VALUE`.
fn data(kind: u16, value: &[u8]) -> Vec<u8> {
    nla(kind | NESTED, &nla(1, value))
}

fn chain_reply(family: u8, table: &str, name: &str, hook: u32, policy: u32) -> Vec<u8> {
    let hook = [be32(NFTA_HOOK_HOOKNUM, hook), be32(2, 0)].concat();
    [
        vec![family, 0, 0, 0],
        string(NFTA_CHAIN_TABLE, table),
        nla(2, &7u64.to_be_bytes()),
        string(NFTA_CHAIN_NAME, name),
        nla(NFTA_CHAIN_HOOK | NESTED, &hook),
        be32(NFTA_CHAIN_POLICY, policy),
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

/// One expression of a rule: its name and attributes.
fn expr(name: &str, attributes: &[Vec<u8>]) -> Vec<u8> {
    let inner = [string(1, name), nla(2 | NESTED, &attributes.concat())].concat();
    nla(1 | NESTED, &inner)
}

fn payload_load(offset: u32, len: u32) -> Vec<u8> {
    expr(
        "payload",
        &[be32(1, 1), be32(2, 1), be32(3, offset), be32(4, len)],
    )
}

fn meta_load(key: u32) -> Vec<u8> {
    expr("meta", &[be32(1, 1), be32(2, key)])
}

fn bitwise(mask: &[u8]) -> Vec<u8> {
    let len = mask.len() as u32;
    let xor = vec![0; mask.len()];
    expr(
        "bitwise",
        &[
            be32(1, 1),
            be32(2, 1),
            be32(3, len),
            data(4, mask),
            data(5, &xor),
        ],
    )
}

fn cmp(op: u32, value: &[u8]) -> Vec<u8> {
    expr("cmp", &[be32(1, 1), be32(2, op), data(3, value)])
}

fn counter() -> Vec<u8> {
    expr(
        "counter",
        &[nla(1, &0u64.to_be_bytes()), nla(2, &0u64.to_be_bytes())],
    )
}

fn verdict(code: i32, chain: Option<&str>) -> Vec<u8> {
    let mut inner = be32(1, code as u32);
    if let Some(chain) = chain {
        inner.extend(string(2, chain));
    }
    let value = nla(2 | NESTED, &inner);
    expr("immediate", &[be32(1, 0), nla(2 | NESTED, &value)])
}

fn xt(kind: &str, name: &str, revision: u32, info: &[u8]) -> Vec<u8> {
    expr(kind, &[string(1, name), be32(2, revision), nla(3, info)])
}

/// `struct xt_conntrack_mtinfo3` asking for `state` alone.
fn conntrack_state(state: u16) -> Vec<u8> {
    let mut info = vec![0; 160];
    info[146..148].copy_from_slice(&1u16.to_ne_bytes());
    info[150..152].copy_from_slice(&state.to_ne_bytes());
    xt("match", "conntrack", 3, &info)
}

fn rule_of(expressions: &[Vec<u8>]) -> Rule {
    let reply = [
        vec![NFPROTO_IPV4, 0, 0, 0],
        string(NFTA_RULE_TABLE, "filter"),
        string(NFTA_RULE_CHAIN, "KUBE-FORWARD"),
        nla(NFTA_RULE_HANDLE, &12u64.to_be_bytes()),
        nla(NFTA_RULE_EXPRESSIONS | NESTED, &expressions.concat()),
    ]
    .concat();
    let (family, table, chain, rule) = parse_rule(&reply).unwrap();
    assert_eq!(
        (family, table.as_str(), chain.as_str(), rule.handle),
        (NFPROTO_IPV4, "filter", "KUBE-FORWARD", 12)
    );
    rule
}

fn to(net: &str) -> Condition {
    Condition::DestinationIn(net.parse().unwrap())
}

#[test]
fn base_chains_of_the_hooks_forwarded_packets_cross_are_hooked() {
    let chain = parse_chain(&chain_reply(NFPROTO_IPV4, "filter", "FORWARD", 2, 0)).unwrap();
    assert!(chain.hooked() && chain.sees_ip());
    assert_eq!(chain.ip_family(), Some(IpFamily::Ipv4));
    assert_eq!(
        (chain.table.as_str(), chain.name.as_str(), chain.policy),
        ("filter", "FORWARD", Some(NF_DROP))
    );
    for (family, hook, hooked) in [
        (NFPROTO_IPV4, 0, true),
        (NFPROTO_IPV4, 4, true),
        (NFPROTO_INET, 5, true),
        (NFPROTO_NETDEV, 0, true),
        (NFPROTO_NETDEV, 1, false),
        (NFPROTO_INET, 1, false),
        (NFPROTO_IPV4, 3, false),
    ] {
        let chain = parse_chain(&chain_reply(family, "t", "c", hook, 1)).unwrap();
        assert_eq!(chain.hooked(), hooked, "family {family} hook {hook}");
    }
    let ipv6 = parse_chain(&chain_reply(NFPROTO_IPV6, "filter", "FORWARD", 2, 1)).unwrap();
    assert!(ipv6.hooked() && ipv6.sees_ip(), "{ipv6:?}");
    assert_eq!(
        ipv6.ip_family(),
        Some(IpFamily::Ipv6),
        "an ip6 chain sees IPv6 alone"
    );
    let inet = parse_chain(&chain_reply(NFPROTO_INET, "filter", "FORWARD", 2, 1)).unwrap();
    assert_eq!(inet.ip_family(), None, "an inet chain sees both");
    let arp = parse_chain(&chain_reply(3, "filter", "FORWARD", 2, 1)).unwrap();
    assert!(!arp.sees_ip(), "an arp chain sees no IP: {arp:?}");
}

#[test]
fn a_regular_chain_has_no_hook() {
    let reply = [
        vec![NFPROTO_IPV4, 0, 0, 0],
        string(NFTA_CHAIN_TABLE, "filter"),
        string(NFTA_CHAIN_NAME, "KUBE-FORWARD"),
    ]
    .concat();
    let chain = parse_chain(&reply).unwrap();
    assert_eq!((chain.hook, chain.policy), (None, None));
    assert!(!chain.hooked());
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

    let rule = [
        vec![NFPROTO_IPV4, 0, 0, 0],
        string(NFTA_RULE_TABLE, "filter"),
        nla(
            NFTA_RULE_EXPRESSIONS | NESTED,
            &[
                payload_load(16, 4),
                cmp(0, &[10, 96, 0, 1]),
                verdict(-3, Some("KUBE-SVC")),
            ]
            .concat(),
        ),
    ]
    .concat();
    for cut in 0..rule.len() {
        let _ = parse_rule(&rule[..cut]);
        let mut flipped = rule.clone();
        flipped[cut] ^= 0xa5;
        let _ = parse_rule(&flipped);
    }
    assert_eq!(parse_rule(&[]), None);
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
fn the_request_is_a_dump_of_every_family() {
    let bytes = request(NFT_MSG_GETRULE, NFPROTO_UNSPEC, NLM_F_REQUEST | NLM_F_DUMP);
    let message = NetlinkBuffer::new_checked(&bytes[..]).unwrap();
    assert_eq!(message.length() as usize, bytes.len());
    assert_eq!(message.message_type(), 0x0a07);
    assert_eq!(message.flags(), NLM_F_REQUEST | NLM_F_DUMP);
    assert_eq!(message.payload(), [NFPROTO_UNSPEC, 0, 0, 0]);
}

/// kube-proxy's `-m conntrack --ctstate INVALID -j DROP`, as iptables-nft
/// writes it, and the same in native nft: `ct state invalid drop`.
#[test]
fn a_drop_of_conntracks_invalid_state_is_recognised_in_both_forms() {
    let xt_form = rule_of(&[conntrack_state(1), counter(), verdict(0, None)]);
    assert_eq!(
        (xt_form.conditions, xt_form.verdict),
        (vec![Condition::ConntrackInvalid], Verdict::Drop)
    );
    assert!(xt_form.effects.is_empty(), "{:?}", xt_form.effects);

    let ct_load = expr("ct", &[be32(1, 1), be32(2, 0)]);
    let native = rule_of(&[
        ct_load,
        bitwise(&1u32.to_ne_bytes()),
        cmp(1, &0u32.to_ne_bytes()),
        verdict(0, None),
    ]);
    assert_eq!(native.conditions, vec![Condition::ConntrackInvalid]);

    let established = rule_of(&[conntrack_state(2 | 4), verdict(1, None)]);
    assert_eq!(established.conditions, vec![Condition::Other]);
    assert_eq!(established.verdict, Verdict::Accept);
}

/// `-m mark --mark 0x4000/0x4000 -j ACCEPT` and `! --mark ... -j RETURN`.
#[test]
fn a_mark_test_is_read_with_its_mask() {
    let mark = 0x4000u32.to_ne_bytes();
    let comment = xt("match", "comment", 0, b"kubernetes forwarding rules\0");
    let accept = rule_of(&[
        comment,
        meta_load(3),
        bitwise(&mark),
        cmp(0, &mark),
        counter(),
        verdict(1, None),
    ]);
    let expected = Condition::Mark {
        mask: 0x4000,
        value: 0x4000,
        negated: false,
    };
    assert_eq!(
        (accept.conditions, accept.verdict),
        (vec![expected], Verdict::Accept)
    );
    let unmarked = rule_of(&[
        meta_load(3),
        bitwise(&mark),
        cmp(1, &mark),
        verdict(-5, None),
    ]);
    let expected = Condition::Mark {
        mask: 0x4000,
        value: 0x4000,
        negated: true,
    };
    assert_eq!(
        (unmarked.conditions, unmarked.verdict),
        (vec![expected], Verdict::Return)
    );
}

#[test]
fn a_destination_test_is_read_as_the_prefix_it_asks_for() {
    let service = rule_of(&[
        xt(
            "match",
            "comment",
            0,
            b"default/kubernetes:https cluster IP\0",
        ),
        payload_load(16, 4),
        cmp(0, &[10, 96, 0, 1]),
        meta_load(16),
        cmp(0, &[6]),
        xt("match", "tcp", 0, &[0; 12]),
        counter(),
        verdict(-3, Some("KUBE-SVC-NPX46M4PTMTKRN6Y")),
    ]);
    assert_eq!(
        service.conditions,
        vec![to("10.96.0.1/32"), Condition::Other, Condition::Other]
    );
    assert_eq!(
        service.verdict,
        Verdict::Jump("KUBE-SVC-NPX46M4PTMTKRN6Y".into())
    );

    let slash8 = rule_of(&[payload_load(16, 1), cmp(0, &[10]), verdict(0, None)]);
    assert_eq!(slash8.conditions, vec![to("10.0.0.0/8")]);
    let slash12 = rule_of(&[
        payload_load(16, 4),
        bitwise(&[255, 240, 0, 0]),
        cmp(0, &[10, 96, 0, 0]),
        verdict(0, None),
    ]);
    assert_eq!(slash12.conditions, vec![to("10.96.0.0/12")]);
    let ip6_service = rule_of(&[
        payload_load(24, 16),
        cmp(
            0,
            &"fd00:10:96::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        ),
        verdict(-3, Some("KUBE-SVC-6")),
    ]);
    assert_eq!(ip6_service.conditions, vec![to("fd00:10:96::1/128")]);
    let ip6_slash64 = rule_of(&[
        payload_load(24, 16),
        bitwise(&[[0xff; 8], [0; 8]].concat()),
        cmp(
            0,
            &[0xfd, 0, 0, 0x10, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        verdict(0, None),
    ]);
    assert_eq!(ip6_slash64.conditions, vec![to("fd00:10:96::/64")]);
    let ip6_source = rule_of(&[payload_load(8, 16), cmp(0, &[0; 16])]);
    assert_eq!(ip6_source.conditions, vec![Condition::Other], "ip6 saddr");
    let not_a_prefix = rule_of(&[
        payload_load(16, 4),
        bitwise(&[255, 0, 255, 0]),
        cmp(0, &[10, 0, 1, 0]),
    ]);
    assert_eq!(not_a_prefix.conditions, vec![Condition::Other]);
    let negated = rule_of(&[payload_load(16, 4), cmp(1, &[10, 96, 0, 1])]);
    assert_eq!(negated.conditions, vec![Condition::Other]);
    let source = rule_of(&[payload_load(12, 4), cmp(0, &[10, 96, 0, 1])]);
    assert_eq!(source.conditions, vec![Condition::Other]);
}

#[test]
fn matches_that_settle_forwarded_packets_are_read_from_their_structures() {
    let mut local = vec![0; 8];
    local[2..4].copy_from_slice(&4u16.to_ne_bytes());
    let nodeports = rule_of(&[
        xt("match", "addrtype", 1, &local),
        verdict(-3, Some("KUBE-NODEPORTS")),
    ]);
    assert_eq!(nodeports.conditions, vec![Condition::DestinationLocal]);
    local[4..8].copy_from_slice(&2u32.to_ne_bytes());
    let not_local = rule_of(&[xt("match", "addrtype", 1, &local)]);
    assert_eq!(
        not_local.conditions,
        vec![Condition::Other],
        "! --dst-type LOCAL"
    );

    let family = |ipv4, ipv6| vec![Condition::FamilyIn { ipv4, ipv6 }];
    let ipv6_only = rule_of(&[meta_load(15), cmp(0, &[10]), verdict(0, None)]);
    assert_eq!(
        ipv6_only.conditions,
        family(false, true),
        "meta nfproto ipv6"
    );
    let ipv4_only = rule_of(&[meta_load(15), cmp(0, &[2]), verdict(0, None)]);
    assert_eq!(
        ipv4_only.conditions,
        family(true, false),
        "meta nfproto ipv4"
    );
    let not_ipv4 = rule_of(&[meta_load(15), cmp(1, &[2]), verdict(0, None)]);
    assert_eq!(
        not_ipv4.conditions,
        family(false, true),
        "meta nfproto != ipv4"
    );
    let arp = rule_of(&[meta_load(1), cmp(0, &[0x08, 0x06]), verdict(0, None)]);
    assert_eq!(arp.conditions, family(false, false), "meta protocol arp");
}

#[test]
fn targets_writes_and_unknown_expressions_are_effects() {
    let masquerade = rule_of(&[xt("target", "MASQUERADE", 0, &[0; 8])]);
    assert_eq!(masquerade.effects, ["target MASQUERADE"]);
    let set_mark = rule_of(&[expr("meta", &[be32(2, 3), be32(3, 1)])]);
    assert_eq!(set_mark.effects, ["meta set"]);
    let nat = rule_of(&[expr("nat", &[be32(1, 1)])]);
    assert_eq!(nat.effects, ["nat"]);
    let recent = rule_of(&[xt("match", "recent", 0, &[0; 8])]);
    assert_eq!(recent.effects, ["match recent"]);
    let verdict_map = rule_of(&[
        payload_load(16, 4),
        expr("lookup", &[string(1, "svc"), be32(2, 1), be32(3, 0)]),
    ]);
    assert_eq!(verdict_map.verdict, Verdict::Other("a verdict map".into()));
}

/// `tcp option maxseg size set rt mtu`, MSS clamping: an `exthdr` that
/// writes. And a load whose destination register the reader does not know
/// leaves no earlier load to trust.
#[test]
fn mss_clamping_is_a_write_and_an_unknown_load_forgets_the_registers() {
    let clamp = rule_of(&[
        expr("rt", &[be32(1, 1), be32(2, 4)]),
        expr("exthdr", &[be32(2, 2), be32(3, 2), be32(4, 2), be32(7, 1)]),
    ]);
    assert_eq!(clamp.effects, ["exthdr set"]);
    let between = rule_of(&[
        payload_load(16, 4),
        expr("hash", &[be32(1, 2), be32(2, 1), be32(3, 4)]),
        cmp(0, &[10, 96, 0, 1]),
    ]);
    assert_eq!(between.conditions, vec![Condition::Other]);
    assert!(between.effects.is_empty(), "{:?}", between.effects);
}
