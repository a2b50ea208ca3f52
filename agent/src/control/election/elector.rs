//! The election as a task: one turn every retry period (read the Lease,
//! write it if the rules say so), whether this gateway is active published
//! on a watch channel, and the gateway pods labelled as Liqo labels them
//! (`net.liqo.io/gateway=active` on the active one, `standby` on the
//! others), so that a Service or a load balancer follows the active one.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use super::lease::{LeaseClient, LeaseError, record};
use crate::model::election::{Election, Step};

/// The label Liqo's gateway pods carry, and its two values.
pub const GATEWAY_LABEL: &str = "net.liqo.io/gateway";
/// The value of [`GATEWAY_LABEL`] on the active gateway's pod.
pub const ACTIVE: &str = "active";
/// The value of [`GATEWAY_LABEL`] on a standby gateway's pod.
pub const STANDBY: &str = "standby";
/// How long a failed labelling waits before it is tried again, unless the
/// verdict changes first: a missing pod or permission is not fixed by the
/// next turn.
const LABEL_RETRY: Duration = Duration::from_secs(5);

/// The gateway pods of the agent's namespace, by name.
pub struct PodLabels {
    api: Api<Pod>,
    own: String,
}

impl PodLabels {
    /// Pod `own` (this agent's) among those of `namespace`.
    pub fn new(client: Client, namespace: &str, own: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            own: own.to_owned(),
        }
    }

    /// Labels our pod `active` or `standby`; the active one also labels
    /// `standby` any other pod still labelled active (a dead holder's).
    async fn mark(&self, active: bool) -> Result<(), VoteError> {
        if active {
            let selector = format!("{GATEWAY_LABEL}={ACTIVE}");
            let labelled = self
                .api
                .list(&ListParams::default().labels(&selector))
                .await?;
            for pod in labelled.items {
                let name = pod.metadata.name.unwrap_or_default();
                if name != self.own {
                    self.label(&name, STANDBY).await?;
                }
            }
        }
        self.label(&self.own, if active { ACTIVE } else { STANDBY })
            .await?;
        Ok(())
    }

    async fn label(&self, pod: &str, value: &str) -> Result<(), kube::Error> {
        let patch = json!({"metadata": {"labels": {GATEWAY_LABEL: value}}});
        self.api
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }
}

/// Why a turn cast no vote, or labelled no pod.
#[derive(Debug, thiserror::Error)]
enum VoteError {
    /// The API server refused or failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The Lease could not be read or written.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The API server did not answer in time.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Runs the election of one gateway agent.
pub struct Elector {
    election: Election,
    lease: LeaseClient,
    pods: Option<PodLabels>,
    /// Whether the pods carry the labels of the last transition.
    labelled: bool,
    /// When a failed labelling may be tried again.
    label_retry: Option<Instant>,
    active: watch::Sender<bool>,
}

impl Elector {
    /// An elector that has not taken a turn yet: standing by. Without
    /// `pods` (no pod name known), no pod is labelled.
    pub fn new(election: Election, lease: LeaseClient, pods: Option<PodLabels>) -> Self {
        Self {
            election,
            lease,
            pods,
            labelled: false,
            label_retry: None,
            active: watch::channel(false).0,
        }
    }

    /// Whether this gateway is active, as it changes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.active.subscribe()
    }

    /// Takes a turn every retry period until the task is dropped.
    pub async fn run(mut self) {
        let mut clock = tokio::time::interval(self.election.timings().retry_period);
        clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            clock.tick().await;
            self.turn().await;
        }
    }

    /// One turn: read, write if due, publish and label on a change. A vote
    /// the API server does not answer is given up within a retry period,
    /// and never past the instant this gateway must stand down: a hung
    /// request must not keep an active gateway acting after a standby may
    /// have taken over.
    pub async fn turn(&mut self) {
        let timings = self.election.timings();
        let mut give_up = Instant::now() + timings.retry_period;
        if let Some(at) = self.election.standing_down_at() {
            give_up = give_up.min(at);
        }
        let vote = if let Ok(vote) = tokio::time::timeout_at(give_up.into(), self.vote()).await {
            vote
        } else {
            self.election.refused();
            Err(VoteError::TimedOut(timings.retry_period))
        };
        let step = match vote {
            Ok(step) => Some(step),
            Err(e) => {
                warn!(lease = self.lease.name(), error = %e, "the election's Lease cannot be read or written; an active gateway stands by once its renew deadline passes");
                None
            }
        };
        let active = self.election.leading(Instant::now());
        let changed = self
            .active
            .send_if_modified(|was| std::mem::replace(was, active) != active);
        if changed {
            match (&step, active) {
                (_, true) => info!(
                    identity = self.election.identity(),
                    "this gateway is now active"
                ),
                (Some(Step::Follow { holder }), false) => {
                    info!(active = %holder, "this gateway stands by");
                }
                (_, false) => info!("this gateway stands by: its lease was not renewed in time"),
            }
            self.labelled = false;
            self.label_retry = None;
        }
        let due = self.label_retry.is_none_or(|at| Instant::now() >= at);
        if !self.labelled
            && due
            && let Some(pods) = &self.pods
        {
            // Bounded as the vote is, so the next turn comes on time.
            let marked = tokio::time::timeout(timings.retry_period, pods.mark(active)).await;
            match marked.unwrap_or_else(|_| Err(VoteError::TimedOut(timings.retry_period))) {
                Ok(()) => self.labelled = true,
                Err(e) => {
                    self.label_retry = Some(Instant::now() + LABEL_RETRY);
                    warn!(error = %e, retry_in = ?LABEL_RETRY, "labelling the gateway pods");
                }
            }
        }
    }

    async fn vote(&mut self) -> Result<Step, VoteError> {
        let current = self.lease.read().await?;
        let read = current.as_ref().map(record).transpose()?;
        let step = self.election.next(read.as_ref(), Instant::now());
        let identity = self.election.identity().to_owned();
        let timings = self.election.timings();
        match self
            .lease
            .write(&step, current.as_ref(), &identity, timings)
            .await
        {
            Ok(Some(written)) => self.election.written(written, Instant::now()),
            Ok(None) if matches!(step, Step::Follow { .. }) => {}
            Ok(None) => self.election.refused(),
            Err(e) => {
                self.election.refused();
                return Err(e.into());
            }
        }
        Ok(step)
    }
}
