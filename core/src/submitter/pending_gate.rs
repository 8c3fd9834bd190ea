//! Backpressure on submission: a process may have at most so many tasks
//! and actor calls submitted and not yet finished. Past that, `remote()`
//! and actor calls wait for room instead of growing the owner's memory
//! without limit, as Ray's `max_pending_calls` does for actor calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Pending tasks and actor calls per process by default: twice Ray's
/// release test of a million queued tasks, which must run with the
/// defaults; at the few hundred bytes a pending task costs its owner,
/// about 0.6 GB at most of a driver's memory. A driver reaches it only
/// when it submits faster than the cluster runs for a long while.
pub(crate) const DEFAULT_MAX_PENDING_TASKS: usize = 2_000_000;

/// Counts a process's pending tasks and admits new ones while there is room.
/// A submitter that had to wait resumes once an eighth of the limit has
/// finished, so that it submits a run of tasks per wake-up rather than one.
pub(crate) struct PendingGate {
    limit: usize,
    /// Where waiting submitters resume.
    resume_at: usize,
    counts: Mutex<Counts>,
    room: Condvar,
    /// Whether the first wait was logged.
    told: AtomicBool,
}

impl PendingGate {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        let limit = limit.max(1);
        Arc::new(PendingGate {
            limit,
            resume_at: limit - limit.div_ceil(8),
            counts: Mutex::new(Counts::default()),
            room: Condvar::new(),
            told: AtomicBool::new(false),
        })
    }

    /// A permit for one more pending task, once there is room. A thread of
    /// an async runtime is admitted at once, past the limit: blocking it
    /// could stop the very work that makes room.
    pub(crate) fn admit(self: &Arc<Self>) -> PendingPermit {
        let mut counts = self.counts();
        if counts.pending >= self.limit && tokio::runtime::Handle::try_current().is_err() {
            if !self.told.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    limit = self.limit,
                    "this process has as many tasks pending as it may (Config::max_pending_tasks); \
                     new submissions wait until some finish"
                );
            }
            counts.waiting += 1;
            while counts.pending > self.resume_at {
                counts = self.room.wait(counts).unwrap_or_else(|p| p.into_inner());
            }
            counts.waiting -= 1;
        }
        counts.pending += 1;
        PendingPermit(self.clone())
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tasks submitted and not finished now.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.counts().pending
    }

    /// Submitters waiting for room now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.counts().waiting
    }
}

#[derive(Default)]
struct Counts {
    /// Tasks submitted and not finished.
    pending: usize,
    /// Submitters waiting for room.
    waiting: usize,
}

/// One pending task's place; dropping it makes room.
pub(crate) struct PendingPermit(Arc<PendingGate>);

impl Drop for PendingPermit {
    fn drop(&mut self) {
        let gate = &self.0;
        let mut counts = gate.counts();
        counts.pending -= 1;
        if counts.pending == gate.resume_at && counts.waiting > 0 {
            gate.room.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn wait_until_one_waits(gate: &PendingGate) {
        while gate.waiting() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_submission_past_the_limit_waits_until_a_pending_task_finishes() {
        let gate = PendingGate::new(2);
        let first = gate.admit();
        let _second = gate.admit();
        let third = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let _third = gate.admit();
                gate.pending()
            })
        };
        wait_until_one_waits(&gate);
        assert_eq!(gate.pending(), 2);
        drop(first);
        assert_eq!(third.join().unwrap(), 2);
        assert_eq!(gate.pending(), 1);
    }

    #[test]
    fn a_waiting_submission_resumes_once_an_eighth_of_the_limit_finished() {
        let gate = PendingGate::new(16);
        let mut held: Vec<PendingPermit> = (0..16).map(|_| gate.admit()).collect();
        let waiting = {
            let gate = gate.clone();
            std::thread::spawn(move || drop(gate.admit()))
        };
        wait_until_one_waits(&gate);
        held.truncate(15);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(gate.waiting(), 1, "one finished task of 16 is not room enough");
        held.truncate(14);
        waiting.join().unwrap();
        assert_eq!(gate.waiting(), 0);
    }

    #[test]
    fn a_runtime_thread_is_admitted_past_the_limit() {
        let gate = PendingGate::new(1);
        let _held = gate.admit();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let permit = runtime.block_on(async { gate.admit() });
        assert_eq!(gate.pending(), 2);
        drop(permit);
        assert_eq!(gate.pending(), 1);
    }
}
