//! The status of Isthmus's own gateway objects (`IsthmusGatewayServer`,
//! `IsthmusGatewayClient`), which Liqo v1's controllers copy to the
//! `GatewayServer` or `GatewayClient` that owns each
//! (`external-network/server-operator/server_controller.go:255-279` at
//! v1.2.0): where the peer's gateway contacts ours, the Secret that holds
//! our public key, and the node that carries the tunnel.

use std::net::{Ipv4Addr, SocketAddr};

use serde_json::{Value, json};

use crate::model::{
    node::Node,
    object::{ObjectKey, ObjectKind},
    peer::{GatewayImplementation, GatewayRole, LiqoGateway, Peer},
};

/// What every gateway object of this gateway shows, whichever the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayHome {
    /// This node's name.
    pub node: String,
    /// The Secret whose `publicKey` holds our WireGuard key as 32 bytes.
    pub public_key_secret: ObjectKey,
    /// Where this agent serves each gateway's readiness.
    pub readiness: SocketAddr,
    /// The image of the pod of each gateway's Deployment.
    pub pod_image: String,
}

/// One of Isthmus's gateway objects, as it should be shown.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayObject {
    /// The gateway it is the object of.
    pub gateway: LiqoGateway,
    /// Its `status`.
    pub status: Value,
}

impl GatewayObject {
    /// The object's kind.
    pub fn kind(&self) -> ObjectKind {
        LiqoGateway::isthmus_kind(self.gateway.role)
    }
}

impl GatewayHome {
    /// The status of each of `peers`' Isthmus gateway objects, from this
    /// node as `nodes` list it; none while the node is not listed, since
    /// where peers contact us is its address.
    pub fn desired(&self, peers: &[Peer], nodes: &[Node]) -> Vec<GatewayObject> {
        let Some(node) = nodes.iter().find(|n| n.name == self.node) else {
            return Vec::new();
        };
        peers
            .iter()
            .filter_map(|peer| peer.liqo_gateway.as_ref())
            .filter(|gateway| gateway.implementation == GatewayImplementation::Isthmus)
            .map(|gateway| GatewayObject {
                gateway: gateway.clone(),
                status: self.status(gateway, node),
            })
            .collect()
    }

    /// The status of the gateway object of `role` for `peer`, served from
    /// `node`. A server's endpoint is the node's `ExternalIP`, else its
    /// `InternalIP`, in the order Liqo's `NodePort` gateway servers take
    /// them (`pkg/utils/nodeUtils.go:27-45`), and the port its object
    /// gives, where the peer's own tunnel device listens: known before the
    /// peer's key is, which `liqoctl` exchanges only after reading it.
    /// There is no `uid` in `secretRef`: Liqo v1.2 reads one as a
    /// `types.UID`, and a string panics it.
    fn status(&self, gateway: &LiqoGateway, node: &Node) -> Value {
        let contact: Ipv4Addr = node.external_address.unwrap_or(node.address);
        let mut status = json!({
            "secretRef": {
                "apiVersion": "v1",
                "kind": "Secret",
                "name": self.public_key_secret.name,
                "namespace": self.public_key_secret.namespace,
            },
            "internalEndpoint": {
                "ip": node.address.to_string(),
                "node": node.name,
            },
        });
        if gateway.role == GatewayRole::Server {
            status["endpoint"] = json!({
                "addresses": [contact.to_string()],
                "port": gateway.port,
                "protocol": "UDP",
            });
        }
        status
    }
}

/// Whether `shown`, a value as the API server has it, shows every field of
/// `desired`: fields others wrote, and the defaults the API server fills
/// in, are left alone. A list shows a list of as many items, each shown.
pub fn shows(shown: Option<&Value>, desired: &Value) -> bool {
    match (shown, desired) {
        (Some(Value::Object(shown)), Value::Object(desired)) => desired
            .iter()
            .all(|(field, value)| shows(shown.get(field), value)),
        (Some(Value::Array(shown)), Value::Array(desired)) => {
            shown.len() == desired.len()
                && shown.iter().zip(desired).all(|(s, d)| shows(Some(s), d))
        }
        (Some(shown), desired) => shown == desired,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::liqo_v1::fixtures;

    fn node(external: Option<Ipv4Addr>) -> Node {
        Node {
            name: "gateway-1".into(),
            pod_cidrs: Vec::new(),
            pod_cidrs6: Vec::new(),
            address: Ipv4Addr::new(10, 200, 1, 3),
            address6: None,
            external_address: external,
            labels: BTreeMap::new(),
        }
    }

    fn home() -> GatewayHome {
        GatewayHome {
            node: "gateway-1".into(),
            public_key_secret: ObjectKey {
                namespace: "isthmus-system".into(),
                name: "isthmus-wireguard-public".into(),
            },
            readiness: "10.200.1.3:9873".parse().unwrap(),
            pod_image: super::super::gateway_pod::DEFAULT_IMAGE.into(),
        }
    }

    /// The rome peer with the fixture `gateway` as our gateway object,
    /// before its key is known: `liqoctl` reads our status first.
    fn peer(gateway: &str) -> Peer {
        fixtures::rome(gateway, false)
    }

    /// The fixture's `status`, as the agent must write it.
    fn fixture_status(yaml: &str) -> Value {
        let object: Value = serde_yaml_ng::from_str(yaml).unwrap();
        object["status"].clone()
    }

    #[test]
    fn each_gateway_object_shows_what_liqo_copies_as_the_fixtures_have_it() {
        let external = Some(Ipv4Addr::new(198, 51, 100, 40));
        for yaml in [fixtures::SERVER, fixtures::CLIENT] {
            let desired = home().desired(&[peer(yaml)], &[node(external)]);
            assert_eq!(desired.len(), 1);
            assert_eq!(desired[0].gateway.key.to_string(), "liqo-tenant-rome/rome");
            assert_eq!(desired[0].status, fixture_status(yaml));
            assert!(shows(Some(&fixture_status(yaml)), &desired[0].status));
            // A uid there would panic Liqo v1.2's reconcile.
            assert!(desired[0].status["secretRef"].get("uid").is_none());
        }
    }

    #[test]
    fn a_server_without_an_external_ip_gives_its_internal_one_and_none_before_its_node_is_listed() {
        let yaml = fixtures::SERVER;
        let desired = home().desired(&[peer(yaml)], &[node(None)]);
        assert_eq!(
            desired[0].status["endpoint"]["addresses"],
            json!(["10.200.1.3"])
        );
        // The port the object gives, where the peer's own device listens.
        assert_eq!(desired[0].status["endpoint"]["port"], json!(51840));
        assert!(home().desired(&[peer(yaml)], &[]).is_empty());
    }

    #[test]
    fn a_status_with_other_fields_still_shows_ours_and_a_changed_one_does_not() {
        let desired = json!({"endpoint": {"port": 51840}, "internalEndpoint": {"ip": "10.0.0.1"}});
        let more = json!({"endpoint": {"port": 51840, "extra": 1}, "internalEndpoint": {"ip": "10.0.0.1"}, "other": true});
        assert!(shows(Some(&more), &desired));
        let moved = json!({"endpoint": {"port": 51841}, "internalEndpoint": {"ip": "10.0.0.1"}});
        assert!(!shows(Some(&moved), &desired));
        assert!(!shows(None, &desired));
        // A list item with defaults filled in still shows; one more item does not.
        let list = json!({"containers": [{"name": "readiness"}]});
        let defaulted = json!({"containers": [{"name": "readiness", "terminationMessagePath": "/dev/termination-log"}]});
        assert!(shows(Some(&defaulted), &list));
        let longer = json!({"containers": [{"name": "readiness"}, {"name": "other"}]});
        assert!(!shows(Some(&longer), &list));
    }
}
