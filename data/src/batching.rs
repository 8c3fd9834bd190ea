//! Rows of finished blocks cut into batches: the batcher that both
//! `iter_batches` and a streaming split's shards hand batches out of, and
//! [`BatchIter`], the batches of a run of a dataset's own.

use std::collections::VecDeque;

use crate::DataError;
use crate::execution::Execution;
use crate::row::Row;
use crate::stage::RowError;
use crate::task::BlockOutput;

/// Rows of finished blocks, cut into batches: what both `iter_batches`
/// (over a run of its own, or a streaming split's shard) hand out.
pub(crate) struct RowBatcher<T> {
    rows: VecDeque<T>,
    batch_size: usize,
    skipped: Vec<RowError>,
}

impl<T: Row> RowBatcher<T> {
    pub fn new(batch_size: usize) -> Self {
        RowBatcher {
            rows: VecDeque::new(),
            batch_size: batch_size.max(1),
            skipped: Vec::new(),
        }
    }

    /// Whether a whole batch is not there yet.
    pub fn wants_more(&self) -> bool {
        self.rows.len() < self.batch_size
    }

    /// Adds a finished block's rows and the rows it left out.
    pub fn add(&mut self, output: BlockOutput) -> Result<(), DataError> {
        self.rows.extend(output.decode_rows::<T>()?);
        self.skipped.extend(output.skipped);
        Ok(())
    }

    /// The next batch (a short one when the rows run out), if any rows are left.
    pub fn take(&mut self) -> Option<Vec<T>> {
        let take = self.rows.len().min(self.batch_size);
        (take > 0).then(|| self.rows.drain(..take).collect())
    }

    /// Rows left out so far under `OnError::Skip`.
    pub fn skipped(&self) -> &[RowError] {
        &self.skipped
    }
}

/// Batches of a dataset's rows, made as its blocks finish.
pub struct BatchIter<T> {
    execution: Execution,
    batcher: RowBatcher<T>,
}

impl<T: Row> BatchIter<T> {
    pub(crate) fn new(execution: Execution, batch_size: usize) -> Self {
        BatchIter {
            execution,
            batcher: RowBatcher::new(batch_size),
        }
    }

    /// Rows left out so far under `OnError::Skip`.
    pub fn skipped(&self) -> &[RowError] {
        self.batcher.skipped()
    }
}

impl<T: Row> Iterator for BatchIter<T> {
    type Item = Result<Vec<T>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.batcher.wants_more() {
            match self.execution.next_block() {
                None => break,
                Some(Ok((_, output))) => {
                    if let Err(e) = self.batcher.add(output) {
                        return Some(Err(e));
                    }
                }
                Some(Err(e)) => return Some(Err(e)),
            }
        }
        self.batcher.take().map(Ok)
    }
}
