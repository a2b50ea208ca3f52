//! The embedded userspace WireGuard tunnel of a gateway: boringtun's
//! `noise::Tunn` per peer, driven by our own multi-queue TUN and batched
//! UDP datapath.
//!
//! - [`key`]: the private key file;
//! - [`peers`]: peers and their lookup tables (no I/O);
//! - [`tun`], [`batch`]: the two devices' I/O;
//! - [`offload`]: TSO segmentation and GRO coalescing of TUN packets (no I/O);
//! - [`datapath`]: the worker and timer loops;
//! - [`set`]: a gateway's tunnels, one per tunnel device, as a whole.

mod batch;
pub mod datapath;
pub mod handshakes;
pub mod key;
pub mod offload;
pub mod peers;
mod routes;
pub mod set;
pub mod throttle;
mod timers;
mod tun;

use std::{
    collections::BTreeSet,
    io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket},
    panic::AssertUnwindSafe,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use boringtun::noise::{TunnResult, rate_limiter::RateLimiter};
use socket2::{Domain, Protocol, Socket, Type};
use tracing::error;

use self::{
    datapath::{Devices, Worker},
    key::KeyPair,
    peers::{PeerConfig, PeerSet, TunnelPeer},
};
use crate::model::object::ObjectKey;
use crate::sync::Unpoisoned;

/// Handshake messages per second above which the gateway answers with
/// cookies. One limiter, with one cookie secret, serves the whole gateway:
/// it sees each initiation twice (finding its peer, then in the peer's
/// state machine), so this is twice the handshakes it lets through.
pub(crate) const HANDSHAKE_LIMIT: u64 = 200;
/// WireGuard's overhead on a data packet: header, counter, tag.
const OVERHEAD: usize = 32;
/// A session older than this without a new handshake is dead (WireGuard's Reject-After-Time).
const SESSION_LIFETIME: Duration = Duration::from_mins(3);

/// How the tunnel is set up.
#[derive(Clone, Debug)]
pub struct TunnelConfig {
    /// TUN device name.
    pub dev: String,
    /// TUN device MTU.
    pub mtu: u32,
    /// UDP port to listen on; 0 for one the kernel picks.
    pub port: u16,
    /// Persistent keepalive, in seconds (0: none).
    pub keepalive: u16,
    /// Worker threads, each with a TUN queue and a UDP socket.
    pub workers: usize,
}

/// Tunnel-wide counters.
#[derive(Debug, Default)]
pub struct TunnelCounters {
    /// Frames (packets or super-packets) from TUN for which no peer holds the destination.
    pub no_route: AtomicU64,
    /// Frames from TUN for a peer we serve that has not made contact yet:
    /// there is nowhere to send them.
    pub no_endpoint: AtomicU64,
    /// Datagrams from a sender with a key or index we do not know.
    pub unknown_sender: AtomicU64,
    /// Datagrams that failed authentication or decryption.
    pub rejected: AtomicU64,
    /// Cookie replies sent under handshake load.
    pub cookies: AtomicU64,
    /// Handshake initiations not opened: their source had spent its share
    /// of Diffie-Hellman work ([`throttle`]).
    pub throttled: AtomicU64,
    /// Handshake initiations dropped: the queue of their class was full
    /// ([`handshakes`]).
    pub handshake_queue_full: AtomicU64,
    /// Frames from TUN that could not be parsed or segmented.
    pub malformed: AtomicU64,
    /// TSO super-packets from TUN split into segments.
    pub tso_split: AtomicU64,
    /// Super-packets of coalesced segments written to TUN.
    pub gro_written: AtomicU64,
    /// UDP GSO messages of several datagrams sent.
    pub udp_gso_sent: AtomicU64,
    /// UDP GRO trains of several datagrams received.
    pub udp_gro_received: AtomicU64,
    /// Packets from TUN too big to encrypt into one datagram.
    pub oversized: AtomicU64,
    /// Datapath threads restarted after a panic.
    pub thread_restarts: AtomicU64,
}

/// What the datapath threads share.
pub struct Shared {
    peers: RwLock<Arc<PeerSet>>,
    key: KeyPair,
    limiter: Arc<RateLimiter>,
    throttle: throttle::SourceThrottle,
    handshakes: handshakes::HandshakeQueue,
    stop: AtomicBool,
    mtu: usize,
    /// Datapath threads between a panic and their restart.
    down: AtomicUsize,
    /// Tunnel-wide counters.
    pub counters: TunnelCounters,
}

impl Shared {
    /// A tunnel with no peers yet, for `key`, on a device of `mtu` bytes.
    pub fn new(key: KeyPair, mtu: u32) -> Self {
        Self {
            peers: RwLock::new(Arc::new(PeerSet::default())),
            limiter: Arc::new(RateLimiter::new(&key.public, HANDSHAKE_LIMIT)),
            throttle: throttle::SourceThrottle::default(),
            handshakes: handshakes::HandshakeQueue::default(),
            key,
            stop: AtomicBool::new(false),
            mtu: mtu as usize,
            down: AtomicUsize::new(0),
            counters: TunnelCounters::default(),
        }
    }

    /// The gateway's handshake limiter, which every peer's state machine
    /// shares.
    pub fn limiter(&self) -> Arc<RateLimiter> {
        self.limiter.clone()
    }

    /// The peers as they are now; packets in flight keep the one they took.
    pub fn snapshot(&self) -> Arc<PeerSet> {
        self.peers.read().unpoisoned().clone()
    }

    /// Replaces the peers.
    pub fn set_snapshot(&self, peers: PeerSet) {
        *self.peers.write().unpoisoned() = Arc::new(peers);
    }

    /// The largest datagram the tunnel sends: a packet of the device's MTU,
    /// encrypted, with room to spare.
    fn max_sent(&self) -> usize {
        (self.mtu + OVERHEAD + 64).max(2048)
    }

    /// Runs `body` on a thread named `name` until the tunnel stops. A
    /// panic (whatever a datagram made a library do) does not end it: the
    /// thread logs it, counts it, waits a moment and runs `body` again,
    /// and the tunnel reports itself unhealthy meanwhile.
    fn spawn_supervised(
        self: &Arc<Self>,
        name: String,
        mut body: impl FnMut(&Shared) + Send + 'static,
    ) -> io::Result<JoinHandle<()>> {
        let shared = self.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                while !shared.stop.load(Ordering::Relaxed) {
                    let run = std::panic::catch_unwind(AssertUnwindSafe(|| body(&shared)));
                    if run.is_ok() {
                        continue;
                    }
                    shared.down.fetch_add(1, Ordering::SeqCst);
                    shared
                        .counters
                        .thread_restarts
                        .fetch_add(1, Ordering::Relaxed);
                    error!(
                        thread = name,
                        "tunnel thread panicked; restarting it (the panic message is above)"
                    );
                    std::thread::sleep(RESTART_DELAY);
                    shared.down.fetch_sub(1, Ordering::SeqCst);
                }
            })
    }
}

/// How long a datapath thread that panicked waits before it runs again, so
/// that a panic on every packet cannot spin a core.
const RESTART_DELAY: Duration = Duration::from_millis(100);

/// Connection state of one peer, as reported to the rest of the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// A session is established.
    Connected,
    /// Handshaking, or never connected.
    Connecting,
}

/// What the rest of the agent may know of one peer.
#[derive(Clone, Debug)]
pub struct PeerStatus {
    /// The TunnelEndpoint.
    pub key: ObjectKey,
    /// Cluster ID or name.
    pub label: String,
    /// Cluster name.
    pub cluster_name: String,
    /// Whether a session is up.
    pub connection: Connection,
    /// Time since the last completed handshake.
    pub last_handshake: Option<Duration>,
    /// Bytes sent, before encryption.
    pub tx_bytes: u64,
    /// Bytes received, after decryption.
    pub rx_bytes: u64,
    /// Packets sent to the peer.
    pub tx_packets: u64,
    /// Packets received from the peer and delivered.
    pub rx_packets: u64,
    /// Round-trip estimate from the last handshake, in milliseconds.
    pub rtt_ms: Option<u32>,
    /// Current endpoint (roams); None until a peer we serve made contact.
    pub endpoint: Option<SocketAddr>,
    /// Authenticated packets dropped for an inner source outside the peer's networks.
    pub dropped_source: u64,
    /// Failed or abandoned handshakes.
    pub handshake_failures: u64,
    /// Handshake initiations sent to the peer.
    pub initiations: u64,
    /// Packets for the peer dropped while it stays silent.
    pub dropped_silent: u64,
    /// Our index for the peer: the top 24 bits of its sessions' receiver indexes.
    pub index: u32,
}

/// How one peer changed in [`Tunnel::set_peers`].
#[derive(Debug, PartialEq, Eq)]
pub enum PeerChange {
    /// New, or its key changed: a fresh handshake was started.
    Started,
    /// Its endpoint was reconfigured; the session stays.
    Moved,
    /// Gone.
    Removed,
}

/// The running tunnel. Dropping it stops the threads; the device stays,
/// for the next agent (see [`tun`]).
pub struct Tunnel {
    shared: Arc<Shared>,
    control: UdpSocket,
    threads: Vec<JoinHandle<()>>,
    next_index: AtomicU32,
    keepalive: Option<u16>,
}

impl Tunnel {
    /// Creates the TUN device and the sockets, and starts the threads.
    pub fn start(config: &TunnelConfig, key: KeyPair) -> io::Result<Self> {
        let workers = config.workers.max(1);
        let queues = tun::open(&config.dev, workers)?;
        // Port 0 asks the kernel for one: the first socket's, which the
        // others then share.
        let first = bind(config.port)?;
        let port = first.local_addr()?.port();
        let sockets: Vec<UdpSocket> = std::iter::once(Ok(first))
            .chain((1..workers).map(|_| bind(port)))
            .collect::<io::Result<_>>()?;
        let shared = Arc::new(Shared::new(key, config.mtu));
        // Every socket of the SO_REUSEPORT group must be read: the kernel
        // hashes each peer's flow onto one of them. Handshakes and timers
        // therefore send through a clone of a worker's socket, never a
        // socket of their own.
        let control = sockets[0].try_clone()?;
        let mut threads = Vec::new();
        for (i, (tun, udp)) in queues.into_iter().zip(sockets).enumerate() {
            let devices = Devices::new(tun, udp)?;
            threads.push(
                shared.spawn_supervised(format!("tunnel-{i}"), move |shared| {
                    Worker::new(shared, &devices).run();
                })?,
            );
        }
        let handshake_socket = control.try_clone()?;
        threads.push(
            shared.spawn_supervised("tunnel-handshakes".into(), move |shared| {
                datapath::handshakes(shared, &handshake_socket);
            })?,
        );
        let timer_socket = control.try_clone()?;
        threads.push(
            shared.spawn_supervised("tunnel-timers".into(), move |shared| {
                timers::run(shared, &timer_socket);
            })?,
        );
        Ok(Self {
            shared,
            control,
            threads,
            next_index: AtomicU32::new(1),
            keepalive: (config.keepalive > 0).then_some(config.keepalive),
        })
    }

    /// The UDP port the tunnel listens on.
    pub fn port(&self) -> u16 {
        self.control.local_addr().map_or(0, |addr| addr.port())
    }

    /// Our public key.
    pub fn public_key(&self) -> [u8; 32] {
        *self.shared.key.public.as_bytes()
    }

    /// Tunnel-wide counters.
    pub fn counters(&self) -> &TunnelCounters {
        &self.shared.counters
    }

    /// Whether every datapath thread is running: none is waiting to restart
    /// after a panic, and none has ended.
    pub fn healthy(&self) -> bool {
        self.shared.down.load(Ordering::SeqCst) == 0
            && self.threads.iter().all(|t| !t.is_finished())
    }

    /// Brings the peers in line with `configs`, touching only those that
    /// changed: a new key gets a new state machine and an immediate
    /// handshake; a peer whose networks or endpoint change keeps its session.
    pub fn set_peers(&self, configs: &[PeerConfig]) -> Vec<(ObjectKey, PeerChange)> {
        let current = self.shared.snapshot();
        let mut changes = Vec::new();
        let mut started = Vec::new();
        let mut next = Vec::new();
        for config in configs {
            let peer = match current.by_key(&config.key) {
                Some(old) if old.config.public == config.public => {
                    if old.reconfigure(config.endpoint) {
                        changes.push((config.key.clone(), PeerChange::Moved));
                    }
                    old.clone()
                }
                _ => {
                    let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
                    let peer = Arc::new(TunnelPeer::new(
                        config.clone(),
                        index,
                        &self.shared.key.private,
                        self.keepalive,
                        self.shared.limiter(),
                    ));
                    started.push(peer.clone());
                    changes.push((config.key.clone(), PeerChange::Started));
                    peer
                }
            };
            next.push((peer, config.networks.clone()));
        }
        let kept: BTreeSet<&ObjectKey> = configs.iter().map(|c| &c.key).collect();
        changes.extend(
            current
                .iter()
                .filter(|p| !kept.contains(&p.config.key))
                .map(|p| (p.config.key.clone(), PeerChange::Removed)),
        );
        self.shared.set_snapshot(PeerSet::new(next));
        // Only now: the answer to a handshake comes back in microseconds, and
        // the datapath must already know the peer it belongs to.
        for peer in &started {
            self.initiate(peer);
        }
        changes
    }

    /// Starts a handshake now rather than on the first packet, towards a
    /// peer whose endpoint we know.
    fn initiate(&self, peer: &TunnelPeer) {
        let Some(endpoint) = peer.endpoint() else {
            return;
        };
        let mut buf = [0u8; 256];
        let mut tunn = peer.tunn.lock().unpoisoned();
        if let TunnResult::WriteToNetwork(init) = tunn.format_handshake_initiation(&mut buf, false)
        {
            peer.count_sent(init);
            let _ = self.control.send_to(init, endpoint);
        }
    }

    /// The state of every peer.
    pub fn status(&self) -> Vec<PeerStatus> {
        self.shared
            .snapshot()
            .iter()
            .map(|peer| {
                let tunn = peer.tunn.lock().unpoisoned();
                let (last_handshake, tx_bytes, rx_bytes, _loss, rtt_ms) = tunn.stats();
                let connected = last_handshake.is_some_and(|t| t < SESSION_LIFETIME);
                PeerStatus {
                    key: peer.config.key.clone(),
                    label: peer.config.label.clone(),
                    cluster_name: peer.config.cluster_name.clone(),
                    connection: if connected {
                        Connection::Connected
                    } else {
                        Connection::Connecting
                    },
                    last_handshake,
                    tx_bytes: tx_bytes as u64,
                    rx_bytes: rx_bytes as u64,
                    tx_packets: peer.counters.tx_packets.load(Ordering::Relaxed),
                    rx_packets: peer.counters.rx_packets.load(Ordering::Relaxed),
                    rtt_ms,
                    endpoint: peer.endpoint(),
                    dropped_source: peer.counters.dropped_source.load(Ordering::Relaxed),
                    handshake_failures: peer.counters.handshake_failures.load(Ordering::Relaxed),
                    initiations: peer.counters.initiations.load(Ordering::Relaxed),
                    dropped_silent: peer.counters.dropped_silent.load(Ordering::Relaxed),
                    index: peer.index,
                }
            })
            .collect()
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // The handshake thread may be waiting for work: a restart would
        // otherwise wait out its idle timeout, with no tunnel meanwhile.
        self.shared.handshakes.close();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A non-blocking UDP socket on `port` of both families, shared with the
/// other workers through `SO_REUSEPORT`; IPv4 alone on a kernel without
/// IPv6 (booted with `ipv6.disable=1`).
fn bind(port: u16) -> io::Result<UdpSocket> {
    let dual_stack = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    match bind_at(dual_stack) {
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            bind_at(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port).into())
        }
        bound => bound,
    }
}

fn bind_at(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.set_recv_buffer_size(4 << 20)?;
    socket.set_send_buffer_size(4 << 20)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}
