//! A GPT trained, used and scored end to end on the embedded cluster:
//!
//! 1. the Python standard library of this machine's `python3` is prepared:
//!    a byte-level BPE tokenizer trained on its training split, both splits
//!    tokenized by an actor pool into Parquet rows of token ids (kept in
//!    `--data`, so a rerun skips it);
//! 2. the model (`small` by default) trains on 2 data-parallel workers,
//!    reading a shuffled streaming split of the Parquet, with AdamW,
//!    warmup and cosine decay, and reports its validation loss and
//!    perplexity against the corpus's unigram entropy;
//! 3. the last checkpoint continues a few prompts, and with `--score` an
//!    actor pool scores every validation file into Parquet.
//!
//! `cargo run --release -p raylet-lm --example gpt -- [--model small] [--steps 60] [--score]`
//!
//! With `MLFLOW_TRACKING_URI` set, the run is tracked there.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use raylet_data::FileSet;
use raylet_lm::prepare::{TRAIN_DIR, VALIDATION_DIR};
use raylet_lm::{
    GptTraining, OptimizerSettings, PrepareOptions, ScoringOptions, TokenRow, TrainedGpt, TrainingRows, prepare_corpus,
    score_files, token_rows, unigram_entropy,
};
use raylet_models::corpus::{Corpus, Split, stdlib_dir};
use raylet_models::gpt::GptConfig;
use raylet_train::mlflow::MlflowCallback;
use raylet_train::sharding::ShardingStrategy;
use raylet_train::{RunConfig, ScalingConfig, Trainer};

/// Train a GPT on the Python standard library on the embedded cluster.
#[derive(Parser)]
struct Args {
    /// The model's preset: tiny, small or base.
    #[arg(long, default_value = "small")]
    model: String,
    /// Tokens the model reads at once (its context length).
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Tokens in the tokenizer's vocabulary.
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 60)]
    steps: u64,
    /// Rows per step over all workers.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// The peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Data-parallel workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Shard the optimizer state, gradients and parameters (ZeRO-3).
    #[arg(long)]
    zero3: bool,
    /// Where the prepared corpus is kept.
    #[arg(long, default_value = "target/gpt-example/data")]
    data: PathBuf,
    /// Where the training run is kept.
    #[arg(long, default_value = "target/gpt-example/runs")]
    runs: PathBuf,
    /// Also score every validation file with the trained model.
    #[arg(long)]
    score: bool,
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    // Each worker holds a CPU for the whole run; the tasks that read the
    // Parquet and feed them need one more, or they wait for a CPU forever.
    raylet::init_with(raylet::Config::default().num_cpus(args.workers as f64 + 1.0))?;
    let corpus_dir = stdlib_dir()?;
    let started = Instant::now();
    let options = PrepareOptions {
        vocab_size: args.vocab,
        sequence_length: args.context,
        ..PrepareOptions::default()
    };
    let prepared = prepare_corpus(&corpus_dir, &args.data, &options)?;
    println!(
        "prepared {} in {:.0?}: {} training rows, {} validation rows of {} tokens; {} files not UTF-8 skipped",
        corpus_dir.display(),
        started.elapsed(),
        prepared.train.rows,
        prepared.validation.rows,
        args.context + 1,
        prepared.skipped.len()
    );
    let entropy = unigram_entropy(&args.data.join(TRAIN_DIR))?;
    println!(
        "unigram entropy of the training tokens: {entropy:.3} nats (perplexity {:.0})",
        entropy.exp()
    );

    let model = GptConfig {
        context_length: args.context,
        ..GptConfig::named(&args.model, prepared.vocab_size)?
    };
    println!(
        "model {}: {:.1}M parameters",
        args.model,
        model.parameter_count() as f64 / 1e6
    );
    let validation: Vec<TokenRow> = token_rows(&args.data.join(VALIDATION_DIR))
        .show_progress(false)
        .take_all()?;
    let split = token_rows(&args.data.join(TRAIN_DIR))
        .show_progress(false)
        .random_shuffle(0)
        .streaming_split(args.workers)?;
    let training = GptTraining {
        validation: validation.into_iter().take(128).collect(),
        steps: args.steps,
        global_batch_size: args.batch,
        report_every: (args.steps / 6).max(1),
        sharding: if args.zero3 {
            ShardingStrategy::Parameters
        } else {
            ShardingStrategy::None
        },
        optimizer: OptimizerSettings {
            learning_rate: args.lr,
            warmup_steps: (args.steps / 10).max(1),
            ..OptimizerSettings::default()
        },
        ..GptTraining::new(
            model,
            std::fs::read_to_string(&prepared.tokenizer)?,
            TrainingRows::Shards(split.shards()),
        )
    };
    let mut trainer = Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: args.workers,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: format!("gpt-{}-{}", args.model, std::process::id()),
            storage_path: std::path::absolute(&args.runs)?,
            ..RunConfig::default()
        });
    if let Ok(uri) = std::env::var("MLFLOW_TRACKING_URI") {
        trainer = trainer.callback(MlflowCallback::new(&uri)?.experiment_name("raylet-gpt"));
    }
    let result = trainer.fit()?;
    println!("\n  step    loss  val loss  val ppl  tokens/s");
    for report in &result.metrics_history {
        let metric = |name| report.metrics.get(name).unwrap_or(f64::NAN);
        println!(
            "{:>6} {:>7.3} {:>9.3} {:>8.1} {:>9.0}",
            metric("step"),
            metric("loss"),
            metric("validation_loss"),
            metric("validation_perplexity"),
            metric("tokens_per_second")
        );
    }

    let checkpoint = result.checkpoint.ok_or("the run wrote no checkpoint")?;
    let gpt = TrainedGpt::load(checkpoint.path(), &raylet_train::cpu_device())?;
    for prompt in ["import os\n", "def read_config(path):\n", "class Queue:\n    def "] {
        let continuation = gpt.continue_text(prompt, 40)?;
        println!("\n--- {prompt:?}\n{prompt}{continuation}");
    }

    if args.score {
        let stdlib = Corpus::scan(&corpus_dir)?;
        let files = stdlib
            .files()
            .iter()
            .filter(|file| Split::of(&file.relative_path) == Split::Validation)
            .map(|file| corpus_dir.join(&file.relative_path));
        let out = args.runs.join("validation_scores");
        let started = Instant::now();
        let summary = score_files(
            checkpoint.path(),
            FileSet::list(files),
            &out,
            &ScoringOptions::default(),
        )?;
        println!(
            "\nscored {} validation files in {:.0?} with up to {} actors into {}",
            summary.rows,
            started.elapsed(),
            summary.max_actors,
            out.display()
        );
    }
    Ok(())
}
