//! The IPv6 chain of extension headers, as the NAT's programs walk it
//! (`isthmus_common::ipv6::walk`), over any bytes: a header of any kind
//! first, then anything. Nothing may panic, nothing is read outside the
//! packet, and a chain the walk accepts ends within its bounds: at most
//! eight extension headers in at most 256 bytes, its upper-layer header or
//! a later fragment's data inside the packet.
#![no_main]

use std::cell::Cell;

use arbitrary::Arbitrary;
use isthmus_common::ipv6::{
    CHAIN_MAX, FRAGMENT_HLEN, MAX_EXTENSION_HEADERS, Place, Step, Stop, walk,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Packet {
    /// The kind of the first header after the fixed one.
    first: u8,
    /// What follows the fixed header.
    bytes: Vec<u8>,
}

fuzz_target!(|packet: Packet| {
    let bytes = &packet.bytes;
    let reads = Cell::new(0usize);
    let read = |at: usize| {
        reads.set(reads.get() + 1);
        let span = bytes.get(at..at + FRAGMENT_HLEN);
        assert!(span.is_some(), "read past the packet at {at}");
        span?.try_into().ok()
    };
    let result = walk(packet.first, 0, bytes.len(), read).result();
    assert!(reads.get() <= MAX_EXTENSION_HEADERS + 1);
    match result {
        Ok(chain) => {
            assert!(chain.l4 <= bytes.len().max(CHAIN_MAX + 2048));
            match chain.place {
                // A later fragment's data starts right after its header.
                Place::Later => assert!(chain.l4 >= FRAGMENT_HLEN),
                Place::Whole | Place::First => {
                    assert_eq!(Step::of(chain.proto), Step::Upper, "{chain:?}");
                    assert!(chain.l4 <= CHAIN_MAX + 2048);
                }
            }
        }
        Err(Stop::Cut | Stop::Refused(_)) => {}
    }
});
