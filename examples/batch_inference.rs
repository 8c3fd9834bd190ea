//! Batch inference with raylet-data: trains the digits MLP on 2 workers
//! (raylet-train), writes the held-out test digits as 8x8 PGM files,
//! classifies every file with a pool of 2 actors that each load the model
//! from the run's checkpoint once, writes the predictions as JSONL (one
//! file per block, with a manifest) and prints the accuracy.
//!
//! `cargo run --release -p raylet-data --example batch_inference -- [--epochs 10] [--dir DIR]`

use std::path::PathBuf;
use std::time::Instant;

use raylet_data::digits::{self, DigitClassifier, Prediction};
use raylet_data::{ActorPoolStrategy, Dataset, FileSet, OnError};
use raylet_train::digits::DigitsTraining;
use raylet_train::{RunConfig, ScalingConfig, Trainer};

struct Args {
    epochs: u64,
    dir: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        epochs: 10,
        dir: std::env::temp_dir().join(format!("raylet-batch-inference-{}", std::process::id())),
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--epochs" => args.epochs = value.parse()?,
            "--dir" => args.dir = value.into(),
            _ => anyhow::bail!("unknown flag {flag}; expected --epochs or --dir"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    raylet::init()?;
    let data = raylet_models::digits::load(0.2, 0);
    let training = DigitsTraining {
        epochs: args.epochs,
        ..DigitsTraining::default()
    };
    let hidden = training.hidden;
    let result = Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: 2,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: "digits".into(),
            storage_path: args.dir.join("train"),
            ..RunConfig::default()
        })
        .dataset("train", data.train)
        .dataset("test", data.test.clone())
        .fit()?;
    let checkpoint = result
        .checkpoint
        .ok_or_else(|| anyhow::anyhow!("the training run saved no checkpoint"))?;
    println!(
        "trained on 2 workers: {:.1}% test accuracy; checkpoint {}",
        100.0 * result.metrics.get("accuracy").unwrap_or(f64::NAN),
        checkpoint.path().display()
    );

    let images = args.dir.join("images");
    let written = digits::write_images(&images, &data.test)?;
    println!(
        "wrote {} test digits as PGM files to {}",
        written.len(),
        images.display()
    );

    let started = Instant::now();
    let classifier = DigitClassifier {
        checkpoint: checkpoint.path().to_path_buf(),
        hidden,
    };
    let predictions = args.dir.join("predictions");
    let summary = Dataset::read_binary(FileSet::glob(&format!("{}/*.pgm", images.display())))
        .files_per_block(32)
        .on_error(OnError::Skip)
        .map_batches_with(classifier, 32, ActorPoolStrategy::fixed(2))
        .write_jsonl(&predictions)?;
    let (mut correct, mut labelled) = (0, 0);
    for file in &summary.files {
        for line in std::fs::read_to_string(file)?.lines() {
            let prediction: Prediction = serde_json::from_str(line)?;
            if let Some(label) = prediction.label {
                labelled += 1;
                correct += usize::from(label == prediction.predicted);
            }
        }
    }
    println!(
        "classified {} files with {} actors in {:.1} ms ({} blocks, {} skipped): accuracy {:.2}% ({correct} of {labelled}); predictions in {}",
        summary.rows,
        summary.max_actors,
        started.elapsed().as_secs_f64() * 1000.0,
        summary.blocks_written + summary.blocks_skipped,
        summary.errors.len(),
        100.0 * correct as f64 / labelled.max(1) as f64,
        predictions.display()
    );
    Ok(())
}
