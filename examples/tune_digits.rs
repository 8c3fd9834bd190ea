//! Hyperparameter search for the digits MLP: ASHA over the learning rate,
//! the hidden layer's width and the batch size, trials running in
//! parallel on the embedded cluster (one CPU each). With `--compare`, the
//! same configurations also run under FIFO, and the two are compared by
//! the training they needed (total epochs) for their best accuracy.
//!
//! `cargo run --release --example tune_digits -- [--samples 16] [--epochs 20] [--compare] [--storage DIR]`
//!
//! Results go to a temporary directory unless `--storage DIR` keeps them
//! (`DIR/tune_digits_asha/results.csv`, ...).

use std::time::Instant;

use raylet_tune::digits::train_digits;
use raylet_tune::schedulers::{Asha, Fifo, TrialScheduler};
use raylet_tune::search::{BasicVariant, SearchSpace, choice, loguniform};
use raylet_tune::{Mode, ResultGrid, RunConfig, TuneConfig, Tuner};

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn space(epochs: usize) -> SearchSpace {
    SearchSpace::new()
        .with("lr", loguniform(1e-4, 1e-1))
        .with("hidden", choice([16, 32, 64, 128]))
        .with("batch_size", choice([16, 32, 64, 128]))
        .with("epochs", epochs)
}

/// Runs the search under `scheduler`; returns its results and the total
/// epochs its trials trained.
fn search(
    name: &str,
    scheduler: impl TrialScheduler + 'static,
    samples: usize,
    epochs: usize,
    storage: &std::path::Path,
) -> Result<(ResultGrid, usize), Box<dyn std::error::Error>> {
    let results = Tuner::new(train_digits)
        .param_space(space(epochs))
        .tune_config(TuneConfig {
            metric: Some("accuracy".into()),
            mode: Mode::Max,
            num_samples: samples,
            ..TuneConfig::default()
        })
        .searcher(BasicVariant::seeded(7))
        .scheduler(scheduler)
        .run_config(RunConfig {
            name: name.into(),
            storage_path: storage.to_path_buf(),
            ..RunConfig::default()
        })
        .fit()?;
    let trained: usize = results.iter().map(|r| r.metrics_history.len()).sum();
    Ok((results, trained))
}

fn best_accuracy(results: &ResultGrid) -> f64 {
    results
        .iter()
        .flat_map(|r| r.metrics_history.iter().filter_map(|m| m.get("accuracy")))
        .fold(0.0, f64::max)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let samples = flag(&args, "--samples", 16);
    let epochs = flag(&args, "--epochs", 20);
    raylet::init()?;
    let temporary = tempfile::tempdir()?;
    let storage = match args.iter().position(|a| a == "--storage") {
        Some(i) => std::path::PathBuf::from(args.get(i + 1).ok_or("--storage needs a directory")?),
        None => temporary.path().to_path_buf(),
    };
    let asha = Asha::new().max_t(epochs as f64).grace_period(2.0).reduction_factor(3.0);
    let started = Instant::now();
    let (results, asha_epochs) = search("tune_digits_asha", asha, samples, epochs, &storage)?;
    let best = results.best().expect("a trial reported accuracy");
    println!(
        "ASHA, {samples} trials: best test accuracy {:.2}% with {} ({asha_epochs} epochs trained in {:.1} s)",
        100.0 * best.metrics.as_ref().and_then(|m| m.get("accuracy")).unwrap_or(0.0),
        best.config,
        started.elapsed().as_secs_f64()
    );
    if args.iter().any(|a| a == "--compare") {
        let started = Instant::now();
        let (fifo, fifo_epochs) = search("tune_digits_fifo", Fifo, samples, epochs, &storage)?;
        println!(
            "FIFO, the same {samples} trials: best test accuracy {:.2}% ({fifo_epochs} epochs trained in {:.1} s)",
            100.0 * best_accuracy(&fifo),
            started.elapsed().as_secs_f64()
        );
        println!(
            "ASHA reached {:.2}% with {:.2}x less training than FIFO's {:.2}%",
            100.0 * best_accuracy(&results),
            fifo_epochs as f64 / asha_epochs as f64,
            100.0 * best_accuracy(&fifo)
        );
    }
    Ok(())
}
