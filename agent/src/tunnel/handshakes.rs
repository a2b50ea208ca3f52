//! Handshake initiations wait here, apart from data, for the one thread
//! that opens them, as the kernel module queues them apart from its
//! per-peer data queues.
//!
//! An initiation costs the gateway a MAC check, and a cookie reply or
//! Diffie-Hellman work: done on the datapath workers, a stranger's flood
//! of them would keep the workers from draining the UDP socket, and the
//! kernel would drop peers' data with the flood. A worker only copies an
//! initiation into this queue, and drops it, counted, when the queue is
//! full. Initiations from a peer's endpoint address wait in a queue of
//! their own, served first: a flood from elsewhere cannot crowd out a peer
//! that restarts where it was.

use std::{
    collections::VecDeque,
    net::SocketAddrV4,
    sync::{Condvar, Mutex},
    time::Duration,
};

/// The length of a WireGuard handshake initiation.
pub const INITIATION_LEN: usize = 148;
/// WireGuard's message type of an initiation.
const MESSAGE_INITIATION: u8 = 1;
/// Initiations each queue holds.
pub const QUEUE_LEN: usize = 1024;

/// One initiation, as it arrived.
pub struct Initiation {
    /// The datagram.
    pub bytes: [u8; INITIATION_LEN],
    /// Where it came from.
    pub source: SocketAddrV4,
}

/// Whether `datagram` is a handshake initiation, by its type and length.
pub fn is_initiation(datagram: &[u8]) -> bool {
    datagram.len() == INITIATION_LEN && datagram[..4] == [MESSAGE_INITIATION, 0, 0, 0]
}

/// Initiations from peers' endpoint addresses, and from anywhere else.
#[derive(Default)]
struct Queues {
    peers: VecDeque<Initiation>,
    others: VecDeque<Initiation>,
}

/// The bounded queue between the workers and the handshake thread.
#[derive(Default)]
pub struct HandshakeQueue {
    queues: Mutex<Queues>,
    ready: Condvar,
}

impl HandshakeQueue {
    /// Queues an initiation (see [`is_initiation`]) from `source`, a peer's
    /// endpoint address if `from_peer`. Returns false, dropping it, when
    /// its queue is full.
    pub fn push(&self, datagram: &[u8], source: SocketAddrV4, from_peer: bool) -> bool {
        let Ok(bytes) = datagram.try_into() else {
            return false;
        };
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queue = match from_peer {
            true => &mut queues.peers,
            false => &mut queues.others,
        };
        if queue.len() >= QUEUE_LEN {
            return false;
        }
        queue.push_back(Initiation { bytes, source });
        drop(queues);
        self.ready.notify_one();
        true
    }

    /// The next initiation, peers' first; None after `wait` with none.
    pub fn pop(&self, wait: Duration) -> Option<Initiation> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let (mut queues, _) = self
            .ready
            .wait_timeout_while(queues, wait, |q| q.peers.is_empty() && q.others.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        queues
            .peers
            .pop_front()
            .or_else(|| queues.others.pop_front())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn initiation(tag: u8) -> [u8; INITIATION_LEN] {
        let mut bytes = [tag; INITIATION_LEN];
        bytes[..4].copy_from_slice(&[MESSAGE_INITIATION, 0, 0, 0]);
        bytes
    }

    #[test]
    fn only_initiations_are_queued() {
        assert!(is_initiation(&initiation(7)));
        assert!(!is_initiation(&initiation(7)[..147]));
        let mut data = initiation(7);
        data[0] = 4;
        assert!(!is_initiation(&data));
        let queue = HandshakeQueue::default();
        assert!(!queue.push(
            &[1, 0, 0, 0],
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1),
            false
        ));
    }

    #[test]
    fn a_full_queue_of_strangers_leaves_a_peers_initiation_first_in_line() {
        let queue = HandshakeQueue::default();
        let stranger = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 9), 4000);
        let peer = SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 2), 51820);
        for _ in 0..QUEUE_LEN {
            assert!(queue.push(&initiation(1), stranger, false));
        }
        assert!(!queue.push(&initiation(1), stranger, false), "bounded");
        assert!(queue.push(&initiation(2), peer, true));
        let first = queue.pop(Duration::ZERO).unwrap();
        assert_eq!((first.source, first.bytes[4]), (peer, 2));
        assert_eq!(queue.pop(Duration::ZERO).unwrap().source, stranger);
    }

    #[test]
    fn an_empty_queue_waits_only_as_long_as_asked() {
        let queue = HandshakeQueue::default();
        assert!(queue.pop(Duration::from_millis(1)).is_none());
    }
}
