//! Types shared by the Isthmus kernel programs and the agent.
//!
//! Everything here is `#[repr(C)]` and lives in BPF maps, so the layout is
//! part of the contract between `isthmus-ebpf` and `isthmus-agent`.
#![no_std]

/// Fails the build unless `$t` has the size and alignment that both sides
/// of a map assume (as Cilium's `build_bug_on`): a field added, reordered
/// or widened on one side only would otherwise corrupt the map silently.
macro_rules! assert_layout {
    ($t:ty, size = $size:expr, align = $align:expr) => {
        const _: () = assert!(
            core::mem::size_of::<$t>() == $size && core::mem::align_of::<$t>() == $align,
            concat!("the layout of ", stringify!($t), " changed")
        );
    };
}

pub mod conntrack;
pub mod counters;
pub mod csum;
pub mod guard;
pub mod ipv4;
pub mod isolation;
#[cfg(feature = "user")]
pub mod liqo;
pub mod names;
pub mod nat;
pub mod overlay;
#[cfg(feature = "user")]
pub mod pins;
pub mod room;
pub mod tcp;
pub mod wire;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` structs of integers, with no padding.
    unsafe impl aya::Pod for crate::nat::PeerNat {}
    unsafe impl aya::Pod for crate::nat::PrefixRewrite {}
    unsafe impl aya::Pod for crate::nat::PeerKey {}
    unsafe impl aya::Pod for crate::nat::PrefixLens {}
    unsafe impl aya::Pod for crate::nat::MappingKey {}
    unsafe impl aya::Pod for crate::conntrack::FlowKey {}
    unsafe impl aya::Pod for crate::conntrack::FlowNat {}
    unsafe impl aya::Pod for crate::isolation::PeerFlow {}
    unsafe impl aya::Pod for crate::conntrack::SnatConfig {}
    unsafe impl aya::Pod for crate::guard::GuardSource {}
    unsafe impl aya::Pod for crate::guard::GuardConfig {}
    unsafe impl aya::Pod for crate::overlay::OverlayConfig {}
    unsafe impl aya::Pod for crate::isolation::AllowKey {}
    unsafe impl aya::Pod for crate::room::Room {}
    // SAFETY: a transparent u32.
    unsafe impl aya::Pod for crate::wire::Be32 {}
}
