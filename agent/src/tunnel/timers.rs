//! The tunnel's timer thread: every peer's WireGuard timers (handshake
//! retries, rekeys, keepalives), the first handshake's quick retries, and
//! the jitter WireGuard adds to a retry that boringtun leaves out.

use std::{
    collections::HashMap,
    net::UdpSocket,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use boringtun::noise::{TunnResult, errors::WireGuardError};
use tracing::{info, warn};

use super::{
    Shared,
    peers::{PeerSet, REKEY_TIMEOUT, TunnelPeer, clock_ns, has_session},
};
use crate::sync::Unpoisoned;

/// How often WireGuard's timers run (boringtun's own device uses 250 ms).
const TICK: Duration = Duration::from_millis(250);
/// How often the first handshakes' retries, and held retries, are looked at.
const FINE_TICK: Duration = Duration::from_millis(25);
/// WireGuard's jitter on a retry: up to a third of a second past
/// Rekey-Timeout.
const MAX_JITTER_MS: u32 = 334;

/// Runs every peer's WireGuard timers and its first handshake's quick
/// retries, and resets the shared rate limiter and forgets idle sources'
/// buckets each second, until the tunnel stops.
pub fn run(shared: &Shared, udp: &UdpSocket) {
    let mut buf = vec![0u8; shared.max_sent()];
    let mut last_reset = Instant::now();
    let mut last_tick = Instant::now();
    let mut peers = shared.snapshot();
    let mut contacting = first_contacts(&peers);
    let mut retries = Retries::default();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(FINE_TICK);
        let now = Instant::now();
        if now - last_reset >= Duration::from_secs(1) {
            shared.limiter.reset_count();
            shared.throttle.forget_idle(now);
            last_reset = now;
        }
        let latest = shared.snapshot();
        if !Arc::ptr_eq(&latest, &peers) {
            contacting = first_contacts(&latest);
            retries.keep_only(&latest);
            peers = latest;
        }
        for peer in retries.due(now) {
            run_timers(&peer, udp, &mut buf, &mut retries, now);
        }
        if now - last_tick >= TICK {
            last_tick = now;
            for peer in peers.iter() {
                run_timers(peer, udp, &mut buf, &mut retries, now);
            }
        }
        contacting.retain(|peer| retry_first_contact(peer, udp, &mut buf, now));
    }
}

/// The peers still in their first handshake's quick retries: walking only
/// these every few milliseconds, not every peer, keeps a gateway with
/// thousands of settled sessions idle.
fn first_contacts(peers: &PeerSet) -> Vec<Arc<TunnelPeer>> {
    peers
        .iter()
        .filter(|peer| !peer.first_contact_over())
        .cloned()
        .collect()
}

/// WireGuard's timers of `peer`: keepalives, rekeys, expiry. A peer with
/// no session whose retry `retries` holds back, or whose silence does, is
/// passed by.
pub(super) fn run_timers(
    peer: &Arc<TunnelPeer>,
    udp: &UdpSocket,
    buf: &mut [u8],
    retries: &mut Retries,
    now: Instant,
) {
    let endpoint = peer.endpoint();
    let mut tunn = peer.tunn.lock().unpoisoned();
    let waits = retries.holds(peer) || peer.silence.quiet(clock_ns);
    if waits && !has_session(&tunn) {
        return;
    }
    let result = tunn.update_timers(buf);
    let expired = matches!(result, TunnResult::Err(WireGuardError::ConnectionExpired));
    let counters = &peer.counters;
    if expired && !counters.expired.swap(true, Ordering::Relaxed) {
        counters.handshake_failures.fetch_add(1, Ordering::Relaxed);
        let first = !peer.silence.is_silent();
        let wait = peer.silence.round_given_up(clock_ns());
        if first {
            warn!(
                peer = %peer.config.label, endpoint = ?endpoint, next_round_in = ?wait,
                "no handshake with the peer answered for 90 s (WireGuard's Rekey-Attempt-Time): data starts the next round after a wait that doubles each round, up to 5 min; said again only after a session"
            );
        }
    } else if !expired {
        counters.expired.store(false, Ordering::Relaxed);
    }
    if peer.silence.is_silent() && has_session(&tunn) {
        peer.silence.end();
        info!(peer = %peer.config.label, "a session with the peer is up after its silence");
    }
    // A peer we serve that has not made contact yet gets nothing: the
    // handshakes are its to start.
    if let (TunnResult::WriteToNetwork(datagram), Some(endpoint)) = (result, endpoint) {
        if peer.count_sent(datagram) && !has_session(&tunn) {
            retries.hold(peer, now, jitter());
        }
        let _ = udp.send_to(datagram, endpoint);
    }
}

/// Sends `peer`'s first initiation again if its backoff says so; returns
/// whether more retries may follow. The session's lock, which the datapath
/// takes for every packet, is taken only when a retry is due.
pub(super) fn retry_first_contact(
    peer: &TunnelPeer,
    udp: &UdpSocket,
    buf: &mut [u8],
    now: Instant,
) -> bool {
    let lock = || peer.tunn.lock().unpoisoned();
    if let Some(endpoint) = peer.endpoint()
        && peer.first_contact_due(now, || has_session(&lock()))
        && let TunnResult::WriteToNetwork(init) = lock().format_handshake_initiation(buf, true)
    {
        peer.count_sent(init);
        let _ = udp.send_to(init, endpoint);
    }
    !peer.first_contact_over()
}

/// A random delay between none and [`MAX_JITTER_MS`].
fn jitter() -> Duration {
    Duration::from_millis(u64::from(getrandom::u32().unwrap_or(0) % MAX_JITTER_MS))
}

/// The retries of unanswered initiations, each held back until
/// Rekey-Timeout plus a jitter has passed, as WireGuard prescribes.
/// boringtun retries on the first timer tick past Rekey-Timeout, with no
/// jitter: peers configured together, or cut off together, would retry
/// together for as long as they stay silent.
#[derive(Default)]
pub(super) struct Retries {
    held: HashMap<u32, (Instant, Arc<TunnelPeer>)>,
}

impl Retries {
    /// Holds `peer`'s timers back until Rekey-Timeout plus `jitter` after
    /// `now`, when it retries.
    fn hold(&mut self, peer: &Arc<TunnelPeer>, now: Instant, jitter: Duration) {
        self.held
            .insert(peer.index, (now + REKEY_TIMEOUT + jitter, peer.clone()));
    }

    /// Whether `peer`'s timers are held back.
    fn holds(&self, peer: &Arc<TunnelPeer>) -> bool {
        self.held
            .get(&peer.index)
            .is_some_and(|(_, held)| Arc::ptr_eq(held, peer))
    }

    /// The held peers whose retry is due at `now`, released.
    fn due(&mut self, now: Instant) -> Vec<Arc<TunnelPeer>> {
        let mut due = Vec::new();
        self.held.retain(|_, (at, peer)| {
            let keep = *at > now;
            if !keep {
                due.push(peer.clone());
            }
            keep
        });
        due
    }

    /// Forgets the peers that left `peers`, or were replaced in it.
    fn keep_only(&mut self, peers: &PeerSet) {
        self.held.retain(|index, (_, peer)| {
            peers
                .by_receiver(index << 8)
                .is_some_and(|current| Arc::ptr_eq(current, peer))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::peers::tests::peer;

    #[test]
    fn a_held_retry_is_released_once_rekey_timeout_and_its_jitter_have_passed() {
        let (a, b) = (peer("a", 1, 1), peer("b", 2, 2));
        let mut retries = Retries::default();
        let t0 = Instant::now();
        retries.hold(&a, t0, Duration::from_millis(300));
        retries.hold(&b, t0, Duration::ZERO);
        assert!(retries.holds(&a) && retries.holds(&b));
        assert!(retries.due(t0 + Duration::from_millis(4999)).is_empty());
        let due = retries.due(t0 + REKEY_TIMEOUT);
        assert_eq!(due.len(), 1);
        assert!(Arc::ptr_eq(&due[0], &b));
        assert!(!retries.holds(&b) && retries.holds(&a));
        assert!(retries.due(t0 + Duration::from_millis(5299)).is_empty());
        assert_eq!(retries.due(t0 + Duration::from_millis(5300)).len(), 1);
        assert!(!retries.holds(&a));
    }

    #[test]
    fn a_peer_that_left_or_was_replaced_is_forgotten() {
        let (a, b) = (peer("a", 1, 1), peer("b", 2, 2));
        let mut retries = Retries::default();
        let t0 = Instant::now();
        retries.hold(&a, t0, Duration::ZERO);
        retries.hold(&b, t0, Duration::ZERO);
        // `b` is replaced by a new state machine under the same index.
        let b_again = peer("b", 2, 2);
        retries.keep_only(&PeerSet::new([(b_again.clone(), vec![])]));
        assert!(!retries.holds(&a) && !retries.holds(&b) && !retries.holds(&b_again));
        assert!(retries.due(t0 + Duration::from_mins(1)).is_empty());
    }

    #[test]
    fn jitter_stays_within_a_third_of_a_second_and_varies() {
        let draws: Vec<Duration> = (0..200).map(|_| jitter()).collect();
        assert!(draws.iter().all(|j| *j < Duration::from_millis(334)));
        let first = draws[0];
        assert!(draws.iter().any(|j| *j != first), "no jitter at all");
    }
}
