//! Isthmus serving a Liqo v1.2 gateway. In the Liqo v1 lab
//! (`cargo xtask lab up --liqo-v1-peer b`), cluster b runs wireguard-go,
//! the nftables Liqo v1's FirewallConfigurations render and its conncheck
//! (`isthmus_lab::lab::liqo_v1_peer`); cluster a runs Isthmus with
//! `--liqo-api v1`, from a Configuration, a PublicKey and the
//! `IsthmusGatewayClient` Liqo renders from Isthmus's template.
//! The NAT runs the other way from v0.10, yet reachability rows 1–3 hold
//! with the same addresses, an `IP` exposes an address across, and each
//! side's conncheck reaches the other. `cargo xtask test` runs them twice:
//! with a as the tunnel's client, then as its server (an
//! `IsthmusGatewayServer`, `--isthmus-side server`), b's gateway taking the other
//! side; behind a's XDP guard too. And a-gw as a gateway pod made from
//! Isthmus's template: `isthmus-agent liqo-wireguard` in place of a's
//! agent carries the tunnel to b's wireguard-go on either side.
//!
//! These tests need that lab: `cargo xtask test` runs them in it.

use std::{
    net::{Ipv4Addr, TcpListener, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use isthmus_lab::{
    fake_api::FakeApi,
    lab::{
        self,
        liqo_v1_peer::{self, Side},
    },
    liqo_v1::PORT,
    netns,
    probe::{self, Proto},
    topology::{A, B, reachability},
};
use isthmus_tests::{eventually, require_lab};
use serde_json::{Value, json};

use crate::liqo_v0_10_interop::{
    CONNCHECK, a_measures_b, assert_rows_1_to_3, b_hears_a, liqo_side,
};

/// b-pod1, as a sees it.
const B_POD1_AT_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);

/// The `IP`'s address as b sees it: b's view of a's ExternalCIDR.
const IP_EXPOSED_AT_B: Ipv4Addr = Ipv4Addr::new(10, 0, 41, 20);

/// a's address for sources b cannot route back to, as b sees it: the first
/// address of a's ExternalCIDR (192.168.0.0/24), in b's view of it.
const A_UNKNOWN_SOURCE_AT_B: Ipv4Addr = Ipv4Addr::new(10, 0, 41, 0);

/// How long an object change may take to reach the kernel, with margin.
const OBJECT_CHANGE: Duration = Duration::from_secs(5);

/// How long a tunnel may take to come back after a's agent restarts: a
/// WireGuard client that sent and heard nothing starts a new handshake
/// after 15 s (Keepalive-Timeout + Rekey-Timeout), with margin.
const RESTART: Duration = Duration::from_secs(40);

fn require_liqo_v1_lab() {
    require_lab();
    isthmus_side();
}

/// The side of the tunnel a takes in the Liqo v1 lab that is up.
fn isthmus_side() -> Side {
    match lab::Setup::current().expect("the lab's setup").liqo {
        Some(lab::LiqoPeer::V1(side)) => side,
        _ => panic!("the lab is not the Liqo v1 lab: run `cargo xtask lab up --liqo-v1-peer b`"),
    }
}

#[test]
#[ignore = "needs the Liqo v1 lab; `cargo xtask test` runs it there"]
fn rows_1_to_3_hold_where_liqo_v1_puts_the_translation() {
    require_liqo_v1_lab();
    assert_rows_1_to_3();
}

#[test]
#[ignore = "needs the Liqo v1 lab; `cargo xtask test` runs it there"]
fn an_ip_object_exposes_an_address_of_a_to_b_while_it_exists() {
    require_liqo_v1_lab();
    let (from, to) = (B.pod(1), A.pod(2));
    let reaches = || probe::exchange(Proto::Tcp, &from, &to, IP_EXPOSED_AT_B);
    assert!(
        reaches().is_err(),
        "{IP_EXPOSED_AT_B} answers before the IP exists"
    );
    liqo_v1_peer::expose_ip(true).unwrap();
    eventually(
        OBJECT_CHANGE,
        "b-pod1 reaches a-pod2 through the IP",
        || reaches().is_ok(),
    );
    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        let seen = probe::exchange(proto, &from, &to, IP_EXPOSED_AT_B).unwrap();
        assert_eq!(
            (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
            (B_POD1_AT_A.into(), IP_EXPOSED_AT_B.into()),
            "{proto:?}"
        );
    }
    liqo_v1_peer::expose_ip(false).unwrap();
    eventually(OBJECT_CHANGE, "the IP's address is gone", || {
        reaches().is_err()
    });
}

/// a's gateway runs as the DaemonSet for Liqo v1 does, without
/// `--masquerade-ip`: its own traffic to b leaves from the first address of
/// a's ExternalCIDR, as Liqo v1's fabric sends a node's own traffic, and
/// its answers come back.
#[test]
#[ignore = "needs the Liqo v1 lab; `cargo xtask test` runs it there"]
fn the_gateways_own_traffic_leaves_from_the_first_address_of_our_external_cidr() {
    require_liqo_v1_lab();
    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        let seen = probe::exchange(proto, &A.gw(), &B.pod(1), B_POD1_AT_A).unwrap();
        assert_eq!(
            (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
            (A_UNKNOWN_SOURCE_AT_B.into(), B_POD1_AT_A.into()),
            "{proto:?}"
        );
    }
}

/// a-gw's XDP guard verdicts of `verdict`.
fn guard(verdict: &str) -> f64 {
    lab::metric_sum(
        &A.gw(),
        "isthmus_guard_packets_total",
        &[("verdict", verdict)],
    )
    .unwrap()
}

/// The gateways run with their XDP guard until dropped.
struct GuardOn;

impl Drop for GuardOn {
    fn drop(&mut self) {
        if let Err(e) = lab::set_guard(false) {
            eprintln!("turning the guard back off: {e:#}");
        }
    }
}

/// Whether a-pod1 reaches b-pod1 now.
fn row_1_holds() -> bool {
    let row = &reachability()[0];
    probe::exchange(Proto::Tcp, &row.from, &row.answered_by, row.target).is_ok()
}

#[test]
#[ignore = "needs the Liqo v1 lab; `cargo xtask test` runs it there"]
fn behind_the_xdp_guard_the_liqo_v1_gateway_gets_through_on_either_side() {
    require_liqo_v1_lab();
    lab::set_guard(true).unwrap();
    let guard_on = GuardOn;
    // Restarted: a new session, which the side decides who starts. b's
    // wireguard-go, a client, starts one when its old session stops
    // answering, from a port nobody configured.
    eventually(RESTART, "row 1 behind the guard", row_1_holds);
    assert_rows_1_to_3();
    let (initiations, known) = (guard("initiation"), guard("known_source"));
    match isthmus_side() {
        // b contacted a from wherever it is: its initiation passed as such.
        Side::Server => assert!(initiations >= 1.0, "no initiation passed the guard"),
        // a contacted b at its configured endpoint, which answers from it:
        // nothing passed for being an initiation.
        Side::Client => {
            assert_eq!(initiations, 0.0, "initiations passed a client's guard");
            assert!(known >= 1.0, "nothing passed from b's endpoint");
        }
    }
    drop(guard_on);
    eventually(RESTART, "row 1 with the guard off again", row_1_holds);
}

#[test]
#[ignore = "needs the Liqo v1 lab; `cargo xtask test` runs it there"]
fn isthmus_and_the_liqo_v1_gateway_measure_each_other_over_the_tunnel_addresses() {
    require_liqo_v1_lab();
    let peer = [("cluster_id", "cluster-b")];
    eventually(
        CONNCHECK,
        "a-gw's conncheck reaches b's tunnel address",
        || lab::metric_sum(&A.gw(), "liqo_peer_is_connected", &peer).is_ok_and(|v| v == 1.0),
    );
    // Liqo v1's labels: driver and cluster_id, no more.
    let scraped = lab::scrape(&A.gw()).unwrap();
    let connected: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("liqo_peer_is_connected{"))
        .collect();
    assert_eq!(
        connected,
        ["liqo_peer_is_connected{driver=\"wireguard\",cluster_id=\"cluster-b\"} 1"]
    );
    a_measures_b();
    b_hears_a();
    // The Connection Liqo v1's gateway reports to, `gw-<GatewayClient>`,
    // as a-gw's log shows it with `--source dir:`: Connected, with a
    // latency in μs or ms.
    eventually(CONNCHECK, "a-gw logs the Connection Connected", || {
        let log = std::fs::read_to_string(lab::log_file(&A.gw())).unwrap_or_default();
        log.lines().any(|l| {
            l.contains("Connection status")
                && l.contains("liqo-tenant-b/gw-cluster-b")
                && l.contains("status=\"Connected\"")
                && (l.contains("μs") || l.contains("ms"))
        })
    });
    // Only a: b's other peering is Liqo v0.10's, which this lab leaves out.
    let b = liqo_side();
    let peers: Vec<&String> = b["peers"].as_object().unwrap().keys().collect();
    assert_eq!(peers, ["cluster-a"], "{b}");
}

/// a-gw as a Liqo v1 gateway pod made from Isthmus's template: in place
/// of a's agent, `isthmus-agent liqo-wireguard` carries the tunnel, and
/// the test answers and sends the conncheck as Liqo's `gateway` container
/// does beside it. Restores a's agent when dropped.
struct WireguardContainer {
    api: Option<FakeApi>,
    pid: u32,
    stop: Arc<AtomicBool>,
    conncheck: Option<std::thread::JoinHandle<()>>,
}

impl WireguardContainer {
    /// Stops a's agent and starts the container with the flags Liqo's
    /// template renders for a's side, reading b's PublicKey from an API
    /// server in a-gw.
    fn start() -> Self {
        let gw = A.gw();
        lab::stop_agent(&gw).unwrap();
        lab::clean_up_agent(&gw).unwrap();
        let listener = netns::run_in(&gw, || TcpListener::bind("127.0.0.1:0"))
            .unwrap()
            .unwrap();
        let api = FakeApi::start(listener).unwrap();
        let b_id = B.cluster_id();
        api.apply(json!({
            "apiVersion": "networking.liqo.io/v1beta1", "kind": "PublicKey",
            "metadata": {"name": b_id, "namespace": "liqo-tenant-b",
                "labels": {"liqo.io/remote-cluster-id": b_id}},
            "spec": {"publicKey": lab::public_key(&B.gw()).unwrap()},
        }));
        let state = std::path::PathBuf::from(lab::STATE_DIR).join("liqo-wireguard");
        let keys = state.join("keys");
        std::fs::create_dir_all(&keys).unwrap();
        std::fs::copy(lab::key_file(&gw), keys.join("privateKey")).unwrap();
        let kubeconfig = state.join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
        let (mode, side) = match isthmus_side() {
            Side::Client => (
                "client",
                vec![
                    format!("--endpoint-address={}", B.wan_addr()),
                    format!("--endpoint-port={PORT}"),
                ],
            ),
            Side::Server => ("server", vec![format!("--listen-port={PORT}")]),
        };
        // What the template's container holds: NET_ADMIN alone.
        let mut args: Vec<String> = [
            "--bounding-set=-all,+net_admin".to_owned(),
            lab::agent_binary().display().to_string(),
            "liqo-wireguard".to_owned(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--name=cluster-b".to_owned(),
            "--namespace=liqo-tenant-b".to_owned(),
            format!("--remote-cluster-id={b_id}"),
            format!("--mode={mode}"),
            "--mtu=1340".to_owned(),
            format!("--keys-dir={}", keys.display()),
            "--health-probe-bind-address=:9873".to_owned(),
            "--leader-election=false".to_owned(),
        ]
        .into();
        args.extend(side);
        let log = lab::log_file(&gw);
        let pid = lab::spawn_agent_binary("setpriv".as_ref(), &gw, &args, &log).unwrap();
        lab::wait_ready_in(&gw, pid, &log).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conncheck = Some(liqo_gateway_conncheck(stop.clone()));
        Self {
            api: Some(api),
            pid,
            stop,
            conncheck,
        }
    }
}

/// Liqo's `gateway` container's conncheck on a-gw, as the lab's Liqo side
/// runs it: PINGs b's tunnel address twice a second, answers PINGs.
fn liqo_gateway_conncheck(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let (_, theirs) = isthmus_side().addresses();
    let socket = netns::run_in(&A.gw(), || UdpSocket::bind(("0.0.0.0", 12345)))
        .unwrap()
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        while !stop.load(Ordering::Relaxed) {
            let ping = json!({"clusterID": "cluster-b", "msgType": "PING", "timeStamp": "2026-11-28T02:00:00.000000000Z"});
            let _ = socket.send_to(ping.to_string().as_bytes(), (theirs, 12345));
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            if let Ok(mut message) = serde_json::from_slice::<Value>(&buf[..n])
                && message["msgType"] == "PING"
            {
                message["msgType"] = json!("PONG");
                let _ = socket.send_to(message.to_string().as_bytes(), from);
            }
        }
    })
}

impl Drop for WireguardContainer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.conncheck.take() {
            let _ = thread.join();
        }
        let gw = A.gw();
        let _ = lab::stop_pid(self.pid);
        drop(self.api.take());
        let _ = isthmus_lab::cmd::ip(&gw, &["link", "del", "liqo-tunnel"]);
        if let Err(e) = lab::start_agent(&gw).and_then(|_| lab::wait_ready(&gw)) {
            eprintln!("restarting a-gw's agent: {e:#}");
        }
        eventually(RESTART, "row 1 again with a's agent back", row_1_holds);
    }
}

#[test]
#[ignore = "needs the Liqo v1 lab; `cargo xtask test` runs it there"]
fn as_liqos_wireguard_container_isthmus_carries_the_tunnel_to_liqos_wireguard_go() {
    require_liqo_v1_lab();
    let pongs = || {
        liqo_side()["peers"]["cluster-a"]["pongs"]
            .as_u64()
            .unwrap_or(0)
    };
    let answered = || liqo_side()["pings_answered"].as_u64().unwrap_or(0);
    let container = WireguardContainer::start();
    let (pongs_before, answered_before) = (pongs(), answered());
    // b's stock gateway and a's pod hear each other over the tunnel,
    // whichever side each takes: b's conncheck gets new PONGs, and answers
    // new PINGs.
    // b's wireguard-go keeps the session a's agent had; as a client that
    // sends and hears nothing, it starts a new one within RESTART.
    eventually(RESTART, "b's conncheck hears a's pod", || {
        pongs() >= pongs_before + 3 && answered() > answered_before
    });
    // The tunnel's counters are the container's: b's traffic came through it.
    let received = lab::metric_sum(
        &A.gw(),
        "isthmus_peer_receive_packets_total",
        &[("cluster_id", B.cluster_id().as_str())],
    )
    .unwrap();
    assert!(received > 0.0, "a's pod received {received} packets");
    drop(container);
}
