//! The directory source on a live gateway: adding, changing and deleting a
//! TunnelEndpoint file reaches the pinned kernel map within 100 ms, as a
//! diff, and bad objects are rejected by name without disturbing the rest.

use std::{collections::BTreeMap, fs, path::PathBuf, time::Duration};

use ipnet::Ipv4Net;
use isthmus_agent::{kernel::peer_table::PeerMap, kernel::table::KernelTable};
use isthmus_common::nat::PeerNat;
use isthmus_lab::{
    cmd::ip,
    lab,
    objects::TunnelEndpoint,
    probe::{self, Proto},
    topology::{A, reachability},
};
use isthmus_tests::{eventually, metrics::sample, require_lab};

const BUDGET: Duration = Duration::from_millis(100);
/// Upper bound on any wait, so a broken agent fails the test instead of hanging it.
const GIVE_UP: Duration = Duration::from_secs(10);

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

fn entries(map: &PeerMap) -> BTreeMap<Ipv4Net, PeerNat> {
    map.entries().unwrap().into_iter().collect()
}

/// Polls the kernel map until `done` holds; returns how long it took.
fn wait_map(
    map: &PeerMap,
    what: &str,
    done: impl Fn(&BTreeMap<Ipv4Net, PeerNat>) -> bool,
) -> Duration {
    // Every millisecond: these waits measure a 100 ms budget.
    isthmus_lab::wait::until(GIVE_UP, Duration::from_millis(1), what, || {
        done(&entries(map))
    })
    .unwrap_or_else(|e| panic!("{e}; the map holds {:?}", entries(map).keys()))
}

fn wait_log(node: &str, needle: &str) {
    let said = || {
        fs::read_to_string(lab::log_file(node))
            .unwrap_or_default()
            .contains(needle)
    };
    isthmus_lab::wait::until(GIVE_UP, isthmus_tests::POLL, needle, said).unwrap_or_else(|e| {
        panic!(
            "{node}'s log: {e}; it ends:\n{}",
            lab::log_tail(&lab::log_file(node))
        )
    });
}

fn peer_x(remote_nat_pod: &str) -> String {
    TunnelEndpoint::new("tep-x", "liqo-tenant-x")
        .local(["10.244.0.0/24", "10.0.70.0/24", "192.168.0.0/24", "None"])
        .remote([
            "10.50.0.0/24",
            remote_nat_pod,
            "192.168.50.0/24",
            "10.7.1.0/24",
        ])
        .to_string()
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        Self(lab::object_dir(&A.gw()).join(name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn add_change_delete_reach_the_kernel_within_100ms() {
    require_lab();
    let gw = A.gw();
    let map = PeerMap::open(&lab::bpffs(&gw)).unwrap();
    let baseline = entries(&map);
    assert!(
        baseline.contains_key(&net("10.0.0.0/24")),
        "peer b missing from {:?}",
        baseline.keys()
    );
    let written = || sample(&gw, "isthmus_map_updates_total{op=\"write\"}");
    let writes_before = written();

    let file = Scratch::new("peer-x.yaml");
    fs::write(&file.0, peer_x("10.7.0.0/24")).unwrap();
    let took = wait_map(&map, "peer x", |e| {
        e.contains_key(&net("10.7.0.0/24")) && e.contains_key(&net("10.7.1.0/24"))
    });
    assert!(took < BUDGET, "add took {took:?}");
    eprintln!("add reached the kernel map in {took:?}");
    // Exactly peer x's two networks were written; peer b's entries were not touched.
    let after_add = entries(&map);
    assert_eq!(written() - writes_before, 2.0);
    for (net, nat) in &baseline {
        assert_eq!(
            after_add.get(net),
            Some(nat),
            "{net} changed when x was added"
        );
    }

    fs::write(&file.0, peer_x("10.8.0.0/24")).unwrap();
    let took = wait_map(&map, "x moved to 10.8.0.0/24", |e| {
        e.contains_key(&net("10.8.0.0/24")) && !e.contains_key(&net("10.7.0.0/24"))
    });
    assert!(took < BUDGET, "change took {took:?}");
    eprintln!("change reached the kernel map in {took:?}");
    assert_eq!(
        written() - writes_before,
        3.0,
        "a change of one network writes one element"
    );

    fs::remove_file(&file.0).unwrap();
    let took = wait_map(&map, "x gone", |e| *e == baseline);
    assert!(took < BUDGET, "delete took {took:?}");
    eprintln!("delete reached the kernel map in {took:?}");
}

#[test]
fn rejections_name_the_file_object_and_field_and_spare_the_rest() {
    require_lab();
    let gw = A.gw();
    let map = PeerMap::open(&lab::bpffs(&gw)).unwrap();
    let baseline = entries(&map);
    let dir = lab::object_dir(&gw);
    let cases = [
        (
            "bad-cidr.yaml",
            peer_x("10.7.0.0/33").replace("tep-x", "tep-bad-cidr"),
            "bad-cidr.yaml: TunnelEndpoint liqo-tenant-x/tep-bad-cidr: field remoteNATPodCIDR: \"10.7.0.0/33\" is not an IPv4 CIDR or \"None\"",
        ),
        (
            "bad-mask.yaml",
            peer_x("10.7.0.0/24")
                .replace("tep-x", "tep-bad-mask")
                .replace("10.0.70.0/24", "10.0.70.0/23"),
            "bad-mask.yaml: TunnelEndpoint liqo-tenant-x/tep-bad-mask: field localNATPodCIDR: mask /23 differs from localPodCIDR /24",
        ),
        (
            "overlap.yaml",
            peer_x("10.0.0.0/24").replace("tep-x", "tep-overlap"),
            "overlap.yaml: TunnelEndpoint liqo-tenant-x/tep-overlap: field remoteNATPodCIDR (10.0.0.0/24) overlaps field remoteNATPodCIDR (10.0.0.0/24) of TunnelEndpoint liqo-tenant-b/tep-b",
        ),
        (
            "everything.yaml",
            peer_x("None")
                .replace("tep-x", "tep-everything")
                .replace("10.50.0.0/24", "0.0.0.0/1")
                .replace("192.168.50.0/24", "128.0.0.0/1")
                .replace("10.7.1.0/24", "None"),
            "everything.yaml: TunnelEndpoint liqo-tenant-x/tep-everything: field remotePodCIDR: 0.0.0.0/1 is wider than /8 (--min-view-prefix)",
        ),
        (
            "lan.yaml",
            peer_x("172.16.1.0/24").replace("tep-x", "tep-lan"),
            "lan.yaml: TunnelEndpoint liqo-tenant-x/tep-lan: field remoteNATPodCIDR: 172.16.1.0/24 touches the network of lan0 (172.16.1.1/24); no peer may use it",
        ),
        (
            "default.yaml",
            peer_x("10.7.0.0/24")
                .replace("tep-x", "tep-default")
                .replace("liqo-tenant-x", "default"),
            "default.yaml: TunnelEndpoint default/tep-default: field metadata.namespace: \"default\" is not one where TunnelEndpoints are accepted (liqo-tenant-*; see --tunnelendpoint-namespaces)",
        ),
        (
            "configmap.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: not-a-tep}\n".to_owned(),
            "configmap.yaml: document 1 (not-a-tep): not an object Isthmus reads",
        ),
    ];
    let routes = || ip(&gw, &["route", "show", "table", "all"]).unwrap();
    let routes_before = routes();
    let files: Vec<Scratch> = cases
        .iter()
        .map(|(name, _, _)| Scratch::new(name))
        .collect();
    for ((_, yaml, _), file) in cases.iter().zip(&files) {
        fs::write(&file.0, yaml).unwrap();
    }
    // Errors name the file by its full path.
    for (_, _, message) in &cases {
        wait_log(&gw, &format!("{}/{message}", dir.display()));
    }
    assert_eq!(sample(&gw, "isthmus_rejected_objects"), cases.len() as f64);
    assert_eq!(
        entries(&map),
        baseline,
        "a rejected object changed the kernel map"
    );
    assert_eq!(
        routes(),
        routes_before,
        "a rejected object changed the routes"
    );
    // The accepted peer still carries traffic.
    let row = &reachability()[0];
    let seen = probe::exchange(Proto::Udp, &row.from, &row.answered_by, row.target).unwrap();
    assert_eq!(seen.client_as_seen_by_server, row.client_seen_as);

    drop(files);
    eventually(GIVE_UP, "rejections cleared", || {
        sample(&gw, "isthmus_rejected_objects") == 0.0
    });
}

/// A route someone else wrote for a network a peer is seen under stays as
/// it was: the agent says so, and routes the peer's other network.
#[test]
fn a_route_that_is_not_ours_is_never_replaced() {
    require_lab();
    let gw = A.gw();
    let foreign = ["10.7.0.0/24", "via", "172.16.1.2", "proto", "static"];
    let _ = ip(&gw, &[&["route", "del"][..], &foreign].concat());
    ip(&gw, &[&["route", "add"][..], &foreign].concat()).unwrap();
    let file = Scratch::new("peer-x.yaml");
    let with_tunnel = format!(
        "{}  endpointIP: 203.0.113.77\n  backend_config: {{publicKey: \"{}\"}}\n",
        peer_x("10.7.0.0/24"),
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    );
    fs::write(&file.0, with_tunnel).unwrap();
    wait_log(&gw, "route 10.7.0.0/24 exists and is not Isthmus's");
    let route = |net: &str| ip(&gw, &["route", "show", "table", "all", net]).unwrap();
    eventually(
        GIVE_UP,
        "x's other network is routed into the tunnel",
        || route("10.7.1.0/24").contains("isthmus0"),
    );
    let kept = ip(&gw, &["route", "show", "10.7.0.0/24", "proto", "static"]).unwrap();
    assert!(
        kept.contains("via 172.16.1.2 dev lan0"),
        "the foreign route changed: {kept}"
    );
    drop(file);
    eventually(GIVE_UP, "x's routes go with it", || {
        !route("10.7.1.0/24").contains("10.7.1.0/24")
    });
    ip(&gw, &[&["route", "del"][..], &foreign].concat()).unwrap();
}
