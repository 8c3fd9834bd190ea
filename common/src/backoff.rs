//! Retry delays, the one way raylet waits before trying a call again:
//! exponential from a first step up to a cap, each delay drawn at random
//! from the upper half of its step, so that many clients that lost the same
//! peer (every actor handle of a driver, every node of a restarted head)
//! do not all come back in the same instant.

use std::time::Duration;

use rand::Rng;

/// The delays of one run of retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// Delays that start at `first` and double up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            step: first,
        }
    }

    /// The same delay each time (still jittered), for polling.
    pub const fn constant(delay: Duration) -> Self {
        Backoff::new(delay, delay)
    }

    /// The step the next delay is drawn under, before jitter: what a caller
    /// that must stop before a deadline compares with the time left.
    pub fn step(&self) -> Duration {
        self.step
    }

    /// The next delay, between half and all of the current step; the step
    /// then doubles, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = jittered(self.step);
        self.step = (self.step * 2).min(self.max);
        delay
    }

    /// Sleeps the next delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Starts again from the first step, after a success.
    pub fn reset(&mut self) {
        self.step = self.first;
    }

    /// The delay before retry number `attempt` (0 for the first retry)
    /// without keeping state: the step `first × 2^attempt`, capped, then
    /// jittered.
    pub fn delay_for_attempt(first: Duration, max: Duration, attempt: u32) -> Duration {
        let step = first.saturating_mul(2u32.saturating_pow(attempt.min(31))).min(max);
        jittered(step)
    }
}

/// A delay drawn uniformly from `[step / 2, step]`: a fixed pause between
/// tries, jittered as every [`Backoff`] delay is.
pub fn jittered(step: Duration) -> Duration {
    let half = step / 2;
    let spread = (step - half).as_nanos() as u64;
    half + Duration::from_nanos(rand::rng().random_range(0..=spread))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_double_up_to_the_cap_and_each_delay_lies_in_the_upper_half_of_its_step() {
        let mut backoff = Backoff::new(100 * MS, 1000 * MS);
        for step in [100, 200, 400, 800, 1000, 1000] {
            assert_eq!(backoff.step(), step * MS);
            let delay = backoff.next_delay();
            assert!(
                delay >= step * MS / 2 && delay <= step * MS,
                "{delay:?} for a step of {step} ms"
            );
        }
    }

    #[test]
    fn reset_starts_from_the_first_step() {
        let mut backoff = Backoff::new(50 * MS, 1000 * MS);
        backoff.next_delay();
        backoff.next_delay();
        backoff.reset();
        assert_eq!(backoff.step(), 50 * MS);
    }

    #[test]
    fn delays_are_spread_rather_than_all_equal() {
        let mut delays: Vec<_> = (0..64).map(|_| Backoff::constant(200 * MS).next_delay()).collect();
        delays.sort();
        delays.dedup();
        assert!(delays.len() > 32, "only {} distinct delays of 64", delays.len());
    }

    #[test]
    fn the_delay_for_an_attempt_follows_the_same_steps_and_never_overflows() {
        for (attempt, step) in [(0, 500), (1, 1000), (2, 2000), (3, 4000), (4, 8000), (40, 8000)] {
            let delay = Backoff::delay_for_attempt(500 * MS, 8000 * MS, attempt);
            assert!(
                delay >= step * MS / 2 && delay <= step * MS,
                "attempt {attempt}: {delay:?}"
            );
        }
    }
}
