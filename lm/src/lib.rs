//! The language-model workload end to end on a raylet cluster: its data
//! prepared, then a GPT trained on it.
//!
//! - [`prepare_corpus`] trains a byte-level BPE tokenizer on the training
//!   split of a corpus of `.py` files (the Python standard library,
//!   `raylet_models::corpus`), then tokenizes both splits on the cluster
//!   with raylet-data and writes them as Parquet rows of
//!   `sequence_length + 1` token ids, exactly once ([`prepare`],
//!   [`packing`]).
//! - [`token_rows()`] reads the rows back as a dataset, to be shuffled and
//!   split among training workers; [`unigram_entropy`] is the loss a model
//!   must beat to show that it learns (module [`token_rows`](mod@token_rows)).
//! - [`GptTraining`] trains a GPT of raylet-models on the rows with
//!   raylet-train ([`training`]); [`TrainedGpt`] reads one back from a
//!   checkpoint to score and continue text ([`trained`]).
//! - [`tune_gpt`] is a Tune trainable whose trials are GPT Train runs
//!   ([`tuning`]).
//! - [`score_files`] scores a set of files with a trained GPT on an actor
//!   pool, writing each file's loss and a continuation as Parquet
//!   ([`inference`]).
//!
//! Every error is an [`LmError`].

mod error;
pub mod inference;
pub mod packing;
mod preparation_record;
pub mod prepare;
pub mod token_rows;
pub mod trained;
pub mod training;
pub mod tuning;

pub use error::LmError;
pub use inference::{FileScore, ScoringOptions, score_files};
pub use packing::TokenRow;
pub use prepare::{PrepareOptions, Prepared, SplitSummary, prepare_corpus};
pub use token_rows::{token_rows, unigram_entropy};
pub use trained::{TextLoss, TrainedGpt};
pub use training::{GptTraining, OptimizerSettings, TrainingRows};
pub use tuning::tune_gpt;
