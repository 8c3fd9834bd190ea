//! Rows of finished blocks cut into batches: the batcher that both
//! `iter_batches` and a streaming split's shards hand batches out of, and
//! [`BatchIter`], the batches of a run of a dataset's own, and
//! [`ArrowBatchIter`], its record batches.

use std::collections::VecDeque;

use arrow::array::RecordBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::DataError;
use crate::block_output::BlockOutput;
use crate::execution::{Execution, LocalShuffle, StageMemory};
use crate::row::Row;
use crate::stage::RowError;

/// Rows of finished blocks, cut into batches: what both `iter_batches`
/// (over a run of its own, or a streaming split's shard) hand out.
pub(crate) struct RowBatcher<T> {
    rows: VecDeque<T>,
    batch_size: usize,
    skipped: Vec<RowError>,
    /// With a local shuffle: its buffer and random order.
    shuffle: Option<(usize, StdRng)>,
}

impl<T: Row> RowBatcher<T> {
    /// Batches of `batch_size` rows, drawn at random with a local shuffle
    /// (its order taken from the seed and `epoch`).
    pub fn new(batch_size: usize, shuffle: Option<LocalShuffle>, epoch: u64) -> Self {
        RowBatcher {
            rows: VecDeque::new(),
            batch_size: batch_size.max(1),
            skipped: Vec::new(),
            shuffle: shuffle.map(|s| {
                (
                    s.buffer_rows,
                    StdRng::seed_from_u64(crate::exchange::mix(s.seed, epoch)),
                )
            }),
        }
    }

    /// Whether a whole batch (or, shuffling, a full buffer) is not there yet.
    pub fn wants_more(&self) -> bool {
        let wanted = match &self.shuffle {
            Some((buffer_rows, _)) => self.batch_size.max(*buffer_rows),
            None => self.batch_size,
        };
        self.rows.len() < wanted
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
        if take == 0 {
            return None;
        }
        match &mut self.shuffle {
            None => Some(self.rows.drain(..take).collect()),
            Some((_, rng)) => {
                let rows = &mut self.rows;
                let batch = (0..take).map(|_| {
                    let pick = rng.random_range(0..rows.len());
                    rows.swap_remove_back(pick).expect("a row at a drawn index")
                });
                Some(batch.collect())
            }
        }
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
    pub(crate) fn new(execution: Execution, batch_size: usize, shuffle: Option<LocalShuffle>) -> Self {
        BatchIter {
            execution,
            batcher: RowBatcher::new(batch_size, shuffle, 0),
        }
    }

    /// Rows left out so far under `OnError::Skip`.
    pub fn skipped(&self) -> &[RowError] {
        self.batcher.skipped()
    }

    /// The most bytes one block's rows took at each step, so far.
    pub fn memory(&self) -> Vec<StageMemory> {
        self.execution.memory()
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

/// Record batches of a dataset of [`Arrow`](crate::Arrow) rows, cut to
/// `batch_size` rows as its blocks finish.
pub struct ArrowBatchIter {
    execution: Execution,
    pending: VecDeque<RecordBatch>,
    rows: usize,
    batch_size: usize,
}

impl ArrowBatchIter {
    pub(crate) fn new(execution: Execution, batch_size: usize) -> Self {
        ArrowBatchIter {
            execution,
            pending: VecDeque::new(),
            rows: 0,
            batch_size: batch_size.max(1),
        }
    }

    /// Up to `batch_size` rows from the front of the pending batches, joined.
    fn take(&mut self) -> Result<Option<RecordBatch>, DataError> {
        let mut parts = Vec::new();
        let mut wanted = self.batch_size.min(self.rows);
        while wanted > 0 {
            let front = self.pending.pop_front().expect("pending rows are in batches");
            match front.num_rows() <= wanted {
                true => {
                    wanted -= front.num_rows();
                    parts.push(front);
                }
                false => {
                    parts.push(front.slice(0, wanted));
                    self.pending.push_front(front.slice(wanted, front.num_rows() - wanted));
                    wanted = 0;
                }
            }
        }
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let batch = arrow::compute::concat_batches(&first.schema(), &parts)
            .map_err(|e| DataError::InvalidInput(format!("joining record batches: {e}")))?;
        self.rows -= batch.num_rows();
        Ok(Some(batch))
    }
}

impl Iterator for ArrowBatchIter {
    type Item = Result<RecordBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.rows < self.batch_size {
            match self.execution.next_block() {
                None => break,
                Some(Ok((_, output))) => match output.into_batches() {
                    Ok(batches) => {
                        self.rows += batches.iter().map(RecordBatch::num_rows).sum::<usize>();
                        self.pending.extend(batches.into_iter().filter(|b| b.num_rows() > 0));
                    }
                    Err(e) => return Some(Err(e)),
                },
                Some(Err(e)) => return Some(Err(e)),
            }
        }
        self.take().transpose()
    }
}
