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
//! that restarts where it was. The others are opened within a budget a
//! second ([`OTHERS_PER_SECOND`]), so a flood cannot take the CPU the
//! workers need either.

use std::{
    collections::VecDeque,
    net::SocketAddrV4,
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

use crate::sync::Unpoisoned;

/// The length of a WireGuard handshake initiation.
pub const INITIATION_LEN: usize = 148;
/// WireGuard's message type of an initiation.
const MESSAGE_INITIATION: u8 = 1;
/// Initiations each queue holds.
pub const QUEUE_LEN: usize = 1024;
/// Initiations from elsewhere than a peer's endpoint opened a second, at
/// most: each costs a MAC check and a cookie reply or Diffie-Hellman
/// work, and the CPU a stranger's flood would take is the workers'. A new
/// peer's first contact needs a handful.
pub const OTHERS_PER_SECOND: u32 = 4096;

/// One initiation, as it arrived.
pub struct Initiation {
    /// The datagram.
    pub bytes: [u8; INITIATION_LEN],
    /// Where it came from.
    pub source: SocketAddrV4,
    /// Whether that is a peer's endpoint address.
    pub from_peer: bool,
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
    closed: bool,
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
        let mut queues = self.queues.lock().unpoisoned();
        let queue = match from_peer {
            true => &mut queues.peers,
            false => &mut queues.others,
        };
        if queue.len() >= QUEUE_LEN {
            return false;
        }
        queue.push_back(Initiation {
            bytes,
            source,
            from_peer,
        });
        drop(queues);
        self.ready.notify_one();
        true
    }

    /// Closes the queue as the tunnel stops: [`HandshakeQueue::pop`]
    /// returns at once from then on.
    pub fn close(&self) {
        self.queues.lock().unpoisoned().closed = true;
        self.ready.notify_all();
    }

    /// The next initiation, peers' first, and only peers' unless `others`;
    /// None after `wait` with none.
    pub fn pop(&self, wait: Duration, others: bool) -> Option<Initiation> {
        let queues = self.queues.lock().unpoisoned();
        let (mut queues, _) = self
            .ready
            .wait_timeout_while(queues, wait, |q| {
                !q.closed && q.peers.is_empty() && (!others || q.others.is_empty())
            })
            .unpoisoned();
        match queues.peers.pop_front() {
            Some(initiation) => Some(initiation),
            None if others => queues.others.pop_front(),
            None => None,
        }
    }
}

/// How many initiations from elsewhere than a peer's endpoint the
/// handshake thread may still open this second.
pub struct OthersBudget {
    left: u32,
    second: Instant,
}

impl OthersBudget {
    /// A full budget, from `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            left: OTHERS_PER_SECOND,
            second: now,
        }
    }

    /// Whether another may be opened at `now`.
    pub fn available(&mut self, now: Instant) -> bool {
        if now.duration_since(self.second) >= Duration::from_secs(1) {
            *self = Self::new(now);
        }
        self.left > 0
    }

    /// Counts one opened.
    pub fn spend(&mut self) {
        self.left = self.left.saturating_sub(1);
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
        let first = queue.pop(Duration::ZERO, true).unwrap();
        assert_eq!((first.source, first.bytes[4]), (peer, 2));
        assert!(queue.pop(Duration::ZERO, false).is_none(), "peers' only");
        assert_eq!(queue.pop(Duration::ZERO, true).unwrap().source, stranger);
    }

    #[test]
    fn an_empty_queue_waits_only_as_long_as_asked_and_not_once_closed() {
        let queue = HandshakeQueue::default();
        assert!(queue.pop(Duration::from_millis(1), true).is_none());
        queue.close();
        let started = std::time::Instant::now();
        assert!(queue.pop(Duration::from_secs(5), true).is_none());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "closed: no wait"
        );
    }

    #[test]
    fn strangers_get_a_budget_a_second() {
        let start = Instant::now();
        let mut budget = OthersBudget::new(start);
        for _ in 0..OTHERS_PER_SECOND {
            assert!(budget.available(start));
            budget.spend();
        }
        assert!(!budget.available(start + Duration::from_millis(999)));
        assert!(budget.available(start + Duration::from_secs(1)));
    }
}
