//! The gateways' Lease, read one way for its two readers: the election
//! (`control::election`), which takes turns by it, and the overlay, whose
//! workers send remote-bound traffic to the node that holds it.

use serde_yaml_ng::Value;

use crate::model::object::{ObjectError, ObjectKey, ObjectKind, RawObject};

/// A `coordination.k8s.io/v1` Lease, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The Lease.
    pub key: ObjectKey,
    /// `spec.holderIdentity`: the node that holds it; none when nobody
    /// does (client-go empties it on release).
    pub holder: Option<String>,
    /// `spec.renewTime`, as written (compared, never parsed).
    pub renew_time: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
    /// `metadata.resourceVersion`, a write's precondition.
    pub resource_version: String,
}

impl LeaseRecord {
    /// Reads a Lease from `origin`.
    pub fn from_raw(raw: &RawObject, origin: &str) -> Result<Self, ObjectError> {
        let error = |problem: String| ObjectError::new(origin, ObjectKind::Lease, raw, problem);
        let text = |field: &str| match raw.get(&["spec", field]) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(other) => Err(error(format!(
                "field spec.{field}: {other:?} is not a string"
            ))),
        };
        let transitions = match raw.get(&["spec", "leaseTransitions"]) {
            None | Some(Value::Null) => 0,
            Some(value) => value
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| {
                    error(format!(
                        "field spec.leaseTransitions: {value:?} is not a 32-bit integer"
                    ))
                })?,
        };
        Ok(Self {
            key: raw.key.clone(),
            holder: text("holderIdentity")?.filter(|h| !h.is_empty()),
            renew_time: text("renewTime")?,
            transitions,
            resource_version: raw.version.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::object::{Object, parse_documents};

    fn lease(yaml: &str) -> Result<LeaseRecord, ObjectError> {
        match parse_documents(Path::new("lease.yaml"), yaml).pop() {
            Some(Ok(Object::Lease(raw))) => LeaseRecord::from_raw(&raw, "lease.yaml"),
            other => panic!("not a Lease: {other:?}"),
        }
    }

    /// A Lease as the API server returns it after the election wrote it.
    const LEASE: &str = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: isthmus-gateway\n  namespace: isthmus-system\n  resourceVersion: \"4711\"\n  uid: 0f1c5e6a-3c1d-4b8e-9a7d-2f4c6e8a1b3d\n  creationTimestamp: \"2026-11-24T10:00:00Z\"\n  managedFields: [{manager: isthmus-agent, operation: Update, apiVersion: coordination.k8s.io/v1}]\nspec:\n  holderIdentity: a-gw\n  leaseDurationSeconds: 1\n  acquireTime: \"2026-11-24T10:00:00.000000Z\"\n  renewTime: \"2026-11-24T10:00:05.200000Z\"\n  leaseTransitions: 3\n";

    #[test]
    fn a_lease_names_the_active_gateway_and_a_forged_holder_is_refused() {
        let held = lease(LEASE).unwrap();
        assert_eq!(held.holder.as_deref(), Some("a-gw"));
        assert_eq!(held.key.to_string(), "isthmus-system/isthmus-gateway");
        // Released (client-go empties it) or never held: nobody.
        for released in ["holderIdentity: \"\"", "holderIdentity: null"] {
            let text = LEASE.replace("holderIdentity: a-gw", released);
            assert_eq!(lease(&text).unwrap().holder, None, "{released}");
        }
        let forged = LEASE.replace("holderIdentity: a-gw", "holderIdentity: [a-gw, a-gw2]");
        assert!(lease(&forged).unwrap_err().to_string().starts_with(
            "lease.yaml: Lease isthmus-system/isthmus-gateway: field spec.holderIdentity:"
        ),);
    }

    #[test]
    fn a_lease_gives_the_election_its_renewal_transitions_and_version() {
        let held = lease(LEASE).unwrap();
        assert_eq!(
            (held.renew_time.as_deref(), held.transitions),
            (Some("2026-11-24T10:00:05.200000Z"), 3)
        );
        assert_eq!(held.resource_version, "4711");
        let fresh = LEASE.replace("  leaseTransitions: 3\n", "");
        assert_eq!(lease(&fresh).unwrap().transitions, 0);
        let forged = LEASE.replace("leaseTransitions: 3", "leaseTransitions: 4294967296");
        assert!(
            lease(&forged)
                .unwrap_err()
                .to_string()
                .contains("field spec.leaseTransitions: "),
        );
    }
}
