//! The packet loops. Each worker owns one TUN queue and one UDP socket
//! (`SO_REUSEPORT`), so workers share nothing but the peer snapshot and
//! each peer's state machine. Both devices move many packets per system
//! call: TSO and GRO on TUN, GSO and GRO on UDP.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::{AsRawFd, OwnedFd},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use boringtun::noise::{Packet, Tunn, TunnResult, handshake::parse_handshake_anon};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use tracing::debug;

use super::{
    OVERHEAD, Shared,
    batch::{self, RecvBatch, SendBatch},
    handshakes,
    offload::{self, Coalescer, MAX_FRAME, MAX_PACKET, VNET_HDR_LEN},
    peers::{PeerSet, TunnelPeer, clock_ns, has_session},
};

use crate::sync::Unpoisoned;

/// How often a worker wakes with nothing to do, to notice a stop, in ms.
const IDLE_MS: u16 = 200;

/// Frames read from TUN per wake-up, before the UDP side gets a turn.
const TUN_READS: usize = 64;

/// The largest UDP payload of one datagram, of either family (IPv6's
/// payload length leaves out its header). Whatever a WAN host sends,
/// boringtun never gets a buffer shorter than this: it panics on one.
pub const MAX_DATAGRAM: usize = 65535 - 8;

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

impl Buffers {
    fn new(shared: &Shared) -> Self {
        Self {
            outgoing: SendBatch::new(shared.max_sent()),
            incoming: RecvBatch::new(),
            frame: vec![0; MAX_FRAME],
            segment: vec![0; MAX_PACKET],
            packet: vec![0; VNET_HDR_LEN + MAX_DATAGRAM],
            scratch: vec![0; MAX_DATAGRAM],
            coalescer: Coalescer::default(),
        }
    }
}

/// A worker's two devices, watched for input together. An epoll set
/// rather than `poll`: the latter registers with both devices' wait
/// queues and unregisters again on every call, twice per round trip of a
/// request and its answer, which is what a latency-bound flow pays for.
pub struct Devices {
    tun: OwnedFd,
    udp: UdpSocket,
    ready: Epoll,
}

/// Which device an epoll event is for.
const TUN_EVENT: u64 = 0;
const UDP_EVENT: u64 = 1;

impl Devices {
    /// Watches one TUN queue and one UDP socket (level-triggered).
    pub fn new(tun: OwnedFd, udp: UdpSocket) -> std::io::Result<Self> {
        let ready = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        ready.add(&tun, EpollEvent::new(EpollFlags::EPOLLIN, TUN_EVENT))?;
        ready.add(&udp, EpollEvent::new(EpollFlags::EPOLLIN, UDP_EVENT))?;
        Ok(Self { tun, udp, ready })
    }

    /// Which devices have input, after waiting at most [`IDLE_MS`].
    fn wait(&self) -> (bool, bool) {
        let mut events = [EpollEvent::empty(); 2];
        let count = self.ready.wait(&mut events, IDLE_MS).unwrap_or(0);
        let has = |device| events[..count].iter().any(|e| e.data() == device);
        (has(TUN_EVENT), has(UDP_EVENT))
    }
}

/// One datapath thread's devices and buffers.
pub struct Worker<'a> {
    shared: &'a Shared,
    devices: &'a Devices,
    bufs: Buffers,
}

impl<'a> Worker<'a> {
    /// A worker on one TUN queue and one UDP socket, with fresh buffers.
    pub fn new(shared: &'a Shared, devices: &'a Devices) -> Self {
        Self {
            shared,
            devices,
            bufs: Buffers::new(shared),
        }
    }

    /// Moves packets until the tunnel stops.
    pub fn run(&mut self) {
        batch::enable_gro(&self.devices.udp);
        while !self.shared.stop.load(Ordering::Relaxed) {
            let (tun, udp) = self.devices.wait();
            if !tun && !udp {
                continue;
            }
            let peers = self.shared.snapshot();
            if tun {
                self.tun_to_network(&peers);
            }
            if udp {
                self.network_to_tun(&peers);
            }
        }
    }

    /// TUN → segment → encrypt → UDP, a batch at a time.
    fn tun_to_network(&mut self, peers: &PeerSet) {
        let sender = Sender {
            shared: self.shared,
            udp: &self.devices.udp,
        };
        let counters = &self.shared.counters;
        for _ in 0..TUN_READS {
            // SAFETY: reading into an owned buffer of the given length.
            let n = unsafe {
                libc::read(
                    self.devices.tun.as_raw_fd(),
                    self.bufs.frame.as_mut_ptr().cast(),
                    self.bufs.frame.len(),
                )
            };
            if n <= 0 {
                break;
            }
            let frame = &mut self.bufs.frame[..n as usize];
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
            let Some(endpoint) = peer.endpoint() else {
                counters.no_endpoint.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let outgoing = &mut self.bufs.outgoing;
            let mut packets = 0;
            let split = offload::split(frame, &mut self.bufs.segment, |packet| {
                sender.encrypt(peer, endpoint, packet, outgoing);
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
        sender.send(&mut self.bufs.outgoing);
    }

    /// UDP → decrypt → coalesce → TUN, a batch at a time.
    fn network_to_tun(&mut self, peers: &PeerSet) {
        let Ok(count) = self.bufs.incoming.recv(&self.devices.udp) else {
            return;
        };
        let receiver = Receiver {
            shared: self.shared,
            peers,
            udp: &self.devices.udp,
        };
        let tun = &self.devices.tun;
        let mut write = |frame: &[u8]| write_tun(tun, frame);
        let mut coalesced = 0;
        for i in 0..count {
            let (message, segment, source) = self.bufs.incoming.get(i);
            if segment < message.len() {
                self.shared
                    .counters
                    .udp_gro_received
                    .fetch_add(1, Ordering::Relaxed);
            }
            for datagram in message.chunks(segment) {
                if handshakes::is_initiation(datagram) {
                    let from_peer = peers.is_endpoint(source.ip());
                    if !self.shared.handshakes.push(datagram, source, from_peer) {
                        let full = &self.shared.counters.handshake_queue_full;
                        full.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                let (packet, scratch) = (&mut self.bufs.packet, &mut self.bufs.scratch);
                if let Some(len) = receiver.receive(datagram, source, packet, scratch) {
                    let frame = &mut self.bufs.packet[..VNET_HDR_LEN + len];
                    coalesced += self.bufs.coalescer.push(frame, &mut write);
                }
            }
        }
        coalesced += self.bufs.coalescer.flush(&mut write);
        self.shared
            .counters
            .gro_written
            .fetch_add(coalesced, Ordering::Relaxed);
    }
}

/// The sending half of a worker: encryption into a batch, and the socket.
struct Sender<'a> {
    shared: &'a Shared,
    udp: &'a UdpSocket,
}

impl Sender<'_> {
    /// Encrypts one packet for `peer`, at `endpoint`, into the batch. A
    /// packet too big for one datagram (the device's MTU lets none through)
    /// is dropped and counted: boringtun panics on a short buffer.
    fn encrypt(
        &self,
        peer: &TunnelPeer,
        endpoint: SocketAddr,
        packet: &[u8],
        outgoing: &mut SendBatch,
    ) {
        if packet.len() + OVERHEAD > self.shared.max_sent() {
            self.shared
                .counters
                .oversized
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if outgoing.is_full() {
            self.send(outgoing);
        }
        let mut tunn = lock(peer);
        // Without a session, boringtun would start a round of handshakes.
        if peer.silence.quiet(clock_ns) && !has_session(&tunn) {
            peer.counters.dropped_silent.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let TunnResult::WriteToNetwork(datagram) = tunn.encapsulate(packet, outgoing.slot()) {
            peer.count_sent(datagram);
            let len = datagram.len();
            outgoing.commit(len, endpoint);
        }
    }

    fn send(&self, outgoing: &mut SendBatch) {
        if !outgoing.is_empty() {
            let gso = outgoing.send(self.udp);
            self.shared
                .counters
                .udp_gso_sent
                .fetch_add(gso, Ordering::Relaxed);
        }
    }
}

/// Where an IP packet of either family goes.
fn destination(packet: &[u8]) -> Option<IpAddr> {
    match packet.first()? >> 4 {
        4 => {
            let dst: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            Some(Ipv4Addr::from(dst).into())
        }
        6 => {
            let dst: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            Some(Ipv6Addr::from(dst).into())
        }
        _ => None,
    }
}

/// Whether IPv6 destination `dst` is an address a router forwards: not
/// multicast, link-local, loopback or unspecified, which neighbour
/// discovery and router advertisements use and no tunnel carries.
fn leaves_the_link(dst: IpAddr) -> bool {
    match dst {
        IpAddr::V4(_) => true,
        IpAddr::V6(dst) => {
            !(dst.is_multicast()
                || dst.is_unicast_link_local()
                || dst.is_loopback()
                || dst.is_unspecified())
        }
    }
}

fn lock(peer: &TunnelPeer) -> std::sync::MutexGuard<'_, Tunn> {
    peer.tunn.lock().unpoisoned()
}

fn write_tun(tun: &OwnedFd, frame: &[u8]) {
    // SAFETY: writing an owned, initialised slice.
    unsafe { libc::write(tun.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
}

/// The receiving half of a worker: the tunnel, the peers as of this batch,
/// and the socket that answers handshakes.
pub struct Receiver<'a> {
    /// The tunnel's shared state.
    pub shared: &'a Shared,
    /// The peers as of this batch.
    pub peers: &'a PeerSet,
    /// Where handshake answers go out.
    pub udp: &'a UdpSocket,
}

impl Receiver<'_> {
    /// Handles one datagram from `source`: finds its peer, decrypts it into
    /// `packet` after the virtio-net header room, and answers handshakes.
    /// Returns the length of a packet to deliver. `packet` (after the
    /// header room) and `scratch` hold [`MAX_DATAGRAM`] bytes.
    pub fn receive(
        &self,
        datagram: &[u8],
        source: SocketAddr,
        packet: &mut [u8],
        scratch: &mut [u8],
    ) -> Option<usize> {
        let peer = self.sender(datagram, source, scratch)?;
        self.decrypt(peer, datagram, source, packet)
    }

    /// Decrypts one datagram from `peer` into `buf` after the virtio-net
    /// header room, and answers handshakes. Returns the length of a packet
    /// to deliver.
    fn decrypt(
        &self,
        peer: &Arc<TunnelPeer>,
        datagram: &[u8],
        source: SocketAddr,
        buf: &mut [u8],
    ) -> Option<usize> {
        let counters = &self.shared.counters;
        let mut tunn = lock(peer);
        let result = tunn.decapsulate(Some(source.ip()), datagram, &mut buf[VNET_HDR_LEN..]);
        if authenticated(datagram, &result) {
            // Follow the peer to where it authenticated from before anything
            // answers it: another worker may encrypt the reply to this very
            // packet before this one returns from the TUN write.
            peer.roam(source);
        }
        match result {
            TunnResult::WriteToTunnelV4(packet, inner_source) => {
                return self.deliver(peer, packet, inner_source.into());
            }
            TunnResult::WriteToTunnelV6(packet, inner_source) => {
                return self.deliver(peer, packet, inner_source.into());
            }
            TunnResult::WriteToNetwork(reply) => {
                let _ = self.udp.send_to(reply, source);
                // Packets queued while the handshake was under way go now,
                // where the peer is (a peer we serve is, once it answered).
                while let TunnResult::WriteToNetwork(queued) =
                    tunn.decapsulate(None, &[], &mut buf[VNET_HDR_LEN..])
                {
                    if let Some(endpoint) = peer.endpoint() {
                        let _ = self.udp.send_to(queued, endpoint);
                    }
                }
            }
            TunnResult::Done => {}
            TunnResult::Err(e) => {
                debug!(peer = %peer.config.label, error = ?e, "datagram rejected");
                counters.rejected.fetch_add(1, Ordering::Relaxed);
                if is_handshake(datagram) {
                    peer.counters
                        .handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        None
    }

    /// Whether a decrypted `packet` from `inner_source` is delivered: its
    /// source must lie in `peer`'s own networks, as WireGuard's cryptokey
    /// routing wants (a router advertisement's or a neighbour
    /// solicitation's link-local source lies in none), and it must not be
    /// bound for a link: IPv6 multicast or link-local. Returns its length
    /// if so.
    fn deliver(
        &self,
        peer: &Arc<TunnelPeer>,
        packet: &[u8],
        inner_source: IpAddr,
    ) -> Option<usize> {
        let owner = self.peers.route(inner_source);
        // Only IPv6 has link-scoped destinations to refuse: an IPv4
        // packet's is not read again.
        let routed = inner_source.is_ipv4() || destination(packet).is_some_and(leaves_the_link);
        if routed && owner.is_some_and(|owner| Arc::ptr_eq(owner, peer)) {
            peer.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
            return Some(packet.len());
        }
        peer.counters.dropped_source.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// The peer a datagram comes from. A handshake initiation names its
    /// sender only inside its encrypted static key, so it is opened (after
    /// the shared rate limiter, which answers with a cookie under load, and
    /// within its source's share of that work); every other message
    /// carries our index.
    fn sender(
        &self,
        datagram: &[u8],
        source: SocketAddr,
        scratch: &mut [u8],
    ) -> Option<&Arc<TunnelPeer>> {
        let (shared, peers) = (self.shared, self.peers);
        let found = match Tunn::parse_incoming_packet(datagram) {
            Ok(Packet::HandshakeInit(_)) => {
                match shared
                    .limiter
                    .verify_packet(Some(source.ip()), datagram, scratch)
                {
                    Ok(Packet::HandshakeInit(_))
                        if !shared.throttle.allow(source.ip(), Instant::now()) =>
                    {
                        shared.counters.throttled.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                    Ok(Packet::HandshakeInit(init)) => {
                        parse_handshake_anon(&shared.key.private, &shared.key.public, &init)
                            .ok()
                            .and_then(|half| peers.by_public(&half.peer_static_public))
                    }
                    Err(TunnResult::WriteToNetwork(cookie)) => {
                        let _ = self.udp.send_to(cookie, source);
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
}

/// WireGuard's message types, by their first byte.
const MESSAGE_COOKIE_REPLY: u8 = 3;
const MESSAGE_DATA: u8 = 4;

/// Whether handling `datagram` proved that it came from the peer, so that
/// the peer may be followed to its source: transport data that decrypted
/// (a keepalive decrypts to nothing), an initiation answered with a
/// response, a response that completed our handshake (answered with a
/// keepalive). Never a cookie reply, sent or received: boringtun's rate
/// limiter sends one after checking only mac1, which anyone who knows our
/// public key can compute, and a received one is sealed under public values.
fn authenticated(datagram: &[u8], result: &TunnResult) -> bool {
    match result {
        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => true,
        TunnResult::Done => datagram.first() == Some(&MESSAGE_DATA),
        TunnResult::WriteToNetwork(reply) => reply.first() != Some(&MESSAGE_COOKIE_REPLY),
        TunnResult::Err(_) => false,
    }
}

/// Whether `datagram` is a WireGuard handshake message (initiation,
/// response or cookie reply), by its type byte.
fn is_handshake(datagram: &[u8]) -> bool {
    matches!(datagram.first(), Some(1..=3))
}

/// Opens the handshake initiations the workers queued ([`handshakes`]),
/// peers' endpoints' first, and answers them.
pub fn handshakes(shared: &Shared, udp: &UdpSocket) {
    let (mut packet, mut scratch) = (vec![0; VNET_HDR_LEN + MAX_DATAGRAM], vec![0; MAX_DATAGRAM]);
    let mut budget = handshakes::OthersBudget::new(Instant::now());
    while !shared.stop.load(Ordering::Relaxed) {
        let others = budget.available(Instant::now());
        let wait = Duration::from_millis(if others { IDLE_MS.into() } else { 10 });
        let Some(initiation) = shared.handshakes.pop(wait, others) else {
            continue;
        };
        if !initiation.from_peer {
            budget.spend();
        }
        let peers = shared.snapshot();
        let receiver = Receiver {
            shared,
            peers: &peers,
            udp,
        };
        // An initiation delivers nothing to TUN: it is answered, or not.
        let _ = receiver.receive(
            &initiation.bytes,
            initiation.source,
            &mut packet,
            &mut scratch,
        );
    }
}

#[cfg(test)]
mod tests;
