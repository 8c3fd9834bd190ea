//! The task that processes one block: it reads the block's files (or
//! decodes its items), runs every stage of the plan over the rows in
//! order, and returns them encoded, with the rows it left out.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::DataError;
use crate::block::{BlockInput, FileBytes, ReadKind, TextLine};
use crate::model_registry::LoadedModel;
use crate::registry::{self, EncodedRows};
use crate::stage::{OnError, RowError, RowFailure, StageKind, StageRun, StageSpec};

/// A processed block: its rows (a list of the plan's output type, encoded)
/// and the rows left out under [`OnError::Skip`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockOutput {
    pub rows: ByteBuf,
    pub count: u64,
    pub skipped: Vec<RowError>,
}

impl BlockOutput {
    /// The rows, as the plan's output type.
    pub fn decode_rows<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, DataError> {
        raylet::proto::codec::decode(&self.rows)
            .map_err(|e| DataError::InvalidInput(format!("decoding a block's rows: {e}")))
    }
}

/// Runs `stages` over the block in a task. A failure is a JSON
/// [`RowError`] naming the input, so the driver can say which file failed.
#[raylet::remote]
pub(crate) fn process_block(
    input: BlockInput,
    stages: Vec<StageSpec>,
    on_error: OnError,
) -> Result<BlockOutput, String> {
    run_stages(&input, &stages, on_error, None)
}

/// Reads the block and runs `stages` over its rows; a `Model` stage runs
/// `model` (an actor's).
pub(crate) fn run_stages(
    input: &BlockInput,
    stages: &[StageSpec],
    on_error: OnError,
    mut model: Option<&mut dyn LoadedModel>,
) -> Result<BlockOutput, String> {
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
    for stage in stages {
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
    Ok(BlockOutput {
        count: rows.origins.len() as u64,
        rows: ByteBuf::from(rows.rows),
        skipped,
    })
}

/// What each input of the block is called in errors.
fn sources(input: &BlockInput) -> Vec<String> {
    match input {
        BlockInput::Files { paths, .. } => paths.clone(),
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
fn read(input: &BlockInput, run: &mut StageRun) -> Result<EncodedRows, RowFailure> {
    match input {
        BlockInput::Items { rows, count, .. } => Ok(EncodedRows {
            rows: rows.to_vec(),
            origins: (0..*count as u32).collect(),
        }),
        BlockInput::Files {
            paths,
            read: ReadKind::Binary,
        } => read_files(paths, run, read_binary),
        BlockInput::Files {
            paths,
            read: ReadKind::Text,
        } => read_files(paths, run, read_lines),
    }
}

fn read_files<T: Serialize>(
    paths: &[String],
    run: &mut StageRun,
    read_one: fn(&str) -> std::io::Result<Vec<T>>,
) -> Result<EncodedRows, RowFailure> {
    let (mut rows, mut origins) = (Vec::new(), Vec::new());
    for (origin, path) in paths.iter().enumerate() {
        match read_one(path) {
            Ok(file_rows) => {
                origins.extend(std::iter::repeat_n(origin as u32, file_rows.len()));
                rows.extend(file_rows);
            }
            Err(e) => run.fail(&[origin as u32], e.to_string())?,
        }
    }
    let rows = raylet::proto::codec::encode(&rows).map_err(|e| run.block_failure(format!("encoding its rows: {e}")))?;
    Ok(EncodedRows { rows, origins })
}

fn read_binary(path: &str) -> std::io::Result<Vec<FileBytes>> {
    Ok(vec![FileBytes {
        path: path.to_string(),
        bytes: std::fs::read(path)?,
    }])
}

fn read_lines(path: &str) -> std::io::Result<Vec<TextLine>> {
    let text = std::fs::read_to_string(path)?;
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
