//! The Kubernetes source against an API server stand-in that speaks the
//! real list/watch protocol (`isthmus_lab::fake_api`): the agent runs in a netns
//! of the test's own, and the kernel maps it pins are the judge.

mod followers;
mod gateway_key;
mod liqo_v1;
mod liqo_v1_peers;
mod liqo_wireguard;
mod test_peer;

use std::{
    collections::BTreeSet,
    fs,
    net::{Ipv4Addr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD};

use boringtun::{
    noise::{Tunn, TunnResult},
    x25519::{PublicKey, StaticSecret},
};

use ipnet::Ipv4Net;

use isthmus_agent::{
    kernel::maps::{MappingMap, NodeMap, OverlaySettings},
    kernel::peer_table::PeerMap,
    kernel::table::KernelTable,
    model::key_text,
};

use isthmus_common::{isolation::AllowKey, names};

use isthmus_lab::{
    kube_lab::{KubeNode, Networks, nat_mapping, tunnel_endpoint},
    netns, offloading,
    topology::AGENT_NS,
};

use isthmus_tests::{metrics::sample, require_lab};

use serde_json::{Value, json};

const GIVE_UP: Duration = Duration::from_secs(30);

const KEY_SECRET: &str = "isthmus-wireguard";

/// [`eventually`] within [`GIVE_UP`].
fn wait_for(what: &str, done: impl FnMut() -> bool) -> Duration {
    isthmus_tests::eventually(GIVE_UP, what, done)
}

/// What the tests read from a node: the kernel maps its agent pinned, and
/// what its API server saw.
trait Observe {
    fn peers(&self) -> BTreeSet<Ipv4Net>;
    fn mappings(&self) -> usize;
    fn wait_peers(&self, what: &str, nets: &[&str]) -> Duration;
    fn requests(&self, method: &str, needle: &str) -> usize;
    fn lists(&self, plural: &str) -> usize;
    fn refused(&self, plural: &str) -> Vec<Instant>;
    fn log(&self) -> String;
    fn connection(&self, namespace: &str, name: &str) -> Value;
    fn status_patches(&self, needle: &str) -> Vec<Value>;
}

impl Observe for KubeNode {
    fn peers(&self) -> BTreeSet<Ipv4Net> {
        let map = PeerMap::open(&self.bpffs()).unwrap();
        map.entries()
            .unwrap()
            .into_iter()
            .map(|(net, _)| net)
            .collect()
    }

    fn mappings(&self) -> usize {
        let map = MappingMap::open(&self.bpffs()).unwrap();
        map.entries().unwrap().len()
    }

    /// Waits until the kernel's peer table holds exactly `nets`.
    fn wait_peers(&self, what: &str, nets: &[&str]) -> Duration {
        let want: BTreeSet<Ipv4Net> = nets.iter().map(|n| n.parse().unwrap()).collect();
        let took = wait_for(what, || self.peers() == want);
        println!("{what}: {took:?}");
        took
    }

    fn requests(&self, method: &str, needle: &str) -> usize {
        self.api
            .requests()
            .iter()
            .filter(|r| r.method == method && r.uri.contains(needle))
            .count()
    }

    /// List (not watch) requests for `plural`.
    fn lists(&self, plural: &str) -> usize {
        self.api
            .requests()
            .iter()
            .filter(|r| {
                r.method == "GET" && r.uri.contains(plural) && !r.uri.contains("watch=true")
            })
            .count()
    }

    /// When requests for `plural` were refused by the down server.
    fn refused(&self, plural: &str) -> Vec<Instant> {
        self.api
            .requests()
            .iter()
            .filter(|r| r.refused && r.uri.contains(plural))
            .map(|r| r.at)
            .collect()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn connection(&self, namespace: &str, name: &str) -> Value {
        self.api
            .get("tunnelendpoints", namespace, name)
            .map_or(Value::Null, |o| o["status"]["connection"].clone())
    }

    /// The bodies of the status patches whose path holds `needle`.
    fn status_patches(&self, needle: &str) -> Vec<Value> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.uri.contains(needle) && r.uri.contains("/status"))
            .map(|r| r.body.expect("a JSON patch"))
            .collect()
    }
}

/// Asserts that `latency` (`{value, timestamp}`) is a round trip as Liqo
/// writes it ("640μs" or "3ms"), with when it was measured.
fn assert_liqo_latency(latency: &Value) {
    let value = latency["value"].as_str().unwrap_or_default();
    let number = value
        .strip_suffix("μs")
        .or_else(|| value.strip_suffix("ms"))
        .unwrap_or_else(|| panic!("latency {latency}"));
    assert!(number.parse::<u32>().is_ok_and(|n| n > 0), "{latency}");
    assert!(
        latency["timestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{latency}"
    );
}

/// Our networks in every TunnelEndpoint here.
fn nets<'a>(remote_pod: &'a str, remote_external: &'a str) -> Networks<'a> {
    Networks {
        local_pod: "10.244.0.0/24",
        local_external: "192.168.0.0/24",
        remote_pod,
        remote_external,
    }
}

fn tep(name: &str, cluster: &str, remote_pod: &str, remote_external: &str, extra: Value) -> Value {
    tunnel_endpoint(name, cluster, &nets(remote_pod, remote_external), extra)
}

/// The same object as Liqo v0.2.1–v0.3.0 wrote it: the peer's networks as
/// `spec.podCIDR` and `spec.externalCIDR`, the others in `status`, and a
/// lower-case connection status.
fn tep_v030(name: &str, cluster: &str, remote_pod: &str, remote_external: &str) -> Value {
    let mut object = tep(name, cluster, remote_pod, remote_external, json!({}));
    let mut status = object["spec"].take();
    let status = status.as_object_mut().unwrap();
    for gone in ["clusterIdentity", "remotePodCIDR", "remoteExternalCIDR"] {
        status.remove(gone);
    }
    status.insert("phase".into(), json!("Ready"));
    status.insert("connection".into(), json!({"status": "connected"}));
    object["status"] = json!(status);
    object["spec"] =
        json!({"clusterID": cluster, "podCIDR": remote_pod, "externalCIDR": remote_external});
    object
}

fn node(ns: &str, gateway: bool) -> KubeNode {
    require_lab();
    KubeNode::new(ns, gateway).unwrap()
}

fn start(node: &mut KubeNode) {
    node.start_agent(&["--keepalive=0"]).unwrap();
}

#[test]
fn the_kube_source_follows_lists_watches_drops_410s_and_downtime() {
    let b = tep("tep-b", "b", "10.60.0.0/24", "10.61.0.0/24", json!({}));
    let c = tep_v030("tep-c", "c", "10.70.0.0/24", "10.71.0.0/24");
    let bad = tep("tep-bad", "bad", "10.5.0.0/99", "10.6.0.0/24", json!({}));
    let mapping = [
        ("10.244.0.10", "192.168.0.10"),
        ("10.244.0.11", "192.168.0.11"),
    ];
    let mut node = node("ist-t-kube1", false);
    for object in [b, c.clone(), bad, nat_mapping("b", &mapping)] {
        node.api.apply(object);
    }
    start(&mut node);

    // Initial sync: both layouts, the NatMapping, and the bad object
    // rejected by name and field while the good ones are programmed.
    let both = [
        "10.60.0.0/24",
        "10.61.0.0/24",
        "10.70.0.0/24",
        "10.71.0.0/24",
    ];
    node.wait_peers("initial sync", &both);
    wait_for("2 NatMapping entries", || node.mappings() == 2);
    let log = node.log();
    assert!(
        log.contains("role=\"worker\"") || log.contains("role=worker"),
        "{log}"
    );
    assert!(
        log.contains("TunnelEndpoint liqo-tenant-bad/tep-bad: field remotePodCIDR"),
        "the bad object is not named with its field:\n{log}"
    );
    let lists = (node.lists("tunnelendpoints"), node.lists("natmappings"));

    // ADDED, MODIFIED, DELETED.
    let d = |pod: &str| tep("tep-d", "d", pod, "10.81.0.0/24", json!({}));
    node.api.apply(d("10.80.0.0/24"));
    let with_d = |pod| [&both[..], &[pod, "10.81.0.0/24"]].concat();
    node.wait_peers("ADDED", &with_d("10.80.0.0/24"));
    node.api.apply(d("10.82.0.0/24"));
    node.wait_peers("MODIFIED", &with_d("10.82.0.0/24"));
    assert!(node.api.delete("tunnelendpoints", "liqo-tenant-c", "tep-c"));
    let without_c = [
        "10.60.0.0/24",
        "10.61.0.0/24",
        "10.82.0.0/24",
        "10.81.0.0/24",
    ];
    node.wait_peers("DELETED", &without_c);

    // BOOKMARK: the watch moves on, and the next event still arrives.
    node.api.bookmark("tunnelendpoints");
    node.api.bookmark("natmappings");
    let three = [mapping[0], mapping[1], ("10.244.0.12", "192.168.0.12")];
    node.api.apply(nat_mapping("b", &three));
    wait_for("3 NatMapping entries after a bookmark", || {
        node.mappings() == 3
    });
    assert_eq!(
        (node.lists("tunnelendpoints"), node.lists("natmappings")),
        lists,
        "nothing so far should have needed a relist"
    );

    // A dropped connection: the watch resumes where it was, without a relist.
    let watches = node.requests("GET", "watch=true");
    node.api.drop_watches();
    node.api.apply(c.clone());
    let everything = [&without_c[..], &["10.70.0.0/24", "10.71.0.0/24"]].concat();
    node.wait_peers("after a dropped watch", &everything);
    assert!(
        node.requests("GET", "watch=true") > watches,
        "the watch was not resumed"
    );
    assert_eq!(
        (node.lists("tunnelendpoints"), node.lists("natmappings")),
        lists
    );

    // The API server goes down; meanwhile objects change and its history is
    // compacted, so the resumed watch gets 410 Gone and must relist.
    node.api.set_down(true);
    assert!(node.api.delete("tunnelendpoints", "liqo-tenant-d", "tep-d"));
    node.api.apply(nat_mapping("b", &mapping));
    node.api.compact();
    let down = Instant::now();
    // The client retries a 503 a few times at once; the watcher then backs
    // off, with jitter, between bursts.
    let pauses = || {
        let refused = node.refused("tunnelendpoints");
        let gaps: Vec<Duration> = refused.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.into_iter()
            .filter(|gap| *gap > Duration::from_millis(200))
            .collect::<Vec<_>>()
    };
    wait_for(
        "the watcher to back off three times against the down server",
        || {
            // No gap: the kernel keeps everything while the server is away.
            assert_eq!(
                node.peers().len(),
                everything.len(),
                "entries lost while the API server was down"
            );
            pauses().len() >= 3
        },
    );
    let refused = node.refused("tunnelendpoints");
    let window = refused[refused.len() - 1] - refused[0];
    let rate = refused.len() as f64 / window.as_secs_f64();
    println!(
        "down for {:?}; {} refused watches of TunnelEndpoints, pauses {:?}",
        down.elapsed(),
        refused.len(),
        pauses()
    );
    assert!(rate < 10.0, "{rate:.1} requests/s against a down server");
    node.api.set_down(false);
    let back = [
        "10.60.0.0/24",
        "10.61.0.0/24",
        "10.70.0.0/24",
        "10.71.0.0/24",
    ];
    node.wait_peers("after 410 Gone and a relist", &back);
    wait_for("2 NatMapping entries after the relist", || {
        node.mappings() == 2
    });
    let relisted = (node.lists("tunnelendpoints"), node.lists("natmappings"));
    assert!(
        relisted.0 > lists.0 && relisted.1 > lists.1,
        "no relist after 410: {lists:?} -> {relisted:?}"
    );
}
