//! WireGuard messages a stranger can make up, knowing only a gateway's
//! public key and what a WAN observer sees.

use blake2::{
    Blake2s256, Blake2sMac, Digest,
    digest::{FixedOutput, KeyInit, Update, consts::U16},
};

/// A handshake response from sender index 0x1234 to `receiver`, with a
/// valid mac1 for the gateway whose public key is `responder`: all that
/// boringtun checks before its rate limiter answers with a cookie.
pub fn forged_response(responder: &[u8; 32], receiver: u32) -> Vec<u8> {
    let mut message = vec![0u8; 92];
    message[0] = 2;
    message[4..8].copy_from_slice(&0x1234u32.to_le_bytes());
    message[8..12].copy_from_slice(&receiver.to_le_bytes());
    let key = Blake2s256::new()
        .chain_update(b"mac1----")
        .chain_update(responder)
        .finalize();
    let mut mac = <Blake2sMac<U16> as KeyInit>::new_from_slice(&key).expect("a 32-byte key");
    Update::update(&mut mac, &message[..60]);
    message[60..76].copy_from_slice(&mac.finalize_fixed());
    message
}

/// A transport message to `receiver` of `len` bytes: a valid header, then
/// garbage where the ciphertext would be.
pub fn forged_transport(receiver: u32, len: usize) -> Vec<u8> {
    let mut message = vec![0xa5u8; len];
    message[..4].copy_from_slice(&[4, 0, 0, 0]);
    message[4..8].copy_from_slice(&receiver.to_le_bytes());
    message[8..16].copy_from_slice(&7u64.to_le_bytes());
    message
}
