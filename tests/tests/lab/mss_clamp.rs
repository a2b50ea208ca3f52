//! TCP MSS clamping on the tunnel path. Pods with an MTU of 1500
//! on both sides move 50 MB through gateways whose tunnel carries 1,420
//! bytes, while every ICMP "fragmentation needed" is filtered, so PMTU
//! discovery cannot help: only the SYNs' clamped MSS keeps the segments
//! small enough. Without it the transfer stalls.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream},
    thread,
    time::Duration,
};

use isthmus_lab::{
    cmd::ip,
    lab, netns,
    probe::next_port,
    topology::{A, B},
};
use isthmus_tests::require_lab;

/// b-pod2 as cluster a sees it.
const B_POD2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 133);
const BYTES: usize = 50 * 1024 * 1024;
/// Bounds the transfer: it stops by itself whatever happens.
const GIVE_UP: Duration = Duration::from_secs(20);
/// The rule that hides PMTU discovery, on both gateways, both ways.
const FILTER: [&str; 6] = [
    "-p",
    "icmp",
    "--icmp-type",
    "fragmentation-needed",
    "-j",
    "DROP",
];

/// ICMP "fragmentation needed" dropped on both gateways while it lives.
struct IcmpFiltered;

impl IcmpFiltered {
    fn new() -> Self {
        for gw in [A.gw(), B.gw()] {
            for chain in ["OUTPUT", "FORWARD", "INPUT"] {
                isthmus_lab::cmd::iptables(&gw, &[&["-I", chain][..], &FILTER].concat()).unwrap();
            }
        }
        Self
    }
}

impl Drop for IcmpFiltered {
    fn drop(&mut self) {
        for gw in [A.gw(), B.gw()] {
            for chain in ["OUTPUT", "FORWARD", "INPUT"] {
                let _ = isthmus_lab::cmd::iptables(&gw, &[&["-D", chain][..], &FILTER].concat());
            }
        }
    }
}

fn mss_clamps(node: &str) -> f64 {
    lab::metric_sum(
        node,
        "isthmus_nat_translated_packets_total",
        &[("kind", "mss_clamp")],
    )
    .unwrap_or(0.0)
}

#[test]
fn fifty_megabytes_cross_with_df_set_and_icmp_filtered() {
    require_lab();
    for pod in [A.pod(2), B.pod(2)] {
        let link = ip(&pod, &["-o", "link", "show", "eth0"]).unwrap();
        assert!(link.contains("mtu 1500"), "{pod}: {link}");
    }
    let _filtered = IcmpFiltered::new();
    let clamps_before = mss_clamps(&A.gw());
    let port = next_port();
    let listener = netns::run_in(&B.pod(2), || TcpListener::bind(("0.0.0.0", port)))
        .unwrap()
        .unwrap();
    let server = thread::spawn(move || -> std::io::Result<usize> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(GIVE_UP))?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0;
        loop {
            match conn.read(&mut buf)? {
                0 => break,
                n => total += n,
            }
        }
        conn.write_all(&(total as u64).to_be_bytes())?;
        Ok(total)
    });
    let client = netns::run_in(&A.pod(2), || {
        TcpStream::connect_timeout(&(B_POD2, port).into(), Duration::from_secs(5))
    })
    .unwrap()
    .unwrap();
    let mut client = client;
    client.set_write_timeout(Some(GIVE_UP)).unwrap();
    client.set_read_timeout(Some(GIVE_UP)).unwrap();
    let chunk = vec![0x5a; 1024 * 1024];
    for _ in 0..BYTES / chunk.len() {
        client
            .write_all(&chunk)
            .expect("the transfer stalled: segments too big for the tunnel and no ICMP to say so");
    }
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let mut echoed = [0u8; 8];
    client.read_exact(&mut echoed).unwrap();
    assert_eq!(u64::from_be_bytes(echoed) as usize, BYTES);
    assert_eq!(server.join().unwrap().unwrap(), BYTES);
    assert!(mss_clamps(&A.gw()) > clamps_before, "a-gw clamped no SYN");
}
