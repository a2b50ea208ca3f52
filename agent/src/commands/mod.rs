//! The agent's commands, each a module with its own options and one entry
//! point that `main` calls: the top layer, above [`crate::control`].

pub mod check;
pub mod cleanup;
pub mod inspect;
pub mod interval;
pub mod liqo_wireguard;
pub mod policy;
pub mod pubkey;
pub mod run;
