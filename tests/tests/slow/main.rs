//! The slow tests: the WireGuard rekey interop and a silent peer's rounds
//! of handshakes (minutes of timers each, which `cargo xtask test` runs
//! beside the lab tier), the timing budgets (a
//! directory change reaches the kernel within 100 ms), and the Liqo-peer
//! labs' interop (v0.10's and v1's, each a lab of its own).

mod dir_watch;
mod liqo_v0_10_interop;
mod liqo_v1_api;
mod liqo_v1_interop;
mod silent_peer;
mod wireguard_go_interop;
