//! Reference models for raylet's training examples and benchmarks, with
//! the data they learn from:
//!
//! - [`gpt`]: a GPT-style decoder-only transformer language model in burn
//!   (pre-norm blocks, causal self-attention, learned positions, an output
//!   head tied to the token embedding), its configuration with named sizes,
//!   its next-token loss and greedy generation.
//! - [`tokenizer`] (feature `tokenizer`): a byte-level BPE tokenizer trained with Hugging Face's
//!   `tokenizers`, which round-trips any text exactly.
//! - [`corpus`]: the `.py` files of the Python standard library found on the
//!   machine, with a train/validation split that never changes.
//! - [`digits`] (feature `digits`): the digits data set (8x8 images of
//!   handwritten digits) with a seeded train/test split, and a two-layer
//!   perceptron for it.
//!
//! The crate depends on no raylet runtime crate: the trainers use it, not
//! the other way around.

pub mod corpus;
#[cfg(feature = "digits")]
pub mod digits;
pub mod gpt;
#[cfg(feature = "tokenizer")]
pub mod tokenizer;
