//! The eBPF side, seen from userspace: loading, pinning and attaching the
//! programs, the typed maps, the diff that writes them, and devices.

pub mod batch;
pub mod conntrack;
pub mod dataplane;
pub mod layouts;
pub mod link;
pub mod maps;
pub mod netfilter;
pub mod peer_table;
pub mod pinned;
pub mod privileges;
pub mod room;
pub mod table;
