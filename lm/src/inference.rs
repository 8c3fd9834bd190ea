//! Batch inference over a set of files with a trained GPT: each file's
//! per-token loss and a greedy continuation of its first lines, computed by
//! a pool of actors (each loads the checkpoint once) and written as
//! Parquet, exactly once as every raylet-data sink: a rerun or a retried
//! block never writes a file's row twice.

use std::path::{Path, PathBuf};

use raylet_data::{
    ActorPoolStrategy, BatchModel, Dataset, FileBytes, FileSet, ModelError, WriteSummary, register_batch_model,
};
use serde::{Deserialize, Serialize};

use crate::LmError;
use crate::trained::TrainedGpt;

/// One scored file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileScore {
    pub path: String,
    /// Tokens of the file the model predicted.
    pub tokens: u64,
    /// Their mean next-token loss, in nats.
    pub loss: f64,
    /// The file's first lines, given to the model.
    pub prompt: String,
    /// What the model wrote after them.
    pub continuation: String,
}

/// How files are scored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScoringOptions {
    /// The prompt is the file's first this many lines.
    pub prompt_lines: usize,
    /// Tokens generated after the prompt.
    pub new_tokens: usize,
    /// Files per block, the unit written (and retried) at once.
    pub files_per_block: usize,
    /// The most scoring actors at once (the pool starts with one).
    pub max_actors: usize,
}

impl Default for ScoringOptions {
    fn default() -> Self {
        ScoringOptions {
            prompt_lines: 3,
            new_tokens: 32,
            files_per_block: 8,
            max_actors: 2,
        }
    }
}

/// The batch model that scores files with the GPT of a checkpoint (a path
/// every node can read).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ScoreFiles {
    checkpoint: PathBuf,
    prompt_lines: usize,
    new_tokens: usize,
}
register_batch_model!(ScoreFiles);

impl BatchModel for ScoreFiles {
    type In = FileBytes;
    type Out = FileScore;
    type State = TrainedGpt;

    fn load(&self) -> Result<TrainedGpt, ModelError> {
        Ok(TrainedGpt::load(&self.checkpoint, &raylet_train::cpu_device())?)
    }

    fn predict(&self, gpt: &mut TrainedGpt, files: Vec<FileBytes>) -> Result<Vec<FileScore>, ModelError> {
        files.into_iter().map(|file| self.score(gpt, file)).collect()
    }
}

impl ScoreFiles {
    fn score(&self, gpt: &TrainedGpt, file: FileBytes) -> Result<FileScore, ModelError> {
        let text = String::from_utf8(file.bytes).map_err(|e| format!("{} is not UTF-8: {e}", file.path))?;
        let loss = gpt.text_loss(&text)?;
        let prompt: String = text.split_inclusive('\n').take(self.prompt_lines).collect();
        let continuation = gpt.continue_text(&prompt, self.new_tokens)?;
        Ok(FileScore {
            path: file.path,
            tokens: loss.predicted,
            loss: loss.mean,
            prompt,
            continuation,
        })
    }
}

/// Scores every file of `files` with the GPT of the checkpoint directory
/// `checkpoint`, writing a [`FileScore`] row per file as Parquet into
/// `out_dir`; a rerun into the same directory skips the blocks written.
pub fn score_files(
    checkpoint: &Path,
    files: FileSet,
    out_dir: &Path,
    options: &ScoringOptions,
) -> Result<WriteSummary, LmError> {
    let checkpoint = std::path::absolute(checkpoint).map_err(LmError::io("resolving", checkpoint))?;
    let model = ScoreFiles {
        checkpoint,
        prompt_lines: options.prompt_lines,
        new_tokens: options.new_tokens,
    };
    let pool = ActorPoolStrategy::autoscaling(1, options.max_actors.max(1));
    Ok(Dataset::read_binary(files)
        .files_per_block(options.files_per_block)
        .map_batches_with(model, options.files_per_block, pool)
        .write_parquet(out_dir)?)
}
