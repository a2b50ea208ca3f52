//! Diffie-Hellman work per source address.
//!
//! Under load, WireGuard's cookies make a source prove its address before
//! its handshake initiations are opened. But a source that proved it (one
//! host of a stranger's, or a peer's compromised gateway) may go on sending
//! valid initiations as fast as it can, each costing the gateway X25519
//! operations on the one thread that takes them. Each source address gets
//! a bucket instead, as the kernel module's ratelimiter gives one: a burst
//! of [`BURST`] initiations, refilled at [`PER_SECOND`]. A flood from one
//! address then costs the gateway at most that, and other sources keep
//! theirs.
//!
//! The table is bounded ([`MAX_SOURCES`]); sources idle past a second are
//! forgotten by [`SourceThrottle::forget_idle`], which the tunnel's timer
//! thread calls every second. A new source finds no room only while the
//! table holds that many sources active within the last second: the shared
//! rate limiter answers with cookies long before that, so those are
//! addresses that answered a cookie.
//!
//! An IPv6 source counts by its /64 ([`party`]): one host is given a
//! whole /64, and would otherwise have a bucket per address it picks.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::sync::Unpoisoned;

/// Initiations a second a source may have opened, sustained.
pub const PER_SECOND: u32 = 20;
/// Initiations a source may have opened at once.
pub const BURST: u32 = 5;
/// Sources followed at once.
pub const MAX_SOURCES: usize = 8192;

/// The time one initiation costs a source's bucket.
const COST: Duration = Duration::from_nanos(1_000_000_000 / PER_SECOND as u64);
/// A full bucket.
const FULL: Duration = Duration::from_nanos(COST.as_nanos() as u64 * BURST as u64);
/// A source this long idle is forgotten.
const IDLE: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Time banked, spent [`COST`] an initiation, up to [`FULL`].
    tokens: Duration,
    /// When the bucket was last filled.
    last: Instant,
}

/// The buckets of the sources seen lately.
#[derive(Debug, Default)]
pub struct SourceThrottle {
    sources: Mutex<HashMap<IpAddr, Bucket>>,
}

impl SourceThrottle {
    /// Whether an initiation from `source` may be opened at `now`; it is
    /// counted if so.
    pub fn allow(&self, source: IpAddr, now: Instant) -> bool {
        let source = party(source);
        let mut sources = self.sources.lock().unpoisoned();
        if !sources.contains_key(&source) && sources.len() >= MAX_SOURCES {
            return false;
        }
        let bucket = sources.entry(source).or_insert(Bucket {
            tokens: FULL,
            last: now,
        });
        let refilled = bucket.tokens + now.saturating_duration_since(bucket.last);
        bucket.tokens = refilled.min(FULL);
        bucket.last = now;
        match bucket.tokens.checked_sub(COST) {
            Some(left) => {
                bucket.tokens = left;
                true
            }
            None => false,
        }
    }

    /// Forgets the sources idle for a second at `now`: their buckets
    /// would be full again, as a new source's is.
    pub fn forget_idle(&self, now: Instant) {
        let mut sources = self.sources.lock().unpoisoned();
        sources.retain(|_, bucket| now.saturating_duration_since(bucket.last) < IDLE);
    }

    /// Sources followed now.
    pub fn len(&self) -> usize {
        self.sources.lock().unpoisoned().len()
    }

    /// Whether no source is followed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Who sent from `addr`, as the throttle and the handshake queue count
/// sources: an IPv4 address, or an IPv6 address's /64.
pub fn party(addr: IpAddr) -> IpAddr {
    match addr.to_canonical() {
        IpAddr::V6(addr) => {
            let prefix = u128::from(addr) & !u128::from(u64::MAX);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        ipv4 @ IpAddr::V4(_) => ipv4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::Ipv4Addr;

    const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));
    const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 2));

    fn v4(bits: u32) -> IpAddr {
        Ipv4Addr::from(bits).into()
    }

    #[test]
    fn a_flooding_source_gets_its_burst_then_its_rate_and_no_more() {
        let throttle = SourceThrottle::default();
        let t0 = Instant::now();
        let allowed = (0..1000).filter(|_| throttle.allow(FLOODER, t0)).count();
        assert_eq!(allowed, BURST as usize);
        // Over the next second, sending every millisecond: 20 more.
        let allowed = (1..=1000)
            .filter(|ms| throttle.allow(FLOODER, t0 + Duration::from_millis(*ms)))
            .count();
        assert_eq!(allowed, PER_SECOND as usize);
        // Another source is untouched by the flood.
        let later = t0 + Duration::from_secs(1);
        assert!((0..BURST).all(|_| throttle.allow(PEER, later)));
    }

    #[test]
    fn the_table_is_bounded_and_idle_sources_are_forgotten() {
        let throttle = SourceThrottle::default();
        let t0 = Instant::now();
        for i in 0..MAX_SOURCES as u32 {
            assert!(throttle.allow(v4(0x0a00_0000 + i), t0));
        }
        assert!(!throttle.allow(PEER, t0), "a source past the bound");
        // A source already followed keeps its bucket.
        assert!(throttle.allow(v4(0x0a00_0000), t0));
        throttle.forget_idle(t0 + Duration::from_millis(999));
        assert_eq!(throttle.len(), MAX_SOURCES);
        throttle.forget_idle(t0 + IDLE);
        assert!(throttle.is_empty());
        assert!(throttle.allow(PEER, t0 + IDLE));
    }

    #[test]
    fn an_ipv6_flooder_shares_one_bucket_across_its_slash_64() {
        let throttle = SourceThrottle::default();
        let t0 = Instant::now();
        let host = |i: u32| IpAddr::V6(format!("2001:db8:7:7::{i:x}").parse().unwrap());
        let allowed = (1..1000).filter(|i| throttle.allow(host(*i), t0)).count();
        assert_eq!(allowed, BURST as usize, "one bucket for every address");
        assert_eq!(throttle.len(), 1);
        let neighbour: IpAddr = "2001:db8:7:8::1".parse().unwrap();
        assert!(throttle.allow(neighbour, t0), "the next /64 has its own");
        let mapped: IpAddr = "::ffff:198.51.100.7".parse().unwrap();
        assert_eq!(party(mapped), FLOODER);
    }
}
