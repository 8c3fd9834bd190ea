//! Decoding with a key/value cache, as a server decodes: a prompt is read
//! once ([`Gpt::prefill`]), which keeps every block's keys and values in the
//! sequence's [`KvCache`]; each new token then costs one position's work
//! per block ([`Gpt::decode`]), for a batch of sequences of different
//! lengths at once. The projections and the MLP run on the whole batch;
//! attention runs per sequence, over that sequence's own cache, so no
//! sequence waits for or pads to another's length.
//!
//! A cache is allocated once for all the tokens its sequence may hold (its
//! capacity): each step writes one position's keys and values in place,
//! and attention multiplies against the filled part as a strided view, so
//! no step copies the cache.

use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::model::CausalSelfAttention;
use super::{Gpt, token_batch};

/// The keys and values one sequence has computed so far, per block.
pub struct KvCache {
    /// Per block: keys and values, each `[1, n_heads, capacity, head_dim]`,
    /// filled up to `len`.
    blocks: Vec<(Tensor<4>, Tensor<4>)>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// Tokens the cache holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no token (never, once a prefill built it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A cache of `capacity` tokens holding each block's keys and values
    /// (`[1, n_heads, len, head_dim]` each) of a prompt.
    fn new(prompt: Vec<(Tensor<4>, Tensor<4>)>, capacity: usize) -> Self {
        let len = prompt.first().map_or(0, |(keys, _)| keys.dims()[2]);
        let blocks = prompt
            .into_iter()
            .map(|(keys, values)| (with_capacity(keys, capacity), with_capacity(values, capacity)))
            .collect();
        KvCache { blocks, len, capacity }
    }

    /// Writes one position's keys and values (`[1, n_heads, 1, head_dim]`)
    /// of block `block` at position `len`, in place (the cache holds the
    /// only handle to its tensors between steps); returns views of that
    /// block's keys and values up to it.
    fn append(&mut self, block: usize, keys: Tensor<4>, values: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let filled = self.len + 1;
        let (cached_keys, cached_values) = &mut self.blocks[block];
        write_position(cached_keys, self.len, keys);
        write_position(cached_values, self.len, values);
        (
            cached_keys.clone().narrow(2, 0, filled),
            cached_values.clone().narrow(2, 0, filled),
        )
    }
}

/// `prompt` (`[1, n_heads, len, head_dim]`) at the start of a zeroed tensor
/// of `capacity` positions.
fn with_capacity(prompt: Tensor<4>, capacity: usize) -> Tensor<4> {
    let [batch, heads, len, head_dim] = prompt.dims();
    let buffer = Tensor::zeros([batch, heads, capacity, head_dim], &prompt.device());
    buffer.slice_assign([0..batch, 0..heads, 0..len, 0..head_dim], prompt)
}

/// Writes `value` (`[1, n_heads, 1, head_dim]`) at `position` of `cache`.
fn write_position(cache: &mut Tensor<4>, position: usize, value: Tensor<4>) {
    let [batch, heads, _, head_dim] = value.dims();
    let owned = std::mem::replace(cache, Tensor::empty([0, 0, 0, 0], &value.device()));
    *cache = owned.slice_assign([0..batch, 0..heads, position..position + 1, 0..head_dim], value);
}

impl Gpt {
    /// Bytes one token's cache takes: a key and a value of `d_model` f32s
    /// per block.
    pub fn kv_cache_bytes_per_token(&self) -> usize {
        let d_model = self.position_embedding.shape().dims::<2>()[1];
        2 * self.blocks.len() * d_model * std::mem::size_of::<f32>()
    }

    /// Reads `prompt` and returns the next-token logits after it
    /// (`[vocab_size]`) and its cache, which holds up to `capacity` tokens
    /// (the prompt and those decoded after it).
    ///
    /// # Panics
    /// If `prompt` is empty or longer than `capacity`, or `capacity` is
    /// beyond the context length.
    pub fn prefill(&self, prompt: &[u32], capacity: usize, device: &Device) -> (Tensor<1>, KvCache) {
        let seq = prompt.len();
        let context_length = self.context_length();
        assert!(
            seq >= 1 && seq <= capacity && capacity <= context_length,
            "a prompt of {seq} tokens in a cache of {capacity}: it must have 1 to {capacity} tokens, \
             and the cache at most the context's {context_length}"
        );
        let positions = self.position_embedding.val().narrow(0, 0, seq).unsqueeze::<3>();
        let mut residual = self.token_embedding.forward(token_batch(&[prompt], device)) + positions;
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let (attended, keys, values) = block.attention.prefill(block.attention_norm.forward(residual.clone()));
            residual = residual + attended;
            residual = residual.clone() + block.mlp.forward(block.mlp_norm.forward(residual));
            blocks.push((keys, values));
        }
        let last = residual.narrow(1, seq - 1, 1);
        let logits = self.logits(last).reshape([self.vocab_size()]);
        (logits, KvCache::new(blocks, capacity))
    }

    /// One decoding step for a batch: each sequence reads its next token
    /// at the position after its cache, which grows by that token. Returns
    /// the next-token logits of each, `[batch, vocab_size]`, in order.
    ///
    /// # Panics
    /// If the batch is empty or a cache is full.
    pub fn decode(&self, batch: &mut [(u32, &mut KvCache)], device: &Device) -> Tensor<2> {
        let size = batch.len();
        assert!(size > 0, "a decoding step needs at least one sequence");
        if let Some((_, full)) = batch.iter().find(|(_, cache)| cache.len >= cache.capacity) {
            panic!("a cache of {} tokens is full", full.capacity);
        }
        let tokens: Vec<i64> = batch.iter().map(|(token, _)| i64::from(*token)).collect();
        let positions: Vec<i64> = batch.iter().map(|(_, cache)| cache.len as i64).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(tokens, [size, 1]), device);
        let positions = Tensor::<1, Int>::from_data(TensorData::new(positions, [size]), device);
        let d_model = self.position_embedding.shape().dims::<2>()[1];
        let placed = self
            .position_embedding
            .val()
            .select(0, positions)
            .reshape([size, 1, d_model]);
        let mut residual = self.token_embedding.forward(tokens) + placed;
        for (index, block) in self.blocks.iter().enumerate() {
            let normed = block.attention_norm.forward(residual.clone());
            residual = residual + block.attention.decode(normed, batch, index);
            residual = residual.clone() + block.mlp.forward(block.mlp_norm.forward(residual));
        }
        for (_, cache) in batch.iter_mut() {
            cache.len += 1;
        }
        self.logits(residual).reshape([size, self.vocab_size()])
    }

    /// The final LayerNorm and the tied output head: `[batch, 1, d_model]`
    /// to `[batch, vocab_size]`.
    fn logits(&self, states: Tensor<3>) -> Tensor<2> {
        let [batch, _, d_model] = states.dims();
        let states = self.final_norm.forward(states).reshape([batch, d_model]);
        states.matmul(self.token_embedding.weight.val().transpose())
    }
}

impl CausalSelfAttention {
    /// Attention over a whole prompt (`[1, seq, d_model]`), with the keys
    /// and values it computed, split into heads.
    fn prefill(&self, input: Tensor<3>) -> (Tensor<3>, Tensor<4>, Tensor<4>) {
        let [batch, seq, d_model] = input.dims();
        let [query, keys, values] = self.split_query_key_value(input);
        let causal = AttentionModuleOptions {
            is_causal: true,
            ..Default::default()
        };
        let heads = attention(query, keys.clone(), values.clone(), None, None, causal);
        let merged = heads.swap_dims(1, 2).reshape([batch, seq, d_model]);
        (self.output.forward(merged), keys, values)
    }

    /// Attention of one new position per sequence (`[batch, 1, d_model]`)
    /// over that sequence's cached keys and values of block `block`, which
    /// it extends: softmax(q·Kᵀ/√head_dim)·V, the products taking the
    /// cache's filled part as it lies.
    fn decode(&self, input: Tensor<3>, batch: &mut [(u32, &mut KvCache)], block: usize) -> Tensor<3> {
        let [size, _, d_model] = input.dims();
        let [query, keys, values] = self.split_query_key_value(input);
        let row = |tensor: &Tensor<4>, index: usize| tensor.clone().narrow(0, index, 1);
        let scale = ((d_model / self.n_heads) as f64).sqrt().recip();
        let heads: Vec<Tensor<4>> = batch
            .iter_mut()
            .enumerate()
            .map(|(index, (_, cache))| {
                let (all_keys, all_values) = cache.append(block, row(&keys, index), row(&values, index));
                let scores = row(&query, index).matmul(all_keys.swap_dims(2, 3)).mul_scalar(scale);
                softmax(scores, 3).matmul(all_values)
            })
            .collect();
        let merged = Tensor::cat(heads, 0).swap_dims(1, 2).reshape([size, 1, d_model]);
        self.output.forward(merged)
    }

    /// The query, keys and values of `input`, each `[batch, n_heads, seq,
    /// head_dim]`.
    fn split_query_key_value(&self, input: Tensor<3>) -> [Tensor<4>; 3] {
        let [query, keys, values]: [Tensor<3>; 3] = self
            .query_key_value
            .forward(input)
            .chunk(3, 2)
            .try_into()
            .expect("the projection has three d_model-wide parts");
        [
            self.split_heads(query),
            self.split_heads(keys),
            self.split_heads(values),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::GptConfig;

    fn micro_model(device: &Device) -> Gpt {
        let config = GptConfig {
            vocab_size: 50,
            context_length: 24,
            d_model: 32,
            n_heads: 4,
            n_layers: 2,
            mlp_ratio: 4,
            dropout: 0.0,
        };
        device.seed(7);
        Gpt::new(&config, device).unwrap()
    }

    /// The logits at the last position of a full forward pass over
    /// `tokens`.
    fn uncached(model: &Gpt, tokens: &[u32], device: &Device) -> Vec<f32> {
        let last = tokens.len() - 1;
        let logits = model.forward(token_batch(&[tokens], device));
        let logits = logits.slice([0..1, last..last + 1]).reshape([model.vocab_size()]);
        logits.into_data().try_to_vec::<f32>().unwrap()
    }

    fn max_difference(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn a_prefill_gives_the_last_logits_of_a_forward_pass() {
        let device = Device::flex();
        let model = micro_model(&device);
        let prompt = [4, 8, 15, 16, 23, 42];

        let (logits, cache) = model.prefill(&prompt, 10, &device);

        assert_eq!((cache.len(), cache.capacity()), (6, 10));
        let logits: Vec<f32> = logits.into_data().try_to_vec::<f32>().unwrap();
        assert!(max_difference(&logits, &uncached(&model, &prompt, &device)) < 1e-4);
    }

    #[test]
    fn a_batch_of_sequences_of_different_lengths_decodes_as_each_would_alone() {
        let device = Device::flex();
        let model = micro_model(&device);
        let mut sequences: Vec<Vec<u32>> = vec![vec![1], vec![2, 3, 5, 7, 11, 13], vec![9, 9, 9, 1]];
        let mut caches: Vec<KvCache> = sequences
            .iter()
            .map(|s| model.prefill(s, s.len() + 5, &device).1)
            .collect();

        for step in 0..5u32 {
            let next: Vec<u32> = (0..3).map(|i| (step * 7 + i * 3) % 50).collect();
            let mut batch: Vec<(u32, &mut KvCache)> = next.iter().copied().zip(caches.iter_mut()).collect();
            let logits = model.decode(&mut batch, &device);
            assert_eq!(logits.dims(), [3, 50]);
            let logits: Vec<f32> = logits.into_data().try_to_vec::<f32>().unwrap();
            for (index, sequence) in sequences.iter_mut().enumerate() {
                sequence.push(next[index]);
                let cached = &logits[index * 50..(index + 1) * 50];
                let difference = max_difference(cached, &uncached(&model, sequence, &device));
                assert!(
                    difference < 1e-4,
                    "sequence {index} at step {step}: off by {difference}"
                );
                assert_eq!(caches[index].len(), sequence.len());
            }
        }
    }

    #[test]
    #[should_panic(expected = "a cache of 12 tokens is full")]
    fn a_full_cache_cannot_decode() {
        let device = Device::flex();
        let model = micro_model(&device);
        let (_, mut cache) = model.prefill(&[1; 11], 12, &device);
        model.decode(&mut [(2, &mut cache)], &device);
        model.decode(&mut [(3, &mut cache)], &device);
    }

    #[test]
    #[should_panic(expected = "the cache at most the context's 24")]
    fn a_cache_beyond_the_context_is_refused() {
        let device = Device::flex();
        micro_model(&device).prefill(&[1; 4], 25, &device);
    }

    #[test]
    fn a_token_of_cache_holds_a_key_and_a_value_per_block() {
        let tiny = Gpt::new(&GptConfig::tiny(300), &Device::flex()).unwrap();
        assert_eq!(tiny.kv_cache_bytes_per_token(), 2 * 2 * 128 * 4);
    }
}
