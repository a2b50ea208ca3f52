//! Liqo v1's `Connection`: the object Liqo's gateway keeps beside its
//! gateway object, whose status tells Liqo's controllers (and `liqoctl
//! info`) whether the peer is reachable. The shapes follow liqotech/liqo at
//! v1.2.0: `pkg/gateway/tunnel/wireguard/k8s.go:87-128` (creation) and
//! `pkg/gateway/connection/k8s.go:30-52` (status).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client,
    api::{ApiResource, Patch, PatchParams, PostParams},
    core::DynamicObject,
};
use serde_json::{Value, json};
use tracing::info;

use crate::{
    control::source::api_resource_of,
    model::{
        liqo_v1::CLUSTER_ID_LABEL,
        object::{LIQO_V1_NETWORKING_API_VERSION, ObjectKey},
        peer::{GatewayRole, LiqoGateway},
    },
    roles::gateway::conncheck,
};

use super::{ConnectionStatus, MANAGER};

/// How often a Connection whose state holds gets a new latency: Liqo's
/// `--ping-update-status-interval`, as its chart sets it
/// (`networking.gatewayTemplates.ping.updateStatusInterval`, 10s).
pub const UPDATE_STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// Creates the Connection `key` of `gateway` (whose UID is `uid`, if
/// known), or sets its label and spec if it exists, as Liqo's gateway
/// does (`resource.CreateOrUpdate`).
pub async fn ensure(
    client: &Client,
    key: &ObjectKey,
    gateway: &LiqoGateway,
    uid: Option<&str>,
) -> kube::Result<()> {
    if create(client, key, gateway, uid).await? {
        return Ok(());
    }
    let params = PatchParams::apply(MANAGER);
    api(client, key)
        .patch(&key.name, &params, &Patch::Merge(identity(gateway, uid)))
        .await
        .map(drop)
}

/// Creates the Connection `key` of `gateway`; false if it exists already.
pub async fn create(
    client: &Client,
    key: &ObjectKey,
    gateway: &LiqoGateway,
    uid: Option<&str>,
) -> kube::Result<bool> {
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    match api(client, key)
        .create(&params, &object(key, gateway, uid))
        .await
    {
        Ok(_) => {
            info!(object = %key, "Connection created");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The Connections of `key`'s namespace.
pub fn api(client: &Client, key: &ObjectKey) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), &key.namespace, &api_resource())
}

/// What Liqo's `wireguard` container sets on a Connection with no value
/// yet (`tunnel/wireguard/k8s.go:123-126` at v1.2.0), on the version
/// `resource_version` the writer saw: a status written since is kept.
pub fn initial_status_patch(resource_version: Option<String>) -> Value {
    json!({
        "metadata": { "resourceVersion": resource_version },
        "status": { "value": "Connecting" },
    })
}

/// The API resource of Connections.
pub fn api_resource() -> ApiResource {
    api_resource_of(LIQO_V1_NETWORKING_API_VERSION, "Connection", "connections")
}

/// The Connection `key` of `gateway` as Liqo's gateway creates it: labelled
/// with the peer's cluster ID, owned by Liqo's gateway object, and naming
/// it in `spec.gatewayRef`. Liqo names the rendered object's kind there
/// (`WgGatewayClient`) beside the gateway object's UID, and so does this.
pub fn object(key: &ObjectKey, gateway: &LiqoGateway, uid: Option<&str>) -> DynamicObject {
    let mut object = identity(gateway, uid);
    object["apiVersion"] = json!(LIQO_V1_NETWORKING_API_VERSION);
    object["kind"] = json!("Connection");
    object["metadata"]["name"] = json!(key.name);
    object["metadata"]["namespace"] = json!(key.namespace);
    serde_json::from_value(object).expect("a Connection is an object")
}

/// What Liqo's gateway sets on a Connection that already exists: the label
/// and the spec (`resource.CreateOrUpdate`), as a merge patch. The owner
/// and the UID are left out while the gateway's UID is unknown: a null in a
/// merge patch would delete them.
pub fn identity(gateway: &LiqoGateway, uid: Option<&str>) -> Value {
    let connection_type = match gateway.role {
        GatewayRole::Server => "Server",
        GatewayRole::Client => "Client",
    };
    let (rendered_api_version, rendered_kind) = gateway.rendered_kind();
    let mut identity = json!({
        "metadata": {
            "labels": { CLUSTER_ID_LABEL: gateway.cluster_id },
        },
        "spec": {
            "type": connection_type,
            "gatewayRef": {
                "apiVersion": rendered_api_version,
                "kind": rendered_kind,
                "name": gateway.key.name,
                "namespace": gateway.key.namespace,
            },
        },
    });
    if let Some(uid) = uid {
        identity["metadata"]["ownerReferences"] = json!([{
            "apiVersion": LIQO_V1_NETWORKING_API_VERSION,
            "kind": gateway.owner_kind(),
            "name": gateway.key.name,
            "uid": uid,
        }]);
        identity["spec"]["gatewayRef"]["uid"] = json!(uid);
    }
    identity
}

/// The merge patch of a Connection's status subresource: `value`, and the
/// latency with when it was measured.
pub fn status_patch(status: &ConnectionStatus, now: Timestamp) -> Value {
    let latency = status
        .latency
        .clone()
        .unwrap_or_else(|| conncheck::format_latency(None));
    json!({ "status": {
        "value": status.state.as_str(),
        "latency": { "value": latency, "timestamp": now.to_string() },
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        control::status::{ShownOn, State},
        model::peer::GatewayImplementation,
    };

    fn gateway() -> LiqoGateway {
        LiqoGateway::rome(GatewayRole::Client, GatewayImplementation::LiqoWireGuard)
    }

    #[test]
    fn a_connection_is_created_as_liqos_gateway_creates_it() {
        let gateway = gateway();
        let key = gateway.connection();
        let created = serde_json::to_value(object(&key, &gateway, Some("7d2f"))).unwrap();
        assert_eq!(
            created,
            json!({
                "apiVersion": "networking.liqo.io/v1beta1",
                "kind": "Connection",
                "metadata": {
                    "name": "gw-rome",
                    "namespace": "liqo-tenant-rome",
                    "labels": {"liqo.io/remote-cluster-id": "rome"},
                    "ownerReferences": [{
                        "apiVersion": "networking.liqo.io/v1beta1",
                        "kind": "GatewayClient",
                        "name": "rome",
                        "uid": "7d2f",
                    }],
                },
                "spec": {
                    "type": "Client",
                    "gatewayRef": {
                        "apiVersion": "networking.liqo.io/v1beta1",
                        "kind": "WgGatewayClient",
                        "name": "rome",
                        "namespace": "liqo-tenant-rome",
                        "uid": "7d2f",
                    },
                },
            })
        );
        // Without the gateway's UID (not seen yet), no owner is claimed.
        let unowned = serde_json::to_value(object(&key, &gateway, None)).unwrap();
        assert!(unowned["metadata"].get("ownerReferences").is_none());
        assert!(unowned["spec"]["gatewayRef"].get("uid").is_none());
    }

    #[test]
    fn the_status_carries_the_value_and_a_timestamped_latency() {
        let status = ConnectionStatus {
            shown_on: ShownOn::Connection(gateway()),
            state: State::Connected,
            message: String::new(),
            latency: Some("379μs".into()),
            peer_configuration: None,
        };
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        assert_eq!(
            status_patch(&status, now),
            json!({"status": {"value": "Connected", "latency": {"value": "379μs", "timestamp": "2026-11-27T10:00:00Z"}}})
        );
    }
}
