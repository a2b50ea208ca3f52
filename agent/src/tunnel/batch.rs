//! Batched UDP I/O. One `recvmmsg`/`sendmmsg` moves many messages, and one
//! message moves many datagrams: on send, runs of equal-sized datagrams to
//! one endpoint go as a single UDP GSO message (`UDP_SEGMENT`); on receive,
//! the kernel hands over whole GRO trains (`UDP_GRO`). Each message then
//! crosses the stack once instead of once per datagram.

use std::{
    io,
    mem::zeroed,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket},
    os::fd::AsRawFd,
    ptr,
};

/// Messages per system call.
pub const MESSAGES: usize = 32;
/// The largest UDP payload of one message, a GSO or GRO train included:
/// IPv6's, whose payload length leaves out its header.
const MAX_MESSAGE: usize = 65535 - 8;
/// The largest UDP payload of one IPv4 message.
const MAX_MESSAGE_IPV4: usize = 65535 - 20 - 8;
/// Datagrams per GSO message (the kernel's `UDP_MAX_SEGMENTS`).
const MAX_SEGMENTS: usize = 64;
/// Bytes of datagrams held before a send.
const SEND_BUFFER: usize = 256 << 10;

const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Room for one `cmsghdr` and an int, 8-byte aligned as the kernel wants it.
type Control = [u64; 4];

/// The kernel's per-message headers, pointing into a batch's buffers.
struct Headers {
    /// Room for an address of either family.
    addrs: [libc::sockaddr_in6; MESSAGES],
    iovs: [libc::iovec; MESSAGES],
    controls: [Control; MESSAGES],
    msgs: [libc::mmsghdr; MESSAGES],
}

impl Headers {
    fn new() -> Self {
        // SAFETY: plain C structs, valid when zeroed; pointers are set before use.
        unsafe { zeroed() }
    }

    /// Points header `i` at `buf`, the address slot and `control` bytes of its control slot.
    fn point(&mut self, i: usize, buf: &mut [u8], control: usize) {
        self.iovs[i] = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let hdr = &mut self.msgs[i].msg_hdr;
        hdr.msg_name = (&raw mut self.addrs[i]).cast();
        hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as u32;
        hdr.msg_iov = &raw mut self.iovs[i];
        hdr.msg_iovlen = 1;
        hdr.msg_control = if control == 0 {
            ptr::null_mut()
        } else {
            self.controls[i].as_mut_ptr().cast()
        };
        hdr.msg_controllen = control;
        hdr.msg_flags = 0;
        self.msgs[i].msg_len = 0;
    }
}

/// Asks the kernel to deliver GRO trains on `socket`. Kernels without
/// UDP GRO deliver datagrams one by one, which works the same, slower.
pub fn enable_gro(socket: &UdpSocket) {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads an int, which `on` is.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as u32,
        );
    }
}

/// Received messages, each one datagram or a GRO train of equal-sized
/// datagrams (the last may be shorter).
pub struct RecvBatch {
    buf: Vec<u8>,
    lens: [usize; MESSAGES],
    segments: [usize; MESSAGES],
    headers: Headers,
}

impl RecvBatch {
    /// A batch of [`MESSAGES`] buffers, each large enough for a GRO train.
    pub fn new() -> Box<Self> {
        Box::new(Self {
            buf: vec![0; MESSAGES * MAX_MESSAGE],
            lens: [0; MESSAGES],
            segments: [0; MESSAGES],
            headers: Headers::new(),
        })
    }

    /// Receives what is waiting, up to [`MESSAGES`] messages, without
    /// blocking. Returns how many arrived.
    pub fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        for (i, buf) in self.buf.chunks_exact_mut(MAX_MESSAGE).enumerate() {
            self.headers
                .point(i, buf, size_of::<Control>() as libc::size_t);
        }
        // SAFETY: every header points into buffers owned by self, sized as declared.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.headers.msgs.as_mut_ptr(),
                MESSAGES as u32,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        for i in 0..n as usize {
            self.lens[i] = self.headers.msgs[i].msg_len as usize;
            self.segments[i] = gro_segment(&self.headers.msgs[i].msg_hdr).unwrap_or(self.lens[i]);
        }
        Ok(n as usize)
    }

    /// Message `i` after [`RecvBatch::recv`]: its bytes, the size of each
    /// datagram in it, and its source.
    pub fn get(&self, i: usize) -> (&[u8], usize, SocketAddr) {
        let source = socket_addr(&self.headers.addrs[i]);
        let start = i * MAX_MESSAGE;
        (
            &self.buf[start..start + self.lens[i]],
            self.segments[i].max(1),
            source,
        )
    }
}

/// The datagram size of a GRO train, from its control message.
fn gro_segment(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: the kernel filled the control buffer `hdr` points to; the
    // CMSG macros stay within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == UDP_GRO {
                let size = ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return usize::try_from(size).ok().filter(|&s| s > 0);
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    None
}

/// One message to send: datagrams back to back in the batch's buffer.
#[derive(Clone, Copy)]
struct Message {
    start: usize,
    len: usize,
    /// Size of each datagram but the last.
    segment: usize,
    count: usize,
    to: SocketAddr,
    /// A shorter datagram ends a GSO message.
    closed: bool,
}

/// Datagrams waiting to be sent, grouped into GSO messages where they can be.
pub struct SendBatch {
    buf: Vec<u8>,
    used: usize,
    /// The largest datagram [`SendBatch::slot`] must hold.
    max_datagram: usize,
    messages: Vec<Message>,
    /// Cleared for good when the kernel refuses GSO on this socket's route.
    gso: bool,
    headers: Headers,
}

impl SendBatch {
    /// A batch for datagrams of at most `max_datagram` bytes.
    pub fn new(max_datagram: usize) -> Box<Self> {
        Box::new(Self {
            buf: vec![0; SEND_BUFFER.max(2 * max_datagram)],
            used: 0,
            max_datagram,
            messages: Vec::with_capacity(MESSAGES),
            gso: true,
            headers: Headers::new(),
        })
    }

    /// Whether the batch must be sent before another datagram fits.
    pub fn is_full(&self) -> bool {
        self.messages.len() == MESSAGES || self.buf.len() - self.used < self.max_datagram
    }

    /// Whether the batch holds nothing.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Where to write the next datagram, before [`SendBatch::commit`].
    pub fn slot(&mut self) -> &mut [u8] {
        &mut self.buf[self.used..]
    }

    /// Commits `len` bytes written to the slot, bound for `to`: they join
    /// the last message if they continue its run.
    pub fn commit(&mut self, len: usize, to: SocketAddr) {
        let start = self.used;
        self.used += len;
        let gso = self.gso;
        if let Some(last) = self.messages.last_mut().filter(|m| {
            gso && m.to == to
                && !m.closed
                && len <= m.segment
                && m.count < MAX_SEGMENTS
                && m.len + len <= max_message(to)
        }) {
            last.len += len;
            last.count += 1;
            last.closed = len < last.segment;
            return;
        }
        self.messages.push(Message {
            start,
            len,
            segment: len,
            count: 1,
            to,
            closed: false,
        });
    }

    /// Sends everything held and empties the batch. Returns how many GSO
    /// messages (of more than one datagram) went. Datagrams the kernel will
    /// not take now are dropped, as a NIC queue would.
    pub fn send(&mut self, socket: &UdpSocket) -> u64 {
        let count = self.messages.len();
        let mut gso_messages = 0;
        for i in 0..count {
            let m = self.messages[i];
            let control = if m.count > 1 {
                gso_messages += 1;
                segment_control(&mut self.headers.controls[i], m.segment)
            } else {
                0
            };
            self.headers
                .point(i, &mut self.buf[m.start..m.start + m.len], control);
            let namelen = sockaddr(m.to, &mut self.headers.addrs[i]);
            self.headers.msgs[i].msg_hdr.msg_namelen = namelen;
        }
        let mut sent = 0;
        while sent < count {
            // SAFETY: headers sent..count point into buffers owned by self.
            let n = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    self.headers.msgs[sent..].as_mut_ptr(),
                    (count - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                sent += n as usize;
                continue;
            }
            // EIO: the route cannot segment (no checksum offload on the way
            // out). Send this message's datagrams one by one, and never
            // group again.
            if io::Error::last_os_error().raw_os_error() == Some(libc::EIO)
                && self.messages[sent].count > 1
            {
                self.gso = false;
                gso_messages -= 1;
                let m = self.messages[sent];
                for datagram in self.buf[m.start..m.start + m.len].chunks(m.segment) {
                    let _ = socket.send_to(datagram, m.to);
                }
                sent += 1;
                continue;
            }
            break;
        }
        self.messages.clear();
        self.used = 0;
        gso_messages
    }
}

/// Writes a `UDP_SEGMENT` control message into `control`; returns its length.
fn segment_control(control: &mut Control, segment: usize) -> libc::size_t {
    let size = segment as u16;
    // SAFETY: `control` is 8-byte aligned and larger than CMSG_SPACE(2).
    unsafe {
        let cmsg = control.as_mut_ptr().cast::<libc::cmsghdr>();
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as libc::size_t;
        ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size);
        libc::CMSG_SPACE(size_of::<u16>() as u32) as libc::size_t
    }
}

/// The largest UDP payload of one message to `to`.
fn max_message(to: SocketAddr) -> usize {
    if to.is_ipv4() {
        MAX_MESSAGE_IPV4
    } else {
        MAX_MESSAGE
    }
}

/// Writes `addr` into `slot` as the kernel reads it; returns its length.
/// An IPv4 address goes as `sockaddr_in` even on an IPv6 socket, which
/// sends it over IPv4 (`udpv6_sendmsg` hands it to `udp_sendmsg`).
fn sockaddr(addr: SocketAddr, slot: &mut libc::sockaddr_in6) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(addr) => {
            let v4 = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: addr.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*addr.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in6 is larger than a sockaddr_in, and both
            // are plain C structs.
            unsafe { ptr::write((&raw mut *slot).cast::<libc::sockaddr_in>(), v4) };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(addr) => {
            *slot = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: addr.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: addr.ip().octets(),
                },
                sin6_scope_id: addr.scope_id(),
            };
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// The source the kernel wrote into `slot`: an IPv4 one as IPv4, whether
/// an IPv4 socket wrote it or a dual-stack one mapped it into IPv6.
fn socket_addr(slot: &libc::sockaddr_in6) -> SocketAddr {
    if i32::from(slot.sin6_family) == libc::AF_INET {
        // SAFETY: the kernel wrote a sockaddr_in, smaller than the slot.
        let v4 = unsafe { ptr::read((&raw const *slot).cast::<libc::sockaddr_in>()) };
        let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
        return SocketAddrV4::new(ip, u16::from_be(v4.sin_port)).into();
    }
    let ip = Ipv6Addr::from(slot.sin6_addr.s6_addr);
    let port = u16::from_be(slot.sin6_port);
    match ip.to_ipv4_mapped() {
        Some(ip) => SocketAddrV4::new(ip, port).into(),
        None => SocketAddrV6::new(ip, port, 0, slot.sin6_scope_id).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(port: u16) -> SocketAddr {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into()
    }

    fn push(batch: &mut SendBatch, len: usize, dest: SocketAddr) {
        batch.slot()[..len].fill(len as u8);
        batch.commit(len, dest);
    }

    fn shape(batch: &SendBatch) -> Vec<(usize, usize, u16)> {
        batch
            .messages
            .iter()
            .map(|m| (m.count, m.segment, m.to.port()))
            .collect()
    }

    #[test]
    fn equal_datagrams_to_one_endpoint_form_one_gso_message() {
        let mut b = SendBatch::new(1500);
        for _ in 0..3 {
            push(&mut b, 1452, to(1));
        }
        push(&mut b, 400, to(1)); // a shorter one ends the run...
        push(&mut b, 400, to(1)); // ...so this starts the next
        push(&mut b, 1452, to(2)); // another endpoint: its own message
        assert_eq!(shape(&b), [(4, 1452, 1), (1, 400, 1), (1, 1452, 2)]);
    }

    #[test]
    fn a_gso_message_stays_within_the_largest_udp_payload() {
        let mut b = SendBatch::new(1500);
        for _ in 0..60 {
            push(&mut b, 1452, to(1));
        }
        let counts: Vec<usize> = b.messages.iter().map(|m| m.count).collect();
        assert_eq!(counts, [45, 15]);
        assert!(b.messages.iter().all(|m| m.len <= MAX_MESSAGE_IPV4));
        // IPv6's payload length leaves out its header: a message to an
        // IPv6 endpoint holds 20 bytes more.
        let (mut v4, mut v6) = (SendBatch::new(1500), SendBatch::new(1500));
        let at6: SocketAddr = "[::1]:1".parse().unwrap();
        for _ in 0..45 {
            push(&mut v4, 1489, to(1));
            push(&mut v6, 1489, at6);
        }
        assert_eq!(
            v4.messages.iter().map(|m| m.count).collect::<Vec<_>>(),
            [43, 2]
        );
        assert_eq!(
            v6.messages.iter().map(|m| m.count).collect::<Vec<_>>(),
            [44, 1]
        );
    }

    /// A socket on loopback of `addr`'s family; an IPv6 one takes IPv4 too.
    fn bound(addr: &str) -> UdpSocket {
        let addr: SocketAddr = addr.parse().unwrap();
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            None,
        )
        .unwrap();
        if addr.is_ipv6() {
            socket.set_only_v6(false).unwrap();
        }
        socket.bind(&addr.into()).unwrap();
        socket.set_nonblocking(true).unwrap();
        socket.into()
    }

    /// Receives `count` datagrams on `rx` (waiting up to 5 s), each as
    /// (length, first byte, source).
    fn receive(rx: &UdpSocket, count: usize) -> Vec<(usize, u8, SocketAddr)> {
        let mut got = Vec::new();
        let mut incoming = RecvBatch::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < count && std::time::Instant::now() < deadline {
            let n = incoming.recv(rx).unwrap();
            for i in 0..n {
                let (message, segment, source) = incoming.get(i);
                got.extend(message.chunks(segment).map(|d| (d.len(), d[0], source)));
            }
        }
        got
    }

    /// Both ends on loopback: GSO messages go out and arrive as the same
    /// datagrams, whether or not the kernel hands them over as GRO trains.
    #[test]
    fn gso_out_and_gro_in_carry_every_datagram_intact() {
        let rx = bound("127.0.0.1:0");
        enable_gro(&rx);
        let tx = bound("127.0.0.1:0");
        let dest = rx.local_addr().unwrap();
        let mut out = SendBatch::new(1500);
        let sizes = [1000, 1000, 1000, 300, 1000, 7];
        for (i, &len) in sizes.iter().enumerate() {
            out.slot()[..len].fill(i as u8);
            out.commit(len, dest);
        }
        assert_eq!(out.send(&tx), 2, "[1000 ×3, 300] and [1000, 7]");
        let got = receive(&rx, sizes.len());
        let source = tx.local_addr().unwrap();
        let expected: Vec<(usize, u8, SocketAddr)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &l)| (l, i as u8, source))
            .collect();
        assert_eq!(got, expected);
    }

    /// A dual-stack socket sends to and receives from both families: an
    /// IPv4 peer's source reads as IPv4, never as a mapped IPv6 address,
    /// so that it compares equal to the endpoint its object gives.
    #[test]
    fn a_dual_stack_socket_carries_both_families_and_reads_ipv4_sources_as_ipv4() {
        let rx = bound("[::]:0");
        enable_gro(&rx);
        let port = rx.local_addr().unwrap().port();
        let (tx4, tx6) = (bound("127.0.0.1:0"), bound("[::1]:0"));
        for (tx, dest) in [(&tx4, "127.0.0.1"), (&tx6, "::1")] {
            let mut out = SendBatch::new(1500);
            for _ in 0..3 {
                out.slot()[..1200].fill(6);
                out.commit(1200, SocketAddr::new(dest.parse().unwrap(), port));
            }
            assert_eq!(out.send(tx), 1);
            let got = receive(&rx, 3);
            let source = tx.local_addr().unwrap();
            assert_eq!(got, vec![(1200, 6, source); 3], "from {source}");
        }
        // And answers each where it came from.
        let mut out = SendBatch::new(1500);
        for tx in [&tx4, &tx6] {
            out.slot()[..100].fill(9);
            out.commit(100, tx.local_addr().unwrap());
        }
        out.send(&rx);
        let back = rx.local_addr().unwrap().port();
        assert_eq!(
            receive(&tx4, 1),
            [(100, 9, SocketAddr::from(([127, 0, 0, 1], back)))]
        );
        let from6 = SocketAddr::new("::1".parse().unwrap(), back);
        assert_eq!(receive(&tx6, 1), [(100, 9, from6)]);
    }
}
