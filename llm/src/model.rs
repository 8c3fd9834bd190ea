//! The seam between the engine and a model: [`LanguageModel`] reads a
//! prompt into a cache and decodes a batch of sequences one token each;
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

    /// Reads a prompt into a cache of `capacity` tokens (the prompt and
    /// those decoded after it): the logits of the token after it, and the
    /// cache.
    fn prefill(&self, prompt: &[u32], capacity: usize) -> (Vec<f32>, Self::Cache);

    /// Feeds each sequence its next token; the logits of the token after
    /// each, `vocab_size` per sequence, in order.
    fn decode(&self, batch: &mut [(u32, &mut Self::Cache)]) -> Vec<f32>;
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
    /// The threads a decoding step is split among: [`cpu_threads`] on the
    /// CPU, one on a GPU.
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

    fn prefill(&self, prompt: &[u32], capacity: usize) -> (Vec<f32>, KvCache) {
        let (logits, cache) = self.model.prefill(prompt, capacity, &self.device);
        (values(logits.into_data()), cache)
    }

    /// On the CPU, a batch of at least [`MIN_SEQUENCES_PER_THREAD`] per
    /// core is split among the cores, each decoding its part: burn's CPU
    /// kernels run a decoding step's small products on one core.
    fn decode(&self, batch: &mut [(u32, &mut KvCache)]) -> Vec<f32> {
        let parts = self.cores.min(batch.len() / MIN_SEQUENCES_PER_THREAD).max(1);
        if parts == 1 {
            return values(self.model.decode(batch, &self.device).into_data());
        }
        let per_part = batch.len().div_ceil(parts);
        std::thread::scope(|scope| {
            let decoding: Vec<_> = batch
                .chunks_mut(per_part)
                .map(|part| scope.spawn(|| values(self.model.decode(part, &self.device).into_data())))
                .collect();
            decoding
                .into_iter()
                .flat_map(|part| part.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        })
    }
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

/// The fewest sequences a core decodes when a batch is split among cores.
const MIN_SEQUENCES_PER_THREAD: usize = 4;

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
