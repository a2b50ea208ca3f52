//! The task that writes statuses and Events to the API server, apart from
//! the follow loop so that a slow API server never holds up the dataplane.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use k8s_openapi::{api::core::v1::ObjectReference, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::ObjectRef,
    },
};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::{
    control::source::{KubeSource, api_resource},
    model::object::{ObjectKey, ObjectKind},
    model::peer::LiqoGateway,
    observe::metrics::Metrics,
};

use super::{
    ConnectionStatus, MANAGER, ObjectRejection, ShownOn, State, WRITES_PER_PASS, Written, due,
    liqo_connection, truncate_note,
};

/// Writes what the follow loop wants shown.
pub(super) struct Writer {
    client: Client,
    recorder: Recorder,
    source: KubeSource,
    written: HashMap<ObjectKey, Written>,
    /// The Connections this writer created or found, which its status
    /// writes may patch.
    connections: HashSet<ObjectKey>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// A writer whose Events name this agent as `instance`.
    pub(super) fn new(
        client: Client,
        source: KubeSource,
        instance: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: Some(instance.into()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            source,
            written: HashMap::new(),
            connections: HashSet::new(),
            metrics,
        }
    }

    /// Writes until the follow loop ends.
    pub(super) async fn run(
        mut self,
        mut statuses: watch::Receiver<BTreeMap<ObjectKey, ConnectionStatus>>,
        mut rejected: mpsc::Receiver<ObjectRejection>,
    ) {
        loop {
            tokio::select! {
                changed = statuses.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let desired = statuses.borrow_and_update().clone();
                    self.pass(&desired).await;
                }
                rejection = rejected.recv() => match rejection {
                    Some(r) => self.event(r.kind, &r.key, &r.note()).await,
                    None => return,
                },
            }
        }
    }

    /// Writes the statuses that are due, state changes first.
    async fn pass(&mut self, desired: &BTreeMap<ObjectKey, ConnectionStatus>) {
        let now = Instant::now();
        self.written.retain(|key, _| desired.contains_key(key));
        self.connections.retain(|key| desired.contains_key(key));
        let mut due_now: Vec<(&ObjectKey, &ConnectionStatus, bool)> = Vec::new();
        for (key, status) in desired {
            let shown = match &status.shown_on {
                ShownOn::TunnelEndpoint => {
                    let Some(object) = self.find(ObjectKind::TunnelEndpoint, key) else {
                        continue;
                    };
                    ConnectionStatus::shown(&object)
                }
                // The agent is the Connection's only writer: it shows what
                // was last written.
                ShownOn::Connection(_) => self.written.get(key).map(|w| w.status.clone()),
            };
            if due(shown.as_ref(), status, self.written.get(key), now) {
                let state_change = shown.is_none_or(|s| !s.same_state(status));
                due_now.push((key, status, state_change));
            }
        }
        due_now.sort_by_key(|(_, _, state_change)| !state_change);
        let skipped = desired.len() - due_now.len().min(WRITES_PER_PASS);
        self.outcome("skipped", skipped);
        for (key, status, state_change) in due_now.into_iter().take(WRITES_PER_PASS) {
            match self.write(key, status).await {
                Ok(()) => {
                    self.outcome("written", 1);
                    debug!(object = %key, state = status.state.as_str(), "status written");
                    // A Connection's Error is Liqo's to report; a rejected
                    // TunnelEndpoint's gets an Event, as a NatMapping's does.
                    if state_change
                        && status.state == State::Error
                        && status.shown_on == ShownOn::TunnelEndpoint
                    {
                        self.event(ObjectKind::TunnelEndpoint, key, &status.message)
                            .await;
                    }
                    self.written.insert(
                        key.clone(),
                        Written {
                            status: status.clone(),
                            at: now,
                        },
                    );
                }
                Err(e) => {
                    self.outcome("failed", 1);
                    warn!(object = %key, error = %e, "writing {} status; will retry", status.shown_on);
                }
            }
        }
    }

    /// Writes `status` to the object `key` that shows it.
    async fn write(&mut self, key: &ObjectKey, status: &ConnectionStatus) -> kube::Result<()> {
        let now = Timestamp::now();
        let params = PatchParams::apply(MANAGER);
        let (resource, patch) = match &status.shown_on {
            ShownOn::TunnelEndpoint => {
                (api_resource(ObjectKind::TunnelEndpoint), status.patch(now))
            }
            ShownOn::Connection(gateway) => {
                if !self.connections.contains(key) {
                    self.ensure_connection(key, gateway).await?;
                    self.connections.insert(key.clone());
                }
                (
                    liqo_connection::api_resource(),
                    liqo_connection::status_patch(status, now),
                )
            }
        };
        let api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &key.namespace, &resource);
        let written = api
            .patch_status(&key.name, &params, &Patch::Merge(patch))
            .await;
        if let Err(kube::Error::Api(e)) = &written
            && e.code == 404
        {
            // Deleted under us: forgotten, so the next pass creates it.
            self.connections.remove(key);
            self.written.remove(key);
        }
        written.map(drop)
    }

    /// Creates the Connection `key` of `gateway`, or sets its label and spec
    /// if it exists, as Liqo's gateway does.
    async fn ensure_connection(&self, key: &ObjectKey, gateway: &LiqoGateway) -> kube::Result<()> {
        let uid = self.find(gateway.kind, &gateway.key).and_then(|o| o.uid());
        liqo_connection::ensure(&self.client, key, gateway, uid.as_deref()).await
    }

    fn outcome(&self, outcome: &'static str, count: usize) {
        self.metrics
            .status_writes
            .get_or_create(&[("outcome", outcome)])
            .inc_by(count as u64);
    }

    /// The object `kind` `key` as the API server last sent it.
    fn find(&self, kind: ObjectKind, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        // Nodes, what isolation reads and the Lease are never written back to.
        let store = self.source.store(kind)?;
        let reference = ObjectRef::new_with(&key.name, api_resource(kind));
        let reference = if key.namespace.is_empty() {
            reference
        } else {
            reference.within(&key.namespace)
        };
        store.get(&reference)
    }

    /// A Warning Event on a rejected object, saying why.
    async fn event(&self, kind: ObjectKind, key: &ObjectKey, problem: &str) {
        let reference = ObjectReference {
            api_version: Some(kind.api_version().into()),
            kind: Some(kind.as_str().into()),
            name: Some(key.name.clone()),
            namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
            uid: self.find(kind, key).and_then(|o| o.uid()),
            ..ObjectReference::default()
        };
        let note = truncate_note(problem.to_owned());
        let event = Event {
            type_: EventType::Warning,
            reason: "Rejected".into(),
            note: Some(note),
            action: "Program".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            warn!(object = %key, error = %e, "recording an Event");
        }
    }
}
