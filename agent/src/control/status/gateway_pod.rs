//! The Deployment `gw-<gateway>` beside each of Isthmus's gateway objects.
//! Liqo's `ForeignCluster` controller reads its ready replicas for the
//! peering's networking condition, and `liqoctl` waits for one before it
//! exchanges keys (`core/foreigncluster-controller/status.go:125-180`,
//! `pkg/liqoctl/wait/wait.go:206-238` at v1.2.0). Its one pod runs the
//! pause image on the active gateway's node, and is ready while that
//! node's agent serves the gateway: kubelet asks the agent, on its metrics
//! port, at [`readiness_path`].

use std::net::SocketAddr;

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use crate::{
    control::source::api_resource_of,
    model::{
        liqo_v1::CLUSTER_ID_LABEL,
        object::{ISTHMUS_GATEWAY_API_VERSION, ObjectKey},
        peer::LiqoGateway,
    },
};

use super::{MANAGER, gateway_object::shows};

/// The image the pod runs, which does nothing: every node holds it, as the
/// sandbox image of its pods.
pub const DEFAULT_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// The one container's name.
const CONTAINER: &str = "readiness";

/// Where a gateway's readiness is asked: `/readyz/gateways/<namespace>/<name>`.
pub fn readiness_path(gateway: &ObjectKey) -> String {
    format!("/readyz/gateways/{}/{}", gateway.namespace, gateway.name)
}

/// The Deployment's name and namespace: Liqo's `gw-<gateway>`
/// (`pkg/gateway/forge/utils.go:18`), beside the gateway.
pub fn key(gateway: &LiqoGateway) -> ObjectKey {
    gateway.connection()
}

/// The Deployment of `gateway`, owned by its Isthmus object (whose UID is
/// `owner_uid`), with its pod on `node`, whose agent serves its readiness
/// at `agent`, running `image`.
pub fn deployment(
    gateway: &LiqoGateway,
    owner_uid: &str,
    node: &str,
    agent: SocketAddr,
    image: &str,
) -> Value {
    let key = key(gateway);
    let (_, kind) = gateway.rendered_kind();
    let selector = json!({
        "app.kubernetes.io/name": "isthmus",
        "app.kubernetes.io/component": "gateway-readiness",
        "networking.liqo.io/gateway-name": gateway.key.name,
    });
    let mut labels = selector.clone();
    labels[CLUSTER_ID_LABEL] = json!(gateway.cluster_id);
    let mut pod_labels = labels.clone();
    pod_labels["networking.liqo.io/component"] = json!("gateway");
    pod_labels["networking.liqo.io/active"] = json!("true");
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": key.name,
            "namespace": key.namespace,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": ISTHMUS_GATEWAY_API_VERSION,
                "kind": kind,
                "name": gateway.key.name,
                "uid": owner_uid,
                "controller": true,
            }],
        },
        "spec": {
            "replicas": 1,
            // Never two pods: the old node's goes before the new one's.
            "strategy": { "type": "Recreate" },
            "selector": { "matchLabels": selector },
            "template": {
                "metadata": { "labels": pod_labels },
                "spec": pod_spec(gateway, node, agent, image),
            },
        },
    })
}

/// A pod that holds nothing: no account token, no volume, no privilege,
/// bound to `node` without the scheduler, as a DaemonSet's pods are.
fn pod_spec(gateway: &LiqoGateway, node: &str, agent: SocketAddr, image: &str) -> Value {
    json!({
        "nodeName": node,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        // The gateway nodes' taints, whatever they are, as the gateway
        // DaemonSet tolerates them.
        "tolerations": [{ "operator": "Exists" }],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65535,
            "runAsGroup": 65535,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": [{
            "name": CONTAINER,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "readinessProbe": {
                "httpGet": {
                    "host": agent.ip().to_string(),
                    "port": agent.port(),
                    "path": readiness_path(&gateway.key),
                },
                "periodSeconds": 5,
                "failureThreshold": 2,
            },
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"] },
            },
            "resources": {
                "requests": { "cpu": "1m", "memory": "4Mi" },
                "limits": { "memory": "16Mi" },
            },
        }],
    })
}

/// Makes the Deployment `key` show `desired`: creates it, or patches it
/// where it differs. Returns whether it wrote.
pub async fn ensure(client: &Client, key: &ObjectKey, desired: &Value) -> kube::Result<bool> {
    let api =
        Api::<DynamicObject>::namespaced_with(client.clone(), &key.namespace, &api_resource());
    let Some(existing) = api.get_opt(&key.name).await? else {
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        let object = serde_json::from_value(desired.clone()).map_err(kube::Error::SerdeError)?;
        api.create(&params, &object).await?;
        return Ok(true);
    };
    let existing = serde_json::to_value(&existing).map_err(kube::Error::SerdeError)?;
    if shows(Some(&existing), desired) {
        return Ok(false);
    }
    // A merge patch replaces lists whole: the containers are ours.
    api.patch(
        &key.name,
        &PatchParams::apply(MANAGER),
        &Patch::Merge(desired),
    )
    .await?;
    Ok(true)
}

/// The API resource of Deployments.
fn api_resource() -> ApiResource {
    api_resource_of("apps/v1", "Deployment", "deployments")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::peer::{GatewayImplementation, GatewayRole};

    fn gateway() -> LiqoGateway {
        LiqoGateway::rome(GatewayRole::Server, GatewayImplementation::Isthmus)
    }

    #[test]
    fn the_deployment_is_liqos_gw_name_owned_by_our_object_on_the_active_node() {
        let agent: SocketAddr = "10.200.1.3:9873".parse().unwrap();
        let d = deployment(&gateway(), "1f6d", "gateway-1", agent, DEFAULT_IMAGE);
        assert_eq!(d["metadata"]["name"], "gw-rome");
        assert_eq!(d["metadata"]["namespace"], "liqo-tenant-rome");
        assert_eq!(
            d["metadata"]["ownerReferences"],
            json!([{"apiVersion": "gateway.isthmus.dev/v1alpha1", "kind": "IsthmusGatewayServer",
                    "name": "rome", "uid": "1f6d", "controller": true}])
        );
        let pod = &d["spec"]["template"];
        assert_eq!(pod["spec"]["nodeName"], "gateway-1");
        let probe = &pod["spec"]["containers"][0]["readinessProbe"]["httpGet"];
        assert_eq!(
            probe,
            &json!({"host": "10.200.1.3", "port": 9873, "path": "/readyz/gateways/liqo-tenant-rome/rome"})
        );
        // The selector picks the template's pods, and Liqo's labels mark it.
        for (label, value) in d["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&pod["metadata"]["labels"][label], value, "{label}");
        }
        assert_eq!(
            pod["metadata"]["labels"]["networking.liqo.io/active"],
            "true"
        );
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    }
}
