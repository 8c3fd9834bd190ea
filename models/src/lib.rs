//! Reference models for raylet's training examples and benchmarks, with
//! the data they learn from:
//!
//! - [`gpt`]: a GPT-style decoder-only transformer language model in burn
//!   (pre-norm blocks, causal self-attention, learned positions, an output
//!   head tied to the token embedding), its configuration with named sizes,
//!   its next-token loss and greedy generation.
//! - [`tokenizer`]: a byte-level BPE tokenizer trained with Hugging Face's
//!   `tokenizers`, which round-trips any text exactly.
//! - [`corpus`]: the `.py` files of the Python standard library found on the
//!   machine, with a train/validation split that never changes.
//!
//! The crate depends on no raylet runtime crate: the trainers use it, not
//! the other way around.

pub mod corpus;
pub mod gpt;
pub mod tokenizer;
