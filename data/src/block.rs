//! Blocks: the units a dataset is cut into and processed by, one task per
//! block. The built-in row types of file sources, and how files and items
//! are partitioned into blocks (by count and by size) so that a rerun
//! makes the same blocks.

use std::sync::Arc;

use raylet::ObjectRef;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use xxhash_rust::xxh3::xxh3_64;

use crate::block_output::BlockOutput;
use crate::csv_source::CsvOptions;
use crate::encoded_rows::EncodedRows;
use crate::exchange::Reducer;
use crate::files::FileList;
use crate::image_source::ImageOptions;
#[cfg(feature = "parquet")]
use crate::parquet_source::{ParquetOptions, PlannedGroups, RowGroups};
use crate::stage::StageSpec;
use raylet_storage::StorageOptions;

/// A whole file, as `read_binary` gives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileBytes {
    pub path: String,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// One line of a text file, as `read_text` gives it (numbered from 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextLine {
    pub path: String,
    pub line: u64,
    pub text: String,
}

/// How a file becomes rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum ReadKind {
    /// One [`FileBytes`] per file.
    Binary,
    /// One [`TextLine`] per line.
    Text,
    /// Arrow rows, by a schema every block shares.
    Csv(CsvOptions),
    /// One [`Image`](crate::Image) per file.
    Images(ImageOptions),
}

/// What a block's task starts from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum BlockInput {
    Files {
        paths: Vec<String>,
        read: ReadKind,
        storage: StorageOptions,
    },
    /// Row groups of a Parquet file.
    #[cfg(feature = "parquet")]
    Parquet {
        groups: RowGroups,
        options: ParquetOptions,
        storage: StorageOptions,
    },
    /// Items, the first being item `first` of the dataset.
    Items { rows: EncodedRows, first: u64 },
    /// Output block `block` of an all-to-all step: its part of every input
    /// block, merged by `reducer`.
    Exchanged {
        parts: Vec<ObjectRef<BlockOutput>>,
        reducer: Reducer,
        block: usize,
    },
}

/// Where a block's inputs are in the driver: a range of the file list,
/// or the whole input of its task (items, encoded, or row groups).
#[derive(Clone, Debug)]
enum BlockSource {
    Files {
        list: Arc<FileList>,
        first: usize,
        end: usize,
        read: ReadKind,
        storage: StorageOptions,
    },
    Input(BlockInput),
}

/// One block of a dataset's input.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub index: usize,
    source: BlockSource,
    /// Input bytes (file sizes, or the encoded items).
    pub bytes: u64,
    /// Stable across reruns of the same input: a hash of the paths or items.
    pub fingerprint: u64,
    /// Transforms the block runs before the plan's own (those of the
    /// dataset it came from, in a union).
    pub stages: Vec<StageSpec>,
}

impl Block {
    /// The block with `stages` to run before its own, and a fingerprint
    /// that says so.
    pub fn after(mut self, stages: &[StageSpec]) -> Block {
        let mut prefix = stages.to_vec();
        prefix.extend(self.stages);
        self.fingerprint = xxh3_64(format!("{} {prefix:?}", self.fingerprint).as_bytes());
        self.stages = prefix;
        self
    }

    /// What the block's task is sent.
    pub fn input(&self) -> BlockInput {
        match &self.source {
            BlockSource::Files {
                list,
                first,
                end,
                read,
                storage,
            } => BlockInput::Files {
                paths: (*first..*end).map(|index| list.path(index)).collect(),
                read: read.clone(),
                storage: storage.clone(),
            },
            BlockSource::Input(input) => input.clone(),
        }
    }

    /// How many files, items or (of a Parquet file) rows the block holds.
    pub fn inputs(&self) -> u64 {
        match &self.source {
            BlockSource::Files { first, end, .. } => (end - first) as u64,
            BlockSource::Input(input) => input.inputs(),
        }
    }

    /// The block's inputs, for messages: its first and last file or item.
    pub fn describe(&self) -> String {
        match &self.source {
            BlockSource::Files { list, first, end, .. } if end - first == 1 => list.path(*first),
            BlockSource::Files { list, first, end, .. } => {
                format!("{} files, {} .. {}", end - first, list.path(*first), list.path(end - 1))
            }
            BlockSource::Input(input) => input.describe(),
        }
    }
}

impl BlockInput {
    fn inputs(&self) -> u64 {
        match self {
            BlockInput::Files { paths, .. } => paths.len() as u64,
            #[cfg(feature = "parquet")]
            BlockInput::Parquet { groups, .. } => groups.rows,
            BlockInput::Items { rows, .. } => rows.len() as u64,
            BlockInput::Exchanged { .. } => 1,
        }
    }

    fn describe(&self) -> String {
        match self {
            BlockInput::Files { paths, .. } => paths.join(", "),
            #[cfg(feature = "parquet")]
            BlockInput::Parquet { groups, .. } => groups.describe(),
            BlockInput::Items { rows, first } => format!("items {first}..{}", first + rows.len() as u64),
            BlockInput::Exchanged { block, parts, .. } => {
                format!("block {block} of an all-to-all step (parts of {} blocks)", parts.len())
            }
        }
    }
}

/// How inputs are cut into blocks: a block ends at `files_per_block` files
/// (or `items_per_block` items) or before it would pass `block_bytes`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct BlockSizing {
    pub files_per_block: usize,
    pub items_per_block: usize,
    pub block_bytes: u64,
}

impl Default for BlockSizing {
    fn default() -> Self {
        BlockSizing {
            files_per_block: 16,
            items_per_block: 1024,
            block_bytes: 64 << 20,
        }
    }
}

/// The blocks of `list` read as `read`.
pub(crate) fn file_blocks(
    list: FileList,
    read: &ReadKind,
    storage: &StorageOptions,
    sizing: BlockSizing,
) -> Vec<Block> {
    let list = Arc::new(list);
    let mut blocks = Vec::new();
    let (mut first, mut bytes) = (0, 0);
    for index in 0..list.len() {
        let size = list.size(index);
        let full = index - first >= sizing.files_per_block.max(1);
        if index > first && (full || bytes + size > sizing.block_bytes) {
            blocks.push(files_block(blocks.len(), &list, first..index, (read, storage), bytes));
            (first, bytes) = (index, 0);
        }
        bytes += size;
    }
    if list.len() > first {
        blocks.push(files_block(
            blocks.len(),
            &list,
            first..list.len(),
            (read, storage),
            bytes,
        ));
    }
    blocks
}

fn files_block(
    index: usize,
    list: &Arc<FileList>,
    range: std::ops::Range<usize>,
    (read, storage): (&ReadKind, &StorageOptions),
    bytes: u64,
) -> Block {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for file in range.clone() {
        hasher.update(list.path(file).as_bytes());
        hasher.update(b"\n");
    }
    Block {
        index,
        source: BlockSource::Files {
            list: list.clone(),
            first: range.start,
            end: range.end,
            read: read.clone(),
            storage: storage.clone(),
        },
        bytes,
        fingerprint: hasher.digest(),
        stages: Vec::new(),
    }
}

/// The blocks of `items` (each encoded alone), every block's items
/// encoded as one list.
pub(crate) fn item_blocks(items: &[ByteBuf], sizing: BlockSizing) -> Vec<Block> {
    let mut blocks = Vec::new();
    for (index, chunk) in items.chunks(sizing.items_per_block.max(1)).enumerate() {
        let (mut rows, mut hasher) = (EncodedRows::default(), xxhash_rust::xxh3::Xxh3::new());
        for item in chunk {
            rows.push_encoded(item);
            hasher.update(&(item.len() as u64).to_le_bytes());
            hasher.update(item);
        }
        blocks.push(Block {
            index,
            bytes: chunk.iter().map(|item| item.len() as u64).sum(),
            fingerprint: hasher.digest(),
            stages: Vec::new(),
            source: BlockSource::Input(BlockInput::Items {
                rows,
                first: (index * sizing.items_per_block.max(1)) as u64,
            }),
        });
    }
    blocks
}

/// The output blocks of an all-to-all step: block `j` merges part `j` of
/// every input block (`parts[input][j]`); `upstream` identifies the inputs.
pub(crate) fn exchanged_blocks(
    parts: Vec<Vec<ObjectRef<BlockOutput>>>,
    reducer: &Reducer,
    upstream: u64,
) -> Vec<Block> {
    let outputs = parts.first().map_or(0, Vec::len);
    let mut by_output: Vec<Vec<ObjectRef<BlockOutput>>> = vec![Vec::with_capacity(parts.len()); outputs];
    for input in parts {
        for (j, part) in input.into_iter().enumerate() {
            by_output[j].push(part);
        }
    }
    merged_blocks(by_output.into_iter().map(|parts| (parts, reducer.clone())), upstream)
}

/// Blocks each made by merging its parts with its reducer; `upstream`
/// identifies the inputs.
pub(crate) fn merged_blocks(
    merges: impl IntoIterator<Item = (Vec<ObjectRef<BlockOutput>>, Reducer)>,
    upstream: u64,
) -> Vec<Block> {
    merges
        .into_iter()
        .enumerate()
        .map(|(index, (parts, reducer))| Block {
            index,
            bytes: 0,
            fingerprint: xxh3_64(format!("{upstream:016x} {reducer:?} {index}").as_bytes()),
            stages: Vec::new(),
            source: BlockSource::Input(BlockInput::Exchanged {
                parts,
                reducer,
                block: index,
            }),
        })
        .collect()
}

/// The blocks of row groups planned for a Parquet source, in order.
#[cfg(feature = "parquet")]
pub(crate) fn parquet_blocks(
    planned: Vec<PlannedGroups>,
    options: &ParquetOptions,
    storage: &StorageOptions,
) -> Vec<Block> {
    planned
        .into_iter()
        .enumerate()
        .map(|(index, planned)| Block {
            index,
            bytes: planned.bytes,
            fingerprint: xxh3_64(format!("{:?} {:?}", planned.groups, options).as_bytes()),
            stages: Vec::new(),
            source: BlockSource::Input(BlockInput::Parquet {
                groups: planned.groups,
                options: options.clone(),
                storage: storage.clone(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64]) -> FileList {
        FileList::of(sizes.iter().enumerate().map(|(i, size)| (format!("f{i:02}"), *size)))
    }

    fn counts(blocks: &[Block]) -> Vec<u64> {
        blocks.iter().map(Block::inputs).collect()
    }

    #[test]
    fn blocks_end_at_the_file_count_or_before_the_byte_limit() {
        let sizing = BlockSizing {
            files_per_block: 3,
            items_per_block: 2,
            block_bytes: 100,
        };
        let blocks = file_blocks(files(&[10; 7]), &ReadKind::Binary, &StorageOptions::new(), sizing);
        assert_eq!(counts(&blocks), vec![3, 3, 1]);
        let blocks = file_blocks(
            files(&[60, 30, 20, 200, 5]),
            &ReadKind::Binary,
            &StorageOptions::new(),
            sizing,
        );
        assert_eq!(
            counts(&blocks),
            vec![2, 1, 1, 1],
            "a file larger than the limit gets a block of its own"
        );
        assert_eq!(blocks.iter().map(|b| b.bytes).collect::<Vec<_>>(), vec![90, 20, 200, 5]);
        let again = file_blocks(
            files(&[60, 30, 20, 200, 5]),
            &ReadKind::Binary,
            &StorageOptions::new(),
            sizing,
        );
        let fingerprints = |bs: &[Block]| bs.iter().map(|b| b.fingerprint).collect::<Vec<_>>();
        assert_eq!(
            fingerprints(&blocks),
            fingerprints(&again),
            "the same files make the same blocks"
        );
        let items: Vec<ByteBuf> = (1..=5u64)
            .map(|n| ByteBuf::from(raylet::codec::encode(&n).unwrap()))
            .collect();
        let items = item_blocks(&items, sizing);
        assert_eq!(counts(&items), vec![2, 2, 1]);
        assert_eq!(items[2].describe(), "items 4..5");
    }
}
