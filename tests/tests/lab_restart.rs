//! Restarting a gateway's agent loses no packet: the programs and maps stay
//! pinned while it is down, and the new agent swaps its programs in
//! atomically and adopts the maps.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use isthmus_tests::require_lab;
use xtask::{
    lab, netns,
    probe::next_port,
    topology::{A, B, reachability},
};

/// Gap between datagrams: 2,000 a second, well within any socket buffer.
const PACE: Duration = Duration::from_micros(500);
/// Bounds on the stream, so it stops by itself whatever happens.
const MAX_PACKETS: u32 = 200_000;
const MAX_TIME: Duration = Duration::from_secs(90);

#[test]
fn restarting_both_gateway_agents_loses_no_datagram() {
    require_lab();
    let row = &reachability()[0];
    let port = next_port();
    let server = netns::run_in(&row.answered_by, || {
        UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))
    })
    .unwrap()
    .unwrap();
    let client = netns::run_in(&row.from, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap()
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let target = (row.target, port);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU32::new(0));
    let sender = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut seq = 0u32;
            while !stop.load(Ordering::Relaxed) && seq < MAX_PACKETS && start.elapsed() < MAX_TIME {
                client.send_to(&seq.to_be_bytes(), target).expect("send");
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
            // Ends when the stream has been silent for the read timeout.
            while let Ok((n, _)) = server.recv_from(&mut buf) {
                if n == 4 {
                    seen.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
            seen
        })
    };
    let wait_received = |count: u32| {
        let start = Instant::now();
        while received.load(Ordering::Relaxed) < count {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the stream stalled at {}",
                received.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    wait_received(500);
    for gw in [A.gw(), B.gw()] {
        let before = lab::agent_pid(&gw).expect("agent running");
        lab::restart_agent(&gw).unwrap();
        assert_ne!(
            lab::agent_pid(&gw),
            Some(before),
            "{gw}'s agent was not restarted"
        );
    }
    let mark = received.load(Ordering::Relaxed);
    wait_received(mark + 500);
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    let seen = receiver.join().unwrap();

    let sent = sent.load(Ordering::Relaxed);
    let missing: Vec<u32> = (0..sent).filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "{} of {sent} datagrams lost across the restarts, first {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert!(sent > 1000, "stream too short to span the restarts: {sent}");
}
