//! One gateway serving several Liqo v1 peers at once, whose real networks
//! are the same (every fixture peer's PodCIDR is 10.200.0.0/16): each on a
//! tunnel device of its own, named after its cluster, listening on its
//! `GatewayServer`'s port; the kernel told which peer each device carries;
//! a port two servers would share refused by name; and a peer that goes
//! takes its device with it, the others untouched.

use super::{
    liqo_v1::{fixture, gateway_key, gateway_pair_of},
    test_peer::TestPeer,
    *,
};
use isthmus_agent::kernel::maps::PeerDevices;

/// A peer cluster of this test: its name, the first octets of our views of
/// its two networks, and the port of our `GatewayServer` for it.
struct Cluster {
    name: &'static str,
    views: [&'static str; 2],
    port: u16,
}

const ROME: Cluster = Cluster {
    name: "rome",
    views: ["10.70.", "10.71."],
    port: 51840,
};
const MILAN: Cluster = Cluster {
    name: "milan",
    views: ["10.72.", "10.73."],
    port: 51841,
};
/// Asks for rome's port.
const NAPLES: Cluster = Cluster {
    name: "naples",
    views: ["10.74.", "10.75."],
    port: 51840,
};

impl Cluster {
    fn tenant(&self) -> String {
        format!("liqo-tenant-{}", self.name)
    }

    fn connection(&self) -> String {
        format!("gw-{}", self.name)
    }

    fn device(&self) -> String {
        format!("ist-{}", self.name)
    }

    /// rome's fixture `yaml`, made this cluster's.
    fn fixture(&self, yaml: &str) -> Value {
        let text = yaml
            .replace("rome", self.name)
            .replace("10.70.", self.views[0])
            .replace("10.71.", self.views[1]);
        let mut object = fixture(&text);
        if let Some(port) = object.pointer_mut("/spec/endpoint/port") {
            *port = json!(self.port);
        }
        object
    }

    /// Applies the cluster's Configuration, its PublicKey with `peer`'s
    /// key, and our GatewayServer for it with the object Liqo renders.
    fn apply(&self, node: &KubeNode, peer: &TestPeer) {
        let mut public_key = self.fixture(include_str!(
            "../../../fixtures/liqo-v1/publickey-rome.yaml"
        ));
        public_key["spec"]["publicKey"] = json!(key_text::encode(&peer.public()));
        node.api.apply(self.fixture(include_str!(
            "../../../fixtures/liqo-v1/configuration-rome.yaml"
        )));
        node.api.apply(public_key);
        let rendered = gateway_pair_of(
            node,
            self.fixture(include_str!(
                "../../../fixtures/liqo-v1/gatewayserver-rome.yaml"
            )),
            self.fixture(include_str!(
                "../../../fixtures/liqo-v1/isthmusgatewayserver-rome.yaml"
            )),
        );
        node.api.apply(rendered);
    }

    fn connected(&self, node: &KubeNode) -> bool {
        node.api
            .get("connections", &self.tenant(), &self.connection())
            .is_some_and(|c| c["status"]["value"] == "Connected")
    }
}

/// The ifindex of `dev` in netns `ns`, if it exists.
fn ifindex(ns: &str, dev: &str) -> Option<u32> {
    let line = isthmus_lab::cmd::ip(ns, &["-o", "link", "show", "dev", dev]).ok()?;
    line.split(':').next()?.trim().parse().ok()
}

#[test]
fn one_gateway_serves_two_liqo_v1_peers_with_the_same_networks_each_on_its_own_device() {
    const NS: &str = "ist-t-kube-v1two";
    let mut node = node(NS, true);
    let mut rome = TestPeer::new(NS);
    let mut milan = TestPeer::new(NS);
    ROME.apply(&node, &rome);
    MILAN.apply(&node, &milan);
    let (key_secret, public) = gateway_key();
    node.api.apply(key_secret);
    node.start_agent(&["--liqo-api=v1", "--key-secret=gw-rome"])
        .unwrap();
    node.wait_peers(
        "both peers' views",
        &[
            "10.70.0.0/16",
            "10.71.0.0/16",
            "10.72.0.0/16",
            "10.73.0.0/16",
        ],
    );

    // Each makes contact on its own server's port, and each is Connected:
    // its conncheck's PINGs and PONGs crossed its own device, though both
    // devices have the same tunnel address.
    rome.contact(public, (Ipv4Addr::LOCALHOST, ROME.port).into());
    milan.contact(public, (Ipv4Addr::LOCALHOST, MILAN.port).into());
    wait_for("rome and milan Connected", || {
        ROME.connected(&node) && MILAN.connected(&node)
    });
    for cluster in [&ROME, &MILAN] {
        let addresses =
            isthmus_lab::cmd::ip(NS, &["-4", "-o", "addr", "show", "dev", &cluster.device()])
                .unwrap();
        assert!(addresses.contains("169.254.18.1/30"), "{addresses}");
        let label = format!(
            "liqo_peer_is_connected{{driver=\"wireguard\",cluster_id=\"{}\"}}",
            cluster.name
        );
        assert_eq!(sample(NS, &label), 1.0, "{label}");
    }

    // The kernel knows which peer each device carries, by our view of it,
    // and routes each peer's views into its own device.
    let bpffs = node.bpffs();
    let devices = || PeerDevices::open(&bpffs).unwrap().entries().unwrap();
    let expected = |clusters: &[&Cluster]| -> std::collections::BTreeMap<u32, Ipv4Net> {
        clusters
            .iter()
            .map(|c| {
                let view = format!("{}0.0/16", c.views[0]).parse().unwrap();
                (ifindex(NS, &c.device()).unwrap(), view)
            })
            .collect()
    };
    assert_eq!(devices(), expected(&[&ROME, &MILAN]));
    let routes = isthmus_lab::cmd::ip(NS, &["-4", "route", "show", "proto", "153"]).unwrap();
    for (view, device) in [("10.70.0.0/16", "ist-rome"), ("10.73.0.0/16", "ist-milan")] {
        assert!(
            routes
                .lines()
                .any(|l| l.starts_with(view) && l.contains(&format!("dev {device} "))),
            "{view} into {device}:\n{routes}"
        );
    }

    // A third server on rome's port is refused by name; rome and milan
    // keep their sessions.
    let naples = TestPeer::new(NS);
    NAPLES.apply(&node, &naples);
    wait_for("naples' port named", || {
        node.log()
            .contains("field spec.endpoint.port: 51840 is the UDP port of the tunnel of liqo-tenant-rome/rome")
    });
    assert!(ifindex(NS, &NAPLES.device()).is_none());
    assert!(ROME.connected(&node) && MILAN.connected(&node));

    // milan goes: its device goes with it, and rome stays as it was.
    assert!(
        node.api
            .delete("configurations", &MILAN.tenant(), MILAN.name)
    );
    wait_for("milan's device deleted", || {
        ifindex(NS, &MILAN.device()).is_none()
    });
    let rome_alone = expected(&[&ROME]);
    wait_for("milan's device no longer named", || devices() == rome_alone);
    assert!(ROME.connected(&node));

    // rome goes while no agent runs: its device outlives the agent, and
    // the next one deletes it once it has read every object.
    node.stop_agent().unwrap();
    for cluster in [&ROME, &NAPLES] {
        assert!(
            node.api
                .delete("configurations", &cluster.tenant(), cluster.name)
        );
    }
    assert!(ifindex(NS, &ROME.device()).is_some());
    node.start_agent(&["--liqo-api=v1", "--key-secret=gw-rome"])
        .unwrap();
    wait_for("rome's device deleted by the next agent", || {
        ifindex(NS, &ROME.device()).is_none()
    });
    wait_for("no device named", || devices().is_empty());
    drop(naples);
}
