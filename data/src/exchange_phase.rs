//! Running an all-to-all step from the driver: its input blocks go through
//! the transforms before it and are split into parts by their tasks (a
//! bounded number at a time, as any run), and the step's output blocks are
//! made of the parts, ready for the plan's next transforms. A sort first
//! keeps its inputs in the object store with a sample of their keys, from
//! which it chooses the ranges of its output blocks; a limit keeps its
//! inputs in order until it has its rows; a zip keeps both sides' blocks
//! and pairs their rows by position.

use std::collections::VecDeque;

use raylet::{Cluster, ObjectRef, ObjectRefStream};

use crate::DataError;
use crate::block::{self, Block, BlockInput};
use crate::block_output::BlockOutput;
use crate::columnar;
use crate::exchange::{self, Exchange, Partitioner, Reducer};
use crate::execution::{ExecutionOptions, block_error};
use crate::progress::Progress;
use crate::stage::StageSpec;
use crate::task::{BlockJob, BlockSummary, materialize_block, partition_block};

/// Runs `blocks` through `stages` into `exchange`, returning its output blocks.
/// `epoch` is the pass over the data (a streaming split's), and `upstream`
/// identifies what the input blocks are made of.
pub(crate) fn run(
    blocks: Vec<Block>,
    stages: &[StageSpec],
    exchange: &Exchange,
    (options, epoch, upstream): (&ExecutionOptions, u64, u64),
) -> Result<Vec<Block>, DataError> {
    let cluster = raylet::current()?;
    let jobs = jobs_of(blocks, stages, options);
    if let Exchange::Limit { rows } = exchange {
        return limited(&cluster, jobs, *rows, options, upstream);
    }
    let outputs = match exchange {
        Exchange::Repartition { blocks } => *blocks,
        _ => jobs.len(),
    }
    .max(1);
    let (partitioner, jobs) = match exchange {
        Exchange::Limit { .. } => unreachable!("limited above"),
        Exchange::RandomShuffle { seed } => (
            Partitioner::Random {
                seed: exchange::mix(*seed, epoch),
                parts: outputs,
            },
            jobs,
        ),
        Exchange::Repartition { .. } => (Partitioner::RoundRobin { parts: outputs }, jobs),
        Exchange::GroupBy { key, .. } => (
            Partitioner::Hash {
                column: key.clone(),
                parts: outputs,
            },
            jobs,
        ),
        Exchange::Sort { column, descending } => {
            sorted_ranges(&cluster, jobs, (column, *descending), outputs, options)?
        }
    };
    let parts = split_all(&cluster, jobs, &partitioner, options)?;
    Ok(block::exchanged_blocks(parts, &exchange.reducer(epoch), upstream))
}

/// Each block's job: its own transforms, then `stages`.
pub(crate) fn jobs_of(blocks: Vec<Block>, stages: &[StageSpec], options: &ExecutionOptions) -> Vec<(Block, BlockJob)> {
    blocks
        .into_iter()
        .map(|block| {
            let job = BlockJob {
                index: block.index,
                input: block.input(),
                stages: block.stages.iter().chain(stages).cloned().collect(),
                on_error: options.on_error,
                sink: None,
            };
            (block, job)
        })
        .collect()
}

/// A job that reads a block kept in the object store, as it is.
fn kept_job(block: &Block, rows: ObjectRef<BlockOutput>, options: &ExecutionOptions) -> BlockJob {
    BlockJob {
        index: block.index,
        input: BlockInput::Exchanged {
            parts: vec![rows],
            reducer: Reducer::Concat,
            block: block.index,
        },
        stages: Vec::new(),
        on_error: options.on_error,
        sink: None,
    }
}

/// Runs every job with a sample of `column`'s keys, then returns the range
/// partitioner the samples give and jobs that split the kept blocks.
fn sorted_ranges(
    cluster: &Cluster,
    jobs: Vec<(Block, BlockJob)>,
    (column, descending): (&str, bool),
    outputs: usize,
    options: &ExecutionOptions,
) -> Result<(Partitioner, Vec<(Block, BlockJob)>), DataError> {
    let kept = keep_all(cluster, jobs, Some(column), None, options)?;
    let samples = kept
        .iter()
        .map(|(_, _, summary)| {
            columnar::decode_ipc(summary.sample.to_vec()).map(|batches| batches.first().map(|b| b.column(0).clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let boundaries = exchange::boundaries(samples.into_iter().flatten().collect(), outputs, descending)?;
    let partitioner = Partitioner::Range {
        column: column.to_string(),
        descending,
        boundaries,
    };
    let jobs = kept
        .into_iter()
        .map(|(block, rows, _)| {
            let job = kept_job(&block, rows, options);
            (block, job)
        })
        .collect();
    Ok((partitioner, jobs))
}

/// The first `rows` rows: blocks run in order until they hold them, each
/// kept block then taking its share.
fn limited(
    cluster: &Cluster,
    jobs: Vec<(Block, BlockJob)>,
    rows: u64,
    options: &ExecutionOptions,
    upstream: u64,
) -> Result<Vec<Block>, DataError> {
    let kept = keep_all(cluster, jobs, None, Some(rows), options)?;
    let mut left = rows;
    let merges: Vec<(Vec<ObjectRef<BlockOutput>>, Reducer)> = kept
        .into_iter()
        .map(|(_, output, summary)| {
            let take = summary.rows.min(left);
            left -= take;
            (vec![output], Reducer::Take { rows: take as usize })
        })
        .collect();
    Ok(block::merged_blocks(merges, upstream))
}

/// Each output block of `left` beside the same rows of `right`, which must
/// have as many: both sides' blocks are kept in the object store, and
/// output block `i` reads left block `i` and the ranges of right blocks
/// that hold the same rows.
pub(crate) fn zipped(
    left: Vec<(Block, BlockJob)>,
    right: Vec<(Block, BlockJob)>,
    options: &ExecutionOptions,
    upstream: u64,
) -> Result<Vec<Block>, DataError> {
    let cluster = raylet::current()?;
    let left = keep_all(&cluster, left, None, None, options)?;
    let right = keep_all(&cluster, right, None, None, options)?;
    let count = |side: &[Kept]| side.iter().map(|(_, _, summary)| summary.rows).sum::<u64>();
    if count(&left) != count(&right) {
        return Err(DataError::InvalidInput(format!(
            "zip needs datasets of as many rows: {} and {}",
            count(&left),
            count(&right)
        )));
    }
    let mut right_starts = Vec::with_capacity(right.len());
    let mut start = 0;
    for (_, _, summary) in &right {
        right_starts.push(start);
        start += summary.rows;
    }
    let (mut merges, mut first_row) = (Vec::with_capacity(left.len()), 0u64);
    for (_, output, summary) in left {
        let end = first_row + summary.rows;
        let (mut parts, mut ranges) = (vec![output], Vec::new());
        for ((_, rows, part), part_start) in right.iter().zip(&right_starts) {
            let (from, to) = (first_row.max(*part_start), end.min(part_start + part.rows));
            if from < to {
                parts.push(rows.clone());
                ranges.push(((from - part_start) as usize, (to - from) as usize));
            }
        }
        merges.push((parts, Reducer::Zip { ranges }));
        first_row = end;
    }
    Ok(block::merged_blocks(merges, upstream))
}

/// A block kept in the object store, with what the driver knows of it.
type Kept = (Block, ObjectRef<BlockOutput>, BlockSummary);

/// Runs the jobs (a bounded number at a time, in order) keeping each
/// block's rows in the object store, with a sample of `sample_column`'s
/// keys; with `enough` rows, stops running blocks once those before hold
/// that many.
fn keep_all(
    cluster: &Cluster,
    jobs: Vec<(Block, BlockJob)>,
    sample_column: Option<&str>,
    enough: Option<u64>,
    options: &ExecutionOptions,
) -> Result<Vec<Kept>, DataError> {
    let mut progress = Progress::new(jobs.len() as u64, options.show_progress);
    let (mut kept, mut in_flight, mut rows) = (Vec::with_capacity(jobs.len()), VecDeque::new(), 0u64);
    let mut jobs = jobs.into_iter();
    while enough.is_none_or(|enough| rows < enough) {
        while in_flight.len() < options.max_blocks_in_flight.max(1)
            && let Some((block, job)) = jobs.next()
        {
            let refs = materialize_block::options()
                .num_cpus(options.num_cpus)
                .remote(cluster, job, sample_column.map(str::to_string))
                .map_err(|e| block_error(&block, e))?;
            in_flight.push_back((block, refs));
        }
        let Some((block, (output, summary))) = in_flight.pop_front() else {
            break;
        };
        let summary = summary.get().map_err(|e| block_error(&block, e))?;
        progress.block_done(block.inputs(), summary.rows);
        rows += summary.rows;
        kept.push((block, output, summary));
    }
    progress.finish();
    Ok(kept)
}

/// Splits every job's block into parts, a bounded number of blocks at a
/// time; returns each input block's parts, in order.
fn split_all(
    cluster: &Cluster,
    jobs: Vec<(Block, BlockJob)>,
    partitioner: &Partitioner,
    options: &ExecutionOptions,
) -> Result<Vec<Vec<ObjectRef<BlockOutput>>>, DataError> {
    let parts = partitioner.parts()?;
    let mut progress = Progress::new(jobs.len() as u64, options.show_progress);
    let (mut split, mut in_flight) = (Vec::with_capacity(jobs.len()), VecDeque::new());
    for (block, job) in jobs {
        let stream = partition_block::options()
            .num_cpus(options.num_cpus)
            .remote(cluster, job, partitioner.clone())
            .map_err(|e| block_error(&block, e))?;
        in_flight.push_back((block, stream));
        if in_flight.len() >= options.max_blocks_in_flight {
            let (block, stream) = in_flight.pop_front().expect("one in flight");
            split.push(collect_parts(&block, stream, parts, &mut progress)?);
        }
    }
    while let Some((block, stream)) = in_flight.pop_front() {
        split.push(collect_parts(&block, stream, parts, &mut progress)?);
    }
    progress.finish();
    Ok(split)
}

/// The parts a block's task yields, once it has yielded all `parts`.
fn collect_parts(
    block: &Block,
    stream: ObjectRefStream<BlockOutput>,
    parts: usize,
    progress: &mut Progress,
) -> Result<Vec<ObjectRef<BlockOutput>>, DataError> {
    let refs = stream
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| block_error(block, e))?;
    if refs.len() != parts {
        return Err(DataError::InvalidInput(format!(
            "block {} was split into {} parts, not {parts}",
            block.index,
            refs.len()
        )));
    }
    progress.block_done(block.inputs(), 0);
    Ok(refs)
}
