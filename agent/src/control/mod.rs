//! Where objects come from, how rival objects are arbitrated, and the loop
//! that drives the kernel tables, the roles and the status from them.

pub mod check;
pub mod election;
pub mod flows;
pub mod interval;
pub mod kubernetes;
pub mod liqo_wireguard;
pub mod options;
pub mod reconcile;
pub mod run;
pub mod source;
mod start;
pub mod status;

pub use start::run;
