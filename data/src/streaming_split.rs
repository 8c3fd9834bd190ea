//! `streaming_split`: one run of a dataset shared by `n` consumers (the
//! workers of a Train run). A coordinator actor runs the dataset's blocks a
//! bounded number at a time; each consumer reads an epoch as one streaming
//! call, whose items are the finished blocks it takes, one ahead of what it
//! has read, so a faster consumer takes more and every block is read once.
//! Each pass over the shards is an epoch, a new run that starts once every
//! consumer has finished the last one: a consumer's call for the next epoch
//! waits in the coordinator until then.
//!
//! An equal split deals every block to all consumers instead, in parts of
//! the same number of rows ([`crate::equal_split`]), a bounded number ahead
//! of the slowest consumer.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use raylet::{ActorHandle, Cluster, ObjectRefStream};
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::batching::RowBatcher;
use crate::block_output::BlockOutput;
use crate::equal_split::EqualDealer;
use crate::execution::{Execution, LocalShuffle};
use crate::plan::Plan;
use crate::row::Row;
use crate::stage::RowError;

/// Blocks a consumer's epoch call makes ahead of what it has read.
const BLOCKS_AHEAD: u64 = 1;
/// In an equal split, the parts dealt to a consumer that it has not taken
/// yet, at most: dealing waits for the slowest consumer beyond this.
const PARTS_QUEUED: usize = 2;

/// Why a consumer of a split got no block.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error("no consumer {consumer} in a split of {consumers}")]
    NoConsumer { consumer: usize, consumers: usize },
    #[error("consumer {consumer} asked for epoch {asked} during epoch {current}")]
    WrongEpoch { consumer: usize, asked: u64, current: u64 },
    /// The epoch's execution failed; every consumer gets its error.
    #[error("{0}")]
    Failed(String),
}

/// The actor that runs a streaming split's epochs; its consumers' calls run
/// at once, each waiting on the epochs' state.
#[raylet::actor]
pub(crate) struct SplitCoordinator {
    epochs: Arc<Epochs>,
}

/// The current epoch's run and who has finished it, shared by the
/// consumers' calls.
struct Epochs {
    plan: Plan,
    state: Mutex<EpochState>,
    /// Signalled when a consumer finishes an epoch or a new one starts.
    changed: Condvar,
}

struct EpochState {
    epoch: u64,
    execution: Option<Execution>,
    /// Which consumers have finished the current epoch.
    finished: Vec<bool>,
    /// The error that ended the current epoch's run, told to every consumer.
    failure: Option<String>,
    /// In an equal split, the current epoch's dealing.
    dealing: Option<Dealing>,
}

/// An equal split's epoch: the parts dealt to each consumer and not taken
/// yet, and whether the epoch's blocks have all been dealt.
struct Dealing {
    dealer: EqualDealer,
    queued: Vec<VecDeque<BlockOutput>>,
    dealt_all: bool,
}

impl Dealing {
    fn new(consumers: usize) -> Self {
        Dealing {
            dealer: EqualDealer::new(consumers),
            queued: vec![VecDeque::new(); consumers],
            dealt_all: false,
        }
    }
}

#[raylet::actor]
impl SplitCoordinator {
    pub fn new(plan: Plan, consumers: usize, equal: bool) -> Self {
        let state = EpochState {
            epoch: 0,
            execution: None,
            finished: vec![false; consumers],
            failure: None,
            dealing: equal.then(|| Dealing::new(consumers)),
        };
        SplitCoordinator {
            epochs: Arc::new(Epochs {
                plan,
                state: Mutex::new(state),
                changed: Condvar::new(),
            }),
        }
    }

    /// The blocks of `epoch` that `consumer` takes, as they finish. Asking
    /// for the next epoch gives up the rest of this one to the others, and
    /// waits until they have finished it. The stream ends at its first error.
    #[raylet::method(streaming, generator_backpressure = BLOCKS_AHEAD)]
    pub fn blocks(&self, consumer: usize, epoch: u64) -> impl Iterator<Item = Result<BlockOutput, SplitError>> + use<> {
        let epochs = self.epochs.clone();
        let mut refused = epochs.enter(consumer, epoch).err();
        std::iter::from_fn(move || match refused.take() {
            Some(error) => Some(Err(error)),
            None => epochs.next_block(consumer).transpose(),
        })
    }
}

impl Epochs {
    fn state(&self) -> MutexGuard<'_, EpochState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `consumer` may read `epoch`: at once for the current
    /// one; for the next, once every consumer has finished this one.
    fn enter(&self, consumer: usize, epoch: u64) -> Result<(), SplitError> {
        let mut state = self.state();
        let consumers = state.finished.len();
        if consumer >= consumers {
            return Err(SplitError::NoConsumer { consumer, consumers });
        }
        loop {
            if epoch == state.epoch {
                return Ok(());
            }
            if epoch != state.epoch + 1 {
                return Err(SplitError::WrongEpoch {
                    consumer,
                    asked: epoch,
                    current: state.epoch,
                });
            }
            state.finished[consumer] = true;
            if state.finished.iter().all(|done| *done) {
                state.start(epoch);
                self.changed.notify_all();
                return Ok(());
            }
            self.changed.notify_all();
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next block of the current epoch for `consumer`; `None` once it
    /// has every block it will get.
    fn next_block(&self, consumer: usize) -> Result<Option<BlockOutput>, SplitError> {
        let mut state = self.state();
        if let Some(failure) = &state.failure {
            return Err(SplitError::Failed(failure.clone()));
        }
        if state.finished[consumer] {
            return Ok(None);
        }
        if state.dealing.is_some() {
            return self.next_part(state, consumer);
        }
        match state.next_block(&self.plan) {
            Ok(Some(output)) => Ok(Some(output)),
            Ok(None) => {
                state.finished[consumer] = true;
                self.changed.notify_all();
                Ok(None)
            }
            Err(e) => {
                state.failure = Some(e.to_string());
                Err(SplitError::Failed(e.to_string()))
            }
        }
    }

    /// In an equal split, `consumer`'s next part of the current epoch,
    /// dealing the next block when it has none queued and no consumer has
    /// [`PARTS_QUEUED`] waiting; else it waits for a part or for the others
    /// to take theirs. `None` once every block is dealt and taken.
    fn next_part(
        &self,
        mut state: MutexGuard<'_, EpochState>,
        consumer: usize,
    ) -> Result<Option<BlockOutput>, SplitError> {
        loop {
            if let Some(failure) = &state.failure {
                return Err(SplitError::Failed(failure.clone()));
            }
            let finished = state.finished.clone();
            let Some(dealing) = state.dealing.as_mut() else {
                return Ok(None);
            };
            if let Some(part) = dealing.queued[consumer].pop_front() {
                self.changed.notify_all();
                return Ok(Some(part));
            }
            if dealing.dealt_all {
                state.finished[consumer] = true;
                self.changed.notify_all();
                return Ok(None);
            }
            let room = dealing
                .queued
                .iter()
                .zip(&finished)
                .all(|(queued, done)| *done || queued.len() < PARTS_QUEUED);
            if room {
                if let Err(e) = state.deal_next(&self.plan) {
                    state.failure = Some(e.to_string());
                }
                self.changed.notify_all();
                continue;
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl EpochState {
    fn start(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.execution = None;
        self.failure = None;
        self.finished.fill(false);
        if self.dealing.is_some() {
            self.dealing = Some(Dealing::new(self.finished.len()));
        }
    }

    /// Deals the epoch's next block to the consumers that have not finished
    /// it, or marks the epoch dealt when there is none.
    fn deal_next(&mut self, plan: &Plan) -> Result<(), DataError> {
        let block = self.next_block(plan)?;
        let finished = self.finished.clone();
        let Some(dealing) = self.dealing.as_mut() else {
            return Ok(());
        };
        let Some(block) = block else {
            dealing.dealt_all = true;
            tracing::debug!(
                epoch = self.epoch,
                dropped = dealing.dealer.undealt(),
                "an equal split's epoch is dealt; the rows that did not divide evenly are dropped"
            );
            let unfinished = dealing.queued.iter_mut().zip(&finished).find(|(_, done)| !**done);
            if let (Some(last), Some((queued, _))) = (dealing.dealer.finish()?, unfinished) {
                queued.push_back(last);
            }
            return Ok(());
        };
        let parts = dealing.dealer.deal(block)?;
        for ((queued, done), part) in dealing.queued.iter_mut().zip(&finished).zip(parts) {
            if !done {
                queued.push_back(part);
            }
        }
        Ok(())
    }

    fn next_block(&mut self, plan: &Plan) -> Result<Option<BlockOutput>, DataError> {
        let execution = match &mut self.execution {
            Some(execution) => execution,
            None => {
                let mut plan = plan.clone();
                plan.epoch = self.epoch;
                self.execution.insert(plan.execute(plan.blocks()?, &[], None)?)
            }
        };
        execution
            .next_block()
            .transpose()
            .map(|next| next.map(|(_, output)| output))
    }
}

/// A dataset shared by `n` consumers through a coordinator actor, which
/// ends when this is dropped: keep it while the shards are read.
pub struct StreamingSplit<T> {
    cluster: Cluster,
    coordinator: ActorHandle,
    consumers: usize,
    local_shuffle: Option<LocalShuffle>,
    _rows: PhantomData<fn() -> T>,
}

impl<T: Row> StreamingSplit<T> {
    pub(crate) fn start(plan: Plan, consumers: usize, equal: bool) -> Result<Self, DataError> {
        let cluster = raylet::current()?;
        let local_shuffle = plan.options.local_shuffle;
        let coordinator = SplitCoordinator::remote(&cluster, plan, consumers, equal)
            .max_concurrency(consumers as u32 + 1)
            .spawn()?;
        Ok(StreamingSplit {
            cluster,
            coordinator: coordinator.as_ref().clone(),
            consumers,
            local_shuffle,
            _rows: PhantomData,
        })
    }

    /// The consumers' shards, one each, to be sent to them (a Train loop's
    /// configuration) and read there.
    pub fn shards(&self) -> Vec<DataShard<T>> {
        (0..self.consumers)
            .map(|consumer| DataShard {
                coordinator: self.coordinator.clone(),
                consumer,
                epoch: 0,
                local_shuffle: self.local_shuffle,
                _rows: PhantomData,
            })
            .collect()
    }
}

impl<T> Drop for StreamingSplit<T> {
    fn drop(&mut self) {
        let _ = self.cluster.kill(&self.coordinator, true);
    }
}

/// One consumer's part of a streaming split. Each `iter_batches` is one
/// epoch: the blocks this consumer gets of a new run over the dataset.
/// Starting the next epoch gives up what is left of this one to the other
/// consumers, and waits until they have finished it.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct DataShard<T> {
    coordinator: ActorHandle,
    consumer: usize,
    epoch: u64,
    local_shuffle: Option<LocalShuffle>,
    #[serde(skip)]
    _rows: PhantomData<fn() -> T>,
}

impl<T> Clone for DataShard<T> {
    fn clone(&self) -> Self {
        DataShard {
            coordinator: self.coordinator.clone(),
            consumer: self.consumer,
            epoch: self.epoch,
            local_shuffle: self.local_shuffle,
            _rows: PhantomData,
        }
    }
}

impl<T: Row> DataShard<T> {
    /// Which consumer of the split this is.
    pub fn consumer(&self) -> usize {
        self.consumer
    }

    /// This consumer's rows of the next epoch, in batches of `batch_size`
    /// (the last may be shorter), as blocks finish. The batches hold their
    /// own handle on the split, so a train loop may keep them across steps.
    pub fn iter_batches(&mut self, batch_size: usize) -> ShardBatches<T> {
        let epoch = self.epoch;
        self.epoch += 1;
        ShardBatches {
            shard: self.clone(),
            epoch,
            blocks: None,
            batcher: RowBatcher::new(batch_size, self.local_shuffle, epoch),
            ended: false,
        }
    }

    /// The epoch's blocks for this consumer, as the coordinator hands them out.
    fn open_epoch(&self, epoch: u64) -> Result<ObjectRefStream<BlockOutput>, DataError> {
        let coordinator = SplitCoordinatorHandle::from(self.coordinator.clone());
        Ok(coordinator.blocks(self.consumer, epoch)?)
    }
}

/// One epoch's batches of a [`DataShard`].
pub struct ShardBatches<T> {
    shard: DataShard<T>,
    epoch: u64,
    /// The epoch's blocks, opened on the first batch.
    blocks: Option<ObjectRefStream<BlockOutput>>,
    batcher: RowBatcher<T>,
    ended: bool,
}

impl<T: Row> ShardBatches<T> {
    /// Rows left out so far under `OnError::Skip`.
    pub fn skipped(&self) -> &[RowError] {
        self.batcher.skipped()
    }

    /// The next block of the epoch; `None` at its end.
    fn next_block(&mut self) -> Result<Option<BlockOutput>, DataError> {
        let blocks = match &mut self.blocks {
            Some(blocks) => blocks,
            None => self.blocks.insert(self.shard.open_epoch(self.epoch)?),
        };
        match blocks.next() {
            Some(block) => Ok(Some(block?.get()?)),
            None => Ok(None),
        }
    }
}

impl<T: Row> Iterator for ShardBatches<T> {
    type Item = Result<Vec<T>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.ended && self.batcher.wants_more() {
            let added = match self.next_block() {
                Ok(Some(output)) => self.batcher.add(output),
                Ok(None) => {
                    self.ended = true;
                    Ok(())
                }
                Err(e) => {
                    self.ended = true;
                    Err(e)
                }
            };
            if let Err(e) = added {
                return Some(Err(e));
            }
        }
        self.batcher.take().map(Ok)
    }
}
