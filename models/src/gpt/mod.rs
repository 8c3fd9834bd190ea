//! A GPT-style language model: tokens and their positions are embedded, pass
//! through `n_layers` pre-norm transformer blocks (causal multi-head
//! self-attention, then a GELU MLP, each added back to the residual stream)
//! and a final LayerNorm; the logits are the states times the transposed
//! token embedding, so the output head has no parameters of its own.
//!
//! [`GptConfig`] sizes the model and has named presets; [`Gpt::loss`] is the
//! mean next-token cross-entropy a trainer minimizes, and
//! [`Gpt::generate_greedy`] continues a prompt; [`Gpt::step`] reads prompts
//! and decodes many sequences at once with a [`KvCache`] each;
//! [`Gpt::save_safetensors`] writes the weights as PyTorch names them.

mod cached;
mod config;
mod export;
mod generate;
mod model;

pub use cached::KvCache;
pub use config::{GptConfig, GptConfigError, PRESETS, Preset};
pub use export::NamedTensor;
pub use model::{Block, CausalSelfAttention, Gpt, Mlp, token_batch};
