//! Durations as Go writes and reads them (`time.Duration.String`,
//! `time.ParseDuration`): Liqo's flags (`--dns-check-interval=5m`) and the
//! latency its gateway writes on a Connection (`379µs`, `3ms`).

use std::time::Duration;

use thiserror::Error;

/// A text that is not a Go duration we take.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?}: expected a duration as Go writes one, such as 300ms, 5m or 1h30m")]
pub struct BadDuration(pub String);

/// The duration `text` says: numbers, each with its unit (`ns`, `us`,
/// `µs`, `μs`, `ms`, `s`, `m`, `h`), or a bare `0`. Negative durations
/// and sums past `u64` nanoseconds are refused.
pub fn parse(text: &str) -> Result<Duration, BadDuration> {
    let bad = || BadDuration(text.to_owned());
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad());
    }
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    let mut rest = text;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !is_number(c)).ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail.find(is_number).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let nanos = value * nanos_per(unit).ok_or_else(bad)?;
        // u64's nanoseconds: beyond them, no Duration::from_nanos.
        if !(0.0..1.8e19).contains(&nanos) {
            return Err(bad());
        }
        total = total
            .checked_add(Duration::from_nanos(nanos as u64))
            .ok_or_else(bad)?;
        rest = tail;
    }
    Ok(total)
}

/// Nanoseconds in one `unit`, as Go names units.
fn nanos_per(unit: &str) -> Option<f64> {
    Some(match unit {
        "ns" => 1.0,
        "us" | "µs" | "μs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_go_writes_and_liqo_passes() {
        let cases = [
            ("5m", Duration::from_mins(5)),
            ("1h30m", Duration::from_mins(90)),
            ("2.5s", Duration::from_millis(2500)),
            ("3ms", Duration::from_millis(3)),
            // Go writes the micro sign; Liqo's conncheck the Greek mu.
            ("379µs", Duration::from_micros(379)),
            ("379μs", Duration::from_micros(379)),
            ("12us", Duration::from_micros(12)),
            ("7ns", Duration::from_nanos(7)),
            ("0", Duration::ZERO),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn refuses_what_go_would_not_read_and_what_we_cannot_hold() {
        for text in [
            "", "N/A", "5", "ms", "5 m", "-1s", "1.2.3s", "1d", "5m3", "9e99h",
        ] {
            assert_eq!(parse(text), Err(BadDuration(text.into())), "{text:?}");
        }
        assert_eq!(
            parse("N/A").unwrap_err().to_string(),
            "\"N/A\": expected a duration as Go writes one, such as 300ms, 5m or 1h30m"
        );
    }
}
