//! The tunnel's GRO and TSO: TCP segments of a few flows, in order, some
//! of them odd (FIN, a gap, a bad checksum), among packets of no flow, go
//! through the coalescer; every frame it writes is split again. Each flow
//! must come back packet for packet, in order, with valid checksums, and
//! nothing else may change.
#![no_main]

use arbitrary::Arbitrary;
use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use isthmus_agent::tunnel::offload::{self, Coalescer, MAX_PACKET, VNET_HDR_LEN};
use isthmus_common::{
    csum::{checksum, ipv4_l4_checksum},
    wire::Be16,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Input {
    /// The next segment of flow `flow % 3`.
    Segment {
        flow: u8,
        len: u16,
        flags: Flags,
        skip: bool,
        corrupt: bool,
    },
    /// Any bytes at all, as if the tunnel had decrypted them.
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Flags {
    Ack,
    AckPsh,
    Fin,
    Syn,
}

/// What identifies a packet of a flow when it comes back.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    flow: Vec<u8>,
    seq: u32,
    flags: u8,
    payload: Vec<u8>,
}

fn segment(flow: u8, seq: u32, len: u16, flags: Flags) -> Vec<u8> {
    let payload: Vec<u8> = (0..len % 1400).map(|i| (i as u8) ^ flow).collect();
    let tcp = PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 1, flow], 64)
        .tcp(40000 + u16::from(flow), 80, seq, 65535)
        .ack(1);
    let tcp = match flags {
        Flags::Ack => tcp,
        Flags::AckPsh => tcp.psh(),
        Flags::Fin => tcp.fin(),
        Flags::Syn => tcp.syn(),
    };
    let mut packet = Vec::with_capacity(tcp.size(payload.len()));
    tcp.write(&mut packet, &payload).expect("writing to a Vec");
    packet
}

/// The flow, sequence number, flags and payload of an IPv4 TCP packet.
fn seen(packet: &[u8]) -> Option<Seen> {
    let sliced = SlicedPacket::from_ip(packet).ok()?;
    let Some(TransportSlice::Tcp(tcp)) = sliced.transport else {
        return None;
    };
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    Some(Seen {
        flow: packet[12..ihl + 4].to_vec(),
        seq: tcp.sequence_number(),
        flags: packet[ihl + 13],
        payload: tcp.payload().to_vec(),
    })
}

fuzz_target!(|inputs: Vec<Input>| {
    let mut seq = [1000u32; 3];
    let mut sent = Vec::new();
    for input in inputs.into_iter().take(256) {
        let packet = match input {
            Input::Segment {
                flow,
                len,
                flags,
                skip,
                corrupt,
            } => {
                let flow = flow % 3;
                let at = &mut seq[usize::from(flow)];
                if skip {
                    *at = at.wrapping_add(7);
                }
                let mut packet = segment(flow, *at, len, flags);
                *at = at.wrapping_add((len % 1400).into());
                if corrupt && packet.len() > 40 {
                    let last = packet.len() - 1;
                    packet[last] ^= 0x55;
                }
                packet
            }
            Input::Raw(mut bytes) => {
                bytes.truncate(MAX_PACKET);
                bytes
            }
        };
        sent.push(packet);
    }
    let mut coalescer = Coalescer::default();
    let mut written: Vec<Vec<u8>> = Vec::new();
    let mut write = |frame: &[u8]| written.push(frame.to_vec());
    for packet in &sent {
        let mut frame = vec![0u8; VNET_HDR_LEN];
        frame.extend_from_slice(packet);
        coalescer.push(&mut frame, &mut write);
    }
    coalescer.flush(&mut write);

    let mut back = Vec::new();
    let mut scratch = vec![0u8; MAX_PACKET];
    for mut frame in written {
        offload::split(&mut frame, &mut scratch, |p| back.push(p.to_vec()))
            .expect("the coalescer wrote a frame that does not split");
    }
    // Packets of no TCP flow come back as they went, in their order.
    let others = |packets: &[Vec<u8>]| -> Vec<Vec<u8>> {
        packets
            .iter()
            .filter(|p| seen(p).is_none())
            .cloned()
            .collect()
    };
    assert_eq!(others(&back), others(&sent));
    // Each flow's segments come back in order, whole, with valid checksums.
    for flow in 0..3u8 {
        let of_flow = |packets: &[Vec<u8>]| -> Vec<Seen> {
            packets
                .iter()
                .filter_map(|p| seen(p))
                .filter(|s| s.flow.get(7) == Some(&flow) && s.flow.len() == 12)
                .collect()
        };
        assert_eq!(of_flow(&back), of_flow(&sent), "flow {flow}");
    }
    for packet in back.iter().filter(|p| seen(p).is_some()) {
        assert!(
            checksums_hold(packet) || sent.contains(packet),
            "a packet came back with a checksum it did not have"
        );
    }
});

/// Whether the IPv4 header checksum and the TCP checksum of `packet` hold.
fn checksums_hold(packet: &[u8]) -> bool {
    let Ok(sliced) = SlicedPacket::from_ip(packet) else {
        return false;
    };
    let (Some(etherparse::NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(tcp))) =
        (sliced.net, sliced.transport)
    else {
        return false;
    };
    let header = ip.header();
    checksum(header.slice()) == Be16::ZERO
        && ipv4_l4_checksum(header.source(), header.destination(), 6, tcp.slice()) == Be16::ZERO
}
