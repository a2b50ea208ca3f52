//! Which of a cluster's gateway agents is active: an election over a
//! `coordination.k8s.io/v1` Lease, as client-go's leader election holds one.
//!
//! This module is the protocol's state, without I/O.
//! `control::election::lease` reads and writes the object, and
//! `control::election::elector` takes the turns and labels the pods.
//! Its rules:
//! - a candidate takes the Lease only once the record has not changed, as
//!   this agent observed it, for a whole lease duration: the agents'
//!   clocks are never compared;
//! - every write carries the `resourceVersion` it read, so of two agents
//!   that read the same record one write wins and the other gets a
//!   conflict;
//! - the holder stops acting once its last successful renewal is older than
//!   the renew deadline, which is shorter than the lease duration: it has
//!   stepped down before anyone may take over.
//!
//! The crates that elect on kube-rs did not fit: `kube-leader-election` is
//! built on kube 4, and `kube-lease-manager` counts in whole seconds and
//! decides by server-side-apply field ownership, where sub-second failover
//! needs durations in milliseconds.

use std::time::{Duration, Instant};

use thiserror::Error;

use crate::model::lease::LeaseRecord;

/// Timings of the election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a record must stay unchanged before a candidate takes over.
    pub lease_duration: Duration,
    /// How long the holder acts without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews and candidates look.
    pub retry_period: Duration,
}

/// Timings that do not keep the holder's promise.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum TimingsError {
    /// The holder could still be acting when another takes over.
    #[error(
        "the renew deadline ({deadline:?}) must be shorter than the lease duration ({duration:?})"
    )]
    DeadlineNotShorter {
        /// The renew deadline.
        deadline: Duration,
        /// The lease duration.
        duration: Duration,
    },
    /// The holder would not renew before its own deadline.
    #[error(
        "the retry period ({period:?}) must be shorter than the renew deadline ({deadline:?}), and not zero"
    )]
    PeriodNotShorter {
        /// The retry period.
        period: Duration,
        /// The renew deadline.
        deadline: Duration,
    },
}

impl Timings {
    /// Checks that the holder steps down before a candidate may take
    /// over, and renews before its own deadline.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingsError> {
        if renew_deadline >= lease_duration {
            return Err(TimingsError::DeadlineNotShorter {
                deadline: renew_deadline,
                duration: lease_duration,
            });
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return Err(TimingsError::PeriodNotShorter {
                period: retry_period,
                deadline: renew_deadline,
            });
        }
        Ok(Self {
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }
}

impl Default for Timings {
    /// A dead holder is replaced within about 1.2 s (the lease duration
    /// and one retry period), under a TCP retransmission timeout.
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(800),
            retry_period: Duration::from_millis(200),
        }
    }
}

/// What to do with the Lease just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// There is none: create it, held by us.
    Create,
    /// Write it held by us, on `resource_version`: a renewal when we held
    /// it, else a takeover (`transitions` is then one more).
    Write {
        /// The precondition.
        resource_version: String,
        /// `spec.leaseTransitions` to write.
        transitions: i32,
        /// Whether we held it already (its `acquireTime` stays).
        renewal: bool,
    },
    /// Another holds it and is alive: stand by.
    Follow {
        /// Who holds it.
        holder: String,
    },
}

/// One agent's view of the election.
#[derive(Debug)]
pub struct Election {
    identity: String,
    timings: Timings,
    /// The record last read, and when it was first seen as it is.
    observed: Option<(LeaseRecord, Instant)>,
    /// When our last write succeeded, while we hold the Lease.
    renewed: Option<Instant>,
}

impl Election {
    /// `identity` (the node's name) standing with `timings`.
    pub fn new(identity: impl Into<String>, timings: Timings) -> Self {
        Self {
            identity: identity.into(),
            timings,
            observed: None,
            renewed: None,
        }
    }

    /// Who we are in the Lease.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The election's timings.
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// What to do with `lease`, read at `now` (None: it does not exist).
    pub fn next(&mut self, lease: Option<&LeaseRecord>, now: Instant) -> Step {
        let Some(lease) = lease else {
            self.observed = None;
            return Step::Create;
        };
        let since = match &self.observed {
            Some((seen, since)) if seen == lease => *since,
            _ => now,
        };
        self.observed = Some((lease.clone(), since));
        match lease.holder.as_deref() {
            Some(holder) if holder == self.identity => Step::Write {
                resource_version: lease.resource_version.clone(),
                transitions: lease.transitions,
                renewal: true,
            },
            Some(holder) if now.duration_since(since) < self.timings.lease_duration => {
                self.renewed = None;
                Step::Follow {
                    holder: holder.to_owned(),
                }
            }
            _ => Step::Write {
                resource_version: lease.resource_version.clone(),
                transitions: lease.transitions.saturating_add(1),
                renewal: false,
            },
        }
    }

    /// Our write (a create, a renewal or a takeover) succeeded at `at`,
    /// leaving `written` as the record.
    pub fn written(&mut self, written: LeaseRecord, at: Instant) {
        self.observed = Some((written, at));
        self.renewed = Some(at);
    }

    /// Our write was refused (a conflict: another wrote first) or failed.
    pub fn refused(&mut self) {
        // The record we hold is stale; what we held stays held until the
        // deadline, as a failed renewal does.
        self.observed = None;
    }

    /// Whether we are the active one at `now`: our last write succeeded
    /// within the renew deadline.
    pub fn leading(&self, now: Instant) -> bool {
        self.renewed
            .is_some_and(|at| now.duration_since(at) < self.timings.renew_deadline)
    }

    /// When this gateway stops leading unless it renews first; None while
    /// it does not lead.
    pub fn standing_down_at(&self) -> Option<Instant> {
        self.renewed.map(|at| at + self.timings.renew_deadline)
    }
}

#[cfg(test)]
mod tests;
