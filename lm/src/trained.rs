//! A GPT read back from a checkpoint of its training run: the model (its
//! shape from the checkpoint's state) and the tokenizer saved beside it,
//! ready to score text and continue it.

use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use raylet_models::gpt::{Gpt, GptConfig, token_batch};
use raylet_models::tokenizer::LmTokenizer;
use raylet_train::Checkpoint;

use crate::LmError;
use crate::prepare::TOKENIZER_FILE;
use crate::training::GptProgress;

/// Windows of text scored per forward pass.
const SCORING_BATCH_ROWS: usize = 16;

/// A trained GPT and its tokenizer, on a device without autodiff.
pub struct TrainedGpt {
    pub model: Gpt,
    pub tokenizer: LmTokenizer,
    /// Optimizer steps the model was trained for.
    pub steps: u64,
    device: Device,
}

/// How well a model predicts a text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TextLoss {
    /// Tokens predicted: every token of the text but the first of each
    /// window.
    pub predicted: u64,
    /// The mean next-token cross-entropy over them, in nats.
    pub mean: f64,
}

impl TrainedGpt {
    /// The GPT in the checkpoint directory `dir`, on `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self, LmError> {
        let unreadable = |message: String| LmError::Checkpoint {
            path: dir.to_owned(),
            message,
        };
        let checkpoint = Checkpoint::from_directory(dir);
        let progress: GptProgress = checkpoint
            .load_state()
            .map_err(|e| unreadable(format!("not a GPT run's checkpoint: {e}")))?;
        let model = Gpt::new(&progress.model, device).map_err(|e| unreadable(e.to_string()))?;
        let model = checkpoint.load_model(model).map_err(|e| unreadable(e.to_string()))?;
        let tokenizer = LmTokenizer::load(&dir.join(TOKENIZER_FILE))?;
        Ok(TrainedGpt {
            model: model.valid(),
            tokenizer,
            steps: progress.steps_done,
            device: device.clone(),
        })
    }

    /// Writes `model` (of shape `config`) and the `tokenizer` it reads with
    /// as a checkpoint directory `dir` that [`load`](Self::load) reads: a
    /// model trained elsewhere, or an untrained one to serve in a test.
    pub fn save(
        dir: &Path,
        model: &Gpt,
        config: &GptConfig,
        tokenizer: &LmTokenizer,
        steps: u64,
    ) -> Result<(), LmError> {
        let failed = |message: String| LmError::Checkpoint {
            path: dir.to_owned(),
            message,
        };
        std::fs::create_dir_all(dir).map_err(LmError::io("creating", dir))?;
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        tokenizer.save(&tokenizer_path)?;
        let tokenizer_json =
            std::fs::read_to_string(&tokenizer_path).map_err(LmError::io("reading", &tokenizer_path))?;
        let checkpoint = Checkpoint::from_directory(dir);
        checkpoint.save_model(model).map_err(|e| failed(e.to_string()))?;
        let progress = GptProgress::new(steps, config, &tokenizer_json);
        checkpoint.save_state(&progress).map_err(|e| failed(e.to_string()))
    }

    /// `prompt` continued by `new_tokens` greedily chosen tokens: the
    /// continuation alone, as text.
    pub fn continue_text(&self, prompt: &str, new_tokens: usize) -> Result<String, LmError> {
        let mut ids = self.tokenizer.encode(prompt)?;
        if ids.is_empty() {
            ids.push(self.tokenizer.eot_id());
        }
        let generated = self.model.generate_greedy(&ids, new_tokens, &self.device);
        Ok(self.tokenizer.decode(&generated[ids.len()..])?)
    }

    /// The model's loss on `text` followed by end-of-text, read in windows
    /// of `context_length + 1` tokens that overlap by one (so every token
    /// after the first is predicted once).
    pub fn text_loss(&self, text: &str) -> Result<TextLoss, LmError> {
        let mut ids = self.tokenizer.encode(text)?;
        ids.push(self.tokenizer.eot_id());
        let window = self.model.context_length() + 1;
        let windows: Vec<&[u32]> = (0..ids.len().saturating_sub(1))
            .step_by(window - 1)
            .map(|start| &ids[start..(start + window).min(ids.len())])
            .collect();
        let (whole, tail): (Vec<&[u32]>, Vec<&[u32]>) = windows.into_iter().partition(|w| w.len() == window);
        let mut sum = 0.0;
        let mut predicted = 0;
        for batch in whole.chunks(SCORING_BATCH_ROWS).chain(tail.chunks(1)) {
            let tokens = batch.iter().map(|w| w.len() as u64 - 1).sum::<u64>();
            let loss = self.model.loss(token_batch(batch, &self.device)).into_scalar::<f32>();
            sum += f64::from(loss) * tokens as f64;
            predicted += tokens;
        }
        Ok(TextLoss {
            predicted,
            mean: sum / predicted.max(1) as f64,
        })
    }
}
