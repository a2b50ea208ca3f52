//! The slow tier: the WireGuard rekey interop (over two minutes), the
//! timing budgets (a directory change reaches the kernel within 100 ms),
//! and the Liqo-peer lab's interop (a lab of its own).

mod dir_watch;
mod liqo_peer_interop;
mod wireguard_go_interop;
