//! The manifest of an output location: under `_manifest/`, a header
//! naming the dataset (`dataset.json`), then a record per block whose
//! output files are in place (`block_NNNNNN.json`), each written whole
//! after the block's files. A rerun skips the blocks it lists; a different
//! dataset is refused instead of mixed in. One object per record, never
//! appended to, works the same on a local disk and in object storage.

use std::collections::HashMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::block::Block;
use crate::stage::RowError;
use raylet_storage::Storage;

/// The manifest's folder under the output location.
pub(crate) const MANIFEST: &str = "_manifest";
const HEADER: &str = "_manifest/dataset.json";

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
    storage: Storage,
    entries: HashMap<usize, Entry>,
}

impl Manifest {
    /// Opens the manifest of `storage` for `dataset` (a fingerprint of its
    /// blocks and stages), or starts one.
    pub fn open(storage: &Storage, dataset: u64, blocks: usize) -> Result<Self, DataError> {
        let header = Header {
            manifest: 2,
            dataset: format!("{dataset:016x}"),
            blocks,
        };
        let entries = match storage.read_if_present(HEADER)? {
            Some(text) => {
                check_header(storage, &text, &header)?;
                read_entries(storage)?
            }
            None => {
                let text = serde_json::to_vec(&header).expect("a header is JSON");
                storage.write(HEADER, Bytes::from(text))?;
                HashMap::new()
            }
        };
        Ok(Manifest {
            storage: storage.clone(),
            entries,
        })
    }

    /// Whether `block`'s output is already in place.
    pub fn is_done(&self, block: &Block) -> Result<bool, DataError> {
        let Some(entry) = self.entries.get(&block.index) else {
            return Ok(false);
        };
        if entry.fingerprint != format!("{:016x}", block.fingerprint) {
            return Ok(false);
        }
        for file in &entry.files {
            if !self.storage.exists(file)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records a block whose output files were just written.
    pub fn record(&mut self, entry: Entry) -> Result<(), DataError> {
        let text = serde_json::to_vec(&entry).expect("an entry is JSON");
        self.storage
            .write(&format!("{MANIFEST}/block_{:06}.json", entry.block), Bytes::from(text))?;
        self.entries.insert(entry.block, entry);
        Ok(())
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }
}

fn check_header(storage: &Storage, text: &[u8], expected: &Header) -> Result<(), DataError> {
    match serde_json::from_slice::<Header>(text) {
        Ok(header) if header == *expected => Ok(()),
        Ok(header) => Err(DataError::Manifest(format!(
            "{} holds the outputs of another dataset ({} blocks, fingerprint {}; this one: {} blocks, {}): \
             write to a new location, or delete it to start over",
            storage.location_of(""),
            header.blocks,
            header.dataset,
            expected.blocks,
            expected.dataset
        ))),
        Err(_) => Err(DataError::Manifest(format!(
            "{} is not a raylet-data manifest",
            storage.location_of(HEADER)
        ))),
    }
}

/// The records of finished blocks (any that cannot be read are redone).
fn read_entries(storage: &Storage) -> Result<HashMap<usize, Entry>, DataError> {
    let folder = storage.child(MANIFEST);
    let mut entries = HashMap::new();
    for (name, _) in folder.list()? {
        if !name.starts_with("block_") {
            continue;
        }
        if let Some(entry) = folder
            .read_if_present(&name)?
            .and_then(|text| serde_json::from_slice::<Entry>(&text).ok())
        {
            entries.insert(entry.block, entry);
        }
    }
    Ok(entries)
}
