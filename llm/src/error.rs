//! [`LlmError`]: why a model cannot be served or a request generated.

use thiserror::Error;

/// Why a model cannot be loaded or served, or a request generated.
#[derive(Debug, Error)]
pub enum LlmError {
    #[error("loading the model: {0}")]
    Load(#[from] raylet_lm::LmError),
    #[error(
        "the engine can hold no sequence: kv_cache_bytes {kv_cache_bytes} holds no token of \
         {bytes_per_token} bytes, or max_batch_size is 0"
    )]
    HoldsNothing {
        kv_cache_bytes: usize,
        bytes_per_token: usize,
    },
    #[error("max_prefill_tokens is 0: the engine could never read a prompt")]
    ReadsNoPrompt,
    #[error("starting the engine thread: {0}")]
    Thread(std::io::Error),
    #[error("the text does not tokenize: {0}")]
    Tokenize(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the prompt is empty: it needs at least one token")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt} tokens and max_tokens is {max_tokens}: max_tokens must be at least 1 \
         and the two together at most the context length, {context} tokens"
    )]
    BeyondContext {
        prompt: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error(
        "the prompt and max_tokens need {tokens} tokens of key/value cache, more than this replica's \
         whole cache ({capacity} tokens): lower max_tokens or raise kv_cache_bytes"
    )]
    BeyondCache { tokens: usize, capacity: usize },
    #[error("{waiting} requests already wait for this replica: try again later")]
    Busy { waiting: usize },
    #[error("the engine has stopped")]
    EngineStopped,
}
