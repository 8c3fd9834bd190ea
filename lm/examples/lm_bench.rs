//! The raylet side of `bench/compare_lm.sh`: the GPT workload timed on
//! this machine, each run appending one JSON line to `--json`.
//!
//! - `prepare`: the corpus (this machine's Python standard library)
//!   prepared into `--data`, skipped when it is there, and the validation
//!   files listed, a path per line, in `--files`;
//! - `plain`: forward, backward and AdamW steps of the model in this one
//!   process, without a cluster, on random token ids (the baseline; the
//!   step costs the same whatever the ids);
//! - `train`: the model trained by raylet-train on `--workers`
//!   data-parallel workers from a shuffled streaming split of the
//!   prepared Parquet;
//! - `score`: every listed file scored (its loss, and a greedy
//!   continuation of its first lines) by a raylet-data actor pool into
//!   Parquet, with a checkpoint of `train`.
//!
//! Every mode computes on `raylet_train::cpu_device()`: burn's flex
//! backend, or libtorch's kernels when built with the `libtorch` feature.
//! Steps before `--skip` are warm-up and left out of the figures. Build with
//! `cargo build --release -p raylet-lm --example lm_bench`.

use std::error::Error;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::grad_clipping::GradientClippingConfig;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Distribution;
use clap::{Args, Parser, Subcommand};
use raylet_data::{Dataset, FileSet};
use raylet_lm::prepare::TRAIN_DIR;
use raylet_lm::{
    FileScore, GptTraining, OptimizerSettings, PrepareOptions, ScoringOptions, TrainingRows, prepare_corpus,
    score_files, token_rows,
};
use raylet_models::corpus::{Corpus, Split, stdlib_dir};
use raylet_models::gpt::{Gpt, GptConfig};
use raylet_train::collective::ReduceOp;
use raylet_train::{
    Metrics, RunConfig, ScalingConfig, TrainContext, TrainError, TrainLoop, Trainer, register_train_loop,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Time the GPT workload on raylet (the raylet side of bench/compare_lm.sh).
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Prepare the corpus and list the validation files.
    Prepare {
        #[command(flatten)]
        common: Common,
        /// Where the validation files are listed, a path per line.
        #[arg(long)]
        files: PathBuf,
    },
    /// Train steps in this process alone, without a cluster.
    Plain(Workload),
    /// Train on raylet-train workers.
    Train {
        #[command(flatten)]
        workload: Workload,
        /// Data-parallel workers, each holding one CPU.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Where the run and its checkpoint are kept.
        #[arg(long, default_value = "target/bench/lm/runs")]
        runs: PathBuf,
    },
    /// Score the listed files with a checkpoint on an actor pool.
    Score {
        #[command(flatten)]
        common: Common,
        /// The files to score, a path per line.
        #[arg(long)]
        files: PathBuf,
        /// A checkpoint directory of a `train` run.
        #[arg(long)]
        checkpoint: PathBuf,
        /// The most scoring actors at once, each holding one CPU.
        #[arg(long, default_value_t = 2)]
        actors: usize,
        /// Where the scores are written (emptied first).
        #[arg(long, default_value = "target/bench/lm/scores")]
        out: PathBuf,
    },
}

#[derive(Args)]
struct Common {
    /// Where the prepared corpus is kept.
    #[arg(long, default_value = "target/gpt-example/data")]
    data: PathBuf,
    /// The file each run appends its JSON line to.
    #[arg(long)]
    json: PathBuf,
}

#[derive(Args)]
struct Workload {
    #[command(flatten)]
    common: Common,
    /// The model's preset.
    #[arg(long, default_value = "small")]
    model: String,
    /// Optimizer steps, warm-up included.
    #[arg(long, default_value_t = 12)]
    steps: u64,
    /// Steps left out of the figures.
    #[arg(long, default_value_t = 2)]
    skip: u64,
    /// Rows of `context + 1` tokens per worker per step.
    #[arg(long, default_value_t = 8)]
    rows: usize,
}

/// The model's context and the corpus's vocabulary, as `bench/lm_torch.py`
/// uses them.
const CONTEXT: usize = 128;
const VOCAB: usize = 8192;

fn main() -> Result<(), Box<dyn Error>> {
    match Cli::parse().command {
        Command::Prepare { common, files } => prepare(&common, &files),
        Command::Plain(workload) => plain(&workload),
        Command::Train {
            workload,
            workers,
            runs,
        } => train(&workload, workers, &runs),
        Command::Score {
            common,
            files,
            checkpoint,
            actors,
            out,
        } => score(&common, &files, &checkpoint, actors, &out),
    }
}

fn prepare(common: &Common, files: &Path) -> Result<(), Box<dyn Error>> {
    raylet::init()?;
    let corpus_dir = stdlib_dir()?;
    let options = PrepareOptions {
        vocab_size: VOCAB,
        sequence_length: CONTEXT,
        ..PrepareOptions::default()
    };
    let prepared = prepare_corpus(&corpus_dir, &common.data, &options)?;
    let validation: Vec<String> = Corpus::scan(&corpus_dir)?
        .files()
        .iter()
        .filter(|file| Split::of(&file.relative_path) == Split::Validation)
        .map(|file| corpus_dir.join(&file.relative_path).display().to_string())
        .collect();
    std::fs::write(files, validation.join("\n") + "\n")?;
    append_json(
        &common.json,
        json!({
            "run": "prepare",
            "corpus": corpus_dir,
            "train_rows": prepared.train.rows,
            "validation_rows": prepared.validation.rows,
            "validation_files": validation.len(),
            "vocab_size": prepared.vocab_size,
        }),
    )
}

fn model_config(workload: &Workload) -> Result<GptConfig, Box<dyn Error>> {
    Ok(GptConfig {
        context_length: CONTEXT,
        ..GptConfig::named(&workload.model, VOCAB)?
    })
}

fn optimizer_settings() -> OptimizerSettings {
    OptimizerSettings {
        warmup_steps: 2,
        ..OptimizerSettings::default()
    }
}

/// The baseline: this process alone steps the model. The gradients are
/// clipped per parameter (burn's optimizer option) rather than by their
/// global norm, the one difference from `train`'s step: the same one pass
/// over them.
fn plain(workload: &Workload) -> Result<(), Box<dyn Error>> {
    let config = model_config(workload)?;
    let settings = optimizer_settings();
    let device = raylet_train::cpu_device().autodiff();
    device.seed(0);
    let mut model = Gpt::new(&config, &device)?;
    let mut optimizer = AdamWConfig::new()
        .with_weight_decay(settings.weight_decay)
        .with_epsilon(1e-8)
        .with_grad_clipping(settings.max_gradient_norm.map(GradientClippingConfig::Norm))
        .init();
    let mut timed = Vec::new();
    for step in 0..workload.steps {
        let started = Instant::now();
        let tokens = Tensor::<2, Int>::random(
            [workload.rows, CONTEXT + 1],
            Distribution::Uniform(0.0, VOCAB as f64),
            &device,
        );
        let loss = model.loss(tokens);
        let gradients = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(settings.learning_rate, model, gradients);
        if step >= workload.skip {
            timed.push(started.elapsed().as_secs_f64());
        }
    }
    let seconds: f64 = timed.iter().sum();
    let tokens = (timed.len() * workload.rows * CONTEXT) as f64;
    append_json(
        &workload.common.json,
        json!({
            "run": "plain",
            "model": workload.model,
            "workers": 1,
            "rows_per_worker": workload.rows,
            "steps_timed": timed.len(),
            "tokens_per_second": tokens / seconds,
            "step_seconds": seconds / timed.len() as f64,
            "peak_rss_bytes": resident_peak_bytes(),
        }),
    )
}

/// [`GptTraining`] with one more report at the end: the largest peak
/// resident memory of any worker.
#[derive(Serialize, Deserialize)]
struct MeasuredTraining(GptTraining);
register_train_loop!(MeasuredTraining);

impl TrainLoop for MeasuredTraining {
    fn reports(&self) -> Option<u64> {
        self.0.reports().map(|reports| reports + 1)
    }

    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        self.0.run(context)?;
        let mut peak = [resident_peak_bytes() as f64];
        context.group().allreduce(&mut peak, ReduceOp::Max)?;
        context.report(Metrics::new().with("peak_rss_bytes", peak[0]), None)
    }
}

fn train(workload: &Workload, workers: usize, runs: &Path) -> Result<(), Box<dyn Error>> {
    // The workers hold a CPU each for the whole run; the tasks that read
    // the Parquet for them need one more.
    raylet::init_with(raylet::Config::default().num_cpus(workers as f64 + 1.0))?;
    let data = &workload.common.data;
    let split = token_rows(&data.join(TRAIN_DIR))
        .show_progress(false)
        .random_shuffle(0)
        .streaming_split(workers)?;
    let tokenizer_json = std::fs::read_to_string(data.join("tokenizer.json"))?;
    let training = GptTraining {
        steps: workload.steps,
        global_batch_size: workload.rows * workers,
        report_every: 1,
        optimizer: optimizer_settings(),
        ..GptTraining::new(
            model_config(workload)?,
            tokenizer_json,
            TrainingRows::Shards(split.shards()),
        )
    };
    let result = Trainer::new(MeasuredTraining(training))
        .scaling(ScalingConfig {
            num_workers: workers,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: format!("lm-bench-{workers}-{}", std::process::id()),
            storage_path: std::path::absolute(runs)?,
            ..RunConfig::default()
        })
        .fit()?;
    let metric = |index: usize, name: &str| result.metrics_history[index].metrics.get(name).unwrap_or(f64::NAN);
    let steps = result.metrics_history.len() - 1;
    let step_tokens = (workload.rows * workers * CONTEXT) as f64;
    let timed = workload.skip as usize..steps;
    let seconds: Vec<f64> = timed
        .clone()
        .map(|i| step_tokens / metric(i, "tokens_per_second"))
        .collect();
    let total: f64 = seconds.iter().sum();
    let overhead: f64 = timed
        .zip(&seconds)
        .map(|(i, s)| s * metric(i, "runtime_overhead"))
        .sum();
    let checkpoint = result.checkpoint.ok_or("the run wrote no checkpoint")?;
    append_json(
        &workload.common.json,
        json!({
            "run": "train",
            "model": workload.model,
            "workers": workers,
            "rows_per_worker": workload.rows,
            "steps_timed": seconds.len(),
            "tokens_per_second": step_tokens * seconds.len() as f64 / total,
            "step_seconds": total / seconds.len() as f64,
            "runtime_overhead": overhead / total,
            "peak_rss_bytes": metric(steps, "peak_rss_bytes"),
            "checkpoint": std::path::absolute(checkpoint.path())?,
        }),
    )
}

fn score(common: &Common, files: &Path, checkpoint: &Path, actors: usize, out: &Path) -> Result<(), Box<dyn Error>> {
    raylet::init_with(raylet::Config::default().num_cpus(actors as f64 + 1.0))?;
    let paths: Vec<PathBuf> = std::fs::read_to_string(files)?
        .lines()
        .filter(|line| !line.is_empty())
        .map(PathBuf::from)
        .collect();
    if out.exists() {
        std::fs::remove_dir_all(out)?;
    }
    let options = ScoringOptions {
        max_actors: actors,
        ..ScoringOptions::default()
    };
    let started = Instant::now();
    let summary = score_files(checkpoint, FileSet::list(paths), out, &options)?;
    let seconds = started.elapsed().as_secs_f64();
    let scores: Vec<FileScore> = Dataset::read_parquet(FileSet::dir(out))
        .rows::<FileScore>()
        .show_progress(false)
        .take_all()?;
    let tokens: u64 = scores.iter().map(|score| score.tokens).sum();
    let mean_loss = scores.iter().map(|s| s.loss * s.tokens as f64).sum::<f64>() / tokens.max(1) as f64;
    append_json(
        &common.json,
        json!({
            "run": "score",
            "actors": actors,
            "files": summary.rows,
            "tokens": tokens,
            "generated_per_file": options.new_tokens,
            "seconds": seconds,
            "tokens_per_second": tokens as f64 / seconds,
            "mean_loss": mean_loss,
        }),
    )
}

/// This process's peak resident memory (`VmHWM`), in bytes.
fn resident_peak_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn append_json(path: &Path, mut line: serde_json::Value) -> Result<(), Box<dyn Error>> {
    line["system"] = json!("raylet");
    line["backend"] = json!(if cfg!(feature = "libtorch") { "libtorch" } else { "flex" });
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(file, "{line}")?;
    println!("{line}");
    Ok(())
}
