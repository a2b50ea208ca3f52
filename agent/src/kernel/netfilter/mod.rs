//! What the node's netfilter could do to the packets it forwards, for each
//! family: the chains of every hook such a packet crosses (prerouting,
//! forward, postrouting and ingress), in nftables (native, and
//! iptables-nft's) and in iptables-legacy's and ip6tables-legacy's tables,
//! and a proof of what their rules do ([`rules`]).
//!
//! `--forward-past-netfilter=auto` reads this to decide whether packets the
//! FIB settles in one step may skip the stack: only those that no rule
//! could act on (see [`Hooks`]).

mod legacy;
mod nftables;
pub mod rules;

use std::{fmt, io, thread, time::Duration};

use ipnet::IpNet;
use tokio::sync::watch;
use tracing::warn;

use isthmus_common::names::MAX_STACK_DESTINATIONS;
use rules::{Acting, Chain, IpFamily};

/// What the node's hooks could do to a forwarded packet of each family, as
/// last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeHooks {
    /// To an IPv4 packet.
    pub ipv4: Hooks,
    /// To an IPv6 packet.
    pub ipv6: Hooks,
}

impl NodeHooks {
    /// What they could do to `family`'s packets.
    pub fn of(&self, family: IpFamily) -> &Hooks {
        match family {
            IpFamily::Ipv4 => &self.ipv4,
            IpFamily::Ipv6 => &self.ipv6,
        }
    }

    /// Both families' proofs over `chains`.
    fn proved(chains: &[Chain]) -> Self {
        Self {
            ipv4: Hooks::of(chains, IpFamily::Ipv4),
            ipv6: Hooks::of(chains, IpFamily::Ipv6),
        }
    }

    /// Both, as hooks that could not be read, for `why`.
    fn unknown(why: &str) -> Self {
        Self {
            ipv4: Hooks::Unknown(why.into()),
            ipv6: Hooks::Unknown(why.into()),
        }
    }
}

impl fmt::Display for NodeHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IPv4: {}; IPv6: {}", self.ipv4, self.ipv6)
    }
}

/// What the node's hooks could do to a forwarded packet of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hooks {
    /// No rule acts on forwarded packets, but on those to these
    /// destinations, which take the stack.
    Clear {
        /// Where rules act: kube-proxy's Services' addresses, for one.
        stack_destinations: Vec<IpNet>,
    },
    /// These could act on any forwarded packet.
    Acting(Vec<Acting>),
    /// The hooks could not be read; they are treated as acting.
    Unknown(String),
}

impl Hooks {
    /// Whether packets may skip netfilter, but to
    /// [`Hooks::stack_destinations`].
    pub fn clear(&self) -> bool {
        matches!(self, Hooks::Clear { .. })
    }

    /// The destinations whose packets take the stack while the rest skip it.
    pub fn stack_destinations(&self) -> &[IpNet] {
        match self {
            Hooks::Clear { stack_destinations } => stack_destinations,
            _ => &[],
        }
    }

    fn of(chains: &[Chain], family: IpFamily) -> Self {
        let proof = rules::prove(chains, family);
        if !proof.acting.is_empty() {
            return Hooks::Acting(proof.acting);
        }
        if proof.stack_destinations.len() > MAX_STACK_DESTINATIONS as usize {
            return Hooks::Unknown(format!(
                "rules act on {} destinations, more than the {MAX_STACK_DESTINATIONS} that can \
                 be sent through the stack",
                proof.stack_destinations.len()
            ));
        }
        Hooks::Clear {
            stack_destinations: proof.stack_destinations,
        }
    }
}

impl fmt::Display for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hooks::Clear { stack_destinations } if stack_destinations.is_empty() => {
                write!(f, "no rule acts on forwarded packets")
            }
            Hooks::Clear { stack_destinations } => write!(
                f,
                "rules act on forwarded packets only to {} destination(s), which take the stack",
                stack_destinations.len()
            ),
            Hooks::Acting(acting) => {
                let listed: Vec<String> = acting.iter().map(ToString::to_string).collect();
                write!(f, "{}", listed.join("; "))
            }
            Hooks::Unknown(why) => write!(f, "the hooks could not be proved harmless: {why}"),
        }
    }
}

/// Reads the hooks of the calling thread's network namespace. nftables'
/// rules are read again, and the proofs made again, only when nftables'
/// generation or the legacy tables' chains moved: a node with kube-proxy's
/// rules for thousands of Services holds tens of thousands of rules.
#[derive(Default)]
pub struct Reader {
    /// nftables' generation, with its chains.
    nftables: Option<(u32, Vec<Chain>)>,
    /// The last proofs, with the legacy tables' chains they were made of.
    last: Option<(Vec<Chain>, NodeHooks)>,
}

impl Reader {
    /// What the hooks could do now.
    pub fn read(&mut self) -> NodeHooks {
        match self.refresh() {
            Ok(hooks) => hooks,
            Err(e) => {
                self.last = None;
                NodeHooks::unknown(&e.to_string())
            }
        }
    }

    fn refresh(&mut self) -> io::Result<NodeHooks> {
        let generation = nftables::generation()?;
        let legacy = legacy::chains()?;
        let unchanged_nftables = matches!(
            (generation, &self.nftables),
            (Some(now), Some((held, _))) if now == *held
        );
        if unchanged_nftables
            && let Some((held, hooks)) = &self.last
            && *held == legacy
        {
            return Ok(hooks.clone());
        }
        let mut chains = match &self.nftables {
            Some((_, chains)) if unchanged_nftables => chains.clone(),
            _ => {
                // A change between the two reads shows at the next.
                let chains = nftables::chains()?;
                self.nftables = generation.map(|generation| (generation, chains.clone()));
                chains
            }
        };
        chains.extend(legacy.iter().cloned());
        let hooks = NodeHooks::proved(&chains);
        self.last = Some((legacy, hooks.clone()));
        Ok(hooks)
    }
}

/// How often the hooks are read again: a rule added by hand or by a CNI
/// applies to forwarded packets at most this long after it appears.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Follows the hooks from a thread of its own, publishing each change; the
/// first value is read before this returns. The thread ends when every
/// receiver is gone.
pub fn watch_hooks() -> watch::Receiver<NodeHooks> {
    let mut reader = Reader::default();
    let (tx, rx) = watch::channel(reader.read());
    let spawned = thread::Builder::new()
        .name("netfilter-watch".into())
        .spawn(move || {
            while !tx.is_closed() {
                thread::sleep(POLL_INTERVAL);
                let now = reader.read();
                tx.send_if_modified(|held| {
                    let changed = *held != now;
                    *held = now;
                    changed
                });
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "starting the netfilter watch; the hooks are read once only");
    }
    rx
}
