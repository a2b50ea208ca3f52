//! A Kubernetes API server stand-in for the kube source's tests and bench.
//!
//! No API server can be installed here, so this speaks the parts of the
//! real protocol the agent uses: list with a `resourceVersion`, watch
//! streams of `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` and `ERROR` (410
//! for a compacted version), the status subresource with JSON merge patch,
//! Liqo v0.10's and v1's networking objects, Isthmus's gateway objects,
//! Secrets (with `stringData`), Deployments, Nodes and Events. Tests drive it from plain
//! threads: change objects, drop every watch, compact history, or go down.

mod discovery;
mod http;
pub mod schema;

use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpListener},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use anyhow::{Context, Result};
use axum::{Router, serve::ListenerExt};
use base64::{Engine, engine::general_purpose::STANDARD};
use serde_json::{Value, json};
use tokio::sync::watch;

use http::handle;

/// Resources served, as (path prefix, plural, kind, namespaced).
const RESOURCES: [(&str, &str, &str, bool); 18] = [
    (
        "/apis/net.liqo.io/v1alpha1",
        "tunnelendpoints",
        "TunnelEndpoint",
        true,
    ),
    (
        "/apis/net.liqo.io/v1alpha1",
        "natmappings",
        "NatMapping",
        false,
    ),
    ("/api/v1", "nodes", "Node", false),
    ("/api/v1", "pods", "Pod", true),
    (
        "/apis/discovery.k8s.io/v1",
        "endpointslices",
        "EndpointSlice",
        true,
    ),
    (
        "/apis/offloading.liqo.io/v1alpha1",
        "namespaceoffloadings",
        "NamespaceOffloading",
        true,
    ),
    ("/api/v1", "secrets", "Secret", true),
    ("/apis/coordination.k8s.io/v1", "leases", "Lease", true),
    ("/apis/apps/v1", "deployments", "Deployment", true),
    ("/apis/events.k8s.io/v1", "events", "Event", true),
    (LIQO_V1, "configurations", "Configuration", true),
    // Sic: Liqo v1's plural of PublicKey.
    (LIQO_V1, "publickeies", "PublicKey", true),
    (LIQO_V1, "gatewayservers", "GatewayServer", true),
    (LIQO_V1, "gatewayclients", "GatewayClient", true),
    (LIQO_V1, "connections", "Connection", true),
    ("/apis/ipam.liqo.io/v1alpha1", "ips", "IP", true),
    (
        ISTHMUS_GATEWAY,
        "isthmusgatewayservers",
        "IsthmusGatewayServer",
        true,
    ),
    (
        ISTHMUS_GATEWAY,
        "isthmusgatewayclients",
        "IsthmusGatewayClient",
        true,
    ),
];

/// Where Isthmus's gateway objects are served.
const ISTHMUS_GATEWAY: &str = "/apis/gateway.isthmus.dev/v1alpha1";

/// Where Liqo v1's networking objects are served.
const LIQO_V1: &str = "/apis/networking.liqo.io/v1beta1";

/// Where an object is stored: plural, namespace ("" if cluster-scoped), name.
pub type Key = (String, String, String);

/// One request, as the server saw it.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// The body, if JSON.
    pub body: Option<Value>,
    /// When it arrived.
    pub at: std::time::Instant,
    /// Whether it was refused because the server was down.
    pub refused: bool,
}

#[derive(Default)]
struct State {
    /// The last resourceVersion handed out.
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change, in order: (resourceVersion, plural, type, object).
    history: Vec<(u64, String, &'static str, Value)>,
    /// Watches from before this version get `410 Gone`.
    oldest: u64,
    down: bool,
    /// Requests are taken and never answered, as behind a partition that
    /// swallows packets.
    stalled: bool,
    requests: Vec<Request>,
    next_uid: u64,
}

struct Shared {
    state: Mutex<State>,
    /// The CRDs whose schemas and rules writes must meet.
    crds: schema::Crds,
    /// Bumped on every change; `.1` is bumped to end every open watch.
    changes: watch::Sender<(u64, u64)>,
}

/// Waits for changes of a [`FakeApi`]'s objects.
pub struct Changes(watch::Receiver<(u64, u64)>);

impl Changes {
    /// Blocks until an object changes after the last call (or the first).
    pub fn wait(&mut self) {
        // The sender lives as long as the server: an error cannot come
        // while the caller holds the server.
        let _ = futures::executor::block_on(self.0.changed());
    }
}

/// A running fake API server. Dropping it stops the server.
pub struct FakeApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeApi {
    /// Serves on `listener` (already bound, perhaps inside a netns).
    pub fn start(listener: TcpListener) -> Result<Self> {
        Self::start_with_crds(listener, schema::Crds::default())
    }

    /// Serves on `listener`, refusing the writes `crds` refuse, with `422
    /// Unprocessable Entity`, as the API server does.
    pub fn start_with_crds(listener: TcpListener, crds: schema::Crds) -> Result<Self> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            crds,
            state: Mutex::new(State::default()),
            changes: watch::channel((0, 0)).0,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the fake API server's runtime")?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                // As Go's net/http does for the real API server: without it,
                // a watch event can wait 40 ms for a delayed ACK.
                let listener = tokio::net::TcpListener::from_std(listener)
                    .expect("tokio listener")
                    .tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
            // Open watches would keep a graceful shutdown waiting.
            runtime.shutdown_timeout(Duration::from_millis(100));
        });
        Ok(Self {
            shared,
            addr,
            stop: Some(stop),
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig that points at this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: \"http://{}\"}}}}]
users: [{{name: fake, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]
current-context: fake
",
            self.addr
        )
    }

    /// A waiter for the next change of any object.
    pub fn changes(&self) -> Changes {
        Changes(self.shared.changes.subscribe())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().expect("fake API state")
    }

    /// Creates or replaces an object (given as JSON with apiVersion, kind
    /// and metadata), as `kubectl apply` would: watches see ADDED or
    /// MODIFIED. An existing status is kept, as with a status subresource.
    pub fn apply(&self, object: Value) -> u64 {
        let rv = self.state().put(object);
        self.notify(false);
        rv
    }

    /// As [`FakeApi::apply`], for an object the CRDs must admit, as the
    /// API server would: else the reason it would give, and nothing stored.
    pub fn admit(&self, object: Value) -> Result<u64, String> {
        let plural = plural_of(object["kind"].as_str().unwrap_or_default());
        let old = self.get(
            &plural,
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        match self.shared.crds.refusal(&plural, &object, old.as_ref()) {
            Some(why) => Err(why),
            None => Ok(self.apply(object)),
        }
    }

    /// Sets an object's status, as another controller writing the status
    /// subresource does: watches see MODIFIED. Returns whether it existed.
    pub fn set_status(&self, plural: &str, namespace: &str, name: &str, status: Value) -> bool {
        let mut state = self.state();
        let key = (plural.into(), namespace.into(), name.into());
        let Some(stored) = state.objects.get_mut(&key) else {
            return false;
        };
        stored["status"] = status;
        let object = stored.clone();
        state.put(object);
        drop(state);
        self.notify(false);
        true
    }

    /// Deletes an object; watches see DELETED. Returns whether it existed.
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) -> bool {
        let found = self
            .state()
            .delete(&(plural.into(), namespace.into(), name.into()));
        self.notify(false);
        found
    }

    /// Sends a BOOKMARK to every watch of `plural`.
    pub fn bookmark(&self, plural: &str) {
        {
            let mut state = self.state();
            state.rv += 1;
            let rv = state.rv;
            let kind = kind_of(plural);
            let mark = json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}});
            state.history.push((rv, plural.into(), "BOOKMARK", mark));
        }
        self.notify(false);
    }

    /// Ends every open watch, as a broken connection would.
    pub fn drop_watches(&self) {
        self.notify(true);
    }

    /// Forgets all history: a watch resumed from any version seen so far
    /// gets `410 Gone` and must relist.
    pub fn compact(&self) {
        let mut state = self.state();
        state.oldest = state.rv + 1;
        state.history.clear();
    }

    /// Takes the server down (every request gets 503 and every watch ends)
    /// or brings it back.
    pub fn set_down(&self, down: bool) {
        self.state().down = down;
        if down {
            self.notify(true);
        }
    }

    /// Stops answering (requests hang, as behind a partition that
    /// swallows packets) or answers again.
    pub fn set_stalled(&self, stalled: bool) {
        self.state().stalled = stalled;
        self.notify(false);
    }

    /// An object, as stored.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.state()
            .objects
            .get(&(plural.into(), namespace.into(), name.into()))
            .cloned()
    }

    /// Every object of `plural`.
    pub fn list(&self, plural: &str) -> Vec<Value> {
        self.state()
            .objects
            .iter()
            .filter(|((p, _, _), _)| p == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state().requests.clone()
    }

    fn notify(&self, end_watches: bool) {
        let rv = self.state().rv;
        self.shared.changes.send_modify(|(seen, ended)| {
            *seen = rv;
            if end_watches {
                *ended += 1;
            }
        });
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl State {
    fn put(&mut self, mut object: Value) -> u64 {
        let plural = plural_of(object["kind"].as_str().unwrap_or_default());
        let key = key_of(&plural, &object);
        self.rv += 1;
        let existing = self.objects.get(&key);
        let uid = if let Some(old) = existing {
            old["metadata"]["uid"].clone()
        } else {
            self.next_uid += 1;
            json!(format!("00000000-0000-0000-0000-{:012}", self.next_uid))
        };
        if let (Some(old_status), true) =
            (existing.and_then(|o| o.get("status")), has_status(&plural))
        {
            object["status"] = old_status.clone();
        }
        let event = if existing.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let metadata = &mut object["metadata"];
        metadata["resourceVersion"] = json!(self.rv.to_string());
        metadata["uid"] = uid;
        metadata["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        if plural == "secrets" {
            move_string_data(&mut object);
        }
        self.history.push((self.rv, plural, event, object.clone()));
        self.objects.insert(key, object);
        self.rv
    }

    fn delete(&mut self, key: &Key) -> bool {
        let Some(mut object) = self.objects.remove(key) else {
            return false;
        };
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history
            .push((self.rv, key.0.clone(), "DELETED", object));
        true
    }

    /// Watch events of `plural` after `since`, or None if `since` is too old.
    fn events_after(&self, plural: &str, since: u64) -> Option<Vec<Value>> {
        if since + 1 < self.oldest {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|(rv, p, _, _)| *rv > since && p == plural)
                .map(|(_, _, kind, object)| json!({"type": kind, "object": object}))
                .collect(),
        )
    }
}

/// Only the kinds whose status the agent writes have a status subresource
/// here.
fn has_status(plural: &str) -> bool {
    [
        "tunnelendpoints",
        "connections",
        "isthmusgatewayservers",
        "isthmusgatewayclients",
    ]
    .contains(&plural)
}

/// A Secret's `stringData` is written into `data`, base64, as the API server does.
fn move_string_data(secret: &mut Value) {
    let Some(Value::Object(strings)) = secret.as_object_mut().and_then(|o| o.remove("stringData"))
    else {
        return;
    };
    for (key, value) in strings {
        let text = value.as_str().unwrap_or_default();
        secret["data"][key] = json!(STANDARD.encode(text));
    }
}

fn plural_of(kind: &str) -> String {
    RESOURCES
        .iter()
        .find(|r| r.2 == kind)
        .map_or_else(|| format!("{}s", kind.to_lowercase()), |r| r.1.into())
}

fn kind_of(plural: &str) -> &'static str {
    RESOURCES
        .iter()
        .find(|r| r.1 == plural)
        .map_or("Unknown", |r| r.2)
}

fn key_of(plural: &str, object: &Value) -> Key {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        plural.into(),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in patch {
        if value.is_null() {
            target.as_object_mut().expect("object").remove(key);
        } else {
            merge(&mut target[key], value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "d": 3});
        merge(&mut doc, &json!({"a": {"b": null, "e": 4}, "d": [1]}));
        assert_eq!(doc, json!({"a": {"c": 2, "e": 4}, "d": [1]}));
    }

    #[test]
    fn a_watch_from_compacted_history_is_gone() {
        let mut state = State::default();
        state.put(json!({"kind": "NatMapping", "metadata": {"name": "a"}}));
        assert_eq!(state.events_after("natmappings", 0).unwrap().len(), 1);
        state.oldest = state.rv + 1;
        assert!(state.events_after("natmappings", 0).is_none());
        assert_eq!(
            state.events_after("natmappings", state.rv).unwrap().len(),
            0
        );
    }
}
