//! Streaming execution: blocks go to their tasks a bounded number at a
//! time, and finished ones are handed over as they come, so that no more
//! than `max_blocks_in_flight` blocks are ever processed or held at once.

use std::collections::VecDeque;
use std::time::Duration;

use raylet::{Cluster, ObjectRef, TaskErrorKind};

use crate::DataError;
use crate::block::Block;
use crate::progress::Progress;
use crate::registry;
use crate::stage::{OnError, RowError, StageSpec};
use crate::task::{BlockOutput, process_block};

/// How a run uses the cluster.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ExecutionOptions {
    pub max_blocks_in_flight: usize,
    pub num_cpus: f64,
    pub on_error: OnError,
    pub show_progress: bool,
}

/// A run of a plan over its blocks.
pub(crate) struct Execution {
    cluster: Cluster,
    stages: Vec<StageSpec>,
    options: ExecutionOptions,
    waiting: VecDeque<Block>,
    in_flight: Vec<(Block, ObjectRef<BlockOutput>)>,
    progress: Progress,
}

const POLL: Duration = Duration::from_millis(200);

impl Execution {
    /// Checks that every stage's function is registered as its kind, then
    /// gets ready to run `blocks`; `done` are blocks finished before (their
    /// inputs count as done).
    pub fn new(
        cluster: Cluster,
        blocks: Vec<Block>,
        done: &[Block],
        stages: Vec<StageSpec>,
        options: ExecutionOptions,
    ) -> Result<Self, DataError> {
        for stage in &stages {
            let registered =
                registry::find(&stage.function).ok_or_else(|| DataError::NotRegistered(stage.function.clone()))?;
            if registered.kind != stage.kind {
                return Err(DataError::InvalidInput(format!(
                    "{} is registered for {:?} but used for {:?}",
                    stage.function, registered.kind, stage.kind
                )));
            }
        }
        let total = blocks.iter().chain(done).map(Block::inputs).sum();
        let progress = Progress::new(total, options.show_progress);
        progress.skip(done.iter().map(Block::inputs).sum());
        Ok(Execution {
            cluster,
            stages,
            options,
            waiting: blocks.into(),
            in_flight: Vec::new(),
            progress,
        })
    }

    /// The next finished block and its output, in the order they finish;
    /// `None` once every block is done.
    pub fn next_block(&mut self) -> Option<Result<(Block, BlockOutput), DataError>> {
        if let Err(e) = self.submit_ready() {
            return Some(Err(e));
        }
        if self.in_flight.is_empty() {
            self.progress.finish();
            return None;
        }
        let refs: Vec<ObjectRef<BlockOutput>> = self.in_flight.iter().map(|(_, r)| r.clone()).collect();
        let ready = loop {
            let (ready, _) = self.cluster.wait(&refs, 1, Some(POLL));
            if let Some(first) = ready.into_iter().next() {
                break first;
            }
            self.report_in_flight();
        };
        let position = self.in_flight.iter().position(|(_, r)| r.id() == ready.id())?;
        let (block, output) = self.in_flight.swap_remove(position);
        let result = match output.get() {
            Ok(output) => {
                self.progress.block_done(block.inputs(), output.count);
                Ok((block, output))
            }
            Err(e) => Err(block_error(&block, e)),
        };
        self.report_in_flight();
        Some(result)
    }

    fn submit_ready(&mut self) -> Result<(), DataError> {
        while self.in_flight.len() < self.options.max_blocks_in_flight.max(1) {
            let Some(block) = self.waiting.pop_front() else {
                break;
            };
            let output = process_block::options()
                .num_cpus(self.options.num_cpus)
                .remote(
                    &self.cluster,
                    block.input.clone(),
                    self.stages.clone(),
                    self.options.on_error,
                )
                .map_err(|e| block_error(&block, e))?;
            self.in_flight.push((block, output));
        }
        self.report_in_flight();
        Ok(())
    }

    fn report_in_flight(&self) {
        let bytes = self.in_flight.iter().map(|(block, _)| block.bytes).sum();
        self.progress.in_flight(self.in_flight.len(), bytes);
    }
}

/// The error of a block's task: the input a function failed on, when it
/// says, else the block and the cluster's error.
fn block_error(block: &Block, error: raylet::Error) -> DataError {
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
