//! Loading a program into the kernel without a stop signal spoiling it.
//!
//! The verifier gives up on a program when a signal is pending for the
//! loading thread, and aya then loads it again with a verifier log, which
//! for our programs takes minutes: an agent asked to stop while it loads
//! would not stop. The stop signals are held back in the loading thread,
//! so the process's other threads take them and the load completes.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};

/// Time spent in loads since the agent started, in ns: nearly all of it is
/// the verifier's, which operators weigh against the start time.
static LOADING_NS: AtomicU64 = AtomicU64::new(0);

/// Time this process has spent loading programs, the verifier's work.
pub fn loading_time() -> Duration {
    Duration::from_nanos(LOADING_NS.load(Ordering::Relaxed))
}

/// The signals that stop the agent.
const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// Runs `load` with the stop signals blocked in this thread, then restores
/// the thread's signal mask.
pub fn uninterrupted<T>(load: impl FnOnce() -> T) -> T {
    let stop: SigSet = STOP_SIGNALS.into_iter().collect();
    let mut previous = SigSet::empty();
    // Fails only for an invalid `how`; without the mask the load is merely
    // interruptible, as it was.
    let held = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&stop), Some(&mut previous)).is_ok();
    let began = Instant::now();
    let result = load();
    let took = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
    LOADING_NS.fetch_add(took, Ordering::Relaxed);
    if held {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked() -> SigSet {
        SigSet::thread_get_mask().expect("the thread's mask")
    }

    #[test]
    fn the_stop_signals_are_held_only_while_loading() {
        std::thread::spawn(|| {
            let before = blocked();
            assert!(!before.contains(Signal::SIGTERM));
            let during = uninterrupted(blocked);
            for signal in STOP_SIGNALS {
                assert!(during.contains(signal), "{signal} not held while loading");
            }
            let after = blocked();
            assert_eq!(
                STOP_SIGNALS.map(|s| after.contains(s)),
                STOP_SIGNALS.map(|s| before.contains(s)),
                "the mask is restored"
            );
        })
        .join()
        .unwrap();
    }
}
