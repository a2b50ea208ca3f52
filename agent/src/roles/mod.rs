//! What runs beside the kernel tables on each kind of node: the gateway's
//! tunnel, guard, conncheck and peers' host names, the device its NAT
//! translates on, the routes into the tunnel and the blackholes behind
//! them, the overlay that brings workers' remote-bound traffic to the
//! gateway, the masquerade address, and the collector that shares the
//! flow tables among peers.

pub mod flows;
pub mod gateway;
pub mod masquerade;
pub mod nat_device;
pub mod overlay;
pub mod past_netfilter;
pub mod routes;
