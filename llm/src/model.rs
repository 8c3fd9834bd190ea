//! The seam between the engine and a model: [`LanguageModel`] feeds a
//! batch of sequences their next tokens (a prompt for a sequence that
//! starts, one token for one that decodes) in one step;
//! [`Tokenizer`] turns text into token ids and ids into bytes.
//! [`GptModel`] is a GPT of raylet-models read from a checkpoint of its
//! training run (raylet-lm), on the device the process uses.

use std::path::Path;
use std::sync::Arc;

use burn::prelude::*;
use raylet_lm::TrainedGpt;
use raylet_models::gpt::{Gpt, KvCache};
use raylet_models::tokenizer::LmTokenizer;

use crate::LlmError;

/// A model the engine decodes with.
pub trait LanguageModel: Send + 'static {
    /// What one sequence keeps between steps.
    type Cache: Send;

    /// The most tokens a sequence, prompt and output, can have.
    fn context_length(&self) -> usize;

    /// Tokens the logits cover.
    fn vocab_size(&self) -> usize;

    /// Bytes the cache of one token takes.
    fn cache_bytes_per_token(&self) -> usize;

    /// An empty cache for `capacity` tokens (a prompt and those decoded
    /// after it).
    fn new_cache(&self, capacity: usize) -> Self::Cache;

    /// Feeds each sequence its tokens after those its cache holds (its
    /// prompt when it starts, else the token it made last); the logits of
    /// the token after each sequence's last, `vocab_size` per sequence, in
    /// order.
    fn step(&self, batch: &mut [(&[u32], &mut Self::Cache)]) -> Vec<f32>;
}

/// Text to token ids and token ids to bytes.
pub trait Tokenizer: Send + Sync + 'static {
    /// The token ids of `text` ([`LlmError::Tokenize`] when it has none).
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError>;

    /// The bytes token `id` stands for (none for special tokens).
    fn token_bytes(&self, id: u32) -> &[u8];

    /// The token that ends a text.
    fn end_of_text(&self) -> u32;
}

/// A trained GPT on the process's device.
pub struct GptModel {
    model: Gpt,
    device: Device,
    cache_bytes_per_token: usize,
    /// The threads a step is split among: [`cpu_threads`] on the CPU, one
    /// on a GPU.
    cores: usize,
}

/// The byte-level BPE tokenizer a GPT was trained with.
pub struct GptTokenizer {
    tokenizer: LmTokenizer,
    bytes: Vec<Vec<u8>>,
}

impl GptModel {
    /// The GPT and tokenizer of the checkpoint directory `dir`, on
    /// [`serving_device`].
    pub fn load(dir: &Path) -> Result<(Self, Arc<GptTokenizer>), LlmError> {
        let device = serving_device();
        let trained = TrainedGpt::load(dir, &device)?;
        let tokenizer = Arc::new(GptTokenizer::new(trained.tokenizer));
        Ok((GptModel::new(trained.model, device), tokenizer))
    }

    /// `model`, on `device`.
    pub fn new(model: Gpt, device: Device) -> Self {
        let cores = if device == raylet_train::cpu_device() {
            cpu_threads()
        } else {
            1
        };
        GptModel {
            cache_bytes_per_token: model.kv_cache_bytes_per_token(),
            model,
            device,
            cores,
        }
    }
}

/// The device this process serves on: its GPU when raylet-llm is built
/// with `cuda` and the replica was given a GPU (`num_gpus`; the first one
/// `CUDA_VISIBLE_DEVICES` shows it), else the CPU.
pub fn serving_device() -> Device {
    #[cfg(feature = "cuda")]
    if !raylet::gpu_ids().is_empty() {
        return Device::cuda(0);
    }
    raylet_train::cpu_device()
}

impl LanguageModel for GptModel {
    type Cache = KvCache;

    fn context_length(&self) -> usize {
        self.model.context_length()
    }

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn cache_bytes_per_token(&self) -> usize {
        self.cache_bytes_per_token
    }

    fn new_cache(&self, capacity: usize) -> KvCache {
        self.model.new_cache(capacity, &self.device)
    }

    /// On the CPU, a step of at least [`MIN_COST_PER_THREAD`] per core is
    /// cut into runs of neighbouring sequences of about equal cost, each
    /// run on a core of its own: burn's CPU kernels run a decoding step's
    /// small products on one core.
    fn step(&self, batch: &mut [(&[u32], &mut KvCache)]) -> Vec<f32> {
        let costs: Vec<usize> = batch.iter().map(|(tokens, _)| step_cost(tokens)).collect();
        let parts = self.cores.min(costs.iter().sum::<usize>() / MIN_COST_PER_THREAD).max(1);
        let runs = balanced_runs(&costs, parts);
        if runs.len() == 1 {
            return values(self.model.step(batch, &self.device).into_data());
        }
        std::thread::scope(|scope| {
            let mut rest = &mut batch[..];
            let mut stepping = Vec::with_capacity(runs.len());
            for run in runs {
                let (part, after) = rest.split_at_mut(run);
                rest = after;
                stepping.push(scope.spawn(|| values(self.model.step(part, &self.device).into_data())));
            }
            stepping
                .into_iter()
                .flat_map(|part| part.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        })
    }
}

/// What a sequence adds to a step, in tokens: those it reads, and one more
/// for its own attention and logits.
fn step_cost(tokens: &[u32]) -> usize {
    tokens.len() + 1
}

/// The least cost worth a core of its own: four decoding sequences.
const MIN_COST_PER_THREAD: usize = 8;

/// Cuts `costs` into at most `parts` runs of neighbours whose costs are as
/// even as such a cut allows: each cut falls before the item whose middle
/// passes the next equal share. Returns the runs' lengths.
fn balanced_runs(costs: &[usize], parts: usize) -> Vec<usize> {
    let total: usize = costs.iter().sum();
    let mut runs = Vec::with_capacity(parts);
    let (mut run, mut before) = (0, 0);
    for &cost in costs {
        let share = total * (runs.len() + 1) / parts;
        if run > 0 && runs.len() + 1 < parts && 2 * before + cost > 2 * share {
            runs.push(run);
            run = 0;
        }
        run += 1;
        before += cost;
    }
    runs.push(run);
    runs
}

/// The threads a decoding step may use on the CPU: `RAYON_NUM_THREADS`
/// when it is set (the bound burn's CPU kernels take too; set it when
/// several replicas share a node), else every core of the machine.
fn cpu_threads() -> usize {
    let configured = std::env::var("RAYON_NUM_THREADS").ok().and_then(|n| n.parse().ok());
    configured
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

fn values(data: burn::tensor::TensorData) -> Vec<f32> {
    data.try_to_vec::<f32>().expect("a float tensor")
}

impl GptTokenizer {
    pub fn new(tokenizer: LmTokenizer) -> Self {
        let bytes = tokenizer.token_bytes();
        GptTokenizer { tokenizer, bytes }
    }
}

impl Tokenizer for GptTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        self.tokenizer.encode(text).map_err(|e| LlmError::Tokenize(Box::new(e)))
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    fn end_of_text(&self) -> u32 {
        self.tokenizer.eot_id()
    }
}

#[cfg(test)]
mod tests {
    use super::balanced_runs;

    #[test]
    fn a_step_is_cut_into_runs_of_about_equal_cost() {
        assert_eq!(balanced_runs(&[2; 16], 2), [8, 8]);
        assert_eq!(balanced_runs(&[2; 15], 2), [8, 7]);
        assert_eq!(balanced_runs(&[2, 2, 2, 2, 2, 2, 30], 2), [6, 1]);
        assert_eq!(balanced_runs(&[30, 2, 2, 2, 2, 2, 2, 2], 2), [1, 7]);
        assert_eq!(balanced_runs(&[2, 2, 2, 2, 2, 2], 3), [2, 2, 2]);
    }

    #[test]
    fn a_step_has_no_empty_run() {
        assert_eq!(balanced_runs(&[50, 2], 2), [1, 1]);
        assert_eq!(balanced_runs(&[2], 2), [1]);
        assert_eq!(balanced_runs(&[2, 2, 2], 1), [3]);
    }
}
