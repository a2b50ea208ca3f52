//! Structs handed to helpers, zeroed on the stack without `memset`.
//!
//! LLVM merges a run of zero stores into a `memset`, and the BPF target
//! emits that as a call to a byte-by-byte loop: a subprogram call, and its
//! return through the CPU's return-thunk mitigation, on every packet.

use core::mem::{MaybeUninit, align_of, size_of};

/// `slot` zeroed word by word, as a `T`.
///
/// # Safety
/// All-zero must be a valid `T`, as it is for the C structs of helpers'
/// arguments.
#[inline(always)]
pub unsafe fn zeroed<T>(slot: &mut MaybeUninit<T>) -> &mut T {
    // Word stores: the verifier refuses misaligned stack writes.
    const { assert!(size_of::<T>().is_multiple_of(4) && align_of::<T>() >= 4) };
    let words = slot.as_mut_ptr().cast::<u32>();
    for i in 0..size_of::<T>() / 4 {
        // SAFETY: within `slot`, which is aligned for u32. Volatile, so
        // that LLVM cannot merge the stores back into a `memset`.
        unsafe { words.add(i).write_volatile(0) };
    }
    // SAFETY: every byte was written, and the caller vouches for all-zero.
    unsafe { slot.assume_init_mut() }
}
