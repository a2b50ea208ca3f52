//! What Liqo offloads from or exports to each peer, in the shapes Liqo
//! v0.9/v0.10 and Kubernetes write them: the sources of a segregated
//! peer's allowed table (`isthmus_common::isolation`).
//!
//! - A Pod labelled `virtualkubelet.liqo.io/origin: <cluster ID>` was
//!   offloaded from that peer: it may reach the pod on any port.
//! - An EndpointSlice that Kubernetes' endpointslice controller manages,
//!   in a namespace whose NamespaceOffloading selected the peer, exports
//!   its endpoints' ports to it. The NamespaceOffloading's status names
//!   each peer by its NamespaceMap (Liqo v0.5 on) or by its cluster ID
//!   (v0.3 and v0.4).

use std::{collections::BTreeSet, net::IpAddr};

use isthmus_common::ipv4::{PROTO_SCTP, PROTO_TCP, PROTO_UDP};
use serde_yaml_ng::Value;

use crate::model::object::{ObjectError, ObjectKey, ObjectKind, RawObject};

/// The label Liqo's virtual kubelet puts on a pod it offloaded from a
/// peer, holding the peer's cluster ID.
pub const ORIGIN_LABEL: &str = "virtualkubelet.liqo.io/origin";
/// The label naming who manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Kubernetes' own endpointslice controller, the only manager whose
/// slices are exported (Liqo's reflected slices are the peer's own).
pub const ENDPOINTSLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
/// The condition of a NamespaceOffloading that says a peer was selected.
pub const OFFLOADING_REQUIRED: &str = "OffloadingRequired";

/// A pod offloaded from a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadedPod {
    /// The Pod.
    pub key: ObjectKey,
    /// The cluster ID of the peer it came from.
    pub origin_cluster: String,
    /// Its addresses, of both families; none once it has ended or while
    /// it has none.
    pub addresses: Vec<IpAddr>,
}

impl OffloadedPod {
    /// Reads a Pod; None when it was not offloaded.
    pub fn from_raw(raw: &RawObject, origin: &str) -> Result<Option<Self>, ObjectError> {
        let Some(origin_cluster) = raw.label(ORIGIN_LABEL) else {
            return Ok(None);
        };
        let error = |problem| ObjectError::new(origin, ObjectKind::Pod, raw, problem);
        if origin_cluster.is_empty() {
            return Err(error(format!(
                "field metadata.labels.{ORIGIN_LABEL}: empty"
            )));
        }
        Ok(Some(Self {
            key: raw.key.clone(),
            origin_cluster,
            addresses: pod_addresses(raw).map_err(error)?,
        }))
    }
}

/// `status.podIPs`, else `status.podIP`. A pod that has ended holds none:
/// its address may already be another pod's. A pod on the host's network
/// has the node's address, which no peer may reach.
fn pod_addresses(raw: &RawObject) -> Result<Vec<IpAddr>, String> {
    let phase = raw.get(&["status", "phase"]).and_then(Value::as_str);
    let host_network = raw.get(&["spec", "hostNetwork"]).and_then(Value::as_bool);
    if matches!(phase, Some("Succeeded" | "Failed")) || host_network == Some(true) {
        return Ok(Vec::new());
    }
    let texts: Vec<(String, &Value)> = match raw.get(&["status", "podIPs"]) {
        Some(Value::Sequence(list)) => list
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let ip = entry.get("ip").unwrap_or(&Value::Null);
                (format!("status.podIPs[{i}].ip"), ip)
            })
            .collect(),
        Some(Value::Null) | None => raw
            .get(&["status", "podIP"])
            .map(|ip| ("status.podIP".to_owned(), ip))
            .into_iter()
            .collect(),
        Some(_) => return Err("field status.podIPs: not a list".into()),
    };
    texts
        .into_iter()
        .map(|(field, value)| address_of(&field, value))
        .collect()
}

/// An address field, of either family.
fn address_of(field: &str, value: &Value) -> Result<IpAddr, String> {
    let text = value
        .as_str()
        .ok_or_else(|| format!("field {field}: {value:?} is not a string"))?;
    text.parse()
        .map_err(|_| format!("field {field}: {text:?} is not an IP address"))
}

/// A port of an EndpointSlice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExportedPort {
    /// One protocol and port.
    Exact {
        /// The IP protocol number.
        proto: u8,
        /// The port.
        port: u16,
    },
    /// A port without a number: "all ports", as the API defines it.
    Any,
}

/// The endpoints of an EndpointSlice that Kubernetes manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedSlice {
    /// The EndpointSlice; its namespace decides which peers it is exported to.
    pub key: ObjectKey,
    /// Every address of every endpoint, ready or not: a connection to an
    /// endpoint that is shutting down must not break mid-way. All of the
    /// family its `addressType` names.
    pub addresses: Vec<IpAddr>,
    /// Its ports.
    pub ports: Vec<ExportedPort>,
}

impl ExportedSlice {
    /// Reads an EndpointSlice; None when another controller manages it or
    /// its addresses are FQDNs.
    pub fn from_raw(raw: &RawObject, origin: &str) -> Result<Option<Self>, ObjectError> {
        let ipv6 = match raw.get(&["addressType"]).and_then(Value::as_str) {
            Some("IPv4") => false,
            Some("IPv6") => true,
            _ => return Ok(None),
        };
        if raw.label(MANAGED_BY_LABEL).as_deref() != Some(ENDPOINTSLICE_CONTROLLER) {
            return Ok(None);
        }
        let error = |problem| ObjectError::new(origin, ObjectKind::EndpointSlice, raw, problem);
        Ok(Some(Self {
            key: raw.key.clone(),
            addresses: slice_addresses(raw, ipv6).map_err(error)?,
            ports: slice_ports(raw).map_err(error)?,
        }))
    }
}

/// A list field that may be absent or null (none).
fn list<'a>(raw: &'a RawObject, field: &str) -> Result<&'a [Value], String> {
    match raw.get(&[field]) {
        Some(Value::Sequence(list)) => Ok(list),
        Some(Value::Null) | None => Ok(&[]),
        Some(_) => Err(format!("field {field}: not a list")),
    }
}

/// The endpoints' addresses, each of the family `addressType` names
/// (IPv6 when `ipv6`).
fn slice_addresses(raw: &RawObject, ipv6: bool) -> Result<Vec<IpAddr>, String> {
    let mut addresses = Vec::new();
    for (i, endpoint) in list(raw, "endpoints")?.iter().enumerate() {
        let Some(Value::Sequence(texts)) = endpoint.get("addresses") else {
            return Err(format!("field endpoints[{i}].addresses: not a list"));
        };
        for (j, text) in texts.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            let address = address_of(&field, text)?;
            if address.is_ipv6() != ipv6 {
                let family = if ipv6 { "IPv6" } else { "IPv4" };
                return Err(format!("field {field}: not {family}, as addressType says"));
            }
            addresses.push(address);
        }
    }
    Ok(addresses)
}

fn slice_ports(raw: &RawObject) -> Result<Vec<ExportedPort>, String> {
    let mut ports = Vec::new();
    for (i, entry) in list(raw, "ports")?.iter().enumerate() {
        let proto = match entry.get("protocol") {
            None | Some(Value::Null) => PROTO_TCP,
            Some(protocol) => match protocol.as_str() {
                Some("TCP") => PROTO_TCP,
                Some("UDP") => PROTO_UDP,
                Some("SCTP") => PROTO_SCTP,
                _ => {
                    return Err(format!(
                        "field ports[{i}].protocol: {protocol:?} is not TCP, UDP or SCTP"
                    ));
                }
            },
        };
        ports.push(match entry.get("port") {
            None | Some(Value::Null) => ExportedPort::Any,
            Some(value) => {
                let port = value
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("field ports[{i}].port: {value:?} is not a port"))?;
                ExportedPort::Exact { proto, port }
            }
        });
    }
    Ok(ports)
}

/// A NamespaceOffloading: the peers its namespace is offloaded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offloading {
    /// The NamespaceOffloading; its namespace is the one offloaded.
    pub key: ObjectKey,
    /// The peers selected, by the key of Liqo's status: the name of their
    /// NamespaceMap (`isthmus_common::liqo::namespace_map_name`, Liqo v0.5 on) or their
    /// cluster ID (v0.3 and v0.4).
    pub selected: BTreeSet<String>,
}

impl Offloading {
    /// Reads a NamespaceOffloading's `status.remoteNamespacesConditions`:
    /// Liqo lists every peer there, and a peer is selected when its
    /// `OffloadingRequired` condition is `True`.
    pub fn from_raw(raw: &RawObject, origin: &str) -> Result<Self, ObjectError> {
        let error =
            |problem| ObjectError::new(origin, ObjectKind::NamespaceOffloading, raw, problem);
        let field = "status.remoteNamespacesConditions";
        let conditions = match raw.get(&["status", "remoteNamespacesConditions"]) {
            Some(Value::Mapping(map)) => map,
            Some(Value::Null) | None => {
                return Ok(Self {
                    key: raw.key.clone(),
                    selected: BTreeSet::new(),
                });
            }
            Some(_) => return Err(error(format!("field {field}: not a map"))),
        };
        let mut selected = BTreeSet::new();
        for (peer, list) in conditions {
            let peer = peer
                .as_str()
                .ok_or_else(|| error(format!("field {field}: key {peer:?} is not a string")))?;
            let Value::Sequence(list) = list else {
                return Err(error(format!("field {field}.{peer}: not a list")));
            };
            let required = list.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(OFFLOADING_REQUIRED)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            });
            if required {
                selected.insert(peer.to_owned());
            }
        }
        Ok(Self {
            key: raw.key.clone(),
            selected,
        })
    }
}

#[cfg(test)]
mod tests;
