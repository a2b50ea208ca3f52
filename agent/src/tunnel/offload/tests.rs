//! Segmentation offload: GSO batches split and GRO batches built, on
//! crafted packets.

use isthmus_common::{
    csum::{checksum, ipv4_l4_checksum},
    wire::Be16,
};

use super::*;

/// The TCP checksum of an IPv4 packet as the one oracle computes it: zero
/// when the packet's own is right.
fn tcp_checksum_of(packet: &[u8]) -> Be16 {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let addr = |at: usize| [packet[at], packet[at + 1], packet[at + 2], packet[at + 3]];
    ipv4_l4_checksum(addr(12), addr(16), TCP, &packet[ihl..])
}

/// An IPv4 TCP packet with 12 bytes of options and valid checksums.
fn tcp_packet(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![
        0x45, 0x00, 0, 0, 0x12, 0x34, 0x40, 0x00, 64, TCP, 0, 0, 10, 0, 0, 1, 10, 1, 0, 2, 0x9c,
        0x40, 0x00, 0x50, 0, 0, 0, 0, 0xa0, 0xb0, 0xc0, 0xd0, 0x80, flags, 0x01, 0xf6, 0, 0, 0, 0,
        1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2,
    ];
    p[24..28].copy_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(payload);
    finish_tcp4(&mut p, 20);
    p
}

fn frame(hdr: VnetHdr, packet: &[u8]) -> Vec<u8> {
    let mut f = vec![0; VNET_HDR_LEN];
    hdr.write(&mut f);
    f.extend_from_slice(packet);
    f
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn the_fast_sum_agrees_with_rfc_1071_at_every_length() {
    let data = pattern(300);
    for len in 0..data.len() {
        assert_eq!(
            !fold(sum(&data[..len])),
            checksum(&data[..len]).to_bits(),
            "length {len}"
        );
    }
}

#[test]
fn a_built_packet_has_valid_checksums() {
    let p = tcp_packet(7, TCP_ACK, &pattern(33));
    assert_eq!(checksum(&p[..20]), Be16::ZERO);
    assert_eq!(tcp_checksum_of(&p), Be16::ZERO);
    assert!(tcp4_checksum_ok(&p, 20));
}

#[test]
fn a_tso_frame_splits_into_segments_like_the_kernel_cuts_them() {
    let payload = pattern(3000);
    let mut sup = tcp_packet(0xffff_fff0, TCP_ACK | TCP_PSH | TCP_FIN, &payload);
    sup[6] = 0; // DF cleared: ids must still count up
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 52,
        gso_size: 1400,
        csum_start: 20,
        csum_offset: 16,
    };
    let mut f = frame(hdr, &sup);
    let mut segments = Vec::new();
    let mut scratch = vec![0; MAX_PACKET];
    let n = split(&mut f, &mut scratch, |s| segments.push(s.to_vec())).unwrap();
    assert_eq!(n, 3);
    let sizes: Vec<usize> = segments.iter().map(|s| s.len() - 52).collect();
    assert_eq!(sizes, [1400, 1400, 200]);
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
        assert_eq!(u16::from_be_bytes([s[4], s[5]]), 0x1234 + i as u16);
        assert_eq!(checksum(&s[..20]), Be16::ZERO, "IP checksum of {i}");
        assert_eq!(tcp_checksum_of(s), Be16::ZERO, "TCP checksum of {i}");
        let seq = u32::from_be_bytes(s[24..28].try_into().unwrap());
        assert_eq!(seq, 0xffff_fff0u32.wrapping_add(1400 * i as u32));
        let last = i == 2;
        assert_eq!(s[33] & (TCP_PSH | TCP_FIN) != 0, last, "flags of {i}");
        assert_eq!(&s[52..], &payload[i * 1400..(i * 1400 + 1400).min(3000)]);
        assert_eq!(
            &s[38..52],
            &sup[38..52],
            "urgent pointer and options of {i}"
        );
    }
}

#[test]
fn a_partial_checksum_is_completed() {
    let mut p = tcp_packet(1, TCP_ACK, &pattern(99));
    let partial = fold(pseudo_header(&p, 20));
    p[36..38].copy_from_slice(&partial.to_ne_bytes());
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 20,
        csum_offset: 16,
        ..VnetHdr::default()
    };
    let mut f = frame(hdr, &p);
    let mut out = Vec::new();
    split(&mut f, &mut [0; 64], |s| out = s.to_vec()).unwrap();
    assert_eq!(tcp_checksum_of(&out), Be16::ZERO);
}

#[test]
fn bad_frames_are_refused() {
    let mut scratch = [0u8; 128];
    let mut short = [0u8; 4];
    assert_eq!(
        split(&mut short, &mut scratch, |_| ()),
        Err(OffloadError::Truncated)
    );
    let udp_gso = VnetHdr {
        gso_type: 5,
        ..VnetHdr::default()
    };
    let mut f = frame(udp_gso, &tcp_packet(1, TCP_ACK, b"x"));
    assert_eq!(
        split(&mut f, &mut scratch, |_| ()),
        Err(OffloadError::UnsupportedGso(5))
    );
    let far = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 60,
        csum_offset: 16,
        ..VnetHdr::default()
    };
    let mut f = frame(far, &tcp_packet(1, TCP_ACK, b"x"));
    assert_eq!(
        split(&mut f, &mut scratch, |_| ()),
        Err(OffloadError::BadChecksumOffset)
    );
}

/// Pushes `packets` through a coalescer and returns the frames written.
fn coalesce(packets: &[Vec<u8>]) -> (Vec<Vec<u8>>, u64) {
    let mut c = Coalescer::default();
    let mut out = Vec::new();
    let mut write = |f: &[u8]| out.push(f.to_vec());
    let mut merged = 0;
    for p in packets {
        let mut f = frame(VnetHdr::default(), p);
        merged += c.push(&mut f, &mut write);
    }
    merged += c.flush(&mut write);
    (out, merged)
}

#[test]
fn consecutive_segments_merge_and_split_back_to_themselves() {
    let payload = pattern(1400 * 3 + 10);
    let segments: Vec<Vec<u8>> = payload
        .chunks(1400)
        .enumerate()
        .map(|(i, chunk)| {
            let flags = if i == 3 { TCP_ACK | TCP_PSH } else { TCP_ACK };
            let mut s = tcp_packet(1000 + 1400 * i as u32, flags, chunk);
            s[4..6].copy_from_slice(&(0x1234 + i as u16).to_be_bytes());
            finish_tcp4(&mut s, 20);
            s
        })
        .collect();
    let (mut frames, merged) = coalesce(&segments);
    assert_eq!((frames.len(), merged), (1, 1));
    let hdr = VnetHdr::parse(&frames[0]).unwrap();
    assert_eq!(
        hdr,
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1400,
            csum_start: 20,
            csum_offset: 16,
        }
    );
    let sup = &frames[0][VNET_HDR_LEN..];
    assert_eq!(usize::from(u16::from_be_bytes([sup[2], sup[3]])), sup.len());
    assert_eq!(checksum(&sup[..20]), Be16::ZERO);
    assert_eq!(&sup[52..], &payload[..]);
    assert_eq!(
        sup[33] & TCP_PSH,
        TCP_PSH,
        "PSH of the last segment is kept"
    );
    let mut back = Vec::new();
    split(&mut frames[0], &mut vec![0; MAX_PACKET], |s| {
        back.push(s.to_vec());
    })
    .unwrap();
    assert_eq!(back, segments);
}

#[test]
fn what_cannot_merge_goes_alone_and_in_order() {
    let a = tcp_packet(1000, TCP_ACK, &pattern(100));
    let gap = tcp_packet(1200, TCP_ACK, &pattern(100));
    let fin = tcp_packet(1300, TCP_ACK | TCP_FIN, &pattern(100));
    let mut corrupt = tcp_packet(1400, TCP_ACK, &pattern(100));
    corrupt[60] ^= 1;
    let mut other_flow = tcp_packet(1100, TCP_ACK, &pattern(100));
    other_flow[21] = 0x41;
    finish_tcp4(&mut other_flow, 20);
    let udp = {
        let mut u = a.clone();
        u[9] = 17;
        u
    };
    let packets = [a, other_flow, gap, fin, corrupt, udp];
    let (frames, merged) = coalesce(&packets);
    assert_eq!(merged, 0);
    let mut written: Vec<&[u8]> = frames.iter().map(|f| &f[VNET_HDR_LEN..]).collect();
    for f in &frames {
        assert_eq!(VnetHdr::parse(f).unwrap(), VnetHdr::default());
    }
    // Within the first flow the order holds; the other flow and UDP may move.
    written.retain(|p| p[9] == TCP && p[21] == 0x40);
    assert_eq!(
        written,
        [&packets[0][..], &packets[2], &packets[3], &packets[4]]
    );
}

#[test]
fn a_segment_after_a_short_one_starts_a_new_super_packet() {
    let s1 = tcp_packet(0, TCP_ACK, &pattern(1000));
    let s2 = tcp_packet(1000, TCP_ACK, &pattern(500));
    let s3 = tcp_packet(1500, TCP_ACK, &pattern(500));
    let (frames, merged) = coalesce(&[s1, s2, s3]);
    assert_eq!(merged, 1);
    let lens: Vec<usize> = frames.iter().map(|f| f.len() - VNET_HDR_LEN).collect();
    assert_eq!(lens, [52 + 1500, 52 + 500]);
}
