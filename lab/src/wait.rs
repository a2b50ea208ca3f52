//! Waiting on a condition, one way for the lab, the benchmarks and the
//! tests: try, nap, try again, and give up with a message that names what
//! never happened. Never a fixed sleep in place of a condition.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Calls `attempt` every `nap` until it gives a value, for at most
/// `within`. Pollers nap rather than spin: on two cores a spinning poller
/// takes the CPU the agent under test needs.
pub fn poll<T>(
    within: Duration,
    nap: Duration,
    what: &str,
    mut attempt: impl FnMut() -> Option<T>,
) -> Result<T> {
    try_poll(within, nap, what, || Ok(attempt()))
}

/// [`poll`] of an attempt that may fail outright: its error ends the wait.
pub fn try_poll<T>(
    within: Duration,
    nap: Duration,
    what: &str,
    mut attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = attempt()? {
            return Ok(value);
        }
        let waited = start.elapsed();
        if waited >= within {
            bail!("never within {within:?}: {what}");
        }
        // The last try falls on the deadline, not a nap past it.
        std::thread::sleep(nap.min(within.checked_sub(waited).unwrap()));
    }
}

/// Waits, trying every `nap`, until `done` holds; returns how long it took.
pub fn until(
    within: Duration,
    nap: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    poll(within, nap, what, || done().then(|| start.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_that_comes_true_is_waited_for_and_timed() {
        let start = Instant::now();
        let took = until(
            Duration::from_secs(5),
            Duration::from_millis(1),
            "20 ms to pass",
            || start.elapsed() >= Duration::from_millis(20),
        )
        .unwrap();
        assert!(took >= Duration::from_millis(20) && took < Duration::from_secs(5));
        let mut tries = 0;
        let value = poll(
            Duration::from_secs(5),
            Duration::ZERO,
            "a third try",
            || {
                tries += 1;
                (tries == 3).then_some("third")
            },
        );
        assert_eq!(value.unwrap(), "third");
    }

    #[test]
    fn a_condition_that_never_comes_true_names_itself_after_the_deadline() {
        let start = Instant::now();
        let mut tries = 0;
        let error = until(
            Duration::from_millis(30),
            Duration::from_millis(10),
            "pigs to fly",
            || {
                tries += 1;
                false
            },
        )
        .unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(tries >= 3, "tried {tries} times");
        assert_eq!(error.to_string(), "never within 30ms: pigs to fly");
    }

    #[test]
    fn an_attempt_that_fails_ends_the_wait_with_its_error() {
        let mut tries = 0;
        let error = try_poll::<()>(Duration::from_secs(5), Duration::ZERO, "anything", || {
            tries += 1;
            anyhow::ensure!(tries < 2, "the process under test exited");
            Ok(None)
        })
        .unwrap_err();
        assert_eq!(tries, 2);
        assert_eq!(error.to_string(), "the process under test exited");
    }
}
