//! The raylet side of the Parquet, images and shuffle benchmarks of
//! `bench/compare_data.sh --only parquet|images|shuffle` (the harness is
//! bench/compare_data_wave2.py; its block "the raylet side's contract" is
//! what this program implements). Each benchmark mode starts an embedded
//! cluster of 2 CPUs (timed apart, as `init_s`), times its pipeline
//! (`seconds`), and prints one JSON line, the last line of its stdout:
//!
//!   parquet --input DIR --output OUT
//!       read_parquet(DIR) -> map_batches(out = c0 * 2 + c1, the other
//!       columns kept) -> write_parquet(OUT), timed to write_parquet's
//!       return; then, untimed, OUT's files are read back here (the `out`
//!       and `c0` columns, a record batch at a time): rows, sum_out, sum_c0.
//!   shuffle --input DIR --seed S
//!       read_parquet(DIR) -> random_shuffle(S), consumed fully by
//!       iter_batches in the driver, counting the rows and summing c0.
//!   images --input DIR --checkpoint C --actors N
//!       read_images(DIR, labels from the folders) -> map_batches_with(the
//!       CNN of C, 64 images a batch, N actors of 1 CPU, one compute thread
//!       each) -> take_all: rows, label_sum, pred_hist (10 counts).
//!
//! and two helpers the harness runs once before the images mode:
//!
//!   digits --output FILE
//!       the 1797 8x8 digits (raylet-train's, from scikit-learn) as CSV, one
//!       a line: 64 pixel values 0..16, then the label.
//!   checkpoint --output C --seed S
//!       trains the CNN (conv 1->8 3x3, relu, maxpool 2, conv 8->16 3x3,
//!       relu, maxpool 2, flatten, linear 576->10, no padding) on the digits
//!       upscaled to 32x32 as bench/make_data.py makes the images (4x4
//!       blocks of v * 255 / 16, gaussian noise of sigma 24, rounded and
//!       clipped to 0..255), a few epochs with Adam on the flex backend,
//!       prints its accuracy on held-out digits and writes its parameters
//!       (a burn record, burnpack bytes) to C.
//!
//! `cargo build --release -p raylet-data --example data_bench`, then
//! `target/release/examples/data_bench <mode> --help`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::{Bytes, TensorData};
use clap::{Parser, Subcommand};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use raylet_data::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use raylet_data::arrow::compute::kernels::numeric::{add, mul};
use raylet_data::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use raylet_data::arrow::error::ArrowError;
use raylet_data::{
    ActorPoolStrategy, BatchModel, Dataset, Image, ImageOptions, ModelError, register_arrow_fn, register_batch_model,
};
use raylet_models::digits::Digit;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Parser)]
#[command(about = "The raylet side of bench/compare_data.sh --only parquet|images|shuffle")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// read_parquet -> map_batches(out = c0 * 2 + c1) -> write_parquet.
    Parquet {
        #[arg(long)]
        input: PathBuf,
        /// A directory that does not exist yet.
        #[arg(long)]
        output: PathBuf,
        /// Rows per map_batches call.
        #[arg(long, default_value_t = 1 << 20)]
        batch_size: usize,
        #[command(flatten)]
        run: RunOptions,
    },
    /// read_parquet -> random_shuffle(seed), consumed fully in the driver.
    Shuffle {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        seed: u64,
        /// Rows per batch of iter_batches.
        #[arg(long, default_value_t = 1 << 16)]
        batch_rows: usize,
        #[command(flatten)]
        run: RunOptions,
    },
    /// read_images -> the CNN in a pool of actors -> take_all.
    Images {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        checkpoint: PathBuf,
        #[arg(long, default_value_t = 2)]
        actors: usize,
        /// Images per predict call.
        #[arg(long, default_value_t = 64)]
        batch_size: usize,
        /// Image files per block (one actor call reads, decodes and classifies a block).
        #[arg(long, default_value_t = 256)]
        files_per_block: usize,
        /// Compute threads per actor (Ray's side: one torch thread per actor).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[command(flatten)]
        run: RunOptions,
    },
    /// Writes small inputs of the three modes, for a smoke run without
    /// Python: `OUT/parquet` (ROWS rows of c0..c7 in 2 files) and
    /// `OUT/images/<label>/img_NNNNN.png` (IMAGES noisy upscaled digits).
    Sample {
        #[arg(long)]
        output: PathBuf,
        #[arg(long, default_value_t = 20_000)]
        rows: usize,
        #[arg(long, default_value_t = 200)]
        images: usize,
    },
    /// Writes the 8x8 digits as CSV: 64 pixel values 0..16, then the label, per line.
    Digits {
        #[arg(long)]
        output: PathBuf,
    },
    /// Trains the CNN on upscaled noisy digits and writes its parameters.
    Checkpoint {
        #[arg(long)]
        output: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value_t = 8)]
        epochs: usize,
        #[arg(long, default_value_t = 64)]
        batch_size: usize,
        #[arg(long, default_value_t = 3e-3)]
        learning_rate: f64,
    },
}

/// What every benchmark mode shares.
#[derive(clap::Args)]
struct RunOptions {
    /// CPUs of the embedded cluster.
    #[arg(long, default_value_t = 2.0)]
    cpus: f64,
    /// Blocks processed or held at once (raylet-data's default when absent).
    #[arg(long)]
    max_blocks_in_flight: Option<usize>,
    /// Bytes per block (raylet-data's default, 64 MiB, when absent).
    #[arg(long)]
    block_bytes: Option<u64>,
}

impl RunOptions {
    fn apply<T>(&self, dataset: Dataset<T>) -> Dataset<T> {
        let mut dataset = dataset.show_progress(false);
        if let Some(blocks) = self.max_blocks_in_flight {
            dataset = dataset.max_blocks_in_flight(blocks);
        }
        if let Some(bytes) = self.block_bytes {
            dataset = dataset.block_bytes(bytes);
        }
        dataset
    }

    /// The embedded cluster, and how long it took to start.
    fn init(&self) -> anyhow::Result<(raylet::Cluster, f64)> {
        let started = Instant::now();
        let cluster = raylet::init_with(raylet::Config::default().num_cpus(self.cpus))?;
        Ok((cluster, started.elapsed().as_secs_f64()))
    }
}

fn main() -> anyhow::Result<()> {
    let result = match Cli::parse().command {
        Command::Parquet {
            input,
            output,
            batch_size,
            run,
        } => parquet_mode(&input, &output, batch_size, &run)?,
        Command::Shuffle {
            input,
            seed,
            batch_rows,
            run,
        } => shuffle_mode(&input, seed, batch_rows, &run)?,
        Command::Images {
            input,
            checkpoint,
            actors,
            batch_size,
            files_per_block,
            threads,
            run,
        } => {
            let model = CnnClassifier {
                checkpoint: std::path::absolute(&checkpoint)?,
                threads,
            };
            images_mode(&input, model, actors, batch_size, files_per_block, &run)?
        }
        Command::Sample { output, rows, images } => write_samples(&output, rows, images)?,
        Command::Digits { output } => export_digits(&output)?,
        Command::Checkpoint {
            output,
            seed,
            epochs,
            batch_size,
            learning_rate,
        } => train_checkpoint(&output, seed, epochs, batch_size, learning_rate)?,
    };
    println!("{result}");
    Ok(())
}

/// Ends the run's cluster (untimed, as Ray's `ray.shutdown()`), adding how long that took.
fn shut_down(cluster: &raylet::Cluster, result: &mut serde_json::Value) -> anyhow::Result<()> {
    let started = Instant::now();
    cluster.shutdown().context("shutting the cluster down")?;
    result["shutdown_s"] = json!(round4(started.elapsed().as_secs_f64()));
    Ok(())
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

// ---------------------------------------------------------------- parquet

/// The batch with a column `out = c0 * 2 + c1` after its own.
fn add_out(batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| ArrowError::SchemaError(format!("no column {name}")))
    };
    let doubled = mul(&column("c0")?, &Float64Array::new_scalar(2.0))?;
    let out: ArrayRef = add(&doubled, &column("c1")?)?;
    let schema = batch.schema();
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new("out", DataType::Float64, out.null_count() > 0)));
    let mut columns = batch.columns().to_vec();
    columns.push(out);
    RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        columns,
    )
}
register_arrow_fn!(add_out);

fn parquet_mode(input: &Path, output: &Path, batch_size: usize, run: &RunOptions) -> anyhow::Result<serde_json::Value> {
    ensure!(
        !output.exists(),
        "{} exists; the output must be a new directory",
        output.display()
    );
    let (cluster, init_s) = run.init()?;
    let started = Instant::now();
    let summary = run
        .apply(Dataset::read_parquet(path_str(input)?))
        .map_batches(add_out, batch_size)
        .write_parquet(output)?;
    let seconds = started.elapsed().as_secs_f64();

    let verify_started = Instant::now();
    let mut back = ReadBack::default();
    for file in &summary.files {
        back.add_file(file)?;
    }
    let verify_s = verify_started.elapsed().as_secs_f64();
    if back.rows != summary.rows {
        eprintln!(
            "data_bench: write_parquet reported {} rows but its files hold {}",
            summary.rows, back.rows
        );
    }
    let mut result = json!({
        "mode": "parquet",
        "rows": back.rows,
        "seconds": round4(seconds),
        "init_s": round4(init_s),
        "sum_out": back.sum_out,
        "sum_c0": back.sum_c0,
        "summary_rows": summary.rows,
        "files": summary.files.len(),
        "blocks_written": summary.blocks_written,
        "batch_size": batch_size,
        "verify_s": round4(verify_s),
        "rows_per_s": (back.rows as f64 / seconds).round(),
    });
    shut_down(&cluster, &mut result)?;
    Ok(result)
}

/// Rows and sums of `out` and `c0` over parquet files, read a record batch at a time.
#[derive(Default)]
struct ReadBack {
    rows: u64,
    sum_out: f64,
    sum_c0: f64,
}

impl ReadBack {
    fn add_file(&mut self, path: &Path) -> anyhow::Result<()> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
        let mask = ProjectionMask::columns(builder.parquet_schema(), ["out", "c0"]);
        let reader = builder.with_projection(mask).with_batch_size(1 << 16).build()?;
        for batch in reader {
            let batch = batch?;
            self.rows += batch.num_rows() as u64;
            self.sum_out += column_sum(&batch, "out")?;
            self.sum_c0 += column_sum(&batch, "c0")?;
        }
        Ok(())
    }
}

/// The sum of a Float64 column (exact for these data sets, whatever the order).
fn column_sum(batch: &RecordBatch, name: &str) -> anyhow::Result<f64> {
    let column = batch
        .column_by_name(name)
        .with_context(|| format!("no column {name}"))?;
    let values = column
        .as_primitive_opt::<Float64Type>()
        .with_context(|| format!("column {name} is {}, not Float64", column.data_type()))?;
    Ok(raylet_data::arrow::compute::sum(values).unwrap_or(0.0))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

// ---------------------------------------------------------------- shuffle

fn shuffle_mode(input: &Path, seed: u64, batch_rows: usize, run: &RunOptions) -> anyhow::Result<serde_json::Value> {
    let (cluster, init_s) = run.init()?;
    let started = Instant::now();
    let dataset = run.apply(Dataset::read_parquet(path_str(input)?)).random_shuffle(seed);
    let (mut rows, mut sum_c0, mut batches, mut first_c0) = (0u64, 0.0, 0u64, None);
    for batch in dataset.iter_batches(batch_rows)? {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        sum_c0 += column_sum(&batch, "c0")?;
        batches += 1;
        if first_c0.is_none() && batch.num_rows() > 0 {
            first_c0 = batch
                .column_by_name("c0")
                .and_then(|c| c.as_primitive_opt::<Float64Type>().map(|v| v.value(0)));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut result = json!({
        "mode": "shuffle",
        "rows": rows,
        "seconds": round4(seconds),
        "init_s": round4(init_s),
        "sum_c0": sum_c0,
        "first_c0": first_c0,
        "batches": batches,
        "batch_rows": batch_rows,
        "seed": seed,
        "rows_per_s": (rows as f64 / seconds).round(),
    });
    shut_down(&cluster, &mut result)?;
    Ok(result)
}

// ---------------------------------------------------------------- the CNN

const SIDE: usize = 32;
const CLASSES: usize = 10;

/// conv 1->8 3x3, relu, maxpool 2, conv 8->16 3x3, relu, maxpool 2,
/// flatten, linear 576->10; no padding (32 -> 30 -> 15 -> 13 -> 6).
#[derive(Module, Debug)]
struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    pool: MaxPool2d,
    activation: Relu,
    linear: Linear,
}

impl Cnn {
    fn new(device: &Device) -> Self {
        Cnn {
            conv1: Conv2dConfig::new([1, 8], [3, 3]).init(device),
            conv2: Conv2dConfig::new([8, 16], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            activation: Relu::new(),
            linear: LinearConfig::new(16 * 6 * 6, CLASSES).init(device),
        }
    }

    /// Class scores of `[batch, 1, 32, 32]` images (pixels 0..1).
    fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = self.pool.forward(self.activation.forward(self.conv1.forward(images)));
        let x = self.pool.forward(self.activation.forward(self.conv2.forward(x)));
        self.linear.forward(x.flatten::<2>(1, 3))
    }

    /// The predicted class of each of `count` images, their 8-bit pixels one after another.
    fn classify(&self, pixels: &[u8], count: usize, device: &Device) -> Vec<u8> {
        let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
        let input = Tensor::<4>::from_data(TensorData::new(scaled, [count, 1, SIDE, SIDE]), device);
        let classes = self.forward(input).argmax(1).into_data();
        classes.iter::<i64>().map(|c| c as u8).collect()
    }

    fn load(path: &Path, device: &Device) -> Result<Cnn, ModelError> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(bytes))
            .map_err(|e| format!("decoding {}: {e}", path.display()))?;
        Ok(Cnn::new(device)
            .try_load_record(record)
            .map_err(|e| format!("loading {}: {e}", path.display()))?)
    }
}

// ---------------------------------------------------------------- images

/// The CNN of a checkpoint, classifying 32x32 grayscale images in batches.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CnnClassifier {
    checkpoint: PathBuf,
    threads: usize,
}
register_batch_model!(CnnClassifier);

/// One classified image: the label of its folder and the CNN's class.
#[derive(Debug, Serialize, Deserialize)]
struct Classified {
    label: u8,
    predicted: u8,
}

impl BatchModel for CnnClassifier {
    type In = Image;
    type Out = Classified;
    type State = (Cnn, Device, rayon::ThreadPool);

    fn load(&self) -> Result<Self::State, ModelError> {
        let device = Device::flex();
        let model = Cnn::load(&self.checkpoint, &device)?;
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads.max(1))
            .build()?;
        Ok((model, device, threads))
    }

    fn predict(&self, state: &mut Self::State, batch: Vec<Image>) -> Result<Vec<Classified>, ModelError> {
        let (model, device, threads) = state;
        let mut pixels = Vec::with_capacity(batch.len() * SIDE * SIDE);
        let mut labels = Vec::with_capacity(batch.len());
        for image in &batch {
            if (image.width, image.height, image.channels) != (SIDE as u32, SIDE as u32, 1) {
                return Err(format!(
                    "{}: {}x{} with {} channels, expected 32x32 gray",
                    image.path, image.width, image.height, image.channels
                )
                .into());
            }
            let label = image
                .label
                .as_deref()
                .and_then(|l| l.parse::<u8>().ok())
                .ok_or_else(|| format!("{}: its folder {:?} is not a label 0..9", image.path, image.label))?;
            pixels.extend_from_slice(&image.pixels);
            labels.push(label);
        }
        let predicted = threads.install(|| model.classify(&pixels, batch.len(), device));
        Ok(labels
            .into_iter()
            .zip(predicted)
            .map(|(label, predicted)| Classified { label, predicted })
            .collect())
    }
}

fn images_mode(
    input: &Path,
    model: CnnClassifier,
    actors: usize,
    batch_size: usize,
    files_per_block: usize,
    run: &RunOptions,
) -> anyhow::Result<serde_json::Value> {
    ensure!(
        model.checkpoint.is_file(),
        "no checkpoint at {}",
        model.checkpoint.display()
    );
    let threads = model.threads;
    let (cluster, init_s) = run.init()?;
    let started = Instant::now();
    let dataset = run
        .apply(Dataset::read_images(
            path_str(input)?,
            ImageOptions::default().labels_from_folders(),
        ))
        .files_per_block(files_per_block)
        .map_batches_with(model, batch_size, ActorPoolStrategy::fixed(actors));
    let classified = dataset.take_all()?;
    let seconds = started.elapsed().as_secs_f64();
    let mut pred_hist = [0u64; CLASSES];
    let mut label_sum = 0u64;
    for row in &classified {
        label_sum += u64::from(row.label);
        *pred_hist
            .get_mut(usize::from(row.predicted))
            .with_context(|| format!("a predicted class {} out of 0..9", row.predicted))? += 1;
    }
    let correct = classified.iter().filter(|r| r.label == r.predicted).count();
    let rows = classified.len();
    let mut result = json!({
        "mode": "images",
        "rows": rows,
        "seconds": round4(seconds),
        "init_s": round4(init_s),
        "label_sum": label_sum,
        "pred_hist": pred_hist,
        "accuracy": round4(correct as f64 / rows.max(1) as f64),
        "actors": actors,
        "batch_size": batch_size,
        "files_per_block": files_per_block,
        "threads_per_actor": threads,
        "backend": "burn 0.22.1 flex (CPU)",
        "rows_per_s": (rows as f64 / seconds).round(),
    });
    shut_down(&cluster, &mut result)?;
    Ok(result)
}

// ---------------------------------------------------------------- helpers: digits and checkpoint

/// A digit's pixels as the integers 0..16 they were (raylet-train stores v / 16, exact in f32).
fn digit_values(digit: &Digit) -> anyhow::Result<Vec<u8>> {
    digit
        .pixels
        .iter()
        .map(|&p| {
            let v = p * 16.0;
            ensure!(
                v == v.round() && (0.0..=16.0).contains(&v),
                "a pixel {p} that is not an integer 0..16 over 16"
            );
            Ok(v as u8)
        })
        .collect()
}

fn export_digits(output: &Path) -> anyhow::Result<serde_json::Value> {
    // Every digit (none held out), in the order of seed 0's shuffle.
    let digits = raylet_models::digits::load(0.0, 0).train;
    let mut text = String::new();
    for digit in &digits {
        let values = digit_values(digit)?;
        ensure!(values.len() == 64, "a digit with {} pixels", values.len());
        for v in values {
            text.push_str(&v.to_string());
            text.push(',');
        }
        text.push_str(&digit.label.to_string());
        text.push('\n');
    }
    write_atomically(output, text.as_bytes())?;
    Ok(json!({"mode": "digits", "rows": digits.len(), "output": output}))
}

fn write_samples(output: &Path, rows: usize, images: usize) -> anyhow::Result<serde_json::Value> {
    let mut rng = StdRng::seed_from_u64(0);
    let parquet = output.join("parquet");
    std::fs::create_dir_all(&parquet)?;
    for (file, part) in [(0, rows / 2), (1, rows - rows / 2)] {
        let columns = (0..8).map(|c| {
            let values: Vec<f64> = (0..part)
                .map(|_| (normal(&mut rng) * 65536.0).round() / 65536.0)
                .collect();
            (format!("c{c}"), Arc::new(Float64Array::from(values)) as ArrayRef)
        });
        let batch = RecordBatch::try_from_iter(columns)?;
        let out = File::create(parquet.join(format!("part-{file:05}.parquet")))?;
        let mut writer = parquet::arrow::ArrowWriter::try_new(out, batch.schema(), None)?;
        writer.write(&batch)?;
        writer.close()?;
    }
    let digits = raylet_models::digits::load(0.0, 0).train;
    for index in 0..images {
        let digit = &digits[index % digits.len()];
        let mut pixels = Vec::with_capacity(SIDE * SIDE);
        upscale(&digit_values(digit)?, NOISE, &mut rng, &mut pixels);
        let path = output.join(format!("images/{}/img_{index:05}.png", digit.label));
        std::fs::create_dir_all(path.parent().expect("a folder"))?;
        image::GrayImage::from_raw(SIDE as u32, SIDE as u32, pixels)
            .context("a whole image")?
            .save(&path)?;
    }
    Ok(json!({"mode": "sample", "rows": rows, "images": images, "output": output}))
}

/// Writes `bytes` to `path` through a temporary file beside it, so that
/// `path` is either absent or whole.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut name = path
        .file_name()
        .context("an output path with no file name")?
        .to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let temporary = path.with_file_name(name);
    let mut file = File::create(&temporary).with_context(|| format!("creating {}", temporary.display()))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // in (0, 1]
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The digit as bench/make_data.py makes an image of it: each value v as a
/// 4x4 square of v * 255 / 16, plus gaussian noise of sigma `noise`,
/// rounded (half to even, as numpy's rint) and clipped to 0..255.
fn upscale(values: &[u8], noise: f64, rng: &mut StdRng, out: &mut Vec<u8>) {
    const SCALE: usize = SIDE / 8;
    for y in 0..SIDE {
        for x in 0..SIDE {
            let base = f64::from(values[(y / SCALE) * 8 + x / SCALE]) * (255.0 / 16.0);
            let noisy = (base + noise * normal(rng)).round_ties_even();
            out.push(noisy.clamp(0.0, 255.0) as u8);
        }
    }
}

/// Images (one after another) and labels of `digits`, each upscaled with fresh noise.
fn noisy_images(digits: &[(Vec<u8>, u8)], rng: &mut StdRng) -> (Vec<u8>, Vec<i64>) {
    let mut pixels = Vec::with_capacity(digits.len() * SIDE * SIDE);
    for (values, _) in digits {
        upscale(values, NOISE, rng, &mut pixels);
    }
    (pixels, digits.iter().map(|(_, label)| i64::from(*label)).collect())
}

/// bench/make_data.py's default noise (sigma, in 0..255 units).
const NOISE: f64 = 24.0;

fn train_checkpoint(
    output: &Path,
    seed: u64,
    epochs: usize,
    batch_size: usize,
    learning_rate: f64,
) -> anyhow::Result<serde_json::Value> {
    ensure!(batch_size > 0, "--batch-size must be positive");
    let started = Instant::now();
    let split = raylet_models::digits::load(0.2, seed);
    let values = |digits: &[Digit]| -> anyhow::Result<Vec<(Vec<u8>, u8)>> {
        digits.iter().map(|d| Ok((digit_values(d)?, d.label))).collect()
    };
    let (train, test) = (values(&split.train)?, values(&split.test)?);
    let device = Device::flex();
    let autodiff = device.clone().autodiff();
    autodiff.seed(seed);
    let mut model = Cnn::new(&autodiff);
    let mut optimizer = AdamConfig::new().init();
    let mut rng = StdRng::seed_from_u64(seed);
    let tensors = |pixels: Vec<u8>, labels: Vec<i64>, device: &Device| {
        let count = labels.len();
        let scaled: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
        (
            Tensor::<4>::from_data(TensorData::new(scaled, [count, 1, SIDE, SIDE]), device),
            Tensor::<1, Int>::from_data(TensorData::new(labels, [count]), device),
        )
    };
    let mut order: Vec<usize> = (0..train.len()).collect();
    for epoch in 0..epochs {
        let epoch_started = Instant::now();
        order.shuffle(&mut rng);
        let (mut loss_sum, mut steps) = (0.0, 0);
        for chunk in order.chunks(batch_size) {
            let digits: Vec<(Vec<u8>, u8)> = chunk.iter().map(|&i| train[i].clone()).collect();
            let (pixels, labels) = noisy_images(&digits, &mut rng);
            let (images, labels) = tensors(pixels, labels, &autodiff);
            let loss = CrossEntropyLoss::new(None, &autodiff).forward(model.forward(images), labels);
            loss_sum += f64::from(loss.clone().into_scalar::<f32>());
            steps += 1;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(learning_rate, model, grads);
        }
        eprintln!(
            "epoch {epoch}: loss {:.4} ({:.1} s)",
            loss_sum / f64::from(steps.max(1)),
            epoch_started.elapsed().as_secs_f64()
        );
    }
    // Held-out digits, each upscaled with noise from a generator of its own seed.
    let mut test_rng = StdRng::seed_from_u64(seed ^ 0x7e57);
    let (pixels, labels) = noisy_images(&test, &mut test_rng);
    let predicted = model.classify(&pixels, labels.len(), &autodiff);
    let correct = predicted
        .iter()
        .zip(&labels)
        .filter(|(p, l)| i64::from(**p) == **l)
        .count();
    let accuracy = correct as f64 / labels.len().max(1) as f64;
    let bytes = model
        .into_record()
        .into_bytes()
        .map_err(|e| anyhow::anyhow!("encoding the model: {e}"))?;
    write_atomically(output, &bytes)?;
    // The file must load as the classifier will load it.
    let reloaded = Cnn::load(output, &device).map_err(|e| anyhow::anyhow!("{e}"))?;
    let again = reloaded.classify(&pixels, labels.len(), &device);
    if again != predicted {
        bail!("the saved model classifies the test digits differently from the trained one");
    }
    println!(
        "test accuracy {:.2}% ({correct} of {} held-out digits, upscaled with noise)",
        100.0 * accuracy,
        labels.len()
    );
    Ok(json!({
        "mode": "checkpoint",
        "output": output,
        "seed": seed,
        "epochs": epochs,
        "train_digits": train.len(),
        "test_digits": labels.len(),
        "test_accuracy": round4(accuracy),
        "bytes": bytes.len(),
        "seconds": round4(started.elapsed().as_secs_f64()),
    }))
}
