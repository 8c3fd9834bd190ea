//! Sinks: every block's rows go to one file of their own (`block_NNNNNN.jsonl`
//! or `.csv`), written under a temporary name, synced and renamed into
//! place, then recorded in the manifest. A retried or rerun block rewrites
//! the same name, so each input's rows appear exactly once; a rerun skips
//! the blocks the manifest lists. Rows left out under `OnError::Skip` are
//! listed in `_errors.jsonl`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::DataError;
use crate::execution::Execution;
use crate::manifest::{Entry, Manifest};
use crate::stage::RowError;

pub(crate) const ERRORS: &str = "_errors.jsonl";

/// The file format of a sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Jsonl,
    Csv,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Csv => "csv",
        }
    }

    fn encode<T: Serialize>(self, rows: &[T]) -> Result<Vec<u8>, String> {
        match self {
            Format::Jsonl => {
                let mut out = Vec::new();
                for row in rows {
                    serde_json::to_writer(&mut out, row).map_err(|e| e.to_string())?;
                    out.push(b'\n');
                }
                Ok(out)
            }
            Format::Csv => {
                let mut writer = csv::Writer::from_writer(Vec::new());
                for row in rows {
                    writer.serialize(row).map_err(|e| e.to_string())?;
                }
                writer.into_inner().map_err(|e| e.to_string())
            }
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
    pub files: Vec<PathBuf>,
    /// The most actors the model stage's pool had at once (0 without one).
    pub max_actors: usize,
}

/// Runs `execution` into `dir`, one file per block.
pub(crate) fn write_blocks<T: Serialize + serde::de::DeserializeOwned>(
    mut execution: Execution,
    manifest: &mut Manifest,
    dir: &Path,
    format: Format,
    skipped_blocks: usize,
) -> Result<WriteSummary, DataError> {
    let mut blocks_written = 0;
    while let Some(next) = execution.next_block() {
        let (block, output) = next?;
        let rows: Vec<T> = raylet::proto::codec::decode(&output.rows)
            .map_err(|e| DataError::InvalidInput(format!("decoding block {}: {e}", block.index)))?;
        let bytes = format
            .encode(&rows)
            .map_err(|e| DataError::InvalidInput(format!("writing block {} as {format:?}: {e}", block.index)))?;
        let file = format!("block_{:06}.{}", block.index, format.extension());
        write_atomically(&dir.join(&file), &bytes)?;
        manifest.record(Entry {
            block: block.index,
            fingerprint: format!("{:016x}", block.fingerprint),
            file,
            rows: output.count,
            skipped: output.skipped,
        })?;
        blocks_written += 1;
    }
    let mut summary = summarize(manifest, dir, blocks_written, skipped_blocks)?;
    summary.max_actors = execution.largest_pool();
    Ok(summary)
}

/// The summary of the whole output, and `_errors.jsonl` rewritten from the manifest.
fn summarize(manifest: &Manifest, dir: &Path, written: usize, skipped: usize) -> Result<WriteSummary, DataError> {
    let mut entries: Vec<&Entry> = manifest.entries().collect();
    entries.sort_by_key(|entry| entry.block);
    let errors: Vec<RowError> = entries.iter().flat_map(|entry| entry.skipped.clone()).collect();
    let mut text = Vec::new();
    for error in &errors {
        serde_json::to_writer(&mut text, error).expect("a RowError is JSON");
        text.push(b'\n');
    }
    write_atomically(&dir.join(ERRORS), &text)?;
    Ok(WriteSummary {
        blocks_written: written,
        blocks_skipped: skipped,
        rows: entries.iter().map(|entry| entry.rows).sum(),
        errors,
        files: entries.iter().map(|entry| dir.join(&entry.file)).collect(),
        max_actors: 0,
    })
}

/// Writes `bytes` to `path` through a temporary file that is synced and
/// renamed over it, so that `path` holds either nothing or all of it.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let name = path.file_name().expect("a file path").to_string_lossy();
    let temporary = path.with_file_name(format!(".{name}.tmp"));
    let context = || format!("writing {}", path.display());
    let mut file = std::fs::File::create(&temporary).map_err(|e| DataError::io(context(), e))?;
    file.write_all(bytes).map_err(|e| DataError::io(context(), e))?;
    file.sync_all().map_err(|e| DataError::io(context(), e))?;
    std::fs::rename(&temporary, path).map_err(|e| DataError::io(context(), e))
}
