//! Locks shared between the agent's threads, taken whether or not a
//! holder panicked.
//!
//! Every value under the agent's locks is replaced whole or counted up
//! in one step, so a holder that panicked left a value as sound as any
//! other. The dataplane must go on: a poisoned lock is taken as it is.

use std::sync::{LockResult, PoisonError};

/// What a lock gave, poisoned or not.
pub trait Unpoisoned<Guard> {
    /// The guard, whether or not a holder panicked.
    fn unpoisoned(self) -> Guard;
}

impl<Guard> Unpoisoned<Guard> for LockResult<Guard> {
    fn unpoisoned(self) -> Guard {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        thread,
    };

    use super::*;

    #[test]
    fn a_lock_whose_holder_panicked_still_gives_its_value() {
        let shared = Arc::new(Mutex::new(7));
        let holder = Arc::clone(&shared);
        let panicked = thread::spawn(move || {
            let _guard = holder.lock().unpoisoned();
            panic!("the holder panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.lock().unpoisoned(), 7);
    }
}
