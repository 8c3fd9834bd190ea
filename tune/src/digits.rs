//! A trainable for the digits MLP (feature `digits`): one trial trains
//! `DigitsMlp` with Adam on the digits' training set and reports its test
//! accuracy after every epoch, with a checkpoint of the model and the
//! optimizer, so schedulers can pause, resume and exploit it.
//!
//! Its config: `lr` (f64), `hidden` (units), `batch_size`, `epochs`, and
//! optionally `seed` (the model's initialization; default 0).

use std::sync::OnceLock;
use std::time::Instant;

use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::Device;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use raylet_train::digits::{self, DigitsMlp, DigitsSplit, batch};

use crate::{Metrics, TrainableResult, TrialConfig, TrialContext, register_trainable};

/// The share of the digits held out to measure accuracy.
const TEST_FRACTION: f64 = 0.2;

/// The digits, split the same way for every trial.
fn split() -> &'static DigitsSplit {
    static SPLIT: OnceLock<DigitsSplit> = OnceLock::new();
    SPLIT.get_or_init(|| digits::load(TEST_FRACTION, 0))
}

/// Trains the digits MLP for `epochs`, reporting `accuracy`, `loss` and
/// `epoch` after each, resuming from the trial's checkpoint if it has one.
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
    let data = split();
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
        let correct = model.count_correct(&data.test, &autodiff);
        let metrics = Metrics::new()
            .with("epoch", epoch as f64)
            .with("accuracy", correct as f64 / data.test.len() as f64)
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
