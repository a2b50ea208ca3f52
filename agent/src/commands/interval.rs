//! The intervals flags take: one syntax for every one of them, Go's
//! duration (`500ms`, `5s`, `2m`), as Liqo's flags already write them.
//! A flag that once took a bare number in a unit of its own still reads
//! one, and says how to write it now.

use std::{fmt, time::Duration};

use crate::model::go_duration;

/// A positive interval given to a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// How long.
    pub duration: Duration,
    /// The flag's old unit, if it was written as a bare number of it.
    pub old_unit: Option<OldUnit>,
}

/// The unit a flag read a bare number in before it took durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldUnit {
    /// `--resolve-interval`, `--conntrack-gc-interval`.
    Seconds,
    /// The Lease's flags, once `--lease-*-ms`.
    Milliseconds,
}

impl OldUnit {
    fn one(self) -> Duration {
        match self {
            OldUnit::Seconds => Duration::from_secs(1),
            OldUnit::Milliseconds => Duration::from_millis(1),
        }
    }

    fn name(self) -> &'static str {
        match self {
            OldUnit::Seconds => "seconds",
            OldUnit::Milliseconds => "milliseconds",
        }
    }
}

impl Interval {
    /// `duration`, written as Go writes it.
    pub const fn new(duration: Duration) -> Self {
        Self {
            duration,
            old_unit: None,
        }
    }

    /// What to say of flag `--{flag}` if it was given this interval in
    /// its old spelling: how to write it now.
    pub fn old_spelling_warning(&self, flag: &str) -> Option<String> {
        self.old_unit.map(|unit| {
            format!(
                "--{flag}: a bare number of {} is deprecated; write --{flag}={self}, \
                 a duration as every interval flag takes",
                unit.name()
            )
        })
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&go_text(self.duration))
    }
}

/// `duration` in Go's form, in the largest unit that keeps it whole:
/// `2m`, `90s`, `800ms`.
pub fn go_text(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let units: [(&str, u128); 6] = [
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    units
        .into_iter()
        .find(|(_, per)| nanos > 0 && nanos.is_multiple_of(*per))
        .map_or_else(
            || "0s".to_owned(),
            |(unit, per)| format!("{}{unit}", nanos / per),
        )
}

/// A clap value parser for an interval flag that once took a bare number
/// of `old_unit`.
pub fn parser(old_unit: OldUnit) -> impl Fn(&str) -> Result<Interval, String> + Clone {
    move |text: &str| parse(text, old_unit)
}

/// `text` as an interval: a Go duration, or a bare number of `old_unit`.
fn parse(text: &str, old_unit: OldUnit) -> Result<Interval, String> {
    let interval = match text.parse::<u32>() {
        Ok(count) => Interval {
            duration: old_unit.one() * count,
            old_unit: Some(old_unit),
        },
        Err(_) => go_duration::parse(text)
            .map(Interval::new)
            .map_err(|e| e.to_string())?,
    };
    if interval.duration.is_zero() {
        return Err(format!(
            "{text:?}: expected a positive duration, such as 500ms, 5s or 2m"
        ));
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    use OldUnit::{Milliseconds, Seconds};

    #[test]
    fn reads_go_durations_and_the_old_bare_numbers() {
        assert_eq!(
            parse("500ms", Seconds),
            Ok(Interval::new(Duration::from_millis(500)))
        );
        assert_eq!(
            parse("2m", Seconds),
            Ok(Interval::new(Duration::from_mins(2)))
        );
        let old = parse("60", Seconds).unwrap();
        assert_eq!(
            (old.duration, old.old_unit),
            (Duration::from_mins(1), Some(Seconds))
        );
        let millis = parse("800", Milliseconds).unwrap();
        assert_eq!(millis.duration, Duration::from_millis(800));
    }

    #[test]
    fn refuses_zero_negative_and_unknown_units_naming_the_text() {
        for text in ["0", "0s", "-1s", "5d", "soon", "", "99999999999"] {
            let err = parse(text, Seconds).unwrap_err();
            assert!(err.contains(&format!("{text:?}")), "{text}: {err}");
        }
    }

    #[test]
    fn writes_each_interval_in_its_largest_whole_unit() {
        for (duration, text) in [
            (Duration::from_mins(2), "2m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(800), "800ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_hours(2), "2h"),
        ] {
            assert_eq!(go_text(duration), text);
            assert_eq!(go_duration::parse(text), Ok(duration), "{text} reads back");
        }
    }

    #[test]
    fn an_old_spelling_gets_a_warning_naming_the_new_one() {
        let old = parse("60", Seconds).unwrap();
        assert_eq!(
            old.old_spelling_warning("resolve-interval").as_deref(),
            Some(
                "--resolve-interval: a bare number of seconds is deprecated; write \
                 --resolve-interval=1m, a duration as every interval flag takes"
            )
        );
        let lease = parse("1000", Milliseconds).unwrap();
        assert!(
            lease
                .old_spelling_warning("lease-duration")
                .unwrap()
                .contains("milliseconds is deprecated; write --lease-duration=1s,")
        );
        let new = parse("1m", Seconds).unwrap();
        assert_eq!(new.old_spelling_warning("resolve-interval"), None);
    }
}
