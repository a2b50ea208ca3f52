//! A validated NatMapping (docs/design.md#natmapping): the cluster it is for,
//! and its entries checked one by one, so one bad entry costs only itself.
//! Checks that need the cluster's TunnelEndpoint happen in the reconciler.

use std::{
    collections::{BTreeMap, btree_map::Entry},
    net::IpAddr,
    str::FromStr,
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde_yaml_ng::{Mapping, Value};
use thiserror::Error;

use crate::model::{
    cidr::Cidr,
    object::{ObjectKey, RawNatMapping},
};

/// A NatMapping, or one of its entries, that cannot be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{file}: NatMapping {object}: {problem}")]
pub struct NatMappingError {
    /// File holding the object.
    pub file: String,
    /// The object.
    pub object: ObjectKey,
    /// What is wrong.
    pub problem: Box<MappingProblem>,
}

impl NatMappingError {
    /// `problem` with the object found in `file`.
    pub fn new(file: &str, object: &ObjectKey, problem: MappingProblem) -> Self {
        Self {
            file: file.to_owned(),
            object: object.clone(),
            problem: Box::new(problem),
        }
    }
}

/// What makes a NatMapping or an entry unusable, by field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MappingProblem {
    /// No cluster to map for.
    #[error("field spec.clusterID is missing")]
    NoClusterId,
    /// Entries that are not a map.
    #[error("field spec.{field} is not a map")]
    NoMappings {
        /// The field: `clusterMappings`, or `ipv6.clusterMappings`.
        field: &'static str,
    },
    /// The IPv6 part that is not a map.
    #[error("field spec.ipv6 is not a map")]
    NoIpv6,
    /// A network field that does not parse.
    #[error("field spec.{field}: {value:?} is not an {family} CIDR")]
    BadCidr {
        /// The field.
        field: &'static str,
        /// What it holds.
        value: String,
        /// The family the field holds.
        family: &'static str,
    },
    /// A network that is not the one the cluster's TunnelEndpoint gives:
    /// the object was written for other views (a stale or a foreign one).
    #[error(
        "field spec.{field}: {found} is not {expected}, the {meaning} ({tep_field} of TunnelEndpoint {tunnel_endpoint})"
    )]
    ViewMismatch {
        /// The NatMapping's field.
        field: &'static str,
        /// What it holds.
        found: IpNet,
        /// What the TunnelEndpoint gives.
        expected: IpNet,
        /// What that network is.
        meaning: &'static str,
        /// The TunnelEndpoint's field.
        tep_field: &'static str,
        /// The TunnelEndpoint.
        tunnel_endpoint: ObjectKey,
    },
    /// An entry whose key or value is not an address.
    #[error("field spec.{entries}.{endpoint}: {value:?} is not an {family} address")]
    BadAddress {
        /// The entries' field.
        entries: &'static str,
        /// The entry's key (endpointIP) as written.
        endpoint: String,
        /// The part that does not parse.
        value: String,
        /// The family the field holds.
        family: &'static str,
    },
    /// One externalIP claimed by several endpoints: none of them can have it.
    #[error("field spec.{entries}: endpoints {first} and {second} share externalIP {external}")]
    SharedExternal {
        /// The entries' field.
        entries: &'static str,
        /// One endpoint.
        first: IpAddr,
        /// Another.
        second: IpAddr,
        /// The externalIP both claim.
        external: IpAddr,
    },
    /// An externalIP the peer cannot be reaching us at.
    #[error(
        "field spec.{entries}.{endpoint}: externalIP {external} lies outside {cidr}, our ExternalCIDR as the peer sees it ({field} of TunnelEndpoint {tunnel_endpoint})"
    )]
    OutsideExternalCidr {
        /// The entries' field.
        entries: &'static str,
        /// The entry's endpoint.
        endpoint: IpAddr,
        /// Its externalIP.
        external: IpAddr,
        /// Our ExternalCIDR as the peer sees it.
        cidr: IpNet,
        /// The TunnelEndpoint field that CIDR comes from.
        field: &'static str,
        /// Where that CIDR comes from.
        tunnel_endpoint: ObjectKey,
    },
    /// An entry that would expose a node of this cluster to the peer.
    #[error(
        "field spec.{entries}.{endpoint}: endpoint {endpoint} (externalIP {external}) is {what}; no node is exposed to a peer"
    )]
    NodeAddress {
        /// The entries' field.
        entries: &'static str,
        /// The entry's endpoint.
        endpoint: IpAddr,
        /// Its externalIP.
        external: IpAddr,
        /// Which node address it is.
        what: String,
    },
    /// More entries than this cluster's fair share of the kernel's table.
    #[error(
        "field spec.{field}: {refused} of its {entries} entries are refused: this cluster's share of the {family} NatMapping table is {share} of {capacity} (--nat-mapping-capacity); the conncheck's entry and those already programmed are kept first"
    )]
    BeyondShare {
        /// The entries' field.
        field: &'static str,
        /// The table's family.
        family: &'static str,
        /// Entries refused.
        refused: usize,
        /// Entries the object asks for (valid ones).
        entries: usize,
        /// The cluster's share.
        share: usize,
        /// The table's capacity.
        capacity: usize,
    },
    /// IPv6 entries for a cluster whose TunnelEndpoint gives no IPv6
    /// networks: there is no view to read them in.
    #[error(
        "field spec.ipv6: TunnelEndpoint {tunnel_endpoint} gives cluster {cluster} no IPv6 networks; its IPv6 entries are held"
    )]
    NoIpv6Networks {
        /// The cluster ID.
        cluster: String,
        /// The cluster's TunnelEndpoint.
        tunnel_endpoint: ObjectKey,
    },
    /// The cluster has no TunnelEndpoint (yet): nothing to attach the entries to.
    #[error(
        "field spec.clusterID: cluster {cluster} has no TunnelEndpoint yet; its mappings are held until one appears"
    )]
    Held {
        /// The cluster ID.
        cluster: String,
    },
    /// Another NatMapping already maps this cluster.
    #[error(
        "field spec.clusterID: cluster {cluster} is already mapped by NatMapping {other} in {other_file}"
    )]
    DuplicateCluster {
        /// The cluster ID.
        cluster: String,
        /// The NatMapping kept.
        other: ObjectKey,
        /// The file holding it.
        other_file: String,
    },
}

/// One NatMapping, validated as far as it can be alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatMapping {
    /// The object.
    pub key: ObjectKey,
    /// File (or other origin) it was read from.
    pub origin: String,
    /// `spec.clusterID`: the cluster whose traffic the entries translate.
    pub cluster_id: String,
    /// The IPv4 fields of `spec`.
    pub ipv4: Mappings<Ipv4Net>,
    /// `spec.ipv6`: the same for IPv6, if given (docs/design.md#dual-stack).
    /// Liqo v0.10's NatMapping holds one network a field, so Isthmus's CRD
    /// adds it, and Liqo ignores it.
    pub ipv6: Option<Mappings<Ipv6Net>>,
    /// Entries that cannot be used, each with why.
    pub rejected: Vec<NatMappingError>,
}

/// One family's part of a NatMapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mappings<N: Cidr> {
    /// `podCIDR`: the cluster's PodCIDR as we see it, if given.
    pub pod_cidr: Option<N>,
    /// `externalCIDR`: our ExternalCIDR as the cluster sees it, where every
    /// externalIP lies, if given.
    pub external_cidr: Option<N>,
    /// `clusterMappings`' usable entries, externalIP (in the cluster's
    /// view) → endpointIP.
    pub entries: BTreeMap<N::Addr, N::Addr>,
}

/// The names of one family's fields in `spec`, as errors give them.
#[derive(Clone, Copy, Debug)]
pub struct FieldNames {
    /// The PodCIDR's.
    pub pod_cidr: &'static str,
    /// The ExternalCIDR's.
    pub external_cidr: &'static str,
    /// The entries'.
    pub entries: &'static str,
}

impl FieldNames {
    /// IPv6's fields, in `spec.ipv6`, or IPv4's.
    pub const fn of(ipv6: bool) -> Self {
        match ipv6 {
            true => Self {
                pod_cidr: "ipv6.podCIDR",
                external_cidr: "ipv6.externalCIDR",
                entries: "ipv6.clusterMappings",
            },
            false => Self {
                pod_cidr: "podCIDR",
                external_cidr: "externalCIDR",
                entries: "clusterMappings",
            },
        }
    }
}

impl NatMapping {
    /// Validates a NatMapping read from `origin`.
    pub fn from_raw(raw: &RawNatMapping, origin: &str) -> Result<Self, NatMappingError> {
        let error = |problem| NatMappingError::new(origin, &raw.key, problem);
        let cluster_id = raw
            .spec
            .get("clusterID")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| error(MappingProblem::NoClusterId))?
            .to_owned();
        let mut rejected = Vec::new();
        let ipv4 = family(&raw.spec, &error, &mut rejected)?;
        let ipv6 = match raw.spec.get("ipv6") {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(spec)) => Some(family(spec, &error, &mut rejected)?),
            Some(_) => return Err(error(MappingProblem::NoIpv6)),
        };
        Ok(Self {
            key: raw.key.clone(),
            origin: origin.to_owned(),
            cluster_id,
            ipv4,
            ipv6,
            rejected,
        })
    }

    /// An error about this object.
    pub fn error(&self, problem: MappingProblem) -> NatMappingError {
        NatMappingError::new(&self.origin, &self.key, problem)
    }
}

/// Reads one family's fields from `spec`: the NatMapping's own for IPv4,
/// its `ipv6` map for IPv6. Entries that cannot be used go to `rejected`.
fn family<N>(
    spec: &Mapping,
    error: &impl Fn(MappingProblem) -> NatMappingError,
    rejected: &mut Vec<NatMappingError>,
) -> Result<Mappings<N>, NatMappingError>
where
    N: Cidr,
    N::Addr: FromStr,
{
    let names = FieldNames::of(N::IPV6);
    let cidr = |name: &str, field: &'static str| match spec.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_str()
            .and_then(N::parse_network)
            .map(Some)
            .ok_or_else(|| {
                error(MappingProblem::BadCidr {
                    field,
                    value: shown(v),
                    family: N::FAMILY,
                })
            }),
    };
    let pod_cidr = cidr("podCIDR", names.pod_cidr)?;
    let external_cidr = cidr("externalCIDR", names.external_cidr)?;
    let field = names.entries;
    // Liqo writes a new NatMapping with no entries as `{}`, and Go
    // marshals a nil map as null.
    let empty = Mapping::new();
    let mappings = match spec.get("clusterMappings") {
        None | Some(Value::Null) => &empty,
        Some(v) => v
            .as_mapping()
            .ok_or_else(|| error(MappingProblem::NoMappings { field }))?,
    };
    let mut pairs = Vec::with_capacity(mappings.len());
    for (k, v) in mappings {
        let (Some(endpoint), Some(external)) = (address::<N::Addr>(k), address::<N::Addr>(v))
        else {
            let value = if address::<N::Addr>(k).is_none() {
                k
            } else {
                v
            };
            rejected.push(error(MappingProblem::BadAddress {
                entries: field,
                endpoint: shown(k),
                value: shown(value),
                family: N::FAMILY,
            }));
            continue;
        };
        pairs.push((external, endpoint));
    }
    // Sorted once, stably (the first claimant first), and built in
    // bulk: ten thousand entries are read again on every change.
    pairs.sort_by_key(|(external, _)| *external);
    let mut entries = Vec::with_capacity(pairs.len());
    for claimants in pairs.chunk_by(|a, b| a.0 == b.0) {
        match claimants {
            [(external, first), (_, second), ..] => {
                rejected.push(error(MappingProblem::SharedExternal {
                    entries: field,
                    first: (*first).into(),
                    second: (*second).into(),
                    external: (*external).into(),
                }));
            }
            [only] => entries.push(*only),
            [] => {}
        }
    }
    Ok(Mappings {
        pod_cidr,
        external_cidr,
        entries: BTreeMap::from_iter(entries),
    })
}

/// A YAML value as an error shows it.
fn shown(v: &Value) -> String {
    v.as_str().map_or_else(|| format!("{v:?}"), str::to_owned)
}

/// An address of family `A` written as a YAML string.
fn address<A: FromStr>(v: &Value) -> Option<A> {
    v.as_str()?.parse().ok()
}

/// Keeps the first NatMapping of each cluster; later ones are errors.
pub fn one_per_cluster<'m>(
    mappings: impl IntoIterator<Item = &'m NatMapping>,
) -> (Vec<&'m NatMapping>, Vec<NatMappingError>) {
    let mut kept: BTreeMap<&str, &NatMapping> = BTreeMap::new();
    let mut errors = Vec::new();
    for mapping in mappings {
        match kept.entry(mapping.cluster_id.as_str()) {
            Entry::Vacant(slot) => {
                slot.insert(mapping);
            }
            Entry::Occupied(other) => {
                let other = other.get();
                errors.push(mapping.error(MappingProblem::DuplicateCluster {
                    cluster: mapping.cluster_id.clone(),
                    other: other.key.clone(),
                    other_file: other.origin.clone(),
                }));
            }
        }
    }
    (kept.into_values().collect(), errors)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::model::object::{Object, parse_documents};

    fn parse(yaml: &str) -> Result<NatMapping, NatMappingError> {
        let docs = parse_documents(Path::new("nm.yaml"), yaml);
        let Ok(Object::NatMapping(raw)) = &docs[0] else {
            panic!("{docs:?}")
        };
        NatMapping::from_raw(raw, "nm.yaml")
    }

    fn natmapping(body: &str) -> String {
        format!(
            "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata: {{name: nm-a}}\nspec:\n{body}"
        )
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn reads_the_liqo_shape() {
        let nm = parse(&natmapping(
            "  clusterID: cluster-a\n  podCIDR: 10.0.40.0/24\n  externalCIDR: 10.0.1.0/24\n  clusterMappings:\n    10.1.0.5: 10.0.1.45\n    169.254.0.1: 10.0.1.1\n",
        ))
        .unwrap();
        assert_eq!(nm.cluster_id, "cluster-a");
        assert_eq!(nm.ipv4.pod_cidr, Some("10.0.40.0/24".parse().unwrap()));
        assert_eq!(nm.ipv4.external_cidr, Some("10.0.1.0/24".parse().unwrap()));
        assert_eq!(
            nm.ipv4.entries.into_iter().collect::<Vec<_>>(),
            [
                (ip("10.0.1.1"), ip("169.254.0.1")),
                (ip("10.0.1.45"), ip("10.1.0.5"))
            ]
        );
        assert!(nm.rejected.is_empty());
    }

    /// A NatMapping Liqo's IPAM has just created has no entries: `{}`, or
    /// null from a nil Go map.
    #[test]
    fn an_empty_natmapping_is_accepted() {
        for entries in ["{}", "null", ""] {
            let nm = parse(&natmapping(&format!(
                "  clusterID: a\n  podCIDR: 10.0.40.0/24\n  externalCIDR: 10.0.1.0/24\n  clusterMappings: {entries}\n"
            )))
            .unwrap();
            assert!(
                nm.ipv4.entries.is_empty() && nm.rejected.is_empty(),
                "{entries}"
            );
        }
        let err = parse(&natmapping("  clusterID: a\n  externalCIDR: 10.0.1.0/33\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "nm.yaml: NatMapping nm-a: field spec.externalCIDR: \"10.0.1.0/33\" is not an IPv4 CIDR"
        );
    }

    #[test]
    fn a_bad_entry_costs_only_itself_and_names_its_field() {
        let nm = parse(&natmapping(
            "  clusterID: a\n  clusterMappings:\n    10.1.0.5: 192.168.0.45\n    10.1.0.7: 192.168.0.300\n    nonsense: 192.168.0.9\n",
        ))
        .unwrap();
        assert_eq!(nm.ipv4.entries.len(), 1);
        let errors: Vec<String> = nm.rejected.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "nm.yaml: NatMapping nm-a: field spec.clusterMappings.10.1.0.7: \"192.168.0.300\" is not an IPv4 address",
                "nm.yaml: NatMapping nm-a: field spec.clusterMappings.nonsense: \"nonsense\" is not an IPv4 address",
            ]
        );
    }

    #[test]
    fn the_ipv6_part_is_read_as_the_ipv4_one_and_a_bad_entry_costs_only_itself() {
        let nm = parse(&natmapping(
            "  clusterID: a\n  clusterMappings: {10.1.0.5: 10.0.1.45}\n  ipv6:\n    externalCIDR: fd00:10:0:1::/64\n    clusterMappings:\n      'fd00:10:1::5': 'fd00:10:0:1::45'\n      'fd00:10:1::6': 10.0.1.46\n",
        ))
        .unwrap();
        assert_eq!(nm.ipv4.entries.len(), 1);
        let ipv6 = nm.ipv6.as_ref().unwrap();
        assert_eq!(
            ipv6.external_cidr,
            Some("fd00:10:0:1::/64".parse().unwrap())
        );
        assert_eq!(
            ipv6.entries.iter().collect::<Vec<_>>(),
            [(
                &"fd00:10:0:1::45".parse::<Ipv6Addr>().unwrap(),
                &"fd00:10:1::5".parse::<Ipv6Addr>().unwrap()
            )]
        );
        let errors: Vec<String> = nm.rejected.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "nm.yaml: NatMapping nm-a: field spec.ipv6.clusterMappings.fd00:10:1::6: \"10.0.1.46\" is not an IPv6 address"
            ]
        );
        let err = parse(&natmapping(
            "  clusterID: a\n  ipv6:\n    podCIDR: 10.0.40.0/24\n",
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "nm.yaml: NatMapping nm-a: field spec.ipv6.podCIDR: \"10.0.40.0/24\" is not an IPv6 CIDR"
        );
        let err = parse(&natmapping("  clusterID: a\n  ipv6: [1]\n")).unwrap_err();
        assert_eq!(*err.problem, MappingProblem::NoIpv6);
    }

    #[test]
    fn two_endpoints_cannot_share_an_external_ip() {
        let nm = parse(&natmapping(
            "  clusterID: a\n  clusterMappings:\n    10.1.0.5: 192.168.0.45\n    10.1.0.6: 192.168.0.45\n    10.1.0.7: 192.168.0.47\n",
        ))
        .unwrap();
        assert_eq!(
            nm.ipv4.entries.into_iter().collect::<Vec<_>>(),
            [(ip("192.168.0.47"), ip("10.1.0.7"))]
        );
        assert_eq!(
            nm.rejected[0].to_string(),
            "nm.yaml: NatMapping nm-a: field spec.clusterMappings: endpoints 10.1.0.5 and 10.1.0.6 share externalIP 192.168.0.45"
        );
    }

    #[test]
    fn an_object_without_cluster_or_mappings_is_rejected() {
        let no_id =
            parse(&natmapping("  clusterMappings: {10.1.0.5: 192.168.0.45}\n")).unwrap_err();
        assert_eq!(
            no_id.to_string(),
            "nm.yaml: NatMapping nm-a: field spec.clusterID is missing"
        );
        let no_map = parse(&natmapping("  clusterID: a\n  clusterMappings: [1, 2]\n")).unwrap_err();
        assert_eq!(
            *no_map.problem,
            MappingProblem::NoMappings {
                field: "clusterMappings"
            }
        );
    }

    #[test]
    fn a_second_natmapping_for_a_cluster_is_refused() {
        let first = parse(&natmapping(
            "  clusterID: a\n  clusterMappings: {10.1.0.5: 192.168.0.45}\n",
        ))
        .unwrap();
        let mut second = first.clone();
        second.key.name = "nm-a2".into();
        let (kept, errors) = one_per_cluster([&first, &second]);
        assert_eq!(kept.len(), 1);
        assert_eq!(
            errors[0].to_string(),
            "nm.yaml: NatMapping nm-a2: field spec.clusterID: cluster a is already mapped by NatMapping nm-a in nm.yaml"
        );
    }
}
