use super::*;

const FILTER: &str = "nftables ip filter";
const NAT: &str = "nftables ip nat";
const MASQ_BIT: u32 = 0x4000;

fn chain(table: &str, name: &str, hooked: bool, rules: Vec<Rule>) -> Chain {
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| Rule {
            handle: i as u64 + 1,
            ..rule
        })
        .collect();
    Chain {
        table: table.into(),
        family: Some(IpFamily::Ipv4),
        name: name.into(),
        hooked,
        drops: false,
        rules,
    }
}

fn rule(conditions: Vec<Condition>, verdict: Verdict) -> Rule {
    Rule {
        conditions,
        verdict,
        ..Rule::default()
    }
}

fn with_effect(effect: &str, conditions: Vec<Condition>) -> Rule {
    Rule {
        effects: vec![effect.into()],
        ..rule(conditions, Verdict::Continue)
    }
}

fn jump(to: &str, conditions: Vec<Condition>) -> Rule {
    rule(conditions, Verdict::Jump(to.into()))
}

fn to(net: &str) -> Condition {
    Condition::DestinationIn(net.parse().unwrap())
}

fn marked(negated: bool) -> Condition {
    Condition::Mark {
        mask: MASQ_BIT,
        value: MASQ_BIT,
        negated,
    }
}

/// kube-proxy's iptables-mode rules (v1.31) at the hooks forwarded packets
/// cross, for the `kubernetes` Service with one endpoint and a Service
/// without endpoints, as iptables-nft writes them.
fn kube_proxy() -> Vec<Chain> {
    use Condition::{ConntrackInvalid, DestinationLocal, Other};
    vec![
        chain(
            FILTER,
            "FORWARD",
            true,
            vec![
                jump("KUBE-PROXY-FIREWALL", vec![Other]),
                jump("KUBE-FORWARD", vec![]),
                jump("KUBE-SERVICES", vec![Other]),
                jump("KUBE-EXTERNAL-SERVICES", vec![Other]),
            ],
        ),
        chain(FILTER, "KUBE-PROXY-FIREWALL", false, vec![]),
        chain(
            FILTER,
            "KUBE-FORWARD",
            false,
            vec![
                rule(vec![ConntrackInvalid, Other], Verdict::Drop),
                rule(vec![marked(false)], Verdict::Accept),
                rule(vec![Other], Verdict::Accept),
            ],
        ),
        chain(
            FILTER,
            "KUBE-SERVICES",
            false,
            vec![Rule {
                effects: vec!["target REJECT".into()],
                ..rule(vec![to("10.96.0.10/32"), Other], Verdict::Continue)
            }],
        ),
        chain(
            FILTER,
            "KUBE-EXTERNAL-SERVICES",
            false,
            vec![Rule {
                effects: vec!["target REJECT".into()],
                ..rule(vec![DestinationLocal, Other], Verdict::Continue)
            }],
        ),
        chain(NAT, "PREROUTING", true, vec![jump("KUBE-SERVICES", vec![])]),
        chain(
            NAT,
            "KUBE-SERVICES",
            false,
            vec![
                jump("KUBE-SVC-NPX46M4PTMTKRN6Y", vec![to("10.96.0.1/32"), Other]),
                jump("KUBE-NODEPORTS", vec![DestinationLocal]),
            ],
        ),
        chain(
            NAT,
            "KUBE-SVC-NPX46M4PTMTKRN6Y",
            false,
            vec![
                jump("KUBE-MARK-MASQ", vec![to("10.96.0.1/32"), Other]),
                jump("KUBE-SEP-AAAA", vec![]),
            ],
        ),
        chain(
            NAT,
            "KUBE-SEP-AAAA",
            false,
            vec![
                jump("KUBE-MARK-MASQ", vec![to("172.18.0.2/32")]),
                with_effect("target DNAT", vec![Other]),
            ],
        ),
        chain(
            NAT,
            "KUBE-MARK-MASQ",
            false,
            vec![with_effect("target MARK", vec![])],
        ),
        chain(NAT, "KUBE-NODEPORTS", false, vec![]),
        chain(
            NAT,
            "POSTROUTING",
            true,
            vec![jump("KUBE-POSTROUTING", vec![])],
        ),
        chain(
            NAT,
            "KUBE-POSTROUTING",
            false,
            vec![
                rule(vec![marked(true)], Verdict::Return),
                with_effect("target MARK", vec![]),
                with_effect("target MASQUERADE", vec![]),
            ],
        ),
    ]
}

#[test]
fn kube_proxys_rules_act_only_on_its_services_addresses() {
    let proof = prove(&kube_proxy(), IpFamily::Ipv4);
    assert_eq!(proof.acting, vec![], "{proof:?}");
    let expected: Vec<IpNet> = vec![
        "10.96.0.1/32".parse().unwrap(),
        "10.96.0.10/32".parse().unwrap(),
    ];
    assert_eq!(proof.stack_destinations, expected);
}

#[test]
fn an_unconditional_masquerade_acts() {
    let mut chains = kube_proxy();
    let postrouting = chains
        .iter_mut()
        .find(|c| c.name == "KUBE-POSTROUTING")
        .unwrap();
    postrouting.rules.remove(0);
    let proof = prove(&chains, IpFamily::Ipv4);
    assert_eq!(
        proof
            .acting
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "nftables ip nat chain KUBE-POSTROUTING: rule 2 target MARK",
            "nftables ip nat chain KUBE-POSTROUTING: rule 3 target MASQUERADE"
        ]
    );
}

#[test]
fn a_drop_is_inert_only_when_it_asks_for_conntracks_invalid_state() {
    let drops = |conditions| {
        let chains = vec![chain(
            FILTER,
            "FORWARD",
            true,
            vec![rule(conditions, Verdict::Drop)],
        )];
        prove(&chains, IpFamily::Ipv4).acting.len()
    };
    assert_eq!(drops(vec![Condition::ConntrackInvalid]), 0);
    assert_eq!(
        drops(vec![Condition::ConntrackInvalid, Condition::Other]),
        0
    );
    assert_eq!(drops(vec![Condition::Other]), 1);
    assert_eq!(drops(vec![]), 1);
    let with_log = Rule {
        effects: vec!["log".into()],
        ..rule(vec![Condition::ConntrackInvalid], Verdict::Drop)
    };
    let chains = vec![chain(FILTER, "FORWARD", true, vec![with_log])];
    assert_eq!(
        prove(&chains, IpFamily::Ipv4).acting.len(),
        2,
        "a logged drop: the log and the drop"
    );
}

#[test]
fn a_rule_for_one_destination_sends_only_that_destination_through_the_stack() {
    let policy = rule(vec![to("10.244.0.133/32"), Condition::Other], Verdict::Drop);
    let accept = rule(vec![to("10.244.0.0/24")], Verdict::Accept);
    let chains = vec![chain(FILTER, "FORWARD", true, vec![accept, policy])];
    let proof = prove(&chains, IpFamily::Ipv4);
    assert_eq!(proof.acting, vec![]);
    assert_eq!(
        proof.stack_destinations,
        vec!["10.244.0.133/32".parse::<IpNet>().unwrap()],
        "an accept for a prefix costs nothing"
    );
    let everywhere = rule(vec![to("0.0.0.0/0")], Verdict::Drop);
    let chains = vec![chain(FILTER, "FORWARD", true, vec![everywhere])];
    assert_eq!(
        prove(&chains, IpFamily::Ipv4).acting.len(),
        1,
        "a /0 is every destination"
    );
}

#[test]
fn an_accept_that_always_applies_ends_the_chain_and_one_that_may_does_not() {
    let drop = rule(vec![], Verdict::Drop);
    let always = vec![chain(
        FILTER,
        "FORWARD",
        true,
        vec![rule(vec![], Verdict::Accept), drop.clone()],
    )];
    assert_eq!(prove(&always, IpFamily::Ipv4).acting, vec![]);
    let maybe = vec![chain(
        FILTER,
        "FORWARD",
        true,
        vec![rule(vec![Condition::Other], Verdict::Accept), drop],
    )];
    assert_eq!(prove(&maybe, IpFamily::Ipv4).acting.len(), 1);
}

#[test]
fn a_mark_test_decides_for_unmarked_packets() {
    let drop_marked = rule(vec![marked(false)], Verdict::Drop);
    let chains = vec![chain(FILTER, "FORWARD", true, vec![drop_marked])];
    assert_eq!(
        prove(&chains, IpFamily::Ipv4).acting,
        vec![],
        "unmarked packets never match"
    );
    let drop_unmarked = rule(vec![marked(true)], Verdict::Drop);
    let chains = vec![chain(FILTER, "FORWARD", true, vec![drop_unmarked])];
    assert_eq!(prove(&chains, IpFamily::Ipv4).acting.len(), 1);
}

#[test]
fn a_dropping_policy_a_lost_chain_a_deep_nest_and_an_unknown_verdict_act() {
    let mut policy = chain(FILTER, "FORWARD", true, vec![]);
    policy.drops = true;
    assert_eq!(prove(&[policy], IpFamily::Ipv4).acting.len(), 1);

    let lost = chain(FILTER, "FORWARD", true, vec![jump("GONE", vec![])]);
    assert_eq!(prove(&[lost], IpFamily::Ipv4).acting.len(), 1);

    let nest: Vec<Chain> = (0..=MAX_JUMP_DEPTH + 1)
        .map(|i| {
            let next = format!("C{}", i + 1);
            chain(FILTER, &format!("C{i}"), i == 0, vec![jump(&next, vec![])])
        })
        .collect();
    let acting = prove(&nest, IpFamily::Ipv4).acting;
    assert_eq!(acting.len(), 1, "{acting:?}");
    assert!(acting[0].why.contains("deeper"), "{acting:?}");

    let queue = rule(vec![], Verdict::Other("queue".into()));
    assert_eq!(
        prove(
            &[chain(FILTER, "FORWARD", true, vec![queue])],
            IpFamily::Ipv4
        )
        .acting
        .len(),
        1
    );
}

#[test]
fn a_jump_for_one_destination_into_an_acting_chain_sends_that_destination_through() {
    let chains = vec![
        chain(
            FILTER,
            "FORWARD",
            true,
            vec![jump("POLICY", vec![to("10.0.0.0/8")])],
        ),
        chain(FILTER, "POLICY", false, vec![rule(vec![], Verdict::Drop)]),
    ];
    let proof = prove(&chains, IpFamily::Ipv4);
    assert_eq!(proof.acting, vec![]);
    assert_eq!(
        proof.stack_destinations,
        vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]
    );
    let inert = vec![
        chain(
            FILTER,
            "FORWARD",
            true,
            vec![jump("POLICY", vec![to("10.0.0.0/8")])],
        ),
        chain(FILTER, "POLICY", false, vec![rule(vec![], Verdict::Accept)]),
    ];
    assert_eq!(prove(&inert, IpFamily::Ipv4), Proof::default());
}

#[test]
fn a_chain_that_is_not_hooked_is_read_only_through_jumps() {
    let unreached = chain(FILTER, "SPARE", false, vec![rule(vec![], Verdict::Drop)]);
    assert_eq!(prove(&[unreached], IpFamily::Ipv4), Proof::default());
}

/// kube-proxy's IPv6 rules in `ip6 filter` and `ip6 nat` beside its IPv4
/// ones, and a rule of an `inet` table for IPv4 alone: each family's proof
/// reads its own chains.
fn dual_stack() -> Vec<Chain> {
    let mut chains = kube_proxy();
    let six = |table: &str, name: &str, hooked: bool, rules: Vec<Rule>| Chain {
        family: Some(IpFamily::Ipv6),
        ..chain(table, name, hooked, rules)
    };
    chains.extend([
        six(
            "nftables ip6 nat",
            "PREROUTING",
            true,
            vec![jump("KUBE-SERVICES", vec![])],
        ),
        six(
            "nftables ip6 nat",
            "KUBE-SERVICES",
            false,
            vec![with_effect("target DNAT", vec![to("fd00:10:96::1/128")])],
        ),
        Chain {
            family: None,
            ..chain(
                "nftables inet cni",
                "forward",
                true,
                vec![with_effect(
                    "target MASQUERADE",
                    vec![Condition::FamilyIn {
                        ipv4: true,
                        ipv6: false,
                    }],
                )],
            )
        },
    ]);
    chains
}

#[test]
fn each_family_is_proved_over_the_chains_its_packets_cross() {
    let chains = dual_stack();
    let ipv6 = prove(&chains, IpFamily::Ipv6);
    assert_eq!(ipv6.acting, vec![], "{ipv6:?}");
    assert_eq!(
        ipv6.stack_destinations,
        vec!["fd00:10:96::1/128".parse::<IpNet>().unwrap()]
    );
    let ipv4 = prove(&chains, IpFamily::Ipv4);
    assert_eq!(
        ipv4.acting.len(),
        1,
        "the inet masquerade, IPv4's: {ipv4:?}"
    );
    assert!(ipv4.acting[0].place.contains("inet cni"), "{ipv4:?}");
}

#[test]
fn a_test_of_the_other_familys_destination_may_match_any_packet() {
    // `ip daddr` bytes, in an ip6 table, are part of the IPv6 source.
    let stray = Chain {
        family: Some(IpFamily::Ipv6),
        ..chain(
            "nftables ip6 raw",
            "PREROUTING",
            true,
            vec![with_effect("target NOTRACK", vec![to("10.96.0.1/32")])],
        )
    };
    assert_eq!(
        prove(std::slice::from_ref(&stray), IpFamily::Ipv6)
            .acting
            .len(),
        1
    );
    assert_eq!(
        prove(&[stray], IpFamily::Ipv4),
        Proof::default(),
        "an ip6 chain is no IPv4 packet's"
    );
}
