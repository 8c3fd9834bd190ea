//! Request batching over real HTTP on an embedded cluster: concurrent
//! requests share batches of at most `max_batch_size` and each gets its own
//! answer, a lone request is answered once the wait timeout has passed, a
//! handler's error or a wrong number of responses is a 500 for every request
//! of the batch, and a deployment calling a batched one through a
//! `DeploymentHandle` gets the right answers.

use crate::common;

use std::time::{Duration, Instant};

use common::{Answer, Client, deploy, init, runtime, small};
use raylet_serve::{
    Application, BatchOptions, Batcher, BoxError, Deployment, DeploymentHandle, Json, ReplicaContext, ServeInstance,
    register_deployment,
};
use serde::{Deserialize, Serialize};

/// The largest batch of the batched deployment.
const MAX_BATCH_SIZE: usize = 8;
/// Requests a replica takes at once: enough to fill batches.
const MAX_ONGOING_REQUESTS: u32 = 32;
/// How long a batch waits for company: long enough that requests sent
/// together share batches on a busy machine.
const WAIT_TIMEOUT_MS: u64 = 50;

/// What the batch handler of [`Squares`] does with a batch.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
enum Handler {
    /// Squares every number.
    Square,
    /// Fails the batch, naming its size.
    Fail,
    /// Returns one response too few.
    DropOne,
}

/// How [`Squares`] is built.
#[derive(Serialize, Deserialize)]
struct SquaresInit {
    handler: Handler,
    wait_timeout_ms: u64,
}

/// A number's square and the size of the batch it was computed in.
#[derive(Debug, Serialize, Deserialize)]
struct Squared {
    square: i64,
    batch_size: usize,
}

/// Squares numbers in batches of up to [`MAX_BATCH_SIZE`].
struct Squares {
    batcher: Batcher<i64, Squared>,
}
register_deployment!(Squares);

impl Deployment for Squares {
    type Init = SquaresInit;
    type UserConfig = ();
    type Request = Json<i64>;
    type Response = Json<Squared>;

    fn new(init: SquaresInit, _: &ReplicaContext) -> Result<Self, BoxError> {
        let options = BatchOptions {
            max_batch_size: MAX_BATCH_SIZE,
            wait_timeout: Duration::from_millis(init.wait_timeout_ms),
            ..BatchOptions::default()
        };
        let handler = init.handler;
        let batcher = Batcher::new(options, move |batch| async move { square_batch(handler, batch) })?;
        Ok(Squares { batcher })
    }

    async fn call(&self, Json(number): Json<i64>) -> Result<Json<Squared>, BoxError> {
        Ok(Json(self.batcher.submit(number).await?))
    }
}

fn square_batch(handler: Handler, batch: Vec<i64>) -> Result<Vec<Squared>, BoxError> {
    let batch_size = batch.len();
    let squared = batch.into_iter().map(|n| Squared {
        square: n * n,
        batch_size,
    });
    match handler {
        Handler::Square => Ok(squared.collect()),
        Handler::Fail => Err(format!("refused a batch of {batch_size}").into()),
        Handler::DropOne => Ok(squared.skip(1).collect()),
    }
}

/// The sum of squares of a list, each square asked of [`Squares`]
/// concurrently through a handle; with the largest batch size seen.
struct SumOfSquares {
    squares: DeploymentHandle<Squares>,
}
register_deployment!(SumOfSquares);

impl Deployment for SumOfSquares {
    type Init = ();
    type UserConfig = ();
    type Request = Json<Vec<i64>>;
    type Response = Json<(i64, usize)>;

    fn new(_: (), context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(SumOfSquares {
            squares: DeploymentHandle::new(&context.app, "squares"),
        })
    }

    async fn call(&self, Json(numbers): Json<Vec<i64>>) -> Result<Json<(i64, usize)>, BoxError> {
        let calls: Vec<_> = numbers
            .into_iter()
            .map(|n| {
                let squares = self.squares.clone();
                tokio::spawn(async move { squares.call(Json(n)).await })
            })
            .collect();
        let (mut sum, mut largest_batch) = (0, 0);
        for call in calls {
            let Json(squared) = call.await??;
            sum += squared.square;
            largest_batch = largest_batch.max(squared.batch_size);
        }
        Ok(Json((sum, largest_batch)))
    }
}

fn squares_config(handler: Handler, wait_timeout_ms: u64) -> raylet_serve::DeploymentConfig {
    let init = SquaresInit {
        handler,
        wait_timeout_ms,
    };
    small::<Squares>("squares", init).max_ongoing_requests(MAX_ONGOING_REQUESTS)
}

fn serve_squares(cluster: &raylet::Cluster, handler: Handler, wait_timeout_ms: u64) -> ServeInstance {
    let app = Application::new("squares", "/square").deployment(squares_config(handler, wait_timeout_ms));
    deploy(cluster, app)
}

/// Posts `numbers` to `/square`, all at once; the answers in order.
fn post_concurrently(client: &Client, numbers: impl IntoIterator<Item = i64>) -> Vec<Answer> {
    runtime().block_on(async {
        let requests: Vec<_> = numbers
            .into_iter()
            .map(|n| {
                let client = client.clone();
                tokio::spawn(async move { client.post_json("/square", &n.to_string()).await })
            })
            .collect();
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            answers.push(request.await.expect("a request task"));
        }
        answers
    })
}

#[test]
fn concurrent_requests_share_batches_and_each_gets_its_answer() {
    let cluster = init();
    let instance = serve_squares(&cluster, Handler::Square, WAIT_TIMEOUT_MS);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let answers = post_concurrently(&client, 0..32);
    let mut sizes = Vec::new();
    for (n, answer) in (0..32).zip(&answers) {
        assert_eq!(answer.status, 200, "{}", answer.text());
        let squared: Squared = serde_json::from_slice(&answer.body).expect("a Squared");
        assert_eq!(squared.square, n * n, "{n}: {squared:?}");
        sizes.push(squared.batch_size);
    }
    assert!(
        sizes.iter().any(|&size| size > 1),
        "some requests shared a batch: {sizes:?}"
    );
    assert!(sizes.iter().all(|&size| size <= MAX_BATCH_SIZE), "{sizes:?}");
    instance.shutdown().expect("stopped");
}

#[test]
fn a_lone_request_is_answered_once_the_wait_timeout_has_passed() {
    let cluster = init();
    let instance = serve_squares(&cluster, Handler::Square, 300);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let started = Instant::now();
    let answers = post_concurrently(&client, [7]);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(answers[0].status, 200, "{}", answers[0].text());
    assert_eq!(answers[0].json(), serde_json::json!({"square": 49, "batch_size": 1}));
}

#[test]
fn a_failing_handler_is_a_500_for_every_request_of_its_batch() {
    let cluster = init();
    let instance = serve_squares(&cluster, Handler::Fail, WAIT_TIMEOUT_MS);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let answers = post_concurrently(&client, 0..16);
    let mut sizes = Vec::new();
    for answer in &answers {
        assert_eq!(answer.status, 500, "{}", answer.text());
        let error = answer.json()["error"].as_str().expect("an error message").to_string();
        let size = error.strip_prefix("the batch handler failed: refused a batch of ");
        sizes.push(size.and_then(|s| s.parse::<usize>().ok()).expect(&error));
    }
    assert!(
        sizes.iter().any(|&size| size > 1),
        "a batch's error reached all of it: {sizes:?}"
    );
}

#[test]
fn a_wrong_number_of_responses_is_a_500_that_says_so() {
    let cluster = init();
    let instance = serve_squares(&cluster, Handler::DropOne, WAIT_TIMEOUT_MS);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let answers = post_concurrently(&client, 0..8);
    for answer in &answers {
        assert_eq!(answer.status, 500, "{}", answer.text());
        let error = answer.json()["error"].as_str().expect("an error message").to_string();
        assert!(error.contains("responses for a batch of"), "{error}");
        assert!(error.contains("one per request"), "{error}");
    }
}

#[test]
fn a_deployment_calls_a_batched_one_through_a_handle() {
    let cluster = init();
    let ingress = small::<SumOfSquares>("sum", ());
    let app = Application::new("sums", "/sum")
        .deployment(ingress)
        .deployment(squares_config(Handler::Square, WAIT_TIMEOUT_MS));
    let instance = deploy(&cluster, app);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let answer = runtime().block_on(client.post_json("/sum", "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"));
    assert_eq!(answer.status, 200, "{}", answer.text());
    let (sum, largest_batch): (i64, usize) = serde_json::from_slice(&answer.body).expect("a sum and a size");
    assert_eq!(sum, 385);
    assert!((1..=MAX_BATCH_SIZE).contains(&largest_batch), "{largest_batch}");
}
