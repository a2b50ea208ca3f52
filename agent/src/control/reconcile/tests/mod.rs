//! The reconciler over tables in memory: arbitration between peers, and
//! restarts that write nothing.

use std::path::Path;

use isthmus_lab::objects::TunnelEndpoint;

use super::*;
use crate::kernel::table::MemoryTable;
use crate::{model::object::parse_documents, model::policy::Protected};
use ipnet::Ipv4Net;
use isthmus_common::nat::{MappingKey, PeerNat};

fn messages(rejections: &[Rejection]) -> Vec<&str> {
    rejections.iter().map(|r| r.message.as_str()).collect()
}

type Peers = MemoryTable<Ipv4Net, PeerNat>;
type Mappings = MemoryTable<MappingKey, Be32>;

/// A reconciler over `peers` and a NatMapping table of its own.
fn reconciler(peers: &mut Peers) -> Reconciler<&mut Peers, Mappings> {
    Reconciler::new(peers, Mappings::default(), MemoryAllowedTable::default()).unwrap()
}

/// Peer `name`, whose networks are ours: we see its pods and externals as
/// `remote_pod` and `remote_ext`.
fn peer(name: &str, remote_pod: &str, remote_ext: &str) -> TunnelEndpoint {
    TunnelEndpoint::new(name, "liqo-tenant-x")
        .local(["10.244.0.0/24", "10.0.40.0/24", "192.168.0.0/24", "None"])
        .remote(["10.244.0.0/24", remote_pod, "192.168.0.0/24", remote_ext])
}

fn tep(name: &str, remote_pod: &str, remote_ext: &str) -> String {
    peer(name, remote_pod, remote_ext).to_string()
}

fn docs(file: &str, yaml: &str) -> Vec<Document> {
    parse_documents(Path::new(file), yaml)
}

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

#[test]
fn programs_both_views_of_each_peer() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_origin(
        "b.yaml".into(),
        docs("b.yaml", &tep("b", "10.0.0.0/24", "10.0.1.0/24")),
    );
    let report = r.reconcile().0;
    assert_eq!((report.written, report.removed, report.peers), (2, 0, 1));
    drop(r);
    assert_eq!(
        table.entries.keys().copied().collect::<Vec<_>>(),
        [net("10.0.0.0/24"), net("10.0.1.0/24")]
    );
    assert_eq!(table.entries[&net("10.0.0.0/24")].peer_id, 1);
}

#[test]
fn a_change_touches_only_that_peer() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    for i in 0..50 {
        let file = format!("p{i}.yaml");
        let yaml = tep(
            &format!("p{i}"),
            &format!("10.{i}.0.0/24"),
            &format!("10.{i}.1.0/24"),
        );
        r.set_origin(file.clone(), docs(&file, &yaml));
    }
    assert_eq!(r.reconcile().0.written, 100);
    r.set_origin(
        "p7.yaml".into(),
        docs("p7.yaml", &tep("p7", "10.7.0.0/24", "10.99.1.0/24")),
    );
    let report = r.reconcile().0;
    assert_eq!((report.written, report.removed), (1, 1));
    r.remove_origin("p8.yaml");
    let report = r.reconcile().0;
    assert_eq!((report.written, report.removed, report.peers), (0, 2, 49));
}

#[test]
fn overlap_rejects_the_newcomer_and_keeps_the_rest() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_origin(
        "z.yaml".into(),
        docs("z.yaml", &tep("z", "10.0.0.0/24", "10.0.1.0/24")),
    );
    r.reconcile();
    // Sorts before z.yaml, but z was accepted first and keeps its networks.
    r.set_origin(
        "a.yaml".into(),
        docs("a.yaml", &tep("a", "10.9.0.0/24", "10.0.0.0/24")),
    );
    let report = r.reconcile().0;
    assert_eq!((report.written, report.peers, report.rejected), (0, 1, 1));
    assert_eq!(
        messages(&report.new_errors),
        [
            "a.yaml: TunnelEndpoint liqo-tenant-x/a: field remoteNATExternalCIDR (10.0.0.0/24) overlaps field remoteNATPodCIDR (10.0.0.0/24) of TunnelEndpoint liqo-tenant-x/z in z.yaml"
        ]
    );
    // The same error is not reported twice.
    assert!(r.reconcile().0.new_errors.is_empty());
    // Once z goes, a is accepted.
    r.remove_origin("z.yaml");
    let report = r.reconcile().0;
    assert_eq!(
        (report.peers, report.rejected, report.cleared_errors.len()),
        (1, 0, 1)
    );
}

#[test]
fn an_overlap_names_the_senior_of_the_peers_in_the_way() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    for (name, pod, ext) in [
        ("z", "10.0.0.0/24", "10.0.1.0/24"),
        ("y", "10.0.2.0/24", "10.0.3.0/24"),
    ] {
        let file = format!("{name}.yaml");
        r.set_origin(file.clone(), docs(&file, &tep(name, pod, ext)));
        r.reconcile();
    }
    // A view over both: z, accepted first, is named.
    let a = peer("a", "10.9.0.0/24", "None").remote([
        "10.244.0.0/24",
        "10.9.0.0/24",
        "172.16.0.0/16",
        "10.0.0.0/16",
    ]);
    r.set_origin("a.yaml".into(), docs("a.yaml", &a.to_string()));
    // A view inside y's, starting after it.
    let b = peer("b", "None", "10.9.1.0/24").remote([
        "10.244.0.0/25",
        "10.0.2.128/25",
        "192.168.0.0/24",
        "10.9.1.0/24",
    ]);
    r.set_origin("b.yaml".into(), docs("b.yaml", &b.to_string()));
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.rejected), (2, 2));
    assert_eq!(
        messages(&report.new_errors),
        [
            "a.yaml: TunnelEndpoint liqo-tenant-x/a: field remoteNATExternalCIDR (10.0.0.0/16) overlaps field remoteNATPodCIDR (10.0.0.0/24) of TunnelEndpoint liqo-tenant-x/z in z.yaml",
            "b.yaml: TunnelEndpoint liqo-tenant-x/b: field remoteNATPodCIDR (10.0.2.128/25) overlaps field remoteNATPodCIDR (10.0.2.0/24) of TunnelEndpoint liqo-tenant-x/y in y.yaml",
        ]
    );
}

#[test]
fn a_peer_whose_two_views_overlap_is_rejected() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_origin(
        "s.yaml".into(),
        docs("s.yaml", &tep("s", "10.0.1.0/24", "10.0.1.0/24")),
    );
    let report = r.reconcile().0;
    assert_eq!(report.peers, 0);
    assert!(report.new_errors[0].message.contains("field remoteNATExternalCIDR (10.0.1.0/24) overlaps field remoteNATPodCIDR (10.0.1.0/24) of TunnelEndpoint liqo-tenant-x/s"), "{:?}", report.new_errors);
}

#[test]
fn bad_document_does_not_disturb_other_peers() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_origin(
        "good.yaml".into(),
        docs("good.yaml", &tep("good", "10.0.0.0/24", "10.0.1.0/24")),
    );
    r.set_origin(
        "bad.yaml".into(),
        docs("bad.yaml", &tep("bad", "10.5.0.0/99", "10.0.9.0/24")),
    );
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.rejected, report.written), (1, 1, 2));
    assert!(
        report.new_errors[0]
            .message
            .starts_with("bad.yaml: TunnelEndpoint liqo-tenant-x/bad: field remoteNATPodCIDR")
    );
    // Attributed to its object, so the object's status and events can say it.
    let bad = ObjectKey {
        namespace: "liqo-tenant-x".into(),
        name: "bad".into(),
    };
    assert_eq!(
        report.new_errors[0].object,
        Some((ObjectKind::TunnelEndpoint, bad))
    );
    assert!(
        report.new_errors[0]
            .problem
            .starts_with("field remoteNATPodCIDR")
    );
}

#[test]
fn a_full_natmapping_table_still_lets_peers_come_and_go() {
    let mut peers = Peers::default();
    let mut mappings = Mappings {
        capacity: 0,
        ..Mappings::default()
    };
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    let b = peer("b", "10.0.0.0/24", "10.0.1.0/24")
        .cluster_id("cluster-b")
        .to_string();
    let c = peer("c", "10.0.2.0/24", "10.0.3.0/24")
        .cluster_id("cluster-c")
        .to_string();
    let entry = [("10.1.0.5".to_owned(), "192.168.0.45".to_owned())];
    r.set_origin("b.yaml".into(), docs("b.yaml", &b));
    r.set_origin("c.yaml".into(), docs("c.yaml", &c));
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-b", &entry)),
    );
    let (report, failure) = r.reconcile();
    assert_eq!(failure.map(|f| f.kind), Some(ObjectKind::NatMapping));
    assert_eq!((report.peers, report.written), (2, 4));
    // c goes while the NatMapping table is still full: the report
    // says so, for the tunnel and the routes to follow.
    r.remove_origin("c.yaml");
    let (report, failure) = r.reconcile();
    assert!(failure.is_some(), "the NatMapping entry still does not fit");
    assert_eq!(
        report.dropped,
        [ObjectKey {
            namespace: "liqo-tenant-x".into(),
            name: "c".into()
        }]
    );
    assert_eq!(r.peers().len(), 1);
    assert_eq!(report.removed, 2);
}

#[test]
fn a_restart_that_reads_the_same_objects_writes_nothing() {
    let mut table = Peers::default();
    let yaml = format!(
        "{}---\n{}",
        tep("b", "10.0.0.0/24", "10.0.1.0/24"),
        tep("c", "10.3.0.0/24", "10.3.1.0/24")
    );
    {
        let mut r = reconciler(&mut table);
        r.set_origin("x.yaml".into(), docs("x.yaml", &yaml));
        r.reconcile();
    }
    // Reverse the acceptance order: adopted IDs still match the kernel.
    let writes = table.writes;
    let mut r = reconciler(&mut table);
    let swapped = format!(
        "{}---\n{}",
        tep("c", "10.3.0.0/24", "10.3.1.0/24"),
        tep("b", "10.0.0.0/24", "10.0.1.0/24")
    );
    r.set_origin("x.yaml".into(), docs("x.yaml", &swapped));
    let report = r.reconcile().0;
    assert_eq!((report.written, report.removed), (0, 0));
    drop(r);
    assert_eq!(table.writes, writes);
}

/// `tep` with a tunnel to `endpoint` with `key` (a byte repeated), of
/// cluster `cluster`, created at `created` if given.
fn tep_of(
    name: &str,
    views: (&str, &str),
    tunnel: (&str, u8),
    cluster: &str,
    created: Option<&str>,
) -> String {
    let key = crate::model::key_text::encode(&[tunnel.1; 32]);
    let tep = peer(name, views.0, views.1)
        .cluster_id(cluster)
        .endpoint(tunnel.0)
        .public_key(&key);
    match created {
        Some(at) => tep.created(at),
        None => tep,
    }
    .to_string()
}

#[test]
fn a_second_peer_with_a_taken_key_or_cluster_is_rejected_naming_the_first() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    let first = tep_of(
        "b",
        ("10.0.0.0/24", "10.0.1.0/24"),
        ("203.0.113.2", 1),
        "cluster-b",
        None,
    );
    r.set_origin("b.yaml".into(), docs("b.yaml", &first));
    r.reconcile();
    let same_key = tep_of(
        "k",
        ("10.0.2.0/24", "10.0.3.0/24"),
        ("203.0.113.7", 1),
        "cluster-k",
        None,
    );
    let same_cluster = tep_of(
        "c",
        ("10.0.4.0/24", "10.0.5.0/24"),
        ("203.0.113.8", 2),
        "cluster-b",
        None,
    );
    r.set_origin("k.yaml".into(), docs("k.yaml", &same_key));
    r.set_origin("c.yaml".into(), docs("c.yaml", &same_cluster));
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.rejected), (1, 2));
    assert_eq!(
        messages(&report.new_errors),
        [
            "c.yaml: TunnelEndpoint liqo-tenant-x/c: field clusterID: cluster cluster-b already has TunnelEndpoint liqo-tenant-x/b in b.yaml",
            "k.yaml: TunnelEndpoint liqo-tenant-x/k: field backend_config.publicKey: the same key as TunnelEndpoint liqo-tenant-x/b in b.yaml",
        ]
    );
}

#[test]
fn a_view_may_hold_no_wireguard_endpoint() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    // Its own endpoint in its own view: its handshakes would enter the tunnel.
    let own = tep_of(
        "o",
        ("10.0.0.0/24", "203.0.113.0/24"),
        ("203.0.113.2", 1),
        "cluster-o",
        None,
    );
    r.set_origin("o.yaml".into(), docs("o.yaml", &own));
    let report = r.reconcile().0;
    assert_eq!(
        messages(&report.new_errors),
        [
            "o.yaml: TunnelEndpoint liqo-tenant-x/o: field remoteNATExternalCIDR (203.0.113.0/24) holds endpointIP 203.0.113.2 of TunnelEndpoint liqo-tenant-x/o in o.yaml: its WireGuard traffic would be routed into a tunnel"
        ]
    );
    let b = tep_of(
        "b",
        ("10.0.0.0/24", "10.0.1.0/24"),
        ("198.51.100.2", 2),
        "cluster-b",
        None,
    );
    r.set_origin("o.yaml".into(), docs("o.yaml", &b));
    r.reconcile();
    // Another's endpoint in a newcomer's view, and the reverse.
    let over_b = tep_of(
        "v",
        ("10.0.2.0/24", "198.51.100.0/24"),
        ("203.0.113.9", 3),
        "cluster-v",
        None,
    );
    let under_b = tep_of(
        "u",
        ("10.0.4.0/24", "10.0.5.0/24"),
        ("10.0.1.7", 4),
        "cluster-u",
        None,
    );
    r.set_origin("v.yaml".into(), docs("v.yaml", &over_b));
    r.set_origin("u.yaml".into(), docs("u.yaml", &under_b));
    let report = r.reconcile().0;
    assert_eq!(report.peers, 1);
    assert_eq!(
        messages(&report.new_errors),
        [
            "u.yaml: TunnelEndpoint liqo-tenant-x/u: field endpointIP (10.0.1.7) lies in field remoteNATExternalCIDR (10.0.1.0/24) of TunnelEndpoint liqo-tenant-x/b in o.yaml: its WireGuard traffic would be routed into a tunnel",
            "v.yaml: TunnelEndpoint liqo-tenant-x/v: field remoteNATExternalCIDR (198.51.100.0/24) holds endpointIP 198.51.100.2 of TunnelEndpoint liqo-tenant-x/b in o.yaml: its WireGuard traffic would be routed into a tunnel",
        ]
    );
}

#[test]
fn the_policy_and_the_nodes_pod_cidrs_bound_every_view() {
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_origin(
        "nodes.yaml".into(),
        docs(
            "nodes.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {podCIDR: 10.244.0.0/25}\nstatus: {addresses: [{type: InternalIP, address: 172.16.1.2}]}\n",
        ),
    );
    let everything = tep("all", "None", "None")
        .replace("remotePodCIDR: 10.244.0.0/24", "remotePodCIDR: 0.0.0.0/1")
        .replace(
            "remoteExternalCIDR: 192.168.0.0/24",
            "remoteExternalCIDR: 128.0.0.0/1",
        );
    let our_pods = tep("p", "10.244.0.0/24", "10.0.1.0/24");
    let lan = tep("l", "10.0.0.0/24", "172.16.1.0/24");
    r.set_origin("all.yaml".into(), docs("all.yaml", &everything));
    r.set_origin("p.yaml".into(), docs("p.yaml", &our_pods));
    r.set_origin("l.yaml".into(), docs("l.yaml", &lan));
    let report = r.reconcile().0;
    assert_eq!(
        report.peers, 1,
        "only l passes: the LAN is not protected yet"
    );
    assert_eq!(
        messages(&report.new_errors),
        [
            "all.yaml: TunnelEndpoint liqo-tenant-x/all: field remotePodCIDR: 0.0.0.0/1 is wider than /8 (--min-view-prefix)",
            "p.yaml: TunnelEndpoint liqo-tenant-x/p: field remoteNATPodCIDR: 10.244.0.0/24 touches the PodCIDR 10.244.0.0/25 of node n1; no peer may use it",
        ]
    );
    let lan_protected = Policy {
        protected: vec![Protected {
            net: net("172.16.1.0/24").into(),
            what: "the network of lan0 (172.16.1.2/24)".into(),
        }],
        ..Policy::default()
    };
    assert!(r.set_policy(lan_protected.clone()));
    assert!(!r.set_policy(lan_protected));
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.removed), (0, 2));
    drop(r);
    assert!(table.entries.is_empty(), "the kernel still holds a view");
}

#[test]
fn the_first_created_wins_on_any_node_and_a_restart_keeps_the_winner() {
    // Two peers claiming 10.0.0.0/24; y's file sorts first.
    let x = tep_of(
        "x",
        ("10.0.0.0/24", "10.0.1.0/24"),
        ("203.0.113.2", 1),
        "cluster-x",
        Some("2024-05-01T10:00:00Z"),
    );
    let y = tep_of(
        "y",
        ("10.0.0.0/24", "10.0.9.0/24"),
        ("203.0.113.3", 2),
        "cluster-y",
        Some("2024-05-02T10:00:00Z"),
    );
    let mut table = Peers::default();
    let mut r = reconciler(&mut table);
    r.set_origin("b.yaml".into(), docs("b.yaml", &x));
    r.set_origin("a.yaml".into(), docs("a.yaml", &y));
    assert_eq!(r.reconcile().0.added[0].key.name, "x");
    drop(r);
    // Without timestamps, a restarted agent keeps what the kernel
    // holds, although y's file now sorts first.
    let strip = |yaml: &str| {
        yaml.replace(", creationTimestamp: \"2024-05-01T10:00:00Z\"", "")
            .replace(", creationTimestamp: \"2024-05-02T10:00:00Z\"", "")
    };
    let writes = table.writes;
    let mut r = reconciler(&mut table);
    r.set_origin("b.yaml".into(), docs("b.yaml", &strip(&x)));
    r.set_origin("a.yaml".into(), docs("a.yaml", &strip(&y)));
    let report = r.reconcile().0;
    assert_eq!(
        report
            .added
            .iter()
            .map(|p| p.key.name.as_str())
            .collect::<Vec<_>>(),
        ["x"]
    );
    assert_eq!((report.written, report.removed), (0, 0));
    drop(r);
    assert_eq!(table.writes, writes);
}

fn natmapping(cluster: &str, entries: &[(String, String)]) -> String {
    let mut yaml = format!(
        "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata: {{name: nm-{cluster}}}\nspec:\n  clusterID: {cluster}\n  clusterMappings:\n"
    );
    for (endpoint, external) in entries {
        yaml.push_str(&format!("    {endpoint}: {external}\n"));
    }
    yaml
}

mod allowed;
mod dual_stack;
mod liqo_v1;
mod mappings;
mod restart;
