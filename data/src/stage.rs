//! The steps a block goes through in its task: each a registered function
//! of one kind, and what happens to the rows it fails on.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

/// How a registered function is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageKind {
    Map,
    FlatMap,
    Filter,
    MapBatches,
    /// Arrow record batches through a function.
    MapArrowBatches,
    /// A [`BatchModel`](crate::BatchModel) in an actor pool.
    Model,
}

/// One step of a dataset's plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StageSpec {
    pub function: String,
    pub kind: StageKind,
    pub batch_size: usize,
}

/// What a run does when a function fails on a row, or an input cannot be
/// read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnError {
    /// The run fails with an error naming the input.
    #[default]
    Fail,
    /// The row is left out and recorded (in `_errors.jsonl` for a sink).
    Skip,
}

/// A row left out, or the one that failed the run: the function, the
/// input it came from (a file's path, or `item N`) and the message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowError {
    pub function: String,
    pub source: String,
    pub message: String,
}

/// Rows a function failed on: the inputs they came from (none for a
/// failure of the whole block) and why.
#[derive(Debug)]
pub struct RowFailure {
    pub function: String,
    pub origins: Vec<u32>,
    pub message: String,
}

/// One stage's run over one block. Not a public API.
#[doc(hidden)]
pub struct StageRun {
    pub function: String,
    pub batch_size: usize,
    on_error: OnError,
    pub skipped: Vec<RowFailure>,
}

impl StageRun {
    pub(crate) fn new(stage: &StageSpec, on_error: OnError) -> Self {
        StageRun {
            function: stage.function.clone(),
            batch_size: stage.batch_size,
            on_error,
            skipped: Vec::new(),
        }
    }

    /// The run of a source's reader (`read_binary`, `read_text`), one input at a time.
    pub(crate) fn reading(function: &str, on_error: OnError) -> Self {
        StageRun {
            function: function.to_string(),
            batch_size: 1,
            on_error,
            skipped: Vec::new(),
        }
    }

    /// What the run does with rows its function fails on.
    pub(crate) fn on_error(&self) -> OnError {
        self.on_error
    }

    /// The function failed on the rows from `origins`: an error that ends
    /// the block, or (with [`OnError::Skip`]) a record of the rows left out.
    pub(crate) fn fail(&mut self, origins: &[u32], error: impl Display) -> Result<(), RowFailure> {
        let failure = RowFailure {
            function: self.function.clone(),
            origins: origins.to_vec(),
            message: error.to_string(),
        };
        match self.on_error {
            OnError::Fail => Err(failure),
            OnError::Skip => {
                self.skipped.push(failure);
                Ok(())
            }
        }
    }

    /// A failure of the whole block (its rows could not be decoded or encoded).
    pub(crate) fn block_failure(&self, error: impl Display) -> RowFailure {
        RowFailure {
            function: self.function.clone(),
            origins: Vec::new(),
            message: error.to_string(),
        }
    }
}
