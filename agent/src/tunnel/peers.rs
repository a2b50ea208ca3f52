//! The tunnel's peers and how a packet finds one. Protocol state only: no
//! I/O happens here, so all of it can be tested in memory.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use boringtun::noise::{Tunn, rate_limiter::RateLimiter};
use boringtun::x25519::{PublicKey, StaticSecret};
use crossbeam_utils::atomic::AtomicCell;
use ipnet::IpNet;

use super::routes::Routes;

use crate::model::object::ObjectKey;
use crate::sync::Unpoisoned;

/// What the agent knows of a peer from its TunnelEndpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// The TunnelEndpoint.
    pub key: ObjectKey,
    /// Cluster ID or name, for logs and metrics.
    pub label: String,
    /// Cluster name, for metrics.
    pub cluster_name: String,
    /// The peer gateway's static public key.
    pub public: [u8; 32],
    /// Where the peer gateway listens (`endpointIP`, `backend_config.port`),
    /// or None when it is the peer that makes contact (we are its server):
    /// nothing is sent to it until it has.
    pub endpoint: Option<SocketAddr>,
    /// The peer's networks as we see them, of both families.
    pub networks: Vec<IpNet>,
}

/// Counters of one peer, updated by the datapath.
#[derive(Debug, Default)]
pub struct PeerCounters {
    /// Packets sent to the peer (data, before encryption).
    pub tx_packets: AtomicU64,
    /// Packets received from the peer and written to the TUN device.
    pub rx_packets: AtomicU64,
    /// Authenticated packets whose inner source lay outside the peer's networks.
    pub dropped_source: AtomicU64,
    /// Handshake messages from the peer that failed to authenticate, and
    /// handshakes given up after retrying (WireGuard's Rekey-Attempt-Time).
    pub handshake_failures: AtomicU64,
    /// Handshake initiations sent to the peer: first contact, retries, rekeys.
    pub initiations: AtomicU64,
    /// Whether the timers last reported the session expired: boringtun
    /// repeats that on every tick, and one expiry is one failure.
    pub expired: AtomicBool,
    /// Packets for the peer dropped while it stays silent: no session, and
    /// the wait before data may start the next round of handshakes.
    pub dropped_silent: AtomicU64,
}

/// One peer: its WireGuard state machine and where it is.
pub struct TunnelPeer {
    /// Its configuration when created; networks live in the [`PeerSet`].
    pub config: PeerConfig,
    /// Our session index for it (receiver indices carry it in their top 24 bits).
    pub index: u32,
    /// The WireGuard state machine; `encapsulate` and `decapsulate` need it exclusively.
    pub tunn: Mutex<Tunn>,
    /// Current endpoint: starts at the configured one and roams to the
    /// source of the last authenticated packet. Read for every packet sent,
    /// written only when it moves: an IPv6 endpoint is wider than any
    /// atomic, and the cell's reads take no lock.
    endpoint: AtomicCell<Option<SocketAddr>>,
    /// The endpoint the object gives now (a name's address moves).
    configured: AtomicCell<Option<SocketAddr>>,
    /// Datapath counters.
    pub counters: PeerCounters,
    /// The first handshake's retries, until a session is up.
    first_contact: Mutex<FirstContact>,
    /// Set once the retries are over, for good: the timer thread then
    /// passes the peer by without taking the lock, forty times a second.
    first_contact_over: AtomicBool,
    /// The rounds of handshakes it left unanswered in a row.
    pub silence: Silence,
}

/// A peer's rounds of handshakes given up in a row (each lasts WireGuard's
/// Rekey-Attempt-Time, 90 s), and the wait before data may start the next.
/// WireGuard starts a round whenever data is due, and Liqo's conncheck
/// makes data due every 2 s: a peer that stays silent would cost a
/// Diffie-Hellman every 5 s for ever. Each round given up doubles the
/// wait, from [`FIRST_WAIT`] up to [`LONGEST_WAIT`], and the initiations
/// of the next round are as far apart; a session ends it. The peer may
/// initiate at any time meanwhile, and is answered at once.
#[derive(Debug, Default)]
pub struct Silence {
    rounds: AtomicU32,
    /// [`clock_ns`] until which data starts no round; 0 for none.
    quiet_until: AtomicU64,
}

/// The wait after the first round given up.
pub const FIRST_WAIT: Duration = Duration::from_secs(10);
/// The longest wait between rounds.
pub const LONGEST_WAIT: Duration = Duration::from_mins(5);

impl Silence {
    /// A round was given up at `now` (a [`clock_ns`]); returns the wait
    /// before data may start the next.
    pub fn round_given_up(&self, now: u64) -> Duration {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        let wait = self.spacing();
        let until = now.saturating_add(wait.as_nanos() as u64);
        self.quiet_until.store(until, Ordering::Relaxed);
        wait
    }

    /// How far apart this round's initiations are: WireGuard's
    /// Rekey-Timeout (none here) until a round was given up, then the wait
    /// that round set.
    pub fn spacing(&self) -> Duration {
        match self.rounds.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            rounds => FIRST_WAIT
                .saturating_mul(1 << (rounds - 1).min(16))
                .min(LONGEST_WAIT),
        }
    }

    /// An initiation went out at `now`: a silent peer's next waits for
    /// this round's spacing, whatever sends it (data or a timer).
    pub fn initiation_sent(&self, now: u64) {
        let spacing = self.spacing();
        if !spacing.is_zero() {
            let until = now.saturating_add(spacing.as_nanos() as u64);
            self.quiet_until.store(until, Ordering::Relaxed);
        }
    }

    /// Whether data must not start a round now (`now` read only if a wait
    /// was ever set: one atomic load on the packet path of a peer that
    /// answers).
    pub fn quiet(&self, now: impl FnOnce() -> u64) -> bool {
        let until = self.quiet_until.load(Ordering::Relaxed);
        until != 0 && now() < until
    }

    /// Whether any round was given up since the last session.
    pub fn is_silent(&self) -> bool {
        self.rounds.load(Ordering::Relaxed) != 0
    }

    /// A session is up: the silence is over.
    pub fn end(&self) {
        self.rounds.store(0, Ordering::Relaxed);
        self.quiet_until.store(0, Ordering::Relaxed);
    }
}

/// Whether `tunn` holds a session: data goes out at once.
pub fn has_session(tunn: &Tunn) -> bool {
    tunn.time_since_last_handshake().is_some()
}

/// Nanoseconds on a monotonic clock shared by the tunnel's threads.
pub fn clock_ns() -> u64 {
    static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
    EPOCH.elapsed().as_nanos() as u64
}

/// The initiation of a peer's first handshake, sent again on a short
/// backoff until a session is up: a gateway that just became active, or
/// just restarted, has no session at all, and its first initiation may be
/// lost while the address peers know moves to it. WireGuard's own retry,
/// after Rekey-Timeout (5 s), would otherwise make every failover last
/// that long. Once a session has been up, or the backoff reaches 5 s,
/// WireGuard's timers alone decide.
#[derive(Debug)]
pub struct FirstContact {
    next: Option<Instant>,
    step: Duration,
}

/// The first byte of a WireGuard handshake initiation.
const MESSAGE_HANDSHAKE_INITIATION: u8 = 1;

/// The first retry's delay; each next one doubles it.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// WireGuard's Rekey-Timeout: from there, its own retries take over.
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);

impl FirstContact {
    /// A backoff whose first retry falls `FIRST_RETRY` after `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            next: Some(now + FIRST_RETRY),
            step: FIRST_RETRY,
        }
    }

    /// Whether no retry will ever be due again.
    pub fn is_over(&self) -> bool {
        self.next.is_none()
    }

    /// Whether the initiation is due again at `now`, for a peer that has
    /// (`connected`, asked only when the time has come) or has not had a
    /// session yet; schedules the next.
    pub fn due(&mut self, now: Instant, connected: impl FnOnce() -> bool) -> bool {
        let Some(next) = self.next else { return false };
        if now < next {
            return false;
        }
        if connected() {
            self.next = None;
            return false;
        }
        self.step *= 2;
        self.next = (self.step < REKEY_TIMEOUT).then(|| now + self.step);
        true
    }
}

impl std::fmt::Debug for TunnelPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelPeer")
            .field("key", &self.config.key)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl TunnelPeer {
    /// A peer with a fresh state machine.
    pub fn new(
        config: PeerConfig,
        index: u32,
        private: &StaticSecret,
        keepalive: Option<u16>,
        limiter: Arc<RateLimiter>,
    ) -> Self {
        // Every state machine shares the gateway's limiter: one count of
        // handshakes under load and one cookie secret, so a peer's mac2
        // answers the one cookie it was sent wherever it is checked.
        let tunn = Tunn::new(
            private.clone(),
            PublicKey::from(config.public),
            None,
            keepalive,
            index,
            Some(limiter),
        );
        Self {
            endpoint: AtomicCell::new(config.endpoint),
            configured: AtomicCell::new(config.endpoint),
            first_contact_over: AtomicBool::new(config.endpoint.is_none()),
            config,
            index,
            tunn: Mutex::new(tunn),
            counters: PeerCounters::default(),
            first_contact: Mutex::new(FirstContact::new(Instant::now())),
            silence: Silence::default(),
        }
    }

    /// Whether the first handshake's initiation is due again at `now`.
    pub fn first_contact_due(&self, now: Instant, connected: impl FnOnce() -> bool) -> bool {
        if self.first_contact_over() {
            return false;
        }
        let mut contact = self.first_contact.lock().unpoisoned();
        let due = contact.due(now, connected);
        if contact.is_over() {
            self.first_contact_over.store(true, Ordering::Relaxed);
        }
        due
    }

    /// Counts `datagram`, sent to the peer, if it is a handshake
    /// initiation; returns whether it was.
    pub fn count_sent(&self, datagram: &[u8]) -> bool {
        let initiation = datagram.first() == Some(&MESSAGE_HANDSHAKE_INITIATION);
        if initiation {
            self.counters.initiations.fetch_add(1, Ordering::Relaxed);
            self.silence.initiation_sent(clock_ns());
        }
        initiation
    }

    /// Whether the first handshake's quick retries have ended: it
    /// succeeded, or WireGuard's own retries took over.
    pub fn first_contact_over(&self) -> bool {
        self.first_contact_over.load(Ordering::Relaxed)
    }

    /// Where to send to the peer now; None until a peer we serve has made
    /// contact.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint.load()
    }

    /// Follows the peer to `addr`, the source of an authenticated packet.
    pub fn roam(&self, addr: SocketAddr) {
        if self.endpoint.load() != Some(addr) {
            self.endpoint.store(Some(addr));
        }
    }

    /// Moves the peer to a new configured endpoint, keeping its session;
    /// returns whether it changed. A new endpoint replaces wherever the
    /// peer roamed; none (we became its server) leaves it where it last
    /// made contact from.
    pub fn reconfigure(&self, addr: Option<SocketAddr>) -> bool {
        let moved = self.configured.swap(addr) != addr;
        if let (true, Some(addr)) = (moved, addr) {
            self.roam(addr);
        }
        moved
    }
}

/// An immutable snapshot of every peer, indexed for the datapath. A change
/// builds a new snapshot; packets in flight finish on the old one.
#[derive(Default)]
pub struct PeerSet {
    by_key: BTreeMap<ObjectKey, Arc<TunnelPeer>>,
    by_index: HashMap<u32, Arc<TunnelPeer>>,
    by_public: HashMap<[u8; 32], Arc<TunnelPeer>>,
    /// The peers' endpoint addresses, as of the snapshot.
    endpoints: HashSet<IpAddr>,
    /// The peers' networks, of both families.
    routes: Routes<Arc<TunnelPeer>>,
}

impl PeerSet {
    /// Indexes `peers`, routing each one's `networks`.
    pub fn new(peers: impl IntoIterator<Item = (Arc<TunnelPeer>, Vec<IpNet>)>) -> Self {
        let mut set = Self::default();
        let mut routes = Vec::new();
        for (peer, networks) in peers {
            routes.extend(networks.into_iter().map(|net| (net, peer.clone())));
            set.endpoints.extend(peer.endpoint().map(|e| e.ip()));
            set.by_index.insert(peer.index, peer.clone());
            set.by_public.insert(peer.config.public, peer.clone());
            set.by_key.insert(peer.config.key.clone(), peer);
        }
        set.routes = Routes::new(routes);
        set
    }

    /// Whether `addr` was a peer's endpoint address when the snapshot was
    /// taken.
    pub fn is_endpoint(&self, addr: IpAddr) -> bool {
        self.endpoints.contains(&addr)
    }

    /// The peer whose networks hold `addr`: where a packet to `addr` goes,
    /// and the only peer allowed to send from `addr`.
    pub fn route(&self, addr: IpAddr) -> Option<&Arc<TunnelPeer>> {
        self.routes.get(addr)
    }

    /// The peer a receiver index belongs to.
    pub fn by_receiver(&self, receiver_idx: u32) -> Option<&Arc<TunnelPeer>> {
        self.by_index.get(&(receiver_idx >> 8))
    }

    /// The peer with this static public key.
    pub fn by_public(&self, public: &[u8; 32]) -> Option<&Arc<TunnelPeer>> {
        self.by_public.get(public)
    }

    /// The peer of a TunnelEndpoint.
    pub fn by_key(&self, key: &ObjectKey) -> Option<&Arc<TunnelPeer>> {
        self.by_key.get(key)
    }

    /// Every peer.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<TunnelPeer>> {
        self.by_key.values()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A peer named `name`, with session index `index` and a public key of
    /// `public` bytes.
    pub(in crate::tunnel) fn peer(name: &str, index: u32, public: u8) -> Arc<TunnelPeer> {
        peer_at(
            name,
            index,
            public,
            Some("203.0.113.2:5871".parse().unwrap()),
        )
    }

    fn peer_at(
        name: &str,
        index: u32,
        public: u8,
        endpoint: Option<SocketAddr>,
    ) -> Arc<TunnelPeer> {
        let private = StaticSecret::from([7u8; 32]);
        let config = PeerConfig {
            key: ObjectKey {
                namespace: "liqo".into(),
                name: name.into(),
            },
            label: name.into(),
            cluster_name: name.into(),
            public: *PublicKey::from(&StaticSecret::from([public; 32])).as_bytes(),
            endpoint,
            networks: Vec::new(),
        };
        let limiter = Arc::new(RateLimiter::new(&PublicKey::from(&private), 10));
        Arc::new(TunnelPeer::new(config, index, &private, Some(10), limiter))
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn each_round_given_up_doubles_the_wait_up_to_five_minutes_and_a_session_ends_it() {
        let silence = Silence::default();
        assert!(!silence.quiet(|| unreachable!("a peer never silent reads no clock")));
        let s = |secs: u64| secs * 1_000_000_000;
        let waits: Vec<u64> = (0..8)
            .map(|_| silence.round_given_up(s(1000)).as_secs())
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(silence.spacing(), LONGEST_WAIT);
        // Each initiation of a silent peer's round holds the next.
        silence.initiation_sent(s(2000));
        assert!(silence.quiet(|| s(2299)) && !silence.quiet(|| s(2300)));
        silence.initiation_sent(s(1000));
        assert!(silence.is_silent());
        assert!(silence.quiet(|| s(1299)));
        assert!(!silence.quiet(|| s(1300)));
        silence.end();
        assert!(!silence.is_silent());
        assert_eq!(silence.spacing(), Duration::ZERO);
        // A peer that was never silent retries as WireGuard does.
        silence.initiation_sent(s(3000));
        assert!(!silence.quiet(|| s(3000)));
        assert!(!silence.quiet(|| 0));
        assert_eq!(silence.round_given_up(s(5)), FIRST_WAIT);
        // Rounds past any count keep the longest wait.
        for _ in 0..100 {
            silence.round_given_up(0);
        }
        assert_eq!(silence.round_given_up(0), LONGEST_WAIT);
    }

    #[test]
    fn routes_by_longest_prefix_and_finds_by_index_and_key() {
        let (b, c) = (peer("b", 1, 2), peer("c", 2, 3));
        let set = PeerSet::new([
            (b.clone(), vec![net("10.0.0.0/16"), net("10.9.0.0/24")]),
            (c.clone(), vec![net("10.0.7.0/24")]),
        ]);
        assert_eq!(set.route("10.0.7.9".parse().unwrap()).unwrap().index, 2);
        assert_eq!(set.route("10.0.8.9".parse().unwrap()).unwrap().index, 1);
        assert_eq!(set.route("10.9.0.1".parse().unwrap()).unwrap().index, 1);
        assert!(set.route("10.10.0.1".parse().unwrap()).is_none());
        let v6 = PeerSet::new([(b.clone(), vec![net("fd00:10::/64")])]);
        assert_eq!(v6.route("fd00:10::5".parse().unwrap()).unwrap().index, 1);
        assert!(v6.route("10.0.8.9".parse().unwrap()).is_none());
        // boringtun puts our index in the top 24 bits of the receiver index.
        assert_eq!(set.by_receiver((2 << 8) | 5).unwrap().index, 2);
        assert!(set.by_receiver(7 << 8).is_none());
        assert_eq!(set.by_public(&c.config.public).unwrap().index, 2);
    }

    #[test]
    fn endpoint_roams_and_only_a_new_configured_endpoint_moves_it_back() {
        let b = peer("b", 1, 2);
        let at = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        assert_eq!(b.endpoint(), at("203.0.113.2:5871"));
        b.roam("198.51.100.9:40000".parse().unwrap());
        assert_eq!(b.endpoint(), at("198.51.100.9:40000"));
        // The same configuration again leaves the roamed endpoint alone.
        assert!(!b.reconfigure(at("203.0.113.2:5871")));
        assert_eq!(b.endpoint(), at("198.51.100.9:40000"));
        assert!(b.reconfigure(at("203.0.113.7:5871")));
        assert_eq!(b.endpoint(), at("203.0.113.7:5871"));
        // Becoming its server leaves the peer where it last was.
        assert!(b.reconfigure(None));
        assert_eq!(b.endpoint(), at("203.0.113.7:5871"));
    }

    #[test]
    fn a_peer_we_serve_has_no_endpoint_and_no_first_contact_until_it_makes_contact() {
        let b = peer_at("b", 1, 2, None);
        assert_eq!(b.endpoint(), None);
        assert!(b.first_contact_over());
        assert!(!b.first_contact_due(Instant::now() + Duration::from_secs(1), || false));
        let set = PeerSet::new([(b.clone(), vec![net("10.0.0.0/16")])]);
        assert!(!set.is_endpoint(IpAddr::from([0, 0, 0, 0])));
        b.roam("198.51.100.9:40000".parse().unwrap());
        assert_eq!(b.endpoint(), Some("198.51.100.9:40000".parse().unwrap()));
        // The configuration again (still none) keeps where it made contact.
        assert!(!b.reconfigure(None));
        assert_eq!(b.endpoint(), Some("198.51.100.9:40000".parse().unwrap()));
    }

    #[test]
    fn the_first_initiation_is_retried_on_a_doubling_backoff_until_a_session_or_five_seconds() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut contact = FirstContact::new(start);
        let due: Vec<u64> = (0..=6000)
            .step_by(25)
            .filter(|ms| contact.due(at(*ms), || false))
            .collect();
        assert_eq!(due, [100, 300, 700, 1500, 3100]);
        // The last retry, past which WireGuard's own timers decide.
        assert!(!contact.is_over());
        assert!(contact.due(at(6300), || false));
        assert!(contact.is_over());
        let mut answered = FirstContact::new(start);
        assert!(answered.due(at(100), || false));
        assert!(
            !answered.due(at(300), || true),
            "a session ends the retries"
        );
        assert!(!answered.due(at(700), || false), "for good");
    }
}
