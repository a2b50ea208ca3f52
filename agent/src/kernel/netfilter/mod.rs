//! What the node's netfilter could do to the IPv4 packets it forwards: the
//! base chains at its forward hook that hold a rule or drop by default, in
//! nftables (native, and iptables-nft's) and in iptables-legacy's tables.
//!
//! `--forward-past-netfilter=auto` reads this to decide whether packets the
//! FIB settles in one step may skip the stack: only while nothing here could
//! enforce a policy on them (see [`ForwardHooks`]).

mod legacy;
mod nftables;

use std::{fmt, io, thread, time::Duration};

use tokio::sync::watch;
use tracing::warn;

/// A base chain at the IPv4 forward hook that could act on a forwarded
/// packet: it holds rules, or its policy drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardFilter {
    /// `nftables` (native or iptables-nft) or `iptables-legacy`.
    pub backend: &'static str,
    /// The table, with its family for nftables (`ip filter`, `inet fw`).
    pub table: String,
    /// The chain's name.
    pub chain: String,
    /// Rules in the chain.
    pub rules: usize,
    /// Whether the chain's policy drops what no rule accepted.
    pub drops: bool,
}

impl fmt::Display for ForwardFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = if self.drops { "drop" } else { "accept" };
        write!(
            f,
            "{} table {} chain {}: {} rule(s), policy {policy}",
            self.backend, self.table, self.chain, self.rules
        )
    }
}

impl ForwardFilter {
    /// Whether the chain could change a forwarded packet's fate.
    fn acts(&self) -> bool {
        self.rules > 0 || self.drops
    }
}

/// What the node's forward hook holds, as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForwardHooks {
    /// No base chain at the forward hook holds a rule or drops.
    Clear,
    /// These chains could act on forwarded packets.
    Filtered(Vec<ForwardFilter>),
    /// The hook could not be read; it is treated as filtered.
    Unknown(String),
}

impl ForwardHooks {
    /// Reads the forward hook of the calling thread's network namespace.
    pub fn read() -> Self {
        match forward_filters() {
            Ok(filters) if filters.is_empty() => ForwardHooks::Clear,
            Ok(filters) => ForwardHooks::Filtered(filters),
            Err(e) => ForwardHooks::Unknown(e.to_string()),
        }
    }

    /// Whether packets may skip netfilter without skipping a filter.
    pub fn clear(&self) -> bool {
        *self == ForwardHooks::Clear
    }
}

impl fmt::Display for ForwardHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardHooks::Clear => write!(f, "no forward-hook chain holds a rule or drops"),
            ForwardHooks::Filtered(filters) => {
                let listed: Vec<String> = filters.iter().map(ToString::to_string).collect();
                write!(f, "{}", listed.join("; "))
            }
            ForwardHooks::Unknown(why) => write!(f, "the forward hook could not be read: {why}"),
        }
    }
}

/// Every base chain at the IPv4 forward hook that could act on a packet.
pub fn forward_filters() -> io::Result<Vec<ForwardFilter>> {
    let mut filters = nftables::forward_chains()?;
    filters.extend(legacy::forward_chains()?);
    filters.retain(ForwardFilter::acts);
    Ok(filters)
}

/// How often the forward hook is read again: a rule added by hand or by a
/// CNI applies to forwarded packets at most this long after it appears.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Follows the forward hook from a thread of its own, publishing each
/// change; the first value is read before this returns. The thread ends
/// when every receiver is gone.
pub fn watch_forward_hooks() -> watch::Receiver<ForwardHooks> {
    let (tx, rx) = watch::channel(ForwardHooks::read());
    let spawned = thread::Builder::new()
        .name("netfilter-watch".into())
        .spawn(move || {
            while !tx.is_closed() {
                thread::sleep(POLL_INTERVAL);
                let now = ForwardHooks::read();
                tx.send_if_modified(|held| {
                    let changed = *held != now;
                    *held = now;
                    changed
                });
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "starting the netfilter watch; the forward hook is read once only");
    }
    rx
}
