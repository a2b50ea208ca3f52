//! What a node's netfilter rules could do to a packet the overlay would
//! forward past them, proved rule by rule.
//!
//! The packets in question are of one family, forwarded (never for this
//! host), carry no mark, and may be anything else. Each family has a proof
//! of its own, over the chains its packets cross. Walking every chain the
//! kernel runs for them, in order, a rule:
//! - never matches them: it tests the mark for a bit they lack, or asks for
//!   a local destination;
//! - matches only packets to one prefix: those take the stack (the prefix
//!   joins [`Proof::stack_destinations`]), and the rest cannot meet it;
//!   a test of the other family's destination reads other bytes of these
//!   packets, and may match them;
//! - or may match them. Then it must be inert: no side effect, and a
//!   verdict that lets them through (accept, return, continue, or a jump
//!   into a chain that is itself inert), or a drop of what conntrack calls
//!   invalid, which exists to catch packets whose netfilter NAT conntrack
//!   could not undo, and packets past netfilter have none.
//!
//! Anything else acts on the packets, and the node forwards through its
//! stack. A chain with a dropping policy acts too.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use ipnet::IpNet;

/// How deep jumps are followed; the kernel's own limit is 16.
const MAX_JUMP_DEPTH: usize = 16;

/// An address family, whose forwarded packets one proof is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl IpFamily {
    /// Both, in the order the proofs are made.
    pub const BOTH: [IpFamily; 2] = [IpFamily::Ipv4, IpFamily::Ipv6];

    /// Whether `net` is of this family.
    fn holds(self, net: IpNet) -> bool {
        matches!(
            (self, net),
            (IpFamily::Ipv4, IpNet::V4(_)) | (IpFamily::Ipv6, IpNet::V6(_))
        )
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::Ipv4 => "IPv4",
            IpFamily::Ipv6 => "IPv6",
        })
    }
}

/// A chain, with the rules it holds in their order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// Where the chain lives, for messages: `nftables ip filter`.
    pub table: String,
    /// The family whose packets it sees; None for both (nftables' `inet`
    /// and `netdev` tables).
    pub family: Option<IpFamily>,
    /// The chain's name.
    pub name: String,
    /// Whether the kernel runs it for forwarded packets from a hook (a base
    /// chain at prerouting, forward, postrouting or ingress), rather than
    /// only by jumps.
    pub hooked: bool,
    /// Whether its policy drops what no rule accepted (base chains only).
    pub drops: bool,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
}

/// One rule, reduced to what decides its effect on the packets in question.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    /// The kernel's handle of the rule, or its position.
    pub handle: u64,
    /// What a packet must satisfy, all of it, for the rule to apply.
    pub conditions: Vec<Condition>,
    /// What the rule does besides its verdict (a target, a NAT, a mark set,
    /// a log line), by name; any makes the rule act.
    pub effects: Vec<String>,
    /// Where the packet goes next.
    pub verdict: Verdict,
}

/// A test of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The destination, read where this network's family holds it, lies
    /// in it.
    DestinationIn(IpNet),
    /// The destination is one of this host's addresses.
    DestinationLocal,
    /// `(mark & mask) == value`, or `!=` when `negated`.
    Mark {
        /// Bits of the mark compared.
        mask: u32,
        /// What they are compared with.
        value: u32,
        /// Whether the comparison is inequality.
        negated: bool,
    },
    /// Conntrack's state is invalid, and nothing else is asked of it.
    ConntrackInvalid,
    /// The packet is of a family this says: IPv4, IPv6, either, or
    /// neither (ARP, say).
    FamilyIn {
        /// Whether IPv4 packets satisfy it.
        ipv4: bool,
        /// Whether IPv6 packets satisfy it.
        ipv6: bool,
    },
    /// Anything else that only reads the packet or its state.
    Other,
}

/// A rule's verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Verdict {
    /// On to the next rule.
    #[default]
    Continue,
    /// Out of this hook's chain, let through.
    Accept,
    /// Dropped.
    Drop,
    /// Back to the calling chain.
    Return,
    /// Into a chain, then back.
    Jump(String),
    /// Into a chain, not back.
    Goto(String),
    /// Queued, or decided by a map: nothing proves it harmless.
    Other(String),
}

/// What a condition says about the packets in question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applies {
    Never,
    Only(IpNet),
    Maybe,
    Always,
}

impl Condition {
    fn applies(&self, family: IpFamily) -> Applies {
        match *self {
            // Those bytes of the other family's header are something else.
            Condition::DestinationIn(net) if !family.holds(net) => Applies::Maybe,
            Condition::DestinationIn(net) if net.prefix_len() == 0 => Applies::Always,
            Condition::DestinationIn(net) => Applies::Only(net),
            // Such packets are forwarded only where the FIB sends them on.
            Condition::DestinationLocal => Applies::Never,
            Condition::FamilyIn { ipv4, ipv6 } => match family {
                IpFamily::Ipv4 if ipv4 => Applies::Always,
                IpFamily::Ipv6 if ipv6 => Applies::Always,
                _ => Applies::Never,
            },
            // Their mark is zero.
            Condition::Mark { value, negated, .. } => match (value == 0) != negated {
                true => Applies::Always,
                false => Applies::Never,
            },
            Condition::ConntrackInvalid | Condition::Other => Applies::Maybe,
        }
    }
}

impl Rule {
    /// What all the rule's conditions together say of `family`'s packets.
    fn applies(&self, family: IpFamily) -> Applies {
        let each: Vec<Applies> = self.conditions.iter().map(|c| c.applies(family)).collect();
        if each.contains(&Applies::Never) {
            return Applies::Never;
        }
        if let Some(only) = each.iter().find(|a| matches!(a, Applies::Only(_))) {
            return *only;
        }
        match each.contains(&Applies::Maybe) {
            true => Applies::Maybe,
            false => Applies::Always,
        }
    }

    /// A drop only of what conntrack calls invalid.
    fn drops_only_invalid(&self) -> bool {
        self.verdict == Verdict::Drop
            && self.effects.is_empty()
            && self.conditions.contains(&Condition::ConntrackInvalid)
    }
}

/// A rule or chain that could act on the packets in question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acting {
    /// The table and chain.
    pub place: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for Acting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.why)
    }
}

/// The outcome of a walk of every hooked chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Proof {
    /// Destinations whose packets must take the stack, where rules act on
    /// them.
    pub stack_destinations: Vec<IpNet>,
    /// What could act on every packet; empty when the proof holds.
    pub acting: Vec<Acting>,
}

/// Walks every hooked chain of `chains` that sees `family`'s packets, for
/// the packets in question.
pub fn prove(chains: &[Chain], family: IpFamily) -> Proof {
    let by_name: BTreeMap<(&str, &str), &Chain> = chains
        .iter()
        .map(|c| ((c.table.as_str(), c.name.as_str()), c))
        .collect();
    let mut walk = Walk::new(&by_name, family);
    let seen = |c: &&Chain| c.hooked && c.family.is_none_or(|f| f == family);
    for chain in chains.iter().filter(seen) {
        if chain.drops {
            walk.acts(chain, "its policy drops".into());
        }
        walk.chain(chain, 0);
    }
    let mut proof = walk.proof;
    proof.stack_destinations = IpNet::aggregate(&proof.stack_destinations);
    proof
}

type Chains<'a> = BTreeMap<(&'a str, &'a str), &'a Chain>;

struct Walk<'a> {
    chains: &'a Chains<'a>,
    family: IpFamily,
    /// Chains already walked: what they hold is in the proof once, and a
    /// node with many jumps into one chain costs one walk of it.
    walked: BTreeSet<(&'a str, &'a str)>,
    proof: Proof,
}

impl<'a> Walk<'a> {
    fn new(chains: &'a Chains<'a>, family: IpFamily) -> Self {
        Self {
            chains,
            family,
            walked: BTreeSet::new(),
            proof: Proof::default(),
        }
    }

    fn acts(&mut self, chain: &Chain, why: String) {
        self.proof.acting.push(Acting {
            place: format!("{} chain {}", chain.table, chain.name),
            why,
        });
    }

    /// Walks `chain`'s rules, entered `depth` jumps from a hook.
    fn chain(&mut self, chain: &'a Chain, depth: usize) {
        if !self.walked.insert((&chain.table, &chain.name)) {
            return;
        }
        if depth > MAX_JUMP_DEPTH {
            self.acts(chain, "jumps nest deeper than can be followed".into());
            return;
        }
        for rule in &chain.rules {
            let applies = rule.applies(self.family);
            match applies {
                Applies::Never => continue,
                Applies::Only(net) => {
                    if !self.inert(chain, rule, depth) {
                        self.proof.stack_destinations.push(net);
                    }
                    continue;
                }
                Applies::Maybe | Applies::Always => {}
            }
            if !rule.effects.is_empty() {
                let why = format!("rule {} {}", rule.handle, rule.effects.join(", "));
                self.acts(chain, why);
            }
            let ends_here = applies == Applies::Always;
            match &rule.verdict {
                Verdict::Accept | Verdict::Return if ends_here => return,
                Verdict::Continue | Verdict::Accept | Verdict::Return => {}
                Verdict::Drop if rule.drops_only_invalid() => {}
                Verdict::Drop => self.acts(chain, format!("rule {} drops", rule.handle)),
                Verdict::Jump(to) | Verdict::Goto(to) => {
                    self.enter(chain, to, depth);
                    if ends_here && matches!(rule.verdict, Verdict::Goto(_)) {
                        return;
                    }
                }
                Verdict::Other(what) => self.acts(chain, format!("rule {} {what}", rule.handle)),
            }
        }
    }

    /// Walks the chain `to` of `from`'s table.
    fn enter(&mut self, from: &Chain, to: &str, depth: usize) {
        let chains = self.chains;
        match chains.get(&(from.table.as_str(), to)).copied() {
            Some(next) => self.chain(next, depth + 1),
            None => self.acts(from, format!("jumps to {to}, which could not be read")),
        }
    }

    /// Whether `rule`, were it to apply, would neither act nor lead to a
    /// chain that does, whatever it finds there.
    fn inert(&self, chain: &Chain, rule: &Rule, depth: usize) -> bool {
        if !rule.effects.is_empty() {
            return false;
        }
        match &rule.verdict {
            Verdict::Continue | Verdict::Accept | Verdict::Return => true,
            Verdict::Drop => rule.drops_only_invalid(),
            Verdict::Jump(to) | Verdict::Goto(to) => {
                let mut inner = Walk::new(self.chains, self.family);
                inner.enter(chain, to, depth);
                inner.proof == Proof::default()
            }
            Verdict::Other(_) => false,
        }
    }
}

#[cfg(test)]
mod tests;
