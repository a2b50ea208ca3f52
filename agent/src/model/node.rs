//! The cluster's nodes, as the overlay needs them: each node's PodCIDRs and
//! address, and which node is the gateway. Read from `v1` Node objects, from
//! the API server or from a nodes file in the object directory.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde_yaml_ng::Value;

use crate::model::{
    cidr::Cidr,
    object::{ObjectError, ObjectKind, RawObject},
};

/// The node address the overlay sends to, as Kubernetes lists it.
const ADDRESS_TYPE: &str = "InternalIP";
/// The node address from outside the cluster, where it has one.
const EXTERNAL_ADDRESS_TYPE: &str = "ExternalIP";

/// A node, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Its name.
    pub name: String,
    /// The IPv4 networks of its `spec.podCIDRs` (or `spec.podCIDR`).
    pub pod_cidrs: Vec<Ipv4Net>,
    /// The IPv6 networks of its `spec.podCIDRs`, on a dual-stack cluster.
    pub pod_cidrs6: Vec<Ipv6Net>,
    /// Its first IPv4 `InternalIP`.
    pub address: Ipv4Addr,
    /// Its first IPv6 `InternalIP`, on a dual-stack cluster.
    pub address6: Option<Ipv6Addr>,
    /// Its first IPv4 `ExternalIP`, if it has one: where a gateway server
    /// on it is contacted from other clusters.
    pub external_address: Option<Ipv4Addr>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

impl Node {
    /// Validates a Node read from `origin`.
    pub fn from_raw(raw: &RawObject, origin: &str) -> Result<Self, ObjectError> {
        let error = |problem| ObjectError::new(origin, ObjectKind::Node, raw, problem);
        let pod_cidrs = pod_cidrs(raw).map_err(error)?;
        let address = first_address(raw, ADDRESS_TYPE, ipv4)
            .map_err(error)?
            .ok_or_else(|| {
                error(format!(
                    "field status.addresses: no IPv4 address of type {ADDRESS_TYPE}"
                ))
            })?;
        let external_address = first_address(raw, EXTERNAL_ADDRESS_TYPE, ipv4).map_err(error)?;
        let address6 = first_address(raw, ADDRESS_TYPE, ipv6).map_err(error)?;
        let labels = raw.label_texts();
        Ok(Self {
            name: raw.key.name.clone(),
            pod_cidrs: pod_cidrs.iter().filter_map(|n| Ipv4Net::of(*n)).collect(),
            pod_cidrs6: pod_cidrs.iter().filter_map(|n| Ipv6Net::of(*n)).collect(),
            address,
            address6,
            external_address,
            labels,
        })
    }

    /// Whether it carries `label`, given as `key=value` (or a bare `key`,
    /// for any value).
    pub fn has_label(&self, label: &str) -> bool {
        match label.split_once('=') {
            Some((key, value)) => self.labels.get(key).is_some_and(|v| v == value),
            None => self.labels.contains_key(label),
        }
    }
}

/// `spec.podCIDRs`, else `spec.podCIDR`, of both families. A node without
/// any is valid: it holds no pods yet.
fn pod_cidrs(raw: &RawObject) -> Result<Vec<IpNet>, String> {
    let (field, values): (&str, Vec<&Value>) = match raw.get(&["spec", "podCIDRs"]) {
        Some(Value::Sequence(list)) => ("spec.podCIDRs", list.iter().collect()),
        Some(_) => return Err("field spec.podCIDRs: not a list".into()),
        None => (
            "spec.podCIDR",
            raw.get(&["spec", "podCIDR"]).into_iter().collect(),
        ),
    };
    let mut cidrs = Vec::new();
    for value in values {
        let text = value
            .as_str()
            .ok_or_else(|| format!("field {field}: {value:?} is not a string"))?;
        let net: IpNet = text
            .parse()
            .map_err(|_| format!("field {field}: {text:?} is not a CIDR"))?;
        cidrs.push(net.trunc());
    }
    Ok(cidrs)
}

/// The first address of `address_type` in `status.addresses` that `family`
/// takes.
fn first_address<A>(
    raw: &RawObject,
    address_type: &str,
    family: fn(IpAddr) -> Option<A>,
) -> Result<Option<A>, String> {
    let addresses = match raw.get(&["status", "addresses"]) {
        Some(Value::Sequence(list)) => list,
        Some(_) => return Err("field status.addresses: not a list".into()),
        None => return Err("field status.addresses is missing".into()),
    };
    Ok(addresses
        .iter()
        .filter(|a| a.get("type").and_then(Value::as_str) == Some(address_type))
        .filter_map(|a| a.get("address").and_then(Value::as_str))
        .filter_map(|text| text.parse().ok())
        .find_map(family))
}

fn ipv4(addr: IpAddr) -> Option<Ipv4Addr> {
    match addr {
        IpAddr::V4(addr) => Some(addr),
        IpAddr::V6(_) => None,
    }
}

fn ipv6(addr: IpAddr) -> Option<Ipv6Addr> {
    match addr {
        IpAddr::V6(addr) => Some(addr),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::object::{Object, parse_documents};

    fn node(yaml: &str) -> Result<Node, ObjectError> {
        let docs = parse_documents(Path::new("nodes.yaml"), yaml);
        match docs.into_iter().next() {
            Some(Ok(Object::Node(raw))) => Node::from_raw(&raw, "nodes.yaml"),
            other => panic!("not a node: {other:?}"),
        }
    }

    #[test]
    fn reads_pod_cidrs_address_and_labels() {
        let n = node(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: a-gw\n  labels: {net.liqo.io/gateway: \"true\", zone: 3}\n\
             spec: {podCIDRs: [10.244.0.128/25, \"fd00::/64\"]}\n\
             status:\n  addresses:\n  - {type: Hostname, address: a-gw}\n  - {type: InternalIP, address: \"fd00::1\"}\n  - {type: InternalIP, address: 172.16.1.1}\n",
        )
        .unwrap();
        assert_eq!(n.pod_cidrs, vec!["10.244.0.128/25".parse().unwrap()]);
        assert_eq!(n.pod_cidrs6, vec!["fd00::/64".parse().unwrap()]);
        assert_eq!(n.address, Ipv4Addr::new(172, 16, 1, 1));
        assert_eq!(n.address6, Some("fd00::1".parse().unwrap()));
        assert_eq!(n.external_address, None);
        assert!(n.has_label("net.liqo.io/gateway=true"));
        assert!(n.has_label("zone"));
        assert!(!n.has_label("net.liqo.io/gateway=false"));
    }

    #[test]
    fn an_external_ip_is_kept_beside_the_internal_one() {
        let n = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: a-gw}\nspec: {}\n\
             status: {addresses: [{type: ExternalIP, address: 203.0.113.1}, {type: InternalIP, address: 172.16.1.1}]}\n",
        )
        .unwrap();
        assert_eq!(n.address, Ipv4Addr::new(172, 16, 1, 1));
        assert_eq!(n.external_address, Some(Ipv4Addr::new(203, 0, 113, 1)));
    }

    #[test]
    fn the_single_pod_cidr_field_is_read_too() {
        let n = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: w}\nspec: {podCIDR: 10.244.0.7/25}\n\
             status: {addresses: [{type: InternalIP, address: 172.16.1.2}]}\n",
        )
        .unwrap();
        assert_eq!(n.pod_cidrs, vec!["10.244.0.0/25".parse().unwrap()]);
    }

    #[test]
    fn errors_name_the_object_and_field() {
        let bad_cidr = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: w}\nspec: {podCIDR: 10.244.0/25}\n\
             status: {addresses: [{type: InternalIP, address: 172.16.1.2}]}\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            bad_cidr,
            "nodes.yaml: Node w: field spec.podCIDR: \"10.244.0/25\" is not a CIDR"
        );
        let no_address = node(
            "apiVersion: v1\nkind: Node\nmetadata: {name: w}\nspec: {podCIDR: 10.244.0.0/25}\n\
             status: {addresses: [{type: Hostname, address: w}]}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            no_address
                .contains("Node w: field status.addresses: no IPv4 address of type InternalIP"),
            "{no_address}"
        );
    }
}
