//! Training a GPT on prepared rows with raylet-train: [`GptTraining`] is
//! the train loop every worker runs. AdamW with a linear warmup and a
//! cosine decay, the gradients' global norm clipped, gradients accumulated
//! over micro-batches, data parallel or sharded by a ZeRO stage; each
//! report has the training loss, the learning rate, the gradient norm (when
//! clipping), the tokens per second, the runtime's overhead (the share of
//! rank 0's step time outside its forward, backward and optimizer update:
//! feeding rows, collectives, copies) and the validation loss and
//! perplexity, and checkpoints carry the tokenizer and resume the same
//! loss curve.

mod checkpointing;
mod feed;
mod validation;

use std::time::{Duration, Instant};

use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use raylet_models::gpt::{Gpt, GptConfig, token_batch};
use raylet_train::collective::ReduceOp;
use raylet_train::schedule::WarmupCosine;
use raylet_train::sharding::{DataParallel, ShardingStrategy};
use raylet_train::{Checkpoint, Metrics, TrainContext, TrainError, TrainLoop, register_train_loop};
use serde::{Deserialize, Serialize};

use crate::TokenRow;
use feed::BatchFeed;
use validation::validation_loss;

pub use checkpointing::{GptProgress, config_differences};
pub use feed::TrainingRows;

/// AdamW, its learning-rate schedule and gradient clipping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerSettings {
    /// The peak learning rate, reached at the end of the warmup.
    pub learning_rate: f64,
    pub warmup_steps: u64,
    /// The learning rate at the last step, as a fraction of the peak.
    pub final_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f32,
    /// The largest global gradient norm a step takes; `None` never clips.
    pub max_gradient_norm: Option<f32>,
}

impl Default for OptimizerSettings {
    fn default() -> Self {
        OptimizerSettings {
            learning_rate: 1e-3,
            warmup_steps: 20,
            final_lr_ratio: 0.1,
            weight_decay: 0.01,
            max_gradient_norm: Some(1.0),
        }
    }
}

/// The train loop of a GPT: its fields are the run's configuration.
#[derive(Serialize, Deserialize)]
pub struct GptTraining {
    pub model: GptConfig,
    /// The tokenizer the rows were made with (its `tokenizer.json`), saved
    /// into every checkpoint.
    pub tokenizer_json: String,
    pub train: TrainingRows,
    /// Rows the validation loss is the mean over; none leaves it out.
    pub validation: Vec<TokenRow>,
    /// Optimizer steps of the whole run.
    pub steps: u64,
    /// Rows per optimizer step over every worker and micro-batch.
    pub global_batch_size: usize,
    /// Micro-batches each worker's share of a step is cut into; their
    /// gradients are summed before the step.
    pub accumulation_steps: usize,
    pub optimizer: OptimizerSettings,
    pub sharding: ShardingStrategy,
    /// Steps between reports; the last step always reports.
    pub report_every: u64,
    /// Steps between checkpoints (each at a report); 0 checkpoints at the
    /// last step only.
    pub checkpoint_every: u64,
    pub seed: u64,
}

/// What one optimizer step did, over every rank.
struct StepOutcome {
    /// The mean loss over every row of the step.
    loss: f64,
    /// The global gradient norm, known when the gradients are clipped.
    gradient_norm: Option<f32>,
    /// Tokens predicted.
    tokens: u64,
    /// This rank's forward and backward passes and optimizer update.
    compute: Duration,
}

/// The steps since the last report.
#[derive(Default)]
struct ReportWindow {
    steps: u64,
    loss_sum: f64,
    gradient_norm: Option<f32>,
    tokens: u64,
    busy: Duration,
    compute: Duration,
}

register_train_loop!(GptTraining);

impl GptTraining {
    /// A run of `model` on `train`, with the defaults: 100 steps of 16
    /// rows, no accumulation, AdamW at 1e-3 with 20 warmup steps, plain
    /// data parallelism, a report every 10 steps and a checkpoint at the end.
    pub fn new(model: GptConfig, tokenizer_json: String, train: TrainingRows) -> Self {
        GptTraining {
            model,
            tokenizer_json,
            train,
            validation: Vec::new(),
            steps: 100,
            global_batch_size: 16,
            accumulation_steps: 1,
            optimizer: OptimizerSettings::default(),
            sharding: ShardingStrategy::None,
            report_every: 10,
            checkpoint_every: 0,
            seed: 0,
        }
    }

    /// Refuses a configuration no worker could train with, naming the field.
    fn check(&self, context: &TrainContext) -> Result<(), TrainError> {
        let invalid = |why: String| Err(TrainError::InvalidConfig(why));
        self.model
            .check()
            .map_err(|e| TrainError::InvalidConfig(e.to_string()))?;
        if self.steps == 0 || self.report_every == 0 || self.accumulation_steps == 0 {
            return invalid("steps, report_every and accumulation_steps must be at least 1".into());
        }
        let local = context.local_batch_size(self.global_batch_size);
        let workers = context.max_workers();
        if !self.global_batch_size.is_multiple_of(workers) || !local.is_multiple_of(self.accumulation_steps) {
            return invalid(format!(
                "a global batch of {} rows does not split evenly over {workers} workers and {} micro-batches each",
                self.global_batch_size, self.accumulation_steps
            ));
        }
        let lr = self.optimizer.learning_rate;
        if !lr.is_finite() || lr <= 0.0 {
            return invalid(format!("the learning rate must be a positive number, not {lr}"));
        }
        Ok(())
    }

    fn schedule(&self) -> WarmupCosine {
        WarmupCosine {
            peak: self.optimizer.learning_rate,
            warmup_steps: self.optimizer.warmup_steps,
            total_steps: self.steps,
            final_ratio: self.optimizer.final_lr_ratio,
        }
    }

    /// The model and optimizer to start from: fresh, or the checkpoint's.
    fn starting_point(
        &self,
        context: &mut TrainContext,
        autodiff: &Device,
    ) -> Result<(DataParallel<Gpt>, u64), TrainError> {
        let model = Gpt::new(&self.model, autodiff).map_err(|e| TrainError::InvalidConfig(e.to_string()))?;
        let optimizer = AdamWConfig::new()
            .with_weight_decay(self.optimizer.weight_decay)
            .with_epsilon(1e-8)
            .init();
        let (model, optimizer, steps_done) = match context.checkpoint() {
            Some(checkpoint) => checkpointing::resume(checkpoint, &self.progress(0), model, optimizer)?,
            None => (model, optimizer, 0),
        };
        let mut parallel = DataParallel::new(context.group(), model, optimizer, self.sharding)?;
        if let Some(max_norm) = self.optimizer.max_gradient_norm {
            parallel = parallel.clip_gradient_norm(max_norm);
        }
        Ok((parallel, steps_done))
    }

    fn progress(&self, steps_done: u64) -> GptProgress {
        GptProgress::new(steps_done, &self.model, &self.tokenizer_json)
    }

    /// Step `step` (from 0): every micro-batch forward and backward, the
    /// gradients averaged and clipped, AdamW at `lr`.
    fn train_step(
        &self,
        context: &mut TrainContext,
        parallel: &mut DataParallel<Gpt>,
        feed: &mut BatchFeed,
        step: u64,
        lr: f64,
    ) -> Result<StepOutcome, TrainError> {
        let device = context.device();
        let autodiff = device.clone().autodiff();
        let model = parallel.model(context.group())?;
        let mut accumulator = GradientsAccumulator::new();
        let mut loss_sum = [0.0];
        let mut tokens = 0;
        let mut compute = Duration::ZERO;
        for _ in 0..self.accumulation_steps {
            let rows = feed.next(context.group())?;
            let ids = self.checked_ids(&rows)?;
            tokens += ids.iter().map(|row| row.len() as u64 - 1).sum::<u64>();
            let started = Instant::now();
            let loss = model.loss(token_batch(&ids, &autodiff));
            loss_sum[0] += f64::from(loss.clone().into_scalar::<f32>());
            let scaled = loss.div_scalar(self.accumulation_steps as f64);
            accumulator.accumulate(&model, GradientsParams::from_grads(scaled.backward(), &model));
            compute += started.elapsed();
        }
        context.group().allreduce(&mut loss_sum, ReduceOp::Mean)?;
        let loss = loss_sum[0] / self.accumulation_steps as f64;
        if !loss.is_finite() {
            return Err(TrainError::Loop(format!(
                "the training loss is {loss} at step {} of {}: the run diverged; \
                 lower the learning rate or clip the gradients (optimizer.max_gradient_norm)",
                step + 1,
                self.steps
            )));
        }
        let gradient_norm = parallel.step(context.group(), lr, model, accumulator.grads(), &device)?;
        Ok(StepOutcome {
            loss,
            gradient_norm,
            tokens: tokens * context.world_size() as u64,
            compute: compute + parallel.last_update_time(),
        })
    }

    /// The rows' ids, once every row fits the model: at least two ids, at
    /// most `context_length + 1`, each in the vocabulary.
    fn checked_ids<'r>(&self, rows: &'r [TokenRow]) -> Result<Vec<&'r [u32]>, TrainError> {
        let longest = self.model.context_length + 1;
        for row in rows {
            if !(2..=longest).contains(&row.ids.len()) {
                return Err(TrainError::InvalidConfig(format!(
                    "a row of {} token ids does not fit a model of context_length {}: rows need 2 to {longest} ids",
                    row.ids.len(),
                    self.model.context_length
                )));
            }
            if let Some(id) = row.ids.iter().find(|&&id| id as usize >= self.model.vocab_size) {
                return Err(TrainError::InvalidConfig(format!(
                    "token id {id} is outside the model's vocabulary of {}: \
                     the rows were made with another tokenizer",
                    self.model.vocab_size
                )));
            }
        }
        Ok(rows.iter().map(|row| row.ids.as_slice()).collect())
    }

    /// Rank 0's report after `steps_done` steps: the window's figures, the
    /// validation loss, and a checkpoint when one is due.
    fn report(
        &self,
        context: &mut TrainContext,
        parallel: &mut DataParallel<Gpt>,
        steps_done: u64,
        window: ReportWindow,
    ) -> Result<(), TrainError> {
        let mut metrics = Metrics::new()
            .with("step", steps_done as f64)
            .with("loss", window.loss_sum / window.steps.max(1) as f64)
            .with("learning_rate", self.schedule().at(steps_done - 1))
            .with("tokens_per_second", window.tokens as f64 / window.busy.as_secs_f64())
            .with(
                "runtime_overhead",
                1.0 - window.compute.as_secs_f64() / window.busy.as_secs_f64(),
            );
        if let Some(norm) = window.gradient_norm {
            metrics.insert("gradient_norm", f64::from(norm));
        }
        if !self.validation.is_empty() {
            let model = parallel.model(context.group())?;
            let device = context.device();
            let loss = validation_loss(context.group(), &model, &self.validation, &device)?;
            metrics = metrics
                .with("validation_loss", loss)
                .with("validation_perplexity", loss.exp());
        }
        let due = match self.checkpoint_every {
            0 => steps_done == self.steps,
            every => steps_done.is_multiple_of(every) || steps_done == self.steps,
        };
        let checkpoint = match due {
            true => self.checkpoint(context, parallel, steps_done)?,
            false => None,
        };
        context.report(metrics, checkpoint)
    }

    /// On rank 0, a checkpoint of the whole model and optimizer (gathered
    /// from every rank under ZeRO); every rank must call it.
    fn checkpoint(
        &self,
        context: &mut TrainContext,
        parallel: &mut DataParallel<Gpt>,
        steps_done: u64,
    ) -> Result<Option<Checkpoint>, TrainError> {
        let Some((model, optimizer)) = parallel.gathered(context.group())? else {
            return Ok(None);
        };
        let checkpoint = context.new_checkpoint()?;
        checkpointing::save(
            &checkpoint,
            &model,
            &optimizer,
            &self.progress(steps_done),
            &self.tokenizer_json,
        )?;
        Ok(Some(checkpoint))
    }
}

impl TrainLoop for GptTraining {
    fn reports(&self) -> Option<u64> {
        Some(self.steps.div_ceil(self.report_every.max(1)))
    }

    /// The settings without the data: the rows are counted, and the
    /// tokenizer is left out (every checkpoint carries it).
    fn callback_config(&self) -> serde_json::Result<serde_json::Value> {
        let mut config = raylet_train::config_json(self)?;
        if let Some(fields) = config.as_object_mut() {
            fields.remove("tokenizer_json");
            fields.insert("train".into(), self.train.describe().into());
            fields.insert("validation".into(), format!("{} rows", self.validation.len()).into());
        }
        Ok(config)
    }

    fn run(mut self, context: &mut TrainContext) -> Result<(), TrainError> {
        self.check(context)?;
        let autodiff = context.device().autodiff();
        autodiff.seed(self.seed);
        let (mut parallel, steps_done) = self.starting_point(context, &autodiff)?;
        let local_rows = context.local_batch_size(self.global_batch_size) / self.accumulation_steps;
        let rows = std::mem::replace(&mut self.train, TrainingRows::InMemory(Vec::new()));
        let first_micro_batch = steps_done * self.accumulation_steps as u64;
        let mut feed = BatchFeed::new(rows, context, local_rows, first_micro_batch, self.seed)?;
        let schedule = self.schedule();
        let mut window = ReportWindow::default();
        for step in steps_done..self.steps {
            let started = Instant::now();
            let outcome = self.train_step(context, &mut parallel, &mut feed, step, schedule.at(step))?;
            window.steps += 1;
            window.loss_sum += outcome.loss;
            window.gradient_norm = outcome.gradient_norm;
            window.tokens += outcome.tokens;
            window.busy += started.elapsed();
            window.compute += outcome.compute;
            let done = step + 1;
            if done.is_multiple_of(self.report_every) || done == self.steps {
                self.report(context, &mut parallel, done, std::mem::take(&mut window))?;
            }
        }
        Ok(())
    }
}
