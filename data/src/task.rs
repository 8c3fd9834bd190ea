//! The task that processes one block: it reads the block's files, row
//! groups or items, runs every stage of the plan over the rows in order,
//! and returns them encoded (or writes them, when the run has a sink that
//! writes in tasks), with the rows it left out.

use arrow::array::RecordBatch;
use bytes::Bytes;
use raylet::ObjectRef;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::block::{BlockInput, FileBytes, ReadKind, TextLine};
use crate::block_output::{BlockOutput, RowPayload};
use crate::columnar;
use crate::csv_source;
use crate::encoded_rows::EncodedRows;
use crate::exchange::{self, Partitioner, Reducer};
use crate::image_source;
use crate::model_registry::LoadedModel;
#[cfg(feature = "parquet")]
use crate::parquet_source;
use crate::registry::{self, BlockRows, RowData};
use crate::rows_error::RowsError;
use crate::source_error::SourceError;
use crate::stage::{OnError, RowError, RowFailure, StageKind, StageRun, StageSpec};
use crate::task_sink::TaskSink;
use raylet_storage::{self as storage, StorageOptions};

/// Everything a block's task (or actor call) is given.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockJob {
    pub index: usize,
    pub input: BlockInput,
    pub stages: Vec<StageSpec>,
    pub on_error: OnError,
    /// Where the task writes the block's rows instead of returning them.
    pub sink: Option<TaskSink>,
}

/// Why a block's task (or actor call) failed. Its text is what reaches the
/// driver: a failure on an input travels as the JSON of its [`RowError`],
/// which the driver reads back to say which input and function failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BlockError {
    #[error("{}", row_json(.0))]
    Failed(RowError),
    #[error("{0} needs an actor pool")]
    NeedsActorPool(String),
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error("this sink writes Arrow rows, and the block's are typed")]
    TypedRowsForArrowSink,
    #[error(transparent)]
    Rows(#[from] RowsError),
}

/// A failure on an input as the driver reads it back.
fn row_json(row: &RowError) -> String {
    serde_json::to_string(row).unwrap_or_else(|_| row.message.clone())
}

/// Runs the job's stages over its block in a task. A failure names the
/// input, so the driver can say which file failed.
#[raylet::remote]
pub(crate) fn process_block(job: BlockJob) -> Result<BlockOutput, BlockError> {
    run_stages(&job, None)
}

/// Runs the job's stages over its block and splits the rows into one part
/// per output block of an all-to-all step: the generator's items, in order.
#[raylet::remote(streaming, generator_backpressure = 65536)]
pub(crate) fn partition_block(
    job: BlockJob,
    partitioner: Partitioner,
) -> impl Iterator<Item = Result<BlockOutput, BlockError>> {
    let parts = BlockRun::new(&job).partitions(&partitioner);
    let items: Vec<Result<BlockOutput, BlockError>> = match parts {
        Ok(parts) => parts.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e)],
    };
    items.into_iter()
}

/// Keys of the sort column sampled from each block.
const SAMPLED_KEYS: usize = 1024;

/// What the driver learns of a block kept in the object store: its rows,
/// and a sample of a column's keys (an Arrow IPC stream of one column;
/// empty when none was asked for).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockSummary {
    pub rows: u64,
    pub sample: ByteBuf,
}

/// Runs the job's stages over its block and returns the rows (to stay in
/// the object store) and their summary (for the driver), with a sample of
/// the keys of `sample_column` from which a sort's ranges are chosen.
#[raylet::remote(num_returns = 2)]
pub(crate) fn materialize_block(
    job: BlockJob,
    sample_column: Option<String>,
) -> Result<(BlockOutput, BlockSummary), BlockError> {
    let run = BlockRun::new(&job);
    let processed = run.rows(None)?;
    let sample = match &sample_column {
        None => Vec::new(),
        Some(column) => {
            let keys =
                exchange::sample_keys(&processed.rows.data, column, SAMPLED_KEYS).map_err(|e| run.fatal_message(e))?;
            let keys =
                RecordBatch::try_from_iter([("key", keys)]).map_err(RowsError::arrow("a batch of sampled keys"))?;
            columnar::encode_ipc(&[keys])?
        }
    };
    let output = run.output(processed)?;
    let summary = BlockSummary {
        rows: output.count,
        sample: ByteBuf::from(sample),
    };
    Ok((output, summary))
}

/// Reads the block and runs the job's stages over its rows; a `Model`
/// stage runs `model` (an actor's).
pub(crate) fn run_stages(job: &BlockJob, model: Option<&mut dyn LoadedModel>) -> Result<BlockOutput, BlockError> {
    let run = BlockRun::new(job);
    let processed = run.rows(model)?;
    run.output(processed)
}

/// One block's job in a task, and what its inputs are called in errors.
struct BlockRun<'a> {
    job: &'a BlockJob,
    sources: Vec<String>,
}

impl<'a> BlockRun<'a> {
    fn new(job: &'a BlockJob) -> Self {
        BlockRun {
            sources: sources(&job.input),
            job,
        }
    }

    /// The rows a failure was about, as errors naming their inputs.
    fn named(&self, failure: RowFailure) -> Vec<RowError> {
        let names: Vec<String> = match failure.origins.is_empty() {
            true => vec![describe_all(&self.sources)],
            false => failure
                .origins
                .iter()
                .map(|o| self.sources[*o as usize].clone())
                .collect(),
        };
        names
            .into_iter()
            .map(|source| RowError {
                function: failure.function.clone(),
                source,
                message: failure.message.clone(),
            })
            .collect()
    }

    /// The task's error for a failure that ends the block.
    fn fatal(&self, failure: RowFailure) -> BlockError {
        let first = self
            .named(failure)
            .into_iter()
            .next()
            .expect("a failure names an input");
        BlockError::Failed(first)
    }

    /// The task's error for a failure of the whole block after its stages.
    fn fatal_message(&self, error: impl std::fmt::Display) -> BlockError {
        self.fatal(whole_block(&self.job.stages, error.to_string()))
    }

    /// The block's rows after every stage, the rows left out, and the
    /// bytes the rows took after reading and after each stage.
    fn rows(&self, mut model: Option<&mut dyn LoadedModel>) -> Result<Processed, BlockError> {
        let (input, on_error) = (&self.job.input, self.job.on_error);
        let mut reading = StageRun::reading(reader(input), on_error);
        let (mut rows, mut skipped) = read(input, &mut reading).map_err(|f| self.fatal(f))?;
        skipped.extend(reading.skipped.into_iter().flat_map(|f| self.named(f)));
        let mut held = vec![rows.data.bytes()];
        for stage in &self.job.stages {
            let mut run = StageRun::new(stage, on_error);
            rows = match (stage.kind, model.as_deref_mut()) {
                (StageKind::Model, Some(model)) => model.apply(&rows, &mut run),
                (StageKind::Model, None) => return Err(BlockError::NeedsActorPool(stage.function.clone())),
                _ => (registry::find(&stage.function)?.apply)(&rows, &mut run),
            }
            .map_err(|f| self.fatal(f))?;
            skipped.extend(run.skipped.into_iter().flat_map(|f| self.named(f)));
            held.push(rows.data.bytes());
        }
        Ok(Processed { rows, skipped, held })
    }

    /// The block's output: its rows, or the files its sink wrote them to.
    fn output(&self, processed: Processed) -> Result<BlockOutput, BlockError> {
        let Processed { rows, skipped, held } = processed;
        let count = rows.origins.len() as u64;
        let (rows, files) = match (rows.data, &self.job.sink) {
            (RowData::Arrow(batches), Some(sink)) => {
                let files = sink
                    .write(self.job.index, &batches)
                    .map_err(|e| self.fatal_message(e))?;
                (RowPayload::Arrow(raylet::SharedBytes::new()), files)
            }
            (RowData::Encoded(_), Some(_)) => {
                return Err(BlockError::TypedRowsForArrowSink);
            }
            (data, None) => (RowPayload::of(data).map_err(|e| self.fatal_message(e))?, Vec::new()),
        };
        Ok(BlockOutput {
            count,
            rows,
            skipped,
            files,
            held,
        })
    }

    /// The block's rows after every stage, split into parts; the first
    /// part carries the rows left out.
    fn partitions(&self, partitioner: &Partitioner) -> Result<Vec<BlockOutput>, BlockError> {
        let Processed {
            rows,
            mut skipped,
            mut held,
        } = self.rows(None)?;
        let parts = partitioner
            .split(&rows.data, self.job.index)
            .map_err(|e| self.fatal_message(e))?;
        parts
            .into_iter()
            .map(|data| {
                Ok(BlockOutput {
                    count: data.len() as u64,
                    rows: RowPayload::of(data).map_err(|e| self.fatal_message(e))?,
                    skipped: std::mem::take(&mut skipped),
                    files: Vec::new(),
                    held: std::mem::take(&mut held),
                })
            })
            .collect()
    }
}

/// A block's rows after its stages, the rows left out, and the bytes the
/// rows took after reading and after each stage.
struct Processed {
    rows: BlockRows,
    skipped: Vec<RowError>,
    held: Vec<u64>,
}

/// A failure of the whole block after its last stage.
fn whole_block(stages: &[StageSpec], message: String) -> RowFailure {
    RowFailure {
        function: stages
            .last()
            .map_or("write", |stage| stage.function.as_str())
            .to_string(),
        origins: Vec::new(),
        message,
    }
}

/// What each input of the block is called in errors.
fn sources(input: &BlockInput) -> Vec<String> {
    match input {
        BlockInput::Files { paths, .. } => paths.clone(),
        #[cfg(feature = "parquet")]
        BlockInput::Parquet { groups, .. } => vec![groups.describe()],
        BlockInput::Items { rows, first } => (*first..first + rows.len() as u64)
            .map(|i| format!("item {i}"))
            .collect(),
        BlockInput::Exchanged { block, .. } => vec![format!("block {block} of an all-to-all step")],
    }
}

fn describe_all(sources: &[String]) -> String {
    match sources {
        [one] => one.clone(),
        [first, .., last] => format!("the block of {first} .. {last}"),
        [] => "an empty block".into(),
    }
}

/// What errors call the step that makes a block's first rows.
fn reader(input: &BlockInput) -> &'static str {
    match input {
        BlockInput::Items { .. } => "from_items",
        #[cfg(feature = "parquet")]
        BlockInput::Parquet { .. } => "read_parquet",
        BlockInput::Exchanged { .. } => "exchange",
        BlockInput::Files {
            read: ReadKind::Binary, ..
        } => "read_binary",
        BlockInput::Files {
            read: ReadKind::Text, ..
        } => "read_text",
        BlockInput::Files {
            read: ReadKind::Csv(_), ..
        } => "read_csv",
        BlockInput::Files {
            read: ReadKind::Images(_),
            ..
        } => "read_images",
    }
}

/// The block's rows before any stage, and the rows its inputs had left
/// out. Files that cannot be read fail the block, or with
/// [`OnError::Skip`] are left out and recorded in `run`.
fn read(input: &BlockInput, run: &mut StageRun) -> Result<(BlockRows, Vec<RowError>), RowFailure> {
    match input {
        BlockInput::Exchanged { parts, reducer, block } => merge_parts(parts, reducer, *block, run),
        _ => Ok((read_inputs(input, run)?, Vec::new())),
    }
}

/// An all-to-all step's output block: its part of every input block, merged.
fn merge_parts(
    parts: &[ObjectRef<BlockOutput>],
    reducer: &Reducer,
    block: usize,
    run: &mut StageRun,
) -> Result<(BlockRows, Vec<RowError>), RowFailure> {
    let (mut data, mut skipped) = (Vec::with_capacity(parts.len()), Vec::new());
    for part in parts {
        let part = part
            .get()
            .map_err(|e| run.block_failure(format_args!("reading a part: {e}")))?;
        skipped.extend(part.skipped);
        data.push(part.rows.into_data().map_err(|e| run.block_failure(e))?);
    }
    let merged = reducer.reduce(data, block, run).map_err(|e| run.block_failure(e))?;
    let rows = BlockRows {
        origins: vec![0; merged.len()],
        data: merged,
    };
    Ok((rows, skipped))
}

fn read_inputs(input: &BlockInput, run: &mut StageRun) -> Result<BlockRows, RowFailure> {
    match input {
        BlockInput::Exchanged { .. } => unreachable!("merged by read"),
        BlockInput::Items { rows, .. } => Ok(BlockRows {
            origins: (0..rows.len() as u32).collect(),
            data: RowData::Encoded(rows.clone()),
        }),
        BlockInput::Files { paths, read, storage } => match read {
            ReadKind::Binary => typed_rows(read_each(paths, storage, run, read_binary)?, run),
            ReadKind::Text => typed_rows(read_each(paths, storage, run, read_lines)?, run),
            ReadKind::Images(options) => {
                let decode = |path: &str, bytes: Bytes| image_source::decode(path, &bytes, options).map(|i| vec![i]);
                typed_rows(read_each(paths, storage, run, decode)?, run)
            }
            ReadKind::Csv(options) => {
                let parse = |_: &str, bytes: Bytes| csv_source::read_file(bytes, options);
                Ok(arrow_rows(read_each(paths, storage, run, parse)?))
            }
        },
        #[cfg(feature = "parquet")]
        BlockInput::Parquet {
            groups,
            options,
            storage,
        } => match parquet_source::read_groups(groups, options, storage) {
            Ok(batches) => Ok(arrow_rows(vec![(0, batches)])),
            Err(e) => {
                run.fail(&[0], e)?;
                Ok(arrow_rows(Vec::new()))
            }
        },
    }
}

/// Each file's rows, by its index in the block, as `read_one` makes them
/// of its bytes; a file that cannot be read or made rows of fails the
/// block, or (with [`OnError::Skip`]) is left out and recorded in `run`.
fn read_each<T>(
    paths: &[String],
    storage: &StorageOptions,
    run: &mut StageRun,
    read_one: impl Fn(&str, Bytes) -> Result<Vec<T>, SourceError>,
) -> Result<Vec<(u32, Vec<T>)>, RowFailure> {
    let mut files = Vec::with_capacity(paths.len());
    for (origin, path) in paths.iter().enumerate() {
        let rows = storage::open_file(path, storage)
            .and_then(|(storage, name)| storage.read(&name))
            .map_err(SourceError::from)
            .and_then(|bytes| read_one(path, bytes));
        match rows {
            Ok(rows) => files.push((origin as u32, rows)),
            Err(e) => run.fail(&[origin as u32], e)?,
        }
    }
    Ok(files)
}

/// Typed rows of files, encoded, each with its file's origin.
fn typed_rows<T: Serialize>(files: Vec<(u32, Vec<T>)>, run: &StageRun) -> Result<BlockRows, RowFailure> {
    let (mut rows, mut origins) = (Vec::new(), Vec::new());
    for (origin, file_rows) in files {
        origins.extend(std::iter::repeat_n(origin, file_rows.len()));
        rows.extend(file_rows);
    }
    let rows = EncodedRows::encode(&rows).map_err(|e| run.block_failure(e))?;
    Ok(BlockRows {
        data: RowData::Encoded(rows),
        origins,
    })
}

/// Record batches of files, each row with its file's origin.
fn arrow_rows(files: Vec<(u32, Vec<RecordBatch>)>) -> BlockRows {
    let (mut batches, mut origins) = (Vec::new(), Vec::new());
    for (origin, file_batches) in files {
        for batch in file_batches {
            origins.extend(std::iter::repeat_n(origin, batch.num_rows()));
            batches.push(batch);
        }
    }
    BlockRows {
        data: RowData::Arrow(batches),
        origins,
    }
}

fn read_binary(path: &str, bytes: Bytes) -> Result<Vec<FileBytes>, SourceError> {
    Ok(vec![FileBytes {
        path: path.to_string(),
        bytes: Vec::from(bytes),
    }])
}

fn read_lines(path: &str, bytes: Bytes) -> Result<Vec<TextLine>, SourceError> {
    let text = std::str::from_utf8(&bytes)?;
    Ok(text
        .lines()
        .enumerate()
        .map(|(index, line)| TextLine {
            path: path.to_string(),
            line: index as u64 + 1,
            text: line.to_string(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_on_an_input_reaches_the_driver_as_its_row_error() {
        let row = RowError {
            function: "parse".into(),
            source: "inputs/a.txt".into(),
            message: "bad \"digit\" on line 2".into(),
        };
        let text = BlockError::Failed(row.clone()).to_string();
        assert_eq!(serde_json::from_str::<RowError>(&text).ok(), Some(row));
        let other = BlockError::NeedsActorPool("classify".into()).to_string();
        assert_eq!(other, "classify needs an actor pool");
        assert!(serde_json::from_str::<RowError>(&other).is_err());
    }
}
