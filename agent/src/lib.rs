//! The Isthmus node agent, as a library: the binary parses arguments and
//! calls one of the [`commands`]; tests and tools reuse the rest.
//!
//! The layers, each using only those above it in this list:
//!
//! - [`sync`]: locks taken whether or not a holder panicked;
//! - [`model`]: what the Liqo objects mean, with no I/O;
//! - [`kernel`]: the eBPF programs and maps: loading, pinning, attaching,
//!   typed maps and the diff that writes them;
//! - [`tunnel`]: the gateway's embedded WireGuard;
//! - [`roles`]: what a gateway and a worker run beside the kernel tables;
//! - [`observe`]: metrics, health, counters and `inspect`;
//! - [`control`]: where objects come from, the arbitration between them, and
//!   the run loop that drives everything else;
//! - [`commands`]: each command of the binary, with its own options.

pub mod commands;
pub mod control;
pub mod kernel;
pub mod model;
pub mod observe;
pub mod roles;
pub mod sync;
pub mod tunnel;
