//! Streaming execution: blocks go to their tasks (or, with a model stage,
//! to an actor pool) a bounded number at a time, and finished ones are
//! handed over as they come, so that no more than `max_blocks_in_flight`
//! blocks are ever processed or held at once.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use raylet::{Cluster, ObjectRef, TaskErrorKind};

use crate::DataError;
use crate::actor_pool::{ActorPool, ModelSpec};
use crate::block::Block;
use crate::block_output::BlockOutput;
use crate::progress::Progress;
use crate::registry;
use crate::stage::{OnError, RowError, StageKind, StageSpec};
use crate::task::{BlockJob, process_block};
use crate::task_sink::TaskSink;

/// How a run uses the cluster.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ExecutionOptions {
    pub max_blocks_in_flight: usize,
    pub num_cpus: f64,
    pub on_error: OnError,
    pub show_progress: bool,
    /// How consumers draw batches from the rows they hold.
    pub local_shuffle: Option<LocalShuffle>,
    /// Whether blocks are handed over in their order (after a sort).
    pub in_order: bool,
}

/// Batches drawn at random from a buffer of at least `buffer_rows` rows
/// (Ray's `local_shuffle_buffer_size`), by `seed` and the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LocalShuffle {
    pub buffer_rows: usize,
    pub seed: u64,
}

/// A run of a plan over its blocks.
pub(crate) struct Execution {
    cluster: Cluster,
    stages: Vec<StageSpec>,
    sink: Option<TaskSink>,
    options: ExecutionOptions,
    pool: Option<ActorPool>,
    waiting: VecDeque<(Block, u32)>,
    in_flight: Vec<InFlight>,
    progress: Progress,
    /// With the blocks handed over in order: where they are.
    in_order: Option<InOrder>,
    memory: MemoryPeaks,
}

/// The most bytes one block's rows took after a step of the run: reading,
/// each transform, and the output as it crossed to the consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageMemory {
    pub step: String,
    pub peak_block_bytes: u64,
}

/// The peaks a run's blocks reported, per step.
struct MemoryPeaks {
    steps: Vec<String>,
    peaks: Vec<u64>,
}

impl MemoryPeaks {
    fn new(stages: &[StageSpec]) -> Self {
        let short = |name: &str| name.rsplit("::").next().unwrap_or(name).to_string();
        let mut steps = vec!["read".to_string()];
        steps.extend(stages.iter().map(|stage| short(&stage.function)));
        steps.push("output".to_string());
        MemoryPeaks {
            peaks: vec![0; steps.len()],
            steps,
        }
    }

    /// A block's bytes after each step, then its output's.
    fn add(&mut self, held: &[u64], output: u64) {
        let last = self.peaks.len() - 1;
        for (peak, bytes) in self.peaks[..last].iter_mut().zip(held) {
            *peak = (*peak).max(*bytes);
        }
        self.peaks[last] = self.peaks[last].max(output);
    }

    fn report(&self) -> Vec<StageMemory> {
        self.steps
            .iter()
            .zip(&self.peaks)
            .map(|(step, peak)| StageMemory {
                step: step.clone(),
                peak_block_bytes: *peak,
            })
            .collect()
    }
}

/// Blocks handed over in order: the indices still to hand over, in order,
/// and the finished blocks that wait for their turn.
struct InOrder {
    order: VecDeque<usize>,
    ready: HashMap<usize, (Block, BlockOutput)>,
}

/// A block being processed: by a task, or by the pool's actor `actor`.
struct InFlight {
    block: Block,
    attempt: u32,
    actor: Option<u64>,
    output: ObjectRef<BlockOutput>,
}

const POLL: Duration = Duration::from_millis(200);
/// How many times a block is sent again after its actor died.
const ACTOR_ATTEMPTS: u32 = 4;

impl Execution {
    /// Checks that every stage's function is registered as its kind, then
    /// gets ready to run `blocks`; `done` are blocks finished before (their
    /// inputs count as done); a `sink` writes each block in its task.
    pub fn new(
        cluster: Cluster,
        blocks: Vec<Block>,
        done: &[Block],
        stages: Vec<StageSpec>,
        model: Option<ModelSpec>,
        sink: Option<TaskSink>,
        options: ExecutionOptions,
    ) -> Result<Self, DataError> {
        let in_order = options.in_order.then(|| InOrder {
            order: blocks.iter().map(|block| block.index).collect(),
            ready: HashMap::new(),
        });
        check_registered(&stages)?;
        let memory = MemoryPeaks::new(&stages);
        let pool = match model {
            Some(model) => Some(ActorPool::start(cluster.clone(), model)?),
            None => None,
        };
        let total = blocks.iter().chain(done).map(Block::inputs).sum();
        let progress = Progress::new(total, options.show_progress);
        progress.skip(done.iter().map(Block::inputs).sum());
        Ok(Execution {
            cluster,
            stages,
            sink,
            options,
            pool,
            waiting: blocks.into_iter().map(|block| (block, 1)).collect(),
            in_flight: Vec::new(),
            progress,
            in_order,
            memory,
        })
    }

    /// The next finished block and its output, in the order they finish
    /// (or, when the run keeps it, in the blocks' order); `None` once every
    /// block is done.
    pub fn next_block(&mut self) -> Option<Result<(Block, BlockOutput), DataError>> {
        if self.in_order.is_none() {
            return self.next_finished();
        }
        loop {
            let in_order = self.in_order.as_mut().expect("kept in order");
            let next = *in_order.order.front()?;
            if let Some(finished) = in_order.ready.remove(&next) {
                in_order.order.pop_front();
                return Some(Ok(finished));
            }
            match self.next_finished()? {
                Ok((block, output)) => {
                    let in_order = self.in_order.as_mut().expect("kept in order");
                    in_order.ready.insert(block.index, (block, output));
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The next block to finish and its output.
    fn next_finished(&mut self) -> Option<Result<(Block, BlockOutput), DataError>> {
        if let Err(e) = self.submit_ready() {
            return Some(Err(e));
        }
        if self.in_flight.is_empty() {
            self.progress.finish();
            return None;
        }
        let refs: Vec<ObjectRef<BlockOutput>> = self.in_flight.iter().map(|f| f.output.clone()).collect();
        let ready = loop {
            let (ready, _) = self.cluster.wait(&refs, 1, Some(POLL));
            if let Some(first) = ready.into_iter().next() {
                break first;
            }
            if let Some(pool) = &mut self.pool {
                pool.shrink_idle();
            }
            self.report_in_flight();
        };
        let position = self.in_flight.iter().position(|f| f.output.id() == ready.id())?;
        let finished = self.in_flight.swap_remove(position);
        let result = finished.output.get();
        if let (Some(pool), Some(actor)) = (&mut self.pool, finished.actor) {
            if actor_died(&result) && finished.attempt < ACTOR_ATTEMPTS {
                tracing::warn!(
                    block = finished.block.index,
                    "the actor of block {} died; sending it again",
                    finished.block.index
                );
                if let Err(e) = pool.lost(actor) {
                    return Some(Err(e));
                }
                self.waiting.push_front((finished.block, finished.attempt + 1));
                return self.next_finished();
            }
            pool.returned(actor);
        }
        let result = match result {
            Ok(output) => {
                self.progress.block_done(finished.block.inputs(), output.count);
                self.memory.add(&output.held, output.rows.bytes());
                Ok((finished.block, output))
            }
            Err(e) => Err(block_error(&finished.block, e)),
        };
        self.report_in_flight();
        Some(result)
    }

    /// The most actors the run's pool had at once (0 without a pool).
    pub fn largest_pool(&self) -> usize {
        self.pool.as_ref().map_or(0, ActorPool::largest)
    }

    /// The most bytes a block's rows took at each step, so far.
    pub fn memory(&self) -> Vec<StageMemory> {
        self.memory.report()
    }

    fn submit_ready(&mut self) -> Result<(), DataError> {
        while self.in_flight.len() < self.options.max_blocks_in_flight.max(1) {
            let Some((block, attempt)) = self.waiting.pop_front() else {
                break;
            };
            let (actor, output) = match &mut self.pool {
                Some(pool) => {
                    let Some(actor) = pool.actor_with_room()? else {
                        self.waiting.push_front((block, attempt));
                        break;
                    };
                    let job = self.job(&block);
                    (Some(actor), self.pool.as_mut().expect("a pool").submit(actor, job))
                }
                None => {
                    let output = process_block::options()
                        .num_cpus(self.options.num_cpus)
                        .remote(&self.cluster, self.job(&block))
                        .map_err(|e| block_error(&block, e))?;
                    (None, output)
                }
            };
            self.in_flight.push(InFlight {
                block,
                attempt,
                actor,
                output,
            });
        }
        self.report_in_flight();
        Ok(())
    }

    fn job(&self, block: &Block) -> BlockJob {
        BlockJob {
            index: block.index,
            input: block.input(),
            stages: block.stages.iter().chain(&self.stages).cloned().collect(),
            on_error: self.options.on_error,
            sink: self.sink.clone(),
        }
    }

    fn report_in_flight(&self) {
        let bytes = self.in_flight.iter().map(|f| f.block.bytes).sum();
        let actors = self.pool.as_ref().map(ActorPool::size);
        self.progress.in_flight(self.in_flight.len(), bytes, actors);
    }
}

/// Checks that every stage's function is registered as its kind.
pub(crate) fn check_registered(stages: &[StageSpec]) -> Result<(), DataError> {
    for stage in stages.iter().filter(|stage| stage.kind != StageKind::Model) {
        let registered = registry::find(&stage.function)?;
        if registered.kind != stage.kind {
            return Err(DataError::InvalidInput(format!(
                "{} is registered for {:?} but used for {:?}",
                stage.function, registered.kind, stage.kind
            )));
        }
    }
    Ok(())
}

/// Whether a call failed because its actor's worker died.
fn actor_died(result: &Result<BlockOutput, raylet::Error>) -> bool {
    matches!(result, Err(raylet::Error::Task(task)) if task.is_actor_death())
}

/// The error of a block's task: the input a function failed on, when it
/// says, else the block and the cluster's error.
pub(crate) fn block_error(block: &Block, error: raylet::Error) -> DataError {
    if let raylet::Error::Task(task) = &error
        && task.kind == TaskErrorKind::Application
        && let Ok(row) = serde_json::from_str::<RowError>(&task.message)
    {
        return DataError::Row {
            function: row.function,
            input: row.source,
            message: row.message,
        };
    }
    DataError::Task {
        block: block.index,
        inputs: block.describe(),
        source: error,
    }
}
