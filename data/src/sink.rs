//! Sinks: every block's rows go to files of their own, each written whole
//! (locally under a temporary name, synced and renamed into place; in
//! object storage by one PUT), then recorded in the manifest. Tables of
//! typed rows (`write_jsonl`, `write_csv`) are written by the driver, one
//! file per block (`block_NNNNNN.jsonl`); `write_files` writes each row's
//! bytes to the name it carries; Arrow rows (`write_parquet`) are written
//! by the blocks' own tasks. A retried or rerun block rewrites the same
//! names, so each input's rows appear exactly once; a rerun skips the
//! blocks the manifest lists. Rows left out under `OnError::Skip` are
//! listed in `_errors.jsonl`.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::DataError;
use crate::block::{Block, FileBytes};
#[cfg(feature = "parquet")]
use crate::columnar;
use crate::execution::{Execution, StageMemory};
use crate::manifest::{Entry, MANIFEST, Manifest};
use crate::stage::RowError;
use crate::task_sink::{ArrowFormat, SinkError};
use raylet_storage::Storage;

pub(crate) const ERRORS: &str = "_errors.jsonl";

/// What a sink writes: tables of rows, each row as a file, or Arrow
/// rows in a file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Table(Table),
    Files,
    Arrow(ArrowFormat),
}

/// The table formats of typed rows, a file per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    Jsonl,
    Csv,
    /// Through Arrow columns named as the rows' fields.
    #[cfg(feature = "parquet")]
    Parquet,
}

impl Table {
    fn extension(self) -> &'static str {
        match self {
            Table::Jsonl => "jsonl",
            Table::Csv => "csv",
            #[cfg(feature = "parquet")]
            Table::Parquet => "parquet",
        }
    }

    fn encode<T: Serialize>(self, rows: &[T]) -> Result<Vec<u8>, SinkError> {
        match self {
            Table::Jsonl => {
                let mut out = Vec::new();
                for row in rows {
                    serde_json::to_writer(&mut out, row)?;
                    out.push(b'\n');
                }
                Ok(out)
            }
            Table::Csv => {
                let mut writer = csv::Writer::from_writer(Vec::new());
                for row in rows {
                    writer.serialize(row)?;
                }
                writer.into_inner().map_err(|e| SinkError::CsvBuffer(e.into_error()))
            }
            #[cfg(feature = "parquet")]
            Table::Parquet => ArrowFormat::Parquet.encode(&[columnar::rows_to_batch(rows)?]),
        }
    }
}

/// What a write did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// Blocks written by this run.
    pub blocks_written: usize,
    /// Blocks a previous run had written, skipped by this one.
    pub blocks_skipped: usize,
    /// Rows in all the output files, this run's and earlier ones'.
    pub rows: u64,
    /// Rows left out under `OnError::Skip`, listed in `_errors.jsonl`.
    pub errors: Vec<RowError>,
    /// The output files (paths, or URLs in object storage).
    pub files: Vec<PathBuf>,
    /// The most actors the model stage's pool had at once (0 without one).
    pub max_actors: usize,
    /// The most bytes one block's rows took at each step of this run.
    pub memory: Vec<StageMemory>,
}

/// The output names in use and the block that wrote each, so that no two
/// blocks write the same file.
pub(crate) struct OutputNames(HashMap<String, usize>);

impl OutputNames {
    fn of(manifest: &Manifest) -> Self {
        let names = manifest
            .entries()
            .flat_map(|entry| entry.files.iter().map(|file| (file.clone(), entry.block)))
            .collect();
        OutputNames(names)
    }

    /// Takes `name` for `block`, which may have held it in an earlier run.
    fn claim(&mut self, name: &str, block: &Block) -> Result<(), DataError> {
        match self.0.insert(name.to_string(), block.index) {
            Some(other) if other != block.index => Err(two_rows_named(name, block)),
            _ => Ok(()),
        }
    }
}

fn two_rows_named(name: &str, block: &Block) -> DataError {
    DataError::InvalidInput(format!(
        "two rows are both to be written to {name} (one in block {}: {})",
        block.index,
        block.describe()
    ))
}

/// Writes a block's rows to the output location, returning the names of
/// the files written.
pub(crate) type BlockWriter<'a, T> =
    dyn FnMut(&Storage, &Block, Vec<T>, &mut OutputNames) -> Result<Vec<String>, DataError> + 'a;

/// Runs `execution` into `storage`, each block through `write` (none:
/// the blocks' tasks wrote their files).
pub(crate) fn write_blocks<T: DeserializeOwned>(
    mut execution: Execution,
    manifest: &mut Manifest,
    storage: &Storage,
    skipped_blocks: usize,
    mut write: Option<&mut BlockWriter<'_, T>>,
) -> Result<WriteSummary, DataError> {
    let mut names = OutputNames::of(manifest);
    let mut blocks_written = 0;
    while let Some(next) = execution.next_block() {
        let (block, output) = next?;
        let files = match write.as_mut() {
            Some(write) => write(storage, &block, output.decode_rows()?, &mut names)?,
            None => output.files.clone(),
        };
        manifest.record(Entry {
            block: block.index,
            fingerprint: format!("{:016x}", block.fingerprint),
            files,
            rows: output.count,
            skipped: output.skipped,
        })?;
        blocks_written += 1;
    }
    let mut summary = summarize(manifest, storage, blocks_written, skipped_blocks)?;
    summary.max_actors = execution.largest_pool();
    summary.memory = execution.memory();
    Ok(summary)
}

/// Writes a block's rows as one table file, `block_NNNNNN.EXT` (a name no
/// other block has; none for a Parquet block without rows, which has no
/// columns to write).
pub(crate) fn write_table<T: Serialize>(
    format: Table,
    storage: &Storage,
    block: &Block,
    rows: &[T],
) -> Result<Vec<String>, DataError> {
    #[cfg(feature = "parquet")]
    if format == Table::Parquet && rows.is_empty() {
        return Ok(Vec::new());
    }
    let bytes = format
        .encode(rows)
        .map_err(|e| DataError::InvalidInput(format!("writing block {} as {format:?}: {e}", block.index)))?;
    let file = format!("block_{:06}.{}", block.index, format.extension());
    storage.write(&file, Bytes::from(bytes))?;
    Ok(vec![file])
}

/// Writes each row's bytes to `<location>/<row.path>`; the path must be
/// relative and stay inside the location.
pub(crate) fn write_each_file(
    storage: &Storage,
    block: &Block,
    rows: Vec<FileBytes>,
    names: &mut OutputNames,
) -> Result<Vec<String>, DataError> {
    let mut files = Vec::with_capacity(rows.len());
    let mut in_block = HashSet::new();
    for row in rows {
        let name = output_name(&row.path)?;
        if !in_block.insert(name.clone()) {
            return Err(two_rows_named(&name, block));
        }
        names.claim(&name, block)?;
        storage.write(&name, Bytes::from(row.bytes))?;
        files.push(name);
    }
    Ok(files)
}

/// The name under the output directory that a row's path gives, or why it
/// cannot be one.
fn output_name(path: &str) -> Result<String, DataError> {
    let parts: Vec<&str> = Path::new(path)
        .components()
        .map(|part| match part {
            Component::Normal(part) => part.to_str().ok_or(()),
            _ => Err(()),
        })
        .collect::<Result<_, _>>()
        .map_err(|()| {
            DataError::InvalidInput(format!(
                "write_files writes each row to its path under the output directory, so a row's path must be \
                 relative and stay inside it: {path:?} is not (map the rows to relative names first)"
            ))
        })?;
    let name = parts.join("/");
    match parts[..] {
        [] => Err(DataError::InvalidInput("write_files: a row has an empty path".into())),
        [MANIFEST, ..] | [ERRORS] => Err(DataError::InvalidInput(format!(
            "write_files: {name} is the name of the output directory's own record"
        ))),
        _ => Ok(name),
    }
}

/// The summary of the whole output, and `_errors.jsonl` rewritten from the manifest.
fn summarize(
    manifest: &Manifest,
    storage: &Storage,
    written: usize,
    skipped: usize,
) -> Result<WriteSummary, DataError> {
    let mut entries: Vec<&Entry> = manifest.entries().collect();
    entries.sort_by_key(|entry| entry.block);
    let errors: Vec<RowError> = entries.iter().flat_map(|entry| entry.skipped.clone()).collect();
    let mut text = Vec::new();
    for error in &errors {
        serde_json::to_writer(&mut text, error).expect("a RowError is JSON");
        text.push(b'\n');
    }
    storage.write(ERRORS, Bytes::from(text))?;
    Ok(WriteSummary {
        blocks_written: written,
        blocks_skipped: skipped,
        rows: entries.iter().map(|entry| entry.rows).sum(),
        errors,
        files: entries
            .iter()
            .flat_map(|entry| entry.files.iter().map(|file| PathBuf::from(storage.location_of(file))))
            .collect(),
        max_actors: 0,
        memory: Vec::new(),
    })
}
