//! Digits training throughput with 1 and 2 workers: the digits MLP (see
//! `raylet_models::digits`) trained by the data-parallel trainer on the
//! embedded cluster, for three model and batch sizes, each configuration run
//! `--reps` times in turn so that they share the machine's noise. Prints a
//! Markdown table: the median of the per-epoch samples per second (the
//! first epoch of each run left out as warm-up), its ratio to 1 worker,
//! the run's wall time with worker start-up, and the final test accuracy.
//!
//! `cargo run --release -p raylet-train --example digits_throughput [-- --reps 3] [--epochs 10] [--write bench/train_digits.md]`
//!
//! With `--write`, the table also goes to that file, which
//! `bench/compare_ray.py` puts into BENCHMARKS.md.

use std::collections::BTreeMap;
use std::time::Duration;

use raylet_models::digits;
use raylet_train::digits::DigitsTraining;
use raylet_train::{RunConfig, ScalingConfig, TrainResult, Trainer};

/// (hidden units, global batch size): the small model at two batch sizes,
/// then a wider one, whose steps compute more per byte they allreduce.
const CONFIGS: [(usize, usize); 3] = [(64, 64), (64, 256), (1024, 256)];
const WORKERS: [usize; 2] = [1, 2];

/// What the runs of one configuration measured.
#[derive(Default)]
struct Measured {
    samples_per_second: Vec<f64>,
    wall: Vec<Duration>,
    accuracy: Vec<f64>,
}

fn main() {
    let reps: usize = flag("--reps").map_or(2, |reps| reps.parse().expect("--reps takes a number"));
    let epochs: u64 = flag("--epochs").map_or(10, |epochs| epochs.parse().expect("--epochs takes a number"));
    let cluster = raylet::init().expect("an embedded cluster");
    let storage = tempfile_dir();
    let mut measured: BTreeMap<((usize, usize), usize), Measured> = BTreeMap::new();
    for rep in 0..reps {
        for config in CONFIGS {
            for workers in WORKERS {
                let result = train(&storage, rep, epochs, config, workers);
                let entry = measured.entry((config, workers)).or_default();
                let per_epoch = result.metrics_history.iter().skip(1);
                entry
                    .samples_per_second
                    .extend(per_epoch.filter_map(|r| r.metrics.get("samples_per_second")));
                entry.wall.push(result.elapsed);
                entry.accuracy.push(result.metrics.get("accuracy").unwrap_or(f64::NAN));
            }
        }
    }
    cluster.shutdown().expect("the cluster stops");
    std::fs::remove_dir_all(&storage).expect("the runs' directories are removed");
    let report = table(&measured, reps, epochs);
    report.iter().for_each(|line| println!("{line}"));
    if let Some(path) = flag("--write") {
        std::fs::write(&path, report.join("\n") + "\n").expect("the report is written");
    }
}

fn train(
    storage: &std::path::Path,
    rep: usize,
    epochs: u64,
    (hidden, batch): (usize, usize),
    workers: usize,
) -> TrainResult {
    let data = digits::load(0.2, 0);
    let training = DigitsTraining {
        epochs,
        global_batch_size: batch,
        hidden,
        ..DigitsTraining::default()
    };
    Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: workers,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: format!("h{hidden}-b{batch}-w{workers}-r{rep}"),
            storage_path: storage.to_path_buf(),
            verbose: false,
            ..RunConfig::default()
        })
        .dataset("train", data.train)
        .dataset("test", data.test)
        .fit()
        .expect("the run trains")
}

fn table(measured: &BTreeMap<((usize, usize), usize), Measured>, reps: usize, epochs: u64) -> Vec<String> {
    let mut lines = vec![
        format!(
            "{epochs} epochs of the digits MLP (64 inputs, one hidden layer of the row's width, 10 outputs; Adam) \
             per run, {reps} runs per row, taken in turn; samples/s is the median over the runs' epochs after \
             the first; the accuracy is on the 20% of the digits held out as the test split (`digits::load(0.2, 0)`)."
        ),
        String::new(),
        "| hidden units | global batch | workers | samples/s (median) | vs 1 worker | run wall time (median) | final test accuracy |"
            .into(),
        "|---|---|---|---|---|---|---|".into(),
    ];
    for config in CONFIGS {
        let (hidden, batch) = config;
        let one_worker = median(&measured[&(config, 1)].samples_per_second);
        for workers in WORKERS {
            let row = &measured[&(config, workers)];
            let speed = median(&row.samples_per_second);
            let wall = median(&row.wall.iter().map(Duration::as_secs_f64).collect::<Vec<_>>());
            let accuracy = median(&row.accuracy);
            lines.push(format!(
                "| {hidden} | {batch} | {workers} | {speed:.0} | {:.2}× | {:.2} s | {:.1}% |",
                speed / one_worker,
                wall,
                accuracy * 100.0
            ));
        }
    }
    lines
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != name).nth(1)
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("raylet-digits-throughput-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the runs");
    dir
}
