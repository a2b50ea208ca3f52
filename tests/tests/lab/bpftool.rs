//! What an operator sees with `bpftool` on a node: every pin under the
//! bpffs root has one of the documented names, and the maps carry BTF, so a
//! dump shows named fields rather than raw bytes.

use std::{collections::BTreeSet, fs, process::Command};

use isthmus_common::{names, pins};
use isthmus_lab::{
    lab,
    probe::{self, Proto},
    topology::{self, A, B},
};
use isthmus_tests::require_lab;
use serde_json::Value;

/// `bpftool -j map dump pinned` of map `map` on `node`: its entries.
fn dump(node: &str, map: &str) -> Vec<Value> {
    let path = lab::pins(node).map(map);
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&path)
        .output()
        .expect("bpftool is installed by the build");
    assert!(
        out.status.success(),
        "bpftool map dump pinned {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// The field names of a formatted key or value, empty for a plain number.
fn fields(formatted: &Value) -> BTreeSet<String> {
    formatted
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn map_dumps_show_named_fields() {
    require_lab();
    // Row 5 leaves a masqueraded flow on the hub b.
    let row5 = &topology::reachability()[4];
    probe::exchange(Proto::Udp, &row5.from, &row5.answered_by, row5.target).unwrap();
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| (*n).to_owned()).collect() };
    for (node, map, key, value) in [
        (
            A.gw(),
            names::MAP_PEERS,
            set(&["prefix_len", "addr"]),
            set(&["peer_id", "flags", "egress", "ingress", "theirs", "owner"]),
        ),
        (
            B.gw(),
            names::MAP_NATMAP,
            set(&["peer_id", "addr"]),
            // An endpoint address, in network byte order as the type says.
            set(&["network_order"]),
        ),
        (
            B.gw(),
            names::MAP_CONNTRACK,
            set(&["saddr", "daddr", "sport", "dport", "proto", "dir", "pad"]),
            set(&[
                "addr",
                "port",
                "state",
                "answered",
                "owner",
                "pad",
                "last_seen",
            ]),
        ),
        (
            A.node(),
            names::MAP_OVERLAY,
            set(&[]),
            set(&["gateway", "vni", "ifindex", "local", "port", "flags"]),
        ),
    ] {
        let entries = dump(&node, map);
        assert!(!entries.is_empty(), "{node}'s {map} is empty");
        for entry in entries {
            let formatted = &entry["formatted"];
            assert!(
                formatted.is_object(),
                "{node}'s {map}: no BTF-formatted entry in {entry}"
            );
            assert_eq!(
                fields(&formatted["key"]),
                key,
                "{node}'s {map} key: {entry}"
            );
            assert_eq!(
                fields(&formatted["value"]),
                value,
                "{node}'s {map} value: {entry}"
            );
        }
    }
}

#[test]
fn every_pin_has_a_documented_name() {
    require_lab();
    let maps: BTreeSet<&str> = names::MAPS
        .into_iter()
        .chain(names::PROGRAM_ARRAYS)
        .chain([names::MAP_LAYOUTS])
        .collect();
    let programs: BTreeSet<&str> = names::PROGRAMS.into_iter().collect();
    for node in [A.gw(), A.node()] {
        let root = lab::bpffs(&node);
        let listed = |dir: &str| -> Vec<String> {
            fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        };
        let pinned_maps = listed(pins::MAPS);
        assert_eq!(pinned_maps.len(), maps.len(), "{node}: {pinned_maps:?}");
        for map in pinned_maps {
            assert!(maps.contains(map.as_str()), "{node}: map {map}");
        }
        for program in listed(pins::PROGRAMS) {
            assert!(
                programs.contains(program.as_str()),
                "{node}: program {program}"
            );
        }
        // A link pin is `<device>-<direction>-<program>`.
        for link in listed(pins::LINKS) {
            assert!(
                programs
                    .iter()
                    .any(|p| link.ends_with(&format!("-ingress-{p}"))
                        || link.ends_with(&format!("-egress-{p}"))),
                "{node}: link {link}"
            );
        }
    }
}
