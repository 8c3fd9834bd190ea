//! A trainable for the digits MLP (feature `digits`): one trial trains
//! `DigitsMlp` with Adam on the digits' training set, less a validation
//! split held out of it, and reports after every epoch its accuracy on that
//! validation split (`accuracy`, what searchers and schedulers should
//! optimize) and on the test set (`test_accuracy`, to read after the search
//! without having chosen by it), with a checkpoint of the model and the
//! optimizer, so schedulers can pause, resume and exploit it.
//!
//! Its config: `lr` (f64), `hidden` (units), `batch_size`, `epochs`, and
//! optionally `seed` (the model's initialization; default 0).
//!
//! [`train_digits_on_workers`] makes each trial a data-parallel Train run
//! of its own (`workers` ranks, 2 by default) that forwards its reports.

use std::sync::OnceLock;
use std::time::Instant;

use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::Device;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use raylet_models::digits::{self, Digit, DigitsMlp, DigitsSplit, batch};
use raylet_train::digits::DigitsTraining;
use raylet_train::{ScalingConfig, Trainer};

use crate::{Metrics, TrainableResult, TrialConfig, TrialContext, register_trainable};

/// The share of the digits held out as the test set.
const TEST_FRACTION: f64 = 0.2;

/// The share of the training digits that [`train_digits`] holds out to
/// validate on.
const VALIDATION_FRACTION: f64 = 0.2;

/// The digits, split the same way for every trial.
fn split() -> &'static DigitsSplit {
    static SPLIT: OnceLock<DigitsSplit> = OnceLock::new();
    SPLIT.get_or_init(|| digits::load(TEST_FRACTION, 0))
}

/// [`split`]'s training set cut in two, the same way for every trial: the
/// digits to train on and, from its (already shuffled) start, the
/// validation split; the test set stays apart.
struct TrainAndValidation {
    train: Vec<Digit>,
    validation: Vec<Digit>,
}

fn train_and_validation() -> &'static TrainAndValidation {
    static SETS: OnceLock<TrainAndValidation> = OnceLock::new();
    SETS.get_or_init(|| {
        let mut validation = split().train.clone();
        let count = (validation.len() as f64 * VALIDATION_FRACTION).round() as usize;
        let train = validation.split_off(count);
        TrainAndValidation { train, validation }
    })
}

/// The share of `digits` that `model` classifies correctly.
fn accuracy(model: &DigitsMlp, digits: &[Digit], device: &Device) -> f64 {
    model.count_correct(digits, device) as f64 / digits.len() as f64
}

/// Trains the digits MLP for `epochs`, reporting `accuracy` (on the
/// validation split), `test_accuracy`, `loss` and `epoch` after each,
/// resuming from the trial's checkpoint if it has one.
pub fn train_digits(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let lr: f64 = config.get("lr")?;
    let hidden: usize = config.get("hidden")?;
    let batch_size: usize = config.get::<usize>("batch_size")?.max(1);
    let epochs: u64 = config.get("epochs")?;
    let seed: u64 = config.get("seed").unwrap_or(0);
    let autodiff = Device::flex().autodiff();
    autodiff.seed(seed);
    let mut model = DigitsMlp::new(hidden, &autodiff);
    let mut optimizer = AdamConfig::new().init();
    if let Some(checkpoint) = ctx.checkpoint() {
        model = checkpoint.load_model(model)?;
        optimizer = checkpoint.load_optimizer(optimizer)?;
    }
    let data = train_and_validation();
    while ctx.iteration() < epochs {
        let epoch = ctx.iteration();
        let started = Instant::now();
        let mut order: Vec<usize> = (0..data.train.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ (epoch << 16)));
        let mut loss_sum = 0.0;
        let mut steps = 0;
        for step in order.chunks_exact(batch_size) {
            let images: Vec<_> = step.iter().map(|&i| data.train[i].clone()).collect();
            let (pixels, labels) = batch(&images, &autodiff);
            let loss = CrossEntropyLoss::new(None, &autodiff).forward(model.forward(pixels), labels);
            loss_sum += f64::from(loss.clone().into_scalar::<f32>());
            steps += 1;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(lr, model, grads);
        }
        let metrics = Metrics::new()
            .with("epoch", epoch as f64)
            .with("accuracy", accuracy(&model, &data.validation, &autodiff))
            .with("test_accuracy", accuracy(&model, &split().test, &autodiff))
            .with("loss", loss_sum / f64::from(steps.max(1)))
            .with("epoch_seconds", started.elapsed().as_secs_f64());
        let checkpoint = ctx.new_checkpoint()?;
        checkpoint.save_model(&model)?;
        checkpoint.save_optimizer(&optimizer)?;
        ctx.report(metrics, Some(checkpoint))?;
    }
    Ok(())
}
register_trainable!(train_digits);

/// Runs the trial as a Train run of `workers` ranks (2 by default, each
/// holding a CPU) of raylet-train's `DigitsTraining`, kept under the
/// trial's storage path (in object storage too, for an experiment there),
/// forwarding rank 0's reports to Tune. A scheduler's stop ends the Train
/// run; a resumed trial's Train run goes on from its latest checkpoint.
/// Give such trials no CPU of their own (`TrialResources { num_cpus: 0.0,
/// .. }`): their workers hold them.
pub fn train_digits_on_workers(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let training = DigitsTraining {
        epochs: config.get("epochs")?,
        global_batch_size: config.get("batch_size")?,
        learning_rate: config.get("lr")?,
        hidden: config.get("hidden")?,
        seed: config.get("seed").unwrap_or(0),
    };
    let workers: usize = config.get("workers").unwrap_or(2);
    let data = split();
    let trainer = Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: workers,
            ..ScalingConfig::default()
        })
        .dataset("train", data.train.clone())
        .dataset("test", data.test.clone());
    ctx.fit_train_run(trainer)?;
    Ok(())
}
register_trainable!(train_digits_on_workers);
