//! Restarting an agent loses no packet that crosses its NAT programs: they
//! stay attached and pinned while it is down, and the new agent swaps its
//! programs in atomically and adopts the maps.
//!
//! The lab's gateways carry traffic through the agent's userspace tunnel,
//! which a restart necessarily interrupts; so this test builds a gateway of
//! its own that routes in clear (`--tunnel none`): namespace `ist-t-rs-gw`
//! holds a pod address and the NAT on `v0`, and `ist-t-rs-peer` echoes every
//! datagram back.

use std::{
    collections::BTreeSet,
    fs,
    net::{Ipv4Addr, UdpSocket},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use isthmus_lab::{cmd::ip, lab, netns, probe::next_port, topology::PEERINGS};
use isthmus_tests::{netns as test_netns, require_lab, require_root};

const GW: &str = "ist-t-rs-gw";
const PEER: &str = "ist-t-rs-peer";
/// A pod of cluster a, and how cluster b addresses a pod of its own.
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 5);
const POD_AS_SEEN: Ipv4Addr = Ipv4Addr::new(10, 0, 40, 5);
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
/// Gap between datagrams: 2,000 a second, well within any socket buffer.
const PACE: Duration = Duration::from_micros(500);
/// Bounds on the stream, so it stops by itself whatever happens.
const MAX_PACKETS: u32 = 200_000;
const MAX_TIME: Duration = Duration::from_mins(1);

struct Topology {
    objects: PathBuf,
}

impl Topology {
    fn new() -> Self {
        require_root();
        require_lab();
        test_netns::fresh(&[GW, PEER]);
        test_netns::link(GW, PEER);
        ip(GW, &["addr", "add", &format!("{POD}/32"), "dev", "lo"]).unwrap();
        ip(PEER, &["addr", "add", &format!("{REMOTE}/32"), "dev", "lo"]).unwrap();
        ip(GW, &["route", "add", "10.0.0.0/24", "via", "192.0.2.2"]).unwrap();
        ip(PEER, &["route", "add", "10.0.40.0/24", "via", "192.0.2.1"]).unwrap();
        let objects = PathBuf::from(lab::STATE_DIR).join("objects").join(GW);
        fs::create_dir_all(&objects).unwrap();
        fs::write(
            objects.join("peer-b.yaml"),
            PEERINGS[0].tunnel_endpoint_yaml(None),
        )
        .unwrap();
        Self { objects }
    }

    fn start_agent(&self) -> u32 {
        lab::start_tunnelless_gateway(GW, "v0", &self.objects, &[]).unwrap()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        test_netns::remove(&[GW, PEER]);
        let _ = fs::remove_dir_all(&self.objects);
    }
}

#[test]
fn restarting_the_agent_loses_no_datagram_through_the_nat() {
    let topology = Topology::new();
    let mut agent = topology.start_agent();
    let port = next_port();
    // Bound to its pod address, so replies leave from it, not from v1.
    let echo = netns::run_in(PEER, || UdpSocket::bind((REMOTE, port)))
        .unwrap()
        .unwrap();
    let client = netns::run_in(GW, || UdpSocket::bind((POD, 0)))
        .unwrap()
        .unwrap();
    echo.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();

    // The peer echoes each datagram to whoever sent it: through the NAT,
    // that must be a's pod as b sees it.
    let echoer = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        let mut wrong_source = 0u32;
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            if from.ip() != std::net::IpAddr::V4(POD_AS_SEEN) {
                wrong_source += 1;
            }
            let _ = echo.send_to(&buf[..n], from);
        }
        wrong_source
    });
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU32::new(0));
    let sender = {
        let (stop, sent, client) = (stop.clone(), sent.clone(), client.try_clone().unwrap());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut seq = 0u32;
            while !stop.load(Ordering::Relaxed) && seq < MAX_PACKETS && start.elapsed() < MAX_TIME {
                client
                    .send_to(&seq.to_be_bytes(), (REMOTE, port))
                    .expect("send");
                seq += 1;
                sent.store(seq, Ordering::Relaxed);
                std::thread::sleep(PACE);
            }
        })
    };
    let received = Arc::new(AtomicU32::new(0));
    let receiver = {
        let received = received.clone();
        std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            let mut buf = [0u8; 16];
            while let Ok((n, _)) = client.recv_from(&mut buf) {
                if n == 4 {
                    seen.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
            seen
        })
    };
    let wait_received = |count: u32| {
        let got = || received.load(Ordering::Relaxed) >= count;
        isthmus_lab::wait::until(
            Duration::from_secs(10),
            isthmus_tests::POLL,
            "the stream going on",
            got,
        )
        .unwrap_or_else(|e| panic!("{e}: it stalled at {}", received.load(Ordering::Relaxed)));
    };

    wait_received(500);
    for _ in 0..2 {
        lab::stop_pid(agent).unwrap();
        agent = topology.start_agent();
        let mark = received.load(Ordering::Relaxed);
        wait_received(mark + 300);
    }
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    let seen = receiver.join().unwrap();
    let wrong_source = echoer.join().unwrap();
    lab::stop_pid(agent).unwrap();

    let sent = sent.load(Ordering::Relaxed);
    let missing: Vec<u32> = (0..sent).filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "{} of {sent} datagrams lost across two restarts, first {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert_eq!(
        wrong_source, 0,
        "the peer saw datagrams from an untranslated source"
    );
    assert!(sent > 1000, "stream too short to span the restarts: {sent}");
}

/// A pinned map of another capacity or layout than this agent's is never
/// adopted as it is: a hash whose capacity changed keeps its entries in a
/// map of the new capacity (or the agent refuses to start if they do not
/// fit), and one of another layout is replaced.
#[test]
fn pinned_maps_of_another_shape_are_migrated_or_replaced() {
    use aya::{
        EbpfLoader,
        maps::{HashMap as BpfHash, MapData},
    };
    use isthmus_agent::{
        kernel::dataplane::{Capacity, Dataplane, OBJECT},
        kernel::layouts::shape_of,
    };
    use isthmus_common::{
        conntrack::{DIR_OUT, FlowKey, FlowNat},
        counters,
        ipv4::PROTO_TCP,
        names,
        wire::Be32,
    };
    require_root();
    require_lab();
    let root = lab::bpffs("ist-t-pins");
    let _ = fs::remove_dir_all(&root);
    let pins = isthmus_common::pins::Pins::new(&root);
    let pin = |name: &str| pins.map(name);
    let capacity = |conntrack| Capacity {
        conntrack,
        ..Capacity::default()
    };
    // An agent sized for 1024 flows leaves three of them.
    drop(Dataplane::load(&root, &capacity(1024), false).unwrap());
    {
        let map = MapData::from_pin(pin(names::MAP_CONNTRACK)).unwrap();
        let mut flows: BpfHash<MapData, FlowKey, FlowNat> =
            BpfHash::try_from(aya::maps::Map::HashMap(map)).unwrap();
        for port in 1..=3 {
            let [src, dst] = [1, 2].map(|last| Be32::from_bytes([10, 0, 0, last]));
            let key = FlowKey::new(src, dst, port, 80, PROTO_TCP, DIR_OUT);
            flows.insert(key, FlowNat::default(), 0).unwrap();
        }
    }
    let flows = || {
        let map = MapData::from_pin(pin(names::MAP_CONNTRACK)).unwrap();
        let shape = shape_of(&map).unwrap();
        let flows: BpfHash<MapData, FlowKey, FlowNat> =
            BpfHash::try_from(aya::maps::Map::HashMap(map)).unwrap();
        (shape.max_entries, flows.keys().count())
    };
    // Grown: the flows move to a map of the new capacity.
    drop(Dataplane::load(&root, &capacity(4096), false).unwrap());
    assert_eq!(flows(), (4096, 3));
    // Shrunk below what it holds: refused, and the map stays as it was.
    let refused = Dataplane::load(&root, &capacity(2), false)
        .err()
        .expect("adopted");
    assert!(
        refused
            .to_string()
            .contains("holds 3 entries, more than the 2"),
        "{refused}"
    );
    assert_eq!(flows(), (4096, 3));
    // Another layout (a counter array of another length): replaced.
    fs::remove_file(pin(names::MAP_COUNTERS)).unwrap();
    drop(
        EbpfLoader::new()
            .map_max_entries(names::MAP_COUNTERS, 5)
            .map_pin_path(names::MAP_COUNTERS, pin(names::MAP_COUNTERS))
            .load(OBJECT)
            .unwrap(),
    );
    let counters = || shape_of(&MapData::from_pin(pin(names::MAP_COUNTERS)).unwrap()).unwrap();
    assert_eq!(counters().max_entries, 5);
    drop(Dataplane::load(&root, &capacity(4096), false).unwrap());
    assert_eq!(counters().max_entries, counters::SLOTS);
    fs::remove_dir_all(&root).unwrap();
}
