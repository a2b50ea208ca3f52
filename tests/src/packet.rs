//! Packets built from scratch, every checksum computed in full: the oracle
//! the kernel programs' incremental updates are compared against.

use etherparse::{
    IpFragOffset, IpNumber, Ipv4Header, Ipv4Options, TcpHeader, TcpOptionElement, UdpHeader,
};

/// Ethertype of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// Ethertype of ARP.
pub const ETH_P_ARP: u16 = 0x0806;

/// An IPv4 address as octets.
pub type Addr = [u8; 4];

/// What an IPv4 datagram carries. Ports are the source's and the
/// destination's, in host order.
#[derive(Clone, Debug)]
#[allow(
    missing_docs,
    reason = "fields named after the header fields they fill"
)]
pub enum L4 {
    /// UDP; `zero_csum` leaves the checksum at 0 ("not computed").
    Udp {
        sport: u16,
        dport: u16,
        payload: Vec<u8>,
        zero_csum: bool,
    },
    /// TCP with a SYN.
    Tcp {
        sport: u16,
        dport: u16,
        payload: Vec<u8>,
    },
    /// TCP data: an ACK with a payload, as a flow sends once open.
    TcpData {
        sport: u16,
        dport: u16,
        payload: Vec<u8>,
    },
    /// A TCP FIN with an ACK: its sender's side closes.
    TcpFin { sport: u16, dport: u16 },
    /// A TCP SYN (a SYN-ACK with `ack`) with the options Linux sends: MSS
    /// `mss`, SACK permitted, timestamps, window scale.
    TcpSyn {
        sport: u16,
        dport: u16,
        ack: bool,
        mss: u16,
    },
    /// ICMP echo request.
    Echo { id: u16, seq: u16 },
    /// ICMP echo reply.
    EchoReply { id: u16, seq: u16 },
    /// ICMP error of `icmp_type` and `code`, quoting the first `quote_len`
    /// bytes of `quoted`.
    IcmpError {
        icmp_type: u8,
        code: u8,
        quoted: Box<Datagram>,
        quote_len: usize,
    },
}

/// Which flags a plain TCP segment carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Segment {
    /// SYN.
    Syn,
    /// ACK.
    Data,
    /// FIN and ACK.
    Fin,
}

/// An IPv4 datagram to build.
#[derive(Clone, Debug)]
pub struct Datagram {
    /// Source.
    pub src: Addr,
    /// Destination.
    pub dst: Addr,
    /// IP options, a multiple of 4 bytes.
    pub options: Vec<u8>,
    /// Time to live.
    pub ttl: u8,
    /// Payload.
    pub l4: L4,
}

impl Datagram {
    /// A datagram with no options.
    pub fn new(src: Addr, dst: Addr, l4: L4) -> Self {
        Self {
            src,
            dst,
            options: Vec::new(),
            ttl: 64,
            l4,
        }
    }

    /// The same datagram with another TTL: `ttl - 1` is what a router
    /// forwards.
    #[must_use]
    pub fn with_ttl(&self, ttl: u8) -> Self {
        Self {
            ttl,
            ..self.clone()
        }
    }

    /// The same datagram between other addresses (what a NAT should produce).
    #[must_use]
    pub fn between(&self, src: Addr, dst: Addr) -> Self {
        Self {
            src,
            dst,
            ..self.clone()
        }
    }

    /// The same datagram with its quoted packet's addresses replaced.
    #[must_use]
    pub fn quoting(&self, src: Addr, dst: Addr) -> Self {
        let mut out = self.clone();
        if let L4::IcmpError { quoted, .. } = &mut out.l4 {
            **quoted = quoted.between(src, dst);
        }
        out
    }

    fn header(&self, payload_len: usize, protocol: IpNumber) -> Ipv4Header {
        let mut ip =
            Ipv4Header::new(0, self.ttl, protocol, self.src, self.dst).expect("small payload");
        ip.identification = 0x1234;
        ip.options = Ipv4Options::try_from(&self.options[..]).expect("options are a multiple of 4");
        ip.set_payload_len(payload_len).expect("small payload");
        ip.header_checksum = ip.calc_header_checksum();
        ip
    }

    /// The header and payload, checksums filled in.
    pub fn parts(&self) -> (Ipv4Header, Vec<u8>) {
        match &self.l4 {
            L4::Udp {
                sport,
                dport,
                payload,
                zero_csum,
            } => {
                let ip = self.header(8 + payload.len(), IpNumber::UDP);
                let mut udp = UdpHeader::with_ipv4_checksum(*sport, *dport, &ip, payload)
                    .expect("small payload");
                if *zero_csum {
                    udp.checksum = 0;
                }
                (ip, [udp.to_bytes().as_slice(), payload].concat())
            }
            L4::Tcp {
                sport,
                dport,
                payload,
            } => self.tcp_segment(*sport, *dport, payload, Segment::Syn),
            L4::TcpData {
                sport,
                dport,
                payload,
            } => self.tcp_segment(*sport, *dport, payload, Segment::Data),
            L4::TcpFin { sport, dport } => self.tcp_segment(*sport, *dport, &[], Segment::Fin),
            L4::TcpSyn {
                sport,
                dport,
                ack,
                mss,
            } => {
                let mut tcp = TcpHeader::new(*sport, *dport, 1000, 64240);
                tcp.syn = true;
                tcp.ack = *ack;
                tcp.set_options(&[
                    TcpOptionElement::MaximumSegmentSize(*mss),
                    TcpOptionElement::SelectiveAcknowledgementPermitted,
                    TcpOptionElement::Timestamp(7, 0),
                    TcpOptionElement::Noop,
                    TcpOptionElement::WindowScale(7),
                ])
                .expect("options fit");
                let ip = self.header(tcp.header_len(), IpNumber::TCP);
                tcp.checksum = tcp.calc_checksum_ipv4(&ip, &[]).expect("no payload");
                (ip, tcp.to_bytes().to_vec())
            }
            L4::Echo { id, seq } | L4::EchoReply { id, seq } => {
                let icmp_type = if matches!(self.l4, L4::Echo { .. }) {
                    8
                } else {
                    0
                };
                let mut icmp = vec![icmp_type, 0, 0, 0];
                icmp.extend(id.to_be_bytes());
                icmp.extend(seq.to_be_bytes());
                icmp.extend(b"echo-payload");
                (
                    self.header(icmp.len(), IpNumber::ICMP),
                    with_icmp_checksum(icmp),
                )
            }
            L4::IcmpError {
                icmp_type,
                code,
                quoted,
                quote_len,
            } => {
                let mut icmp = vec![*icmp_type, *code, 0, 0, 0, 0, 0, 0];
                icmp.extend(&quoted.bytes()[..*quote_len]);
                (
                    self.header(icmp.len(), IpNumber::ICMP),
                    with_icmp_checksum(icmp),
                )
            }
        }
    }

    /// A TCP segment carrying `payload`: a SYN, or else an ACK.
    fn tcp_segment(
        &self,
        sport: u16,
        dport: u16,
        payload: &[u8],
        segment: Segment,
    ) -> (Ipv4Header, Vec<u8>) {
        let mut tcp = TcpHeader::new(sport, dport, 1000, 64240);
        tcp.syn = segment == Segment::Syn;
        tcp.ack = !tcp.syn;
        tcp.fin = segment == Segment::Fin;
        let ip = self.header(tcp.header_len() + payload.len(), IpNumber::TCP);
        tcp.checksum = tcp.calc_checksum_ipv4(&ip, payload).expect("small payload");
        (ip, [tcp.to_bytes().as_slice(), payload].concat())
    }

    /// The whole datagram.
    pub fn bytes(&self) -> Vec<u8> {
        let (ip, payload) = self.parts();
        [ip.to_bytes().as_slice(), &payload].concat()
    }

    /// A fragment of the datagram: payload bytes `from..to`, at the right
    /// offset, with MF set unless it is the last.
    pub fn fragment(&self, from: usize, to: usize) -> Vec<u8> {
        let (mut ip, payload) = self.parts();
        let to = to.min(payload.len());
        ip.more_fragments = to < payload.len();
        ip.fragment_offset = IpFragOffset::try_new((from / 8) as u16).expect("offset in range");
        ip.set_payload_len(to - from).expect("small payload");
        ip.header_checksum = ip.calc_header_checksum();
        [ip.to_bytes().as_slice(), &payload[from..to]].concat()
    }
}

/// The same IPv4 packet with identification `id`, its header checksum
/// computed again.
pub fn with_id(mut packet: Vec<u8>, id: u16) -> Vec<u8> {
    packet[4..6].copy_from_slice(&id.to_be_bytes());
    packet[10..12].fill(0);
    let check = isthmus_common::csum::checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&check.bytes());
    packet
}

fn with_icmp_checksum(mut icmp: Vec<u8>) -> Vec<u8> {
    let check = isthmus_common::csum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&check.bytes());
    icmp
}

/// An Ethernet frame around `payload`.
pub fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
    frame.extend(ethertype.to_be_bytes());
    frame.extend(payload);
    frame
}

/// An Ethernet frame carrying IPv4.
pub fn eth_ipv4(ip: &[u8]) -> Vec<u8> {
    ethernet(ETH_P_IP, ip)
}

/// An overlay packet: `inner` (an Ethernet frame) in VXLAN with `vni`, in
/// UDP to `dport`, from node `src` to node `dst`; outer checksums computed
/// in full.
pub fn vxlan(src: Addr, dst: Addr, dport: u16, vni: u32, inner: &[u8]) -> Datagram {
    let payload = vxlan_payload(vni, inner);
    Datagram::new(
        src,
        dst,
        L4::Udp {
            sport: 49152,
            dport,
            payload,
            zero_csum: false,
        },
    )
}

/// The UDP payload of an overlay packet: `inner` (an Ethernet frame) after
/// a VXLAN header with `vni`.
pub fn vxlan_payload(vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut payload = vec![0x08, 0, 0, 0];
    payload.extend((vni << 8).to_be_bytes());
    payload.extend(inner);
    payload
}

/// A UDP datagram from `src` to `dst` with a short payload.
pub fn udp(src: Addr, dst: Addr) -> Datagram {
    Datagram::new(
        src,
        dst,
        L4::Udp {
            sport: 40000,
            dport: 53,
            payload: b"isthmus udp".to_vec(),
            zero_csum: false,
        },
    )
}

/// A TCP SYN from `src` to `dst` with a short payload.
pub fn tcp(src: Addr, dst: Addr) -> Datagram {
    Datagram::new(
        src,
        dst,
        L4::Tcp {
            sport: 40001,
            dport: 80,
            payload: b"GET /".to_vec(),
        },
    )
}
