//! The task that processes one block: it reads the block's files, row
//! groups or items, runs every stage of the plan over the rows in order,
//! and returns them encoded (or writes them, when the run has a sink that
//! writes in tasks), with the rows it left out.

use arrow::array::RecordBatch;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::DataError;
use crate::block::{BlockInput, FileBytes, ReadKind, TextLine};
use crate::columnar;
use crate::csv_source;
use crate::image_source;
use crate::model_registry::LoadedModel;
use crate::parquet_source;
use crate::registry::{self, BlockRows, RowData};
use crate::stage::{OnError, RowError, RowFailure, StageKind, StageRun, StageSpec};
use crate::storage::{self, StorageOptions};
use crate::task_sink::TaskSink;

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

/// How a block's rows are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RowEncoding {
    /// A postcard list of the plan's output type.
    Postcard,
    /// An Arrow IPC stream.
    ArrowIpc,
}

/// A processed block: its rows (or the files a sink wrote them to) and
/// the rows left out under [`OnError::Skip`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockOutput {
    pub rows: ByteBuf,
    pub encoding: RowEncoding,
    pub count: u64,
    pub skipped: Vec<RowError>,
    /// The files a sink wrote, relative to its location.
    pub files: Vec<String>,
}

impl BlockOutput {
    /// The rows, as the plan's output type.
    pub fn decode_rows<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, DataError> {
        let rows = match self.encoding {
            RowEncoding::Postcard => raylet::proto::codec::decode(&self.rows).map_err(|e| e.to_string()),
            RowEncoding::ArrowIpc => columnar::decode_ipc(&self.rows).and_then(|b| columnar::batches_to_rows(&b)),
        };
        rows.map_err(|e| DataError::InvalidInput(format!("decoding a block's rows: {e}")))
    }

    /// The rows as Arrow record batches.
    pub fn decode_batches(&self) -> Result<Vec<RecordBatch>, DataError> {
        match self.encoding {
            RowEncoding::ArrowIpc => columnar::decode_ipc(&self.rows).map_err(DataError::InvalidInput),
            RowEncoding::Postcard => Err(DataError::InvalidInput(
                "a block of typed rows was read as Arrow batches".into(),
            )),
        }
    }
}

/// Runs the job's stages over its block in a task. A failure is a JSON
/// [`RowError`] naming the input, so the driver can say which file failed.
#[raylet::remote]
pub(crate) fn process_block(job: BlockJob) -> Result<BlockOutput, String> {
    run_stages(&job, None)
}

/// Reads the block and runs the job's stages over its rows; a `Model`
/// stage runs `model` (an actor's).
pub(crate) fn run_stages(job: &BlockJob, mut model: Option<&mut dyn LoadedModel>) -> Result<BlockOutput, String> {
    let (input, on_error) = (&job.input, job.on_error);
    let sources = sources(input);
    let named = |failure: RowFailure| -> Vec<RowError> {
        let names: Vec<String> = match failure.origins.is_empty() {
            true => vec![describe_all(&sources)],
            false => failure.origins.iter().map(|o| sources[*o as usize].clone()).collect(),
        };
        names
            .into_iter()
            .map(|source| RowError {
                function: failure.function.clone(),
                source,
                message: failure.message.clone(),
            })
            .collect()
    };
    let fatal = |failure: RowFailure| -> String {
        let first = named(failure).into_iter().next().expect("a failure names an input");
        serde_json::to_string(&first).expect("a RowError is JSON")
    };
    let mut reading = StageRun::reading(reader(input), on_error);
    let mut rows = read(input, &mut reading).map_err(fatal)?;
    let mut skipped: Vec<RowError> = reading.skipped.into_iter().flat_map(named).collect();
    for stage in &job.stages {
        let mut run = StageRun::new(stage, on_error);
        rows = match (stage.kind, model.as_deref_mut()) {
            (StageKind::Model, Some(model)) => model.apply(&rows, &mut run),
            (StageKind::Model, None) => return Err(format!("{} needs an actor pool", stage.function)),
            _ => {
                let registered = registry::find(&stage.function)
                    .ok_or_else(|| format!("{} is not registered in this binary", stage.function))?;
                (registered.apply)(&rows, &mut run)
            }
        }
        .map_err(fatal)?;
        skipped.extend(run.skipped.into_iter().flat_map(named));
    }
    let count = rows.origins.len() as u64;
    let (rows, encoding, files) = match (rows.data, &job.sink) {
        (RowData::Arrow(batches), Some(sink)) => {
            let files = sink
                .write(job.index, &batches)
                .map_err(|e| fatal(whole_block(&job.stages, e)))?;
            (Vec::new(), RowEncoding::ArrowIpc, files)
        }
        (RowData::Encoded(_), Some(_)) => return Err("this sink writes Arrow rows, and the block's are typed".into()),
        (RowData::Arrow(batches), None) => (
            columnar::encode_ipc(&batches).map_err(|e| fatal(whole_block(&job.stages, e)))?,
            RowEncoding::ArrowIpc,
            Vec::new(),
        ),
        (RowData::Encoded(bytes), None) => (bytes, RowEncoding::Postcard, Vec::new()),
    };
    Ok(BlockOutput {
        count,
        rows: ByteBuf::from(rows),
        encoding,
        skipped,
        files,
    })
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
        BlockInput::Parquet { groups, .. } => vec![groups.describe()],
        BlockInput::Items { count, first, .. } => (*first..first + count).map(|i| format!("item {i}")).collect(),
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
        BlockInput::Parquet { .. } => "read_parquet",
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

/// The block's rows before any stage. Files that cannot be read fail the
/// block, or with [`OnError::Skip`] are left out and recorded in `run`.
fn read(input: &BlockInput, run: &mut StageRun) -> Result<BlockRows, RowFailure> {
    match input {
        BlockInput::Items { rows, count, .. } => Ok(BlockRows {
            data: RowData::Encoded(rows.to_vec()),
            origins: (0..*count as u32).collect(),
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
    read_one: impl Fn(&str, Bytes) -> Result<Vec<T>, String>,
) -> Result<Vec<(u32, Vec<T>)>, RowFailure> {
    let mut files = Vec::with_capacity(paths.len());
    for (origin, path) in paths.iter().enumerate() {
        let rows = storage::open_file(path, storage)
            .and_then(|(storage, name)| storage.read(&name))
            .map_err(|e| e.to_string())
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
    let rows = raylet::proto::codec::encode(&rows).map_err(|e| run.block_failure(format!("encoding its rows: {e}")))?;
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

fn read_binary(path: &str, bytes: Bytes) -> Result<Vec<FileBytes>, String> {
    Ok(vec![FileBytes {
        path: path.to_string(),
        bytes: Vec::from(bytes),
    }])
}

fn read_lines(path: &str, bytes: Bytes) -> Result<Vec<TextLine>, String> {
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("not UTF-8 text: {e}"))?;
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
