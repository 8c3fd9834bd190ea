//! Training the tiny GPT on real standard library text with raylet-train:
//! one worker, two data-parallel workers, ZeRO-3 and ZeRO-1 with gradient
//! accumulation take the same steps, and so does an elastic group that
//! finds room for one worker of two; a resumed run continues the same loss
//! curve; a checkpoint of another model or tokenizer is refused naming
//! what differs; a diverging run stops naming its step; and trained from
//! a shuffled streaming split of the prepared Parquet, the model's
//! validation loss ends below the corpus's unigram entropy.

use std::ops::ControlFlow;
use std::path::Path;

use raylet_lm::prepare::{TRAIN_DIR, VALIDATION_DIR};
use raylet_lm::{
    GptTraining, OptimizerSettings, PrepareOptions, TokenRow, TrainingRows, prepare_corpus, token_rows, unigram_entropy,
};
use raylet_models::corpus::{Corpus, Split, stdlib_dir};
use raylet_models::gpt::GptConfig;
use raylet_models::tokenizer::LmTokenizer;
use raylet_train::sharding::ShardingStrategy;
use raylet_train::{Report, RunConfig, ScalingConfig, TrainError, TrainResult, Trainer, WorkerResources};

use crate::stdlib_sample::stdlib_sample;

const VOCAB_SIZE: usize = 512;
const CONTEXT_LENGTH: usize = 64;
const GLOBAL_BATCH: usize = 8;

pub fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
}

/// The tiny preset, reading 64 tokens at a time.
fn tiny() -> GptConfig {
    GptConfig {
        context_length: CONTEXT_LENGTH,
        ..GptConfig::tiny(VOCAB_SIZE)
    }
}

/// A tokenizer trained on a sample of the standard library, and rows of
/// each split's sample packed as preparation packs them.
pub struct Sample {
    tokenizer_json: String,
    train: Vec<TokenRow>,
    validation: Vec<TokenRow>,
}

pub fn sample(scratch: &Path) -> Sample {
    let stdlib = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
    let train_files = stdlib_sample(&stdlib, Split::Train, 150_000);
    let validation_files = stdlib_sample(&stdlib, Split::Validation, 20_000);
    let tokenizer = LmTokenizer::train(train_files.iter().map(|file| file.text.as_str()), VOCAB_SIZE).unwrap();
    let path = scratch.join("tokenizer.json");
    tokenizer.save(&path).unwrap();
    let rows = |files: &[raylet_models::corpus::SourceFile]| -> Vec<TokenRow> {
        let mut stream = Vec::new();
        for file in files {
            stream.extend(tokenizer.encode(&file.text).unwrap());
            stream.push(tokenizer.eot_id());
        }
        stream
            .chunks_exact(CONTEXT_LENGTH + 1)
            .map(|ids| TokenRow { ids: ids.to_vec() })
            .collect()
    };
    Sample {
        tokenizer_json: std::fs::read_to_string(&path).unwrap(),
        train: rows(&train_files),
        validation: rows(&validation_files).into_iter().take(32).collect(),
    }
}

/// `steps` steps of the tiny model on the sample's rows in memory, a report
/// every step.
pub fn training(sample: &Sample, steps: u64) -> GptTraining {
    GptTraining {
        validation: sample.validation.clone(),
        steps,
        global_batch_size: GLOBAL_BATCH,
        report_every: 1,
        optimizer: OptimizerSettings {
            learning_rate: 3e-3,
            warmup_steps: 2,
            ..OptimizerSettings::default()
        },
        ..GptTraining::new(
            tiny(),
            sample.tokenizer_json.clone(),
            TrainingRows::InMemory(sample.train.clone()),
        )
    }
}

pub fn trainer(training: GptTraining, workers: usize, storage: &Path, name: &str) -> Trainer<GptTraining> {
    Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: workers,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: name.into(),
            storage_path: storage.to_path_buf(),
            verbose: false,
            ..RunConfig::default()
        })
}

/// Each report's `metric`, in order.
fn curve(reports: &[Report], metric: &str) -> Vec<f64> {
    reports
        .iter()
        .map(|report| report.metrics.get(metric).unwrap())
        .collect()
}

/// The largest difference between two curves of one length.
fn apart(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "{a:?} and {b:?}");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

#[test]
fn one_worker_two_workers_zero3_and_zero1_with_accumulation_take_the_same_steps() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let sample = sample(scratch.path());
    let steps = 5;
    let run = |name: &str, workers: usize, sharding: ShardingStrategy, accumulation_steps: usize| -> TrainResult {
        let training = GptTraining {
            sharding,
            accumulation_steps,
            ..training(&sample, steps)
        };
        trainer(training, workers, scratch.path(), name).fit().unwrap()
    };
    let one = run("one-worker", 1, ShardingStrategy::None, 1);
    let two = run("two-workers", 2, ShardingStrategy::None, 1);
    let zero3 = run("zero-3", 2, ShardingStrategy::Parameters, 1);
    let zero1 = run("zero-1-accumulating", 2, ShardingStrategy::OptimizerState, 2);

    let losses = curve(&one.metrics_history, "loss");
    println!("losses of one worker: {losses:?}");
    assert!(losses[steps as usize - 1] < losses[0] - 0.1, "training lowers the loss");
    for (name, other) in [
        ("two workers", &two),
        ("ZeRO-3", &zero3),
        ("ZeRO-1, 2 micro-batches", &zero1),
    ] {
        let history = &other.metrics_history;
        let loss = apart(&losses, &curve(history, "loss"));
        let validation = apart(
            &curve(&one.metrics_history, "validation_loss"),
            &curve(history, "validation_loss"),
        );
        let norms = apart(
            &curve(&one.metrics_history, "gradient_norm"),
            &curve(history, "gradient_norm"),
        );
        println!("{name}: loss within {loss:e}, validation loss within {validation:e}, gradient norm within {norms:e}");
        assert!(loss < 1e-4 && validation < 1e-4, "{name}: {loss} and {validation}");
        assert!(norms < 1e-3, "{name}: gradient norms {norms}");
        let overheads = curve(history, "runtime_overhead");
        assert!(
            overheads.iter().all(|share| (0.0..1.0).contains(share)),
            "{name}: the runtime's overhead is a share of the step: {overheads:?}"
        );
    }
}

#[test]
fn an_elastic_group_with_room_for_one_worker_takes_the_steps_of_two() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let sample = sample(scratch.path());
    let two = trainer(training(&sample, 4), 2, scratch.path(), "two").fit().unwrap();
    // Workers of 3 CPUs on a cluster of 4: room for one of the two.
    let elastic = trainer(training(&sample, 4), 2, scratch.path(), "elastic")
        .scaling(ScalingConfig {
            resources_per_worker: WorkerResources {
                num_cpus: 3.0,
                ..WorkerResources::default()
            },
            ..ScalingConfig::elastic(1, 2)
        })
        .fit()
        .unwrap();

    let sizes: Vec<usize> = elastic.metrics_history.iter().map(|r| r.world_size).collect();
    assert_eq!(
        sizes, [1; 4],
        "the elastic group ran with the one worker there was room for"
    );
    let difference = apart(
        &curve(&two.metrics_history, "loss"),
        &curve(&elastic.metrics_history, "loss"),
    );
    println!("an elastic group of one worker: its losses within {difference:e} of two workers'");
    assert!(difference < 1e-4, "{difference}");
}

#[test]
fn a_resumed_run_continues_the_same_loss_curve() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let sample = sample(scratch.path());
    let with_checkpoints = || GptTraining {
        checkpoint_every: 3,
        ..training(&sample, 6)
    };
    let whole = trainer(with_checkpoints(), 2, scratch.path(), "whole").fit().unwrap();

    let stop_at_the_checkpoint = |report: &Report| match report.checkpoint {
        Some(_) => ControlFlow::Break(()),
        None => ControlFlow::Continue(()),
    };
    let first = trainer(with_checkpoints(), 2, scratch.path(), "interrupted")
        .fit_with_reports(stop_at_the_checkpoint)
        .unwrap();
    assert_eq!(first.metrics_history.len(), 3, "stopped at the first checkpoint");
    let rest = trainer(with_checkpoints(), 2, scratch.path(), "interrupted")
        .fit()
        .unwrap();

    let steps = curve(&rest.metrics_history, "step");
    assert_eq!(steps, [4.0, 5.0, 6.0], "the resumed run starts after the checkpoint");
    let whole_losses = curve(&whole.metrics_history, "loss");
    let resumed = curve(&rest.metrics_history, "loss");
    let difference = apart(&whole_losses[3..], &resumed);
    println!(
        "steps 4-6: {:?} uninterrupted, {resumed:?} resumed: within {difference:e}",
        &whole_losses[3..]
    );
    assert!(difference < 1e-5, "{difference}");
    assert!(
        apart(&whole_losses[..3], &curve(&first.metrics_history, "loss")) < 1e-5,
        "the runs agree before the checkpoint too"
    );
}

#[test]
fn a_checkpoint_of_another_model_or_tokenizer_is_refused_naming_what_differs() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let sample = sample(scratch.path());
    trainer(training(&sample, 1), 1, scratch.path(), "run").fit().unwrap();

    let narrower = GptTraining {
        model: GptConfig { d_model: 64, ..tiny() },
        ..training(&sample, 2)
    };
    let error = trainer(narrower, 1, scratch.path(), "run")
        .fit()
        .unwrap_err()
        .to_string();
    println!("another model: {error}");
    assert!(
        error.contains("of another model than this run's: d_model is 128 in the checkpoint and 64 in this run"),
        "{error}"
    );

    let other_tokenizer = LmTokenizer::train(["def other():\n    return 'text'\n"; 20], 300).unwrap();
    let other_json = scratch.path().join("other.json");
    other_tokenizer.save(&other_json).unwrap();
    let retokenized = GptTraining {
        tokenizer_json: std::fs::read_to_string(&other_json).unwrap(),
        ..training(&sample, 2)
    };
    let error = trainer(retokenized, 1, scratch.path(), "run")
        .fit()
        .unwrap_err()
        .to_string();
    println!("another tokenizer: {error}");
    assert!(error.contains("the tokenizer (hash"), "{error}");
    assert!(!error.contains("d_model"), "only the tokenizer differs: {error}");
}

#[test]
fn a_diverging_run_stops_with_an_error_naming_its_step() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let sample = sample(scratch.path());
    let diverging = GptTraining {
        optimizer: OptimizerSettings {
            learning_rate: 1e30,
            warmup_steps: 0,
            max_gradient_norm: None,
            ..OptimizerSettings::default()
        },
        ..training(&sample, 5)
    };
    let error = trainer(diverging, 1, scratch.path(), "diverging").fit().unwrap_err();
    println!("{error}");
    let TrainError::TooManyFailures { last, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(last.contains("the training loss is"), "{last}");
    assert!(last.contains("at step 2 of 5: the run diverged"), "{last}");
}

#[test]
fn tiny_learns_below_the_unigram_entropy_from_a_shuffled_streaming_split_of_the_parquet() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let stdlib = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
    let corpus = scratch.path().join("corpus");
    for split in [(Split::Train, 300_000), (Split::Validation, 40_000)] {
        for file in stdlib_sample(&stdlib, split.0, split.1) {
            let path = corpus.join(&file.relative_path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, &file.text).unwrap();
        }
    }
    let out = scratch.path().join("prepared");
    let options = PrepareOptions {
        vocab_size: VOCAB_SIZE,
        sequence_length: CONTEXT_LENGTH,
        files_per_block: 4,
        max_actors: 2,
    };
    let prepared = prepare_corpus(&corpus, &out, &options).unwrap();
    let entropy = unigram_entropy(&out.join(TRAIN_DIR)).unwrap();
    let validation: Vec<TokenRow> = token_rows(&out.join(VALIDATION_DIR))
        .show_progress(false)
        .take_all()
        .unwrap();
    let split = token_rows(&out.join(TRAIN_DIR))
        .show_progress(false)
        .random_shuffle(7)
        .streaming_split(2)
        .unwrap();
    let steps = 120;
    let training = GptTraining {
        validation: validation.into_iter().take(64).collect(),
        steps,
        global_batch_size: 16,
        report_every: 30,
        optimizer: OptimizerSettings {
            learning_rate: 3e-3,
            warmup_steps: 10,
            ..OptimizerSettings::default()
        },
        ..GptTraining::new(
            tiny(),
            std::fs::read_to_string(&prepared.tokenizer).unwrap(),
            TrainingRows::Shards(split.shards()),
        )
    };
    let result = trainer(training, 2, scratch.path(), "learns").fit().unwrap();

    let validation = curve(&result.metrics_history, "validation_loss");
    let perplexity = result.metrics.get("validation_perplexity").unwrap();
    println!(
        "{} training rows; unigram entropy {entropy:.3} nats; validation loss by report {validation:?}, \
         perplexity {perplexity:.1}",
        prepared.train.rows
    );
    let last = *validation.last().unwrap();
    assert!(
        last < entropy,
        "validation loss {last} is not below the unigram entropy {entropy}"
    );
    assert!((perplexity - last.exp()).abs() < 1e-6 * perplexity);
    assert_eq!(result.metrics.get("step"), Some(steps as f64));
}
