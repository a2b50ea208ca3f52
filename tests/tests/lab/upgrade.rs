//! Upgrades keep what the previous agent pinned: a map whose entries'
//! layout changed is migrated into this agent's layout, entry by entry,
//! and the version of each map's layout is recorded for the next agent. A
//! hub upgraded from the previous release mid-transfer loses no byte.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{HashMap as BpfHash, Map, MapData};
use isthmus_agent::kernel::{
    dataplane::{Capacity, Dataplane},
    layouts::Registry,
};
use isthmus_common::{
    conntrack::{DIR_IN, DIR_OUT, FlowKey, FlowNat, TcpState},
    ipv4::{PROTO_TCP, PROTO_UDP},
    names,
    pins::Pins,
    room::OWNER_LOCAL,
    wire::Be32,
};
use isthmus_lab::{
    cmd::run,
    lab,
    stream::TcpTransfer,
    topology::{B, C, reachability},
    wait,
};
use isthmus_tests::{require_lab, require_root};

/// A conntrack value of the first layout (before flows had owners):
/// address, port, TCP state, a zero byte, last seen.
fn first_layout(addr: [u8; 4], port: u16, state: TcpState, last_seen: u64) -> [u8; 16] {
    let mut value = [0u8; 16];
    value[..4].copy_from_slice(&addr);
    value[4..6].copy_from_slice(&port.to_ne_bytes());
    value[6] = state as u8;
    value[8..].copy_from_slice(&last_seen.to_ne_bytes());
    value
}

fn key(sport: u16, proto: u8, dir: u8) -> FlowKey {
    let [src, dst] = [1, 2].map(|last| Be32::from_bytes([10, 0, 0, last]));
    FlowKey::new(src, dst, sport, 80, proto, dir)
}

fn hash<K: aya::Pod, V: aya::Pod>(pins: &Pins, name: &str) -> BpfHash<MapData, K, V> {
    let map = MapData::from_pin(pins.map(name)).unwrap();
    BpfHash::try_from(Map::HashMap(map)).unwrap()
}

/// The layouts the agent recorded under `pins`.
fn registry(pins: &Pins) -> Registry {
    Registry::open(&pins.map(names::MAP_LAYOUTS)).unwrap()
}

fn recorded(pins: &Pins, name: &str) -> Option<u32> {
    registry(pins).recorded(name)
}

/// An agent whose conntrack held its flows in the first layout left three;
/// this agent carries each into its own layout, its translation and age
/// kept, and records the version.
#[test]
fn a_conntrack_of_the_first_layout_keeps_its_flows_in_this_agents_layout() {
    require_root();
    require_lab();
    let root = lab::bpffs("ist-t-layouts");
    let _ = fs::remove_dir_all(&root);
    let pins = Pins::new(&root);
    fs::create_dir_all(root.join(isthmus_common::pins::MAPS)).unwrap();
    let flows = [
        (key(40000, PROTO_TCP, DIR_OUT), TcpState::Established),
        (key(40001, PROTO_TCP, DIR_IN), TcpState::Syn),
        (key(40002, PROTO_UDP, DIR_OUT), TcpState::None),
    ];
    {
        let mut first: BpfHash<MapData, FlowKey, [u8; 16]> = BpfHash::create(1024, 0).unwrap();
        for (i, (key, state)) in flows.iter().enumerate() {
            let value = first_layout([192, 168, 0, 1], 61000 + i as u16, *state, 1000 + i as u64);
            first.insert(key, value, 0).unwrap();
        }
        first.pin(pins.map(names::MAP_CONNTRACK)).unwrap();
    }
    drop(Dataplane::load(&root, &Capacity::default(), false).unwrap());
    let conntrack = hash::<FlowKey, FlowNat>(&pins, names::MAP_CONNTRACK);
    assert_eq!(conntrack.keys().count(), flows.len());
    for (i, (key, state)) in flows.iter().enumerate() {
        let flow = conntrack.get(key, 0).expect("a flow was lost");
        assert_eq!(
            flow,
            FlowNat {
                addr: Be32::from_bytes([192, 168, 0, 1]),
                port: 61000 + i as u16,
                state: *state as u8,
                answered: u8::from(*state != TcpState::Syn),
                owner: OWNER_LOCAL,
                pad: 0,
                last_seen: 1000 + i as u64,
            }
        );
    }
    assert_eq!(recorded(&pins, names::MAP_CONNTRACK), Some(2));
    assert_eq!(recorded(&pins, names::MAP_NATMAP), Some(1));

    // A later agent's layout, left by a downgrade: this agent cannot read
    // it, and replaces it.
    registry(&pins).record(names::MAP_CONNTRACK, 3).unwrap();
    drop(Dataplane::load(&root, &Capacity::default(), false).unwrap());
    let conntrack = hash::<FlowKey, FlowNat>(&pins, names::MAP_CONNTRACK);
    assert_eq!(
        conntrack.keys().count(),
        0,
        "a layout it cannot read was kept"
    );
    assert_eq!(recorded(&pins, names::MAP_CONNTRACK), Some(2));
    fs::remove_dir_all(&root).unwrap();
}

/// The previous release, whose agent binary this repository keeps
/// (`tests/artifacts/README.md`): it recorded no layout versions.
const PREVIOUS: &str = "v0.1.0";
/// The SHA-256 of its binary, unpacked.
const PREVIOUS_SHA256: &str = "e77671f63af5d09dcffab16c9ac4aabf8a70f50977f424d5814d395dec45cf73";
/// How long traffic may take to flow again after the upgrade.
const GIVE_UP: Duration = Duration::from_secs(10);

/// The previous release's agent, unpacked into the lab's state.
fn previous_release() -> PathBuf {
    let packed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("artifacts")
        .join(format!("isthmus-agent-{PREVIOUS}.zst"));
    let binary = Path::new(lab::STATE_DIR).join(format!("isthmus-agent-{PREVIOUS}"));
    run(
        "zstd",
        &[
            "-d",
            "-f",
            "-q",
            &packed.to_string_lossy(),
            "-o",
            &binary.to_string_lossy(),
        ],
    )
    .unwrap();
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o755)).unwrap();
    let sum = run("sha256sum", &[&binary.to_string_lossy()]).unwrap();
    assert!(
        sum.starts_with(PREVIOUS_SHA256),
        "{} is not the binary tests/artifacts/README.md describes: {sum}",
        packed.display()
    );
    binary
}

/// The TCP flows in the conntrack pinned under `pins`.
fn tcp_flows(pins: &Pins) -> Vec<(FlowKey, FlowNat)> {
    hash::<FlowKey, FlowNat>(pins, names::MAP_CONNTRACK)
        .iter()
        .filter_map(Result::ok)
        .filter(|(key, _)| key.proto == PROTO_TCP)
        .collect()
}

/// The kernel's ID of the map pinned as `name`.
fn map_id(pins: &Pins, name: &str) -> u32 {
    MapData::from_pin(pins.map(name))
        .unwrap()
        .info()
        .unwrap()
        .id()
}

/// Whether node `node`'s agent says it is of version `version`.
fn runs_version(node: &str, version: &str) -> bool {
    lab::metric_sum(node, "isthmus_build_info", &[("version", version)]).is_ok_and(|v| v == 1.0)
}

/// Puts this build's agent back on `node` when the test ends, passed or not.
struct ThisBuildAfter<'a>(&'a str);

impl Drop for ThisBuildAfter<'_> {
    fn drop(&mut self) {
        if let Err(e) = lab::restart_agent(self.0) {
            eprintln!("{}: this build's agent did not start again: {e:#}", self.0);
        }
    }
}

/// b-gw, the hub, runs the previous release while a-pod1 sends to c-pod1
/// through its masquerade (row 5), and is upgraded to this build mid-transfer:
/// the connection survives, and every byte arrives. The new agent reads the
/// previous one's maps, carries their flows, and records their layouts.
#[test]
fn upgrading_the_hub_from_the_previous_release_mid_transfer_loses_no_byte() {
    require_root();
    require_lab();
    let gw = B.gw();
    let previous = previous_release();
    let _restore = ThisBuildAfter(&gw);
    let pins = Pins::new(&lab::bpffs(&gw));
    lab::stop_agent(&gw).unwrap();
    // As on a node that never ran a later agent than the previous release.
    fs::remove_file(pins.map(names::MAP_LAYOUTS)).unwrap();
    lab::start_agent_binary(&gw, &previous).unwrap();
    lab::wait_ready(&gw).unwrap();
    assert!(runs_version(&gw, "0.1.0"), "{gw} does not run {PREVIOUS}");

    let row = reachability()
        .into_iter()
        .find(|r| r.row == 5)
        .expect("row 5");
    let transfer =
        TcpTransfer::start(&row.from, &row.answered_by, C.pod_addr(1), row.target).unwrap();
    let writes = |more: u64, what: &str| {
        let from = transfer.sent();
        wait::until(GIVE_UP, Duration::from_millis(20), what, || {
            transfer.sent() > from + more
        })
        .unwrap();
    };
    writes(1 << 20, "TCP writes through the previous release's hub");
    let conntrack_id = map_id(&pins, names::MAP_CONNTRACK);
    let masqueraded = tcp_flows(&pins);
    assert!(
        !masqueraded.is_empty(),
        "{gw} does not masquerade the transfer"
    );
    let log_before = fs::metadata(lab::log_file(&gw)).map_or(0, |m| m.len());
    lab::restart_agent(&gw).unwrap();
    assert!(runs_version(&gw, env!("CARGO_PKG_VERSION")));
    writes(1 << 20, "TCP writes through the upgraded hub");
    let report = transfer.finish().unwrap();
    eprintln!("upgrade of {gw} from {PREVIOUS}: {report:?}");
    assert_eq!(report.verified, report.sent, "the TCP transfer lost bytes");
    // The previous release's conntrack has this agent's layout: it is
    // kept as it is, and the flow's translation with it. (A flow lost
    // would mostly be masqueraded anew to the same port, and go on.)
    assert_eq!(
        map_id(&pins, names::MAP_CONNTRACK),
        conntrack_id,
        "the conntrack was not kept"
    );
    let now = tcp_flows(&pins);
    for (key, flow) in &masqueraded {
        let kept = now.iter().find(|(k, _)| k == key).map(|(_, f)| f);
        assert!(
            kept.is_some_and(|f| (f.addr, f.port) == (flow.addr, flow.port)),
            "the flow {key:?} ({flow:?}) was not carried over: {kept:?}"
        );
    }

    let log = fs::read(lab::log_file(&gw)).unwrap();
    let after = String::from_utf8_lossy(&log[log_before as usize..]);
    assert!(
        !after.contains("cannot read"),
        "the upgraded agent replaced a map:\n{after}"
    );
    assert_eq!(recorded(&pins, names::MAP_CONNTRACK), Some(2));
}
