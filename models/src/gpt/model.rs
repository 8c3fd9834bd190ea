//! The GPT modules: the model, its pre-norm blocks, causal self-attention
//! and the MLP, with GPT-2's initialization (normal weights of std 0.02,
//! residual output projections scaled down by `sqrt(2 * n_layers)`, zero
//! biases) so the untrained model predicts close to uniformly.

use burn::module::Param;
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::{Dropout, DropoutConfig, Embedding, Gelu, Initializer, LayerNorm, LayerNormConfig, Linear};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::{GptConfig, GptConfigError};

const INIT_STD: f64 = 0.02;

/// A GPT-style language model; see the [module](super) doc.
#[derive(Module, Debug)]
pub struct Gpt {
    /// `[vocab_size, d_model]`: reads the tokens in and, transposed, the
    /// logits out.
    pub(super) token_embedding: Embedding,
    /// `[context_length, d_model]`: row `t` is added at position `t`.
    pub(super) position_embedding: Param<Tensor<2>>,
    pub(super) embedding_dropout: Dropout,
    pub(super) blocks: Vec<Block>,
    pub(super) final_norm: LayerNorm,
}

/// Pre-norm transformer block: `x + attention(norm(x))`, then
/// `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct Block {
    pub(super) attention_norm: LayerNorm,
    pub(super) attention: CausalSelfAttention,
    pub(super) mlp_norm: LayerNorm,
    pub(super) mlp: Mlp,
}

/// Multi-head self-attention in which a position attends only to itself and
/// the positions before it.
///
/// Written with burn's attention op (`burn::tensor::module::attention`,
/// `is_causal`) rather than `nn::attention::MultiHeadAttention`: one fused
/// query/key/value projection instead of three, no mask tensor to build, and
/// on the flex backend a fused kernel for inference; under autodiff the op
/// falls back to matmul, a `-inf` mask above the diagonal and softmax, which
/// differentiate. The op has no dropout on the attention weights, so dropout
/// is applied to this layer's output only.
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    pub(super) query_key_value: Linear,
    pub(super) output: Linear,
    pub(super) dropout: Dropout,
    pub(super) n_heads: usize,
}

/// The position-wise feed-forward layer: expand, GELU, contract.
#[derive(Module, Debug)]
pub struct Mlp {
    pub(super) expand: Linear,
    pub(super) activation: Gelu,
    pub(super) contract: Linear,
    pub(super) dropout: Dropout,
}

impl Gpt {
    /// A freshly initialized model of the shape `config` describes.
    pub fn new(config: &GptConfig, device: &Device) -> Result<Self, GptConfigError> {
        config.check()?;
        let normal = Initializer::Normal {
            mean: 0.0,
            std: INIT_STD,
        };
        Ok(Gpt {
            token_embedding: Embedding {
                weight: normal.init([config.vocab_size, config.d_model], device),
            },
            position_embedding: normal.init([config.context_length, config.d_model], device),
            embedding_dropout: DropoutConfig::new(config.dropout).init(),
            blocks: (0..config.n_layers).map(|_| Block::new(config, device)).collect(),
            final_norm: LayerNormConfig::new(config.d_model).init(device),
        })
    }

    /// The most tokens [`forward`](Self::forward) reads.
    pub fn context_length(&self) -> usize {
        self.position_embedding.shape().dims::<2>()[0]
    }

    /// Tokens the model reads and predicts.
    pub fn vocab_size(&self) -> usize {
        self.token_embedding.weight.shape().dims::<2>()[0]
    }

    /// The next-token logits at every position, `[batch, seq]` to
    /// `[batch, seq, vocab_size]`.
    ///
    /// # Panics
    /// If `seq` is longer than the context length.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let states = self.final_states(tokens);
        let [batch, seq, d_model] = states.dims();
        let embedding = self.token_embedding.weight.val();
        let [vocab_size, _] = embedding.dims();
        states
            .reshape([batch * seq, d_model])
            .matmul(embedding.transpose())
            .reshape([batch, seq, vocab_size])
    }

    /// The mean cross-entropy of predicting `tokens[:, 1:]` from
    /// `tokens[:, :-1]`, so a batch of `context_length + 1` tokens per row
    /// trains every position.
    ///
    /// # Panics
    /// If a row has fewer than two tokens or more than `context_length + 1`.
    pub fn loss(&self, tokens: Tensor<2, Int>) -> Tensor<1> {
        let [batch, seq] = tokens.dims();
        assert!(seq >= 2, "a loss needs at least two tokens per row, got {seq}");
        let inputs = tokens.clone().slice([0..batch, 0..seq - 1]);
        let targets = tokens.slice([0..batch, 1..seq]);
        let logits = self.forward(inputs);
        let predictions = batch * (seq - 1);
        let logits = logits.reshape([predictions, self.vocab_size()]);
        CrossEntropyLoss::new(None, &logits.device()).forward(logits, targets.reshape([predictions]))
    }

    /// The residual stream after the last block and the final LayerNorm,
    /// `[batch, seq, d_model]`.
    fn final_states(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let [_, seq] = tokens.dims();
        let context_length = self.context_length();
        assert!(
            seq <= context_length,
            "{seq} tokens exceed the context length {context_length}"
        );
        let positions = self.position_embedding.val().narrow(0, 0, seq).unsqueeze::<3>();
        let embedded = self.token_embedding.forward(tokens) + positions;
        let residual = self.embedding_dropout.forward(embedded);
        let residual = self
            .blocks
            .iter()
            .fold(residual, |residual, block| block.forward(residual));
        self.final_norm.forward(residual)
    }
}

impl Block {
    fn new(config: &GptConfig, device: &Device) -> Self {
        Block {
            attention_norm: LayerNormConfig::new(config.d_model).init(device),
            attention: CausalSelfAttention::new(config, device),
            mlp_norm: LayerNormConfig::new(config.d_model).init(device),
            mlp: Mlp::new(config, device),
        }
    }

    fn forward(&self, residual: Tensor<3>) -> Tensor<3> {
        let residual = residual.clone() + self.attention.forward(self.attention_norm.forward(residual));
        residual.clone() + self.mlp.forward(self.mlp_norm.forward(residual))
    }
}

impl CausalSelfAttention {
    fn new(config: &GptConfig, device: &Device) -> Self {
        let d_model = config.d_model;
        CausalSelfAttention {
            query_key_value: linear(d_model, 3 * d_model, INIT_STD, device),
            output: linear(d_model, d_model, residual_projection_std(config), device),
            dropout: DropoutConfig::new(config.dropout).init(),
            n_heads: config.n_heads,
        }
    }

    /// `[batch, seq, d_model]` to `[batch, seq, d_model]`.
    fn forward(&self, input: Tensor<3>) -> Tensor<3> {
        let [batch, seq, d_model] = input.dims();
        let [query, key, value] = self
            .query_key_value
            .forward(input)
            .chunk(3, 2)
            .try_into()
            .expect("the projection has three d_model-wide parts");
        let options = AttentionModuleOptions {
            is_causal: true,
            ..Default::default()
        };
        let heads = attention(
            self.split_heads(query),
            self.split_heads(key),
            self.split_heads(value),
            None,
            None,
            options,
        );
        let merged = heads.swap_dims(1, 2).reshape([batch, seq, d_model]);
        self.dropout.forward(self.output.forward(merged))
    }

    /// `[batch, seq, d_model]` to `[batch, n_heads, seq, head_dim]`.
    pub(super) fn split_heads(&self, states: Tensor<3>) -> Tensor<4> {
        let [batch, seq, d_model] = states.dims();
        states
            .reshape([batch, seq, self.n_heads, d_model / self.n_heads])
            .swap_dims(1, 2)
    }
}

impl Mlp {
    fn new(config: &GptConfig, device: &Device) -> Self {
        Mlp {
            expand: linear(config.d_model, config.mlp_width(), INIT_STD, device),
            activation: Gelu::new(),
            contract: linear(
                config.mlp_width(),
                config.d_model,
                residual_projection_std(config),
                device,
            ),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    pub(super) fn forward(&self, input: Tensor<3>) -> Tensor<3> {
        let hidden = self.activation.forward(self.expand.forward(input));
        self.dropout.forward(self.contract.forward(hidden))
    }
}

/// Rows of token ids as a `[rows, length]` tensor, the input of
/// [`Gpt::forward`] and [`Gpt::loss`].
///
/// # Panics
/// If the rows are not all of one length.
pub fn token_batch(rows: &[&[u32]], device: &Device) -> Tensor<2, Int> {
    let length = rows.first().map_or(0, |row| row.len());
    assert!(
        rows.iter().all(|row| row.len() == length),
        "token rows of different lengths"
    );
    let ids: Vec<i64> = rows
        .iter()
        .flat_map(|row| row.iter().map(|&id| i64::from(id)))
        .collect();
    Tensor::from_data(TensorData::new(ids, [rows.len(), length]), device)
}

/// A linear layer with normal weights of standard deviation `std` and a
/// zero bias.
fn linear(inputs: usize, outputs: usize, std: f64, device: &Device) -> Linear {
    Linear {
        weight: Initializer::Normal { mean: 0.0, std }.init([inputs, outputs], device),
        bias: Some(Initializer::Zeros.init([outputs], device)),
    }
}

/// The layers that write into the residual stream start smaller, so the
/// stream's variance does not grow with depth (GPT-2).
fn residual_projection_std(config: &GptConfig) -> f64 {
    INIT_STD / ((2 * config.n_layers) as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use burn::optim::{AdamWConfig, GradientsParams};

    use super::*;

    /// Small enough that a debug build trains it in seconds.
    fn micro(vocab_size: usize) -> GptConfig {
        GptConfig {
            vocab_size,
            context_length: 16,
            d_model: 32,
            n_heads: 4,
            n_layers: 2,
            mlp_ratio: 4,
            dropout: 0.0,
        }
    }

    /// `length` token ids below `vocab_size` from a fixed generator.
    fn pseudo_random_tokens(seed: u64, length: usize, vocab_size: usize) -> Vec<u32> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..length)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % vocab_size as u64) as u32
            })
            .collect()
    }

    fn values(tensor: Tensor<3>) -> Vec<f32> {
        tensor.into_data().try_to_vec().unwrap()
    }

    fn max_difference(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn a_built_model_has_the_parameters_its_config_counts() {
        let device = Device::flex();
        let tiny = GptConfig::tiny(8192);
        assert_eq!(Gpt::new(&tiny, &device).unwrap().num_params(), tiny.parameter_count());
        let odd = GptConfig {
            mlp_ratio: 2,
            n_layers: 3,
            ..micro(50)
        };
        assert_eq!(Gpt::new(&odd, &device).unwrap().num_params(), odd.parameter_count());
    }

    #[test]
    fn a_model_is_not_built_from_a_shape_that_fails_its_checks() {
        let uneven_heads = GptConfig {
            n_heads: 3,
            ..micro(50)
        };
        let error = Gpt::new(&uneven_heads, &Device::flex()).unwrap_err();
        assert_eq!(
            error,
            GptConfigError::HeadsDoNotDivideWidth {
                d_model: 32,
                n_heads: 3
            }
        );
    }

    #[test]
    fn the_logits_are_the_final_states_times_the_transposed_token_embedding() {
        let device = Device::flex();
        let model = Gpt::new(&micro(40), &device).unwrap();
        let tokens = token_batch(&[&pseudo_random_tokens(1, 12, 40)], &device);

        let logits = values(model.forward(tokens.clone()));

        let states: Tensor<2> = model.final_states(tokens).reshape([12, 32]);
        let by_hand = states
            .matmul(model.token_embedding.weight.val().transpose())
            .unsqueeze::<3>();
        assert_eq!(logits.len(), 12 * 40);
        assert!(max_difference(&logits, &values(by_hand)) < 1e-5);
    }

    /// Changes the token at position 9 and checks which positions' logits
    /// move.
    fn assert_causal(device: &Device) {
        let vocab_size = 40;
        let model = Gpt::new(&micro(vocab_size), device).unwrap();
        let original = pseudo_random_tokens(2, 16, vocab_size);
        let mut changed = original.clone();
        let position = 9;
        changed[position] = (changed[position] + 1) % vocab_size as u32;

        let before = values(model.forward(token_batch(&[&original], device)));
        let after = values(model.forward(token_batch(&[&changed], device)));

        let per_position = |logits: &[f32], t: usize| logits[t * vocab_size..(t + 1) * vocab_size].to_vec();
        for t in 0..16 {
            let difference = max_difference(&per_position(&before, t), &per_position(&after, t));
            match t < position {
                true => assert!(
                    difference < 1e-6,
                    "position {t} saw a later token: moved by {difference}"
                ),
                false => assert!(
                    difference > 1e-4,
                    "position {t} did not see token {position}: moved by {difference}"
                ),
            }
        }
    }

    #[test]
    fn a_position_sees_no_later_token_at_inference() {
        assert_causal(&Device::flex());
    }

    #[test]
    fn a_position_sees_no_later_token_in_training() {
        assert_causal(&Device::flex().autodiff());
    }

    #[test]
    fn inference_and_training_compute_the_same_logits() {
        let device = Device::flex().autodiff();
        let model = Gpt::new(&micro(40), &device).unwrap();
        let tokens = pseudo_random_tokens(3, 16, 40);

        let training = values(model.forward(token_batch(&[&tokens], &device)));
        let inference = values(model.valid().forward(token_batch(&[&tokens], &Device::flex())));

        assert!(max_difference(&training, &inference) < 1e-4);
    }

    #[test]
    fn adamw_steps_on_a_fixed_batch_cut_the_loss_by_more_than_half() {
        let vocab_size = 64;
        let device = Device::flex().autodiff();
        device.seed(0);
        let mut model = Gpt::new(&micro(vocab_size), &device).unwrap();
        let rows: Vec<Vec<u32>> = (0..4u32)
            .map(|row| (0..17).map(|i| (5 * row + (row + 1) * i) % vocab_size as u32).collect())
            .collect();
        let rows: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let batch = token_batch(&rows, &device);
        let mut optimizer = AdamWConfig::new().init();

        let loss_of = |model: &Gpt| model.loss(batch.clone()).into_scalar::<f32>();
        let initial = loss_of(&model);
        for _ in 0..30 {
            let loss = model.loss(batch.clone());
            let gradients = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(3e-3, model, gradients);
        }
        let trained = loss_of(&model);

        let uniform = (vocab_size as f32).ln();
        assert!(
            (initial - uniform).abs() < 0.1,
            "initial loss {initial}, ln(vocab) {uniform}"
        );
        assert!(trained < initial / 2.0, "loss went from {initial} to {trained}");
    }
}
