//! Where a peer's gateway is. Liqo copies a LoadBalancer's host name into
//! `endpointIP` when the LoadBalancer has no address (an AWS ELB), so a
//! name is resolved through the system resolver, again every
//! [`DEFAULT_EVERY`], and at once when the peer's handshakes fail: a
//! LoadBalancer that moved is found without waiting.
//!
//! The bookkeeping is apart from the lookups, so it is tested without DNS.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

/// How often a name is looked up again by default.
pub const DEFAULT_EVERY: Duration = Duration::from_mins(1);
/// Longest a lookup may take before it counts as failed.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// A failed lookup is tried again this soon, whatever the interval.
const RETRY_FAILED: Duration = Duration::from_secs(5);

/// The last lookup of one name.
#[derive(Clone, Debug)]
struct Resolution {
    result: Result<IpAddr, String>,
    at: Instant,
    /// The peer's handshake failures when it was made.
    failures: u64,
}

/// The addresses of the names peers' `endpointIP` holds.
#[derive(Debug)]
pub struct Resolver {
    every: Duration,
    names: BTreeMap<String, Resolution>,
}

impl Resolver {
    /// A resolver that looks names up again every `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            names: BTreeMap::new(),
        }
    }

    /// Whether `name` must be looked up now: never looked up, looked up
    /// `every` ago (a failure sooner), or its peer's handshakes failed since.
    pub fn due(&self, name: &str, failures: u64, now: Instant) -> bool {
        self.names.get(name).is_none_or(|r| {
            let every = if r.result.is_ok() {
                self.every
            } else {
                RETRY_FAILED.min(self.every)
            };
            now.duration_since(r.at) >= every || failures > r.failures
        })
    }

    /// Records a lookup of `name`, made when the peer had `failures`.
    pub fn record(
        &mut self,
        name: &str,
        result: Result<IpAddr, String>,
        failures: u64,
        now: Instant,
    ) {
        self.names.insert(
            name.to_owned(),
            Resolution {
                result,
                at: now,
                failures,
            },
        );
    }

    /// The last answer for `name`: its address, or why there is none.
    pub fn address(&self, name: &str) -> Result<IpAddr, String> {
        self.names
            .get(name)
            .map_or_else(|| Err("not resolved yet".to_owned()), |r| r.result.clone())
    }

    /// Forgets every name not in `names`.
    pub fn retain(&mut self, names: &[&str]) {
        self.names.retain(|name, _| names.contains(&name.as_str()));
    }
}

/// The first IPv4 address of `name`, through the system resolver
/// (`/etc/hosts`, DNS, as `getaddrinfo` is configured).
pub async fn lookup(name: &str) -> Result<IpAddr, String> {
    let query = tokio::net::lookup_host((name, 0));
    match tokio::time::timeout(LOOKUP_TIMEOUT, query).await {
        Err(_) => Err(format!("no answer within {LOOKUP_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(addrs)) => {
            let addrs: Vec<IpAddr> = addrs.map(|a| a.ip().to_canonical()).collect();
            (addrs.iter().find(|a| a.is_ipv4()).or_else(|| addrs.first()))
                .copied()
                .ok_or_else(|| "no address".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn a_name_is_looked_up_again_on_the_interval_sooner_after_a_failure_and_after_failed_handshakes()
     {
        let mut r = Resolver::new(Duration::from_mins(1));
        let t0 = Instant::now();
        let name = "gw.example";
        assert!(r.due(name, 0, t0));
        assert_eq!(r.address(name), Err("not resolved yet".into()));
        r.record(name, Ok(Ipv4Addr::new(203, 0, 113, 2).into()), 0, t0);
        assert_eq!(r.address(name), Ok(Ipv4Addr::new(203, 0, 113, 2).into()));
        assert!(!r.due(name, 0, t0 + Duration::from_secs(59)));
        assert!(r.due(name, 0, t0 + Duration::from_mins(1)));
        // A failed handshake since the lookup: the LoadBalancer may have moved.
        assert!(r.due(name, 1, t0 + Duration::from_secs(1)));
        r.record(name, Err("NXDOMAIN".into()), 1, t0);
        assert!(!r.due(name, 1, t0 + Duration::from_secs(4)));
        assert!(r.due(name, 1, t0 + Duration::from_secs(5)));
        r.retain(&[]);
        assert!(r.due(name, 1, t0));
    }

    #[tokio::test]
    async fn the_system_resolver_answers_for_localhost_and_fails_cleanly_for_an_unknown_name() {
        assert_eq!(lookup("localhost").await, Ok(Ipv4Addr::LOCALHOST.into()));
        assert_eq!(
            lookup("::1").await,
            Ok(std::net::Ipv6Addr::LOCALHOST.into())
        );
        // `.invalid` never resolves (RFC 2606).
        assert!(lookup("isthmus-test.invalid").await.is_err());
    }
}
