//! Decoding with a key/value cache, as a server decodes: each sequence
//! keeps every block's keys and values in its [`KvCache`], and a step
//! ([`Gpt::step`]) feeds a batch of sequences their next tokens at once: a
//! whole prompt (or a part of one) for a sequence that is starting, one
//! token for a sequence that is decoding. The step lays every sequence's
//! tokens end to end, so the projections and the MLP run once over all of
//! them (a prompt read in the same step as the decoding sequences costs
//! one pass over the weights, not two); attention runs per sequence, over
//! that sequence's own cache, so no sequence waits for or pads to
//! another's length.
//!
//! A cache is allocated once for all the tokens its sequence may hold (its
//! capacity): each step writes its positions' keys and values in place,
//! and attention reads the filled part as a strided view, so no step copies
//! the cache.

use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::Gpt;
use super::model::CausalSelfAttention;

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

    /// Whether it holds no token yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes `keys` and `values` (`[1, n_heads, n, head_dim]`) of block
    /// `block` at positions `len..len + n`, in place (the cache holds the
    /// only handle to its tensors between steps); returns views of that
    /// block's keys and values up to them.
    fn append(&mut self, block: usize, keys: Tensor<4>, values: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let filled = self.len + keys.dims()[2];
        let (cached_keys, cached_values) = &mut self.blocks[block];
        write_positions(cached_keys, self.len, keys);
        write_positions(cached_values, self.len, values);
        (
            cached_keys.clone().narrow(2, 0, filled),
            cached_values.clone().narrow(2, 0, filled),
        )
    }
}

/// Writes `value` (`[1, n_heads, n, head_dim]`) at positions `start..start
/// + n` of `cache`.
fn write_positions(cache: &mut Tensor<4>, start: usize, value: Tensor<4>) {
    let [batch, heads, n, head_dim] = value.dims();
    let owned = std::mem::replace(cache, Tensor::empty([0, 0, 0, 0], &value.device()));
    *cache = owned.slice_assign([0..batch, 0..heads, start..start + n, 0..head_dim], value);
}

impl Gpt {
    /// Bytes one token's cache takes: a key and a value of `d_model` f32s
    /// per block.
    pub fn kv_cache_bytes_per_token(&self) -> usize {
        2 * self.blocks.len() * self.d_model() * std::mem::size_of::<f32>()
    }

    /// An empty cache for `capacity` tokens (a prompt and those decoded
    /// after it).
    ///
    /// # Panics
    /// If `capacity` is beyond the context length.
    pub fn new_cache(&self, capacity: usize, device: &Device) -> KvCache {
        let context_length = self.context_length();
        assert!(
            capacity <= context_length,
            "a cache of {capacity} tokens: a sequence holds at most the context's {context_length}"
        );
        let blocks = self
            .blocks
            .iter()
            .map(|block| {
                let heads = block.attention.n_heads;
                let shape = [1, heads, capacity, self.d_model() / heads];
                (Tensor::zeros(shape, device), Tensor::zeros(shape, device))
            })
            .collect();
        KvCache {
            blocks,
            len: 0,
            capacity,
        }
    }

    /// Reads `prompt` into a new cache of `capacity` tokens: the next-token
    /// logits after it (`[vocab_size]`) and the cache.
    ///
    /// # Panics
    /// If `prompt` is empty or longer than `capacity`, or `capacity` is
    /// beyond the context length.
    pub fn prefill(&self, prompt: &[u32], capacity: usize, device: &Device) -> (Tensor<1>, KvCache) {
        let mut cache = self.new_cache(capacity, device);
        let logits = self.step(&mut [(prompt, &mut cache)], device);
        (logits.reshape([self.vocab_size()]), cache)
    }

    /// One step for a batch of sequences, each given the tokens it reads
    /// now and its cache: each sequence reads its tokens at the
    /// positions after its cache, which grows by them. Returns the
    /// next-token logits after each sequence's last token, `[batch,
    /// vocab_size]`, in order.
    ///
    /// # Panics
    /// If the batch is empty, a sequence has no token, or a cache has no
    /// room for its tokens.
    pub fn step(&self, batch: &mut [(&[u32], &mut KvCache)], device: &Device) -> Tensor<2> {
        let size = batch.len();
        assert!(size > 0, "a step needs at least one sequence");
        for (tokens, cache) in batch.iter() {
            assert!(!tokens.is_empty(), "a sequence in a step reads at least one token");
            assert!(
                cache.len + tokens.len() <= cache.capacity,
                "a cache of {} tokens is full: it holds {} and would read {} more",
                cache.capacity,
                cache.len,
                tokens.len()
            );
        }
        let total: usize = batch.iter().map(|(tokens, _)| tokens.len()).sum();
        let ids: Vec<i64> = batch
            .iter()
            .flat_map(|(tokens, _)| tokens.iter().map(|&token| i64::from(token)))
            .collect();
        let positions: Vec<i64> = batch
            .iter()
            .flat_map(|(tokens, cache)| (cache.len..cache.len + tokens.len()).map(|at| at as i64))
            .collect();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, total]), device);
        let positions = Tensor::<1, Int>::from_data(TensorData::new(positions, [total]), device);
        let placed = self
            .position_embedding
            .val()
            .select(0, positions)
            .reshape([1, total, self.d_model()]);
        let mut residual = self.token_embedding.forward(ids) + placed;
        for (index, block) in self.blocks.iter().enumerate() {
            let normed = block.attention_norm.forward(residual.clone());
            residual = residual + block.attention.step(normed, batch, index);
            residual = residual.clone() + block.mlp.forward(block.mlp_norm.forward(residual));
        }
        let mut ends = Vec::with_capacity(size);
        let mut end = 0;
        for (tokens, cache) in batch.iter_mut() {
            end += tokens.len();
            ends.push(end as i64 - 1);
            cache.len += tokens.len();
        }
        let ends = Tensor::<1, Int>::from_data(TensorData::new(ends, [size]), device);
        let last = residual.select(1, ends).reshape([size, 1, self.d_model()]);
        self.logits(last).reshape([size, self.vocab_size()])
    }

    fn d_model(&self) -> usize {
        self.position_embedding.shape().dims::<2>()[1]
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
    /// Attention of a step's tokens (`[1, total, d_model]`, the sequences'
    /// tokens end to end) over each sequence's cached keys and values of
    /// block `block`, which they extend. A sequence reading one token
    /// multiplies against its cache as it lies; one reading several
    /// attends causally (each token to the cache and the tokens before it).
    fn step(&self, input: Tensor<3>, batch: &mut [(&[u32], &mut KvCache)], block: usize) -> Tensor<3> {
        let [_, total, d_model] = input.dims();
        let [query, keys, values] = self.split_query_key_value(input);
        let scale = ((d_model / self.n_heads) as f64).sqrt().recip();
        let mut start = 0;
        let heads: Vec<Tensor<4>> = batch
            .iter_mut()
            .map(|(tokens, cache)| {
                let part = |tensor: &Tensor<4>| tensor.clone().narrow(2, start, tokens.len());
                let (all_keys, all_values) = cache.append(block, part(&keys), part(&values));
                let query = part(&query);
                start += tokens.len();
                if tokens.len() == 1 {
                    let scores = query.matmul(all_keys.swap_dims(2, 3)).mul_scalar(scale);
                    return softmax(scores, 3).matmul(all_values);
                }
                let causal = AttentionModuleOptions {
                    is_causal: true,
                    ..Default::default()
                };
                attention(query, all_keys, all_values, None, None, causal)
            })
            .collect();
        let merged = Tensor::cat(heads, 2).swap_dims(1, 2).reshape([1, total, d_model]);
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
    use crate::gpt::{GptConfig, token_batch};

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
            let mut batch: Vec<(&[u32], &mut KvCache)> = next.chunks(1).zip(caches.iter_mut()).collect();
            let logits = model.step(&mut batch, &device);
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
    fn a_prompt_read_in_parts_beside_a_decoding_sequence_gives_what_a_forward_pass_gives() {
        let device = Device::flex();
        let model = micro_model(&device);
        let prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5];
        let decoding = [7, 7, 2];
        let mut prompt_cache = model.new_cache(12, &device);
        let (_, mut decoding_cache) = model.prefill(&decoding[..2], 12, &device);

        let mut first = [(&prompt[..4], &mut prompt_cache), (&decoding[2..], &mut decoding_cache)];
        let logits: Vec<f32> = model.step(&mut first, &device).into_data().try_to_vec().unwrap();
        assert!(max_difference(&logits[..50], &uncached(&model, &prompt[..4], &device)) < 1e-4);
        assert!(max_difference(&logits[50..], &uncached(&model, &decoding, &device)) < 1e-4);

        let mut rest = [(&prompt[4..], &mut prompt_cache)];
        let logits: Vec<f32> = model.step(&mut rest, &device).into_data().try_to_vec().unwrap();
        assert!(max_difference(&logits, &uncached(&model, &prompt, &device)) < 1e-4);
        assert_eq!((prompt_cache.len(), decoding_cache.len()), (9, 3));
    }

    #[test]
    #[should_panic(expected = "a cache of 12 tokens is full: it holds 12 and would read 1 more")]
    fn a_full_cache_cannot_decode() {
        let device = Device::flex();
        let model = micro_model(&device);
        let (_, mut cache) = model.prefill(&[1; 11], 12, &device);
        model.step(&mut [(&[2], &mut cache)], &device);
        model.step(&mut [(&[3], &mut cache)], &device);
    }

    #[test]
    #[should_panic(expected = "a cache of 25 tokens: a sequence holds at most the context's 24")]
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
