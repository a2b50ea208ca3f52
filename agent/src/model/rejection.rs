//! The one shape of every object error: what the object is, the problem
//! naming its field (for the object's own status), and the whole message
//! naming the origin too (for logs).

use crate::model::{
    natmapping::NatMappingError,
    object::{DocumentError, ObjectError, ObjectKey, ObjectKind},
    peer::PeerError,
};

/// An object, or one entry of it, that is not programmed, and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rejection {
    /// The object's kind and key; None for a document that names no object.
    pub object: Option<(ObjectKind, ObjectKey)>,
    /// What is wrong, naming the field, for the object's own status.
    pub problem: String,
    /// The whole message, naming the origin too, for logs.
    pub message: String,
}

impl Rejection {
    /// The object's kind and key for log fields; empty for a document that
    /// names no object.
    pub fn kind_and_key(&self) -> (&'static str, String) {
        self.object
            .as_ref()
            .map_or(("", String::new()), |(kind, key)| {
                (kind.as_str(), key.to_string())
            })
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<PeerError> for Rejection {
    fn from(e: PeerError) -> Self {
        Self {
            object: Some((e.kind, e.object.clone())),
            problem: e.problem.to_string(),
            message: e.to_string(),
        }
    }
}

impl From<NatMappingError> for Rejection {
    fn from(e: NatMappingError) -> Self {
        Self {
            object: Some((ObjectKind::NatMapping, e.object.clone())),
            problem: e.problem.to_string(),
            message: e.to_string(),
        }
    }
}

impl From<ObjectError> for Rejection {
    fn from(e: ObjectError) -> Self {
        Self {
            object: Some((e.kind, e.object.clone())),
            problem: e.problem.clone(),
            message: e.to_string(),
        }
    }
}

impl From<DocumentError> for Rejection {
    fn from(e: DocumentError) -> Self {
        Self {
            object: None,
            problem: e.to_string(),
            message: e.to_string(),
        }
    }
}
