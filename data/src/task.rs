//! The task that processes one block: it reads the block's files, row
//! groups or items, runs every stage of the plan over the rows in order,
//! and returns them encoded (or writes them, when the run has a sink that
//! writes in tasks), with the rows it left out.

use arrow::array::RecordBatch;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::DataError;
use crate::block::{BlockInput, FileBytes, ReadKind, TextLine};
use crate::columnar;
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
        BlockInput::Files {
            paths,
            read: ReadKind::Binary,
            storage,
        } => read_files(paths, storage, run, read_binary),
        BlockInput::Files {
            paths,
            read: ReadKind::Text,
            storage,
        } => read_files(paths, storage, run, read_lines),
        BlockInput::Parquet {
            groups,
            options,
            storage,
        } => match parquet_source::read_groups(groups, options, storage) {
            Ok(batches) => Ok(BlockRows {
                origins: vec![0; batches.iter().map(RecordBatch::num_rows).sum()],
                data: RowData::Arrow(batches),
            }),
            Err(e) => {
                run.fail(&[0], e)?;
                Ok(BlockRows {
                    data: RowData::Arrow(Vec::new()),
                    origins: Vec::new(),
                })
            }
        },
    }
}

fn read_files<T: Serialize>(
    paths: &[String],
    storage: &StorageOptions,
    run: &mut StageRun,
    read_one: fn(&str, bytes::Bytes) -> Result<Vec<T>, String>,
) -> Result<BlockRows, RowFailure> {
    let (mut rows, mut origins) = (Vec::new(), Vec::new());
    for (origin, path) in paths.iter().enumerate() {
        let file_rows = storage::open_file(path, storage)
            .and_then(|(storage, name)| storage.read(&name))
            .map_err(|e| e.to_string())
            .and_then(|bytes| read_one(path, bytes));
        match file_rows {
            Ok(file_rows) => {
                origins.extend(std::iter::repeat_n(origin as u32, file_rows.len()));
                rows.extend(file_rows);
            }
            Err(e) => run.fail(&[origin as u32], e.to_string())?,
        }
    }
    let rows = raylet::proto::codec::encode(&rows).map_err(|e| run.block_failure(format!("encoding its rows: {e}")))?;
    Ok(BlockRows {
        data: RowData::Encoded(rows),
        origins,
    })
}

fn read_binary(path: &str, bytes: bytes::Bytes) -> Result<Vec<FileBytes>, String> {
    Ok(vec![FileBytes {
        path: path.to_string(),
        bytes: Vec::from(bytes),
    }])
}

fn read_lines(path: &str, bytes: bytes::Bytes) -> Result<Vec<TextLine>, String> {
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
