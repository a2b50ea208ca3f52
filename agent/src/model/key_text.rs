//! WireGuard keys as text: base64 of 32 bytes, as WireGuard tools print
//! them and as TunnelEndpoints and Secrets carry them.

use base64::{Engine, engine::general_purpose::STANDARD};

/// Base64, as WireGuard tools print keys.
pub fn encode(bytes: &[u8; 32]) -> String {
    STANDARD.encode(bytes)
}

/// Parses a base64 32-byte key.
pub fn decode(text: &str) -> Option<[u8; 32]> {
    STANDARD.decode(text.trim()).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_lengths() {
        let key = [7u8; 32];
        assert_eq!(decode(&format!(" {} ", encode(&key))), Some(key));
        assert_eq!(decode(&STANDARD.encode([7u8; 31])), None);
        assert_eq!(decode("not base64!"), None);
    }
}
