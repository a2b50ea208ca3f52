//! TCP MSS clamping on the tunnel device (`isthmus_common::tcp`): a SYN or
//! SYN-ACK of a peer's traffic, either way, advertises no larger segment
//! than the tunnel carries.

use aya_ebpf::programs::TcContext;
use isthmus_common::tcp::{self, DATA_OFFSET, MIN_HEADER};

use crate::parse::{Malformed, Transport};

/// An MSS option that advertises more than the tunnel carries.
pub struct Oversized {
    /// Packet offset of the option's value.
    pub off: usize,
    /// The value advertised.
    pub mss: u16,
}

/// The MSS option of `t`, a TCP SYN, if it advertises more than `max`.
/// Only reads: the NAT rewrites it with the packet's other fields.
#[inline(always)]
pub fn oversized(ctx: &TcContext, t: &Transport, max: u16) -> Result<Option<Oversized>, Malformed> {
    let data_offset: u8 = ctx.load(t.off + DATA_OFFSET).map_err(|_| Malformed)?;
    let header = usize::from(data_offset >> 4) * 4;
    if header <= MIN_HEADER {
        return Ok(None);
    }
    let options = t.off + MIN_HEADER;
    let Some(at) = tcp::mss_value_offset(header - MIN_HEADER, |i| ctx.load::<u8>(options + i).ok())
    else {
        return Ok(None);
    };
    let off = options + at;
    let mss = u16::from_be(ctx.load::<u16>(off).map_err(|_| Malformed)?);
    Ok((mss > max).then_some(Oversized { off, mss }))
}
