//! Request batching, like Ray Serve's `@serve.batch`: a [`Batcher`] gathers
//! the requests that concurrent [`Deployment::call`](crate::Deployment::call)s
//! submit into batches and runs one async handler per batch, so that a
//! model computes many inputs in one pass.
//!
//! **When a batch runs.** As soon as it holds `max_batch_size` requests, or
//! `wait_timeout` after its first request arrived, whichever comes first.
//! At most `max_concurrent_batches` run at once; meanwhile new requests
//! queue, and the next batch starts with what has gathered, so under load
//! batches fill without waiting. The two settings can be changed live
//! ([`Batcher::set_max_batch_size`], [`Batcher::set_wait_timeout`]), from
//! [`Deployment::reconfigure`](crate::Deployment::reconfigure) for example.
//!
//! **Filling.** A replica runs at most `max_ongoing_requests` calls at
//! once, so a batch can only fill when `max_ongoing_requests >=
//! max_batch_size` (as in Ray Serve); below that every batch waits out its
//! `wait_timeout`. With several replicas, each batches what it gets.
//!
//! **Costs.** Per request a channel send and a oneshot answer; per batch
//! two tokio tasks (one runs the handler, so that its panic is caught). A
//! request that finds no company waits `wait_timeout` (10 ms by default):
//! the latency batching trades for throughput. The handler runs on the
//! runtime of the first [`Batcher::submit`], in a replica the runtime of
//! its user code: a CPU-heavy handler occupies one of its threads while it
//! runs, as a CPU-heavy `call` would. The queue has no bound of its own:
//! it holds only requests whose callers wait, at most the replica's
//! `max_ongoing_requests`.
//!
//! **Failure.** A handler's error goes to every caller of its batch as
//! [`BatchError::Handler`] with the error's message; a handler that returns
//! a different number of responses than it got requests fails every caller
//! of the batch with [`BatchError::WrongLength`]; a panic, with
//! [`BatchError::Panicked`]. A caller that goes away (its future dropped)
//! is left out of a batch not yet started, or its answer is discarded; the
//! others are answered as usual. If the runtime the batcher runs on shuts
//! down, waiting callers get [`BatchError::Stopped`]; a submit outside a
//! tokio runtime fails with [`BatchError::NoRuntime`]. Once the last clone
//! of a batcher is dropped, its background task ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::deployment::BoxError;

/// How a [`Batcher`] forms and runs batches; Ray Serve's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOptions {
    /// The most requests in one batch (default 10). Batches fill only when
    /// the deployment's `max_ongoing_requests` is at least this.
    pub max_batch_size: usize,
    /// How long a batch waits for more requests after its first one
    /// (default 10 ms). Zero waits for none: a batch takes the requests
    /// that queued while the previous batch ran, so under load batches
    /// still fill and a lone request goes at once.
    pub wait_timeout: Duration,
    /// How many batches may run at once (default 1).
    pub max_concurrent_batches: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            max_batch_size: 10,
            wait_timeout: Duration::from_millis(10),
            max_concurrent_batches: 1,
        }
    }
}

impl BatchOptions {
    fn validate(&self) -> Result<(), BatchError> {
        check_batch_size(self.max_batch_size)?;
        if self.max_concurrent_batches == 0 {
            return Err(BatchError::InvalidOptions(
                "max_concurrent_batches must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

fn check_batch_size(max_batch_size: usize) -> Result<(), BatchError> {
    match max_batch_size {
        0 => Err(BatchError::InvalidOptions("max_batch_size must be at least 1".into())),
        _ => Ok(()),
    }
}

/// Why a submitted request got no response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("invalid batch options: {0}")]
    InvalidOptions(String),
    #[error("the batch handler failed: {0}")]
    Handler(String),
    #[error(
        "the batch handler returned {responses} responses for a batch of {requests} requests; \
         it must return one per request, in order"
    )]
    WrongLength { requests: usize, responses: usize },
    #[error("the batch handler panicked: {0}")]
    Panicked(String),
    #[error("the batcher stopped before answering: the runtime it ran on shut down")]
    Stopped,
    #[error("Batcher::submit must run on a tokio runtime (a replica's call does)")]
    NoRuntime,
}

/// What a batch handler returns.
type HandlerFuture<Resp> = Pin<Box<dyn Future<Output = Result<Vec<Resp>, BoxError>> + Send>>;
/// The batch handler, its future boxed.
type Handler<Req, Resp> = Arc<dyn Fn(Vec<Req>) -> HandlerFuture<Resp> + Send + Sync>;
/// Where a request's response goes.
type Answer<Resp> = oneshot::Sender<Result<Resp, BatchError>>;

/// Gathers the requests of concurrent calls into batches for one async
/// handler. A batch runs when it holds `max_batch_size` requests or
/// `wait_timeout` after its first request, at most
/// `max_concurrent_batches` at once; batches fill only when the
/// deployment's `max_ongoing_requests` is at least `max_batch_size`. The
/// handler's error, panic or wrong number of responses fails every caller
/// of its batch. Cheap to clone: the clones share one queue.
///
/// ```no_run
/// use raylet_serve::{BatchOptions, Batcher, BoxError, Deployment, Json, ReplicaContext};
///
/// struct Squares(Batcher<i64, i64>);
/// raylet_serve::register_deployment!(Squares);
///
/// impl Deployment for Squares {
///     type Init = ();
///     type UserConfig = ();
///     type Request = Json<i64>;
///     type Response = Json<i64>;
///     fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
///         let options = BatchOptions { max_batch_size: 8, ..BatchOptions::default() };
///         let squares = |batch: Vec<i64>| async move { Ok(batch.iter().map(|x| x * x).collect()) };
///         Ok(Squares(Batcher::new(options, squares)?))
///     }
///     async fn call(&self, Json(x): Json<i64>) -> Result<Json<i64>, BoxError> {
///         Ok(Json(self.0.submit(x).await?))
///     }
/// }
/// ```
pub struct Batcher<Req, Resp> {
    queue: mpsc::UnboundedSender<Pending<Req, Resp>>,
    /// The dispatcher until the first submit starts it on its runtime.
    idle: Arc<Mutex<Option<Dispatcher<Req, Resp>>>>,
    settings: Arc<Settings>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
            idle: self.idle.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// A batcher that runs `handler` on each batch; the handler returns
    /// one response per request, in the requests' order.
    pub fn new<F, Fut>(options: BatchOptions, handler: F) -> Result<Self, BatchError>
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Resp>, BoxError>> + Send + 'static,
    {
        options.validate()?;
        let settings = Arc::new(Settings::new(&options));
        let (queue, requests) = mpsc::unbounded_channel();
        let dispatcher = Dispatcher {
            requests,
            handler: Arc::new(move |batch| Box::pin(handler(batch))),
            running: Arc::new(Semaphore::new(options.max_concurrent_batches)),
            settings: settings.clone(),
        };
        Ok(Batcher {
            queue,
            idle: Arc::new(Mutex::new(Some(dispatcher))),
            settings,
        })
    }

    /// Adds `request` to the batch being gathered and waits for its
    /// response.
    pub async fn submit(&self, request: Req) -> Result<Resp, BatchError> {
        self.start_dispatcher()?;
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            request,
            answer,
            arrived: Instant::now(),
        };
        self.queue.send(pending).map_err(|_| BatchError::Stopped)?;
        answered.await.map_err(|_| BatchError::Stopped)?
    }

    /// Changes the largest batch; batches gathered from now on use it.
    pub fn set_max_batch_size(&self, max_batch_size: usize) -> Result<(), BatchError> {
        check_batch_size(max_batch_size)?;
        self.settings.max_batch_size.store(max_batch_size, Ordering::Relaxed);
        Ok(())
    }

    /// Changes how long a batch waits; batches gathered from now on use it.
    pub fn set_wait_timeout(&self, wait_timeout: Duration) {
        self.settings.set_wait_timeout(wait_timeout);
    }

    /// The options now in force.
    pub fn options(&self) -> BatchOptions {
        BatchOptions {
            max_batch_size: self.settings.max_batch_size(),
            wait_timeout: self.settings.wait_timeout(),
            max_concurrent_batches: self.settings.max_concurrent_batches,
        }
    }

    /// Starts the dispatcher on the caller's runtime, the first time.
    fn start_dispatcher(&self) -> Result<(), BatchError> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.is_none() {
            return Ok(());
        }
        let runtime = Handle::try_current().map_err(|_| BatchError::NoRuntime)?;
        if let Some(dispatcher) = idle.take() {
            runtime.spawn(dispatcher.run());
        }
        Ok(())
    }
}

/// The settings a batcher and its dispatcher share; the first two change
/// live.
struct Settings {
    max_batch_size: AtomicUsize,
    wait_timeout_nanos: AtomicU64,
    max_concurrent_batches: usize,
}

impl Settings {
    fn new(options: &BatchOptions) -> Self {
        let settings = Settings {
            max_batch_size: AtomicUsize::new(options.max_batch_size),
            wait_timeout_nanos: AtomicU64::new(0),
            max_concurrent_batches: options.max_concurrent_batches,
        };
        settings.set_wait_timeout(options.wait_timeout);
        settings
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size.load(Ordering::Relaxed)
    }

    fn wait_timeout(&self) -> Duration {
        Duration::from_nanos(self.wait_timeout_nanos.load(Ordering::Relaxed))
    }

    fn set_wait_timeout(&self, wait_timeout: Duration) {
        let nanos = u64::try_from(wait_timeout.as_nanos()).unwrap_or(u64::MAX);
        self.wait_timeout_nanos.store(nanos, Ordering::Relaxed);
    }
}

/// A submitted request and where its response goes.
struct Pending<Req, Resp> {
    request: Req,
    answer: Answer<Resp>,
    arrived: Instant,
}

impl<Req, Resp> Pending<Req, Resp> {
    /// Whether its caller went away.
    fn abandoned(&self) -> bool {
        self.answer.is_closed()
    }
}

/// The background task: gathers batches and starts their handlers.
struct Dispatcher<Req, Resp> {
    requests: mpsc::UnboundedReceiver<Pending<Req, Resp>>,
    handler: Handler<Req, Resp>,
    /// One permit per batch that may run.
    running: Arc<Semaphore>,
    settings: Arc<Settings>,
}

impl<Req: Send + 'static, Resp: Send + 'static> Dispatcher<Req, Resp> {
    /// Runs until every clone of the batcher is gone.
    async fn run(mut self) {
        loop {
            let Ok(permit) = self.running.clone().acquire_owned().await else {
                return;
            };
            let Some(mut batch) = self.gather().await else {
                return;
            };
            batch.retain(|pending| !pending.abandoned());
            if !batch.is_empty() {
                tokio::spawn(run_batch(self.handler.clone(), batch, permit));
            }
        }
    }

    /// The next batch: its first request, then more until the batch is
    /// full or `wait_timeout` has passed since that first request arrived;
    /// requests whose callers went away meanwhile are skipped. `None` once
    /// the queue is closed and empty.
    async fn gather(&mut self) -> Option<Vec<Pending<Req, Resp>>> {
        let first = self.requests.recv().await?;
        let max_batch_size = self.settings.max_batch_size();
        let deadline = first.arrived + self.settings.wait_timeout();
        let mut batch = vec![first];
        while batch.len() < max_batch_size {
            match tokio::time::timeout_at(deadline, self.requests.recv()).await {
                Ok(Some(pending)) if pending.abandoned() => continue,
                Ok(Some(pending)) => batch.push(pending),
                Ok(None) | Err(_) => break,
            }
        }
        Some(batch)
    }
}

/// Runs the handler on one batch and answers its callers; the permit is
/// held until then.
async fn run_batch<Req: Send + 'static, Resp: Send + 'static>(
    handler: Handler<Req, Resp>,
    batch: Vec<Pending<Req, Resp>>,
    _permit: OwnedSemaphorePermit,
) {
    let (requests, answers): (Vec<Req>, Vec<Answer<Resp>>) = batch.into_iter().map(|p| (p.request, p.answer)).unzip();
    let outcome = match tokio::spawn(async move { handler(requests).await }).await {
        Ok(Ok(responses)) => Ok(responses),
        Ok(Err(e)) => Err(BatchError::Handler(e.to_string())),
        Err(e) => Err(BatchError::Panicked(panic_message(e))),
    };
    answer_all(answers, outcome);
}

/// Sends each caller its response, or every caller the batch's error (a
/// wrong number of responses is one). A caller gone away is skipped.
fn answer_all<Resp>(answers: Vec<Answer<Resp>>, outcome: Result<Vec<Resp>, BatchError>) {
    let requests = answers.len();
    let outcome = outcome.and_then(|responses| match responses.len() {
        n if n == requests => Ok(responses),
        responses => Err(BatchError::WrongLength { requests, responses }),
    });
    match outcome {
        Ok(responses) => answers.into_iter().zip(responses).for_each(|(answer, response)| {
            let _ = answer.send(Ok(response));
        }),
        Err(error) => answers.into_iter().for_each(|answer| {
            let _ = answer.send(Err(error.clone()));
        }),
    }
}

/// What a panicking handler said.
fn panic_message(error: tokio::task::JoinError) -> String {
    let Ok(payload) = error.try_into_panic() else {
        return "its task was cancelled".to_string();
    };
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Answers each request with itself and the size of its batch.
    fn echo(options: BatchOptions) -> Batcher<u32, (u32, usize)> {
        Batcher::new(options, |batch: Vec<u32>| async move {
            let size = batch.len();
            Ok(batch.into_iter().map(|x| (x, size)).collect())
        })
        .expect("valid options")
    }

    fn options(max_batch_size: usize, wait_timeout: Duration) -> BatchOptions {
        BatchOptions {
            max_batch_size,
            wait_timeout,
            ..BatchOptions::default()
        }
    }

    /// Submits `requests` concurrently; their responses, in order.
    async fn submit_all<Resp: Send + 'static>(
        batcher: &Batcher<u32, Resp>,
        requests: impl IntoIterator<Item = u32>,
    ) -> Vec<Result<Resp, BatchError>> {
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(request).await })
            })
            .collect();
        let mut responses = Vec::with_capacity(tasks.len());
        for task in tasks {
            responses.push(task.await.expect("a submitting task"));
        }
        responses
    }

    #[test]
    fn the_defaults_are_ray_serves_and_bad_options_are_refused() {
        let defaults = BatchOptions::default();
        assert_eq!(
            (
                defaults.max_batch_size,
                defaults.wait_timeout,
                defaults.max_concurrent_batches
            ),
            (10, Duration::from_millis(10), 1)
        );
        let no_batch = Batcher::<u32, u32>::new(options(0, Duration::ZERO), |b| async move { Ok(b) });
        assert!(matches!(no_batch, Err(BatchError::InvalidOptions(_))));
        let none_at_once = BatchOptions {
            max_concurrent_batches: 0,
            ..BatchOptions::default()
        };
        assert!(matches!(
            Batcher::<u32, u32>::new(none_at_once, |b| async move { Ok(b) }),
            Err(BatchError::InvalidOptions(_))
        ));
        let batcher = echo(BatchOptions::default());
        assert!(matches!(
            batcher.set_max_batch_size(0),
            Err(BatchError::InvalidOptions(_))
        ));
        assert_eq!(
            batcher.options(),
            BatchOptions::default(),
            "a refused setting changes nothing"
        );
    }

    #[test]
    fn each_caller_gets_its_own_response_or_the_batchs_error() {
        let (answers, mut answered): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
        answer_all(answers, Ok(vec!['a', 'b', 'c']));
        let got: Vec<_> = answered.iter_mut().map(|a| a.try_recv().expect("an answer")).collect();
        assert_eq!(got, vec![Ok('a'), Ok('b'), Ok('c')]);

        let (answers, mut answered): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel::<Result<char, _>>()).unzip();
        answer_all(answers, Ok(vec!['a', 'b']));
        let wrong = BatchError::WrongLength {
            requests: 3,
            responses: 2,
        };
        assert!(answered.iter_mut().all(|a| a.try_recv() == Ok(Err(wrong.clone()))));
        assert!(
            wrong.to_string().contains("returned 2 responses for a batch of 3"),
            "{wrong}"
        );

        let (answers, mut answered): (Vec<_>, Vec<_>) = (0..2).map(|_| oneshot::channel::<Result<char, _>>()).unzip();
        drop(answered.pop());
        answer_all(answers, Err(BatchError::Handler("out of memory".into())));
        assert_eq!(
            answered[0].try_recv(),
            Ok(Err(BatchError::Handler("out of memory".into())))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_runs_without_waiting_for_the_timeout() {
        let batcher = echo(options(4, Duration::from_secs(3600)));
        let started = Instant::now();
        let responses = submit_all(&batcher, 0..4).await;
        assert_eq!(responses, (0..4).map(|x| Ok((x, 4))).collect::<Vec<_>>());
        assert!(started.elapsed() < Duration::from_secs(3600), "{:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_runs_once_the_wait_timeout_has_passed() {
        let batcher = echo(options(8, Duration::from_millis(10)));
        let started = Instant::now();
        assert_eq!(batcher.submit(7).await, Ok((7, 1)));
        assert!(
            started.elapsed() >= Duration::from_millis(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_wait_a_lone_request_goes_at_once_and_what_queues_meanwhile_is_the_next_batch() {
        let batcher = Batcher::new(options(32, Duration::ZERO), |batch: Vec<u32>| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let size = batch.len();
            Ok(batch.into_iter().map(|x| (x, size)).collect())
        })
        .expect("valid options");
        let started = Instant::now();
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(0).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let rest = submit_all(&batcher, 1..7).await;
        assert_eq!(first.await.expect("the first caller"), Ok((0, 1)));
        assert_eq!(rest, (1..7).map(|x| Ok((x, 6))).collect::<Vec<_>>());
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(10) && elapsed < Duration::from_millis(11),
            "two 5 ms batches back to back, no wait between: {elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn batches_never_exceed_the_size_and_settings_change_live() {
        let batcher = echo(options(3, Duration::from_millis(10)));
        let responses = submit_all(&batcher, 0..10).await;
        let sizes: Vec<usize> = responses.into_iter().map(|r| r.expect("a response").1).collect();
        assert!(sizes.iter().all(|&size| size <= 3), "{sizes:?}");
        assert_eq!(sizes.iter().filter(|&&size| size == 3).count(), 9, "{sizes:?}");
        batcher.set_max_batch_size(2).expect("a valid size");
        batcher.set_wait_timeout(Duration::from_secs(3600));
        let started = Instant::now();
        let responses = submit_all(&batcher, 0..4).await;
        assert!(responses.iter().all(|r| matches!(r, Ok((_, 2)))), "{responses:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "full batches of 2 do not wait"
        );
        assert_eq!(batcher.options().wait_timeout, Duration::from_secs(3600));
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_concurrent_batches_run_at_once() {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (now, peak) = (running.clone(), most.clone());
        let options = BatchOptions {
            max_batch_size: 2,
            wait_timeout: Duration::from_millis(1),
            max_concurrent_batches: 2,
        };
        let batcher = Batcher::new(options, move |batch: Vec<u32>| {
            let (now, peak) = (now.clone(), peak.clone());
            async move {
                peak.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(batch)
            }
        })
        .expect("valid options");
        let responses = submit_all(&batcher, 0..20).await;
        assert_eq!(responses, (0..20).map(Ok).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 2, "two batches ran together, never three");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_goes_away_is_left_out_and_the_others_are_answered() {
        let batcher = echo(options(8, Duration::from_millis(10)));
        let gone = {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.submit(99).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        gone.abort();
        let responses = submit_all(&batcher, [1, 2]).await;
        assert_eq!(responses, vec![Ok((1, 2)), Ok((2, 2))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_error_or_panic_reaches_every_caller_of_the_batch() {
        let failing = Batcher::<u32, u32>::new(options(2, Duration::from_secs(1)), |_| async move {
            Err("the weights are corrupt".into())
        })
        .expect("valid options");
        let expected = Err(BatchError::Handler("the weights are corrupt".into()));
        assert_eq!(submit_all(&failing, [1, 2]).await, vec![expected.clone(), expected]);
        let panicking = Batcher::<u32, u32>::new(options(2, Duration::from_secs(1)), |_| async move {
            panic!("index out of range")
        })
        .expect("valid options");
        let expected = Err(BatchError::Panicked("index out of range".into()));
        assert_eq!(submit_all(&panicking, [1, 2]).await, vec![expected.clone(), expected]);
        assert_eq!(
            failing.submit(3).await,
            Err(BatchError::Handler("the weights are corrupt".into())),
            "the batcher lives on"
        );
    }
}
