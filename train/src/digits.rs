//! A whole data-parallel train loop for the digits: every rank starts from
//! rank 0's model (or the run's latest checkpoint), trains on its shard
//! with the gradients averaged over the group at every step, and after
//! every epoch the ranks count their test shard's correct answers together;
//! rank 0 reports them with a checkpoint of the model, the optimizer and
//! the epoch.

use std::time::Instant;

use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{AdamConfig, GradientsParams};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use raylet_models::digits::{Digit, DigitsMlp, batch};
use serde::{Deserialize, Serialize};

use crate::collective::ReduceOp;
use crate::model_sync::{allreduce_gradients, sync_initial_model};
use crate::{Metrics, TrainContext, TrainError, TrainLoop};

/// Trains a [`DigitsMlp`] on the trainer's `train` dataset and tests it on
/// its `test` dataset (both of [`Digit`]s), with Adam.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DigitsTraining {
    pub epochs: u64,
    /// Images per step over all workers; each takes its share.
    pub global_batch_size: usize,
    pub learning_rate: f64,
    pub hidden: usize,
    pub seed: u64,
}

impl Default for DigitsTraining {
    fn default() -> Self {
        DigitsTraining {
            epochs: 15,
            global_batch_size: 64,
            learning_rate: 3e-3,
            hidden: 64,
            seed: 0,
        }
    }
}

/// What a checkpoint records besides the model and the optimizer.
#[derive(Serialize, Deserialize)]
struct Progress {
    epoch: u64,
}

crate::register_train_loop!(DigitsTraining);

impl TrainLoop for DigitsTraining {
    fn reports(&self) -> Option<u64> {
        Some(self.epochs)
    }

    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        let device = context.device();
        let autodiff = device.clone().autodiff();
        autodiff.seed(self.seed);
        let train: Vec<Digit> = context.dataset_shard("train")?;
        let test: Vec<Digit> = context.dataset_shard("test")?;
        let mut model = DigitsMlp::new(self.hidden, &autodiff);
        let mut optimizer = AdamConfig::new().init();
        let mut first_epoch = 0;
        if let Some(checkpoint) = context.checkpoint() {
            model = checkpoint.load_model(model)?;
            optimizer = checkpoint.load_optimizer(optimizer)?;
            first_epoch = checkpoint.load_state::<Progress>()?.epoch + 1;
        }
        model = sync_initial_model(context.group(), model)?;
        let local_batch = context.local_batch_size(self.global_batch_size);
        let learning_rate = context.learning_rate(self.learning_rate, self.global_batch_size);
        for epoch in first_epoch..self.epochs {
            let started = Instant::now();
            let mut order: Vec<usize> = (0..train.len()).collect();
            let shuffle_seed = self.seed ^ (epoch << 16) ^ context.rank() as u64;
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(shuffle_seed));
            let steps = train.len() / local_batch;
            let mut loss_sum = 0.0;
            for step in order.chunks_exact(local_batch).take(steps) {
                let digits: Vec<Digit> = step.iter().map(|&i| train[i].clone()).collect();
                let (pixels, labels) = batch(&digits, &autodiff);
                let loss = CrossEntropyLoss::new(None, &autodiff).forward(model.forward(pixels), labels);
                loss_sum += f64::from(loss.clone().into_scalar::<f32>());
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                let grads = allreduce_gradients(context.group(), &model, grads, &device)?;
                model = optimizer.step(learning_rate, model, grads);
            }
            let correct = model.count_correct(&test, &autodiff);
            let mut totals = [correct as f64, test.len() as f64, loss_sum, steps as f64];
            context.group().allreduce(&mut totals, ReduceOp::Sum)?;
            let samples = (steps * local_batch * context.world_size()) as f64;
            let metrics = Metrics::new()
                .with("epoch", epoch as f64)
                .with("accuracy", totals[0] / totals[1])
                .with("loss", totals[2] / totals[3].max(1.0))
                .with("samples_per_second", samples / started.elapsed().as_secs_f64());
            let checkpoint = match context.rank() {
                0 => {
                    let checkpoint = context.new_checkpoint()?;
                    checkpoint.save_model(&model)?;
                    checkpoint.save_optimizer(&optimizer)?;
                    checkpoint.save_state(&Progress { epoch })?;
                    Some(checkpoint)
                }
                _ => None,
            };
            context.report(metrics, checkpoint)?;
        }
        Ok(())
    }
}
