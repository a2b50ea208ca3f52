//! Address writes that keep every checksum that covers the address valid.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_csum_diff,
    programs::TcContext,
};
use isthmus_common::{
    csum::replace4,
    ipv4,
    wire::{Be32, Be128},
};

use crate::parse::{IcmpError, Ip, PseudoCsum};

const PSEUDO: u64 = BPF_F_PSEUDO_HDR as u64;
/// A UDP checksum of zero means "none": the kernel leaves it so.
const UDP_ZERO_STAYS: u64 = BPF_F_MARK_MANGLED_0 as u64;

/// A kernel helper refused a write or a checksum update, possibly after
/// an earlier one of the same packet succeeded: its fields and checksums
/// may disagree, so it must not go on.
pub struct RewriteFailed;

/// Turns a helper's error into [`RewriteFailed`].
#[inline(always)]
fn done<E>(result: Result<(), E>) -> Result<(), RewriteFailed> {
    result.map_err(|_| RewriteFailed)
}

/// Writes `new` over the address at `field` of the packet's own header, and
/// updates the IP header checksum and the pseudo-header L4 checksum. The
/// L4 checksum goes through the kernel helper, which also handles
/// offloaded checksums (CHECKSUM_PARTIAL) and `skb->csum` correctly.
///
/// The source, which the egress rewrites, and the header checksum are
/// written straight into the packet, whose headers the parser made linear:
/// two helper calls fewer per packet. The header's sum does not change, so
/// neither does a CHECKSUM_COMPLETE `skb->csum`. The ingress, whose program
/// is near the verifier's budget (`verifier_budget`), keeps the helpers:
/// the bounds check costs it a path more per path through the NAT.
#[inline(always)]
pub fn set_addr(
    ctx: &TcContext,
    hdr: &Ip<Be32>,
    field: usize,
    old: Be32,
    new: Be32,
) -> Result<(), RewriteFailed> {
    let (old, new) = (old.to_bits(), new.to_bits());
    if field == ipv4::SRC {
        let ip = ctx.data() + hdr.off;
        if ip + ipv4::MIN_HLEN > ctx.data_end() {
            return Err(RewriteFailed);
        }
        // SAFETY: both fields lie in the IPv4 header, below the packet's
        // end as checked just above; TC programs may write packet data,
        // and the kernel unclones the skb first.
        unsafe {
            let ip = ip as *mut u8;
            let check = ip.add(ipv4::CHECK).cast::<u16>();
            check.write_unaligned(replace4(check.read_unaligned(), old, new));
            ip.add(field).cast::<u32>().write_unaligned(new);
        }
    } else {
        done(ctx.store(hdr.off + field, &new, 0))?;
        done(ctx.l3_csum_replace(hdr.off + ipv4::CHECK, old.into(), new.into(), 4))?;
    }
    match l4_pseudo(hdr.csum) {
        Some((off, flags)) => done(ctx.l4_csum_replace(off, old.into(), new.into(), flags | 4)),
        None => Ok(()),
    }
}

/// Where the L4 checksum over the pseudo-header is, and the flags its
/// helper takes.
#[inline(always)]
fn l4_pseudo(csum: PseudoCsum) -> Option<(usize, u64)> {
    match csum {
        PseudoCsum::None => None,
        PseudoCsum::Full(off) => Some((off, PSEUDO)),
        PseudoCsum::Udp(off) => Some((off, PSEUDO | UDP_ZERO_STAYS)),
    }
}

/// Writes `new` over the IPv6 address at `field` of the packet's own
/// header, and updates the L4 checksum over the pseudo-header. IPv6 has no
/// header checksum; the change's sum is taken once, and the helper folds it
/// in, offloaded checksums included.
#[inline(always)]
pub fn set_addr6(
    ctx: &TcContext,
    hdr: &Ip<Be128>,
    field: usize,
    old: Be128,
    new: Be128,
) -> Result<(), RewriteFailed> {
    done(ctx.store(hdr.off + field, &new, 0))?;
    match l4_pseudo(hdr.csum) {
        Some((off, flags)) => {
            let diff = diff16(old, new)?;
            done(ctx.l4_csum_replace(off, 0, diff, flags))
        }
        None => Ok(()),
    }
}

/// The one's-complement sum of the change from `old` to `new`, as the
/// checksum helpers take it.
#[inline(always)]
fn diff16(old: Be128, new: Be128) -> Result<u64, RewriteFailed> {
    let mut from = old.words().map(Be32::to_bits);
    let mut to = new.words().map(Be32::to_bits);
    // SAFETY: two 16-byte buffers on the stack, their sizes given.
    let diff = unsafe { bpf_csum_diff(from.as_mut_ptr(), 16, to.as_mut_ptr(), 16, 0) };
    u64::try_from(diff).map_err(|_| RewriteFailed)
}

/// Writes `new` over the IPv6 address at `field` of the header quoted in
/// an ICMPv6 error. The quoted header is plain data to the ICMPv6
/// checksum, which covers it; a quoted L4 checksum is updated here, and its
/// change folded into the ICMPv6 checksum too.
#[inline(always)]
pub fn set_quoted_addr6(
    ctx: &TcContext,
    err: &IcmpError<Be128>,
    field: usize,
    old: Be128,
    new: Be128,
) -> Result<(), RewriteFailed> {
    done(ctx.store(err.quoted.off + field, &new, 0))?;
    done(ctx.l4_csum_replace(err.check_off, 0, diff16(old, new)?, 0))?;
    let (old, new) = (old.words(), new.words());
    let change = |mut check| {
        for i in 0..4 {
            check = replace4(check, old[i].to_bits(), new[i].to_bits());
        }
        check
    };
    match err.quoted.csum {
        PseudoCsum::None => Ok(()),
        PseudoCsum::Full(off) => update_quoted_check(ctx, err.check_off, off, false, change),
        PseudoCsum::Udp(off) => update_quoted_check(ctx, err.check_off, off, true, change),
    }
}

/// Writes the 16-bit L4 field `new` (a port, an ICMP echo identifier, a
/// TCP MSS) over `old` at packet offset `off`, and updates the L4 checksum
/// at `check` (`udp`: where 0 means none).
#[inline(always)]
pub fn set_be16(
    ctx: &TcContext,
    off: usize,
    check: usize,
    udp: bool,
    old: u16,
    new: u16,
) -> Result<(), RewriteFailed> {
    let (old, new) = (old.to_be(), new.to_be());
    done(ctx.store(off, &new, 0))?;
    let flags = if udp { UDP_ZERO_STAYS } else { 0 };
    done(ctx.l4_csum_replace(check, old.into(), new.into(), flags | 2))
}

/// Writes `new` over the address at `field` of the header quoted in an ICMP
/// error. The quoted checksums are plain payload to the kernel, so they are
/// updated here; every word changed is then folded into the ICMP checksum.
#[inline(always)]
pub fn set_quoted_addr(
    ctx: &TcContext,
    err: &IcmpError<Be32>,
    field: usize,
    old: Be32,
    new: Be32,
) -> Result<(), RewriteFailed> {
    let quoted = &err.quoted;
    let (old, new) = (old.to_bits(), new.to_bits());
    done(ctx.store(quoted.off + field, &new, 0))?;
    done(ctx.l4_csum_replace(err.check_off, old.into(), new.into(), 4))?;
    let change = |check| replace4(check, old, new);
    update_quoted_check(ctx, err.check_off, quoted.off + ipv4::CHECK, false, change)?;
    match quoted.csum {
        PseudoCsum::None => Ok(()),
        PseudoCsum::Full(off) => update_quoted_check(ctx, err.check_off, off, false, change),
        PseudoCsum::Udp(off) => update_quoted_check(ctx, err.check_off, off, true, change),
    }
}

/// Updates the quoted checksum at `off` by `change`, for an address
/// change, and the ICMP checksum at `icmp_check` for the checksum's own
/// change.
#[inline(always)]
fn update_quoted_check(
    ctx: &TcContext,
    icmp_check: usize,
    off: usize,
    udp: bool,
    change: impl Fn(u16) -> u16,
) -> Result<(), RewriteFailed> {
    let before: u16 = ctx.load(off).map_err(|_| RewriteFailed)?;
    if udp && before == 0 {
        return Ok(());
    }
    let mut after = change(before);
    if udp && after == 0 {
        after = 0xffff;
    }
    done(ctx.store(off, &after, 0))?;
    done(ctx.l4_csum_replace(icmp_check, before.into(), after.into(), 2))
}
