//! raylet-serve's side of `bench/compare_serve.sh`: two applications on the
//! embedded cluster, served over HTTP until stdin closes.
//!
//! - `noop` (POST /noop): the body is taken and ignored, the answer is
//!   `{"ok": true}`; 2 replicas, `max_ongoing_requests` 64.
//! - `digits` (POST /digits): `{"pixels": [64 floats]}` -> `{"digit": k}`
//!   through an MLP of the digits model's shape (64 -> hidden -> 10, ReLU)
//!   with the weights in a JSON file; 2 replicas, `max_ongoing_requests`
//!   64, requests batched as Ray Serve's side batches them (a [`Batcher`]
//!   with up to 32 within 5 ms, one batch at a time per replica). The only
//!   difference: Ray computes a batch with numpy, this side with plain
//!   Rust loops over its rows.
//! - `digits_nowait` (POST /digits_nowait): the same with a wait timeout of
//!   0, as Ray's side sets `batch_wait_timeout_s=0`: a batch takes the
//!   requests that queued while the replica's previous batch ran.
//!
//! `serve_bench --write-weights W.json [--hidden 64]` writes fixed
//! pseudo-random weights (the same file feeds Ray Serve's side);
//! `serve_bench --weights W.json [--port P]` serves and prints
//! `READY noop=<port> digits=<port> digits_nowait=<port> token=<token>`.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use raylet_serve::{
    Application, BatchOptions, Batcher, BoxError, Deployment, DeploymentConfig, HttpOptions, Json, ReplicaContext,
};
use serde::{Deserialize, Serialize};

/// Takes any body and answers `{"ok": true}`.
struct Noop;
raylet_serve::register_deployment!(Noop);

#[derive(Serialize, Deserialize)]
struct Answer {
    ok: bool,
}

impl Deployment for Noop {
    type Init = ();
    type UserConfig = ();
    type Request = bytes::Bytes;
    type Response = Json<Answer>;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Noop)
    }

    async fn call(&self, _: bytes::Bytes) -> Result<Json<Answer>, BoxError> {
        Ok(Json(Answer { ok: true }))
    }
}

/// The MLP's weights, as Ray Serve's side reads them too.
#[derive(Serialize, Deserialize)]
struct Weights {
    w1: Vec<Vec<f32>>,
    b1: Vec<f32>,
    w2: Vec<Vec<f32>>,
    b2: Vec<f32>,
}

#[derive(Serialize, Deserialize)]
struct Pixels {
    pixels: Vec<f32>,
}

#[derive(Serialize, Deserialize)]
struct Digit {
    digit: usize,
}

/// bench/serve_ray.py's `@serve.batch(max_batch_size=32, batch_wait_timeout_s=...)`.
fn batching(wait_timeout: Duration) -> BatchOptions {
    BatchOptions {
        max_batch_size: 32,
        wait_timeout,
        max_concurrent_batches: 1,
    }
}

/// Where the weights are and how long a batch waits.
#[derive(Serialize, Deserialize)]
struct DigitsInit {
    weights: String,
    wait_timeout_ms: u64,
}

/// Classifies 64 pixels with the MLP, in batches.
struct Digits {
    batcher: Batcher<Vec<f32>, Digit>,
    pixels: usize,
}
raylet_serve::register_deployment!(Digits);

impl Deployment for Digits {
    type Init = DigitsInit;
    type UserConfig = ();
    type Request = Json<Pixels>;
    type Response = Json<Digit>;

    fn new(init: DigitsInit, _: &ReplicaContext) -> Result<Self, BoxError> {
        let weights: Arc<Weights> = Arc::new(serde_json::from_slice(&std::fs::read(init.weights)?)?);
        let pixels = weights.w1.len();
        let options = batching(Duration::from_millis(init.wait_timeout_ms));
        let batcher = Batcher::new(options, move |batch: Vec<Vec<f32>>| {
            let weights = weights.clone();
            async move { Ok(batch.iter().map(|pixels| classify(&weights, pixels)).collect()) }
        })?;
        Ok(Digits { batcher, pixels })
    }

    async fn call(&self, Json(input): Json<Pixels>) -> Result<Json<Digit>, BoxError> {
        if input.pixels.len() != self.pixels {
            return Err(format!("expected {} pixels, got {}", self.pixels, input.pixels.len()).into());
        }
        Ok(Json(self.batcher.submit(input.pixels).await?))
    }
}

/// The likeliest digit of one image.
fn classify(weights: &Weights, pixels: &[f32]) -> Digit {
    let hidden = layer(pixels, &weights.w1, &weights.b1, true);
    let scores = layer(&hidden, &weights.w2, &weights.b2, false);
    let digit = (0..scores.len())
        .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
        .unwrap_or(0);
    Digit { digit }
}

/// `x @ w + b`, with ReLU when asked.
fn layer(x: &[f32], w: &[Vec<f32>], b: &[f32], relu: bool) -> Vec<f32> {
    let mut out = b.to_vec();
    for (value, row) in x.iter().zip(w) {
        out.iter_mut().zip(row).for_each(|(o, weight)| *o += value * weight);
    }
    if relu {
        out.iter_mut().for_each(|o| *o = o.max(0.0));
    }
    out
}

/// Fixed pseudo-random weights of the digits model's shape.
fn made_weights(hidden: usize) -> Weights {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 2000) as f32 / 10_000.0 - 0.1
    };
    let mut matrix = |rows: usize, cols: usize| (0..rows).map(|_| (0..cols).map(|_| next()).collect()).collect();
    Weights {
        w1: matrix(64, hidden),
        b1: vec![0.0; hidden],
        w2: matrix(hidden, 10),
        b2: vec![0.0; 10],
    }
}

fn main() -> Result<(), BoxError> {
    if let Some(path) = flag("--write-weights") {
        let hidden = flag("--hidden").map_or(Ok(64), |h| h.parse())?;
        std::fs::write(path, serde_json::to_vec(&made_weights(hidden))?)?;
        return Ok(());
    }
    let weights = flag("--weights").ok_or("--weights W.json (or --write-weights W.json) is needed")?;
    let port: u16 = flag("--port").map_or(Ok(8000), |p| p.parse())?;
    let cluster = raylet::init()?;
    let http = |offset: u16| HttpOptions::default().host([127, 0, 0, 1].into()).port(port + offset);
    let config = |deployment: DeploymentConfig| deployment.num_replicas(2).max_ongoing_requests(64).num_cpus(0.0);
    let noop = Application::new("noop", "/noop").deployment(config(DeploymentConfig::new::<Noop>("noop", ())?));
    let digits_app = |name: &str, wait_timeout_ms: u64| -> Result<Application, BoxError> {
        let init = DigitsInit {
            weights: weights.clone(),
            wait_timeout_ms,
        };
        let deployment = config(DeploymentConfig::new::<Digits>("digits", init)?);
        Ok(Application::new(name, &format!("/{name}")).deployment(deployment))
    };
    let noop = raylet_serve::run_with(&cluster, noop, http(0))?;
    let digits = raylet_serve::run_with(&cluster, digits_app("digits", 5)?, http(1))?;
    let nowait = raylet_serve::run_with(&cluster, digits_app("digits_nowait", 0)?, http(2))?;
    println!(
        "READY noop={} digits={} digits_nowait={} token={}",
        noop.address().port(),
        digits.address().port(),
        nowait.address().port(),
        cluster.token()
    );
    std::io::stdin().read_to_end(&mut Vec::new())?;
    for app in [noop, digits, nowait] {
        app.shutdown()?;
    }
    cluster.shutdown()?;
    Ok(())
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}
