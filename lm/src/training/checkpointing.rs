//! A GPT run's checkpoints: rank 0 writes the model, the AdamW state, the
//! tokenizer it was trained with and what it was (its config, its
//! vocabulary, the steps done); resuming first checks that the checkpoint
//! is of the same model and vocabulary, and says what differs when not.

use burn::optim::ModuleOptimizer;
use raylet_models::gpt::{Gpt, GptConfig};
use raylet_train::{Checkpoint, TrainError};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::prepare::TOKENIZER_FILE;

/// What a checkpoint was trained as, and how far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptProgress {
    /// Optimizer steps done.
    pub steps_done: u64,
    pub model: GptConfig,
    /// A hash of the tokenizer's JSON: another tokenizer means other token ids.
    pub tokenizer_hash: u64,
}

impl GptProgress {
    pub(crate) fn new(steps_done: u64, model: &GptConfig, tokenizer_json: &str) -> Self {
        GptProgress {
            steps_done,
            model: model.clone(),
            tokenizer_hash: xxh3_64(tokenizer_json.as_bytes()),
        }
    }
}

/// Writes a whole checkpoint of the run into `checkpoint`.
pub(super) fn save(
    checkpoint: &Checkpoint,
    model: &Gpt,
    optimizer: &ModuleOptimizer,
    progress: &GptProgress,
    tokenizer_json: &str,
) -> Result<(), TrainError> {
    checkpoint.save_model(model)?;
    checkpoint.save_optimizer(optimizer)?;
    checkpoint.save_file(TOKENIZER_FILE, tokenizer_json.as_bytes())?;
    checkpoint.save_state(progress)
}

/// The model, optimizer and steps done of `checkpoint`, once it is known to
/// be of the run's `expected` model and tokenizer.
pub(super) fn resume(
    checkpoint: &Checkpoint,
    expected: &GptProgress,
    model: Gpt,
    optimizer: ModuleOptimizer,
) -> Result<(Gpt, ModuleOptimizer, u64), TrainError> {
    let saved: GptProgress = checkpoint.load_state()?;
    let differences = differences(&saved, expected);
    if !differences.is_empty() {
        return Err(TrainError::checkpoint(
            checkpoint.path(),
            format!(
                "it is of another model than this run's: {}; train it into a run of its own name",
                differences.join("; ")
            ),
        ));
    }
    let model = checkpoint.load_model(model)?;
    let optimizer = checkpoint.load_optimizer(optimizer)?;
    Ok((model, optimizer, saved.steps_done))
}

/// Each way `saved` is not `expected`, as "what: there, here".
fn differences(saved: &GptProgress, expected: &GptProgress) -> Vec<String> {
    let mut differences = config_differences(&saved.model, &expected.model);
    if saved.tokenizer_hash != expected.tokenizer_hash {
        differences.push(format!(
            "the tokenizer (hash {:016x} in the checkpoint and {:016x} in this run) maps text to other token ids",
            saved.tokenizer_hash, expected.tokenizer_hash
        ));
    }
    differences
}

/// The fields of two model configs that differ, as "field: a in the
/// checkpoint, b in this run".
pub fn config_differences(saved: &GptConfig, expected: &GptConfig) -> Vec<String> {
    let fields = |config: &GptConfig| -> Vec<(&'static str, String)> {
        vec![
            ("vocab_size", config.vocab_size.to_string()),
            ("context_length", config.context_length.to_string()),
            ("d_model", config.d_model.to_string()),
            ("n_heads", config.n_heads.to_string()),
            ("n_layers", config.n_layers.to_string()),
            ("mlp_ratio", config.mlp_ratio.to_string()),
            ("dropout", config.dropout.to_string()),
        ]
    };
    fields(saved)
        .into_iter()
        .zip(fields(expected))
        .filter(|((_, there), (_, here))| there != here)
        .map(|((field, there), (_, here))| format!("{field} is {there} in the checkpoint and {here} in this run"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_fields_are_named_with_both_values() {
        let tiny = GptConfig::tiny(512);
        let wider = GptConfig {
            d_model: 256,
            vocab_size: 1024,
            ..tiny.clone()
        };
        assert_eq!(config_differences(&tiny, &tiny), Vec::<String>::new());
        assert_eq!(
            config_differences(&tiny, &wider),
            [
                "vocab_size is 512 in the checkpoint and 1024 in this run",
                "d_model is 128 in the checkpoint and 256 in this run"
            ]
        );
    }
}
