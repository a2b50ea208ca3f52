//! Isthmus speaks real WireGuard: an Isthmus gateway and `wireguard-go`
//! configured with `wg` (the reference implementation, Debian packages)
//! carry traffic both ways, and keep doing so across a rekey.
//!
//! `ist-t-wgo-iso` runs the agent, with a pod address 10.244.0.5 that the
//! peer sees as 10.0.40.5; `ist-t-wgo-go` runs wireguard-go with 10.1.0.5
//! and no remapping.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::unix::fs::OpenOptionsExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use isthmus_lab::{
    cmd::{ip, run},
    lab, netns,
    objects::TunnelEndpoint,
    probe::next_port,
};
use isthmus_tests::{netns as test_netns, require_lab, require_root};

const ISO: &str = "ist-t-wgo-iso";
const GO: &str = "ist-t-wgo-go";
/// wireguard-go's device, named so its machine-wide control socket is ours.
const WG_DEV: &str = "istwgo0";
const ISO_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 5);
const ISO_POD_AS_SEEN: Ipv4Addr = Ipv4Addr::new(10, 0, 40, 5);
const GO_POD: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 5);
/// WireGuard rekeys a session after 120 s; give it a margin, and a bound.
const REKEY_WAIT: Duration = Duration::from_mins(3);

struct Pair {
    agent: u32,
    _wireguard_go: Reaped,
    dir: PathBuf,
}

/// A child that is killed when dropped, even if setup fails half-way.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // Ends only the wireguard-go this test started, by PID.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sh(ns: &str, script: &str) -> String {
    run("ip", &["netns", "exec", ns, "sh", "-c", script]).unwrap()
}

impl Pair {
    fn new() -> Self {
        require_root();
        require_lab();
        test_netns::fresh(&[ISO, GO]);
        test_netns::link(ISO, GO);
        ip(ISO, &["addr", "add", &format!("{ISO_POD}/32"), "dev", "lo"]).unwrap();

        let dir = PathBuf::from(lab::STATE_DIR).join("wgo");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("objects")).unwrap();
        let iso_public = lab::public_key(ISO).unwrap();

        // The reference side, configured with the reference tools.
        let go_key = dir.join("go.key");
        let generated = run("wg", &["genkey"]).unwrap();
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&go_key)
            .unwrap();
        fs::write(&go_key, generated.trim()).unwrap();
        let go_public = run("sh", &["-c", &format!("wg pubkey < {}", go_key.display())])
            .unwrap()
            .trim()
            .to_owned();
        // The control socket's directory is machine-wide: a name of our own,
        // and a stale socket of a killed run removed first.
        let socket = PathBuf::from(format!("/var/run/wireguard/{WG_DEV}.sock"));
        let _ = fs::remove_file(&socket);
        let wireguard_go = Command::new("ip")
            .args(["netns", "exec", GO, "wireguard-go", WG_DEV])
            .env("WG_PROCESS_FOREGROUND", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Reaped)
            .expect("wireguard-go");
        isthmus_tests::eventually(
            Duration::from_secs(10),
            "wireguard-go's control socket open",
            || std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        );
        sh(
            GO,
            &format!(
                "wg set {WG_DEV} private-key {} listen-port 5871 peer {iso_public} endpoint 192.0.2.1:5871 allowed-ips 10.0.40.0/24 persistent-keepalive 10",
                go_key.display()
            ),
        );
        ip(GO, &["addr", "add", &format!("{GO_POD}/32"), "dev", WG_DEV]).unwrap();
        ip(GO, &["link", "set", WG_DEV, "up"]).unwrap();
        ip(GO, &["route", "add", "10.0.40.0/24", "dev", WG_DEV]).unwrap();

        // Isthmus, with the peer as Liqo would describe it.
        fs::write(
            dir.join("objects/peer-go.yaml"),
            TunnelEndpoint::new("tep-go", "liqo-tenant-go")
                .cluster_id("cluster-go")
                .local(["10.244.0.0/24", "10.0.40.0/24", "192.168.0.0/24", "None"])
                .remote(["10.1.0.0/24", "None", "10.2.0.0/24", "None"])
                .endpoint("192.0.2.2")
                .port(5871)
                .public_key(&go_public)
                .to_string(),
        )
        .unwrap();
        let agent = lab::start_gateway_in(ISO, &dir.join("objects"), &[]).unwrap();
        Self {
            agent,
            _wireguard_go: wireguard_go,
            dir,
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = lab::stop_pid(self.agent);
        test_netns::remove(&[ISO, GO]);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One datagram from `client_ns` (bound to `from`) to `to`, echoed back by a
/// server in `server_ns` bound to `server_addr`. Returns the client address
/// the server saw.
fn echo(
    client_ns: &str,
    from: Ipv4Addr,
    server_ns: &str,
    server_addr: Ipv4Addr,
    to: Ipv4Addr,
) -> Option<Ipv4Addr> {
    let port = next_port();
    let server = netns::run_in(server_ns, || UdpSocket::bind((server_addr, port)))
        .unwrap()
        .unwrap();
    let client = netns::run_in(client_ns, || UdpSocket::bind((from, 0)))
        .unwrap()
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 32];
    // A few tries: the first packet may wait for a handshake.
    for _ in 0..6 {
        client.send_to(b"interop", (to, port)).unwrap();
        if let Ok((_, seen)) = server.recv_from(&mut buf) {
            server.send_to(b"reply", seen).unwrap();
            let (_, replier) = client.recv_from(&mut buf).ok()?;
            assert_eq!(
                replier,
                SocketAddr::from((to, port)),
                "reply from elsewhere"
            );
            let SocketAddr::V4(seen) = seen else {
                return None;
            };
            return Some(*seen.ip());
        }
    }
    None
}

fn both_ways() {
    assert_eq!(
        echo(ISO, ISO_POD, GO, GO_POD, GO_POD),
        Some(ISO_POD_AS_SEEN),
        "Isthmus → wireguard-go{}",
        diagnose()
    );
    assert_eq!(
        echo(GO, GO_POD, ISO, ISO_POD, ISO_POD_AS_SEEN),
        Some(GO_POD),
        "wireguard-go → Isthmus{}",
        diagnose()
    );
}

/// What both ends say of the tunnel, for a failure message.
fn diagnose() -> String {
    let metrics = lab::http_get(ISO, "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default();
    let tunnel: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("isthmus_peer") || l.starts_with("isthmus_tunnel"))
        .collect();
    format!(
        "\nwg show:\n{}\nIsthmus log:\n{}\nIsthmus metrics:\n{}",
        sh(GO, &format!("wg show {WG_DEV}")),
        lab::log_tail(&lab::log_file(ISO)),
        tunnel.join("\n")
    )
}

#[test]
fn traffic_flows_both_ways_with_wireguard_go_and_survives_a_rekey() {
    // Held to the end: dropping it takes the pair down.
    let _pair = Pair::new();
    both_ways();
    let first = latest_handshake();
    assert!(first > 0, "wireguard-go reports no handshake with Isthmus");

    // Keep a little traffic flowing until a new handshake replaces the session.
    // An echo a second: a little traffic, not a flood.
    let took = isthmus_lab::wait::until(REKEY_WAIT, Duration::from_secs(1), "a rekey", || {
        assert!(
            echo(ISO, ISO_POD, GO, GO_POD, GO_POD).is_some(),
            "traffic stopped before the rekey"
        );
        latest_handshake() != first
    })
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("rekeyed after {took:?}");
    both_ways();
}

/// The epoch second of wireguard-go's latest handshake with Isthmus.
fn latest_handshake() -> u64 {
    let out = sh(GO, &format!("wg show {WG_DEV} latest-handshakes"));
    out.split_whitespace()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}
