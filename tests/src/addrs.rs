//! The lab's pod addresses (docs/design.md#wan-and-nodes) in the octets the packet builders
//! take, as cluster a and its peer b see them; shared by the kernel tables.

use crate::packet::Addr;

/// a-pod1, on a's worker.
pub const A_POD1: Addr = [10, 244, 0, 5];
/// a-pod2, on a's gateway.
pub const A_POD2: Addr = [10, 244, 0, 133];
/// a-pod1 as b sees it.
pub const A_POD1_AT_B: Addr = [10, 0, 40, 5];
/// a-pod2 as b sees it.
pub const A_POD2_AT_B: Addr = [10, 0, 40, 133];
/// b-pod1 as a sees it.
pub const B_POD1: Addr = [10, 0, 0, 5];
