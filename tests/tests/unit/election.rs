//! The gateways' election against the API server stand-in on loopback,
//! which refuses a write on a stale `resourceVersion` as the real one does.

use std::{
    net::TcpListener,
    path::Path,
    time::{Duration, Instant},
};

use isthmus_agent::{
    control::{
        election::{
            elector::{ACTIVE, Elector, GATEWAY_LABEL, PodLabels, STANDBY},
            lease::{LeaseClient, record},
        },
        kubernetes,
    },
    model::election::{Election, Step, Timings},
};
use isthmus_lab::fake_api::FakeApi;
use serde_json::json;

const NAMESPACE: &str = "isthmus-system";
const LEASE: &str = "isthmus-gateway";

struct Api {
    fake: FakeApi,
    _dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
}

fn api() -> Api {
    let fake = FakeApi::start(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let dir = isthmus_tests::scratch_dir();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    Api {
        fake,
        _dir: dir,
        kubeconfig,
    }
}

async fn lease(kubeconfig: &Path) -> LeaseClient {
    let client = kubernetes::client(Some(kubeconfig)).await.unwrap();
    LeaseClient::new(client, NAMESPACE, LEASE)
}

#[tokio::test]
async fn of_two_agents_writing_one_version_the_second_gets_a_conflict() {
    let api = api();
    let (a, b) = (lease(&api.kubeconfig).await, lease(&api.kubeconfig).await);
    let timings = Timings::default();
    let (mut ea, mut eb) = (
        Election::new("a-gw", timings),
        Election::new("a-gw2", timings),
    );
    // Both read the missing Lease, then both create it: one wins.
    assert!(a.read().await.unwrap().is_none() && b.read().await.unwrap().is_none());
    let now = Instant::now();
    let (step_a, step_b) = (ea.next(None, now), eb.next(None, now));
    assert_eq!((&step_a, &step_b), (&Step::Create, &Step::Create));
    let first = a.write(&step_a, None, "a-gw", timings).await.unwrap();
    let second = b.write(&step_b, None, "a-gw2", timings).await.unwrap();
    assert!(first.is_some() && second.is_none(), "one create wins");
    ea.written(first.unwrap(), Instant::now());
    eb.refused();
    assert!(ea.leading(Instant::now()) && !eb.leading(Instant::now()));

    // Both read the same version: a renews on it, then b's takeover on
    // it is refused, so a stays the one holder.
    let read = a.read().await.unwrap().expect("the Lease");
    let version = record(&read).unwrap().resource_version;
    let write = |renewal| Step::Write {
        resource_version: version.clone(),
        transitions: 1,
        renewal,
    };
    let renewed = a.write(&write(true), Some(&read), "a-gw", timings).await;
    let taken = b.write(&write(false), Some(&read), "a-gw2", timings).await;
    assert!(
        renewed.unwrap().is_some(),
        "a renews on the version it read"
    );
    assert!(
        taken.unwrap().is_none(),
        "b's write on the same version is refused"
    );
    let holder = a
        .read()
        .await
        .unwrap()
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("a-gw"));
}

fn gateway_pod(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": "isthmus"}},
        "spec": {"nodeName": name.trim_end_matches("-agent")}})
}

fn label(api: &FakeApi, pod: &str) -> Option<String> {
    let pod = api.get("pods", NAMESPACE, pod)?;
    pod["metadata"]["labels"][GATEWAY_LABEL]
        .as_str()
        .map(str::to_owned)
}

async fn elector(api: &Api, node: &str) -> Elector {
    let client = kubernetes::client(Some(&api.kubeconfig)).await.unwrap();
    let pods = PodLabels::new(client, NAMESPACE, &format!("{node}-agent"));
    Elector::new(
        Election::new(node, Timings::default()),
        lease(&api.kubeconfig).await,
        Some(pods),
    )
}

#[tokio::test]
async fn a_dead_active_gateway_is_replaced_after_the_lease_duration_and_relabelled() {
    let api = api();
    for pod in ["a-gw-agent", "a-gw2-agent"] {
        api.fake.apply(gateway_pod(pod));
    }
    let timings = Timings::default();
    let (mut a, mut b) = (elector(&api, "a-gw").await, elector(&api, "a-gw2").await);
    let (a_active, b_active) = (a.subscribe(), b.subscribe());
    // Both agents' clock: a turn every retry period.
    let mut clock = tokio::time::interval(timings.retry_period);
    let start = Instant::now();
    while start.elapsed() < timings.lease_duration * 2 {
        clock.tick().await;
        a.turn().await;
        b.turn().await;
        assert!(*a_active.borrow() && !*b_active.borrow());
    }
    assert_eq!(label(&api.fake, "a-gw-agent").as_deref(), Some(ACTIVE));
    assert_eq!(label(&api.fake, "a-gw2-agent").as_deref(), Some(STANDBY));
    let stale = lease(&api.kubeconfig).await.read().await.unwrap();

    // a dies where it stands: b takes over once the record stood still for
    // a lease duration, after a's own deadline passed.
    let died = Instant::now();
    let a_deadline = died + timings.renew_deadline;
    let took_over = loop {
        clock.tick().await;
        b.turn().await;
        if *b_active.borrow() {
            break died.elapsed();
        }
        assert!(died.elapsed() < Duration::from_secs(5), "b never took over");
    };
    assert!(
        Instant::now() > a_deadline,
        "b leads before a's deadline passed"
    );
    // a's last renewal was at most a retry period before its death; the
    // third period above the protocol's two (see the unit test of the
    // rules) is room for a loaded CI machine's scheduling.
    assert!(
        took_over + timings.retry_period >= timings.lease_duration
            && took_over <= timings.lease_duration + 3 * timings.retry_period,
        "took over after {took_over:?}"
    );
    // The load balancer's label moved with it.
    assert_eq!(label(&api.fake, "a-gw2-agent").as_deref(), Some(ACTIVE));
    assert_eq!(label(&api.fake, "a-gw-agent").as_deref(), Some(STANDBY));

    // a comes back with what it knew: its renewal on the version it last
    // read is refused, and on its next turn it stands by.
    let old = record(stale.as_ref().expect("a read the Lease")).unwrap();
    let renewal = Step::Write {
        resource_version: old.resource_version,
        transitions: old.transitions,
        renewal: true,
    };
    let refused = lease(&api.kubeconfig)
        .await
        .write(&renewal, stale.as_ref(), "a-gw", timings)
        .await;
    assert!(refused.unwrap().is_none(), "a renewed on a stale version");
    a.turn().await;
    assert!(!*a_active.borrow() && *b_active.borrow());
}

/// An API server that stops answering, as behind a partition that
/// swallows packets, must not keep the active gateway acting past its renew
/// deadline, whatever its client's own timeouts: a standby takes over once
/// the lease duration has passed, and the two would both act.
#[tokio::test]
async fn an_api_server_that_stops_answering_makes_the_active_gateway_stand_down_in_time() {
    let api = api();
    api.fake.apply(gateway_pod("a-gw-agent"));
    let timings = Timings::default();
    let mut a = elector(&api, "a-gw").await;
    let mut active = a.subscribe();
    a.turn().await;
    assert!(*active.borrow_and_update(), "a leads");
    let renewed = Instant::now();
    api.fake.set_stalled(true);
    // The agent's run loop reads the verdict as it is published.
    let turns = tokio::spawn(async move {
        let mut clock = tokio::time::interval(timings.retry_period);
        loop {
            clock.tick().await;
            a.turn().await;
        }
    });
    let published = tokio::time::timeout(Duration::from_secs(5), active.changed()).await;
    let stood_down = renewed.elapsed();
    turns.abort();
    api.fake.set_stalled(false);
    published
        .expect("a turn hung on the silent API server")
        .unwrap();
    assert!(!*active.borrow());
    // It stands down at its deadline, give or take a loaded machine's
    // scheduling, well before a standby could take over.
    assert!(
        stood_down <= timings.renew_deadline + timings.retry_period / 2,
        "a stood down {stood_down:?} after its last renewal"
    );
    assert!(stood_down < timings.lease_duration);
}

/// A Lease someone else wrote in a shape the API would not hold (a
/// holder that is no string) is an error of that turn: nobody leads on it,
/// and nothing panics.
#[tokio::test]
async fn a_malformed_lease_makes_nobody_active() {
    let api = api();
    api.fake.apply(
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": NAMESPACE},
        "spec": {"holderIdentity": 7, "leaseTransitions": "many"}}),
    );
    let mut a = elector(&api, "a-gw").await;
    let active = a.subscribe();
    a.turn().await;
    assert!(!*active.borrow());
    assert!(lease(&api.kubeconfig).await.read().await.is_err());
}
