//! Streaming generators: a remote function or actor method that yields
//! items gives its caller an [`ObjectRefStream`], whose references arrive
//! one by one as the worker yields them, long before the call ends. The
//! owner's side of a call is in `table.rs`; the worker's in
//! `worker/generator.rs`.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use raylet_proto::TaskId;

use self::table::{GeneratorState, Next};
use crate::core_worker::CoreWorker;
use crate::objects::object_ref::handle::AnyObjectRef;
use crate::submitter::SubmitterEvent;
use crate::value::Outcome;
use crate::{Error, ObjectRef, Result};

pub(crate) mod table;

pub use self::table::DEFAULT_BACKPRESSURE;

/// The references a generator call yields, in order, each as soon as the
/// worker yields it: an `Iterator` for sync callers and a `Stream` for
/// async ones. Each item is an object of its own (inline when small, in
/// the node's shared-memory store when large) that can be fetched, waited
/// on or passed to other tasks while the generator still runs.
///
/// The stream ends when the generator does; an error the generator
/// returned, or the loss of its worker with no retries left, comes as the
/// last item. Dropping the stream before its end cancels the call.
pub struct ObjectRefStream<T> {
    state: Arc<GeneratorState>,
    /// The call's outcome, held while the stream is.
    end: AnyObjectRef,
    core: Arc<CoreWorker>,
    /// How the call is stopped when the stream is dropped.
    caller: Caller,
    finished: bool,
    /// The wait of an async `poll_next` that found no item.
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    item: PhantomData<fn() -> T>,
}

/// Who runs a generator call for its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A task: the submitter cancels it, queued or running.
    Task,
    /// An actor method: its worker is told to stop it.
    Actor,
}

impl<T> ObjectRefStream<T> {
    /// The stream of call `task`, opened when it was submitted; `returns`
    /// holds the reference to its outcome.
    pub(crate) fn of_call(
        core: &Arc<CoreWorker>,
        task: TaskId,
        mut returns: Vec<AnyObjectRef>,
        caller: Caller,
    ) -> Self {
        let state = core
            .owner
            .generators
            .get(task)
            .expect("a generator call's stream is opened as it is submitted");
        ObjectRefStream::new(state, returns.remove(0), core.clone(), caller)
    }

    fn new(state: Arc<GeneratorState>, end: AnyObjectRef, core: Arc<CoreWorker>, caller: Caller) -> Self {
        ObjectRefStream {
            state,
            end,
            core,
            caller,
            finished: false,
            waiting: None,
            item: PhantomData,
        }
    }

    /// The reference to the call's outcome: the number of items yielded,
    /// or the error that ended the generator.
    pub fn completed(&self) -> ObjectRef<u64> {
        self.end.clone().typed()
    }

    /// Items that came back so far, taken or not.
    pub fn items_received(&self) -> u64 {
        self.state.received()
    }

    /// Stops the generator: it ends before its next item, and the stream
    /// ends with a `Cancelled` error after the items that came back.
    pub fn cancel(&self) {
        self.state.stop();
        if self.caller == Caller::Task {
            let _ = self.core.submitter.send(SubmitterEvent::Cancel {
                object: self.state.end(),
                force: false,
            });
        }
    }

    /// The next item if there is one now, or what to wait on.
    fn poll_item(&mut self) -> Polled<T> {
        if self.finished {
            return Polled::Done(None);
        }
        let placeholder = match self.state.take() {
            Next::Item(item) => return Polled::Done(Some(Ok(item.typed()))),
            Next::Wait(placeholder) => placeholder,
        };
        let outcome = match self.core.owner.store.try_get(self.state.end()) {
            Ok(None) => return Polled::Wait(placeholder),
            Ok(Some(outcome)) => outcome,
            Err(error) => {
                self.close();
                return Polled::Done(Some(Err(error)));
            }
        };
        // Items come in before the end does: one may have come since.
        match self.state.take() {
            Next::Item(item) => Polled::Done(Some(Ok(item.typed()))),
            Next::Wait(_) => Polled::Done(self.end_with(outcome)),
        }
    }

    /// The stream ends: with nothing after the last item, or with the error.
    fn end_with(&mut self, outcome: Outcome) -> Option<Result<ObjectRef<T>>> {
        self.close();
        outcome.err().map(|error| Err(Error::Task(error)))
    }

    /// The stream has ended: items that still come are deleted.
    fn close(&mut self) {
        self.finished = true;
        self.core.owner.generators.close(self.state.task);
    }

    /// Waits without blocking a thread for the next item or the end.
    pub async fn next_async(&mut self) -> Option<Result<ObjectRef<T>>> {
        loop {
            match self.poll_item() {
                Polled::Done(item) => return item,
                Polled::Wait(placeholder) => wait_either(self.core.clone(), placeholder, self.state.end()).await,
            }
        }
    }
}

/// An item, or the end; or what to wait for before looking again.
enum Polled<T> {
    Done(Option<Result<ObjectRef<T>>>),
    Wait(AnyObjectRef),
}

/// Waits until the placeholder's item or the end of the stream is there.
async fn wait_either(core: Arc<CoreWorker>, placeholder: AnyObjectRef, end: raylet_proto::ObjectId) {
    let store = &core.owner.store;
    tokio::select! {
        _ = store.wait(placeholder.id(), None) => {}
        _ = store.wait(end, None) => {}
    }
}

impl<T> Iterator for ObjectRefStream<T> {
    type Item = Result<ObjectRef<T>>;

    /// Blocks until the next item comes or the stream ends.
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.poll_item() {
                Polled::Done(item) => return item,
                Polled::Wait(placeholder) => {
                    self.core.wait_for_any(&[placeholder.id(), self.state.end()]);
                }
            }
        }
    }
}

impl<T> Stream for ObjectRefStream<T> {
    type Item = Result<ObjectRef<T>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(waiting) = this.waiting.as_mut() {
                if waiting.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.waiting = None;
            }
            match this.poll_item() {
                Polled::Done(item) => return Poll::Ready(item),
                Polled::Wait(placeholder) => {
                    let end = this.state.end();
                    this.waiting = Some(Box::pin(wait_either(this.core.clone(), placeholder, end)));
                }
            }
        }
    }
}

impl<T> Unpin for ObjectRefStream<T> {}

impl<T> Drop for ObjectRefStream<T> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Ok(None) = self.core.owner.store.try_get(self.state.end()) {
            self.cancel();
        }
        self.core.owner.generators.close(self.state.task);
    }
}

impl<T> std::fmt::Debug for ObjectRefStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ObjectRefStream({}, {} received)",
            self.state.task,
            self.state.received()
        )
    }
}
