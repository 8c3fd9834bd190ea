//! The key/value-cache budget: every sequence reserves, when it joins the
//! batch, the cache of all the tokens it may ever hold (its prompt plus its
//! `max_tokens`), and gives it back when it leaves. Reserving up front
//! means a running sequence never needs memory that is not there: the
//! budget is never exceeded, and a request that does not fit waits instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Tokens of cache: how many there are and how many are reserved, readable
/// from other threads (routing, metrics, tests).
#[derive(Debug)]
pub struct CacheBudget {
    capacity: usize,
    reserved: AtomicUsize,
    /// The most ever reserved at once.
    peak: AtomicUsize,
}

impl CacheBudget {
    pub(crate) fn new(capacity_tokens: usize) -> Arc<Self> {
        Arc::new(CacheBudget {
            capacity: capacity_tokens,
            reserved: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// Tokens of cache in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens reserved by running sequences.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// The most tokens ever reserved at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Reserves `tokens` if they fit. Only the engine thread reserves and
    /// releases, so a check and its update cannot interleave with another.
    pub(crate) fn try_reserve(&self, tokens: usize) -> bool {
        let reserved = self.reserved() + tokens;
        if reserved > self.capacity {
            return false;
        }
        self.reserved.store(reserved, Ordering::Relaxed);
        self.peak.fetch_max(reserved, Ordering::Relaxed);
        true
    }

    pub(crate) fn release(&self, tokens: usize) {
        self.reserved.fetch_sub(tokens, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_within_the_capacity_and_come_back() {
        let budget = CacheBudget::new(100);
        assert!(budget.try_reserve(60));
        assert!(!budget.try_reserve(41));
        assert!(budget.try_reserve(40));
        budget.release(60);
        assert_eq!(budget.reserved(), 40);
        assert_eq!(budget.peak(), 100);
    }
}
