//! Where each rank's training rows come from, one micro-batch at a time,
//! with every rank stepping together.
//!
//! - [`TrainingRows::Shards`]: the shards of a shuffled `streaming_split`
//!   of the prepared Parquet, one per rank. Each epoch a rank reads the
//!   blocks it takes; the ranks move to the next epoch together as soon as
//!   one of them lacks a whole batch, so none waits in a collective for a
//!   rank that has run out. Where a run resumes, it starts a new epoch.
//! - [`TrainingRows::InMemory`]: rows every rank holds, read as one stream
//!   in a seeded order: micro-batch `k` of the run is the stream's `k`-th
//!   window of a global batch, and each rank takes its own part of it. The
//!   rows a step trains on depend only on the step, not on the number of
//!   ranks or on where the run resumed, so runs can be compared exactly.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use raylet_data::{DataShard, ShardBatches};
use raylet_train::collective::{CollectiveGroup, ReduceOp};
use raylet_train::{TrainContext, TrainError};
use serde::{Deserialize, Serialize};

use crate::TokenRow;

/// The rows a run trains on.
#[derive(Serialize, Deserialize)]
pub enum TrainingRows {
    /// One shard of a `streaming_split` per rank (its length is the number
    /// of workers).
    Shards(Vec<DataShard<TokenRow>>),
    /// Rows every rank holds, for small sets and runs that must be
    /// reproduced exactly.
    InMemory(Vec<TokenRow>),
}

impl TrainingRows {
    /// What the rows are, in a few words (`2 shards of a streaming split`).
    pub fn describe(&self) -> String {
        match self {
            TrainingRows::Shards(shards) => format!("{} shards of a streaming split", shards.len()),
            TrainingRows::InMemory(rows) => format!("{} rows in memory", rows.len()),
        }
    }
}

/// One rank's micro-batches.
pub(super) enum BatchFeed {
    Shard {
        shard: DataShard<TokenRow>,
        /// The current epoch's batches (boxed: they hold a block stream).
        epoch: Option<Box<ShardBatches<TokenRow>>>,
        rows: usize,
    },
    InMemory {
        rows: Vec<TokenRow>,
        order: Vec<usize>,
        rank: usize,
        local_rows: usize,
        world_size: usize,
        /// Micro-batches of the run taken so far.
        taken: u64,
    },
}

impl BatchFeed {
    /// The feed of this rank, `local_rows` rows per micro-batch, the first
    /// being micro-batch `first_micro_batch` of the run.
    pub(super) fn new(
        rows: TrainingRows,
        context: &TrainContext,
        local_rows: usize,
        first_micro_batch: u64,
        seed: u64,
    ) -> Result<Self, TrainError> {
        match rows {
            TrainingRows::Shards(mut shards) => {
                if shards.len() != context.world_size() {
                    return Err(TrainError::InvalidConfig(format!(
                        "{} streaming-split shards for {} workers: split the rows into one shard per worker",
                        shards.len(),
                        context.world_size()
                    )));
                }
                Ok(BatchFeed::Shard {
                    shard: shards.swap_remove(context.rank()),
                    epoch: None,
                    rows: local_rows,
                })
            }
            TrainingRows::InMemory(rows) => {
                let global = local_rows * context.world_size();
                if rows.len() < global {
                    return Err(TrainError::InvalidConfig(format!(
                        "{} training rows are fewer than one global micro-batch of {global}",
                        rows.len()
                    )));
                }
                let mut order: Vec<usize> = (0..rows.len()).collect();
                order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
                Ok(BatchFeed::InMemory {
                    rows,
                    order,
                    rank: context.rank(),
                    local_rows,
                    world_size: context.world_size(),
                    taken: first_micro_batch,
                })
            }
        }
    }

    /// This rank's next micro-batch; every rank must call it together.
    pub(super) fn next(&mut self, group: &mut CollectiveGroup) -> Result<Vec<TokenRow>, TrainError> {
        match self {
            BatchFeed::Shard { shard, epoch, rows } => next_from_shard(shard, epoch, *rows, group),
            BatchFeed::InMemory {
                rows,
                order,
                rank,
                local_rows,
                world_size,
                taken,
            } => {
                let global = (*local_rows * *world_size) as u64;
                let start = *taken * global + (*rank * *local_rows) as u64;
                *taken += 1;
                Ok((start..start + *local_rows as u64)
                    .map(|k| rows[order[(k % order.len() as u64) as usize]].clone())
                    .collect())
            }
        }
    }
}

/// The next whole batch of `shard` that every rank also has one of,
/// starting new epochs as the ranks run out together.
fn next_from_shard(
    shard: &mut DataShard<TokenRow>,
    epoch: &mut Option<Box<ShardBatches<TokenRow>>>,
    rows: usize,
    group: &mut CollectiveGroup,
) -> Result<Vec<TokenRow>, TrainError> {
    let mut empty_epochs = 0;
    loop {
        let batches = epoch.get_or_insert_with(|| Box::new(shard.iter_batches(rows)));
        let next = batches
            .next()
            .transpose()
            .map_err(|e| TrainError::Loop(format!("reading the training rows: {e}")))?;
        let whole = next.as_ref().is_some_and(|batch| batch.len() == rows);
        let mut ranks_with_a_batch = [f64::from(u8::from(whole))];
        group.allreduce(&mut ranks_with_a_batch, ReduceOp::Sum)?;
        if ranks_with_a_batch[0] as usize == group.world_size() {
            return Ok(next.expect("a whole batch"));
        }
        *epoch = None;
        empty_epochs += 1;
        if empty_epochs > 1 {
            return Err(TrainError::Loop(format!(
                "an epoch of the training rows gives some worker no batch of {rows} rows: \
                 use a smaller batch or more rows"
            )));
        }
    }
}
