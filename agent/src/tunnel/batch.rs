//! Batched UDP I/O: many datagrams per `recvmmsg`/`sendmmsg` call, into
//! buffers allocated once per worker.

use std::{
    io,
    mem::zeroed,
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
};

/// Datagrams per system call.
pub const BATCH: usize = 64;

/// `BATCH` buffers with their addresses and the kernel's message headers.
pub struct Batch {
    bufs: Vec<Vec<u8>>,
    lens: [usize; BATCH],
    addrs: [libc::sockaddr_in; BATCH],
    iovs: [libc::iovec; BATCH],
    msgs: [libc::mmsghdr; BATCH],
    /// Slots in use.
    len: usize,
}

impl Batch {
    /// A batch of `BATCH` buffers of `size` bytes.
    pub fn new(size: usize) -> Box<Self> {
        // SAFETY: plain C structs, valid when zeroed; pointers are set before use.
        Box::new(Self {
            bufs: (0..BATCH).map(|_| vec![0u8; size]).collect(),
            lens: [0; BATCH],
            addrs: unsafe { zeroed() },
            iovs: unsafe { zeroed() },
            msgs: unsafe { zeroed() },
            len: 0,
        })
    }

    /// Whether the batch holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every slot is used.
    pub fn is_full(&self) -> bool {
        self.len == BATCH
    }

    /// The next free buffer, to fill before [`Batch::push`].
    pub fn next_buf(&mut self) -> &mut [u8] {
        &mut self.bufs[self.len]
    }

    /// Commits `len` bytes of the next buffer, bound for `to`.
    pub fn push(&mut self, len: usize, to: SocketAddrV4) {
        self.lens[self.len] = len;
        self.addrs[self.len] = sockaddr(to);
        self.len += 1;
    }

    /// Datagram `i` and its source, after [`Batch::recv`].
    pub fn get(&self, i: usize) -> (&[u8], SocketAddrV4) {
        let a = &self.addrs[i];
        let addr = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
            u16::from_be(a.sin_port),
        );
        (&self.bufs[i][..self.lens[i]], addr)
    }

    fn prepare(&mut self, count: usize, fill: bool) {
        for i in 0..count {
            let len = if fill {
                self.bufs[i].len()
            } else {
                self.lens[i]
            };
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: len,
            };
            let hdr = &mut self.msgs[i].msg_hdr;
            hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_in).cast();
            hdr.msg_namelen = size_of::<libc::sockaddr_in>() as u32;
            hdr.msg_iov = &mut self.iovs[i];
            hdr.msg_iovlen = 1;
            self.msgs[i].msg_len = 0;
        }
    }

    /// Receives as many datagrams as are waiting, up to `BATCH`, without blocking.
    pub fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        self.prepare(BATCH, true);
        // SAFETY: every header points into buffers owned by self, sized as declared.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            self.len = 0;
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        self.len = n as usize;
        for i in 0..self.len {
            self.lens[i] = self.msgs[i].msg_len as usize;
        }
        Ok(self.len)
    }

    /// Sends every held datagram and empties the batch. Datagrams the
    /// kernel will not take now are dropped, as a NIC queue would.
    pub fn send(&mut self, socket: &UdpSocket) -> io::Result<()> {
        let count = self.len;
        self.prepare(count, false);
        let mut sent = 0;
        while sent < count {
            // SAFETY: headers 0..count point into buffers owned by self.
            let n = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    self.msgs[sent..].as_mut_ptr(),
                    (count - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                break;
            }
            sent += n as usize;
        }
        self.len = 0;
        Ok(())
    }
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}
