//! The packet loops. Each worker owns one TUN queue and one UDP socket
//! (`SO_REUSEPORT`), so workers share nothing but the peer snapshot and
//! each peer's state machine. Both devices move many packets per system
//! call: TSO and GRO on TUN, GSO and GRO on UDP.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::{AsRawFd, OwnedFd},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use boringtun::noise::{
    Packet, Tunn, TunnResult, errors::WireGuardError, handshake::parse_handshake_anon,
};
use tracing::debug;

use super::{
    Shared,
    batch::{self, RecvBatch, SendBatch},
    offload::{self, Coalescer, MAX_FRAME, MAX_PACKET, VNET_HDR_LEN},
    peers::{PeerSet, TunnelPeer},
};

/// How often a worker wakes with nothing to do, to notice a stop.
const IDLE: Duration = Duration::from_millis(200);
/// How often WireGuard's timers run (boringtun's own device uses 250 ms).
const TICK: Duration = Duration::from_millis(250);

/// Frames read from TUN per wake-up, before the UDP side gets a turn.
const TUN_READS: usize = 64;

/// Buffers of one worker, allocated once.
struct Buffers {
    outgoing: Box<SendBatch>,
    incoming: Box<RecvBatch>,
    /// A frame read from TUN: a packet or a TSO super-packet.
    frame: Vec<u8>,
    /// One segment cut from a super-packet.
    segment: Vec<u8>,
    /// A decrypted packet, after room for its virtio-net header.
    packet: Vec<u8>,
    scratch: Vec<u8>,
    coalescer: Coalescer,
}

/// Runs one worker until the tunnel stops.
pub fn worker(shared: Arc<Shared>, tun: OwnedFd, udp: UdpSocket) {
    let size = shared.buffer_size();
    let mut bufs = Buffers {
        outgoing: SendBatch::new(size),
        incoming: RecvBatch::new(),
        frame: vec![0; MAX_FRAME],
        segment: vec![0; MAX_PACKET],
        packet: vec![0; VNET_HDR_LEN + size],
        scratch: vec![0; size],
        coalescer: Coalescer::default(),
    };
    batch::enable_gro(&udp);
    let mut fds = [
        libc::pollfd {
            fd: tun.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: udp.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !shared.stop.load(Ordering::Relaxed) {
        // SAFETY: two valid pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, IDLE.as_millis() as i32) };
        if ready <= 0 {
            continue;
        }
        let peers = shared.snapshot();
        if fds[0].revents & libc::POLLIN != 0 {
            from_tun(&shared, &peers, &tun, &udp, &mut bufs);
        }
        if fds[1].revents & libc::POLLIN != 0 {
            from_network(&shared, &peers, &tun, &udp, &mut bufs);
        }
    }
}

/// TUN → segment → encrypt → UDP, a batch at a time.
fn from_tun(shared: &Shared, peers: &PeerSet, tun: &OwnedFd, udp: &UdpSocket, bufs: &mut Buffers) {
    let counters = &shared.counters;
    for _ in 0..TUN_READS {
        // SAFETY: reading into an owned buffer of the given length.
        let n = unsafe {
            libc::read(
                tun.as_raw_fd(),
                bufs.frame.as_mut_ptr().cast(),
                bufs.frame.len(),
            )
        };
        if n <= 0 {
            break;
        }
        let frame = &mut bufs.frame[..n as usize];
        // Every segment of a super-packet goes where its first does: one
        // route lookup per frame.
        let Some(peer) = frame
            .get(VNET_HDR_LEN..)
            .and_then(destination)
            .and_then(|dst| peers.route(dst))
        else {
            counters.no_route.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let (endpoint, outgoing) = (peer.endpoint(), &mut bufs.outgoing);
        let mut packets = 0;
        let split = offload::split(frame, &mut bufs.segment, |packet| {
            encrypt(shared, peer, endpoint, packet, outgoing, udp);
            packets += 1;
        });
        peer.counters
            .tx_packets
            .fetch_add(packets, Ordering::Relaxed);
        match split {
            Ok(1) => {}
            Ok(_) => {
                counters.tso_split.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                debug!(error = %e, "frame from TUN dropped");
                counters.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    send(shared, udp, &mut bufs.outgoing);
}

/// Encrypts one packet for `peer`, at `endpoint`, into the batch.
fn encrypt(
    shared: &Shared,
    peer: &TunnelPeer,
    endpoint: SocketAddrV4,
    packet: &[u8],
    outgoing: &mut SendBatch,
    udp: &UdpSocket,
) {
    if outgoing.is_full() {
        send(shared, udp, outgoing);
    }
    let mut tunn = lock(peer);
    if let TunnResult::WriteToNetwork(datagram) = tunn.encapsulate(packet, outgoing.slot()) {
        let len = datagram.len();
        outgoing.commit(len, endpoint);
    }
}

fn send(shared: &Shared, udp: &UdpSocket, outgoing: &mut SendBatch) {
    if !outgoing.is_empty() {
        let gso = outgoing.send(udp);
        shared
            .counters
            .udp_gso_sent
            .fetch_add(gso, Ordering::Relaxed);
    }
}

fn destination(packet: &[u8]) -> Option<Ipv4Addr> {
    (packet.len() >= 20 && packet[0] >> 4 == 4)
        .then(|| Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]))
}

fn lock(peer: &TunnelPeer) -> std::sync::MutexGuard<'_, Tunn> {
    peer.tunn
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_tun(tun: &OwnedFd, frame: &[u8]) {
    // SAFETY: writing an owned, initialised slice.
    unsafe { libc::write(tun.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
}

/// UDP → decrypt → coalesce → TUN, a batch at a time.
fn from_network(
    shared: &Shared,
    peers: &PeerSet,
    tun: &OwnedFd,
    udp: &UdpSocket,
    bufs: &mut Buffers,
) {
    let Ok(count) = bufs.incoming.recv(udp) else {
        return;
    };
    let mut write = |frame: &[u8]| write_tun(tun, frame);
    let mut coalesced = 0;
    for i in 0..count {
        let (message, segment, source) = bufs.incoming.get(i);
        if segment < message.len() {
            shared
                .counters
                .udp_gro_received
                .fetch_add(1, Ordering::Relaxed);
        }
        for datagram in message.chunks(segment) {
            let Some(peer) = sender(shared, peers, datagram, source, udp, &mut bufs.scratch) else {
                continue;
            };
            if let Some(len) = decrypt(shared, peers, peer, datagram, source, udp, &mut bufs.packet)
            {
                let frame = &mut bufs.packet[..VNET_HDR_LEN + len];
                coalesced += bufs.coalescer.push(frame, &mut write);
            }
        }
    }
    coalesced += bufs.coalescer.flush(&mut write);
    shared
        .counters
        .gro_written
        .fetch_add(coalesced, Ordering::Relaxed);
}

/// Decrypts one datagram from `peer` into `buf` after the virtio-net header
/// room, and answers handshakes. Returns the length of a packet to deliver.
fn decrypt(
    shared: &Shared,
    peers: &PeerSet,
    peer: &Arc<TunnelPeer>,
    datagram: &[u8],
    source: SocketAddrV4,
    udp: &UdpSocket,
    buf: &mut [u8],
) -> Option<usize> {
    let mut tunn = lock(peer);
    let result = tunn.decapsulate(
        Some(IpAddr::V4(*source.ip())),
        datagram,
        &mut buf[VNET_HDR_LEN..],
    );
    if !matches!(result, TunnResult::Err(_)) {
        // Follow the peer to where it authenticated from before anything
        // answers it: another worker may encrypt the reply to this very
        // packet before this one returns from the TUN write.
        peer.roam(source);
    }
    match result {
        TunnResult::WriteToTunnelV4(packet, inner_source) => {
            // The inner source must be one of this peer's networks.
            if peers
                .route(inner_source)
                .is_some_and(|owner| Arc::ptr_eq(owner, peer))
            {
                peer.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
                return Some(packet.len());
            }
            peer.counters.dropped_source.fetch_add(1, Ordering::Relaxed);
        }
        TunnResult::WriteToNetwork(reply) => {
            let _ = udp.send_to(reply, source);
            // Packets queued while the handshake was under way go now.
            while let TunnResult::WriteToNetwork(queued) =
                tunn.decapsulate(None, &[], &mut buf[VNET_HDR_LEN..])
            {
                let _ = udp.send_to(queued, peer.endpoint());
            }
        }
        TunnResult::Done => {}
        TunnResult::Err(e) => {
            debug!(peer = %peer.config.label, error = ?e, "datagram rejected");
            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
            if is_handshake(datagram) {
                peer.counters
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        TunnResult::WriteToTunnelV6(..) => {
            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
    None
}

/// The peer a datagram comes from. A handshake initiation names its sender
/// only inside its encrypted static key, so it is opened (after the shared
/// rate limiter, which answers with a cookie under load); every other
/// message carries our index.
fn sender<'p>(
    shared: &Shared,
    peers: &'p PeerSet,
    datagram: &[u8],
    source: SocketAddrV4,
    udp: &UdpSocket,
    scratch: &mut [u8],
) -> Option<&'p Arc<TunnelPeer>> {
    let found = match Tunn::parse_incoming_packet(datagram) {
        Ok(Packet::HandshakeInit(_)) => {
            match shared
                .limiter
                .verify_packet(Some(IpAddr::V4(*source.ip())), datagram, scratch)
            {
                Ok(Packet::HandshakeInit(init)) => {
                    parse_handshake_anon(&shared.key.private, &shared.key.public, &init)
                        .ok()
                        .and_then(|half| peers.by_public(&half.peer_static_public))
                }
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    let _ = udp.send_to(cookie, source);
                    shared.counters.cookies.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                _ => None,
            }
        }
        Ok(Packet::HandshakeResponse(p)) => peers.by_receiver(p.receiver_idx),
        Ok(Packet::PacketCookieReply(p)) => peers.by_receiver(p.receiver_idx),
        Ok(Packet::PacketData(p)) => peers.by_receiver(p.receiver_idx),
        Err(_) => None,
    };
    if found.is_none() {
        shared
            .counters
            .unknown_sender
            .fetch_add(1, Ordering::Relaxed);
    }
    found
}

/// Whether `datagram` is a WireGuard handshake message (initiation,
/// response or cookie reply), by its type byte.
fn is_handshake(datagram: &[u8]) -> bool {
    matches!(datagram.first(), Some(1..=3))
}

/// Runs every peer's WireGuard timers (handshake retries, rekeying,
/// keepalives) and resets the shared rate limiter each second.
pub fn timers(shared: Arc<Shared>, udp: UdpSocket) {
    let mut buf = vec![0u8; shared.buffer_size()];
    let mut last_reset = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(TICK);
        if last_reset.elapsed() >= Duration::from_secs(1) {
            shared.limiter.reset_count();
            last_reset = Instant::now();
        }
        for peer in shared.snapshot().iter() {
            let endpoint = peer.endpoint();
            let result = lock(peer).update_timers(&mut buf);
            let expired = matches!(result, TunnResult::Err(WireGuardError::ConnectionExpired));
            if expired && !peer.counters.expired.swap(true, Ordering::Relaxed) {
                peer.counters
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
            } else if !expired {
                peer.counters.expired.store(false, Ordering::Relaxed);
            }
            if let TunnResult::WriteToNetwork(datagram) = result {
                let _ = udp.send_to(datagram, endpoint);
            }
        }
    }
}
