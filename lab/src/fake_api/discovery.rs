//! The stand-in's discovery documents, from its table of resources, as
//! the real API server's legacy discovery gives them: what `kubectl` reads
//! before it names a resource.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::RESOURCES;

/// The discovery document at `path`, if `path` is one.
pub(super) fn document(path: &str) -> Option<Value> {
    let path = path.trim_end_matches('/');
    match path {
        "/api" => Some(json!({"kind": "APIVersions", "versions": ["v1"],
                              "serverAddressByClientCIDRs": []})),
        "/apis" => Some(groups()),
        _ => resources(path),
    }
}

/// Every group but the core one, each with its one version.
fn groups() -> Value {
    let versions: BTreeMap<&str, &str> = RESOURCES
        .iter()
        .filter_map(|r| r.0.strip_prefix("/apis/"))
        .filter_map(|group_version| group_version.split_once('/'))
        .collect();
    let groups: Vec<Value> = versions
        .iter()
        .map(|(group, version)| {
            let version = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [version.clone()], "preferredVersion": version})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The resources served under `prefix` (`/api/v1`, `/apis/<group>/<version>`).
fn resources(prefix: &str) -> Option<Value> {
    let served: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.0 == prefix)
        .map(|(_, plural, kind, namespaced)| {
            json!({
                "name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced,
                "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            })
        })
        .collect();
    if served.is_empty() {
        return None;
    }
    let group_version = prefix
        .strip_prefix("/apis/")
        .or_else(|| prefix.strip_prefix("/api/"))?;
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": group_version, "resources": served}))
}
