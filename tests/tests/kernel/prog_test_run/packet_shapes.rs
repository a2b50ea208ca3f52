//! Every packet shape the NAT programs meet, each in and out byte for byte:
//! the table of rows, and the test that runs them.

use super::*;

struct Row {
    name: &'static str,
    direction: Direction,
    input: Vec<u8>,
    expected: Vec<u8>,
    outcome: Outcome,
    /// The kinds of rule that rewrote it, each counted once.
    kinds: &'static [Kind],
}

/// A row the prefix remap alone rewrites.
fn translated(
    name: &'static str,
    direction: Direction,
    input: &Datagram,
    expected: &Datagram,
) -> Row {
    Row {
        name,
        direction,
        input: eth_ipv4(&input.bytes()),
        expected: eth_ipv4(&expected.bytes()),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    }
}

/// A row the prefix remap and a NatMapping both rewrite.
fn mapped(name: &'static str, direction: Direction, input: &Datagram, expected: &Datagram) -> Row {
    Row {
        kinds: &[Kind::Prefix, Kind::NatMapping],
        ..translated(name, direction, input, expected)
    }
}

fn untouched(name: &'static str, direction: Direction, frame: Vec<u8>, outcome: Outcome) -> Row {
    Row {
        name,
        direction,
        expected: frame.clone(),
        input: frame,
        outcome,
        kinds: &[],
    }
}

fn rows() -> Vec<Row> {
    use Direction::{Egress, Ingress};
    let mut rows = vec![
        translated(
            "udp egress, double NAT",
            Egress,
            &udp(A_POD1, B_POD1),
            &udp(A_POD1_AT_B, B_POD1),
        ),
        translated(
            "udp ingress, double NAT",
            Ingress,
            &udp(B_POD1, A_POD1_AT_B),
            &udp(B_POD1, A_POD1),
        ),
        translated(
            "tcp egress",
            Egress,
            &tcp(A_POD2, B_POD2),
            &tcp(A_POD2_AT_B, B_POD2),
        ),
        translated(
            "tcp ingress",
            Ingress,
            &tcp(B_POD2, A_POD2_AT_B),
            &tcp(B_POD2, A_POD2),
        ),
        translated(
            "external egress",
            Egress,
            &udp(A_EXT, B_EXT),
            &udp(A_EXT_AT_B, B_EXT),
        ),
        translated(
            "external ingress",
            Ingress,
            &tcp(B_EXT, A_EXT_AT_B),
            &tcp(B_EXT, A_EXT),
        ),
        translated(
            "single NAT egress",
            Egress,
            &tcp(A_POD1, S_POD),
            &tcp(A_POD1_AT_S, S_POD),
        ),
        translated(
            "single NAT ingress",
            Ingress,
            &udp(S_POD, A_POD1_AT_S),
            &udp(S_POD, A_POD1),
        ),
    ];

    // MSS clamping: a SYN or SYN-ACK, either way, advertises no more than
    // the tunnel carries; one below that is left alone.
    let syn = |src, dst, ack, mss| {
        Datagram::new(
            src,
            dst,
            L4::TcpSyn {
                sport: 40100,
                dport: 80,
                ack,
                mss,
            },
        )
    };
    let clamped = |name, direction, input: Datagram, expected: Datagram| Row {
        kinds: &[Kind::Prefix, Kind::MssClamp],
        ..translated(name, direction, &input, &expected)
    };
    rows.extend([
        clamped(
            "mss clamp, syn egress",
            Egress,
            syn(A_POD1, B_POD1, false, 1460),
            syn(A_POD1_AT_B, B_POD1, false, TUNNEL_MSS),
        ),
        clamped(
            "mss clamp, syn-ack egress",
            Egress,
            syn(A_POD2, B_POD2, true, 8960),
            syn(A_POD2_AT_B, B_POD2, true, TUNNEL_MSS),
        ),
        clamped(
            "mss clamp, syn-ack ingress",
            Ingress,
            syn(B_POD1, A_POD1_AT_B, true, 1460),
            syn(B_POD1, A_POD1, true, TUNNEL_MSS),
        ),
        translated(
            "mss below the clamp left alone",
            Egress,
            &syn(A_POD1, B_POD1, false, 1200),
            &syn(A_POD1_AT_B, B_POD1, false, 1200),
        ),
        untouched(
            "a syn of no peer keeps its mss",
            Egress,
            eth_ipv4(&syn(A_POD1, [198, 51, 100, 7], false, 1460).bytes()),
            Outcome::Passed,
        ),
    ]);

    // NatMapping: after the prefix step, b's packets to the externalIP go to
    // the endpoint behind it; the endpoint's packets to b carry it back.
    rows.extend([
        mapped(
            "natmapping DNAT ingress, tcp",
            Ingress,
            &tcp(B_POD1, MAPPED_EXT_AT_B),
            &tcp(B_POD1, S_POD),
        ),
        mapped(
            "natmapping reverse egress, tcp",
            Egress,
            &tcp(S_POD, B_POD1),
            &tcp(MAPPED_EXT_AT_B, B_POD1),
        ),
        mapped(
            "natmapping DNAT ingress, udp",
            Ingress,
            &udp(B_POD2, MAPPED_EXT_AT_B),
            &udp(B_POD2, S_POD),
        ),
    ]);
    let echo = Datagram::new(B_POD1, MAPPED_EXT_AT_B, L4::Echo { id: 9, seq: 1 });
    rows.push(mapped(
        "natmapping DNAT ingress, icmp echo",
        Ingress,
        &echo,
        &echo.between(B_POD1, S_POD),
    ));
    let reply = Datagram::new(S_POD, B_POD1, L4::Echo { id: 9, seq: 1 });
    rows.push(mapped(
        "natmapping reverse egress, icmp echo reply",
        Egress,
        &reply,
        &reply.between(MAPPED_EXT_AT_B, B_POD1),
    ));
    // b's router cannot forward what the endpoint sent b: the quote names the endpoint again.
    let quoted = udp(MAPPED_EXT_AT_B, B_POD1);
    let err = icmp_error(3, 4, B_GW_WAN, MAPPED_EXT_AT_B, quoted, 28);
    let want = err.between(B_GW_WAN, S_POD).quoting(S_POD, B_POD1);
    rows.push(mapped(
        "natmapping ingress icmp error, quote translated back",
        Ingress,
        &err,
        &want,
    ));
    let ping = |dst| {
        Datagram::new(
            B_POD1,
            dst,
            L4::Udp {
                sport: 40200,
                dport: 12345,
                payload: br#"{"msgType":"PING"}"#.to_vec(),
                zero_csum: false,
            },
        )
    };
    rows.push(mapped(
        "natmapping to the conncheck, udp 12345",
        Ingress,
        &ping(A_EXT_FIRST_AT_B),
        &ping(CONNCHECK),
    ));
    rows.push(untouched(
        "natmapping of b does not apply to peer s",
        Ingress,
        eth_ipv4(&udp(S_POD, MAPPED_EXT).bytes()),
        Outcome::Passed,
    ));

    let zero = Datagram::new(
        A_POD1,
        B_POD1,
        L4::Udp {
            sport: 1,
            dport: 2,
            payload: vec![7; 9],
            zero_csum: true,
        },
    );
    rows.push(translated(
        "udp checksum 0 stays 0",
        Egress,
        &zero,
        &zero.between(A_POD1_AT_B, B_POD1),
    ));

    let echo = Datagram::new(A_POD1, B_POD1, L4::Echo { id: 77, seq: 3 });
    rows.push(translated(
        "icmp echo egress",
        Egress,
        &echo,
        &echo.between(A_POD1_AT_B, B_POD1),
    ));
    let echo_in = echo.between(B_POD1, A_POD1_AT_B);
    rows.push(translated(
        "icmp echo ingress",
        Ingress,
        &echo_in,
        &echo_in.between(B_POD1, A_POD1),
    ));

    // a-pod1 refuses a datagram from b: the quoted packet travelled towards a.
    let quoted = udp(B_POD1, A_POD1);
    let len = quoted.bytes().len();
    let err = icmp_error(3, 3, A_POD1, B_POD1, quoted, len);
    let want = err
        .between(A_POD1_AT_B, B_POD1)
        .quoting(B_POD1, A_POD1_AT_B);
    rows.push(translated(
        "icmp port unreachable egress, quoted udp",
        Egress,
        &err,
        &want,
    ));

    // b's gateway (an address of no peer) says TTL exceeded for a-pod1's SYN;
    // the peer is found through the quoted packet, whose TCP checksum is quoted too.
    let quoted = tcp(A_POD1_AT_B, B_POD1);
    let err = icmp_error(11, 0, B_GW_WAN, A_POD1_AT_B, quoted.clone(), 40);
    let want = err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1);
    rows.push(translated(
        "icmp time exceeded ingress from a router, quoted tcp",
        Ingress,
        &err,
        &want,
    ));
    // RFC 792 minimum quote: 8 bytes of TCP, no checksum to update.
    let err = icmp_error(3, 4, B_GW_WAN, A_POD1_AT_B, quoted, 28);
    let want = err.between(B_GW_WAN, A_POD1).quoting(A_POD1, B_POD1);
    rows.push(translated(
        "icmp frag needed ingress, 8-byte quote",
        Ingress,
        &err,
        &want,
    ));

    let mut with_options = tcp(A_POD1, B_POD1);
    with_options.options = vec![1, 1, 1, 0];
    rows.push(translated(
        "ip options, tcp egress",
        Egress,
        &with_options,
        &with_options.between(A_POD1_AT_B, B_POD1),
    ));

    let big = Datagram::new(
        A_POD1,
        B_POD1,
        L4::Udp {
            sport: 5,
            dport: 6,
            payload: (0..64).collect(),
            zero_csum: false,
        },
    );
    let big_out = big.between(A_POD1_AT_B, B_POD1);
    rows.push(Row {
        name: "first fragment: udp checksum over the whole datagram",
        direction: Egress,
        input: eth_ipv4(&big.fragment(0, 32)),
        expected: eth_ipv4(&big_out.fragment(0, 32)),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    });
    rows.push(Row {
        name: "later fragment: L3 only",
        direction: Egress,
        input: eth_ipv4(&big.fragment(32, 72)),
        expected: eth_ipv4(&big_out.fragment(32, 72)),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    });

    let short = Datagram::new(
        A_POD1,
        B_POD1,
        L4::Udp {
            sport: 5,
            dport: 6,
            payload: vec![1, 2],
            zero_csum: false,
        },
    );
    let pad = |mut frame: Vec<u8>| {
        frame.resize(60, 0xee);
        frame
    };
    rows.push(Row {
        name: "ethernet padding after the datagram is left alone",
        direction: Egress,
        input: pad(eth_ipv4(&short.bytes())),
        expected: pad(eth_ipv4(&short.between(A_POD1_AT_B, B_POD1).bytes())),
        outcome: Outcome::Translated,
        kinds: &[Kind::Prefix],
    });

    // Nothing to do: handed on untouched, counted as passed.
    rows.push(untouched(
        "no peer for the destination",
        Egress,
        eth_ipv4(&udp(A_POD1, [10, 9, 9, 9]).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "source not ours (node traffic)",
        Egress,
        eth_ipv4(&udp([172, 16, 1, 1], B_POD1).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "destination not remapped",
        Ingress,
        eth_ipv4(&udp(B_POD1, [10, 244, 0, 9]).bytes()),
        Outcome::Passed,
    ));
    rows.push(untouched(
        "external not remapped by a single-NAT peer",
        Egress,
        eth_ipv4(&udp(A_EXT, S_POD).bytes()),
        Outcome::Passed,
    ));
    // The IPv6 NAT reads it: a payload length (0x6060) past its end.
    rows.push(untouched(
        "ipv6 longer than it is",
        Egress,
        ethernet(ETH_P_IPV6, &[0x60; 48]),
        Outcome::Unparseable,
    ));
    rows.push(untouched(
        "arp",
        Ingress,
        ethernet(ETH_P_ARP, &[0; 28]),
        Outcome::Passed,
    ));

    // Cannot be parsed: handed on untouched, counted as unparseable.
    let mut cut = udp(A_POD1, B_POD1).bytes();
    cut.truncate(cut.len() - 6);
    rows.push(untouched(
        "truncated datagram",
        Egress,
        eth_ipv4(&cut),
        Outcome::Unparseable,
    ));
    rows.push(untouched(
        "truncated tcp header",
        Egress,
        eth_ipv4(&tcp_header_cut_at(10)),
        Outcome::Unparseable,
    ));
    let mut bad_ihl = udp(A_POD1, B_POD1).bytes();
    bad_ihl[0] = 0x44;
    rows.push(untouched(
        "header length below 20",
        Egress,
        eth_ipv4(&bad_ihl),
        Outcome::Unparseable,
    ));
    let quoted = udp(B_POD1, A_POD1);
    rows.push(untouched(
        "icmp error quoting less than an IP header",
        Egress,
        eth_ipv4(&icmp_error(3, 3, A_POD1, B_POD1, quoted, 12).bytes()),
        Outcome::Unparseable,
    ));
    rows
}

#[test]
fn every_packet_shape_comes_out_byte_exact() {
    let harness = Harness::new();
    let mut failures = Vec::new();
    for row in rows() {
        let before = harness.counters.read().unwrap();
        let (ret, out) = harness.run(row.direction, &row.input);
        let after = harness.counters.read().unwrap();
        let slot = |s: u32| s as usize;
        let mut want: Vec<usize> = row
            .kinds
            .iter()
            .map(|k| slot(counters::kind_slot(Link::Eth, row.direction, *k)))
            .collect();
        want.push(slot(counters::outcome_slot(
            Link::Eth,
            row.direction,
            row.outcome,
        )));
        want.sort_unstable();
        let moved: Vec<usize> = (0..before.len())
            .filter(|i| after[*i] != before[*i])
            .collect();
        if ret != HAND_ON {
            failures.push(format!("{}: returned {ret}, want {HAND_ON}", row.name));
        }
        if out != row.expected {
            failures.push(format!(
                "{}: output differs\n got:\n{}\nwant:\n{}",
                row.name,
                hex(&out),
                hex(&row.expected)
            ));
        }
        if moved != want || want.iter().any(|s| after[*s] != before[*s] + 1) {
            failures.push(format!(
                "{}: counters moved at {moved:?}, want only slots {want:?} ({:?}, {:?}) by one",
                row.name, row.outcome, row.kinds
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} row(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
