//! Hyperparameter search for the digits MLP: ASHA over the learning rate,
//! the hidden layer's width and the batch size, trials running in
//! parallel on the embedded cluster (one CPU each). The trials optimize
//! their accuracy on a validation split held out of the training digits;
//! the search chooses the trial with the best last validation accuracy,
//! and its test accuracy (on digits no choice looked at) is what the
//! chosen model scores. With `--compare`, the same configurations also run
//! under FIFO, and the two are compared by the training they needed (total
//! epochs) and the test accuracy of the trial each chose.
//!
//! `cargo run --release -p raylet-tune --example tune_digits -- [--samples 16] [--epochs 20] [--compare] [--storage DIR]`
//!
//! Results go to a temporary directory unless `--storage DIR` keeps them
//! (`DIR/tune_digits_asha/results.csv`, ...).

use std::error::Error;
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

/// What one search under a scheduler came to.
struct Outcome {
    /// The chosen trial's last validation and test accuracy.
    validation: f64,
    test: f64,
    /// The chosen trial's configuration.
    config: String,
    /// The epochs all trials trained.
    epochs: usize,
    seconds: f64,
}

/// Runs the search under `scheduler`, optimizing `accuracy` (the
/// validation accuracy), and chooses its trial.
fn search(
    name: &str,
    scheduler: impl TrialScheduler + 'static,
    samples: usize,
    epochs: usize,
    storage: &std::path::Path,
) -> Result<Outcome, Box<dyn Error>> {
    let started = Instant::now();
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
    let seconds = started.elapsed().as_secs_f64();
    choose(&results, seconds)
}

/// The trial whose last result has the best validation accuracy
/// (`ResultGrid::best`), with that result's test accuracy.
fn choose(results: &ResultGrid, seconds: f64) -> Result<Outcome, Box<dyn Error>> {
    let best = results.best().ok_or("no trial reported accuracy")?;
    let metric = |name| best.metrics.as_ref().and_then(|m| m.get(name)).unwrap_or(f64::NAN);
    Ok(Outcome {
        validation: metric("accuracy"),
        test: metric("test_accuracy"),
        config: best.config.to_string(),
        epochs: results.iter().map(|r| r.metrics_history.len()).sum(),
        seconds,
    })
}

fn print_outcome(what: &str, outcome: &Outcome) {
    println!(
        "{what}: chose {} by validation accuracy {:.2}%, test accuracy {:.2}% ({} epochs trained in {:.1} s)",
        outcome.config,
        100.0 * outcome.validation,
        100.0 * outcome.test,
        outcome.epochs,
        outcome.seconds
    );
}

fn main() -> Result<(), Box<dyn Error>> {
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
    let asha = search("tune_digits_asha", asha, samples, epochs, &storage)?;
    print_outcome(&format!("ASHA, {samples} trials"), &asha);
    if args.iter().any(|a| a == "--compare") {
        let fifo = search("tune_digits_fifo", Fifo, samples, epochs, &storage)?;
        print_outcome(&format!("FIFO, the same {samples} trials"), &fifo);
        println!(
            "ASHA's choice scored {:.2}% on the test digits with {:.2}x less training than FIFO's ({:.2}%)",
            100.0 * asha.test,
            fifo.epochs as f64 / asha.epochs as f64,
            100.0 * fifo.test
        );
    }
    Ok(())
}
