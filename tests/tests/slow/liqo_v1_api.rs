//! Every cluster on Liqo v1's API (`cargo xtask lab up --liqo-api v1`,
//! dual-stack in `cargo xtask test`): each agent reads its own cluster's
//! API server stand-in, which holds Liqo v1's objects as `liqoctl peer`
//! and Liqo's controllers write them, with Isthmus as the gateway type. b
//! serves a and c at once, each on a device and a port of its own. The
//! reference lab's reachability rows hold with v1's direction of NAT, and
//! the IPv6 rows between peers too; the nodes' own traffic leaves from the
//! first address of the ExternalCIDR, in each family; the Connections Liqo
//! reads go to Error when a WAN link is cut, and back; `kubectl` reads
//! each stand-in.
//!
//! These tests need that lab: `cargo xtask test` runs them in it.

use std::{
    net::{IpAddr, Ipv4Addr},
    process::Command,
    time::{Duration, Instant},
};

use ipnet::Ipv4Net;
use isthmus_agent::kernel::maps::PeerDevices;
use isthmus_lab::{
    cmd::{run, sysctl},
    lab::{
        self,
        liqo_v1_api::settings::{HUB, kubeconfig, server_port},
    },
    probe::{self, Proto},
    topology::{A, B, C, Cluster, PEERINGS, reachability, reachability6},
};
use isthmus_tests::{
    assert_row, eventually,
    inspect::{cell, inspect_on},
    require_lab,
};
use serde_json::Value;

/// How long the peerings may take to come up after the lab does.
const CONNECT: Duration = Duration::from_secs(30);

/// Where b sends what it masquerades: the first address of its
/// ExternalCIDR, as Liqo v1's fabric does, unremapped as c sees it.
const B_FIRST_EXTERNAL: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 0);

fn require_liqo_api_v1_lab() {
    require_lab();
    assert!(
        lab::Setup::current().expect("the lab's setup").liqo_api_v1,
        "the lab is not the Liqo v1 API lab: run `cargo xtask lab up --liqo-api v1`"
    );
}

/// `kubectl <args>` against `cluster`'s stand-in, from its gateway's netns.
fn kubectl(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", &cluster.gw(), "kubectl", "--kubeconfig"])
        .arg(kubeconfig(cluster))
        .args(args)
        .output()
        .expect("kubectl runs")
}

/// `kubectl get <plural> -A -o json` against `cluster`'s stand-in: the
/// items.
fn kubectl_get(cluster: &Cluster, plural: &str) -> Vec<Value> {
    let output = kubectl(cluster, &["get", plural, "-A", "-o", "json"]);
    assert!(
        output.status.success(),
        "kubectl get {plural} in cluster {}: {}",
        cluster.name,
        String::from_utf8_lossy(&output.stderr)
    );
    let list: Value = serde_json::from_slice(&output.stdout).expect("kubectl prints JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The `status.value` of each Connection of `cluster`, by peer cluster ID.
fn connections(cluster: &Cluster) -> Vec<(String, String)> {
    kubectl_get(cluster, "connections")
        .iter()
        .map(|c| {
            let peer = c["metadata"]["labels"]["liqo.io/remote-cluster-id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let value = c["status"]["value"].as_str().unwrap_or_default().to_owned();
            (peer, value)
        })
        .collect()
}

/// Whether `cluster`'s Connection to `peer` shows `value`.
fn shows(cluster: &Cluster, peer: &Cluster, value: &str) -> bool {
    connections(cluster)
        .iter()
        .any(|(id, v)| *id == peer.cluster_id() && v == value)
}

fn every_connection_connected() -> bool {
    shows(&A, &B, "Connected")
        && shows(&B, &A, "Connected")
        && shows(&B, &C, "Connected")
        && shows(&C, &B, "Connected")
}

#[test]
#[ignore = "needs the Liqo v1 API lab; `cargo xtask test` runs it there"]
fn rows_1_to_5_hold_with_liqo_v1s_direction_of_nat() {
    require_liqo_api_v1_lab();
    eventually(
        CONNECT,
        "every Connection Connected",
        every_connection_connected,
    );
    for reach in reachability() {
        // Row 5 crosses b through an IP of b's, and b masquerades it as
        // Liqo v1's gateway does: to its ExternalCIDR's first address.
        let seen_as = match reach.row {
            5 => B_FIRST_EXTERNAL,
            _ => reach.client_seen_as,
        };
        for proto in [Proto::Tcp, Proto::Udp] {
            let seen = probe::exchange(proto, &reach.from, &reach.answered_by, reach.target)
                .unwrap_or_else(|e| panic!("row {} over {proto:?}: {e:#}", reach.row));
            assert_eq!(
                (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
                (seen_as.into(), reach.target.into()),
                "row {} over {proto:?}",
                reach.row
            );
        }
    }
}

/// Rows 1 to 4 of the dual-stack lab's IPv6 rows: a–b both ways, with
/// each side's PodCIDR and ExternalCIDR remapped, and b to c. Row 5 would
/// take an IPv6 `IP` of b's, which Liqo's CRD refuses (`format: ipv4`).
#[test]
#[ignore = "needs the Liqo v1 API lab, dual-stack; `cargo xtask test` runs it there"]
fn the_ipv6_rows_hold_with_liqo_v1s_direction_of_nat() {
    require_liqo_api_v1_lab();
    assert!(
        lab::Setup::current().expect("the lab's setup").dual_stack,
        "the lab is not dual-stack: run `cargo xtask lab up --liqo-api v1 --dual-stack`"
    );
    eventually(
        CONNECT,
        "every Connection Connected",
        every_connection_connected,
    );
    for row in reachability6().iter().filter(|row| row.row <= 4) {
        for proto in Proto::ALL {
            assert_row(proto, row);
        }
    }
}

/// `inspect nat` on a-gw shows b's remap, our view to its real networks,
/// in each family, and the IPv6 view is the device's in `ist_peer_devs6`.
#[test]
#[ignore = "needs the Liqo v1 API lab, dual-stack; `cargo xtask test` runs it there"]
fn inspect_shows_a_v1_peers_remap_in_both_families() {
    require_liqo_api_v1_lab();
    let peering = &PEERINGS[0];
    let views = peering.remote_views().map(|v| v.to_string());
    let views6 = peering.remote_views6().map(|v| v.to_string());
    let real = [peering.remote.pod_cidr, peering.remote.external_cidr];
    let real6 = [peering.remote.pod_cidr6, peering.remote.external_cidr6];
    let mut wanted: Vec<(String, String)> = views
        .into_iter()
        .chain(views6)
        .zip(real.into_iter().chain(real6).map(str::to_owned))
        .collect();
    wanted.sort();
    let mut shown: Vec<(String, String)> = inspect_on(&A.gw(), "nat")
        .iter()
        .filter(|row| cell(row, "direction") == "peer")
        .map(|row| (cell(row, "from").to_owned(), cell(row, "to").to_owned()))
        .collect();
    shown.sort();
    assert_eq!(shown, wanted);
    let devices = PeerDevices::open(&lab::bpffs(&A.gw())).unwrap();
    let pod_views6: Vec<String> = (devices.entries6().unwrap().values())
        .map(ToString::to_string)
        .collect();
    assert_eq!(pod_views6, [peering.remote_views6()[0].to_string()]);
}

#[test]
#[ignore = "needs the Liqo v1 API lab; `cargo xtask test` runs it there"]
fn the_hub_serves_both_peers_each_on_its_own_device_and_port_as_liqo_reads_it() {
    require_liqo_api_v1_lab();
    eventually(
        CONNECT,
        "every Connection Connected",
        every_connection_connected,
    );
    let servers = kubectl_get(HUB, "isthmusgatewayservers");
    for client in [&A, &C] {
        let server = servers
            .iter()
            .find(|s| s["metadata"]["name"] == client.cluster_id().as_str())
            .unwrap_or_else(|| panic!("b's server for {}", client.name));
        let endpoint = &server["status"]["endpoint"];
        assert_eq!(endpoint["addresses"][0], B.wan_addr().to_string().as_str());
        assert_eq!(endpoint["port"], server_port(client));
        assert_eq!(
            server["status"]["internalEndpoint"]["node"],
            B.gw().as_str()
        );
        let device = format!("ist-{}", client.cluster_id());
        let link = run("ip", &["-n", &B.gw(), "-o", "link", "show", "dev", &device])
            .unwrap_or_else(|e| panic!("b-gw's device for {}: {e:#}", client.name));
        // With the MTU of its object, Liqo's.
        assert!(
            link.contains(&device) && link.contains("mtu 1340"),
            "{link}"
        );
    }
    let deployments: Vec<String> = kubectl_get(HUB, "deployments")
        .iter()
        .filter_map(|d| Some(d["metadata"]["name"].as_str()?.to_owned()))
        .collect();
    for client in [&A, &C] {
        let name = format!("gw-{}", client.cluster_id());
        assert!(deployments.contains(&name), "{name} in {deployments:?}");
    }
    // The stand-in refuses what Liqo's CRDs refuse: an IP's target is
    // immutable, by a CEL rule of theirs.
    let refused = kubectl(
        HUB,
        &[
            "patch",
            "ips",
            "c-pod1",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"ip":"10.1.0.6"}}"#,
        ],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("IP field is immutable"),
        "{stderr}"
    );
}

/// Loads `rules` (nft's own syntax) in netns `ns`.
fn nft(ns: &str, rules: &str) {
    let script = format!("echo '{rules}' | nft -f -");
    run("ip", &["netns", "exec", ns, "sh", "-c", &script]).expect("nft");
}

/// Drops (or lets through again) every datagram between a's and b's
/// uplinks at a's gateway, as a cut WAN link would.
fn cut_a_from_b(cut: bool) {
    let b = B.wan_addr();
    let rules = match cut {
        true => format!(
            "table ip isthmus-cut {{ chain in {{ type filter hook input priority -10; ip saddr {b} drop; }}; chain out {{ type filter hook output priority -10; ip daddr {b} drop; }}; }}"
        ),
        false => "delete table ip isthmus-cut".to_owned(),
    };
    nft(&A.gw(), &rules);
}

#[test]
#[ignore = "needs the Liqo v1 API lab; `cargo xtask test` runs it there"]
fn a_cut_wan_link_shows_error_within_10_s_on_both_sides_and_connected_once_mended() {
    require_liqo_api_v1_lab();
    eventually(
        CONNECT,
        "every Connection Connected",
        every_connection_connected,
    );
    cut_a_from_b(true);
    let cut = Instant::now();
    let took = eventually(
        Duration::from_secs(10),
        "a's and b's Connections in Error within 10 s of the cut",
        || shows(&A, &B, "Error") && shows(&B, &A, "Error"),
    );
    println!("both in Error {took:?} after the cut");
    // The other peering is b's too, and is not disturbed.
    assert!(shows(&B, &C, "Connected") && shows(&C, &B, "Connected"));
    cut_a_from_b(false);
    eventually(
        CONNECT,
        "a's and b's Connections Connected again",
        every_connection_connected,
    );
    println!("Connected again {:?} after the cut", cut.elapsed());
}

/// Liqo's `api-server` IP (`EnforceAPIServerIPRemapping`,
/// `pkg/utils/ipam/mapping/ips.go:37-71` at v1.2.0), as the IPAM completes
/// it: the `kubernetes` Service's ClusterIP, exposed at `exposed`.
fn api_server_ip(exposed: Ipv4Addr) -> String {
    format!(
        r#"{{"apiVersion": "ipam.liqo.io/v1alpha1", "kind": "IP",
  "metadata": {{"name": "api-server", "namespace": "liqo",
    "labels": {{"ipam.liqo.io/ip-type": "api-server"}},
    "annotations": {{"liqo.io/preinstalled": "true"}}}},
  "spec": {{"ip": "{CLUSTER_IP}"}},
  "status": {{"ip": "{exposed}", "cidr": "{}"}}}}"#,
        B.external_cidr
    )
}

/// The `kubernetes` Service's ClusterIP.
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// kube-proxy's part on b-gw (or none): the `ClusterIP` translated to the API
/// server, b-gw's LAN address here, and a rule at the forward hook, as
/// kube-proxy's `KUBE-FORWARD` chain has.
fn kube_proxy_on_b(on: bool) {
    let rules = match on {
        true => format!(
            "table ip kube-proxy-stand-in {{ chain services {{ type nat hook prerouting priority dstnat; ip daddr {CLUSTER_IP} meta l4proto tcp dnat to {}; }}; chain forward {{ type filter hook forward priority filter; ct state related,established accept; }}; }}",
            B.lan_gw()
        ),
        false => "delete table ip kube-proxy-stand-in".to_owned(),
    };
    nft(&B.gw(), &rules);
}

#[test]
#[ignore = "needs the Liqo v1 API lab; `cargo xtask test` runs it there"]
fn liqos_api_server_ip_leads_a_remote_pod_through_the_services_cluster_ip() {
    require_liqo_api_v1_lab();
    eventually(
        CONNECT,
        "every Connection Connected",
        every_connection_connected,
    );
    // With kube-proxy's rules there, b-gw's agent sends the ClusterIP
    // their DNAT acts on through the stack, where that DNAT runs, and the
    // rest past it.
    kube_proxy_on_b(true);
    let metric = |name| lab::metric_sum(&B.gw(), name, &[]).ok();
    eventually(
        CONNECT,
        "b-gw sends the ClusterIP alone through the stack",
        || {
            metric("isthmus_forward_past_netfilter") == Some(1.0)
                && metric("isthmus_forward_stack_destinations") == Some(1.0)
        },
    );
    // b's API server, as a's pods reach it: 192.168.0.1 of b's
    // ExternalCIDR, 10.0.1.1 in a's view of it.
    let (exposed, seen_from_a) = (Ipv4Addr::new(192, 168, 0, 1), Ipv4Addr::new(10, 0, 1, 1));
    let file = std::env::temp_dir().join("isthmus-api-server-ip.json");
    std::fs::write(&file, api_server_ip(exposed)).unwrap();
    // The stand-in serves no OpenAPI document for kubectl's own checks;
    // it judges the object by Liqo's CRD itself.
    let path = file.to_string_lossy();
    let applied = kubectl(HUB, &["apply", "--validate=false", "-f", &path]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let reaches = || probe::exchange(Proto::Tcp, &A.pod(1), &B.gw(), seen_from_a);
    eventually(CONNECT, "a-pod1 reaches b's API server", || {
        reaches().is_ok()
    });
    let seen = reaches().unwrap();
    assert_eq!(
        (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
        (Ipv4Addr::new(10, 0, 40, 5).into(), seen_from_a.into())
    );
    let deleted = kubectl(HUB, &["delete", "ips", "api-server", "-n", "liqo"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    kube_proxy_on_b(false);
}

/// Reverse-path filtering made strict on `ns` for as long as it lives, as
/// many distributions set it on nodes; the lab's netns are loose.
struct StrictReversePath(String);

impl StrictReversePath {
    fn on(ns: &str) -> Self {
        sysctl(ns, "net.ipv4.conf.all.rp_filter", "1").expect("sysctl");
        Self(ns.to_owned())
    }
}

impl Drop for StrictReversePath {
    fn drop(&mut self) {
        let _ = sysctl(&self.0, "net.ipv4.conf.all.rp_filter", "0");
    }
}

#[test]
#[ignore = "needs the Liqo v1 API lab; `cargo xtask test` runs it there"]
fn the_nodes_own_traffic_leaves_from_the_first_address_of_the_external_cidr() {
    require_liqo_api_v1_lab();
    eventually(
        CONNECT,
        "every Connection Connected",
        every_connection_connected,
    );
    // b-pod1, as a sees it; a's ExternalCIDR's first address, as b sees
    // it; in each family the lab has.
    let a_external_at_b: Ipv4Net = PEERINGS[0].local_nat_external.unwrap().parse().unwrap();
    let mut families: Vec<(IpAddr, IpAddr)> = vec![(
        reachability()[0].target.into(),
        a_external_at_b.network().into(),
    )];
    if lab::Setup::current().expect("the lab's setup").dual_stack {
        let a_external_at_b = PEERINGS[0].local_external_view6();
        families.push((
            reachability6()[0].target.into(),
            a_external_at_b.network().into(),
        ));
    }
    // The worker's replies must come back the way its route to b leads,
    // over the overlay, not straight off the LAN.
    let _strict = StrictReversePath::on(&A.node());
    for (b_pod1, a_first_external) in families {
        for node in [A.node(), A.gw()] {
            for proto in [Proto::Tcp, Proto::Udp] {
                let seen = probe::exchange(proto, &node, &B.pod(1), b_pod1)
                    .unwrap_or_else(|e| panic!("{node} to {b_pod1} over {proto:?}: {e:#}"));
                assert_eq!(
                    (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
                    (a_first_external, b_pod1),
                    "{node} over {proto:?}"
                );
            }
        }
    }
}
