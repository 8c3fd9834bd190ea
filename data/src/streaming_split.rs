//! `streaming_split`: one run of a dataset shared by `n` consumers (the
//! workers of a Train run). A coordinator actor runs the dataset's blocks a
//! bounded number at a time and hands each finished block to whichever
//! consumer asks next, so a faster consumer takes more and every block is
//! read once. Each pass over the shards is an epoch, a new run that starts
//! once every consumer has finished the last one.

use std::marker::PhantomData;
use std::time::Duration;

use raylet::{ActorHandle, Cluster};
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::batching::RowBatcher;
use crate::execution::Execution;
use crate::plan::Plan;
use crate::row::Row;
use crate::stage::RowError;
use crate::task::BlockOutput;

/// How long a consumer that finished an epoch waits before asking again
/// whether the next one can start.
const EPOCH_POLL: Duration = Duration::from_millis(20);

/// What a consumer is answered.
#[derive(Serialize, Deserialize)]
pub(crate) enum SplitReply {
    Block(BlockOutput),
    /// The consumer has every block of this epoch it will get.
    EndOfEpoch,
    /// The next epoch starts once every consumer has finished this one.
    Wait,
}

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

/// The actor that runs a streaming split's epochs.
#[raylet::actor]
pub(crate) struct SplitCoordinator {
    plan: Plan,
    epoch: u64,
    execution: Option<Execution>,
    /// Which consumers have been told the current epoch ended.
    finished: Vec<bool>,
    /// The error that ended the current epoch's run, told to every consumer.
    failure: Option<String>,
}

#[raylet::actor]
impl SplitCoordinator {
    pub fn new(plan: Plan, consumers: usize) -> Self {
        SplitCoordinator {
            plan,
            epoch: 0,
            execution: None,
            finished: vec![false; consumers],
            failure: None,
        }
    }

    /// The next block of `epoch` for `consumer`.
    pub fn next(&mut self, consumer: usize, epoch: u64) -> Result<SplitReply, SplitError> {
        if consumer >= self.finished.len() {
            return Err(SplitError::NoConsumer {
                consumer,
                consumers: self.finished.len(),
            });
        }
        if epoch == self.epoch + 1 {
            // Asking for the next epoch leaves the rest of this one to the others.
            self.finished[consumer] = true;
            if !self.finished.iter().all(|done| *done) {
                return Ok(SplitReply::Wait);
            }
            self.start_epoch(epoch);
        } else if epoch != self.epoch {
            return Err(SplitError::WrongEpoch {
                consumer,
                asked: epoch,
                current: self.epoch,
            });
        }
        if let Some(failure) = &self.failure {
            return Err(SplitError::Failed(failure.clone()));
        }
        if self.finished[consumer] {
            return Ok(SplitReply::EndOfEpoch);
        }
        match self.next_block() {
            Ok(Some(output)) => Ok(SplitReply::Block(output)),
            Ok(None) => {
                self.finished[consumer] = true;
                Ok(SplitReply::EndOfEpoch)
            }
            Err(e) => {
                self.failure = Some(e.to_string());
                Err(SplitError::Failed(e.to_string()))
            }
        }
    }
}

impl SplitCoordinator {
    fn start_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.execution = None;
        self.failure = None;
        self.finished.fill(false);
    }

    fn next_block(&mut self) -> Result<Option<BlockOutput>, DataError> {
        let execution = match &mut self.execution {
            Some(execution) => execution,
            None => self.execution.insert(self.plan.execute(self.plan.blocks()?, &[])?),
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
    _rows: PhantomData<fn() -> T>,
}

impl<T: Row> StreamingSplit<T> {
    pub(crate) fn start(plan: Plan, consumers: usize) -> Result<Self, DataError> {
        let cluster = raylet::current()?;
        let coordinator = SplitCoordinator::remote(&cluster, plan, consumers).spawn()?;
        Ok(StreamingSplit {
            cluster,
            coordinator: coordinator.as_ref().clone(),
            consumers,
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
    #[serde(skip)]
    _rows: PhantomData<fn() -> T>,
}

impl<T> Clone for DataShard<T> {
    fn clone(&self) -> Self {
        DataShard {
            coordinator: self.coordinator.clone(),
            consumer: self.consumer,
            epoch: self.epoch,
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
    /// (the last may be shorter), as blocks finish.
    pub fn iter_batches(&mut self, batch_size: usize) -> ShardBatches<'_, T> {
        let epoch = self.epoch;
        self.epoch += 1;
        ShardBatches {
            shard: self,
            epoch,
            batcher: RowBatcher::new(batch_size),
            ended: false,
        }
    }

    fn next_reply(&self, epoch: u64) -> Result<SplitReply, DataError> {
        let coordinator = SplitCoordinatorHandle::from(self.coordinator.clone());
        loop {
            match coordinator.next(self.consumer, epoch).get()? {
                SplitReply::Wait => std::thread::sleep(EPOCH_POLL),
                reply => return Ok(reply),
            }
        }
    }
}

/// One epoch's batches of a [`DataShard`].
pub struct ShardBatches<'a, T> {
    shard: &'a DataShard<T>,
    epoch: u64,
    batcher: RowBatcher<T>,
    ended: bool,
}

impl<T: Row> ShardBatches<'_, T> {
    /// Rows left out so far under `OnError::Skip`.
    pub fn skipped(&self) -> &[RowError] {
        self.batcher.skipped()
    }
}

impl<T: Row> Iterator for ShardBatches<'_, T> {
    type Item = Result<Vec<T>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.ended && self.batcher.wants_more() {
            let added = match self.shard.next_reply(self.epoch) {
                Ok(SplitReply::Block(output)) => self.batcher.add(output),
                Ok(_) => {
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
