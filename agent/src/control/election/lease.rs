//! The election's Lease on the API server: read, created, and written with
//! the `resourceVersion` it was read at as the precondition, so that of two
//! writers of one version the second gets `409 Conflict`.

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};

use thiserror::Error;

use crate::model::election::{Step, Timings};
use crate::model::{
    lease::LeaseRecord,
    object::{self, Object, ObjectError},
};

/// The Lease the gateways of one cluster elect by.
pub struct LeaseClient {
    api: Api<Lease>,
    name: String,
}

impl LeaseClient {
    /// Lease `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Lease as it is now, if it exists.
    pub async fn read(&self) -> Result<Option<Lease>, kube::Error> {
        self.api.get_opt(&self.name).await
    }

    /// Carries out `step` for `identity` on `current` (the Lease as read).
    /// Returns the record written, or None when another writer came first.
    pub async fn write(
        &self,
        step: &Step,
        current: Option<&Lease>,
        identity: &str,
        timings: Timings,
    ) -> Result<Option<LeaseRecord>, LeaseError> {
        let now = MicroTime(Timestamp::now());
        // The Lease to write, its transitions, and whether we take it now
        // (a renewal keeps the `acquireTime` it had).
        let (mut lease, transitions, acquired) = match (step, current) {
            (Step::Follow { .. }, _) | (Step::Write { .. }, None) => return Ok(None),
            (Step::Create, _) => {
                let metadata = ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                };
                let lease = Lease {
                    metadata,
                    spec: None,
                };
                (lease, 0, true)
            }
            (
                Step::Write {
                    resource_version,
                    transitions,
                    renewal,
                },
                Some(current),
            ) => {
                let mut lease = current.clone();
                // The version read is the precondition, whatever the copy says.
                lease.metadata.resource_version = Some(resource_version.clone());
                (lease, *transitions, !renewal)
            }
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if acquired {
            spec.acquire_time = Some(now.clone());
        }
        spec.lease_transitions = Some(transitions);
        spec.holder_identity = Some(identity.to_owned());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(whole_seconds(timings));
        let params = PostParams::default();
        let written = match step {
            Step::Create => self.api.create(&params, &lease).await,
            _ => self.api.replace(&self.name, &params, &lease).await,
        };
        match written {
            Ok(lease) => Ok(Some(record(&lease)?)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The Lease as the election reads it: the API server's answer, read as
/// every Lease is ([`LeaseRecord::from_raw`]).
pub fn record(lease: &Lease) -> Result<LeaseRecord, LeaseError> {
    let origin = "the API server's Lease";
    match object::from_decoded(origin, lease) {
        Ok(Object::Lease(raw)) => Ok(LeaseRecord::from_raw(&raw, origin)?),
        Ok(other) => Err(LeaseError::NotALease(format!("{other:?}"))),
        Err(e) => Err(LeaseError::NotALease(e.to_string())),
    }
}

/// Why a read or a write of the Lease gave no record.
#[derive(Debug, Error)]
pub enum LeaseError {
    /// The API server refused or failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// It answered with a Lease the election cannot use.
    #[error(transparent)]
    Unusable(#[from] ObjectError),
    /// It answered with something that is not a Lease.
    #[error("not a Lease: {0}")]
    NotALease(String),
}

/// The API's field counts whole seconds; other clients (kubectl, client-go)
/// read it, so it is rounded up, never down.
fn whole_seconds(timings: Timings) -> i32 {
    let millis = timings.lease_duration.as_millis();
    i32::try_from(millis.div_ceil(1000)).unwrap_or(i32::MAX)
}
