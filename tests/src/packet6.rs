//! IPv6 packets built from scratch, every checksum computed in full over
//! the pseudo-header: the oracle the IPv6 NAT's updates are compared
//! against.

use isthmus_common::{
    csum::ipv6_l4_checksum,
    ipv4::{PROTO_TCP, PROTO_UDP},
    ipv6::{DEST_OPTIONS, FRAGMENT, HOP_BY_HOP, PROTO_ICMPV6},
};

/// An IPv6 address as octets.
pub type Addr6 = [u8; 16];

/// The address written `text`.
pub fn addr6(text: &str) -> Addr6 {
    text.parse::<std::net::Ipv6Addr>()
        .expect("an IPv6 address")
        .octets()
}

/// An upper-layer segment, its checksum left at zero until [`Packet6`]
/// fills it.
#[derive(Clone, Debug)]
pub struct Segment {
    /// Its protocol.
    pub proto: u8,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// A TCP segment from `sport` to `dport` with `flags` and `options` (a
/// multiple of 4 bytes).
pub fn tcp6(sport: u16, dport: u16, flags: u8, options: &[u8]) -> Segment {
    let mut bytes = Vec::new();
    bytes.extend(sport.to_be_bytes());
    bytes.extend(dport.to_be_bytes());
    bytes.extend(1u32.to_be_bytes());
    bytes.extend(0u32.to_be_bytes());
    bytes.push((((20 + options.len()) / 4) << 4) as u8);
    bytes.push(flags);
    bytes.extend(64240u16.to_be_bytes());
    bytes.extend([0, 0, 0, 0]);
    bytes.extend(options);
    Segment {
        proto: PROTO_TCP,
        bytes,
    }
}

/// A UDP datagram from `sport` to `dport` carrying `payload`.
pub fn udp6(sport: u16, dport: u16, payload: &[u8]) -> Segment {
    let mut bytes = Vec::new();
    bytes.extend(sport.to_be_bytes());
    bytes.extend(dport.to_be_bytes());
    bytes.extend(((8 + payload.len()) as u16).to_be_bytes());
    bytes.extend([0, 0]);
    bytes.extend(payload);
    Segment {
        proto: PROTO_UDP,
        bytes,
    }
}

/// An ICMPv6 message of `icmp_type` whose second word is `rest`,
/// followed by `body`.
pub fn icmp6(icmp_type: u8, rest: [u8; 4], body: &[u8]) -> Segment {
    let mut bytes = vec![icmp_type, 0, 0, 0];
    bytes.extend(rest);
    bytes.extend(body);
    Segment {
        proto: PROTO_ICMPV6,
        bytes,
    }
}

/// An IPv6 packet: its addresses, its extension headers, its segment.
#[derive(Clone, Debug)]
pub struct Packet6 {
    /// Source address.
    pub src: Addr6,
    /// Destination address.
    pub dst: Addr6,
    /// Extension headers, each as its kind and its body after the two
    /// bytes of next header and length.
    pub extensions: Vec<(u8, Vec<u8>)>,
    /// The upper-layer segment.
    pub segment: Segment,
}

impl Packet6 {
    /// `segment` from `src` to `dst`, with no extension header.
    pub fn new(src: Addr6, dst: Addr6, segment: Segment) -> Self {
        Self {
            src,
            dst,
            extensions: Vec::new(),
            segment,
        }
    }

    /// The same packet with another pair of addresses.
    #[must_use]
    pub fn between(&self, src: Addr6, dst: Addr6) -> Self {
        Self {
            src,
            dst,
            ..self.clone()
        }
    }

    /// The same packet behind `count` destination-options headers of 8
    /// bytes, after a hop-by-hop one.
    #[must_use]
    pub fn with_options(&self, count: usize) -> Self {
        let mut extensions = vec![(HOP_BY_HOP, vec![1, 4, 0, 0, 0, 0])];
        extensions.extend((1..count).map(|_| (DEST_OPTIONS, vec![1, 4, 0, 0, 0, 0])));
        Self {
            extensions,
            ..self.clone()
        }
    }

    /// The same packet behind a fragment header at `offset` (in 8-byte
    /// units), with `more` fragments to follow, identification `id`.
    #[must_use]
    pub fn in_fragment(&self, offset: u16, more: bool, id: u32) -> Self {
        let field = (offset << 3) | u16::from(more);
        let mut body = field.to_be_bytes().to_vec();
        body.extend(id.to_be_bytes());
        Self {
            extensions: vec![(FRAGMENT, body)],
            ..self.clone()
        }
    }

    /// The segment with its checksum over this packet's pseudo-header.
    pub fn segment_bytes(&self) -> Vec<u8> {
        let mut bytes = self.segment.bytes.clone();
        let at = match self.segment.proto {
            PROTO_TCP => 16,
            PROTO_UDP => 6,
            _ => 2,
        };
        bytes[at..at + 2].fill(0);
        let check = ipv6_l4_checksum(self.src, self.dst, self.segment.proto, &bytes);
        bytes[at..at + 2].copy_from_slice(&check.bytes());
        bytes
    }

    /// The whole packet, checksums filled.
    pub fn bytes(&self) -> Vec<u8> {
        self.with_segment(&self.segment_bytes())
    }

    /// The packet around `segment` as given, its checksum untouched.
    pub fn with_segment(&self, segment: &[u8]) -> Vec<u8> {
        let mut chain = Vec::new();
        let kinds: Vec<u8> = self.extensions.iter().map(|(kind, _)| *kind).collect();
        for (i, (_, body)) in self.extensions.iter().enumerate() {
            let next = kinds.get(i + 1).copied().unwrap_or(self.segment.proto);
            let len = 2 + body.len();
            let units = if kinds[i] == FRAGMENT { 0 } else { len / 8 - 1 };
            chain.push(next);
            chain.push(units as u8);
            chain.extend(body);
        }
        let first = kinds.first().copied().unwrap_or(self.segment.proto);
        let payload_len = (chain.len() + segment.len()) as u16;
        let mut packet = vec![0x60, 0, 0, 0];
        packet.extend(payload_len.to_be_bytes());
        packet.push(first);
        packet.push(64);
        packet.extend(self.src);
        packet.extend(self.dst);
        packet.extend(chain);
        packet.extend(segment);
        packet
    }
}

/// An ICMPv6 error of `icmp_type` with `rest`, from `src` to `dst`,
/// quoting `quoted` whole.
pub fn icmp6_error(src: Addr6, dst: Addr6, icmp_type: u8, rest: [u8; 4], quoted: &[u8]) -> Packet6 {
    Packet6::new(src, dst, icmp6(icmp_type, rest, quoted))
}
