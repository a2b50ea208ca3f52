//! A handshake flood from a stranger on the WAN: the peers' traffic and
//! a restarting peer's handshake get through it.

use super::*;

/// A thread sending one datagram to `to` from `socket` as fast as it can,
/// until dropped; bounded in time and count.
struct Flood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Flood {
    const MAX_TIME: Duration = Duration::from_secs(30);
    const MAX_DATAGRAMS: u64 = 20_000_000;

    fn start(socket: &UdpSocket, datagram: Vec<u8>, to: SocketAddr) -> Self {
        use std::sync::atomic::Ordering;
        let socket = socket.try_clone().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut sent = 0;
            while !halt.load(Ordering::Relaxed)
                && sent < Self::MAX_DATAGRAMS
                && started.elapsed() < Self::MAX_TIME
            {
                sent += u64::from(socket.send_to(&datagram, to).is_ok());
            }
            sent
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops it; how many datagrams it sent.
    fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap())
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The median of rounds' p50s, in microseconds.
fn median_p50(rounds: &[[f64; 2]]) -> f64 {
    let mut p50s: Vec<f64> = rounds.iter().map(|r| r[0]).collect();
    p50s.sort_by(f64::total_cmp);
    p50s[p50s.len() / 2]
}

/// With the gateways as the DaemonSet runs them (no XDP guard), a stranger
/// floods b-gw with handshake initiations that carry a valid mac1 (it
/// knows b-gw's public key), as fast as one thread sends. Meanwhile
/// a-gw's agent restarts: its new handshake gets through b-gw's one limiter
/// (a cookie, then mac2 under the same secret) and a's traffic is back
/// within 2 s; c's traffic through b loses under 2% of its packets, with a
/// p50 round trip under 3x what it was before the flood.
#[test]
fn a_handshake_flood_spares_the_peers_and_lets_a_restarting_peer_in() {
    require_lab();
    assert!(
        !lab::Setup::current().unwrap().guard,
        "the lab runs the gateways as shipped"
    );
    let mut stranger = Outsider::towards(&B);
    let c_pod1 = C.pod_addr(1);
    // b-pod1's round trips to c-pod1, through b's tunnel: their p50.
    let b_to_c_p50 = || {
        let rounds = probe::round_trips(&B.pod(1), &C.pod(1), c_pod1, 3, 300, probe::Lost::Fails);
        median_p50(&rounds.unwrap())
    };
    let before = b_to_c_p50();
    let cookies_before = sample(&B.gw(), "isthmus_tunnel_cookies_sent_total");
    let mut buf = vec![0u8; 256];
    let TunnResult::WriteToNetwork(init) =
        stranger.tunn.format_handshake_initiation(&mut buf, false)
    else {
        panic!("no initiation");
    };
    let flood = Flood::start(&stranger.socket, init.to_vec(), stranger.gateway);
    let stream = UdpStream::start(&B.pod(1), &C.pod(1), c_pod1, c_pod1).unwrap();
    let during = b_to_c_p50();
    // a's traffic, a datagram a millisecond: its longest silence is the
    // restart's gap.
    let a_to_b = UdpStream::start(
        &A.pod(1),
        &B.pod(1),
        B.pod_addr(1),
        Ipv4Addr::new(10, 0, 0, 5),
    )
    .unwrap();
    a_to_b.wait_more(200, GIVE_UP).unwrap();
    lab::restart_agent(&A.gw()).unwrap();
    a_to_b.wait_more(500, GIVE_UP).unwrap();
    let resumed = a_to_b.finish().unwrap().longest_gap;
    stream.wait_more(500, GIVE_UP).unwrap();
    let report = stream.finish().unwrap();
    let sent = flood.stop();
    let cookies = sample(&B.gw(), "isthmus_tunnel_cookies_sent_total") - cookies_before;
    let loss = 1.0 - f64::from(report.received) / f64::from(report.sent);
    println!(
        "flood: {sent} initiations, {cookies} cookies; a's gap {resumed:?}; c's stream {}/{} ({:.2}% lost); p50 {before:.0} µs before, {during:.0} µs during",
        report.received,
        report.sent,
        loss * 100.0
    );
    assert!(cookies > 0.0, "b-gw sent no cookie: the flood was not felt");
    assert!(
        resumed < Duration::from_secs(2),
        "a's traffic came back after {resumed:?}"
    );
    assert!(loss < 0.02, "c's traffic lost {:.2}%", loss * 100.0);
    assert!(
        during < 3.0 * before,
        "c's p50 went from {before:.0} µs to {during:.0} µs"
    );
}

/// Where the newcomer of the test below initiates from: an address a-gw
/// has never seen.
const NEWCOMER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 98);

/// A stranger floods a-gw with initiations from one address, as in the
/// test above. Meanwhile a peer a-gw was just told of initiates from an
/// address a-gw has never seen: its object gives another endpoint, as for
/// a client behind NAT, so its initiations wait with the stranger's. It
/// completes its first handshake within 2 s: its line is served in turn
/// with the flood's.
#[test]
fn a_new_peer_from_an_unseen_address_gets_in_within_2_s_of_a_flood() {
    require_lab();
    let mut stranger = Outsider::towards(&A);
    let mut newcomer = Outsider::at(NEWCOMER, &A);
    let elsewhere = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 77), newcomer.port());
    let object = Outsider::register_at(elsewhere, &newcomer.public);
    eventually(GIVE_UP, "a-gw programs the newcomer", || {
        sample(&A.gw(), "isthmus_peers ") == 2.0
    });
    let mut buf = vec![0u8; 256];
    let TunnResult::WriteToNetwork(init) =
        stranger.tunn.format_handshake_initiation(&mut buf, false)
    else {
        panic!("no initiation");
    };
    let cookies = || sample(&A.gw(), "isthmus_tunnel_cookies_sent_total");
    let cookies_before = cookies();
    let flood = Flood::start(&stranger.socket, init.to_vec(), stranger.gateway);
    // The flood is felt: a-gw is under load, and answers with cookies.
    eventually(GIVE_UP, "a-gw sends the flood cookies", || {
        cookies() > cookies_before
    });
    let started = Instant::now();
    let connected = newcomer.handshake(Duration::from_secs(2));
    let took = started.elapsed();
    let sent = flood.stop();
    fs::remove_file(&object).unwrap();
    println!("flood: {sent} initiations; the newcomer's handshake took {took:?}");
    assert!(sent > 10_000, "the flood sent only {sent} initiations");
    assert!(
        connected,
        "the newcomer had no session 2 s into the flood ({took:?})"
    );
}
