//! The objects the agent reads, in the shape Liqo's network manager writes
//! them (`net.liqo.io/v1alpha1`), before validation.

use std::{fmt, path::Path};

use serde_yaml_ng::{Mapping, Value};
use thiserror::Error;

/// The API group and version of Liqo's objects the agent reads.
pub const API_VERSION: &str = "net.liqo.io/v1alpha1";
/// The API version of Kubernetes core objects.
pub const CORE_API_VERSION: &str = "v1";

/// A kind of object the agent reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// Liqo's per-peer object.
    TunnelEndpoint,
    /// Liqo's per-cluster DNAT table.
    NatMapping,
    /// A cluster node, read for the overlay: its PodCIDRs, its address and
    /// whether it is the gateway.
    Node,
}

impl ObjectKind {
    /// Every kind, in the order the agent reads them.
    pub const ALL: [ObjectKind; 3] = [Self::TunnelEndpoint, Self::NatMapping, Self::Node];

    /// The `kind` field of such an object.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TunnelEndpoint => "TunnelEndpoint",
            Self::NatMapping => "NatMapping",
            Self::Node => "Node",
        }
    }

    /// The `apiVersion` such an object carries.
    pub const fn api_version(self) -> &'static str {
        match self {
            Self::TunnelEndpoint | Self::NatMapping => API_VERSION,
            Self::Node => CORE_API_VERSION,
        }
    }

    /// The API's resource name of the kind.
    pub const fn plural(self) -> &'static str {
        match self {
            Self::TunnelEndpoint => "tunnelendpoints",
            Self::NatMapping => "natmappings",
            Self::Node => "nodes",
        }
    }

    /// The kind an object with these `apiVersion` and `kind` fields is, if
    /// the agent reads it.
    pub fn of(api_version: &str, kind: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.as_str() == kind)
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Where Liqo put a TunnelEndpoint's networks (DESIGN §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Liqo v0.3.1 and later: every network in `spec`, under its own name.
    Spec,
    /// Liqo v0.2.1–v0.3.0: the peer's networks as `spec.podCIDR` and
    /// `spec.externalCIDR`, ours and every remapped one in `status`.
    Legacy,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Spec => "spec (Liqo v0.3.1+)",
            Layout::Legacy => "spec.podCIDR/externalCIDR and status (Liqo v0.2.1-v0.3.0)",
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

/// A Kubernetes Node as read: the parts the overlay uses.
#[derive(Clone, Debug)]
pub struct RawNode {
    /// Its `metadata`.
    pub key: ObjectKey,
    /// Its `metadata.labels`.
    pub labels: Mapping,
    /// Its `spec`.
    pub spec: Mapping,
    /// Its `status`.
    pub status: Mapping,
}

/// One document of a source, recognised by its `apiVersion` and `kind`.
#[derive(Clone, Debug)]
pub enum Object {
    /// A `TunnelEndpoint`.
    TunnelEndpoint(RawTunnelEndpoint),
    /// A `NatMapping`.
    NatMapping(RawNatMapping),
    /// A `v1` `Node`.
    Node(RawNode),
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
        "{file}: document {index} ({name}): not an object Isthmus reads: apiVersion {api_version:?}, kind {kind:?} (field apiVersion/kind; want {API_VERSION} TunnelEndpoint or NatMapping, or {CORE_API_VERSION} Node)"
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

/// A NatMapping of 10,000 entries spends 9 ms in the YAML scanner, nearly
/// all of it on `spec.clusterMappings`. In the plain shape kubectl and Liqo
/// write (one `a.b.c.d: e.f.g.h` per line), that block is read here and the
/// scanner reads the rest. Any other shape, or a file of several documents,
/// returns None and goes to the scanner whole, which also reports errors.
///
/// The block's key is replaced by a sentinel before the scanner reads the
/// rest, and the result is kept only if the scanner finds that sentinel as
/// `spec.clusterMappings` and nowhere else: a look-alike block inside a
/// quoted or block scalar, or under another key, sends the file to the
/// scanner whole. Where it answers, it answers as the scanner would.
pub fn plain_natmapping(text: &str) -> Option<Value> {
    let lines: Vec<&str> = text.lines().collect();
    // YAML refuses a tab where it would indent, and any other control
    // character anywhere, and this reader does not tell where those are:
    // one anywhere sends the text to the scanner.
    if text.chars().any(refused_by_yaml)
        || lines
            .iter()
            .any(|l| l.starts_with("---") || l.starts_with("..."))
    {
        return None;
    }
    // The first `clusterMappings:` met while `spec:` is the open top-level
    // key, in one pass; the sentinel checks it is really spec's.
    let mut top = "";
    let start = lines.iter().position(|l| {
        if indent_of(l) == 0 && !l.trim().is_empty() {
            top = l.trim_end();
        }
        top == "spec:" && l.trim() == "clusterMappings:"
    })?;
    let indent = indent_of(lines[start]);
    let mut entries = Mapping::new();
    let mut end = start + 1;
    let entry_indent = indent_of(lines.get(end)?);
    while let Some(line) = lines
        .get(end)
        .filter(|l| indent_of(l) > indent && !l.trim().is_empty())
    {
        let (endpoint, external) = plain_pair(line)?;
        if indent_of(line) != entry_indent
            || entries
                .insert(
                    Value::String(endpoint.into()),
                    Value::String(external.into()),
                )
                .is_some()
        {
            return None;
        }
        end += 1;
    }
    // `clusterMappings:` with nothing under it is null to the scanner.
    if entries.is_empty() {
        return None;
    }
    // After a blank line, nothing may continue the block.
    if lines[end..]
        .iter()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| indent_of(l) > indent)
    {
        return None;
    }
    let placeholder = format!(
        "{}clusterMappings: {{{SENTINEL}: 0}}",
        &lines[start][..indent]
    );
    let rest = [&lines[..start], &[placeholder.as_str()], &lines[end..]]
        .concat()
        .join("\n");
    if rest.matches(SENTINEL).count() != 1 {
        return None;
    }
    let mut value: Value = serde_yaml_ng::from_str(&rest).ok()?;
    if value.get("kind").and_then(Value::as_str) != Some(ObjectKind::NatMapping.as_str()) {
        return None;
    }
    let slot = value.get_mut("spec")?.get_mut("clusterMappings")?;
    let sentinel = Mapping::from_iter([(Value::String(SENTINEL.into()), Value::from(0))]);
    if *slot != Value::Mapping(sentinel) {
        return None;
    }
    *slot = Value::Mapping(entries);
    Some(value)
}

/// Whether YAML may refuse `c` where this reader would take it: outside
/// YAML 1.2's printable set (a tab is in it, but not where it indents).
fn refused_by_yaml(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{fffe}' | '\u{ffff}')
}

/// The key the fast path puts in place of the block it read.
const SENTINEL: &str = "isthmus-fast-path-sentinel";

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `a.b.c.d: e.f.g.h`, both plain dotted quads, which YAML reads as strings.
fn plain_pair(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.trim().split_once(": ")?;
    let (key, value) = (key.trim_end(), value.trim_start());
    (dotted_quad(key) && dotted_quad(value)).then_some((key, value))
}

fn dotted_quad(s: &str) -> bool {
    s.split('.').count() == 4
        && s.split('.')
            .all(|part| (1..=3).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit()))
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
    let mut half = |name: &str| match value.get_mut(name).map(std::mem::take) {
        Some(Value::Mapping(mapping)) => mapping,
        _ => Mapping::new(),
    };
    Ok(match object_kind {
        ObjectKind::Node => Object::Node(RawNode {
            key,
            labels,
            spec: half("spec"),
            status: half("status"),
        }),
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

#[cfg(test)]
mod tests;
