//! Running an all-to-all step from the driver: its input blocks go through
//! the transforms before it and are split into parts by their tasks (a
//! bounded number at a time, as any run), and the step's output blocks are
//! made of the parts, ready for the plan's next transforms. A sort first
//! runs its inputs with a sample of their keys, from which it chooses the
//! ranges of its output blocks.

use std::collections::VecDeque;

use raylet::{Cluster, ObjectRef, ObjectRefStream};
use serde_bytes::ByteBuf;

use crate::DataError;
use crate::block::{self, Block, BlockInput};
use crate::block_output::BlockOutput;
use crate::columnar;
use crate::exchange::{self, Exchange, Partitioner, Reducer};
use crate::execution::{ExecutionOptions, block_error};
use crate::progress::Progress;
use crate::stage::StageSpec;
use crate::task::{BlockJob, partition_block, sample_block};

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
    let outputs = match exchange {
        Exchange::Repartition { blocks } => *blocks,
        _ => blocks.len(),
    }
    .max(1);
    let jobs: Vec<(Block, BlockJob)> = blocks
        .into_iter()
        .map(|block| {
            let job = BlockJob {
                index: block.index,
                input: block.input(),
                stages: stages.to_vec(),
                on_error: options.on_error,
                sink: None,
            };
            (block, job)
        })
        .collect();
    let (partitioner, jobs) = match exchange {
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

/// Runs every job with a sample of `column`'s keys, then returns the range
/// partitioner the samples give and jobs that split the finished blocks.
fn sorted_ranges(
    cluster: &Cluster,
    jobs: Vec<(Block, BlockJob)>,
    (column, descending): (&str, bool),
    outputs: usize,
    options: &ExecutionOptions,
) -> Result<(Partitioner, Vec<(Block, BlockJob)>), DataError> {
    let mut progress = Progress::new(jobs.len() as u64, options.show_progress);
    let mut sampled = Vec::with_capacity(jobs.len());
    let mut in_flight = VecDeque::new();
    for (block, job) in jobs {
        let refs = sample_block::options()
            .num_cpus(options.num_cpus)
            .remote(cluster, job, column.to_string())
            .map_err(|e| block_error(&block, e))?;
        in_flight.push_back((block, refs));
        if in_flight.len() >= options.max_blocks_in_flight {
            sampled.push(finish_sample(
                in_flight.pop_front().expect("one in flight"),
                &mut progress,
            )?);
        }
    }
    while let Some(next) = in_flight.pop_front() {
        sampled.push(finish_sample(next, &mut progress)?);
    }
    progress.finish();
    let samples = sampled
        .iter()
        .map(|(_, _, sample)| columnar::decode_ipc(sample).map(|batches| batches[0].column(0).clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(DataError::InvalidInput)?;
    let boundaries = exchange::boundaries(samples, outputs, descending).map_err(DataError::InvalidInput)?;
    let partitioner = Partitioner::Range {
        column: column.to_string(),
        descending,
        boundaries,
    };
    let jobs = sampled
        .into_iter()
        .map(|(block, rows, _)| {
            let job = BlockJob {
                index: block.index,
                input: BlockInput::Exchanged {
                    parts: vec![rows],
                    reducer: Reducer::Concat,
                    block: block.index,
                },
                stages: Vec::new(),
                on_error: options.on_error,
                sink: None,
            };
            (block, job)
        })
        .collect();
    Ok((partitioner, jobs))
}

type SampleRefs = (ObjectRef<BlockOutput>, ObjectRef<ByteBuf>);

fn finish_sample(
    (block, (rows, sample)): (Block, SampleRefs),
    progress: &mut Progress,
) -> Result<(Block, ObjectRef<BlockOutput>, ByteBuf), DataError> {
    let sample = sample.get().map_err(|e| block_error(&block, e))?;
    progress.block_done(block.inputs(), 0);
    Ok((block, rows, sample))
}

/// Splits every job's block into parts, a bounded number of blocks at a
/// time; returns each input block's parts, in order.
fn split_all(
    cluster: &Cluster,
    jobs: Vec<(Block, BlockJob)>,
    partitioner: &Partitioner,
    options: &ExecutionOptions,
) -> Result<Vec<Vec<ObjectRef<BlockOutput>>>, DataError> {
    let parts = partitioner.parts().map_err(DataError::InvalidInput)?;
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
