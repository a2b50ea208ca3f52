//! The election's rules, on a clock and a Lease store of the test's own.

use std::path::Path;

use super::*;
use crate::model::object::{Object, ObjectKey, parse_documents};

fn key() -> ObjectKey {
    ObjectKey {
        namespace: "isthmus-system".into(),
        name: "isthmus-gateway".into(),
    }
}

fn record(holder: &str, renew: &str, rv: u64) -> LeaseRecord {
    LeaseRecord {
        key: key(),
        holder: Some(holder.into()),
        renew_time: Some(renew.into()),
        transitions: 3,
        resource_version: rv.to_string(),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_missing_lease_is_created_and_a_live_holder_followed() {
    let t0 = Instant::now();
    let mut e = Election::new("a-gw2", Timings::default());
    assert_eq!(e.next(None, t0), Step::Create);
    let held = record("a-gw", "t1", 7);
    assert_eq!(
        e.next(Some(&held), t0),
        Step::Follow {
            holder: "a-gw".into()
        }
    );
    // Renewed before the lease duration ran out: still followed.
    let renewed = record("a-gw", "t2", 8);
    assert_eq!(
        e.next(Some(&renewed), t0 + ms(900)),
        Step::Follow {
            holder: "a-gw".into()
        }
    );
    assert_eq!(
        e.next(Some(&renewed), t0 + ms(1800)),
        Step::Follow {
            holder: "a-gw".into()
        }
    );
    assert!(!e.leading(t0 + ms(1800)));
}

#[test]
fn a_record_unchanged_for_a_lease_duration_is_taken_over_on_its_version() {
    let t0 = Instant::now();
    let mut e = Election::new("a-gw2", Timings::default());
    let held = record("a-gw", "t1", 7);
    e.next(Some(&held), t0);
    assert!(matches!(
        e.next(Some(&held), t0 + ms(999)),
        Step::Follow { .. }
    ));
    assert_eq!(
        e.next(Some(&held), t0 + ms(1000)),
        Step::Write {
            resource_version: "7".into(),
            transitions: 4,
            renewal: false
        }
    );
    // An empty holder is free at once.
    let mut fresh = Election::new("a-gw2", Timings::default());
    let text = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: isthmus-gateway\n  namespace: isthmus-system\n  resourceVersion: \"9\"\nspec:\n  holderIdentity: \"\"\n  renewTime: t1\n  leaseTransitions: 3\n";
    let released = match parse_documents(Path::new("lease.yaml"), text).pop() {
        Some(Ok(Object::Lease(raw))) => LeaseRecord::from_raw(&raw, "lease.yaml").unwrap(),
        other => panic!("not a Lease: {other:?}"),
    };
    assert!(matches!(
        fresh.next(Some(&released), t0),
        Step::Write { renewal: false, .. }
    ));
}

#[test]
fn the_holder_renews_and_leads_only_within_its_deadline() {
    let t0 = Instant::now();
    let mut e = Election::new("a-gw", Timings::default());
    let ours = record("a-gw", "t1", 7);
    assert_eq!(
        e.next(Some(&ours), t0),
        Step::Write {
            resource_version: "7".into(),
            transitions: 3,
            renewal: true
        }
    );
    assert!(!e.leading(t0), "nothing was written yet");
    e.written(record("a-gw", "t2", 8), t0);
    assert!(e.leading(t0 + ms(799)));
    assert!(!e.leading(t0 + ms(800)), "past the renew deadline");
    // Seeing another holder ends it at once.
    e.written(record("a-gw", "t3", 9), t0 + ms(900));
    e.next(Some(&record("a-gw2", "t4", 10)), t0 + ms(950));
    assert!(!e.leading(t0 + ms(950)));
}

#[test]
fn timings_that_would_overlap_two_holders_are_refused() {
    assert!(Timings::new(ms(1000), ms(800), ms(200)).is_ok());
    assert_eq!(
        Timings::new(ms(1000), ms(1000), ms(200))
            .unwrap_err()
            .to_string(),
        "the renew deadline (1s) must be shorter than the lease duration (1s)"
    );
    assert!(Timings::new(ms(1000), ms(800), ms(800)).is_err());
    assert!(Timings::new(ms(1000), ms(800), ms(0)).is_err());
}

/// A Lease store that refuses a write on a stale version, as the API
/// server does.
#[derive(Default)]
struct Store {
    lease: Option<LeaseRecord>,
    version: u64,
}

impl Store {
    fn write(&mut self, step: &Step, who: &str, at: Instant) -> Option<LeaseRecord> {
        let current = self.lease.as_ref().map(|l| l.resource_version.clone());
        let (precondition, transitions) = match step {
            Step::Create => (None, 0),
            Step::Write {
                resource_version,
                transitions,
                ..
            } => (Some(resource_version.clone()), *transitions),
            Step::Follow { .. } => return None,
        };
        if precondition != current {
            return None;
        }
        self.version += 1;
        let written = LeaseRecord {
            key: key(),
            holder: Some(who.into()),
            renew_time: Some(format!("{at:?}")),
            transitions,
            resource_version: self.version.to_string(),
        };
        self.lease = Some(written.clone());
        Some(written)
    }
}

/// Two agents taking turns in every order, the holder dying half way: at
/// no instant do both lead, and the survivor leads within a lease
/// duration and two retry periods of the death.
#[test]
fn two_agents_never_lead_at_once_and_the_survivor_takes_over() {
    let timings = Timings::default();
    for offset in [0, 1, 50, 100, 150, 199] {
        let t0 = Instant::now();
        let mut store = Store::default();
        let mut agents = [
            (Election::new("a-gw", timings), ms(0)),
            (Election::new("a-gw2", timings), ms(offset)),
        ];
        let death = ms(3000);
        let mut dead = [false, false];
        let mut taken_over = None;
        for tick in 0..600u64 {
            let now = t0 + ms(tick * 10);
            for (i, (agent, phase)) in agents.iter_mut().enumerate() {
                let elapsed = now - t0;
                if dead[i] || elapsed < *phase {
                    continue;
                }
                if !elapsed
                    .checked_sub(*phase)
                    .unwrap()
                    .as_millis()
                    .is_multiple_of(timings.retry_period.as_millis())
                {
                    continue;
                }
                let step = agent.next(store.lease.as_ref(), now);
                match store.write(&step, &agent.identity.clone(), now) {
                    Some(written) => agent.written(written, now),
                    None if matches!(step, Step::Follow { .. }) => {}
                    None => agent.refused(),
                }
            }
            let leaders: Vec<usize> = (0..2)
                .filter(|i| !dead[*i] && agents[*i].0.leading(now))
                .collect();
            assert!(leaders.len() < 2, "offset {offset}: both lead at {tick}");
            if now - t0 >= death && !dead.contains(&true) {
                // The leader dies where it stands.
                let leader = leaders
                    .first()
                    .copied()
                    .expect("someone leads before the death");
                dead[leader] = true;
            }
            if dead.contains(&true) && taken_over.is_none() && leaders.len() == 1 {
                taken_over = Some(now.saturating_duration_since(t0).saturating_sub(death));
            }
        }
        let gap = taken_over.expect("the survivor took over");
        assert!(
            gap <= timings.lease_duration + 2 * timings.retry_period,
            "offset {offset}: took over after {gap:?}"
        );
    }
}
