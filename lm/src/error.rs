//! `LmError`: what preparing, reading or measuring the language model's
//! data can fail with, each variant naming what it is about.

use std::path::PathBuf;

use raylet_data::DataError;
use raylet_models::corpus::CorpusError;
use raylet_models::tokenizer::TokenizerError;
use thiserror::Error;

/// An error of the language-model workload.
#[derive(Debug, Error)]
pub enum LmError {
    /// The corpus directory is missing, not a directory, or holds no `.py` file.
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A raylet-data pipeline failed (no cluster, a worker's error, a sink's).
    #[error(transparent)]
    Data(#[from] DataError),
    /// One side of the train/validation split holds no file.
    #[error("the {split} split of the corpus in {corpus} holds no file")]
    EmptySplit { split: &'static str, corpus: PathBuf },
    /// The output directory holds data prepared from another corpus or with
    /// other options, which a rerun must not mix in.
    #[error(
        "{path} records a preparation of another corpus or with other options \
         (recorded: {recorded}; this one: {current}): prepare into a new directory, or delete it to start over"
    )]
    OtherPreparation {
        path: PathBuf,
        recorded: String,
        current: String,
    },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint of a GPT run that does not read as one.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// The rows read hold no token.
    #[error("the rows in {0} hold no token")]
    NoTokens(PathBuf),
}

impl LmError {
    pub(crate) fn io(context: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> LmError {
        let path = path.into();
        move |source| LmError::Io { context, path, source }
    }
}
