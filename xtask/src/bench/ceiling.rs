//! How fast the tunnel could go on this machine: the path in clear, less
//! what sealing and opening each packet costs, with the AEAD WireGuard
//! uses (ChaCha20-Poly1305, as boringtun's data path runs it, from `ring`)
//! measured here on one core.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};

/// What one packet carries through the tunnel: its MTU.
const PACKET: usize = 1420;
/// How long sealing is timed.
const TIMED: Duration = Duration::from_secs(1);

/// Gigabits a second of packets one core seals with ChaCha20-Poly1305.
pub fn seal_gbps() -> Result<f64> {
    let key = UnboundKey::new(&CHACHA20_POLY1305, &[0x42; 32])
        .map_err(|_| anyhow!("ring refused a 32-byte ChaCha20-Poly1305 key"))?;
    let key = LessSafeKey::new(key);
    let mut packet = vec![0x17u8; PACKET];
    let (start, mut sealed) = (Instant::now(), 0u64);
    while start.elapsed() < TIMED {
        for _ in 0..256 {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&sealed.to_le_bytes());
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::empty(),
                    &mut packet,
                )
                .map_err(|_| anyhow!("sealing failed"))?;
            let _ = black_box(tag);
            sealed += 1;
        }
    }
    Ok(sealed as f64 * PACKET as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9)
}

/// The throughput a tunnel could reach over a path that carries `clear`
/// Gbit/s in clear when each packet is sealed once and opened once, each
/// at `seal` Gbit/s: the time of a bit is the path's plus both AEAD passes.
pub fn ceiling(clear: f64, seal: f64) -> f64 {
    1.0 / (1.0 / clear + 2.0 / seal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_adds_the_times_of_the_path_and_both_passes() {
        assert!((ceiling(10.0, 20.0) - 5.0).abs() < 1e-9);
        assert!(ceiling(10.0, f64::INFINITY) == 10.0);
        assert!(ceiling(4.0, 16.0) < 4.0);
    }

    #[test]
    fn sealing_is_timed_and_positive() {
        assert!(seal_gbps().unwrap() > 0.0);
    }
}
