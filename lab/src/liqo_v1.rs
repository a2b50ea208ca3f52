//! The lab's peerings as Liqo v1.2 writes them
//! (`tests/fixtures/liqo-v1/` holds the shapes, with their sources): the
//! same networks and views as the TunnelEndpoints, for an agent that
//! serves a peer the Liqo v1 way (docs/design.md#liqo-v1-peers). Each
//! object is a JSON value, for an API server stand-in, or YAML, for an
//! object directory.

use serde_json::{Value, json};

use crate::{
    lab::liqo_v1_peer::Side,
    topology::{Cluster, Peering},
};

/// The label Liqo v1 names a peer's objects with.
const CLUSTER_ID_LABEL: &str = "liqo.io/remote-cluster-id";
/// Liqo v1's WireGuard port (`forge/gatewayserver.go:35`).
pub const PORT: u16 = 51840;
/// Liqo v1's tunnel MTU (`forge/common.go:19`).
pub const MTU: u16 = 1340;
/// The API version of Liqo v1's networking objects.
const LIQO_NETWORKING_API: &str = "networking.liqo.io/v1beta1";
/// The API version of Isthmus's gateway objects, which Liqo renders from
/// Isthmus's gateway templates.
const ISTHMUS_GATEWAY_API: &str = "gateway.isthmus.dev/v1alpha1";
/// Where `manifests/liqo-v1` puts Isthmus's gateway templates.
const TEMPLATE_NAMESPACE: &str = "liqo";

/// `metadata` of a peer's object, in its tenant namespace.
fn metadata(remote: &Cluster) -> Value {
    let id = remote.cluster_id();
    json!({
        "name": id,
        "namespace": format!("liqo-tenant-{}", remote.name),
        "labels": {CLUSTER_ID_LABEL: id},
    })
}

/// A list of one CIDR, as the `cidr` fields hold it.
fn cidrs(pod: &str, external: &str) -> Value {
    json!({"cidr": {"pod": [pod], "external": [external]}})
}

/// `value` as one YAML document.
fn yaml(value: &Value) -> String {
    serde_yaml_ng::to_string(value).expect("a JSON value serialises")
}

impl Peering {
    /// The local cluster's `Configuration` for the peer: both real
    /// networks in `spec`, our view of the peer's in `status.remote`, and
    /// the condition Liqo's controller sets once it has remapped them
    /// (`configuration_controller.go:136-217` at v1.2.0).
    pub fn configuration(&self) -> Value {
        let (local, remote) = (self.local, self.remote);
        let mut configuration = object(
            LIQO_NETWORKING_API,
            "Configuration",
            remote,
            json!({
                "spec": {
                    "local": cidrs(local.pod_cidr, local.external_cidr),
                    "remote": cidrs(remote.pod_cidr, remote.external_cidr),
                },
                "status": {
                    "conditions": [{
                        "type": "NetworkCIDRsConfigured", "status": "True",
                        "reason": "NetworkCIDRsConfigured",
                        "message": "All network CIDRs are configured",
                        "observedGeneration": 1,
                        "lastTransitionTime": "2026-07-14T09:12:05Z",
                    }],
                    "remote": cidrs(
                        self.remote_nat_pod.unwrap_or(remote.pod_cidr),
                        self.remote_nat_external.unwrap_or(remote.external_cidr),
                    ),
                },
            }),
        );
        configuration["metadata"]["generation"] = json!(1);
        configuration
    }

    /// [`Peering::configuration`] for the dual-stack lab: each list holds
    /// the IPv6 network after the IPv4 one, as Liqo v1's lists are made
    /// for, with our IPv6 view of the peer in `status.remote`.
    pub fn dual_stack_configuration(&self) -> Value {
        let mut configuration = self.configuration();
        let (local, remote) = (self.local, self.remote);
        let [seen_pod, seen_external] = self.remote_views6().map(|net| net.to_string());
        let ipv6 = [
            ("spec", "local", [local.pod_cidr6, local.external_cidr6]),
            ("spec", "remote", [remote.pod_cidr6, remote.external_cidr6]),
            ("status", "remote", [&seen_pod, &seen_external]),
        ];
        for (part, side, [pod, external]) in ipv6 {
            let cidr = &mut configuration[part][side]["cidr"];
            for (list, net) in [("pod", pod), ("external", external)] {
                if let Some(list) = cidr[list].as_array_mut() {
                    list.push(json!(net));
                }
            }
        }
        configuration
    }

    /// [`Peering::configuration`], as YAML.
    pub fn configuration_yaml(&self) -> String {
        yaml(&self.configuration())
    }

    /// The peer gateway's `PublicKey`, `key` in base64.
    pub fn public_key(&self, key: &str) -> Value {
        let spec = json!({"spec": {"publicKey": key}});
        object(LIQO_NETWORKING_API, "PublicKey", self.remote, spec)
    }

    /// [`Peering::public_key`], as YAML.
    pub fn public_key_yaml(&self, key: &str) -> String {
        yaml(&self.public_key(key))
    }

    /// Liqo's gateway object towards the peer, as `liqoctl peer` makes it
    /// with Isthmus's templates: a `GatewayServer` whose clients contact
    /// `port`, or a `GatewayClient` that contacts the peer's gateway on
    /// its uplink at `port`.
    pub fn liqo_gateway(&self, side: Side, port: u16) -> Value {
        let template = |kind: &str, name: &str| {
            json!({"apiVersion": ISTHMUS_GATEWAY_API, "kind": kind,
                   "name": name, "namespace": TEMPLATE_NAMESPACE})
        };
        let spec = match side {
            Side::Server => json!({
                "serverTemplateRef": template("IsthmusGatewayServerTemplate", "isthmus-server"),
                "mtu": MTU,
                "endpoint": {"port": port, "serviceType": "NodePort"},
                "secretRef": {},
            }),
            Side::Client => json!({
                "clientTemplateRef": template("IsthmusGatewayClientTemplate", "isthmus-client"),
                "mtu": MTU,
                "endpoint": {"addresses": [self.remote.wan_addr().to_string()],
                             "port": port, "protocol": "UDP"},
                "secretRef": {},
            }),
        };
        let spec = json!({"spec": spec});
        object(LIQO_NETWORKING_API, liqo_kind(side), self.remote, spec)
    }

    /// What Liqo renders from Isthmus's template for
    /// [`Peering::liqo_gateway`]: the same endpoint and MTU, labelled as
    /// the template labels it.
    pub fn isthmus_gateway(&self, side: Side, port: u16) -> Value {
        let endpoint = match side {
            Side::Server => json!({"port": port}),
            Side::Client => {
                json!({"addresses": [self.remote.wan_addr().to_string()], "port": port})
            }
        };
        let kind = format!("Isthmus{}", liqo_kind(side));
        let spec = json!({"spec": {"mtu": MTU, "endpoint": endpoint}});
        let mut rendered = object(ISTHMUS_GATEWAY_API, &kind, self.remote, spec);
        let labels = &mut rendered["metadata"]["labels"];
        labels["app.kubernetes.io/name"] = json!("isthmus");
        labels["app.kubernetes.io/component"] = json!("gateway");
        labels["networking.liqo.io/gateway-name"] = json!(self.remote.cluster_id());
        rendered
    }

    /// [`Peering::isthmus_gateway`] on Liqo's port, as YAML, for an object
    /// directory.
    pub fn isthmus_gateway_yaml(&self, side: Side) -> String {
        yaml(&self.isthmus_gateway(side, PORT))
    }
}

/// The kind of Liqo's gateway object for `side`.
fn liqo_kind(side: Side) -> &'static str {
    match side {
        Side::Server => "GatewayServer",
        Side::Client => "GatewayClient",
    }
}

/// An object of `kind` about peer `remote`, in its tenant namespace, with
/// `fields` (its `spec`, its `status`).
fn object(api_version: &str, kind: &str, remote: &Cluster, fields: Value) -> Value {
    let mut object = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata(remote)});
    if let Value::Object(fields) = fields {
        for (field, value) in fields {
            object[field] = value;
        }
    }
    object
}
