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

pub mod budget;
pub mod conntrack;
pub mod counters;
pub mod csum;
pub mod guard;
pub mod ipv4;
pub mod ipv6;
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
    /// Declares map types plain old data for aya.
    macro_rules! plain {
        ($($ty:ty),* $(,)?) => {$(
            // SAFETY: a `#[repr(C)]` struct of integers with no padding
            // (each type's size is asserted where it is defined), or a
            // transparent integer: any bytes are a valid value.
            unsafe impl aya::Pod for $ty {}
        )*};
    }

    plain!(
        crate::nat::PeerNat,
        crate::nat::PeerNat<crate::wire::Be128>,
        crate::nat::PrefixRewrite,
        crate::nat::PeerKey,
        crate::nat::PeerKey<crate::wire::Be128>,
        crate::nat::MappingKey<crate::wire::Be128>,
        crate::nat::PrefixLens,
        crate::nat::MappingKey,
        crate::conntrack::FlowKey,
        crate::conntrack::FlowKey<crate::wire::Be128>,
        crate::conntrack::FlowNat,
        crate::conntrack::FlowNat<crate::wire::Be128>,
        crate::isolation::PeerFlow,
        crate::conntrack::SnatConfig,
        crate::conntrack::SnatConfig<crate::wire::Be128>,
        crate::guard::GuardSource,
        crate::guard::GuardSource<crate::wire::Be128>,
        crate::overlay::OverlayConfig,
        crate::isolation::AllowKey,
        crate::isolation::AllowKey<crate::wire::Be128>,
        crate::room::Room,
        crate::budget::Budget,
        crate::wire::Be16,
        crate::wire::Be32,
        crate::wire::Be128,
    );
}
