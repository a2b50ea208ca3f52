//! Which pinned maps are kept, migrated or replaced, by shape and layout
//! version, and each migration's entries.

use aya::maps::MapType;
use isthmus_common::conntrack::{DIR_OUT, FlowKey};

use super::*;

fn shape(map_type: MapType, key_size: u32, value_size: u32, max_entries: u32) -> Shape {
    Shape {
        map_type: map_type as u32,
        key_size,
        value_size,
        max_entries,
        map_flags: 0,
    }
}

fn conntrack(value_size: u32, max_entries: u32) -> Shape {
    shape(MapType::Hash, 16, value_size, max_entries)
}

fn steps(plan: &Plan) -> Option<usize> {
    match plan {
        Plan::Migrate(upgrades) => Some(upgrades.len()),
        _ => None,
    }
}

#[test]
fn a_map_of_this_agents_shape_and_layout_is_kept_recorded_or_not() {
    let wanted = conntrack(24, 1000);
    let history = history(names::MAP_CONNTRACK, &wanted);
    assert!(matches!(plan(&wanted, None, &wanted, &history), Plan::Keep));
    assert!(matches!(
        plan(&wanted, Some(2), &wanted, &history),
        Plan::Keep
    ));
    // A map whose layout never changed has version 1.
    let peers = shape(MapType::Hash, 8, 12, 256);
    assert_eq!(current_version(names::MAP_PEERS, &peers), 1);
    let history = super::history(names::MAP_PEERS, &peers);
    assert!(matches!(
        plan(&peers, Some(1), &peers, &history),
        Plan::Keep
    ));
}

#[test]
fn only_a_hash_maps_capacity_and_flags_migrate_as_they_are() {
    let wanted = conntrack(24, 1000);
    let history = history(names::MAP_CONNTRACK, &wanted);
    assert_eq!(
        steps(&plan(&conntrack(24, 50), Some(2), &wanted, &history)),
        Some(0)
    );
    // A preallocated map of an earlier release keeps its entries.
    let on_demand = Shape {
        map_flags: 1,
        ..wanted
    };
    assert_eq!(steps(&plan(&wanted, None, &on_demand, &history)), Some(0));
    let lru = shape(MapType::LruHash, 16, 24, 1000);
    assert!(matches!(
        plan(&lru, Some(2), &wanted, &history),
        Plan::Replace
    ));
    // A counter array of a length no layout had changed its meaning.
    let counters = shape(MapType::PerCpuArray, 4, 8, counters::SLOTS);
    let history = super::history(names::MAP_COUNTERS, &counters);
    assert!(matches!(
        plan(
            &shape(MapType::PerCpuArray, 4, 8, 56),
            None,
            &counters,
            &history
        ),
        Plan::Replace
    ));
    // The first layout's 60 slots are read where they are, recorded or not.
    let first = shape(MapType::PerCpuArray, 4, 8, counters::BLOCK_SLOTS);
    for recorded in [None, Some(1)] {
        assert_eq!(steps(&plan(&first, recorded, &counters, &history)), Some(1));
    }
    assert!(matches!(
        plan(&counters, Some(2), &counters, &history),
        Plan::Keep
    ));
}

#[test]
fn a_conntrack_of_the_first_layout_migrates_recorded_or_told_by_its_sizes() {
    let wanted = conntrack(24, 1000);
    let history = history(names::MAP_CONNTRACK, &wanted);
    assert_eq!(current_version(names::MAP_CONNTRACK, &wanted), 2);
    let first = conntrack(16, 1000);
    assert_eq!(steps(&plan(&first, None, &wanted, &history)), Some(1));
    assert_eq!(steps(&plan(&first, Some(1), &wanted, &history)), Some(1));
    // And into another capacity at once.
    assert_eq!(
        steps(&plan(&conntrack(16, 64), None, &wanted, &history)),
        Some(1)
    );
}

#[test]
fn a_layout_that_contradicts_its_record_or_is_newer_than_this_agents_is_replaced() {
    let wanted = conntrack(24, 1000);
    let history = history(names::MAP_CONNTRACK, &wanted);
    // Recorded as version 2, with version 1's sizes.
    assert!(matches!(
        plan(&conntrack(16, 1000), Some(2), &wanted, &history),
        Plan::Replace
    ));
    // A later agent's layout, after a downgrade.
    assert!(matches!(
        plan(&wanted, Some(3), &wanted, &history),
        Plan::Replace
    ));
    // Sizes no layout ever had.
    assert!(matches!(
        plan(&conntrack(32, 1000), None, &wanted, &history),
        Plan::Replace
    ));
}

/// A version 1 conntrack value: address, port, TCP state, a zero byte,
/// last seen.
fn first_layout_value(addr: [u8; 4], port: u16, state: TcpState, last_seen: u64) -> Vec<u8> {
    let mut value = addr.to_vec();
    value.extend(port.to_ne_bytes());
    value.extend([state as u8, 0]);
    value.extend(last_seen.to_ne_bytes());
    value
}

#[test]
fn a_first_layout_flow_keeps_its_translation_and_age_and_counts_as_the_gateways() {
    let key = FlowKey::new(
        Be32::from_bytes([10, 0, 0, 1]),
        Be32::from_bytes([10, 0, 0, 2]),
        40000,
        80,
        6,
        DIR_OUT,
    );
    let key_bytes = pod_bytes(&key).to_vec();
    let value = first_layout_value([192, 168, 0, 1], 61000, TcpState::Established, 123_456_789);
    let (next_key, next) = conntrack_owners(&key_bytes, &value);
    assert_eq!(next_key, key_bytes, "the key is the same");
    assert_eq!(next.len(), size_of::<FlowNat>());
    let expected = FlowNat {
        addr: Be32::from_bytes([192, 168, 0, 1]),
        port: 61000,
        state: TcpState::Established as u8,
        answered: 1,
        owner: OWNER_LOCAL,
        pad: 0,
        last_seen: 123_456_789,
    };
    assert_eq!(next, pod_bytes(&expected));
    // A connection still opening was never answered: it stays the first
    // evicted.
    let opening = first_layout_value([192, 168, 0, 1], 61001, TcpState::Syn, 7);
    let (_, next) = conntrack_owners(&key_bytes, &opening);
    assert_eq!(next[7], 0, "answered");
    assert_eq!(next[6], TcpState::Syn as u8);
    // UDP and ICMP flows have no TCP state: carried over as answered.
    let udp = first_layout_value([192, 168, 0, 1], 61002, TcpState::None, 7);
    assert_eq!(conntrack_owners(&key_bytes, &udp).1[7], 1);
}

#[test]
fn a_short_or_long_value_from_a_damaged_pin_never_panics() {
    for len in [0, 3, 15, 17, 64] {
        let (_, next) = conntrack_owners(&[0; 16], &vec![0xff; len]);
        assert_eq!(next.len(), size_of::<FlowNat>());
    }
}

#[test]
fn registry_keys_are_names_nul_padded_to_16_bytes() {
    let k = key(names::MAP_CONNTRACK);
    assert_eq!(&k[..13], b"ist_conntrack");
    assert!(k[13..].iter().all(|b| *b == 0));
    // The kernel's names hold 15 bytes: the 16th stays a NUL.
    assert_eq!(key("a_name_longer_than_sixteen")[15], 0);
}
