//! The IPv6 NAT (docs/design.md#dual-stack), reached from the IPv4 NAT's
//! first stage by tail call, on crafted packets: DESIGN's dual-stack
//! addresses, each output compared whole with one built from scratch with
//! full checksums, and each packet counted once where the IPv4 NAT counts.

use isthmus_agent::kernel::peer_table::PeerMap6;
use isthmus_common::{
    ipv6::{ICMPV6_ECHO_REQUEST, ICMPV6_PACKET_TOO_BIG},
    wire::Be128,
};
use isthmus_tests::packet6::{Packet6, addr6, icmp6, icmp6_error, tcp6, udp6};

use super::*;

/// a's view of b in DESIGN's dual-stack lab: both sides remapped.
fn a_to_b() -> TunnelEndpoint {
    TunnelEndpoint::new("tep-b6", "liqo-tenant-b").ipv6(
        [
            "fd00:10:244::/64",
            "fd00:10:0:40::/64",
            "fd00:192:168::/64",
            "fd00:10:0:41::/64",
        ],
        [
            "fd00:10:244::/64",
            "fd00:10::/64",
            "fd00:192:168::/64",
            "fd00:10:0:1::/64",
        ],
    )
}

/// The stateless harness, with peer b's IPv6 networks under its ID.
pub(super) fn harness() -> Harness {
    with_peer_b(Harness::new(), SecurityMode::FullPodToPod)
}

/// `h` with peer b's IPv6 networks under its ID, in security `mode`.
pub(super) fn with_peer_b(h: Harness, mode: SecurityMode) -> Harness {
    with_peer_b_flagged(h, mode, 0)
}

/// As [`with_peer_b`], with `flags` added to the peer's rules.
fn with_peer_b_flagged(mut h: Harness, mode: SecurityMode, flags: u32) -> Harness {
    let mut peers = PeerMap6::new(
        h.ebpf.take_map(names::MAP_PEERS6).unwrap(),
        h.ebpf.take_map(names::MAP_PEER_OWNERS6).unwrap(),
        h.ebpf.take_map(names::MAP_PREFIX_LENS6).unwrap(),
    )
    .unwrap();
    let yaml = a_to_b().to_string();
    let docs = parse_documents("test.yaml".as_ref(), &yaml);
    let Ok(Object::TunnelEndpoint(raw)) = &docs[0] else {
        panic!("{docs:?}")
    };
    let peer = Peer::from_raw(raw, "test.yaml").unwrap();
    let mut nat = peer.nat6(1, mode).expect("IPv6 rules");
    nat.flags |= flags;
    for (_, net) in peer.ipv6.unwrap().views(peer.layout) {
        peers.put(net, &nat, None).unwrap();
    }
    h
}

pub(super) fn a_pod1() -> [u8; 16] {
    addr6("fd00:10:244::5")
}
pub(super) fn a_pod1_at_b() -> [u8; 16] {
    addr6("fd00:10:0:40::5")
}
pub(super) fn a_pod2() -> [u8; 16] {
    addr6("fd00:10:244:0:8000::133")
}
pub(super) fn a_pod2_at_b() -> [u8; 16] {
    addr6("fd00:10:0:40:8000::133")
}
pub(super) fn b_pod1() -> [u8; 16] {
    addr6("fd00:10::5")
}

/// What a packet should come to.
pub(super) enum Fate {
    /// Handed on as these bytes, counted with this outcome and these kinds.
    Out(Vec<u8>, Outcome, &'static [Kind]),
    /// Dropped, for this reason.
    Dropped(DropReason),
}

/// Runs `input` through the NAT of `direction` and checks its fate and its
/// counts: every slot that moved, and only those.
pub(super) fn check(
    h: &Harness,
    name: &str,
    direction: Direction,
    input: &[u8],
    fate: Fate,
) -> Vec<String> {
    let before = h.counters.read().unwrap();
    let (ret, out) = h.run(direction, &ethernet(ETH_P_IPV6, input));
    let after = h.counters.read().unwrap();
    let slot = |s: u32| s as usize;
    let mut failures = Vec::new();
    let (want_ret, mut want) = match &fate {
        Fate::Out(expected, outcome, kinds) => {
            let frame = ethernet(ETH_P_IPV6, expected);
            if out != frame {
                failures.push(format!(
                    "{name}: output differs\n got:\n{}\nwant:\n{}",
                    hex(&out),
                    hex(&frame)
                ));
            }
            let mut want: Vec<usize> = kinds
                .iter()
                .map(|k| slot(counters::kind_slot(Link::Eth, direction, *k)))
                .collect();
            want.push(slot(counters::outcome_slot(Link::Eth, direction, *outcome)));
            (HAND_ON, want)
        }
        Fate::Dropped(reason) => (
            2,
            vec![
                slot(counters::outcome_slot(
                    Link::Eth,
                    direction,
                    Outcome::Dropped,
                )),
                slot(counters::drop_slot(Link::Eth, direction, *reason)),
            ],
        ),
    };
    want.sort_unstable();
    if ret != want_ret {
        failures.push(format!("{name}: returned {ret}, want {want_ret}"));
    }
    let moved: Vec<usize> = (0..before.len())
        .filter(|i| after[*i] != before[*i])
        .collect();
    if moved != want || want.iter().any(|s| after[*s] != before[*s] + 1) {
        failures.push(format!(
            "{name}: counters moved at {moved:?}, want {want:?}"
        ));
    }
    failures
}

/// A SYN advertising an MSS of 1460.
fn syn(src: [u8; 16], dst: [u8; 16], mss: u16) -> Packet6 {
    let [hi, lo] = mss.to_be_bytes();
    Packet6::new(src, dst, tcp6(40000, 80, 0x02, &[2, 4, hi, lo]))
}

#[test]
fn nat66_rewrites_each_sides_prefix_and_every_checksum() {
    use Direction::{Egress, Ingress};
    let h = harness();
    let udp = Packet6::new(a_pod1(), b_pod1(), udp6(5353, 53, b"query"));
    let echo = Packet6::new(
        a_pod2(),
        b_pod1(),
        icmp6(ICMPV6_ECHO_REQUEST, [0, 7, 0, 1], b"ping"),
    );
    let reply = Packet6::new(b_pod1(), a_pod1_at_b(), tcp6(80, 40000, 0x12, &[]));
    let rows = [
        (
            "udp egress",
            Egress,
            udp.bytes(),
            udp.between(a_pod1_at_b(), b_pod1()).bytes(),
            &[Kind::Prefix][..],
        ),
        (
            "icmpv6 echo egress, whose checksum covers the addresses",
            Egress,
            echo.bytes(),
            echo.between(a_pod2_at_b(), b_pod1()).bytes(),
            &[Kind::Prefix][..],
        ),
        (
            "tcp ingress",
            Ingress,
            reply.bytes(),
            reply.between(b_pod1(), a_pod1()).bytes(),
            &[Kind::Prefix][..],
        ),
        (
            "syn egress, MSS clamped to the tunnel's MTU less 60",
            Egress,
            syn(a_pod1(), b_pod1(), 1460).bytes(),
            syn(a_pod1_at_b(), b_pod1(), TUNNEL_MSS - 20).bytes(),
            &[Kind::Prefix, Kind::MssClamp][..],
        ),
        (
            "behind hop-by-hop and destination options",
            Egress,
            udp.with_options(3).bytes(),
            udp.with_options(3).between(a_pod1_at_b(), b_pod1()).bytes(),
            &[Kind::Prefix][..],
        ),
    ];
    let mut failures = Vec::new();
    for (name, direction, input, expected, kinds) in rows {
        let fate = Fate::Out(expected, Outcome::Translated, kinds);
        failures.extend(check(&h, name, direction, &input, fate));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn fragments_take_the_rules_by_their_addresses_and_a_tiny_first_one_is_dropped() {
    let h = harness();
    let whole = Packet6::new(a_pod1(), b_pod1(), udp6(5353, 53, &[7; 64]));
    let first = whole.in_fragment(0, true, 0x0102_0304);
    let mut failures = check(
        &h,
        "first fragment",
        Direction::Egress,
        &first.bytes(),
        Fate::Out(
            first.between(a_pod1_at_b(), b_pod1()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    );
    // A later fragment's data is no header: left as it is, its addresses
    // rewritten.
    let data = [9u8; 24];
    let later = whole.in_fragment(9, false, 0x0102_0304);
    failures.extend(check(
        &h,
        "later fragment",
        Direction::Egress,
        &later.with_segment(&data),
        Fate::Out(
            later.between(a_pod1_at_b(), b_pod1()).with_segment(&data),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    ));
    // RFC 7112: the first fragment holds 4 bytes of the UDP header.
    failures.extend(check(
        &h,
        "tiny first fragment",
        Direction::Egress,
        &first.with_segment(&[0x14, 0xe9, 0, 53]),
        Fate::Dropped(DropReason::TinyFragment),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn hostile_ipv6_headers_are_dropped_or_refused_and_counted() {
    let h = harness();
    let udp = Packet6::new(b_pod1(), a_pod1_at_b(), udp6(53, 5353, b"answer"));
    let mut failures = check(
        &h,
        "nine extension headers",
        Direction::Ingress,
        &udp.with_options(9).bytes(),
        Fate::Dropped(DropReason::ExtensionHeaders),
    );
    // Eight is the bound: still walked.
    failures.extend(check(
        &h,
        "eight extension headers",
        Direction::Ingress,
        &udp.with_options(8).bytes(),
        Fate::Out(
            udp.with_options(8).between(b_pod1(), a_pod1()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    ));
    // A payload length past the packet's end: from a peer, not let in.
    let mut long = udp.bytes();
    long[4..6].copy_from_slice(&999u16.to_be_bytes());
    failures.extend(check(
        &h,
        "payload length past the end",
        Direction::Ingress,
        &long,
        Fate::Dropped(DropReason::Denied),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let unparseable =
        h.denied.read().unwrap()[counters::deny_slot(1, DenyReason::Unparseable) as usize];
    assert_eq!(unparseable, 1, "the peer is charged the unparseable packet");
}

#[test]
fn an_icmpv6_error_and_the_packet_it_quotes_are_translated_back_to_the_sender() {
    let h = harness();
    // a-pod1's datagram as it left, seen by b's router: too big.
    let sent = Packet6::new(a_pod1_at_b(), b_pod1(), udp6(5353, 53, &[1; 32]));
    let router = addr6("fd00:10::1");
    let error = icmp6_error(
        router,
        a_pod1_at_b(),
        ICMPV6_PACKET_TOO_BIG,
        1280u32.to_be_bytes(),
        &sent.bytes(),
    );
    let back = icmp6_error(
        router,
        a_pod1(),
        ICMPV6_PACKET_TOO_BIG,
        1280u32.to_be_bytes(),
        &sent.between(a_pod1(), b_pod1()).bytes(),
    );
    let mut failures = check(
        &h,
        "packet too big",
        Direction::Ingress,
        &error.bytes(),
        Fate::Out(back.bytes(), Outcome::Translated, &[Kind::Prefix]),
    );
    // A forged quote: a packet from an address none of ours. Its outer
    // destination is translated as any; the quote has no rule to take.
    let forged = sent.between(addr6("fd00:99::1"), b_pod1()).bytes();
    let error = icmp6_error(router, a_pod1_at_b(), 1, [0; 4], &forged);
    let back = icmp6_error(router, a_pod1(), 1, [0; 4], &forged);
    failures.extend(check(
        &h,
        "forged quote",
        Direction::Ingress,
        &error.bytes(),
        Fate::Out(back.bytes(), Outcome::Translated, &[Kind::Prefix]),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `h`'s NatMapping tables, holding b's entry: it reaches a-pod1 at
/// `fd00:10:0:41::45`, our `fd00:192:168::45`.
fn with_mapping_to_a_pod1(h: &mut Harness) -> isthmus_agent::kernel::maps::MappingMap6 {
    let mut mappings = isthmus_agent::kernel::maps::MappingMap6::new(
        h.ebpf.take_map(names::MAP_NATMAP6).unwrap(),
        h.ebpf.take_map(names::MAP_NATMAP_REV6).unwrap(),
    )
    .unwrap();
    let key = MappingKey {
        peer_id: 1,
        addr: Be128::from_bytes(addr6("fd00:192:168::45")),
    };
    mappings
        .put(key, &Be128::from_bytes(a_pod1()), None)
        .unwrap();
    mappings
}

#[test]
fn an_ipv6_natmapping_entry_leads_to_its_endpoint_and_the_reply_leaves_from_its_external_ip() {
    use Direction::{Egress, Ingress};
    let mut h = harness();
    let mut mappings = with_mapping_to_a_pod1(&mut h);
    let external_at_b = addr6("fd00:10:0:41::45");
    let request = Packet6::new(b_pod1(), external_at_b, udp6(5353, 53, b"query"));
    let reply = Packet6::new(a_pod1(), b_pod1(), udp6(53, 5353, b"answer"));
    let mut failures = check(
        &h,
        "to the externalIP",
        Ingress,
        &request.bytes(),
        Fate::Out(
            request.between(b_pod1(), a_pod1()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix, Kind::NatMapping],
        ),
    );
    failures.extend(check(
        &h,
        "the endpoint's reply",
        Egress,
        &reply.bytes(),
        Fate::Out(
            reply.between(external_at_b, b_pod1()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix, Kind::NatMapping],
        ),
    ));
    // A forged entry that leads to a node's IPv6 address, which the agent
    // writes to the node table: no rule leads a peer to a node.
    let node = addr6("fd00:172:16:1::2");
    let mut nodes: ByteHash<Be128> =
        ByteHash::new(h.ebpf.take_map(names::MAP_NODE_ADDRS6).unwrap()).unwrap();
    nodes.put(Be128::from_bytes(node), &1, None).unwrap();
    let to_node = MappingKey {
        peer_id: 1,
        addr: Be128::from_bytes(addr6("fd00:192:168::46")),
    };
    mappings
        .put(to_node, &Be128::from_bytes(node), None)
        .unwrap();
    let forged = Packet6::new(b_pod1(), addr6("fd00:10:0:41::46"), udp6(5353, 53, b"q"));
    failures.extend(check(
        &h,
        "to an externalIP that leads to a node",
        Ingress,
        &forged.bytes(),
        Fate::Dropped(DropReason::Denied),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The agent marks a peer without entries so that its packets skip the
/// tables: an entry the mark hides is not read, either way.
#[test]
fn a_peer_marked_without_mappings_does_not_look_them_up() {
    use Direction::{Egress, Ingress};
    use isthmus_common::nat::NO_MAPPINGS;
    let mut h = with_peer_b_flagged(Harness::new(), SecurityMode::FullPodToPod, NO_MAPPINGS);
    let _mappings = with_mapping_to_a_pod1(&mut h);
    let request = Packet6::new(b_pod1(), addr6("fd00:10:0:41::45"), udp6(5353, 53, b"q"));
    let reply = Packet6::new(a_pod1(), b_pod1(), udp6(53, 5353, b"answer"));
    // Our ExternalCIDR's address, as the prefix alone leads: not the
    // entry's endpoint, a-pod1.
    let mut failures = check(
        &h,
        "to the hidden entry's externalIP",
        Ingress,
        &request.bytes(),
        Fate::Out(
            request.between(b_pod1(), addr6("fd00:192:168::45")).bytes(),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    );
    failures.extend(check(
        &h,
        "from its endpoint: our networks' prefix alone",
        Egress,
        &reply.bytes(),
        Fate::Out(
            reply.between(a_pod1_at_b(), b_pod1()).bytes(),
            Outcome::Translated,
            &[Kind::Prefix],
        ),
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
