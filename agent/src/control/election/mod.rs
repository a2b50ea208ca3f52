//! The gateways' election, as it meets the API server: [`lease`] reads and
//! writes the Lease, and [`elector`] takes the turns of the protocol that
//! `model::election` holds, and labels the pods.

pub mod elector;
pub mod lease;
