//! `read_delta`: the data files of a Delta Lake table's current version,
//! found by replaying its transaction log (`_delta_log`: the newest
//! complete checkpoint, then every JSON commit after it, in order), read as
//! Parquet. Tables on a local disk or in object storage. A table that needs
//! what this reader does not do (deletion vectors, column mapping,
//! partition columns, other reader features) is refused, naming it, rather
//! than read wrong.

use std::collections::{BTreeMap, HashMap};

use arrow::json::ArrayWriter;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use raylet_storage::{Storage, StorageError, StorageOptions};
use serde::Deserialize;

use crate::DataError;
use crate::files::FileList;

const LOG_DIR: &str = "_delta_log";
/// The highest reader version whose tables this reader can read.
const READER_VERSION: u32 = 3;
/// Reader features (of reader version 3) that change nothing for a reader
/// of whole files.
const HARMLESS_READER_FEATURES: [&str; 2] = ["timestampNtz", "vacuumProtocolCheck"];

/// Why a Delta table cannot be read, or is refused.
#[derive(Debug, thiserror::Error)]
enum DeltaError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0} is not a Delta table: it has no {LOG_DIR} commits")]
    NotATable(String),
    #[error("checkpoint {part}: {source}")]
    Checkpoint { part: String, source: ActionsError },
    #[error("commit {name}: {source}")]
    Commit { name: String, source: ActionsError },
    #[error("commit {version} follows {} in {LOG_DIR}: the log has a gap", version_text(*.after))]
    Gap { version: u64, after: Option<u64> },
    #[error("the log has no protocol action")]
    NoProtocol,
    #[error("it needs a reader of version {0} (read_delta reads up to {READER_VERSION})")]
    ReaderVersion(u32),
    #[error("read_delta does not read tables with the reader features {0:?}")]
    ReaderFeatures(Vec<String>),
    #[error("the log has no metaData action")]
    NoMetadata,
    #[error("read_delta does not read tables with column mapping ({0})")]
    ColumnMapping(String),
    #[error("read_delta does not read partitioned tables yet (partition columns {0:?})")]
    Partitioned(Vec<String>),
    #[error("{0} has a deletion vector, which read_delta does not apply")]
    DeletionVector(String),
    #[error("{0} lies outside the table (read_delta reads files under it)")]
    OutsideTable(String),
    #[error("{0} has a bad percent escape")]
    BadEscape(String),
    #[error("{0} is not UTF-8 once decoded")]
    NotUtf8Path(String),
}

/// Why a commit's lines or a checkpoint's rows are not actions.
#[derive(Debug, thiserror::Error)]
enum ActionsError {
    #[error(transparent)]
    NotText(#[from] std::str::Utf8Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
}

fn version_text(version: Option<u64>) -> String {
    version.map_or("nothing".to_string(), |last| last.to_string())
}

/// The Parquet files of the table at `location`, with their sizes.
pub(crate) fn table_files(location: &str, options: &StorageOptions) -> Result<FileList, DataError> {
    let table_error = |error: DeltaError| DataError::Format {
        input: location.to_string(),
        message: format!("reading the Delta table: {error}"),
    };
    let table = Storage::open(location, options).map_err(|e| table_error(e.into()))?;
    let log = table.child(LOG_DIR);
    let listed = log.list().map_err(|e| table_error(e.into()))?;
    let files = LogFiles::of(listed.into_iter().map(|(name, _)| name));
    if files.commits.is_empty() && files.checkpoint.is_none() {
        return Err(table_error(DeltaError::NotATable(location.to_string())));
    }
    let replay = replayed(&log, &files).map_err(table_error)?;
    replay.check().map_err(table_error)?;
    let files = replay
        .files
        .into_iter()
        .map(|(path, file)| Ok((data_file_name(&path)?, file.size)))
        .collect::<Result<Vec<_>, DeltaError>>()
        .map_err(table_error)?;
    Ok(FileList::under(table.location_of(""), files))
}

/// The table's state at its newest version: the checkpoint's actions, then
/// those of every commit after it, which must follow one another.
fn replayed(log: &Storage, files: &LogFiles) -> Result<Replay, DeltaError> {
    let mut replay = Replay::default();
    if let Some((version, parts)) = &files.checkpoint {
        for part in parts {
            let bytes = log.read(part)?;
            let actions = checkpoint_actions(bytes).map_err(|source| DeltaError::Checkpoint {
                part: part.clone(),
                source,
            })?;
            replay.apply(actions);
        }
        replay.version = Some(*version);
    }
    for (version, name) in files.commits_after(replay.version) {
        if replay.version.map_or(version != 0, |last| version != last + 1) {
            return Err(DeltaError::Gap {
                version,
                after: replay.version,
            });
        }
        let bytes = log.read(&name)?;
        let actions = commit_actions(&bytes).map_err(|source| DeltaError::Commit { name, source })?;
        replay.apply(actions);
        replay.version = Some(version);
    }
    Ok(replay)
}

/// The log's commits by version, and its newest complete checkpoint.
struct LogFiles {
    commits: BTreeMap<u64, String>,
    checkpoint: Option<(u64, Vec<String>)>,
}

impl LogFiles {
    fn of(names: impl Iterator<Item = String>) -> Self {
        let mut commits = BTreeMap::new();
        let mut checkpoints: BTreeMap<u64, Vec<(u32, u32, String)>> = BTreeMap::new();
        for name in names.filter(|name| !name.contains('/')) {
            let Some((version, rest)) = name.split_once('.') else {
                continue;
            };
            let Ok(number) = version.parse::<u64>() else {
                continue;
            };
            let parts: Vec<&str> = rest.split('.').collect();
            match parts.as_slice() {
                ["json"] => {
                    commits.insert(number, name);
                }
                ["checkpoint", "parquet"] => checkpoints.entry(number).or_default().push((1, 1, name)),
                ["checkpoint", part, of, "parquet"] => {
                    if let (Ok(part), Ok(of)) = (part.parse(), of.parse()) {
                        checkpoints.entry(number).or_default().push((part, of, name));
                    }
                }
                _ => {}
            }
        }
        let checkpoint = checkpoints.into_iter().rev().find_map(|(version, mut parts)| {
            parts.sort();
            let of = parts.first()?.1;
            let complete = parts.len() == of as usize && parts.iter().enumerate().all(|(i, p)| p.0 == i as u32 + 1);
            complete.then(|| (version, parts.into_iter().map(|(_, _, name)| name).collect()))
        });
        LogFiles { commits, checkpoint }
    }

    fn commits_after(&self, version: Option<u64>) -> impl Iterator<Item = (u64, String)> + '_ {
        let first = version.map_or(0, |v| v + 1);
        self.commits.range(first..).map(|(v, name)| (*v, name.clone()))
    }
}

/// One action of the log, as a commit line or a checkpoint row holds it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Action {
    add: Option<AddFile>,
    remove: Option<RemoveFile>,
    meta_data: Option<Metadata>,
    protocol: Option<Protocol>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AddFile {
    path: String,
    size: u64,
    deletion_vector: Option<serde_json::Value>,
}

/// A live data file.
struct DataFile {
    size: u64,
    has_deletion_vector: bool,
}

#[derive(Deserialize)]
struct RemoveFile {
    path: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    #[serde(default)]
    partition_columns: Vec<String>,
    #[serde(default)]
    configuration: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Protocol {
    min_reader_version: u32,
    #[serde(default)]
    reader_features: Vec<String>,
}

/// The table's state as the log is replayed.
#[derive(Default)]
struct Replay {
    version: Option<u64>,
    /// The live data files, by their paths as the log has them.
    files: BTreeMap<String, DataFile>,
    metadata: Option<Metadata>,
    protocol: Option<Protocol>,
}

impl Replay {
    fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            if let Some(add) = action.add {
                let file = DataFile {
                    size: add.size,
                    has_deletion_vector: add.deletion_vector.is_some_and(|dv| !dv.is_null()),
                };
                self.files.insert(add.path, file);
            }
            if let Some(remove) = action.remove {
                self.files.remove(&remove.path);
            }
            if let Some(metadata) = action.meta_data {
                self.metadata = Some(metadata);
            }
            if let Some(protocol) = action.protocol {
                self.protocol = Some(protocol);
            }
        }
    }

    /// Refuses a table this reader would read wrong.
    fn check(&self) -> Result<(), DeltaError> {
        let protocol = self.protocol.as_ref().ok_or(DeltaError::NoProtocol)?;
        if protocol.min_reader_version > READER_VERSION {
            return Err(DeltaError::ReaderVersion(protocol.min_reader_version));
        }
        let unknown: Vec<String> = protocol
            .reader_features
            .iter()
            .filter(|feature| !HARMLESS_READER_FEATURES.contains(&feature.as_str()))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(DeltaError::ReaderFeatures(unknown));
        }
        let metadata = self.metadata.as_ref().ok_or(DeltaError::NoMetadata)?;
        if let Some(mode) = metadata.configuration.get("delta.columnMapping.mode")
            && mode != "none"
        {
            return Err(DeltaError::ColumnMapping(mode.clone()));
        }
        if !metadata.partition_columns.is_empty() {
            return Err(DeltaError::Partitioned(metadata.partition_columns.clone()));
        }
        match self.files.iter().find(|(_, file)| file.has_deletion_vector) {
            Some((path, _)) => Err(DeltaError::DeletionVector(path.clone())),
            None => Ok(()),
        }
    }
}

fn commit_actions(bytes: &[u8]) -> Result<Vec<Action>, ActionsError> {
    let text = std::str::from_utf8(bytes)?;
    let lines = text.lines().filter(|line| !line.trim().is_empty());
    Ok(lines.map(serde_json::from_str).collect::<Result<_, _>>()?)
}

/// A checkpoint's rows as actions: written as JSON objects by arrow, so
/// that they read as commit lines do.
fn checkpoint_actions(bytes: Bytes) -> Result<Vec<Action>, ActionsError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).and_then(|builder| builder.build())?;
    let mut writer = ArrayWriter::new(Vec::new());
    for batch in reader {
        writer.write(&batch?)?;
    }
    writer.finish()?;
    let rows = writer.into_inner();
    match rows.is_empty() {
        true => Ok(Vec::new()),
        false => Ok(serde_json::from_slice(&rows)?),
    }
}

/// The name under the table of the data file the log names `path` (a URI
/// reference relative to the table, percent-encoded).
fn data_file_name(path: &str) -> Result<String, DeltaError> {
    let decoded = percent_decoded(path)?;
    if decoded.contains("://") || decoded.starts_with('/') {
        return Err(DeltaError::OutsideTable(decoded));
    }
    Ok(decoded)
}

fn percent_decoded(path: &str) -> Result<String, DeltaError> {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = path
                .get(index + 1..index + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| DeltaError::BadEscape(path.to_string()))?;
            decoded.push(hex);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| DeltaError::NotUtf8Path(path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_paths_are_percent_decoded_and_paths_outside_the_table_are_refused() {
        assert_eq!(
            data_file_name("year%3D2024/a%20b.parquet").unwrap(),
            "year=2024/a b.parquet"
        );
        assert!(matches!(data_file_name("bad%2"), Err(DeltaError::BadEscape(_))));
        assert!(matches!(data_file_name("%FF"), Err(DeltaError::NotUtf8Path(_))));
        let error = data_file_name("s3://other/x.parquet").unwrap_err();
        assert!(matches!(error, DeltaError::OutsideTable(_)), "{error}");
        assert!(error.to_string().contains("outside the table"), "{error}");
    }

    #[test]
    fn the_newest_complete_checkpoint_is_chosen() {
        let names = [
            "00000000000000000000.json",
            "00000000000000000001.json",
            "00000000000000000001.checkpoint.parquet",
            "00000000000000000002.json",
            "00000000000000000002.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000002.checkpoint.0000000002.0000000002.parquet",
            "00000000000000000003.checkpoint.0000000001.0000000002.parquet",
            "_last_checkpoint",
        ];
        let files = LogFiles::of(names.iter().map(|name| name.to_string()));
        let (version, parts) = files.checkpoint.clone().unwrap();
        assert_eq!((version, parts.len()), (2, 2), "version 3's checkpoint lacks a part");
        assert_eq!(files.commits_after(Some(version)).count(), 0);
        assert_eq!(files.commits_after(None).count(), 3);
    }
}
