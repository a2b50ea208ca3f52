//! Where objects come from, how rival objects are arbitrated, and the loop
//! that drives the kernel tables, the roles and the status from them.

pub mod election;
pub mod kubernetes;
pub mod reconcile;
pub mod run;
pub mod source;
mod stages;
pub mod status;
