//! The Kubernetes source against an API server stand-in that speaks the
//! real list/watch protocol (`isthmus_lab::fake_api`): the agent runs in a netns
//! of the test's own, and the kernel maps it pins are the judge.

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
    kernel::maps::{MappingMap, NodeMap, OverlaySettings, PeerMap},
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
            .map(|o| o["status"]["connection"].clone())
            .unwrap_or(Value::Null)
    }
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

/// The test's own WireGuard peer on loopback in the node's netns: answers
/// every handshake the gateway starts, until dropped.
struct TestPeer {
    socket: Option<UdpSocket>,
    port: u16,
    secret: [u8; 32],
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestPeer {
    fn new(ns: &str) -> Self {
        let mut secret = [0u8; 32];
        std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut secret)
            .unwrap();
        let socket = netns::run_in(ns, || UdpSocket::bind("127.0.0.1:0"))
            .unwrap()
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Self {
            port: socket.local_addr().unwrap().port(),
            socket: Some(socket),
            secret,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    fn public(&self) -> [u8; 32] {
        *PublicKey::from(&StaticSecret::from(self.secret)).as_bytes()
    }

    /// Starts answering, now that the gateway's key is known.
    fn answer(&mut self, gateway_public: [u8; 32]) {
        let socket = self.socket.take().expect("answering once");
        let (secret, stop) = (StaticSecret::from(self.secret), self.stop.clone());
        self.thread = Some(std::thread::spawn(move || {
            let mut tunn = Tunn::new(
                secret,
                PublicKey::from(gateway_public),
                None,
                None,
                0x99,
                None,
            );
            let (mut buf, mut out) = (vec![0u8; 2048], vec![0u8; 2048]);
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let mut result = tunn.decapsulate(Some(from.ip()), &buf[..n], &mut out);
                while let TunnResult::WriteToNetwork(packet) = result {
                    let _ = socket.send_to(packet, from);
                    result = tunn.decapsulate(None, &[], &mut out);
                }
                // A Liqo gateway answers the conncheck's PINGs.
                if let TunnResult::WriteToTunnelV4(packet, _) = result
                    && let Some(pong) = pong_for(packet)
                    && let TunnResult::WriteToNetwork(sealed) = tunn.encapsulate(&pong, &mut buf)
                {
                    let _ = socket.send_to(sealed, from);
                }
            }
        }));
    }
}

/// The PONG a Liqo gateway sends for `packet`, if it is a conncheck PING:
/// the same message, typed PONG, back to where it came from.
fn pong_for(packet: &[u8]) -> Option<Vec<u8>> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let udp = packet.get(ihl..)?;
    if packet.get(9) != Some(&17) || udp.get(2..4)? != 12345u16.to_be_bytes() {
        return None;
    }
    let mut message: Value = serde_json::from_slice(udp.get(8..)?).ok()?;
    (message["msgType"] == "PING").then_some(())?;
    message["msgType"] = json!("PONG");
    let addr = |at: usize| -> Option<[u8; 4]> { packet.get(at..at + 4)?.try_into().ok() };
    let sport = u16::from_be_bytes(udp.get(0..2)?.try_into().ok()?);
    let reply = isthmus_tests::packet::Datagram::new(
        addr(16)?,
        addr(12)?,
        isthmus_tests::packet::L4::Udp {
            sport: 12345,
            dport: sport,
            payload: serde_json::to_vec(&message).ok()?,
            zero_csum: false,
        },
    );
    Some(reply.bytes())
}

impl Drop for TestPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn secret_text(secret: &Value, field: &str) -> String {
    let encoded = secret["data"][field]
        .as_str()
        .unwrap_or_else(|| panic!("Secret has no data.{field}: {secret}"));
    String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap()
}

#[test]
fn the_gateway_keeps_its_key_in_a_secret_and_reports_status_and_events() {
    const NS: &str = "ist-t-kube2";
    let mut node = node(NS, true);
    let mut peer = TestPeer::new(NS);
    let peer_key = key_text::encode(&peer.public());
    let tunnel = |addr: &str, port: u16, key: &str| json!({"endpointIP": addr, "backend_config": {"port": port.to_string(), "publicKey": key}});
    let b = tep(
        "tep-b",
        "b",
        "10.60.0.0/24",
        "10.61.0.0/24",
        tunnel("127.0.0.1", peer.port, &peer_key),
    );
    let silent_key = key_text::encode(&[7u8; 32]);
    let c = tep(
        "tep-c",
        "c",
        "10.70.0.0/24",
        "10.71.0.0/24",
        tunnel("127.0.0.2", 9, &silent_key),
    );
    let no_key = tep(
        "tep-nokey",
        "nokey",
        "10.80.0.0/24",
        "10.81.0.0/24",
        json!({"endpointIP": "127.0.0.3"}),
    );
    let bad_key = tep(
        "tep-badkey",
        "badkey",
        "10.90.0.0/24",
        "10.91.0.0/24",
        tunnel("127.0.0.4", 9, "not-a-key"),
    );
    // b's conncheck reaches us at our ExternalCIDR's first host, as Liqo's
    // NatMapping for b says.
    let conncheck = [("169.254.0.1", "192.168.0.1")];
    for object in [b, c, no_key, bad_key, nat_mapping("b", &conncheck)] {
        node.api.apply(object);
    }
    start(&mut node);

    // The key: created in the Secret, the public half published beside it.
    let secret = node
        .api
        .get("secrets", AGENT_NS, KEY_SECRET)
        .expect("the agent created its key Secret");
    let private = key_text::decode(&secret_text(&secret, "privateKey"))
        .expect("privateKey holds a base64 key");
    let public = *PublicKey::from(&StaticSecret::from(private)).as_bytes();
    assert_eq!(secret_text(&secret, "publicKey"), key_text::encode(&public));
    peer.answer(public);

    // Status, through the status subresource.
    wait_for("tep-b Connected", || {
        node.connection("liqo-tenant-b", "tep-b")["status"] == "Connected"
    });
    let connected = node.connection("liqo-tenant-b", "tep-b");
    // The conncheck's round trip, as Liqo writes it: "640μs" or "3ms".
    let latency = connected["latency"]["value"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let number = latency
        .strip_suffix("μs")
        .or_else(|| latency.strip_suffix("ms"))
        .unwrap_or_else(|| panic!("latency {latency:?} in {connected}"));
    assert!(number.parse::<u32>().is_ok_and(|n| n > 0), "{connected}");
    assert!(
        connected["latency"]["timestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert_eq!(connected["statusMessage"], "VPN connection established");
    assert_eq!(
        connected["peerConfiguration"],
        json!({"allowedIPs": "10.60.0.0/24, 10.61.0.0/24", "endpointIP": "127.0.0.1", "port": peer.port.to_string(), "publicKey": peer_key})
    );
    wait_for("tep-c Connecting", || {
        node.connection("liqo-tenant-c", "tep-c")["status"] == "Connecting"
    });
    let waiting = node.connection("liqo-tenant-c", "tep-c");
    assert_eq!(
        waiting["statusMessage"],
        "Waiting VPN connection to be established"
    );
    assert_eq!(waiting["latency"]["value"], "N/A");
    assert_eq!(waiting["peerConfiguration"]["endpointIP"], "127.0.0.2");
    // Five PINGs (10 s) without a PONG: Error, as Liqo says it.
    wait_for("tep-c Error once its conncheck is silent", || {
        node.connection("liqo-tenant-c", "tep-c")["status"] == "Error"
    });
    assert_eq!(
        node.connection("liqo-tenant-c", "tep-c")["statusMessage"],
        "No network connectivity towards remote cluster"
    );
    wait_for("tep-nokey Error", || {
        node.connection("liqo-tenant-nokey", "tep-nokey")["status"] == "Error"
    });
    assert_eq!(
        node.connection("liqo-tenant-nokey", "tep-nokey")["statusMessage"],
        "field backend_config.publicKey is missing: no tunnel to this peer"
    );
    wait_for("tep-badkey Error", || {
        node.connection("liqo-tenant-badkey", "tep-badkey")["status"] == "Error"
    });
    let bad_message = node.connection("liqo-tenant-badkey", "tep-badkey")["statusMessage"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        bad_message.starts_with("field backend_config.publicKey: \"not-a-key\""),
        "{bad_message}"
    );
    // The rejected object's NAT is not programmed; the three others are.
    assert_eq!(node.peers().len(), 6);

    // Every status write is a merge patch of status.connection only.
    for request in node
        .api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.uri.contains("/status"))
    {
        let body = request.body.as_ref().expect("a JSON patch");
        let keys: Vec<&String> = body["status"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["connection"], "{body}");
        assert!(body.as_object().unwrap().len() == 1, "{body}");
    }

    // Events: one Warning per object in Error, naming the field.
    wait_for("two Events", || node.api.list("events").len() >= 2);
    for (name, field) in [
        ("tep-badkey", "backend_config.publicKey: \"not-a-key\""),
        ("tep-nokey", "backend_config.publicKey is missing"),
    ] {
        let events = node.api.list("events");
        let event = events
            .iter()
            .find(|e| e["regarding"]["name"] == name)
            .unwrap_or_else(|| panic!("no Event about {name}: {events:?}"));
        assert_eq!(
            (event["type"].as_str(), event["reason"].as_str()),
            (Some("Warning"), Some("Rejected"))
        );
        assert!(event["note"].as_str().unwrap().contains(field), "{event}");
        assert_eq!(event["regarding"]["kind"], "TunnelEndpoint");
        assert!(event["regarding"]["uid"].as_str().is_some(), "{event}");
    }

    // Nothing changed: passes go by and skip every object.
    let patches = node.requests("PATCH", "/status");
    let skipped = || sample(NS, "isthmus_status_writes_total{outcome=\"skipped\"}");
    let before = skipped();
    wait_for("three more status passes", || {
        skipped() >= before + 3.0 * 4.0
    });
    assert_eq!(
        node.requests("PATCH", "/status"),
        patches,
        "a status was rewritten though nothing changed"
    );

    // A fixed object clears its Error.
    let fixed_key = key_text::encode(&[9u8; 32]);
    node.api.apply(tep(
        "tep-badkey",
        "badkey",
        "10.90.0.0/24",
        "10.91.0.0/24",
        tunnel("127.0.0.4", 9, &fixed_key),
    ));
    wait_for("tep-badkey Connecting once fixed", || {
        node.connection("liqo-tenant-badkey", "tep-badkey")["status"] == "Connecting"
    });
    assert_eq!(node.peers().len(), 8);
}

/// A Node object as the API server holds it.
fn node_object(name: &str, pod_cidr: &str, address: &str, gateway: bool) -> Value {
    let labels = if gateway {
        json!({"net.liqo.io/gateway": "true"})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podCIDR": pod_cidr},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    })
}

/// The overlay as a worker's kernel holds it: the gateway node, and the
/// other nodes' PodCIDRs with their addresses.
fn overlay_of(node: &KubeNode) -> (Ipv4Addr, BTreeSet<(Ipv4Net, Ipv4Addr)>) {
    let gateway = OverlaySettings::open(&node.bpffs())
        .unwrap()
        .get()
        .unwrap()
        .gateway;
    let table = NodeMap::open(&node.bpffs())
        .unwrap()
        .entries()
        .unwrap()
        .into_iter()
        .map(|(net, addr)| (net, Ipv4Addr::from(addr)))
        .collect();
    (Ipv4Addr::from(gateway), table)
}

/// In kube mode the overlay follows the Node objects: the node carrying
/// the gateway label is where the worker sends, every other node's
/// PodCIDR leads to its InternalIP, and both follow changes live.
#[test]
fn the_overlay_follows_node_objects() {
    let mut node = node("ist-t-kube3", false);
    node.api
        .apply(node_object("gw-1", "10.90.0.0/25", "172.30.0.1", true));
    node.api
        .apply(node_object("w-2", "10.90.0.128/25", "172.30.0.2", false));
    start(&mut node);
    let entry = |net: &str, addr: [u8; 4]| (net.parse::<Ipv4Net>().unwrap(), Ipv4Addr::from(addr));
    let both: BTreeSet<_> = [
        entry("10.90.0.0/25", [172, 30, 0, 1]),
        entry("10.90.0.128/25", [172, 30, 0, 2]),
    ]
    .into();
    wait_for("the overlay programmed from the Node objects", || {
        overlay_of(&node) == (Ipv4Addr::new(172, 30, 0, 1), both.clone())
    });

    // The gateway role moves to w-2.
    node.api
        .apply(node_object("gw-1", "10.90.0.0/25", "172.30.0.1", false));
    node.api
        .apply(node_object("w-2", "10.90.0.128/25", "172.30.0.2", true));
    wait_for("the worker sending to the new gateway", || {
        overlay_of(&node).0 == Ipv4Addr::new(172, 30, 0, 2)
    });

    // A node leaves: its PodCIDR goes, and so does the gateway it was.
    assert!(node.api.delete("nodes", "", "w-2"));
    let rest: BTreeSet<_> = [entry("10.90.0.0/25", [172, 30, 0, 1])].into();
    wait_for("the node table without w-2, and no gateway", || {
        overlay_of(&node) == (Ipv4Addr::UNSPECIFIED, rest.clone())
    });
}

/// A YAML object of `isthmus_lab::offloading`, as the API server serves it.
fn served(yaml: &str) -> Value {
    serde_yaml_ng::from_str(yaml).expect("the fixtures are valid YAML")
}

fn allowed_entries(node: &KubeNode) -> usize {
    isthmus_lab::lab::pinned_hash::<AllowKey, u8>(&node.bpffs(), names::MAP_ALLOWED)
        .map_or(0, |table| table.keys().count())
}

#[test]
fn a_segregating_gateway_follows_offloaded_pods_exported_slices_and_offloadings() {
    let mut node = node("ist-t-kube4", true);
    let offloaded = |origin: Option<&str>| {
        served(&offloading::pod(
            "web",
            "shop",
            origin,
            Ipv4Addr::new(10, 244, 0, 133),
        ))
    };
    let slice = offloading::endpoint_slice(
        "api",
        "shop",
        &[Ipv4Addr::new(10, 244, 0, 5)],
        &[("http", 18080, "TCP"), ("dns", 53, "UDP")],
    );
    let offloaded_to_b = |selected| {
        let b = offloading::Listed {
            cluster_name: Some("b"),
            cluster_id: "b",
            selected,
        };
        served(&offloading::namespace_offloading("shop", &[b]))
    };
    for object in [
        tep("tep-b", "b", "10.60.0.0/24", "10.61.0.0/24", json!({})),
        offloaded(Some("b")),
        served(&slice),
        offloaded_to_b(true),
    ] {
        node.api.apply(object);
    }
    node.start_agent(&[
        "--keepalive=0",
        "--security-mode=IntraClusterTrafficSegregation",
    ])
    .unwrap();
    // The pod on any port, the service's two ports.
    wait_for("the allowed table from the API server", || {
        allowed_entries(&node) == 3
    });
    // Pods and slices are listed by their labels, not all of them.
    for selector in [
        "pods?&labelSelector=virtualkubelet.liqo.io%2Forigin&",
        "endpointslices?&labelSelector=endpointslice.kubernetes.io%2Fmanaged-by%3Dendpointslice-controller.k8s.io&",
    ] {
        assert!(node.requests("GET", selector) > 0, "no list of {selector}");
    }
    assert!(node.lists("namespaceoffloadings") > 0);
    // The pod loses its label, then the namespace its offloading to b.
    node.api.apply(offloaded(None));
    wait_for("the pod's entry gone", || allowed_entries(&node) == 2);
    node.api.apply(offloaded_to_b(false));
    wait_for("the service's entries gone", || allowed_entries(&node) == 0);
    node.api.apply(offloaded_to_b(true));
    wait_for("the service's entries back", || allowed_entries(&node) == 2);
    assert!(node.api.delete("endpointslices", "shop", "api-x7k2p"));
    wait_for("the deleted slice's entries gone", || {
        allowed_entries(&node) == 0
    });
}

/// The election's Lease, held by `holder` (None: released).
fn lease_object(holder: Option<&str>) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "isthmus-gateway", "namespace": AGENT_NS},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1},
    })
}

/// Where several nodes carry the gateway label, a worker sends to the one
/// holding the election's Lease, and moves as soon as it changes hands.
#[test]
fn a_worker_follows_the_elected_gateway() {
    let mut node = node("ist-t-kube5", false);
    for object in [
        node_object("gw-1", "10.90.0.0/25", "172.30.0.1", true),
        node_object("gw-2", "10.90.1.0/25", "172.30.0.2", true),
        lease_object(Some("gw-2")),
        // Another namespace's Lease of the same name is not the election's.
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "isthmus-gateway", "namespace": "elsewhere"},
            "spec": {"holderIdentity": "gw-1"}}),
    ] {
        node.api.apply(object);
    }
    start(&mut node);
    let gateway = |node: &KubeNode| overlay_of(node).0;
    wait_for("the worker sending to gw-2, the Lease's holder", || {
        gateway(&node) == Ipv4Addr::new(172, 30, 0, 2)
    });
    node.api.apply(lease_object(Some("gw-1")));
    let moved = wait_for("the worker sending to gw-1, the new holder", || {
        gateway(&node) == Ipv4Addr::new(172, 30, 0, 1)
    });
    println!("the worker followed the Lease in {moved:?}");
    // Released: the first labelled node by name.
    node.api.apply(lease_object(None));
    node.api.apply(lease_object(Some("gw-2")));
    wait_for("the worker back on gw-2", || {
        gateway(&node) == Ipv4Addr::new(172, 30, 0, 2)
    });
    assert!(
        node.lists("leases") > 0
            && node.requests("GET", "fieldSelector=metadata.name%3Disthmus-gateway") > 0,
        "the Lease is not watched by name"
    );
}
