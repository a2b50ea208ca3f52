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
use tracing::{debug, info, warn};

use crate::{
    control::source::{KubeSource, api_resource},
    model::object::{ObjectKey, ObjectKind},
    model::peer::LiqoGateway,
    observe::metrics::Metrics,
};

use super::{
    ConnectionStatus, GatewayHome, MANAGER, ObjectRejection, RETRY, ShownOn, State,
    WRITES_PER_PASS, Wanted, Written, due,
    gateway_object::{self, GatewayObject},
    gateway_pod, liqo_connection, truncate_note,
};

/// How often a gateway's Deployment is checked even when nothing changed.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(20);

/// Writes what the follow loop wants shown.
pub(super) struct Writer {
    client: Client,
    recorder: Recorder,
    source: KubeSource,
    written: HashMap<ObjectKey, Written>,
    /// The Connections this writer created or found, which its status
    /// writes may patch.
    connections: HashSet<ObjectKey>,
    /// Where gateway objects are served from; None on an agent that serves
    /// none.
    home: Option<GatewayHome>,
    /// When each gateway object's status was last written.
    statuses_tried: HashMap<ObjectKey, Instant>,
    /// Each gateway's Deployment as last made so, or Null where that
    /// failed, and when.
    deployments: HashMap<ObjectKey, (serde_json::Value, Instant)>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// A writer whose Events name this agent as `instance`.
    pub(super) fn new(
        client: Client,
        source: KubeSource,
        instance: &str,
        metrics: Arc<Metrics>,
        home: Option<GatewayHome>,
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
            home,
            statuses_tried: HashMap::new(),
            deployments: HashMap::new(),
            metrics,
        }
    }

    /// Writes until the follow loop ends.
    pub(super) async fn run(
        mut self,
        mut statuses: watch::Receiver<Wanted>,
        mut rejected: mpsc::Receiver<ObjectRejection>,
    ) {
        loop {
            tokio::select! {
                changed = statuses.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let wanted = statuses.borrow_and_update().clone();
                    self.pass(&wanted.connections).await;
                    self.gateway_objects(&wanted.gateway_objects).await;
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

    /// Brings each of Isthmus's gateway objects in `desired` in line: its
    /// status, and its Deployment. Each write waits [`RETRY`] before it is
    /// tried again, as the store may not have brought it back yet.
    async fn gateway_objects(&mut self, desired: &[GatewayObject]) {
        let now = Instant::now();
        let wanted = |key: &ObjectKey| desired.iter().any(|o| &o.gateway.key == key);
        self.statuses_tried.retain(|key, _| wanted(key));
        self.deployments.retain(|key, _| wanted(key));
        for object in desired {
            let Some(stored) = self.find(object.kind(), &object.gateway.key) else {
                continue;
            };
            if let Some(uid) = stored.uid() {
                self.ensure_deployment(object, &uid, now).await;
            }
            let tried = self.statuses_tried.get(&object.gateway.key);
            if tried.is_some_and(|at| now.duration_since(*at) < RETRY)
                || gateway_object::shows(stored.data.get("status"), &object.status)
            {
                continue;
            }
            self.statuses_tried.insert(object.gateway.key.clone(), now);
            self.write_gateway_status(object).await;
        }
    }

    /// Patches the status of `object`'s Isthmus object.
    async fn write_gateway_status(&self, object: &GatewayObject) {
        let key = &object.gateway.key;
        let api = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &key.namespace,
            &api_resource(object.kind()),
        );
        let patch = Patch::Merge(serde_json::json!({ "status": object.status }));
        match api
            .patch_status(&key.name, &PatchParams::apply(MANAGER), &patch)
            .await
        {
            Ok(_) => {
                self.outcome("written", 1);
                info!(object = %key, kind = %object.kind(), "gateway object status written");
            }
            Err(e) => {
                self.outcome("failed", 1);
                warn!(object = %key, kind = %object.kind(), error = %e, "writing the gateway object's status; will retry");
            }
        }
    }

    /// Makes `object`'s Deployment (its owner's UID `owner_uid`) what this
    /// node's agent would have it, when it last did otherwise, or was last
    /// checked [`RESYNC`] ago: someone may have changed or deleted it.
    async fn ensure_deployment(&mut self, object: &GatewayObject, owner_uid: &str, now: Instant) {
        let Some(home) = &self.home else {
            return;
        };
        let desired = gateway_pod::deployment(
            &object.gateway,
            owner_uid,
            &home.node,
            home.readiness,
            &home.pod_image,
        );
        let done = self
            .deployments
            .get(&object.gateway.key)
            .is_some_and(|(last, at)| {
                let age = now.duration_since(*at);
                (last == &desired && age < RESYNC) || (last.is_null() && age < RETRY)
            });
        if done {
            return;
        }
        let key = gateway_pod::key(&object.gateway);
        let outcome = gateway_pod::ensure(&self.client, &key, &desired).await;
        let node = home.node.clone();
        match outcome {
            Ok(wrote) => {
                if wrote {
                    self.outcome("written", 1);
                    info!(deployment = %key, %node, "gateway Deployment written");
                }
                self.deployments
                    .insert(object.gateway.key.clone(), (desired, now));
            }
            Err(e) => {
                self.outcome("failed", 1);
                warn!(deployment = %key, error = %e, "writing the gateway's Deployment; will retry");
                self.deployments
                    .insert(object.gateway.key.clone(), (serde_json::Value::Null, now));
            }
        }
    }

    /// Creates the Connection `key` of `gateway`, or sets its label and spec
    /// if it exists, as Liqo's gateway does. It is owned by Liqo's gateway
    /// object, the controller of ours.
    async fn ensure_connection(&self, key: &ObjectKey, gateway: &LiqoGateway) -> kube::Result<()> {
        let ours = self.find(LiqoGateway::isthmus_kind(gateway.role), &gateway.key);
        let uid = ours.as_deref().and_then(controller_uid);
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

/// The UID of `object`'s controller, from its owner references.
fn controller_uid(object: &DynamicObject) -> Option<String> {
    object
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| owner.uid.clone())
}
