//! TCP MSS clamping on the tunnel device (`isthmus_common::tcp`): a SYN or
//! SYN-ACK of a peer's traffic, either way, advertises no larger segment
//! than the tunnel carries.

use aya_ebpf::programs::TcContext;
use isthmus_common::tcp::{self, DATA_OFFSET, MIN_HEADER};

use crate::{
    csum,
    parse::{Malformed, Transport},
};

/// Lowers the MSS option of `t`, a TCP SYN whose checksum is at `check`,
/// to `max` if it advertises more. Returns whether it did.
#[inline(always)]
pub fn clamp(ctx: &TcContext, t: &Transport, check: usize, max: u16) -> Result<bool, Malformed> {
    let data_offset: u8 = ctx.load(t.off + DATA_OFFSET).map_err(|_| Malformed)?;
    let header = usize::from(data_offset >> 4) * 4;
    if header <= MIN_HEADER {
        return Ok(false);
    }
    let options = t.off + MIN_HEADER;
    let Some(at) = tcp::mss_value_offset(header - MIN_HEADER, |i| ctx.load::<u8>(options + i).ok())
    else {
        return Ok(false);
    };
    let mss = u16::from_be(ctx.load::<u16>(options + at).map_err(|_| Malformed)?);
    if mss <= max {
        return Ok(false);
    }
    csum::set_be16(ctx, options + at, check, false, mss, max)?;
    Ok(true)
}
