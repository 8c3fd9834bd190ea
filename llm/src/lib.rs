//! raylet-llm: serving language models on raylet-serve.
//!
//! - [`engine`]: one thread per replica owns the model and decodes all its
//!   sequences in one batch that changes at every step (continuous
//!   batching), each sequence with its own key/value cache, within a cache
//!   budget that requests wait for rather than exceed; `max_tokens`,
//!   temperature and top-p sampling with a seed, and stop sequences.
//! - [`model`]: the seam the engine decodes through ([`LanguageModel`],
//!   [`Tokenizer`]) and its implementation for a trained GPT
//!   ([`GptModel`]).
//! - [`openai`]: the [`OpenAiServer`](openai::OpenAiServer) deployment, which
//!   serves an engine over OpenAI's completions, chat completions and
//!   models endpoints, streamed as server-sent events or not.
//! - [`stats`]: time to first token, inter-token latency and tokens/s,
//!   on `/metrics` and in `raylet serve status`.
//!
//! Every error is an [`LlmError`].

pub mod engine;
mod error;
pub mod model;
pub mod openai;
pub mod stats;

pub use engine::{Engine, EngineOptions, Event, FinishReason, Generation, GenerationRequest, SamplingParams};
pub use error::LlmError;
pub use model::{GptModel, GptTokenizer, LanguageModel, Tokenizer};
pub use stats::{ServingStats, StatsSnapshot};
