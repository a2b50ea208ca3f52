//! The objects the agent reads, in the shape Liqo's network manager writes
//! them (`net.liqo.io/v1alpha1`), before validation.

use std::{collections::BTreeMap, fmt, path::Path};

use serde_yaml_ng::{Mapping, Value};
use thiserror::Error;

/// `namespace/name` of an object; cluster-scoped objects have no namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Where Liqo put a TunnelEndpoint's networks (docs/design.md#tunnelendpoint-fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Liqo v0.3.1 and later: every network in `spec`, under its own name.
    Spec,
    /// Liqo v0.2.1–v0.3.0: the peer's networks as `spec.podCIDR` and
    /// `spec.externalCIDR`, ours and every remapped one in `status`.
    Legacy,
    /// Liqo v1: a `Configuration`, with the peer's networks in `spec.remote`
    /// and our view of them in `status.remote`.
    LiqoV1,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Spec => "spec (Liqo v0.3.1+)",
            Layout::Legacy => "spec.podCIDR/externalCIDR and status (Liqo v0.2.1-v0.3.0)",
            Layout::LiqoV1 => "Configuration (Liqo v1)",
        })
    }
}

/// A TunnelEndpoint as read, with `spec` and `status` kept apart.
#[derive(Clone, Debug)]
pub struct RawTunnelEndpoint {
    /// Its `metadata`.
    pub key: ObjectKey,
    /// Its `metadata.creationTimestamp`, as the API server writes it
    /// (`YYYY-MM-DDThh:mm:ssZ`, which sorts as time does); None otherwise.
    pub created: Option<String>,
    /// Its `metadata.annotations`.
    pub annotations: Mapping,
    spec: Mapping,
    status: Mapping,
}

impl RawTunnelEndpoint {
    /// Builds one from its two halves (either may be empty).
    pub fn new(key: ObjectKey, spec: Mapping, status: Mapping) -> Self {
        Self {
            key,
            created: None,
            annotations: Mapping::new(),
            spec,
            status,
        }
    }

    /// The value of `spec.<field>`.
    pub fn field(&self, field: &str) -> Option<&Value> {
        self.spec.get(field)
    }

    /// The layout the object was written in: the v0.2.1–v0.3.0 one when
    /// its spec names the peer's PodCIDR `podCIDR` and not `remotePodCIDR`.
    pub fn layout(&self) -> Layout {
        if !self.spec.contains_key("remotePodCIDR") && self.spec.contains_key("podCIDR") {
            Layout::Legacy
        } else {
            Layout::Spec
        }
    }

    /// Network `field`, by its v0.3.1+ name, wherever the object's layout
    /// keeps it, with the name it goes by there (for errors).
    pub fn network(&self, field: &'static str) -> (&'static str, Option<&Value>) {
        // The IPv6 networks are in `spec.ipv6`, in every layout.
        if let Some(name) = field.strip_prefix("ipv6.") {
            return (field, self.spec.get("ipv6").and_then(|v| v.get(name)));
        }
        if self.layout() == Layout::Spec {
            return (field, self.spec.get(field));
        }
        match LEGACY_PATHS.iter().find(|(name, _)| *name == field) {
            Some((_, path)) => match path.split_once('.') {
                Some(("spec", key)) => (path, self.spec.get(key)),
                Some((_, key)) => (path, self.status.get(key)),
                None => (path, None),
            },
            None => (field, self.spec.get(field)),
        }
    }
}

/// Where Liqo v0.2.1–v0.3.0 kept each network.
const LEGACY_PATHS: [(&str, &str); 8] = [
    ("remotePodCIDR", "spec.podCIDR"),
    ("remoteExternalCIDR", "spec.externalCIDR"),
    ("localPodCIDR", "status.localPodCIDR"),
    ("localNATPodCIDR", "status.localNATPodCIDR"),
    ("remoteNATPodCIDR", "status.remoteNATPodCIDR"),
    ("localExternalCIDR", "status.localExternalCIDR"),
    ("localNATExternalCIDR", "status.localNATExternalCIDR"),
    ("remoteNATExternalCIDR", "status.remoteNATExternalCIDR"),
];

/// A NatMapping as read: cluster-scoped, its fields in `spec`.
#[derive(Clone, Debug)]
pub struct RawNatMapping {
    /// Its `metadata`.
    pub key: ObjectKey,
    /// Its `spec`.
    pub spec: Mapping,
}

/// A Kubernetes object read for a few of its fields (a Node, a Pod, an
/// EndpointSlice, a NamespaceOffloading): its name, labels and every
/// top-level field but `metadata`.
#[derive(Clone, Debug)]
pub struct RawObject {
    /// Its `metadata`.
    pub key: ObjectKey,
    /// Its `metadata.labels`.
    pub labels: Mapping,
    /// Its `metadata.resourceVersion`: empty in a file, the precondition of
    /// a write to the API server.
    pub version: String,
    /// Its other top-level fields (`spec`, `status`, an EndpointSlice's
    /// `endpoints`, …).
    pub body: Mapping,
}

impl RawObject {
    fn new(key: ObjectKey, labels: Mapping, version: String, body: Mapping) -> Self {
        Self {
            key,
            labels,
            version,
            body,
        }
    }

    /// The value at `path` (`["status", "podIP"]`), if every step is a
    /// mapping that holds the next.
    pub fn get(&self, path: &[&str]) -> Option<&Value> {
        let (first, rest) = path.split_first()?;
        rest.iter()
            .try_fold(self.body.get(*first)?, |value, step| value.get(*step))
    }

    /// The text of label `key`, if it has one.
    pub fn label(&self, key: &str) -> Option<String> {
        label_text(self.labels.get(key)?)
    }

    /// Every label with a text value, by key.
    pub fn label_texts(&self) -> BTreeMap<String, String> {
        self.labels
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), label_text(v)?)))
            .collect()
    }
}

/// YAML reads `"true"` as a string but an unquoted `true` (or a number)
/// as such; a label is text either way.
fn label_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// An object, or a field of one, that cannot be used: the origin, the
/// object and the problem, naming the field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{origin}: {kind} {object}: {problem}")]
pub struct ObjectError {
    /// Where the object came from.
    pub origin: String,
    /// Its kind.
    pub kind: ObjectKind,
    /// The object.
    pub object: ObjectKey,
    /// What is wrong, naming the field.
    pub problem: String,
}

/// The longest problem an object error carries: a problem quotes the
/// field's value, which an object's author may make megabytes long.
pub const PROBLEM_MAX: usize = 1024;

impl ObjectError {
    /// `problem` with `raw`, a `kind` read from `origin`; a problem past
    /// [`PROBLEM_MAX`] bytes is cut.
    pub fn new(origin: &str, kind: ObjectKind, raw: &RawObject, problem: String) -> Self {
        Self {
            origin: origin.to_owned(),
            kind,
            object: raw.key.clone(),
            problem: bounded(problem, PROBLEM_MAX),
        }
    }
}

/// `text` cut to `max` bytes on a character boundary, marked `...`.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let cut = (0..=max.saturating_sub(3))
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// One document of a source, recognised by its `apiVersion` and `kind`.
#[derive(Clone, Debug)]
pub enum Object {
    /// A `TunnelEndpoint`.
    TunnelEndpoint(RawTunnelEndpoint),
    /// A `NatMapping`.
    NatMapping(RawNatMapping),
    /// A `v1` `Node`.
    Node(RawObject),
    /// A `v1` `Pod`.
    Pod(RawObject),
    /// A `discovery.k8s.io/v1` `EndpointSlice`.
    EndpointSlice(RawObject),
    /// An `offloading.liqo.io/v1alpha1` `NamespaceOffloading`.
    NamespaceOffloading(RawObject),
    /// A `coordination.k8s.io/v1` `Lease`.
    Lease(RawObject),
    /// A Liqo v1 `Configuration`.
    Configuration(RawObject),
    /// A Liqo v1 `PublicKey`.
    PublicKey(RawObject),
    /// An `IsthmusGatewayServer`, Liqo v1's server side of a peering.
    IsthmusGatewayServer(RawObject),
    /// An `IsthmusGatewayClient`, Liqo v1's client side of a peering.
    IsthmusGatewayClient(RawObject),
    /// A Liqo v1 `IP`.
    Ip(RawObject),
}

/// A document that is not an object the agent reads.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DocumentError {
    /// The YAML itself is broken.
    #[error("{file}: document {index}: invalid YAML: {reason}")]
    Yaml {
        /// File holding the document.
        file: String,
        /// 1-based position of the document in the file.
        index: usize,
        /// What the parser said.
        reason: String,
    },
    /// Valid YAML of another kind.
    #[error(
        "{file}: document {index} ({name}): not an object Isthmus reads: apiVersion {api_version:?}, kind {kind:?} (field apiVersion/kind; want {})",
        ObjectKind::wanted()
    )]
    WrongKind {
        /// File holding the document.
        file: String,
        /// 1-based position of the document in the file.
        index: usize,
        /// `metadata.name`, or `<unnamed>`.
        name: String,
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
    /// The file could not be read.
    #[error("{file}: cannot read: {reason}")]
    Unreadable {
        /// The file.
        file: String,
        /// What the system said.
        reason: String,
    },
    /// An object with no `metadata.name`.
    #[error("{file}: document {index} ({kind}): field metadata.name is missing")]
    NoName {
        /// File holding the document.
        file: String,
        /// 1-based position of the document in the file.
        index: usize,
        /// Its `kind`.
        kind: String,
    },
}

/// Parses every document of a multi-document YAML file. A file holding
/// one JSON object (JSON is YAML too) takes a parser several times faster,
/// which a NatMapping of many thousand entries notices.
pub fn parse_documents(file: &Path, text: &str) -> Vec<Result<Object, DocumentError>> {
    let file = file.display().to_string();
    if text.trim_start().starts_with('{') {
        return vec![match serde_json::from_str::<Value>(text) {
            Ok(value) => object(&file, 1, value),
            Err(e) => Err(DocumentError::Yaml {
                file,
                index: 1,
                reason: e.to_string(),
            }),
        }];
    }
    if let Some(value) = plain_natmapping(text) {
        return vec![object(&file, 1, value)];
    }
    let mut documents = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        match serde::Deserialize::deserialize(doc) {
            Ok(Value::Null) => {}
            Ok(value) => documents.push(object(&file, index, value)),
            Err(e) => {
                // After a syntax error the rest of the stream cannot be trusted.
                documents.push(Err(DocumentError::Yaml {
                    file,
                    index,
                    reason: e.to_string(),
                }));
                break;
            }
        }
    }
    documents
}

/// Reads one object that arrived decoded, from the Kubernetes API; `origin`
/// names it in errors as a file name would.
pub fn from_decoded(
    origin: &str,
    decoded: &impl serde::Serialize,
) -> Result<Object, DocumentError> {
    match serde_yaml_ng::to_value(decoded) {
        Ok(value) => object(origin, 1, value),
        Err(e) => Err(DocumentError::Yaml {
            file: origin.to_owned(),
            index: 1,
            reason: e.to_string(),
        }),
    }
}

fn object(file: &str, index: usize, mut value: Value) -> Result<Object, DocumentError> {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    let api_version = text(value.get("apiVersion"));
    let kind = text(value.get("kind"));
    let metadata = value.get("metadata");
    let name = text(metadata.and_then(|m| m.get("name")));
    let Some(object_kind) = ObjectKind::of(&api_version, &kind) else {
        return Err(DocumentError::WrongKind {
            file: file.to_owned(),
            index,
            name: if name.is_empty() {
                "<unnamed>".into()
            } else {
                name
            },
            api_version,
            kind,
        });
    };
    if name.is_empty() {
        return Err(DocumentError::NoName {
            file: file.to_owned(),
            index,
            kind,
        });
    }
    let key = ObjectKey {
        namespace: text(metadata.and_then(|m| m.get("namespace"))),
        name,
    };
    let version = text(metadata.and_then(|m| m.get("resourceVersion")));
    let created = Some(text(metadata.and_then(|m| m.get("creationTimestamp"))))
        .filter(|t| is_api_timestamp(t));
    let mut metadata_map = |name: &str| match value
        .get_mut("metadata")
        .and_then(|m| m.get_mut(name))
        .map(std::mem::take)
    {
        Some(Value::Mapping(mapping)) => mapping,
        _ => Mapping::new(),
    };
    let labels = metadata_map("labels");
    let annotations = metadata_map("annotations");
    // Taken, not cloned: a NatMapping's spec may hold thousands of entries.
    let mut body = match value {
        Value::Mapping(body) => body,
        _ => Mapping::new(),
    };
    for field in ["apiVersion", "kind", "metadata"] {
        body.remove(field);
    }
    let mut half = |name: &str| match body.remove(name) {
        Some(Value::Mapping(mapping)) => mapping,
        _ => Mapping::new(),
    };
    Ok(match object_kind {
        ObjectKind::NatMapping => Object::NatMapping(RawNatMapping {
            key,
            spec: half("spec"),
        }),
        ObjectKind::TunnelEndpoint => {
            let spec = half("spec");
            let raw = RawTunnelEndpoint::new(key, spec, half("status"));
            Object::TunnelEndpoint(RawTunnelEndpoint {
                created,
                annotations,
                ..raw
            })
        }
        ObjectKind::Node => Object::Node(RawObject::new(key, labels, version, body)),
        ObjectKind::Pod => Object::Pod(RawObject::new(key, labels, version, body)),
        ObjectKind::EndpointSlice => {
            Object::EndpointSlice(RawObject::new(key, labels, version, body))
        }
        ObjectKind::NamespaceOffloading => {
            Object::NamespaceOffloading(RawObject::new(key, labels, version, body))
        }
        ObjectKind::Lease => Object::Lease(RawObject::new(key, labels, version, body)),
        ObjectKind::Configuration => {
            Object::Configuration(RawObject::new(key, labels, version, body))
        }
        ObjectKind::PublicKey => Object::PublicKey(RawObject::new(key, labels, version, body)),
        ObjectKind::IsthmusGatewayServer => {
            Object::IsthmusGatewayServer(RawObject::new(key, labels, version, body))
        }
        ObjectKind::IsthmusGatewayClient => {
            Object::IsthmusGatewayClient(RawObject::new(key, labels, version, body))
        }
        ObjectKind::Ip => Object::Ip(RawObject::new(key, labels, version, body)),
    })
}

/// Whether `t` has the one shape the API server writes timestamps in, in
/// which text order is time order.
fn is_api_timestamp(t: &str) -> bool {
    let shape = "0000-00-00T00:00:00Z";
    t.len() == shape.len()
        && t.bytes().zip(shape.bytes()).all(|(c, s)| match s {
            b'0' => c.is_ascii_digit(),
            _ => c == s,
        })
}

mod kind;
mod plain;

pub use kind::*;
pub use plain::plain_natmapping;

#[cfg(test)]
mod tests;
