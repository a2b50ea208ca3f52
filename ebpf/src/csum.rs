//! Address writes that keep every checksum that covers the address valid.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use isthmus_common::{csum::replace4, ipv4, wire::Be32};

use crate::parse::{IcmpError, Ipv4, PseudoCsum};

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
    hdr: &Ipv4,
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
    let (off, flags) = match hdr.csum {
        PseudoCsum::None => return Ok(()),
        PseudoCsum::Tcp(off) => (off, PSEUDO),
        PseudoCsum::Udp(off) => (off, PSEUDO | UDP_ZERO_STAYS),
    };
    done(ctx.l4_csum_replace(off, old.into(), new.into(), flags | 4))
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
    err: &IcmpError,
    field: usize,
    old: Be32,
    new: Be32,
) -> Result<(), RewriteFailed> {
    let quoted = &err.quoted;
    let (old, new) = (old.to_bits(), new.to_bits());
    done(ctx.store(quoted.off + field, &new, 0))?;
    done(ctx.l4_csum_replace(err.check_off, old.into(), new.into(), 4))?;
    update_quoted_check(
        ctx,
        err.check_off,
        quoted.off + ipv4::CHECK,
        old,
        new,
        false,
    )?;
    match quoted.csum {
        PseudoCsum::None => Ok(()),
        PseudoCsum::Tcp(off) => update_quoted_check(ctx, err.check_off, off, old, new, false),
        PseudoCsum::Udp(off) => update_quoted_check(ctx, err.check_off, off, old, new, true),
    }
}

/// Updates the quoted checksum at `off` for an address change from `old` to
/// `new`, and the ICMP checksum at `icmp_check` for the checksum's own change.
#[inline(always)]
fn update_quoted_check(
    ctx: &TcContext,
    icmp_check: usize,
    off: usize,
    old: u32,
    new: u32,
    udp: bool,
) -> Result<(), RewriteFailed> {
    let before: u16 = ctx.load(off).map_err(|_| RewriteFailed)?;
    if udp && before == 0 {
        return Ok(());
    }
    let mut after = replace4(before, old, new);
    if udp && after == 0 {
        after = 0xffff;
    }
    done(ctx.store(off, &after, 0))?;
    done(ctx.l4_csum_replace(icmp_check, before.into(), after.into(), 2))
}
