//! Telling the node manager whether this worker owns objects (a worker
//! that does is kept when its lease ends, so that its objects stay
//! reachable). It says so at once when the worker starts owning, but that
//! it stopped only once it has owned nothing for [`OWNING_SETTLE`]: a
//! worker that calls and gets one object at a time (Serve's proxy) would
//! otherwise send two session messages per call, each waking a thread here
//! and one in the node manager.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use raylet_proto::v1::WorkerSessionMessage;
use raylet_proto::v1::worker_session_message::Kind as SessionKind;
use tokio::sync::{Notify, mpsc};

/// How long a worker owns nothing before it tells its node it stopped.
pub(super) const OWNING_SETTLE: Duration = Duration::from_secs(1);

/// Whether the worker owns objects, and what its node was told.
#[derive(Default)]
pub(super) struct OwningReport {
    owns: AtomicBool,
    reported: AtomicBool,
    started_owning: Notify,
}

impl OwningReport {
    /// The memory store's hook: the worker now owns objects or none.
    pub(super) fn set(&self, owns: bool) {
        self.owns.store(owns, Ordering::SeqCst);
        if owns && !self.reported.load(Ordering::SeqCst) {
            self.started_owning.notify_one();
        }
    }

    /// Sends the changes on `session` until it closes.
    pub(super) async fn run(self: Arc<Self>, session: mpsc::UnboundedSender<WorkerSessionMessage>) {
        let send = |owns: bool| {
            session
                .send(WorkerSessionMessage {
                    kind: Some(SessionKind::OwnsObjects(owns)),
                })
                .is_ok()
        };
        loop {
            let open = match self.reported.load(Ordering::SeqCst) {
                true => {
                    tokio::time::sleep(OWNING_SETTLE).await;
                    self.stop_if_owning_nothing(send)
                }
                false => {
                    self.started_owning.notified().await;
                    let owns = self.owns.load(Ordering::SeqCst);
                    self.reported.store(owns, Ordering::SeqCst);
                    !owns || send(true)
                }
            };
            if !open {
                return;
            }
        }
    }

    /// Reports that the worker stopped owning, unless it owns again. The
    /// order (reported first, then the check) lets a concurrent
    /// [`set`](Self::set) either see nothing reported, and notify, or be
    /// seen here.
    fn stop_if_owning_nothing(&self, send: impl Fn(bool) -> bool) -> bool {
        if self.owns.load(Ordering::SeqCst) {
            return true;
        }
        self.reported.store(false, Ordering::SeqCst);
        if self.owns.load(Ordering::SeqCst) {
            self.reported.store(true, Ordering::SeqCst);
            return true;
        }
        send(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owns(message: WorkerSessionMessage) -> bool {
        match message.kind {
            Some(SessionKind::OwnsObjects(owns)) => owns,
            other => panic!("expected an owning message, got {other:?}"),
        }
    }

    /// A running report and what it sends.
    fn started() -> (Arc<OwningReport>, mpsc::UnboundedReceiver<WorkerSessionMessage>) {
        let report = Arc::new(OwningReport::default());
        let (session, sent) = mpsc::unbounded_channel();
        tokio::spawn(report.clone().run(session));
        (report, sent)
    }

    #[tokio::test(start_paused = true)]
    async fn starting_to_own_is_told_at_once_and_stopping_only_after_owning_nothing_for_the_settle_time() {
        let (report, mut sent) = started();
        report.set(true);
        assert!(owns(sent.recv().await.expect("a message")));

        // A call at a time: owning and not, far more often than the settle time.
        for _ in 0..1_000 {
            report.set(false);
            report.set(true);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(sent.try_recv().is_err(), "flapping sent messages");

        report.set(false);
        let started = tokio::time::Instant::now();
        assert!(!owns(sent.recv().await.expect("a message")));
        assert!(started.elapsed() <= OWNING_SETTLE * 2, "{:?}", started.elapsed());
        assert!(sent.try_recv().is_err());

        report.set(true);
        assert!(owns(sent.recv().await.expect("a message")));
    }

    #[tokio::test(start_paused = true)]
    async fn owning_again_before_the_settle_time_sends_nothing() {
        let (report, mut sent) = started();
        report.set(true);
        assert!(owns(sent.recv().await.expect("a message")));
        report.set(false);
        tokio::time::sleep(OWNING_SETTLE / 2).await;
        report.set(true);
        tokio::time::sleep(OWNING_SETTLE * 5).await;
        assert!(sent.try_recv().is_err(), "a worker that owns again said it stopped");
    }
}
