//! Data-parallel training of an MLP on the digits with two workers on the
//! embedded cluster: each worker is an actor with its shard of the
//! training set, gradients are averaged over the group at every step, and
//! rank 0 reports the test accuracy and a checkpoint after every epoch.
//!
//! `cargo run --release -p raylet-train --features digits --example train_digits -- --workers 2 --epochs 15`

use std::path::PathBuf;

use raylet_models::digits;
use raylet_train::digits::DigitsTraining;
use raylet_train::{CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, Trainer};

/// `--workers N --epochs N --storage DIR`, each optional.
struct Args {
    workers: usize,
    epochs: u64,
    storage: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        workers: 2,
        epochs: 15,
        storage: std::env::temp_dir().join("raylet_results"),
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--workers" => args.workers = value.parse()?,
            "--epochs" => args.epochs = value.parse()?,
            "--storage" => args.storage = value.into(),
            _ => anyhow::bail!("unknown flag {flag}; expected --workers, --epochs or --storage"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    raylet::init()?;
    let data = digits::load(0.2, 0);
    println!(
        "digits: {} training and {} test images, {} workers",
        data.train.len(),
        data.test.len(),
        args.workers
    );
    let training = DigitsTraining {
        epochs: args.epochs,
        ..DigitsTraining::default()
    };
    let name = format!("digits-{}w-{}", args.workers, std::process::id());
    let result = Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: args.workers,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name,
            storage_path: args.storage,
            checkpoint: CheckpointConfig {
                num_to_keep: Some(2),
                score_metric: Some("accuracy".into()),
                ..CheckpointConfig::default()
            },
            failure: FailureConfig {
                max_failures: 2,
                ..FailureConfig::default()
            },
            verbose: true,
        })
        .dataset("train", data.train)
        .dataset("test", data.test)
        .fit()?;
    for report in &result.metrics_history {
        let accuracy = report.metrics.get("accuracy").unwrap_or(f64::NAN);
        println!("epoch {:>2}: test accuracy {:.2}%", report.index, accuracy * 100.0);
    }
    let best = result.best_checkpoints.first();
    if let Some((checkpoint, metrics)) = best {
        println!("best checkpoint: {} ({metrics})", checkpoint.path().display());
    }
    println!(
        "trained in {:.1} s with {} failure(s); run directory {}",
        result.elapsed.as_secs_f64(),
        result.failures,
        result.path.display()
    );
    Ok(())
}
