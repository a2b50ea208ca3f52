//! A multi-queue TUN device: one non-blocking file descriptor per worker,
//! so the kernel spreads packets over the queues and no lock is shared.
//! Every packet carries a virtio-net header, and the device offers TSO
//! and checksum offload for IPv4 (see [`super::offload`]).
//!
//! The device is persistent: it outlives the agent, with its routes, so
//! that a restarted agent re-attaches to it and traffic resumes as soon as
//! the new sessions are up, without routes to write again. While no agent
//! holds it, the kernel drops what is routed into it. `isthmus-agent
//! cleanup` deletes it.

use std::{
    fs::OpenOptions,
    io,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::OpenOptionsExt,
    },
};

/// What the kernel may hand us unfinished: checksums, and TCP over IPv4 in
/// super-packets. Nothing else is offered, so nothing else needs handling.
const OFFLOADS: libc::c_uint = libc::TUN_F_CSUM | libc::TUN_F_TSO4;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates (or attaches to) the persistent TUN device `name` with `queues`
/// queues.
pub fn open(name: &str, queues: usize) -> io::Result<Vec<OwnedFd>> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad device name {name:?}"),
        ));
    }
    (0..queues.max(1))
        .map(|_| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open("/dev/net/tun")?;
            let mut req = IfReq {
                name: [0; libc::IFNAMSIZ],
                flags: (libc::IFF_TUN
                    | libc::IFF_NO_PI
                    | libc::IFF_MULTI_QUEUE
                    | libc::IFF_VNET_HDR) as libc::c_short,
                _pad: [0; 22],
            };
            req.name[..name.len()].copy_from_slice(name.as_bytes());
            // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is.
            if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
                return Err(io::Error::last_os_error());
            }
            for (request, value) in [(libc::TUNSETOFFLOAD, OFFLOADS), (libc::TUNSETPERSIST, 1)] {
                // SAFETY: TUNSETOFFLOAD and TUNSETPERSIST take their argument
                // by value.
                if unsafe { libc::ioctl(file.as_raw_fd(), request, value) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(OwnedFd::from(file))
        })
        .collect()
}
