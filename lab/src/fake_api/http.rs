//! The stand-in's HTTP side: a request's target (kind, namespace, name,
//! subresource), the list, get, write and watch answers, and the watch
//! stream of events.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, MutexGuard},
};

use axum::{
    body::{Body, Bytes},
    extract::State as AxumState,
    http::{Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Key, RESOURCES, Request, Shared, State, kind_of, merge};

/// A request's path, taken apart.
struct Target {
    plural: String,
    namespace: String,
    name: Option<String>,
    status: bool,
}

fn target(path: &str) -> Option<Target> {
    let (prefix, rest) = RESOURCES
        .iter()
        .find_map(|r| Some((r.0, path.strip_prefix(r.0)?)))?;
    let rest: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, rest) = match rest.as_slice() {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        rest => (String::new(), rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (plural, None, false),
        [plural, name] => (plural, Some(name.to_string()), false),
        [plural, name, "status"] => (plural, Some(name.to_string()), true),
        _ => return None,
    };
    let known = RESOURCES
        .iter()
        .any(|r| r.0 == prefix && r.1 == *plural && (r.3 || namespace.is_empty()));
    known.then(|| Target {
        plural: plural.to_string(),
        namespace,
        name,
        status,
    })
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(body: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) async fn handle(
    AxumState(shared): AxumState<Arc<Shared>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let mut changes = shared.changes.subscribe();
    while shared.state.lock().expect("fake API state").stalled {
        let _ = changes.changed().await;
    }
    let body: Option<Value> = serde_json::from_slice(&body).ok();
    let query: BTreeMap<&str, &str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let mut state = shared.state.lock().expect("fake API state");
    let refused = state.down;
    state.requests.push(Request {
        method: method.to_string(),
        uri: uri.to_string(),
        body: body.clone(),
        at: std::time::Instant::now(),
        refused,
    });
    if refused {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is down".into(),
        );
    }
    if method == Method::GET
        && let Some(document) = super::discovery::document(uri.path())
    {
        return ok(document);
    }
    let Some(target) = target(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no resource at {}", uri.path()),
        );
    };
    let body = body.unwrap_or_default();
    match (method, target.name.clone()) {
        (Method::GET, None) if query.get("watch") == Some(&"true") => {
            let since = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(state.rv);
            drop(state);
            watch_stream(shared, target.plural, since)
        }
        (Method::GET, None) => list(&state, &target),
        (Method::GET, Some(name)) => match state.objects.get(&target.key(&name)) {
            Some(object) => ok(object.clone()),
            None => target.not_found(&name),
        },
        (Method::POST, None) => create(state, &shared, &target, body),
        (Method::PUT, Some(name)) => replace(state, &shared, &target, &name, body),
        (Method::PATCH, Some(name)) => patch(state, &shared, &target, &name, body),
        (Method::DELETE, Some(name)) => remove(state, &shared, &target, &name),
        (method, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} {}", uri.path()),
        ),
    }
}

impl Target {
    /// The key of object `name` of this target's kind and namespace.
    fn key(&self, name: &str) -> Key {
        (self.plural.clone(), self.namespace.clone(), name.to_owned())
    }

    fn not_found(&self, name: &str) -> Response {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} {name:?} not found", self.plural),
        )
    }
}

/// A list of the target's kind, in its namespace or in all.
fn list(state: &State, target: &Target) -> Response {
    let items: Vec<&Value> = state
        .objects
        .iter()
        .filter(|((p, ns, _), _)| {
            *p == target.plural && (target.namespace.is_empty() || *ns == target.namespace)
        })
        .map(|(_, v)| v)
        .collect();
    ok(json!({
        "apiVersion": "v1", "kind": format!("{}List", kind_of(&target.plural)),
        "metadata": {"resourceVersion": state.rv.to_string()}, "items": items,
    }))
}

fn create(
    state: MutexGuard<'_, State>,
    shared: &Shared,
    target: &Target,
    mut object: Value,
) -> Response {
    object["metadata"]["namespace"] = json!(target.namespace);
    object["kind"] = json!(kind_of(&target.plural));
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if state.objects.contains_key(&target.key(&name)) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} {name:?} already exists", target.plural),
        );
    }
    if let Some(refused) = invalid(shared, &target.plural, &object, None) {
        return refused;
    }
    let stored = store(state, shared, object, target.key(&name));
    (StatusCode::CREATED, ok(stored)).into_response()
}

fn replace(
    state: MutexGuard<'_, State>,
    shared: &Shared,
    target: &Target,
    name: &str,
    mut object: Value,
) -> Response {
    let Some(stored) = state.objects.get(&target.key(name)) else {
        return target.not_found(name);
    };
    if let Some(refused) = stale(&object, stored, &target.plural, name) {
        return refused;
    }
    object["metadata"]["namespace"] = json!(target.namespace);
    object["kind"] = json!(kind_of(&target.plural));
    if let Some(refused) = invalid(shared, &target.plural, &object, Some(stored)) {
        return refused;
    }
    ok(store(state, shared, object, target.key(name)))
}

/// A JSON merge patch of the object, or of its status subresource.
fn patch(
    mut state: MutexGuard<'_, State>,
    shared: &Shared,
    target: &Target,
    name: &str,
    patch: Value,
) -> Response {
    let key = target.key(name);
    let Some(mut object) = state.objects.get(&key).cloned() else {
        return target.not_found(name);
    };
    if let Some(refused) = stale(&patch, &object, &target.plural, name) {
        return refused;
    }
    let old = object.clone();
    if target.status {
        let mut new_status = object.get("status").cloned().unwrap_or_else(|| json!({}));
        merge(&mut new_status, &patch["status"]);
        object["status"] = new_status.clone();
        if let Some(refused) = invalid(shared, &target.plural, &object, Some(&old)) {
            return refused;
        }
        // `put` keeps the stored status, so the new one is stored first.
        if let Some(stored) = state.objects.get_mut(&key) {
            stored["status"] = new_status;
        }
    } else {
        merge(&mut object, &patch);
        if let Some(refused) = invalid(shared, &target.plural, &object, Some(&old)) {
            return refused;
        }
    }
    ok(store(state, shared, object, key))
}

/// Deletes the object, as `kubectl delete` asks: the object as it was.
fn remove(
    mut state: MutexGuard<'_, State>,
    shared: &Shared,
    target: &Target,
    name: &str,
) -> Response {
    let key = target.key(name);
    let Some(object) = state.objects.get(&key).cloned() else {
        return target.not_found(name);
    };
    state.delete(&key);
    let rv = state.rv;
    drop(state);
    shared.changes.send_modify(|(seen, _)| *seen = rv);
    ok(object)
}

/// The `422 Unprocessable Entity` the API server answers a write its CRDs
/// refuse, naming the field and the rule; None if they admit it.
fn invalid(shared: &Shared, plural: &str, object: &Value, old: Option<&Value>) -> Option<Response> {
    let why = shared.crds.refusal(plural, object, old)?;
    Some(status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", why))
}

/// Stores `object` (whose key is `key`), tells the watches, and returns it
/// as stored.
fn store(mut state: MutexGuard<'_, State>, shared: &Shared, object: Value, key: Key) -> Value {
    state.put(object);
    let stored = state.objects[&key].clone();
    drop(state);
    shared.changes.send_modify(|(seen, _)| *seen += 1);
    stored
}

/// The `409 Conflict` the API server answers a write that names a
/// `metadata.resourceVersion` other than the stored one; a write naming
/// none is unconditional.
fn stale(write: &Value, stored: &Value, plural: &str, name: &str) -> Option<Response> {
    let wanted = write["metadata"]["resourceVersion"].as_str()?;
    let current = stored["metadata"]["resourceVersion"].as_str();
    (Some(wanted) != current).then(|| {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {plural} {name:?}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
    })
}

/// A watch: every change after `since`, then new ones as they happen, one
/// JSON object per line, until the watch is ended or the client goes.
fn watch_stream(shared: Arc<Shared>, plural: String, since: u64) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        let mut changes = shared.changes.subscribe();
        let ended_at_start = changes.borrow_and_update().1;
        let mut cursor = since;
        loop {
            let pending = {
                let state = shared.state.lock().expect("fake API state");
                state
                    .events_after(&plural, cursor)
                    .map(|events| (events, state.rv))
            };
            let Some((events, rv)) = pending else {
                let gone = json!({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {cursor}"), "reason": "Expired", "code": 410,
                }});
                let _ = tx.send(line(&gone)).await;
                return;
            };
            for event in &events {
                if tx.send(line(event)).await.is_err() {
                    return;
                }
            }
            cursor = rv;
            if changes.changed().await.is_err() || changes.borrow_and_update().1 != ended_at_start {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("watch response")
}

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_as_the_api_server_lays_them_out() {
        let t = target("/apis/net.liqo.io/v1alpha1/namespaces/liqo/tunnelendpoints/tep/status")
            .unwrap();
        assert_eq!(
            (
                t.plural.as_str(),
                t.namespace.as_str(),
                t.name.as_deref(),
                t.status
            ),
            ("tunnelendpoints", "liqo", Some("tep"), true)
        );
        let t = target("/apis/net.liqo.io/v1alpha1/natmappings").unwrap();
        assert_eq!(
            (t.plural.as_str(), t.namespace.as_str(), t.name),
            ("natmappings", "", None)
        );
        let t = target("/api/v1/namespaces/isthmus-system/secrets").unwrap();
        assert_eq!(
            (t.plural.as_str(), t.namespace.as_str(), t.name),
            ("secrets", "isthmus-system", None)
        );
        assert!(target("/api/v1/namespaces/x/nodes/n").is_none());
        assert!(target("/apis/apps/v1/daemonsets").is_none());
    }
}
