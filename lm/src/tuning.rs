//! Hyperparameter search for the GPT with raylet-tune: [`tune_gpt`] is a
//! trainable whose every trial is a raylet-train run of [`GptTraining`]
//! on rows prepared by [`prepare_corpus`](crate::prepare_corpus), forwarding
//! rank 0's reports (`validation_loss` among them) to Tune, so that a
//! scheduler such as ASHA stops the trials that fall behind.
//!
//! A trial's config:
//! - `data_dir`: the preparation's output directory (its `train` and
//!   `validation` rows and `tokenizer.json`), a path every node reads;
//! - `lr`, `warmup_steps` and `d_model` (the width; the other sizes are
//!   `tiny`'s, the context length is the rows');
//! - `steps`, `batch_size` and `report_every`;
//! - optionally `validation_rows` (64), `workers` (1) and `seed` (0).
//!
//! Give the trials no CPU of their own (`TrialResources { num_cpus: 0.0,
//! .. }`): their Train workers hold them.

use std::path::{Path, PathBuf};

use raylet_models::gpt::GptConfig;
use raylet_models::tokenizer::LmTokenizer;
use raylet_train::{ScalingConfig, Trainer};
use raylet_tune::{TrainableResult, TrialConfig, TrialContext, register_trainable};

use crate::prepare::{TOKENIZER_FILE, TRAIN_DIR, VALIDATION_DIR};
use crate::{GptTraining, LmError, OptimizerSettings, TokenRow, TrainingRows, token_rows};

/// Validation rows a trial is scored on unless its config says otherwise.
const DEFAULT_VALIDATION_ROWS: usize = 64;

/// Runs one trial: a Train run of the GPT its config describes.
pub fn tune_gpt(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let data_dir: PathBuf = config.get("data_dir")?;
    let validation_rows: usize = config.get("validation_rows").unwrap_or(DEFAULT_VALIDATION_ROWS);
    let (tokenizer_json, vocab_size) = tokenizer(&data_dir)?;
    let train = rows(&data_dir.join(TRAIN_DIR))?;
    let validation: Vec<TokenRow> = rows(&data_dir.join(VALIDATION_DIR))?
        .into_iter()
        .take(validation_rows)
        .collect();
    let context_length = train
        .first()
        .ok_or(LmError::NoTokens(data_dir.join(TRAIN_DIR)))?
        .ids
        .len()
        - 1;
    let model = GptConfig {
        d_model: config.get("d_model")?,
        context_length,
        ..GptConfig::tiny(vocab_size)
    };
    let training = GptTraining {
        validation,
        steps: config.get("steps")?,
        global_batch_size: config.get("batch_size")?,
        report_every: config.get("report_every")?,
        seed: config.get("seed").unwrap_or(0),
        optimizer: OptimizerSettings {
            learning_rate: config.get("lr")?,
            warmup_steps: config.get("warmup_steps")?,
            ..OptimizerSettings::default()
        },
        ..GptTraining::new(model, tokenizer_json, TrainingRows::InMemory(train))
    };
    let trainer = Trainer::new(training).scaling(ScalingConfig {
        num_workers: config.get("workers").unwrap_or(1),
        ..ScalingConfig::default()
    });
    ctx.fit_train_run(trainer)?;
    Ok(())
}
register_trainable!(tune_gpt);

/// The preparation's tokenizer: its JSON and its vocabulary size.
fn tokenizer(data_dir: &Path) -> Result<(String, usize), LmError> {
    let path = data_dir.join(TOKENIZER_FILE);
    let vocab_size = LmTokenizer::load(&path)?.vocab_size();
    let json = std::fs::read_to_string(&path).map_err(LmError::io("reading", &path))?;
    Ok((json, vocab_size))
}

fn rows(dir: &Path) -> Result<Vec<TokenRow>, LmError> {
    Ok(token_rows(dir).show_progress(false).take_all()?)
}
