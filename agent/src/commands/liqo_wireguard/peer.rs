//! What the pod's tunnel should hold, from what the API server holds: the
//! one WireGuard peer of Liqo's `wireguard` container, from the peer's
//! `PublicKey` (`publickeys_controller.go`, `device.go:33-60` at v1.2.0),
//! and how the peer fares, from the `Connection` Liqo's `gateway`
//! container keeps. No I/O, so all of it is tested in memory.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use ipnet::{IpNet, Ipv4Net};
use kube::{ResourceExt, api::DynamicObject};

use super::options::Settings;
use crate::{
    control::source::read_watched,
    model::{
        go_duration,
        liqo_v1::{CLUSTER_ID_LABEL, PeerKey},
        object::{Object, ObjectKind},
        peer::Endpoint,
    },
    roles::gateway::conncheck::Health,
    tunnel::peers::PeerConfig,
};

/// The peer the tunnel should hold, if any, and what kept it from being
/// what the objects ask, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// The peer.
    pub peer: Option<PeerConfig>,
    /// Why a PublicKey was left out, or why there is no peer.
    pub problems: Vec<String>,
}

/// The peer from `public_keys` (the namespace's, as watched) and, for a
/// client whose endpoint is a name, its `address` as last looked up.
///
/// Liqo's container configures every PublicKey labelled with the peer's
/// cluster ID in turn, the last one winning. Here two that disagree leave
/// no peer, named, rather than one picked by the order of events.
pub fn desired(
    settings: &Settings,
    public_keys: &[Arc<DynamicObject>],
    address: Option<IpAddr>,
) -> Desired {
    let cluster_id = &settings.gateway.cluster_id;
    let mut problems = Vec::new();
    let mut keys: Vec<(String, [u8; 32])> = Vec::new();
    for object in public_keys {
        if object.labels().get(CLUSTER_ID_LABEL) != Some(cluster_id) {
            continue;
        }
        match read_public_key(object) {
            Ok(key) => keys.push((object.name_any(), key.key)),
            Err(problem) => problems.push(problem),
        }
    }
    keys.sort();
    let distinct: BTreeSet<[u8; 32]> = keys.iter().map(|(_, key)| *key).collect();
    let public = match distinct.iter().collect::<Vec<_>>().as_slice() {
        [] => {
            problems.push(format!(
                "no usable PublicKey labelled {CLUSTER_ID_LABEL}={cluster_id} in namespace {}: the tunnel has no peer yet",
                settings.gateway.key.namespace
            ));
            return Desired {
                peer: None,
                problems,
            };
        }
        [key] => **key,
        _ => {
            let names: Vec<&str> = keys.iter().map(|(name, _)| name.as_str()).collect();
            problems.push(format!(
                "PublicKeys {} all carry {CLUSTER_ID_LABEL}={cluster_id} with different keys: the tunnel has no peer until one is left",
                names.join(", ")
            ));
            return Desired {
                peer: None,
                problems,
            };
        }
    };
    let endpoint = match (&settings.endpoint, address) {
        (Endpoint::Learned, _) => None,
        (Endpoint::Addr(ip), _) => Some(SocketAddr::new(*ip, settings.endpoint_port)),
        (Endpoint::Name(_), Some(ip)) => Some(SocketAddr::new(ip, settings.endpoint_port)),
        (Endpoint::Name(name), None) => {
            problems.push(format!(
                "--endpoint-address={name} has no address yet: the tunnel has no peer until it resolves"
            ));
            return Desired {
                peer: None,
                problems,
            };
        }
    };
    Desired {
        peer: Some(PeerConfig {
            key: settings.gateway.key.clone(),
            label: cluster_id.clone(),
            cluster_name: cluster_id.clone(),
            public,
            endpoint,
            // Liqo's AllowedIPs: the gateway's routes decide what enters.
            networks: vec![IpNet::V4(Ipv4Net::default())],
        }),
        problems,
    }
}

/// A PublicKey read as the kube source reads one, with an error that
/// names the object and the field.
fn read_public_key(object: &DynamicObject) -> Result<PeerKey, String> {
    match read_watched(ObjectKind::PublicKey, object.clone()) {
        (origin, Ok(Object::PublicKey(raw))) => {
            PeerKey::from_public_key(&raw, &origin).map_err(|e| e.to_string())
        }
        (origin, Ok(_)) => Err(format!("{origin}: not a PublicKey")),
        (_, Err(e)) => Err(e.to_string()),
    }
}

/// How the peer fares by the Connection's status, as Liqo's `wireguard`
/// container reads it for `liqo_peer_*` (`wireguard/metrics.go` at
/// v1.2.0): Connected or not, and the latency when Go can read it.
pub fn reported_health(connection: &DynamicObject) -> Option<Health> {
    let status = connection.data.get("status")?;
    let value = status.get("value")?.as_str()?;
    let rtt = status
        .get("latency")
        .and_then(|l| l.get("value"))
        .and_then(|v| v.as_str())
        .and_then(|text| go_duration::parse(text).ok());
    Some(Health {
        rtt,
        unanswered: 0,
        connected: value == "Connected",
        failed: value == "Error",
    })
}

/// Whether Liqo's `wireguard` container would still set this Connection
/// Connecting: it has no `status.value` yet (`k8s.go:123-126`).
pub fn needs_initial_status(connection: &DynamicObject) -> bool {
    connection
        .data
        .get("status")
        .and_then(|s| s.get("value"))
        .and_then(|v| v.as_str())
        .is_none_or(str::is_empty)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use serde_json::{Value, json};

    use super::*;
    use crate::model::{
        key_text,
        peer::{GatewayImplementation, GatewayRole, LiqoGateway},
    };

    const PEER_KEY: [u8; 32] = [7; 32];

    fn settings(endpoint: Endpoint) -> Settings {
        let role = match endpoint {
            Endpoint::Learned => GatewayRole::Server,
            _ => GatewayRole::Client,
        };
        Settings {
            gateway: LiqoGateway::rome(role, GatewayImplementation::LiqoWireGuard),
            gateway_uid: None,
            endpoint,
            endpoint_port: 51840,
            dev: "liqo-tunnel".into(),
            mtu: 1340,
            listen_port: 51840,
            key_file: "/etc/wireguard/keys/privateKey".into(),
            dns_check_interval: std::time::Duration::from_mins(5),
            serve_on: vec![],
            workers: 1,
        }
    }

    /// A PublicKey as Liqo's controller-manager writes it (the fixture's shape).
    fn public_key(name: &str, cluster: &str, spec: Value) -> Arc<DynamicObject> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "networking.liqo.io/v1beta1",
                "kind": "PublicKey",
                "metadata": {
                    "name": name,
                    "namespace": "liqo-tenant-rome",
                    "labels": {
                        CLUSTER_ID_LABEL: cluster,
                        "liqo.io/gateway-resource": "true",
                    },
                },
                "spec": spec,
            }))
            .unwrap(),
        )
    }

    fn key_spec(key: [u8; 32]) -> Value {
        json!({ "publicKey": key_text::encode(&key) })
    }

    #[test]
    fn the_peers_public_key_gives_the_one_peer_with_liqos_allowed_ips() {
        let keys = [
            public_key("gw-rome", "rome", key_spec(PEER_KEY)),
            public_key("gw-milan", "milan", key_spec([9; 32])),
        ];
        let client = desired(
            &settings(Endpoint::Addr(Ipv4Addr::new(203, 0, 113, 1).into())),
            &keys,
            None,
        );
        assert_eq!(client.problems, Vec::<String>::new());
        let peer = client.peer.unwrap();
        assert_eq!(peer.public, PEER_KEY);
        assert_eq!(peer.endpoint, Some("203.0.113.1:51840".parse().unwrap()));
        assert_eq!(peer.networks, vec!["0.0.0.0/0".parse::<IpNet>().unwrap()]);
        assert_eq!(
            (peer.label.as_str(), peer.key.name.as_str()),
            ("rome", "rome")
        );
        // A server waits for the peer to make contact.
        let server = desired(&settings(Endpoint::Learned), &keys, None);
        assert_eq!(server.peer.unwrap().endpoint, None);
    }

    #[test]
    fn a_name_gives_a_peer_once_it_resolves() {
        let keys = [public_key("gw-rome", "rome", key_spec(PEER_KEY))];
        let named = settings(Endpoint::Name("gw.rome.example".into()));
        let waiting = desired(&named, &keys, None);
        assert_eq!(waiting.peer, None);
        assert!(
            waiting.problems[0].contains("--endpoint-address=gw.rome.example has no address yet")
        );
        let resolved = desired(&named, &keys, Some(Ipv4Addr::new(198, 51, 100, 4).into()));
        assert_eq!(
            resolved.peer.unwrap().endpoint,
            Some("198.51.100.4:51840".parse().unwrap())
        );
    }

    #[test]
    fn forged_and_conflicting_public_keys_are_named_and_give_no_peer() {
        let client = settings(Endpoint::Addr(Ipv4Addr::new(203, 0, 113, 1).into()));
        let forged = [
            public_key("gw-rome", "rome", json!({ "publicKey": "not base64!" })),
            public_key("short", "rome", json!({ "publicKey": "AAAA" })),
            public_key("huge", "rome", json!({ "publicKey": "A".repeat(1 << 20) })),
            public_key("nokey", "rome", json!({})),
        ];
        let result = desired(&client, &forged, None);
        assert_eq!(result.peer, None);
        assert_eq!(result.problems.len(), 5, "{:?}", result.problems);
        assert!(
            result.problems[0].contains("gw-rome") && result.problems[0].contains("spec.publicKey")
        );
        assert!(
            result.problems[3].contains("nokey") && result.problems[3].contains("spec.publicKey")
        );
        // A megabyte of key is not a megabyte of log.
        assert!(result.problems[2].contains("huge") && result.problems[2].len() < 2048);
        assert!(
            result.problems[4]
                .contains("no usable PublicKey labelled liqo.io/remote-cluster-id=rome")
        );

        // Two keys for one peer: neither, both named.
        let rival = [
            public_key("gw-rome", "rome", key_spec(PEER_KEY)),
            public_key("gw-rome-forged", "rome", key_spec([1; 32])),
        ];
        let result = desired(&client, &rival, None);
        assert_eq!(result.peer, None);
        assert!(result.problems[0].contains("PublicKeys gw-rome, gw-rome-forged all carry"));
        // The same key twice is one peer.
        let twice = [
            public_key("gw-rome", "rome", key_spec(PEER_KEY)),
            public_key("gw-rome-copy", "rome", key_spec(PEER_KEY)),
        ];
        assert_eq!(
            desired(&client, &twice, None).peer.unwrap().public,
            PEER_KEY
        );
    }

    fn connection(status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "networking.liqo.io/v1beta1",
            "kind": "Connection",
            "metadata": { "name": "gw-rome", "namespace": "liqo-tenant-rome" },
            "spec": { "type": "Client" },
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_connection_says_how_the_peer_fares_as_liqos_gateway_wrote_it() {
        let connected = connection(json!({
            "value": "Connected",
            "latency": { "value": "379µs", "timestamp": "2026-11-28T01:00:00Z" },
        }));
        let health = reported_health(&connected).unwrap();
        assert!(health.connected && !health.failed);
        assert_eq!(health.rtt, Some(std::time::Duration::from_micros(379)));
        assert!(!needs_initial_status(&connected));

        let error = reported_health(&connection(json!({
            "value": "Error", "latency": { "value": "N/A" },
        })))
        .unwrap();
        assert!(!error.connected && error.failed && error.rtt.is_none());

        let fresh = connection(json!({}));
        assert_eq!(reported_health(&fresh), None);
        assert!(needs_initial_status(&fresh));
        assert!(needs_initial_status(&connection(json!({ "value": "" }))));
        // A forged latency is no latency.
        let odd = connection(json!({ "value": "Connected", "latency": { "value": 12 } }));
        assert_eq!(reported_health(&odd).unwrap().rtt, None);
    }
}
