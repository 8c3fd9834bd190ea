//! Quickstart: the embedded cluster. `raylet::init()` starts a head and a
//! node inside this process; workers are this same binary, started again.
//! Small jobs run on it: Monte Carlo π over 100 tasks; a map-reduce word
//! count over generated files, where the map tasks' results travel to the
//! reduce task as `ObjectRef`s; data-parallel training of an MLP on the
//! digits by two worker actors that average their gradients; batch
//! inference with that model over the test digits written as image files,
//! by a pool of two actors; and a short hyperparameter search for the MLP,
//! with ASHA ending poor trials early.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use raylet::prelude::*;
use raylet_data::digits::{DigitClassifier, Prediction};
use raylet_data::{ActorPoolStrategy, Dataset, FileSet};
use raylet_models::digits;
use raylet_train::digits::DigitsTraining;
use raylet_train::{RunConfig, ScalingConfig, Trainer};
use raylet_tune::schedulers::Asha;
use raylet_tune::search::{BasicVariant, SearchSpace, choice, loguniform};
use raylet_tune::{Mode, TuneConfig, Tuner};

/// Counts how many of `samples` random points in the unit square fall
/// inside the quarter circle. A small xorshift generator keeps it
/// dependency-free and deterministic per seed.
#[raylet::remote]
fn sample_pi(seed: u64, samples: u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..samples).filter(|_| next().powi(2) + next().powi(2) <= 1.0).count() as u64
}

/// Map: counts the words of one file.
#[raylet::remote]
fn count_words(path: String) -> Result<BTreeMap<String, u64>, String> {
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let mut counts = BTreeMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
    }
    Ok(counts)
}

/// Reduce: merges the per-file counts, fetched from their owners.
#[raylet::remote]
fn merge_counts(parts: Vec<ObjectRef<BTreeMap<String, u64>>>) -> Result<BTreeMap<String, u64>, String> {
    let mut total = BTreeMap::new();
    for part in parts {
        for (word, count) in part.get().map_err(|e| e.to_string())? {
            *total.entry(word).or_insert(0) += count;
        }
    }
    Ok(total)
}

fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = raylet::init()?;
    println!("cluster ready in {:.1} ms", ms(started));
    sample_pi::remote(&cluster, 0, 1)?.get()?;
    println!("first task result {:.1} ms after start", ms(started));

    let pi_started = Instant::now();
    let samples = 200_000;
    let hits: Vec<ObjectRef<u64>> = (0..100)
        .map(|seed| sample_pi::remote(&cluster, seed, samples))
        .collect::<raylet::Result<_>>()?;
    let inside: u64 = cluster.get_all(&hits)?.iter().sum();
    let pi = 4.0 * inside as f64 / (100 * samples) as f64;
    println!(
        "pi ~= {pi:.5} from 100 tasks of {samples} samples in {:.1} ms",
        ms(pi_started)
    );

    let files = write_corpus(&std::env::temp_dir().join(format!("raylet-quickstart-{}", std::process::id())))?;
    let count_started = Instant::now();
    let parts: Vec<_> = files
        .iter()
        .map(|f| count_words::remote(&cluster, f.to_string_lossy().to_string()))
        .collect::<raylet::Result<_>>()?;
    let totals = merge_counts::remote(&cluster, parts)?.get()?;
    let mut top: Vec<_> = totals.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    println!(
        "word count over {} files in {:.1} ms: {} distinct words; top 5: {:?}",
        files.len(),
        ms(count_started),
        totals.len(),
        &top[..5]
    );
    if let Some(dir) = files.first().and_then(|f| f.parent()) {
        std::fs::remove_dir_all(dir)?;
    }

    train_and_classify_digits()?;
    tune_digits()?;
    cluster.shutdown()?;
    println!("total {:.1} ms", ms(started));
    Ok(())
}

/// Trains an MLP on the digits with two workers for ten epochs (the
/// trainer prints each epoch's test accuracy as rank 0 reports it), then
/// classifies the test digits, written as image files, with it.
fn train_and_classify_digits() -> anyhow::Result<()> {
    let storage = std::env::temp_dir().join(format!("raylet-quickstart-train-{}", std::process::id()));
    let data = digits::load(0.2, 0);
    let test = data.test.clone();
    let training = DigitsTraining {
        epochs: 10,
        ..DigitsTraining::default()
    };
    let result = Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: 2,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: "digits".into(),
            storage_path: storage.clone(),
            ..RunConfig::default()
        })
        .dataset("train", data.train)
        .dataset("test", data.test)
        .fit()?;
    let accuracy = result.metrics.get("accuracy").unwrap_or(f64::NAN);
    println!(
        "digits MLP on 2 workers: {:.1}% test accuracy after 10 epochs in {:.1} ms",
        accuracy * 100.0,
        result.elapsed.as_secs_f64() * 1000.0
    );
    let checkpoint = result
        .checkpoint
        .ok_or_else(|| anyhow::anyhow!("the training run saved no checkpoint"))?;
    classify_digits(&storage, checkpoint.path().to_path_buf(), &test)?;
    std::fs::remove_dir_all(storage)?;
    Ok(())
}

/// Writes the test digits as PGM files and classifies them with a pool of
/// two actors that each load the trained model once; prints the accuracy.
fn classify_digits(storage: &Path, checkpoint: PathBuf, test: &[digits::Digit]) -> anyhow::Result<()> {
    let images = storage.join("images");
    raylet_data::digits::write_images(&images, test)?;
    let started = Instant::now();
    let classifier = DigitClassifier {
        checkpoint,
        hidden: DigitsTraining::default().hidden,
    };
    let predictions: Vec<Prediction> = Dataset::read_binary(FileSet::dir(&images))
        .files_per_block(32)
        .map_batches_with(classifier, 32, ActorPoolStrategy::fixed(2))
        .take_all()?;
    let correct = predictions.iter().filter(|p| p.label == Some(p.predicted)).count();
    println!(
        "batch inference over {} image files with 2 actors in {:.1} ms: {:.1}% classified right",
        predictions.len(),
        ms(started),
        100.0 * correct as f64 / predictions.len().max(1) as f64
    );
    Ok(())
}

/// Searches 8 learning rates and hidden sizes for the digits MLP, two
/// trials at a time, for up to 6 epochs each; ASHA stops the poor ones
/// after 2 epochs.
fn tune_digits() -> anyhow::Result<()> {
    let storage = std::env::temp_dir().join(format!("raylet-quickstart-tune-{}", std::process::id()));
    let started = Instant::now();
    let results = Tuner::new(raylet_tune::digits::train_digits)
        .param_space(
            SearchSpace::new()
                .with("lr", loguniform(1e-3, 1e-1))
                .with("hidden", choice([16, 64]))
                .with("batch_size", 32)
                .with("epochs", 6),
        )
        .tune_config(TuneConfig {
            metric: Some("accuracy".into()),
            mode: Mode::Max,
            num_samples: 8,
            ..TuneConfig::default()
        })
        .searcher(BasicVariant::seeded(0))
        .scheduler(Asha::new().max_t(6.0).grace_period(2.0).reduction_factor(3.0))
        .run_config(raylet_tune::RunConfig {
            name: "digits_search".into(),
            storage_path: storage.clone(),
            ..raylet_tune::RunConfig::default()
        })
        .fit()?;
    let best = results
        .best()
        .ok_or_else(|| anyhow::anyhow!("no trial reported accuracy"))?;
    let epochs: usize = results.iter().map(|r| r.metrics_history.len()).sum();
    println!(
        "ASHA search over 8 trials ({epochs} of 48 epochs trained) in {:.1} ms: best {:.1}% with {}",
        ms(started),
        100.0
            * best
                .metrics
                .as_ref()
                .and_then(|m| m.get("accuracy"))
                .unwrap_or(f64::NAN),
        best.config
    );
    std::fs::remove_dir_all(storage)?;
    Ok(())
}

/// Writes 20 files of generated text, so the example needs no data set.
fn write_corpus(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    const WORDS: [&str; 12] = [
        "ray", "raylet", "task", "actor", "object", "node", "cluster", "worker", "lease", "train", "tune", "data",
    ];
    std::fs::create_dir_all(dir)?;
    (0..20)
        .map(|file| {
            let text: Vec<&str> = (0..5_000usize)
                .map(|i| WORDS[(i * i + file * 5 + i / 7) % WORDS.len()])
                .collect();
            let path = dir.join(format!("part-{file:02}.txt"));
            std::fs::write(&path, text.join(" "))?;
            Ok(path)
        })
        .collect()
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
