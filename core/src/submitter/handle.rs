//! How the rest of the process reaches the submitter: an event sent to its
//! loop, or handled at once on the calling thread under the lock the loop
//! takes too. A synchronous task's submission and its result are handled
//! at once, so that neither waits for a runtime thread to wake (waking one
//! took about a third of a 34 us round trip here). A thread that is already
//! handling an event sends instead, so the submitter never re-enters itself.

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tokio::sync::mpsc::{self, error::SendError};

use super::Submitter;
use super::events::SubmitterEvent;

/// The submitter's state, shared by its loop and the threads that handle
/// events at once.
pub(super) struct SubmitterState {
    /// `None` before the loop starts and once it stopped.
    submitter: Mutex<Option<Submitter>>,
    /// Told when an event handled at once moved the next idle lease's
    /// deadline before the one the loop sleeps until.
    pub(super) rearm: Notify,
}

impl SubmitterState {
    pub(super) fn lock(&self) -> MutexGuard<'_, Option<Submitter>> {
        self.submitter.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A way to the submitter, which any thread may hold.
#[derive(Clone)]
pub(crate) struct SubmitterHandle {
    pub(super) events: mpsc::UnboundedSender<SubmitterEvent>,
    state: Weak<SubmitterState>,
}

/// What the submitter's loop takes: the events sent, and its state.
pub(crate) struct SubmitterInbox {
    pub(super) handle: SubmitterHandle,
    pub(super) received: mpsc::UnboundedReceiver<SubmitterEvent>,
    pub(super) state: Arc<SubmitterState>,
}

/// A handle to a submitter that [`Submitter::spawn`] starts on the inbox;
/// events sent before then wait for it.
pub(crate) fn submitter_channel() -> (SubmitterHandle, SubmitterInbox) {
    let (events, received) = mpsc::unbounded_channel();
    let state = Arc::new(SubmitterState {
        submitter: Mutex::new(None),
        rearm: Notify::new(),
    });
    let handle = SubmitterHandle {
        events,
        state: Arc::downgrade(&state),
    };
    let inbox = SubmitterInbox {
        handle: handle.clone(),
        received,
        state,
    };
    (handle, inbox)
}

thread_local! {
    /// Whether this thread is handling a submitter event.
    static HANDLING: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as handling a submitter event while it lives.
pub(super) struct Handling(());

impl Handling {
    pub(super) fn start() -> Self {
        HANDLING.set(true);
        Handling(())
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        HANDLING.set(false);
    }
}

impl SubmitterHandle {
    /// Sends `event` to the submitter's loop; fails once it stopped.
    pub(crate) fn send(&self, event: SubmitterEvent) -> Result<(), SendError<SubmitterEvent>> {
        self.events.send(event)
    }

    /// Handles `event` on this thread, or sends it to the loop when this
    /// thread is already handling one, or the loop has not started or
    /// stopped. Fails once the loop stopped.
    pub(crate) fn handle_now(&self, event: SubmitterEvent) -> Result<(), SendError<SubmitterEvent>> {
        if HANDLING.get() || matches!(event, SubmitterEvent::Shutdown(_)) {
            return self.send(event);
        }
        let Some(state) = self.state.upgrade() else {
            return self.send(event);
        };
        let mut slot = state.lock();
        let Some(submitter) = slot.as_mut() else {
            drop(slot);
            return self.send(event);
        };
        let _runtime = submitter.owner.ctx.runtime.enter();
        let handling = Handling::start();
        submitter.handle(event);
        drop(handling);
        if submitter.linger_moved_earlier() {
            state.rearm.notify_one();
        }
        Ok(())
    }
}
