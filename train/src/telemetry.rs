//! What Train tells the operator while it runs: the step and allreduce
//! time histograms (`raylet_train_step_seconds`,
//! `raylet_train_allreduce_seconds` on the head's `/metrics`), and the
//! allreduce's phases as timeline spans when the job's timeline is on.

use std::sync::LazyLock;
use std::time::Duration;

use raylet::metrics::Histogram;

/// Seconds, from 1 ms to 1 min.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static ALLREDUCE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::new(
        "raylet_train_allreduce_seconds",
        "Time of one allreduce over a collective group, by algorithm",
        BUCKETS,
        &["algorithm"],
    )
});

/// An allreduce of `algorithm` took `elapsed`.
pub(crate) fn allreduce(algorithm: &str, elapsed: Duration) {
    ALLREDUCE_SECONDS.observe(&[algorithm], elapsed.as_secs_f64());
}

/// The step histogram: steps are timed at gradient allreduces, which only
/// burn's models make (feature `burn`).
#[cfg(feature = "burn")]
mod steps {
    use std::sync::{LazyLock, Mutex};
    use std::time::{Duration, Instant};

    use raylet::metrics::Histogram;

    use super::BUCKETS;

    /// A longer pause between two gradient allreduces is not a step.
    const LONGEST_STEP: Duration = Duration::from_secs(600);

    static STEP_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
        Histogram::new(
            "raylet_train_step_seconds",
            "Time between a rank's gradient allreduces: forward, backward, allreduce and optimizer step",
            BUCKETS,
            &[],
        )
    });
    static LAST_STEP: Mutex<Option<Instant>> = Mutex::new(None);

    /// A gradient allreduce starts: the time since the last one is a step.
    pub(crate) fn step() {
        let now = Instant::now();
        let mut last = LAST_STEP.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(previous) = last.replace(now) {
            let step = now - previous;
            if step < LONGEST_STEP {
                STEP_SECONDS.observe(&[], step.as_secs_f64());
            }
        }
    }
}

#[cfg(feature = "burn")]
pub(crate) use steps::step;
