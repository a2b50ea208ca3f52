//! The slow tier: the WireGuard rekey interop (over two minutes), timing
//! budgets, and the Liqo-peer lab's interop (a lab of its own).

mod liqo_peer_interop;
mod wireguard_go_interop;
