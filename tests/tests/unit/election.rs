//! The gateways' election against the API server stand-in on loopback,
//! which refuses a write on a stale `resourceVersion` as the real one does.

use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use isthmus_agent::control::{
    election::{Election, Step, Timings, lease::LeaseClient, lease::record},
    kubernetes,
};
use xtask::fake_api::FakeApi;

const NAMESPACE: &str = "isthmus-system";
const LEASE: &str = "isthmus-gateway-a";

struct Agent {
    election: Election,
    lease: LeaseClient,
}

impl Agent {
    /// Reads the Lease, and writes it if the election says so; returns
    /// the step taken and whether the write went through.
    async fn turn(&mut self) -> (Step, bool) {
        let current = self.lease.read().await.expect("the Lease reads");
        let step = self
            .election
            .next(current.as_ref().map(record).as_ref(), Instant::now());
        let written = self
            .lease
            .write(
                &step,
                current.as_ref(),
                self.election.identity(),
                self.election.timings(),
            )
            .await
            .expect("the API server answers");
        match written {
            Some(record) => self.election.written(record, Instant::now()),
            None if matches!(step, Step::Follow { .. }) => {}
            None => self.election.refused(),
        }
        (step, self.leading())
    }

    fn leading(&self) -> bool {
        self.election.leading(Instant::now())
    }
}

async fn agents(api: &FakeApi) -> [Agent; 2] {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, api.kubeconfig()).unwrap();
    let mut out = Vec::new();
    for name in ["a-gw", "a-gw2"] {
        let client = kubernetes::client(Some(&path)).await.unwrap();
        out.push(Agent {
            election: Election::new(name, Timings::default()),
            lease: LeaseClient::new(client, NAMESPACE, LEASE),
        });
    }
    out.try_into().ok().expect("two agents")
}

#[tokio::test]
async fn of_two_agents_writing_one_version_the_second_gets_a_conflict() {
    let api = FakeApi::start(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let [mut a, mut b] = agents(&api).await;
    // Both read the missing Lease, then both create it: one wins.
    let (none_a, none_b) = (a.lease.read().await.unwrap(), b.lease.read().await.unwrap());
    assert!(none_a.is_none() && none_b.is_none());
    let now = Instant::now();
    let (step_a, step_b) = (a.election.next(None, now), b.election.next(None, now));
    assert_eq!((&step_a, &step_b), (&Step::Create, &Step::Create));
    let timings = Timings::default();
    let first = a.lease.write(&step_a, None, "a-gw", timings).await.unwrap();
    let second = b
        .lease
        .write(&step_b, None, "a-gw2", timings)
        .await
        .unwrap();
    assert!(first.is_some() && second.is_none(), "one create wins");
    a.election.written(first.unwrap(), Instant::now());
    b.election.refused();
    assert!(a.leading() && !b.leading());

    // Both read the same version: a renews on it, then b's takeover on
    // it is refused, so a stays the one holder.
    let read = a.lease.read().await.unwrap().expect("the Lease");
    let version = record(&read).resource_version;
    let write = |renewal| Step::Write {
        resource_version: version.clone(),
        transitions: 1,
        renewal,
    };
    let renewed = a
        .lease
        .write(&write(true), Some(&read), "a-gw", timings)
        .await;
    let taken = b
        .lease
        .write(&write(false), Some(&read), "a-gw2", timings)
        .await;
    assert!(
        renewed.unwrap().is_some(),
        "a renews on the version it read"
    );
    assert!(
        taken.unwrap().is_none(),
        "b's write on the same version is refused"
    );
    let holder = a
        .lease
        .read()
        .await
        .unwrap()
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("a-gw"));
}

#[tokio::test]
async fn a_holder_that_stops_renewing_is_replaced_after_the_lease_duration() {
    let api = FakeApi::start(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let [mut a, mut b] = agents(&api).await;
    a.turn().await;
    assert!(a.leading());
    let timings = Timings::default();
    // Both agents' clock: a turn every retry period.
    let mut clock = tokio::time::interval(timings.retry_period);
    // a renews on its period while b looks: b follows.
    let start = Instant::now();
    while start.elapsed() < timings.lease_duration * 2 {
        clock.tick().await;
        a.turn().await;
        let (step, _) = b.turn().await;
        assert!(matches!(step, Step::Follow { .. }), "{step:?}");
        assert!(a.leading() && !b.leading());
    }
    let stale = a.lease.read().await.unwrap();
    // a stops (it died); b takes over once the record stood still for a
    // lease duration, and a's own deadline passed before.
    let died = Instant::now();
    let took_over = loop {
        clock.tick().await;
        assert!(
            !(a.leading() && b.leading()),
            "both lead {:?} after a stopped",
            died.elapsed()
        );
        if b.turn().await.1 {
            break died.elapsed();
        }
        assert!(died.elapsed() < Duration::from_secs(5), "b never took over");
    };
    assert!(!a.leading(), "a still thinks it leads");
    assert!(
        took_over >= timings.lease_duration
            && took_over <= timings.lease_duration + 2 * timings.retry_period,
        "took over after {took_over:?}"
    );
    // a comes back with what it knew: its renewal on the version it last
    // read is refused, and it follows b.
    let old = stale.as_ref().map(record).expect("a read the Lease");
    let renewal = Step::Write {
        resource_version: old.resource_version,
        transitions: old.transitions,
        renewal: true,
    };
    let refused = a
        .lease
        .write(&renewal, stale.as_ref(), "a-gw", timings)
        .await;
    assert!(refused.unwrap().is_none(), "a renewed on a stale version");
    let (step, leading) = a.turn().await;
    assert_eq!(
        step,
        Step::Follow {
            holder: "a-gw2".into()
        }
    );
    assert!(!leading && b.leading());
}
