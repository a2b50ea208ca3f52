//! TUN offloads, as a NIC driver would do them. With `IFF_VNET_HDR` every
//! packet on the device carries a virtio-net header, which lets the kernel
//! hand us TCP super-packets of up to 64 KiB (TSO) with the checksum left to
//! us, and lets us hand it super-packets back (GRO). One read or write then
//! moves dozens of packets: per-packet system calls and stack traversals are
//! what a userspace tunnel spends most of its time on.
//!
//! Packet maths only, no I/O: [`split`] turns what the device gives us into
//! wire-sized packets, and [`Coalescer`] merges decrypted TCP segments of one
//! flow before they are written.

use isthmus_common::csum::fold;
use thiserror::Error;

/// Length of the virtio-net header before every packet on the device.
pub const VNET_HDR_LEN: usize = 10;
/// The largest IPv4 packet, so the largest super-packet.
pub const MAX_PACKET: usize = 65535;
/// The largest frame on the device: header and super-packet.
pub const MAX_FRAME: usize = VNET_HDR_LEN + MAX_PACKET;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_ECN: u8 = 0x80;

const TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;
/// Offset of the TCP checksum in its header.
const TCP_CSUM: usize = 16;
/// Segments merged into one super-packet at most, as Linux GRO (`MAX_GRO_SKBS`).
const MAX_SEGMENTS: u16 = 64;

/// The virtio-net header (`struct virtio_net_hdr`, in host byte order as a
/// legacy TUN device uses it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`.
    pub gso_type: u8,
    /// Length of the headers before the payload.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts, for `NEEDS_CSUM`.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    fn parse(frame: &[u8]) -> Result<Self, OffloadError> {
        let b = frame.get(..VNET_HDR_LEN).ok_or(OffloadError::Truncated)?;
        let word = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Ok(Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: word(2),
            gso_size: word(4),
            csum_start: word(6),
            csum_offset: word(8),
        })
    }

    /// Writes the header into the first [`VNET_HDR_LEN`] bytes of `frame`.
    pub fn write(&self, frame: &mut [u8]) {
        frame[0] = self.flags;
        frame[1] = self.gso_type;
        for (i, word) in [
            self.hdr_len,
            self.gso_size,
            self.csum_start,
            self.csum_offset,
        ]
        .into_iter()
        .enumerate()
        {
            frame[2 + 2 * i..4 + 2 * i].copy_from_slice(&word.to_ne_bytes());
        }
    }
}

/// Why a frame from the device could not be turned into packets.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OffloadError {
    /// Shorter than the headers it declares.
    #[error("frame shorter than its headers")]
    Truncated,
    /// A segmentation type we never offered the kernel.
    #[error("GSO type {0:#x} was not offered")]
    UnsupportedGso(u8),
    /// A TSO frame that is not IPv4 TCP, or has no segment size.
    #[error("TSO frame is not segmentable IPv4 TCP")]
    NotTcp4,
    /// The checksum to complete lies outside the packet.
    #[error("checksum offset outside the packet")]
    BadChecksumOffset,
}

/// Turns one frame read from the device into wire-sized packets, completing
/// the checksums the kernel left to us, and hands each to `emit`. `scratch`
/// must hold the largest packet. Returns how many packets were emitted.
pub fn split(
    frame: &mut [u8],
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<usize, OffloadError> {
    let hdr = VnetHdr::parse(frame)?;
    let packet = &mut frame[VNET_HDR_LEN..];
    match hdr.gso_type & !GSO_ECN {
        GSO_NONE => {
            if hdr.flags & F_NEEDS_CSUM != 0 {
                complete_checksum(packet, hdr.csum_start.into(), hdr.csum_offset.into())?;
            }
            emit(packet);
            Ok(1)
        }
        GSO_TCPV4 => segment_tcp4(packet, hdr.gso_size.into(), scratch, emit),
        other => Err(OffloadError::UnsupportedGso(other)),
    }
}

/// Finishes a partial checksum: the field holds the pseudo-header sum, and
/// everything from `start` is summed into it.
fn complete_checksum(packet: &mut [u8], start: usize, offset: usize) -> Result<(), OffloadError> {
    let at = start + offset;
    if at + 2 > packet.len() {
        return Err(OffloadError::BadChecksumOffset);
    }
    // As the kernel's skb_checksum_help: a zero result is sent as 0xffff,
    // which for UDP means "checksummed" rather than "no checksum".
    let csum = match !fold(sum(&packet[start..])) {
        0 => 0xffff,
        c => c,
    };
    packet[at..at + 2].copy_from_slice(&csum.to_ne_bytes());
    Ok(())
}

/// The IPv4 and TCP header lengths of `packet`, checked against its length.
fn tcp4_headers(packet: &[u8]) -> Option<(usize, usize)> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    if packet[0] >> 4 != 4 || ihl < 20 || *packet.get(9)? != TCP {
        return None;
    }
    let thl = usize::from(packet.get(ihl + 12)? >> 4) * 4;
    (thl >= 20 && packet.len() >= ihl + thl).then_some((ihl, thl))
}

/// Cuts a TSO super-packet into segments of `mss` payload bytes, each with
/// its own length, IP id, sequence number and checksums, as
/// `tcp_gso_segment` would. FIN and PSH stay on the last segment only, CWR
/// on the first only.
fn segment_tcp4(
    packet: &[u8],
    mss: usize,
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<usize, OffloadError> {
    let (ihl, thl) = tcp4_headers(packet).ok_or(OffloadError::NotTcp4)?;
    if mss == 0 {
        return Err(OffloadError::NotTcp4);
    }
    let headers = ihl + thl;
    let payload = &packet[headers..];
    let id = u16::from_be_bytes([packet[4], packet[5]]);
    let seq = u32::from_be_bytes(packet[ihl + 4..ihl + 8].try_into().unwrap());
    let count = payload.len().div_ceil(mss).max(1);
    for i in 0..count {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        let segment = &mut scratch[..headers + chunk.len()];
        segment[..headers].copy_from_slice(&packet[..headers]);
        segment[headers..].copy_from_slice(chunk);
        segment[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        segment[ihl + 4..ihl + 8]
            .copy_from_slice(&seq.wrapping_add((i * mss) as u32).to_be_bytes());
        if i + 1 < count {
            segment[ihl + 13] &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            segment[ihl + 13] &= !TCP_CWR;
        }
        finish_tcp4(segment, ihl);
        emit(segment);
    }
    Ok(count)
}

/// Sets the IP total length and both checksums of a complete segment.
fn finish_tcp4(segment: &mut [u8], ihl: usize) {
    let total = segment.len() as u16;
    segment[2..4].copy_from_slice(&total.to_be_bytes());
    segment[10..12].fill(0);
    let ip_csum = !fold(sum(&segment[..ihl]));
    segment[10..12].copy_from_slice(&ip_csum.to_ne_bytes());
    segment[ihl + TCP_CSUM..ihl + TCP_CSUM + 2].fill(0);
    let tcp_csum = !fold(pseudo_header(segment, ihl) + sum(&segment[ihl..]));
    segment[ihl + TCP_CSUM..ihl + TCP_CSUM + 2].copy_from_slice(&tcp_csum.to_ne_bytes());
}

/// The TCP pseudo-header's sum for `packet`'s addresses and L4 length.
fn pseudo_header(packet: &[u8], ihl: usize) -> u32 {
    let l4_len = (packet.len() - ihl) as u16;
    let [hi, lo] = l4_len.to_be_bytes();
    sum(&packet[12..20]) + sum(&[0, TCP, hi, lo])
}

/// The ones' complement sum of `bytes`, folded to 16 bits (a few such sums
/// add up in a `u32` before [`fold`]). Words are read in memory order,
/// which RFC 1071 (§2 B) shows gives the same bytes once folded and stored
/// back in memory order, so no byte is ever swapped.
fn sum(bytes: &[u8]) -> u32 {
    let mut words = bytes.chunks_exact(4);
    let mut acc: u64 = (&mut words)
        .map(|w| u64::from(u32::from_ne_bytes(w.try_into().unwrap())))
        .sum();
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc += u64::from(u32::from_ne_bytes(tail));
    // 2^32 ≡ 1 modulo 0xffff: folding the halves keeps the sum.
    let acc = (acc & 0xffff_ffff) + (acc >> 32);
    let acc = (acc & 0xffff_ffff) + (acc >> 32);
    u32::from(fold(acc as u32))
}

/// Whether `packet`'s TCP checksum is right.
fn tcp4_checksum_ok(packet: &[u8], ihl: usize) -> bool {
    fold(pseudo_header(packet, ihl) + sum(&packet[ihl..])) == 0xffff
}

/// One super-packet being built: a frame (header room, then the first
/// segment's headers, then every segment's payload).
struct Slot {
    frame: Vec<u8>,
    /// Bytes of the frame in use.
    len: usize,
    ihl: usize,
    headers: usize,
    /// Payload bytes per segment: the first segment's.
    mss: usize,
    segments: u16,
    next_seq: u32,
    /// A short or PSH segment ends a super-packet, as in `tcp_gro_receive`.
    closed: bool,
}

impl Slot {
    fn packet(&self) -> &[u8] {
        &self.frame[VNET_HDR_LEN..self.len]
    }

    fn flow(&self) -> &[u8] {
        flow(self.packet(), self.ihl)
    }

    /// Starts a super-packet with `packet`, a coalescable segment.
    fn open(&mut self, packet: &[u8], ihl: usize, headers: usize) {
        self.frame[VNET_HDR_LEN..VNET_HDR_LEN + packet.len()].copy_from_slice(packet);
        self.len = VNET_HDR_LEN + packet.len();
        self.ihl = ihl;
        self.headers = headers;
        self.mss = packet.len() - headers;
        self.segments = 1;
        self.next_seq = seq(packet, ihl).wrapping_add(self.mss as u32);
        self.closed = flags(packet, ihl) & TCP_PSH != 0;
    }

    /// Appends `packet`'s payload if it continues this super-packet.
    fn append(&mut self, packet: &[u8], ihl: usize, headers: usize) -> bool {
        let payload = &packet[headers..];
        let fits = !self.closed
            && self.segments < MAX_SEGMENTS
            && ihl == self.ihl
            && headers == self.headers
            && payload.len() <= self.mss
            && self.len - VNET_HDR_LEN + payload.len() <= MAX_PACKET
            && seq(packet, ihl) == self.next_seq
            && same_headers(self.packet(), packet, ihl, headers);
        if !fits {
            return false;
        }
        self.frame[self.len..self.len + payload.len()].copy_from_slice(payload);
        self.len += payload.len();
        self.segments += 1;
        self.next_seq = self.next_seq.wrapping_add(payload.len() as u32);
        let psh = flags(packet, ihl) & TCP_PSH;
        self.frame[VNET_HDR_LEN + ihl + 13] |= psh;
        self.closed = payload.len() < self.mss || psh != 0;
        true
    }

    /// The frame to write: the packet as it came if it is alone, otherwise
    /// a super-packet whose TCP checksum the kernel is told to complete.
    fn finish(&mut self) -> &[u8] {
        let mut hdr = VnetHdr::default();
        if self.segments > 1 {
            let (ihl, len) = (self.ihl, self.len);
            let packet = &mut self.frame[VNET_HDR_LEN..len];
            let total = packet.len() as u16;
            packet[2..4].copy_from_slice(&total.to_be_bytes());
            packet[10..12].fill(0);
            let ip_csum = !fold(sum(&packet[..ihl]));
            packet[10..12].copy_from_slice(&ip_csum.to_ne_bytes());
            let partial = fold(pseudo_header(packet, ihl));
            packet[ihl + TCP_CSUM..ihl + TCP_CSUM + 2].copy_from_slice(&partial.to_ne_bytes());
            hdr = VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: self.headers as u16,
                gso_size: self.mss as u16,
                csum_start: ihl as u16,
                csum_offset: TCP_CSUM as u16,
            };
        }
        hdr.write(&mut self.frame);
        &self.frame[..self.len]
    }
}

fn seq(packet: &[u8], ihl: usize) -> u32 {
    u32::from_be_bytes(packet[ihl + 4..ihl + 8].try_into().unwrap())
}

fn flags(packet: &[u8], ihl: usize) -> u8 {
    packet[ihl + 13]
}

/// Addresses and ports: what names a flow.
fn flow(packet: &[u8], ihl: usize) -> &[u8] {
    &packet[12..ihl + 4]
}

/// Whether two segments' headers agree on everything but length, IP id and
/// checksums, sequence number and PSH, as `tcp_gro_receive` requires.
fn same_headers(a: &[u8], b: &[u8], ihl: usize, headers: usize) -> bool {
    let (ta, tb) = (&a[ihl..headers], &b[ihl..headers]);
    a[..2] == b[..2]
        && a[6..10] == b[6..10]
        && a[12..ihl] == b[12..ihl]
        && ta[..4] == tb[..4]
        && ta[8..13] == tb[8..13]
        && ta[13] & !TCP_PSH == tb[13] & !TCP_PSH
        && ta[14..16] == tb[14..16]
        && ta[18..] == tb[18..]
}

/// A segment that may join a super-packet: IPv4 TCP, unfragmented, with
/// payload, only ACK (and PSH) set, and a right checksum (GRO never vouches
/// for a checksum it has not seen). Returns its header lengths.
fn coalescable(packet: &[u8]) -> Option<(usize, usize)> {
    let (ihl, thl) = tcp4_headers(packet)?;
    let fragmented = u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff != 0;
    let whole = usize::from(u16::from_be_bytes([packet[2], packet[3]])) == packet.len();
    let ok = !fragmented
        && whole
        && packet.len() > ihl + thl
        && flags(packet, ihl) & !TCP_PSH == TCP_ACK
        && tcp4_checksum_ok(packet, ihl);
    ok.then_some((ihl, ihl + thl))
}

/// Merges TCP segments of the same flows into super-packets, a batch at a
/// time. Frames go to `write` with their virtio-net header; packets that
/// cannot be merged go alone, in order within their flow.
pub struct Coalescer {
    slots: Vec<Slot>,
    used: usize,
}

/// Flows merged at once; more in one batch flush the others first.
const FLOWS: usize = 8;

impl Default for Coalescer {
    fn default() -> Self {
        Self {
            slots: (0..FLOWS)
                .map(|_| Slot {
                    frame: vec![0; MAX_FRAME],
                    len: 0,
                    ihl: 0,
                    headers: 0,
                    mss: 0,
                    segments: 0,
                    next_seq: 0,
                    closed: false,
                })
                .collect(),
            used: 0,
        }
    }
}

impl Coalescer {
    /// Takes the packet in `frame[VNET_HDR_LEN..]`; the header room before
    /// it is overwritten when the packet is written alone. Returns how many
    /// super-packets of more than one segment were written.
    pub fn push(&mut self, frame: &mut [u8], write: &mut impl FnMut(&[u8])) -> u64 {
        let packet = &frame[VNET_HDR_LEN..];
        let Some((ihl, headers)) = coalescable(packet) else {
            let written = match tcp4_headers(packet) {
                Some((ihl, _)) => self.flush_flow(flow(packet, ihl), write),
                None => 0,
            };
            VnetHdr::default().write(frame);
            write(frame);
            return written;
        };
        let found = self.slots[..self.used]
            .iter()
            .position(|s| s.flow() == flow(packet, ihl));
        if let Some(i) = found {
            if self.slots[i].append(packet, ihl, headers) {
                return 0;
            }
            let written = self.write_slot(i, write);
            self.slots[i].open(packet, ihl, headers);
            return written;
        }
        let mut written = 0;
        if self.used == FLOWS {
            written = self.flush(write);
        }
        self.slots[self.used].open(packet, ihl, headers);
        self.used += 1;
        written
    }

    /// Writes every super-packet being built. Returns how many had more than one segment.
    pub fn flush(&mut self, write: &mut impl FnMut(&[u8])) -> u64 {
        let written = (0..self.used).map(|i| self.write_slot(i, write)).sum();
        self.used = 0;
        written
    }

    fn flush_flow(&mut self, flow_key: &[u8], write: &mut impl FnMut(&[u8])) -> u64 {
        let Some(i) = self.slots[..self.used]
            .iter()
            .position(|s| s.flow() == flow_key)
        else {
            return 0;
        };
        let written = self.write_slot(i, write);
        self.slots.swap(i, self.used - 1);
        self.used -= 1;
        written
    }

    fn write_slot(&mut self, i: usize, write: &mut impl FnMut(&[u8])) -> u64 {
        let slot = &mut self.slots[i];
        let merged = u64::from(slot.segments > 1);
        write(slot.finish());
        merged
    }
}

#[cfg(test)]
mod tests;
