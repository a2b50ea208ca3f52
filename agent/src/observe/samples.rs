//! The dataplane's per-CPU counters as named, labelled samples, summed over
//! CPUs when read: what `/metrics` exports and `isthmus-agent inspect
//! counters` prints.

use std::path::Path;

use aya::maps::MapError;
use isthmus_common::{
    counters::{self, DIRECTIONS, DROP_REASONS, KINDS, LINKS, OUTCOMES},
    guard::VERDICTS,
    overlay::EVENTS,
};

use crate::kernel::maps::Counters;

/// Label names and values of one sample.
pub type Labels = Vec<(&'static str, &'static str)>;

/// One counter family: a metric name (without the `isthmus_` prefix and
/// the `_total` suffix), its help, and its samples.
#[derive(Debug)]
pub struct Family {
    /// Metric name.
    pub name: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// Each label set and its value.
    pub samples: Vec<(Labels, u64)>,
}

/// The NAT's, the guard's and the overlay's counters, pinned under one root.
#[derive(Debug)]
pub struct DataplaneCounters {
    nat: Counters,
    guard: Counters,
    overlay: Counters,
}

impl DataplaneCounters {
    /// Opens the counters pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Ok(Self {
            nat: Counters::open(root)?,
            guard: Counters::open_guard(root)?,
            overlay: Counters::open_overlay(root)?,
        })
    }

    /// Every family, read now.
    pub fn families(&self) -> Result<Vec<Family>, MapError> {
        let mut families = nat_families(&self.nat.read()?);
        families.push(Family {
            name: "guard_packets",
            help: "Datagrams to the tunnel port seen by the XDP guard, by verdict",
            samples: labelled(
                "verdict",
                VERDICTS.map(isthmus_common::guard::Verdict::as_str),
                self.guard.read()?,
            ),
        });
        families.push(Family {
            name: "overlay_packets",
            help: "Packets the overlay sent to the gateway or another node, took in, or could not handle, by event",
            samples: labelled("event", EVENTS.map(isthmus_common::overlay::OverlayEvent::as_str), self.overlay.read()?),
        });
        Ok(families)
    }
}

fn labelled<const N: usize>(
    label: &'static str,
    values: [&'static str; N],
    sums: Vec<u64>,
) -> Vec<(Labels, u64)> {
    values
        .into_iter()
        .zip(sums)
        .map(|(value, sum)| (vec![(label, value)], sum))
        .collect()
}

/// The NAT programs' counters: every packet by outcome, drops by reason,
/// and translations by kind of rule, each per program and direction.
fn nat_families(sums: &[u64]) -> Vec<Family> {
    let per_program = |slot: &dyn Fn(
        counters::Link,
        counters::Direction,
    ) -> Vec<(&'static str, &'static str, u32)>| {
        LINKS
            .into_iter()
            .flat_map(|l| DIRECTIONS.map(|d| (l, d)))
            .flat_map(|(l, d)| {
                slot(l, d).into_iter().map(move |(label, value, index)| {
                    let labels = vec![
                        ("program", l.program(d)),
                        ("direction", d.as_str()),
                        (label, value),
                    ];
                    (labels, sums[index as usize])
                })
            })
            .collect()
    };
    vec![
        Family {
            name: "nat_packets",
            help: "Packets seen by the NAT programs, by program, direction and outcome",
            samples: per_program(&|l, d| {
                OUTCOMES
                    .map(|o| ("outcome", o.as_str(), counters::outcome_slot(l, d, o)))
                    .to_vec()
            }),
        },
        Family {
            name: "nat_dropped_packets",
            help: "Packets the NAT programs dropped, by program, direction and reason",
            samples: per_program(&|l, d| {
                DROP_REASONS
                    .map(|r| ("reason", r.as_str(), counters::drop_slot(l, d, r)))
                    .to_vec()
            }),
        },
        Family {
            name: "nat_translated_packets",
            help: "Packets the NAT programs rewrote, by program, direction and kind of rule (prefix, natmapping, masquerade); a packet counts once per kind that rewrote it",
            samples: per_program(&|l, d| {
                KINDS
                    .map(|k| ("kind", k.as_str(), counters::kind_slot(l, d, k)))
                    .to_vec()
            }),
        },
    ]
}
