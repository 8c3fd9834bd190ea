//! The manifest of an output directory: a header naming the dataset, then a
//! line per block whose output files are in place, appended and synced after
//! the file's rename. A rerun skips the blocks it lists; a different
//! dataset is refused instead of mixed in.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::atomic_write::write_atomically;
use crate::block::Block;
use crate::stage::RowError;

pub(crate) const MANIFEST: &str = "_manifest.jsonl";

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Header {
    manifest: u32,
    dataset: String,
    blocks: usize,
}

/// One finished block.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub block: usize,
    pub fingerprint: String,
    /// The files the block wrote, relative to the output directory.
    pub files: Vec<String>,
    pub rows: u64,
    pub skipped: Vec<RowError>,
}

pub(crate) struct Manifest {
    dir: PathBuf,
    file: File,
    entries: HashMap<usize, Entry>,
}

impl Manifest {
    /// Opens the manifest of `dir` for `dataset` (a fingerprint of its
    /// blocks and stages), or starts one.
    pub fn open(dir: &Path, dataset: u64, blocks: usize) -> Result<Self, DataError> {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(format!("creating {}", dir.display()), e))?;
        let path = dir.join(MANIFEST);
        let header = Header {
            manifest: 1,
            dataset: format!("{dataset:016x}"),
            blocks,
        };
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) => read_entries(&path, &text, &header)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                write_new(&path, &header)?;
                HashMap::new()
            }
            Err(e) => return Err(DataError::io(format!("reading {}", path.display()), e)),
        };
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| DataError::io(format!("opening {}", path.display()), e))?;
        Ok(Manifest {
            dir: dir.to_path_buf(),
            file,
            entries,
        })
    }

    /// Whether `block`'s output is already in place.
    pub fn is_done(&self, block: &Block) -> bool {
        self.entries.get(&block.index).is_some_and(|entry| {
            entry.fingerprint == format!("{:016x}", block.fingerprint)
                && entry.files.iter().all(|file| self.dir.join(file).exists())
        })
    }

    /// Records a block whose output files were just renamed into place.
    pub fn record(&mut self, entry: Entry) -> Result<(), DataError> {
        let mut line = serde_json::to_string(&entry).expect("an entry is JSON");
        line.push('\n');
        let context = || format!("appending to {}", self.dir.join(MANIFEST).display());
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| DataError::io(context(), e))?;
        self.file.sync_data().map_err(|e| DataError::io(context(), e))?;
        self.entries.insert(entry.block, entry);
        Ok(())
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }
}

fn write_new(path: &Path, header: &Header) -> Result<(), DataError> {
    let mut text = serde_json::to_string(header).expect("a header is JSON");
    text.push('\n');
    write_atomically(path, text.as_bytes())
}

/// The entries after the header; a last line cut short by a crash is left out.
fn read_entries(path: &Path, text: &str, expected: &Header) -> Result<HashMap<usize, Entry>, DataError> {
    let mut lines = text.lines();
    let header: Option<Header> = lines.next().and_then(|line| serde_json::from_str(line).ok());
    match header {
        Some(header) if header == *expected => {}
        Some(header) => {
            return Err(DataError::Manifest(format!(
                "{} holds the outputs of another dataset ({} blocks, fingerprint {}; this one: {} blocks, {}): \
                 write to a new directory, or delete it to start over",
                path.parent().unwrap_or(path).display(),
                header.blocks,
                header.dataset,
                expected.blocks,
                expected.dataset
            )));
        }
        None => {
            return Err(DataError::Manifest(format!(
                "{} is not a raylet-data manifest",
                path.display()
            )));
        }
    }
    Ok(lines
        .filter_map(|line| serde_json::from_str::<Entry>(line).ok())
        .map(|entry| (entry.block, entry))
        .collect())
}
