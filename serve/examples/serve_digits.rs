//! Serving the digits model with request batching, on the embedded
//! cluster: trains the digits MLP with raylet-train (two workers, a few
//! epochs; or loads a checkpoint of `DigitsTraining`, hidden size 64,
//! given with `--checkpoint DIR`), deploys it with 2 replicas that batch
//! requests (up to 32 within 5 ms), then classifies the held-out test
//! images over HTTP with a small concurrent client and prints the accuracy
//! and requests per second.
//!
//! `POST /digits` takes `{"pixels": [64 floats, 0..1, row by row]}` and
//! answers `{"digit": 3, "probabilities": [10 floats]}`.
//!
//! ```text
//! cargo run --release -p raylet-serve --example serve_digits -- \
//!     [--checkpoint DIR] [--epochs 5] [--concurrency 64] [--serve]
//! ```
//!
//! With `--serve` it then keeps serving until Ctrl-C and prints a `curl`
//! line that classifies a test image.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use raylet_models::digits::{self, Digit, DigitsMlp};
use raylet_serve::{
    Application, BatchOptions, Batcher, BoxError, Deployment, DeploymentConfig, HttpOptions, Json, ReplicaContext,
    ServeInstance,
};
use raylet_train::digits::DigitsTraining;
use raylet_train::{Checkpoint, RunConfig, ScalingConfig, Trainer};
use serde::{Deserialize, Serialize};

const PIXELS: usize = 64;
const CLASSES: usize = 10;
/// The batching of the model's replicas; bench/serve_ray.py's too.
const BATCHING: BatchOptions = BatchOptions {
    max_batch_size: 32,
    wait_timeout: Duration::from_millis(5),
    max_concurrent_batches: 1,
};

/// A request: one 8x8 image.
#[derive(Serialize, Deserialize)]
struct Pixels {
    pixels: Vec<f32>,
}

/// A response: the likeliest digit and every digit's probability.
#[derive(Serialize, Deserialize)]
struct Classified {
    digit: usize,
    probabilities: Vec<f32>,
}

/// Where a replica loads the model from.
#[derive(Serialize, Deserialize)]
struct ModelInit {
    checkpoint: PathBuf,
    hidden: usize,
}

/// The digits MLP behind a batcher: each batch is one forward pass.
struct DigitsModel {
    batcher: Batcher<Vec<f32>, Classified>,
}
raylet_serve::register_deployment!(DigitsModel);

impl Deployment for DigitsModel {
    type Init = ModelInit;
    type UserConfig = ();
    type Request = Json<Pixels>;
    type Response = Json<Classified>;

    fn new(init: ModelInit, _: &ReplicaContext) -> Result<Self, BoxError> {
        let device = Device::flex();
        let model = Checkpoint::from_directory(&init.checkpoint)
            .load_model(DigitsMlp::new(init.hidden, &device))
            .map_err(|e| format!("loading the model from {}: {e}", init.checkpoint.display()))?;
        let model = Arc::new(model);
        let batcher = Batcher::new(BATCHING, move |batch| {
            let (model, device) = (model.clone(), device.clone());
            async move { classify(&model, &device, batch) }
        })?;
        Ok(DigitsModel { batcher })
    }

    async fn call(&self, Json(image): Json<Pixels>) -> Result<Json<Classified>, BoxError> {
        if image.pixels.len() != PIXELS {
            return Err(format!("expected {PIXELS} pixels, got {}", image.pixels.len()).into());
        }
        Ok(Json(self.batcher.submit(image.pixels).await?))
    }
}

/// Classifies a batch of images in one forward pass.
fn classify(model: &DigitsMlp, device: &Device, batch: Vec<Vec<f32>>) -> Result<Vec<Classified>, BoxError> {
    let images = batch.len();
    let pixels: Vec<f32> = batch.into_iter().flatten().collect();
    let input = Tensor::<2>::from_data(TensorData::new(pixels, [images, PIXELS]), device);
    let scores = model.forward(input);
    let digits = scores.clone().argmax(1).into_data();
    let probabilities: Vec<f32> = softmax(scores, 1).into_data().try_into_vec()?;
    let classified = digits.iter::<i64>().zip(probabilities.chunks(CLASSES));
    Ok(classified
        .map(|(digit, probabilities)| Classified {
            digit: digit as usize,
            probabilities: probabilities.to_vec(),
        })
        .collect())
}

fn main() -> Result<(), BoxError> {
    let cluster = raylet::init()?;
    let data = digits::load(0.2, 0);
    let hidden = DigitsTraining::default().hidden;
    let (checkpoint, storage) = match flag("--checkpoint") {
        Some(path) => (PathBuf::from(path), None),
        None => {
            let epochs = flag("--epochs").map_or(Ok(5), |e| e.parse())?;
            let (checkpoint, storage) = train(&data, epochs)?;
            (checkpoint, Some(storage))
        }
    };
    let instance = deploy(&cluster, ModelInit { checkpoint, hidden })?;
    let concurrency = flag("--concurrency").map_or(Ok(64), |c| c.parse())?;
    let client = HttpClient::new(&instance, cluster.token());
    let runtime = tokio::runtime::Runtime::new()?;
    let score = runtime.block_on(classify_over_http(&client, &data.test, concurrency))?;
    println!(
        "classified {} held-out images over HTTP ({concurrency} at a time): {:.1}% right, {:.0} requests/s",
        data.test.len(),
        100.0 * score.correct as f64 / data.test.len() as f64,
        data.test.len() as f64 / score.elapsed.as_secs_f64()
    );
    if std::env::args().any(|arg| arg == "--serve") {
        let digit = &data.test[0];
        println!(
            "serving until Ctrl-C; this classifies a test image of a {}:",
            digit.label
        );
        println!("{}", curl_line(&client, digit));
        runtime.block_on(tokio::signal::ctrl_c())?;
    }
    instance.shutdown()?;
    cluster.shutdown()?;
    if let Some(storage) = storage {
        std::fs::remove_dir_all(storage)?;
    }
    Ok(())
}

/// Trains the MLP on two workers; its last checkpoint and the run's
/// storage directory.
fn train(data: &digits::DigitsSplit, epochs: u64) -> Result<(PathBuf, PathBuf), BoxError> {
    let storage = std::env::temp_dir().join(format!("raylet-serve-digits-{}", std::process::id()));
    let result = Trainer::new(DigitsTraining {
        epochs,
        ..DigitsTraining::default()
    })
    .scaling(ScalingConfig {
        num_workers: 2,
        ..ScalingConfig::default()
    })
    .run_config(RunConfig {
        name: "serve_digits".into(),
        storage_path: storage.clone(),
        ..RunConfig::default()
    })
    .dataset("train", data.train.clone())
    .dataset("test", data.test.clone())
    .fit()?;
    let accuracy = result.metrics.get("accuracy").unwrap_or(f64::NAN);
    println!(
        "trained the digits MLP on 2 workers for {epochs} epochs: {:.1}% test accuracy",
        100.0 * accuracy
    );
    let checkpoint = result.checkpoint.ok_or("the training run saved no checkpoint")?;
    Ok((checkpoint.path().to_path_buf(), storage))
}

/// Deploys the model under `/digits`: 2 replicas, each taking enough
/// requests at once to fill its batches.
fn deploy(cluster: &raylet::Cluster, init: ModelInit) -> Result<ServeInstance, BoxError> {
    let model = DeploymentConfig::new::<DigitsModel>("model", init)?
        .num_replicas(2)
        .max_ongoing_requests(2 * BATCHING.max_batch_size as u32)
        .num_cpus(0.5);
    let app = Application::new("digits", "/digits").deployment(model);
    Ok(raylet_serve::run_with(cluster, app, HttpOptions::default().port(0))?)
}

/// A client of the application's proxy, with the cluster token.
#[derive(Clone)]
struct HttpClient {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl HttpClient {
    fn new(instance: &ServeInstance, token: String) -> Self {
        // raylet-train turns on reqwest's `rustls-no-provider`, which needs
        // a provider installed before any client is built.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        HttpClient {
            http: reqwest::Client::new(),
            url: format!("http://{}/digits", instance.address()),
            token,
        }
    }

    async fn classify(&self, digit: &Digit) -> Result<Classified, BoxError> {
        let body = serde_json::to_vec(&Pixels {
            pixels: digit.pixels.clone(),
        })?;
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = response.status();
        let body = response.bytes().await?;
        if !status.is_success() {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)).into());
        }
        Ok(serde_json::from_slice(&body)?)
    }
}

/// How many test images came back right, and how long all took.
struct Score {
    correct: usize,
    elapsed: Duration,
}

/// Classifies every image over HTTP, `concurrency` requests at a time.
async fn classify_over_http(client: &HttpClient, test: &[Digit], concurrency: usize) -> Result<Score, BoxError> {
    let test: Arc<[Digit]> = test.into();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let senders: Vec<_> = (0..concurrency)
        .map(|_| tokio::spawn(send_in_turn(client.clone(), test.clone(), next.clone())))
        .collect();
    let mut correct = 0;
    for sender in senders {
        correct += sender.await??;
    }
    let elapsed = started.elapsed();
    Ok(Score { correct, elapsed })
}

/// Takes the next unclassified image until none is left; how many it got
/// right.
async fn send_in_turn(client: HttpClient, test: Arc<[Digit]>, next: Arc<AtomicUsize>) -> Result<usize, BoxError> {
    let mut correct = 0;
    while let Some(digit) = test.get(next.fetch_add(1, Ordering::Relaxed)) {
        let answer = client.classify(digit).await?;
        correct += usize::from(answer.digit == usize::from(digit.label));
    }
    Ok(correct)
}

/// A shell command that classifies `digit`.
fn curl_line(client: &HttpClient, digit: &Digit) -> String {
    let body = serde_json::json!({ "pixels": digit.pixels });
    format!(
        "curl -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -d '{body}' {}",
        client.token, client.url
    )
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}
