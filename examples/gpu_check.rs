//! What raylet does on a CUDA GPU, run by `bench/gpu_check.sh` where one is
//! lent (built with the `cuda` feature: burn-cuda, kernels through NVRTC):
//!
//! 1. burn-cuda is right: a matmul and a training step on the GPU equal the
//!    CPU's within tolerance;
//! 2. tensors move between host and GPU, raw and through the object store
//!    (a put on the driver, a get by an actor on the GPU), in GB/s;
//! 3. the digits and the GPT (`--model`, `small` by default) train on one
//!    GPU, beside 2 CPU workers;
//! 4. two data-parallel workers share the GPU (0.5 each), then the GPT
//!    trains with ZeRO-3 on them;
//! 5. Data classifies the test digits with an actor pool of half GPUs;
//! 6. a Serve replica on the GPU answers HTTP;
//!
//! while `nvidia-smi` is sampled every 2 s for the processes on the GPU. It
//! prints a Markdown table of every step, also written to `--out`.
//!
//! With `GPU_CHECK_ON_CPU=1` every step runs on the CPU, on a node with one
//! fake GPU: a rehearsal of the script where no GPU is lent, whose figures
//! mean nothing.
//!
//! `gpu_check [--data target/gpt-example/data] [--model small] [--out gpu_check.md]`

use std::error::Error;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use clap::Parser;
use raylet::FakeGpus;
use raylet_data::{ActorPoolStrategy, BatchModel, Dataset, ModelError, register_batch_model};
use raylet_lm::prepare::{TRAIN_DIR, VALIDATION_DIR};
use raylet_lm::{GptTraining, TokenRow, TrainingRows, token_rows};
use raylet_models::digits::{self, Digit, DigitsMlp, batch};
use raylet_models::gpt::GptConfig;
use raylet_serve::{Application, BoxError, Deployment, DeploymentConfig, HttpOptions, Json, ReplicaContext};
use raylet_train::digits::DigitsTraining;
use raylet_train::sharding::ShardingStrategy;
use raylet_train::{Checkpoint, RunConfig, ScalingConfig, TensorRef, TrainResult, Trainer, WorkerResources};
use serde::{Deserialize, Serialize};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Set (and inherited by the workers) for a rehearsal on the CPU.
const ON_CPU: &str = "GPU_CHECK_ON_CPU";

fn rehearsal() -> bool {
    std::env::var_os(ON_CPU).is_some()
}

/// The device GPU work runs on: this process's GPU, the CPU in a rehearsal.
fn gpu_device() -> Device {
    match rehearsal() {
        true => Device::flex(),
        false => Device::cuda(0),
    }
}

/// Run everything raylet does on a GPU and print what it measured.
#[derive(Parser)]
struct Args {
    /// A corpus prepared by the `gpt` example (tokenizer and Parquet rows).
    #[arg(long, default_value = "target/gpt-example/data")]
    data: PathBuf,
    /// The GPT preset trained on the GPU: tiny, small or base.
    #[arg(long, default_value = "small")]
    model: String,
    /// Optimizer steps of each GPT run.
    #[arg(long, default_value_t = 20)]
    gpt_steps: u64,
    /// Epochs of each digits run.
    #[arg(long, default_value_t = 10)]
    epochs: u64,
    /// Where the Markdown table is written.
    #[arg(long, default_value = "gpu_check.md")]
    out: PathBuf,
}

/// One line of the table: what ran, and what it gave.
struct Row {
    step: String,
    result: String,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpu_check: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let mut config = raylet::Config::default().num_cpus(6.0);
    match rehearsal() {
        true => config = config.gpu_detector(Arc::new(FakeGpus::new(1))),
        false => raylet_train::check_cuda_runtime()?,
    }
    let cluster = raylet::init_with(config)?;
    let gpus = cluster
        .status()?
        .alive()
        .map(|node| node.stats.gpus.clone())
        .collect::<Vec<_>>();
    println!("GPUs the node detected: {gpus:?}");
    let sampler = GpuSampler::start();
    let mut rows = vec![Row {
        step: "GPU".into(),
        result: nvidia_smi(&["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
    }];
    let gpu = gpu_device();
    rows.extend(check_kernels(&gpu)?);
    rows.extend(copy_bandwidth(&cluster, &gpu)?);
    let data = digits::load(0.2, 0);
    let (digits_rows, checkpoint) = digits_runs(&data, args.epochs)?;
    rows.extend(digits_rows);
    rows.extend(gpt_runs(&args)?);
    rows.push(batch_inference(&checkpoint, &data.test)?);
    rows.push(serve_on_gpu(&cluster, &checkpoint, &data.test)?);
    rows.push(Row {
        step: "nvidia-smi during the runs".into(),
        result: sampler.stop(),
    });
    let table = markdown(&rows);
    println!("\n{table}");
    std::fs::write(&args.out, table)?;
    cluster.shutdown()?;
    Ok(())
}

/// Step 1: a 1024x1024 matmul and one SGD step of the digits MLP, on the
/// GPU and on the CPU.
fn check_kernels(gpu: &Device) -> Result<Vec<Row>> {
    let cpu = Device::flex();
    let a = Tensor::<2>::random([1024, 1024], Distribution::Normal(0.0, 1.0), &cpu);
    let b = Tensor::<2>::random([1024, 1024], Distribution::Normal(0.0, 1.0), &cpu);
    let on_cpu: Vec<f32> = a.clone().matmul(b.clone()).into_data().try_into_vec()?;
    let on_gpu: Vec<f32> = a.to_device(gpu).matmul(b.to_device(gpu)).into_data().try_into_vec()?;
    let largest = on_cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
    let error = on_cpu.iter().zip(&on_gpu).fold(0f32, |m, (c, g)| m.max((c - g).abs())) / largest;
    let matmul_ok = error < 1e-3;

    let digits = digits::load(0.2, 0).train[..256].to_vec();
    let cpu_autodiff = cpu.clone().autodiff();
    cpu_autodiff.seed(7);
    let model = DigitsMlp::new(64, &cpu_autodiff);
    let gpu_autodiff = gpu.clone().autodiff();
    // Each copy gets an autodiff graph of its own.
    let (cpu_before, cpu_after) = one_sgd_step(model.clone().fork(&cpu_autodiff), &digits, &cpu_autodiff);
    let (gpu_before, gpu_after) = one_sgd_step(model.fork(&gpu_autodiff), &digits, &gpu_autodiff);
    let step_ok = (cpu_before - gpu_before).abs() < 1e-4 && (cpu_after - gpu_after).abs() < 1e-4;
    if !(matmul_ok && step_ok) {
        return Err(format!("burn-cuda disagrees with the CPU: matmul error {error:e}, losses {cpu_before}/{gpu_before} then {cpu_after}/{gpu_after}").into());
    }
    Ok(vec![
        Row {
            step: "1. matmul 1024x1024, GPU against CPU".into(),
            result: format!("largest difference {error:.1e} of the largest value: equal"),
        },
        Row {
            step: "1. one SGD step of the digits MLP, GPU against CPU".into(),
            result: format!(
                "loss {cpu_before:.5} -> {cpu_after:.5} on the CPU, {gpu_before:.5} -> {gpu_after:.5} on the GPU"
            ),
        },
    ])
}

/// The loss of `model` on `digits` before and after one SGD step on them.
fn one_sgd_step(model: DigitsMlp, digits: &[Digit], device: &Device) -> (f32, f32) {
    let (pixels, labels) = batch(digits, device);
    let loss_of =
        |model: &DigitsMlp| CrossEntropyLoss::new(None, device).forward(model.forward(pixels.clone()), labels.clone());
    let loss = loss_of(&model);
    let before = loss.clone().into_scalar::<f32>();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let model = SgdConfig::new().init().step(0.1, model, grads);
    (before, loss_of(&model).into_scalar::<f32>())
}

/// Elements of the tensor the copies move: 256 MiB of f32.
const COPIED: usize = 64 << 20;

/// The actor that reads a stored tensor onto its GPU.
#[raylet::actor]
struct GpuReader;

#[raylet::actor]
impl GpuReader {
    fn new() -> Self {
        GpuReader
    }

    /// Seconds to get `tensor` onto this actor's GPU (from the object store
    /// and across PCIe), and its sum there.
    fn get_onto_gpu(&self, tensor: TensorRef<1>) -> (f64, f32) {
        let cluster = raylet::current().expect("actors run in a cluster");
        let started = Instant::now();
        let on_gpu = tensor.get(&cluster, &gpu_device()).expect("the tensor reads");
        let sum = on_gpu.sum().into_scalar::<f32>();
        (started.elapsed().as_secs_f64(), sum)
    }
}

/// Step 2: host to GPU and back, raw, then through the object store.
fn copy_bandwidth(cluster: &raylet::Cluster, gpu: &Device) -> Result<Vec<Row>> {
    let gigabytes = (COPIED * 4) as f64 / 1e9;
    let host = TensorData::new(vec![1.0f32; COPIED], [COPIED]);
    let started = Instant::now();
    let on_gpu = Tensor::<1>::from_data(host, gpu);
    gpu.sync()?;
    let upload = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let _ = on_gpu.to_data();
    let download = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let stored = TensorRef::put(cluster, on_gpu)?;
    let put = started.elapsed().as_secs_f64();
    let reader = GpuReader::remote(cluster).num_cpus(0.0).num_gpus(0.5).spawn()?;
    let (get, sum) = reader.get_onto_gpu(stored).get()?;
    cluster.kill(&reader, true)?;
    if sum != COPIED as f32 {
        return Err(format!("the tensor read onto the GPU sums to {sum}, not {COPIED}").into());
    }
    let rate = |seconds: f64| format!("{:.1} GB/s", gigabytes / seconds);
    Ok(vec![
        Row {
            step: "2. 256 MiB host -> GPU / GPU -> host (burn-cuda)".into(),
            result: format!("{} / {}", rate(upload), rate(download)),
        },
        Row {
            step: "2. 256 MiB GPU tensor put (GPU -> host -> object store) / get by a GPU actor (store -> its GPU)"
                .into(),
            result: format!("{} / {}", rate(put), rate(get)),
        },
    ])
}

/// Step 3 and 4's digits: 1 GPU, 2 CPU workers, 2 workers on half a GPU
/// each. The rows, and the GPU run's checkpoint.
fn digits_runs(data: &digits::DigitsSplit, epochs: u64) -> Result<(Vec<Row>, PathBuf)> {
    let mut rows = Vec::new();
    let mut checkpoint = None;
    for (place, workers, gpus) in [
        ("3. digits MLP, 1 worker on the GPU", 1, 1.0),
        ("3. digits MLP, 2 CPU workers", 2, 0.0),
        ("4. digits MLP, 2 workers sharing the GPU (0.5 each)", 2, 0.5),
    ] {
        let started = Instant::now();
        let result = Trainer::new(DigitsTraining {
            epochs,
            ..DigitsTraining::default()
        })
        .scaling(scaling(workers, gpus))
        .run_config(run_config(&format!("digits-{workers}-{gpus}")))
        .dataset("train", data.train.clone())
        .dataset("test", data.test.clone())
        .fit()?;
        let metric = |name| result.metrics.get(name).unwrap_or(f64::NAN);
        rows.push(Row {
            step: place.into(),
            result: format!(
                "{:.2}% test accuracy after {epochs} epochs, {:.0} samples/s, {:.1} s",
                100.0 * metric("accuracy"),
                metric("samples_per_second"),
                started.elapsed().as_secs_f64()
            ),
        });
        if gpus == 1.0 {
            checkpoint = result.checkpoint.map(|c| c.path().to_path_buf());
        }
    }
    Ok((rows, checkpoint.ok_or("the GPU digits run wrote no checkpoint")?))
}

/// Steps 3 and 4's GPT: `--model` on 1 GPU and on 2 CPU workers, then
/// with ZeRO-3 on 2 workers sharing the GPU.
fn gpt_runs(args: &Args) -> Result<Vec<Row>> {
    let tokenizer = std::fs::read_to_string(args.data.join("tokenizer.json"))
        .map_err(|e| format!("{}: {e} (prepare it with the gpt example)", args.data.display()))?;
    let validation: Vec<TokenRow> = token_rows(&args.data.join(VALIDATION_DIR))
        .show_progress(false)
        .take_all()?;
    let preparation: serde_json::Value = serde_json::from_slice(&std::fs::read(args.data.join("preparation.json"))?)?;
    let size = |field: &str| {
        preparation[field]
            .as_u64()
            .map(|n| n as usize)
            .ok_or(format!("no {field} in preparation.json"))
    };
    let model = GptConfig {
        context_length: size("sequence_length")?,
        ..GptConfig::named(&args.model, size("vocab_size")?)?
    };
    let mut rows = Vec::new();
    for (place, workers, gpus, sharding) in [
        ("3. GPT, 1 worker on the GPU", 1, 1.0, ShardingStrategy::None),
        ("3. GPT, 2 CPU workers", 2, 0.0, ShardingStrategy::None),
        (
            "4. GPT with ZeRO-3, 2 workers sharing the GPU",
            2,
            0.5,
            ShardingStrategy::Parameters,
        ),
    ] {
        let split = token_rows(&args.data.join(TRAIN_DIR))
            .show_progress(false)
            .random_shuffle(0)
            .streaming_split(workers)?;
        let training = GptTraining {
            validation: validation.iter().take(64).cloned().collect(),
            steps: args.gpt_steps,
            global_batch_size: 16,
            report_every: args.gpt_steps.max(1),
            sharding,
            ..GptTraining::new(model.clone(), tokenizer.clone(), TrainingRows::Shards(split.shards()))
        };
        let started = Instant::now();
        let result: TrainResult = Trainer::new(training)
            .scaling(scaling(workers, gpus))
            .run_config(run_config(&format!("gpt-{workers}-{gpus}")))
            .fit()?;
        let metric = |name| result.metrics.get(name).unwrap_or(f64::NAN);
        rows.push(Row {
            step: format!(
                "{place} ({}, {:.1}M parameters)",
                args.model,
                model.parameter_count() as f64 / 1e6
            ),
            result: format!(
                "{:.0} tokens/s, validation loss {:.3} after {} steps, {:.1} s",
                metric("tokens_per_second"),
                metric("validation_loss"),
                args.gpt_steps,
                started.elapsed().as_secs_f64()
            ),
        });
    }
    Ok(rows)
}

fn scaling(workers: usize, gpus: f64) -> ScalingConfig {
    ScalingConfig {
        num_workers: workers,
        use_gpu: gpus > 0.0 && !rehearsal(),
        resources_per_worker: WorkerResources {
            num_cpus: 1.0,
            num_gpus: gpus,
            ..WorkerResources::default()
        },
        ..ScalingConfig::default()
    }
}

fn run_config(name: &str) -> RunConfig {
    RunConfig {
        name: format!("gpu-check-{name}-{}", std::process::id()),
        storage_path: std::env::temp_dir().join("raylet-gpu-check"),
        ..RunConfig::default()
    }
}

/// A test digit as the pool classified it, and where.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Classified {
    label: u8,
    predicted: u8,
    gpu_ids: Vec<u32>,
}

/// The digits MLP of a checkpoint, classifying on its actor's GPU.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ClassifyOnGpu {
    checkpoint: PathBuf,
}
register_batch_model!(ClassifyOnGpu);

impl BatchModel for ClassifyOnGpu {
    type In = Digit;
    type Out = Classified;
    type State = DigitsMlp;

    fn load(&self) -> std::result::Result<DigitsMlp, ModelError> {
        load_digits(&self.checkpoint, &gpu_device()).map_err(|e| e.to_string().into())
    }

    fn predict(&self, model: &mut DigitsMlp, digits: Vec<Digit>) -> std::result::Result<Vec<Classified>, ModelError> {
        let predicted = classify(model, &digits, &gpu_device())?;
        Ok(digits
            .iter()
            .zip(predicted)
            .map(|(digit, predicted)| Classified {
                label: digit.label,
                predicted,
                gpu_ids: raylet::gpu_ids(),
            })
            .collect())
    }
}

fn load_digits(checkpoint: &Path, device: &Device) -> Result<DigitsMlp> {
    let model = DigitsMlp::new(DigitsTraining::default().hidden, device);
    Ok(Checkpoint::from_directory(checkpoint).load_model(model)?)
}

/// The likeliest digit of each image, in one forward pass.
fn classify(model: &DigitsMlp, digits: &[Digit], device: &Device) -> std::result::Result<Vec<u8>, ModelError> {
    let (pixels, _) = batch(digits, device);
    let predicted = model.forward(pixels).argmax(1).into_data();
    Ok(predicted.iter::<i64>().map(|digit| digit as u8).collect())
}

/// Step 5: the test digits through a pool of 2 actors on half a GPU each.
fn batch_inference(checkpoint: &Path, test: &[Digit]) -> Result<Row> {
    let started = Instant::now();
    let pool = ActorPoolStrategy::fixed(2).num_gpus(0.5);
    let model = ClassifyOnGpu {
        checkpoint: checkpoint.to_path_buf(),
    };
    let classified = Dataset::from_items(test.to_vec())
        .map_batches_with(model, 64, pool)
        .show_progress(false)
        .take_all()?;
    let correct = classified.iter().filter(|c| c.label == c.predicted).count();
    let mut gpus: Vec<Vec<u32>> = classified.iter().map(|c| c.gpu_ids.clone()).collect();
    gpus.sort();
    gpus.dedup();
    Ok(Row {
        step: "5. Data: test digits through an actor pool of 2 x 0.5 GPU".into(),
        result: format!(
            "{} of {} right, actors on GPU ids {gpus:?}, {:.1} s",
            correct,
            classified.len(),
            started.elapsed().as_secs_f64()
        ),
    })
}

/// The digits MLP as a Serve deployment on its replica's GPU.
struct DigitsOnGpu {
    model: DigitsMlp,
}
raylet_serve::register_deployment!(DigitsOnGpu);

/// A request: one 8x8 image; the answer: its digit.
#[derive(Serialize, Deserialize)]
struct Pixels {
    pixels: Vec<f32>,
}

impl Deployment for DigitsOnGpu {
    type Init = PathBuf;
    type UserConfig = ();
    type Request = Json<Pixels>;
    type Response = Json<(u8, Vec<u32>)>;

    fn new(checkpoint: PathBuf, _: &ReplicaContext) -> std::result::Result<Self, BoxError> {
        let model = load_digits(&checkpoint, &gpu_device()).map_err(|e| e.to_string())?;
        Ok(DigitsOnGpu { model })
    }

    async fn call(&self, Json(image): Json<Pixels>) -> std::result::Result<Json<(u8, Vec<u32>)>, BoxError> {
        let digit = Digit {
            pixels: image.pixels,
            label: 0,
        };
        let predicted = classify(&self.model, &[digit], &gpu_device()).map_err(|e| e.to_string())?;
        Ok(Json((predicted[0], raylet::gpu_ids())))
    }
}

/// Step 6: one replica on half a GPU, asked over HTTP for 200 test digits.
fn serve_on_gpu(cluster: &raylet::Cluster, checkpoint: &Path, test: &[Digit]) -> Result<Row> {
    let deployment = DeploymentConfig::new::<DigitsOnGpu>("digits", checkpoint.to_path_buf())?
        .num_cpus(0.0)
        .num_gpus(0.5);
    let app = Application::new("digits", "/digits").deployment(deployment);
    let instance = raylet_serve::run_with(cluster, app, HttpOptions::default().port(0))?;
    let started = Instant::now();
    let asked = &test[..200.min(test.len())];
    let mut correct = 0;
    let mut gpu_ids = Vec::new();
    for digit in asked {
        let body = serde_json::to_vec(&Pixels {
            pixels: digit.pixels.clone(),
        })?;
        let answer = http_post(&instance.address().to_string(), "/digits", &cluster.token(), &body)?;
        let (predicted, ids): (u8, Vec<u32>) = serde_json::from_slice(&answer)?;
        correct += usize::from(predicted == digit.label);
        gpu_ids = ids;
    }
    let elapsed = started.elapsed().as_secs_f64();
    instance.shutdown()?;
    Ok(Row {
        step: "6. Serve: a replica on 0.5 GPU answering HTTP".into(),
        result: format!(
            "{correct} of {} right over HTTP, replica on GPU ids {gpu_ids:?}, {:.0} requests/s one at a time",
            asked.len(),
            asked.len() as f64 / elapsed
        ),
    })
}

/// The body of an HTTP/1.1 POST of JSON with the cluster's token.
fn http_post(address: &str, path: &str, token: &str, body: &[u8]) -> Result<Vec<u8>> {
    let mut stream = std::net::TcpStream::connect(address)?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no header end")?;
    let status = String::from_utf8_lossy(&response[..split]);
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "the replica answered {status}: {}",
            String::from_utf8_lossy(&response[split..])
        )
        .into());
    }
    Ok(response[split + 4..].to_vec())
}

/// `nvidia-smi`'s answer to `args`, on one line.
fn nvidia_smi(args: &[&str]) -> String {
    match Command::new("nvidia-smi").args(args).output() {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout).trim().replace('\n', "; "),
        Ok(output) => format!("nvidia-smi failed: {}", String::from_utf8_lossy(&output.stderr).trim()),
        Err(error) => format!("no nvidia-smi: {error}"),
    }
}

/// Samples the processes on the GPU every 2 s, on a thread of its own.
struct GpuSampler {
    running: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
    thread: std::thread::JoinHandle<()>,
}

impl GpuSampler {
    fn start() -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (flag, lines) = (running.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while flag.load(Ordering::Relaxed) {
                let apps = nvidia_smi(&[
                    "--query-compute-apps=pid,process_name,used_memory",
                    "--format=csv,noheader",
                ]);
                let mut lines = lines.lock().expect("the sampler's lines");
                let processes = apps.split("; ").filter(|line| !line.is_empty()).count();
                lines.push(format!("{processes} process(es): {apps}"));
                drop(lines);
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        GpuSampler { running, seen, thread }
    }

    /// The sample with the most processes on the GPU.
    fn stop(self) -> String {
        self.running.store(false, Ordering::Relaxed);
        let _ = self.thread.join();
        let seen = self.seen.lock().expect("the sampler's lines");
        let busiest = seen.iter().max_by_key(|line| line.split("; ").count());
        format!(
            "{} samples; the busiest: {}",
            seen.len(),
            busiest.map_or("none", String::as_str)
        )
    }
}

fn markdown(rows: &[Row]) -> String {
    let mut table = String::from("| Step | Result |\n|---|---|\n");
    for row in rows {
        table.push_str(&format!("| {} | {} |\n", row.step, row.result.replace('|', "/")));
    }
    table
}
