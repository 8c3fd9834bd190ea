//! Blocks: the units a dataset is cut into and processed by, one task per
//! block. The built-in row types of file sources, and how files and items
//! are partitioned into blocks (by count and by size) so that a rerun
//! makes the same blocks.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use xxhash_rust::xxh3::xxh3_64;

use crate::DataError;

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
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum ReadKind {
    /// One [`FileBytes`] per file.
    Binary,
    /// One [`TextLine`] per line.
    Text,
}

/// What a block's task starts from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum BlockInput {
    Files {
        paths: Vec<String>,
        read: ReadKind,
    },
    /// Items encoded as one list, the first being item `first` of the dataset.
    Items {
        rows: ByteBuf,
        count: u64,
        first: u64,
    },
}

/// One block of a dataset's input.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub index: usize,
    pub input: BlockInput,
    /// Input bytes (file sizes, or the encoded items).
    pub bytes: u64,
    /// Stable across reruns of the same input: a hash of the paths or items.
    pub fingerprint: u64,
}

impl Block {
    /// How many files (or items) the block holds.
    pub fn inputs(&self) -> u64 {
        match &self.input {
            BlockInput::Files { paths, .. } => paths.len() as u64,
            BlockInput::Items { count, .. } => *count,
        }
    }

    /// The block's inputs, for messages: its first and last file or item.
    pub fn describe(&self) -> String {
        match &self.input {
            BlockInput::Files { paths, .. } if paths.len() == 1 => paths[0].clone(),
            BlockInput::Files { paths, .. } => {
                format!("{} files, {} .. {}", paths.len(), paths[0], paths[paths.len() - 1])
            }
            BlockInput::Items { count, first, .. } => format!("items {first}..{}", first + count),
        }
    }
}

/// How inputs are cut into blocks: a block ends at `files_per_block` files
/// (or `items_per_block` items) or before it would pass `block_bytes`.
#[derive(Clone, Copy, Debug)]
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

/// The blocks of `files` (sorted, with sizes) read as `read`.
pub(crate) fn file_blocks(files: &[(PathBuf, u64)], read: ReadKind, sizing: BlockSizing) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    let mut bytes = 0;
    for (path, size) in files {
        let full = paths.len() >= sizing.files_per_block.max(1);
        if !paths.is_empty() && (full || bytes + size > sizing.block_bytes) {
            blocks.push(files_block(blocks.len(), std::mem::take(&mut paths), read, bytes));
            bytes = 0;
        }
        paths.push(path.to_string_lossy().into_owned());
        bytes += size;
    }
    if !paths.is_empty() {
        blocks.push(files_block(blocks.len(), paths, read, bytes));
    }
    blocks
}

fn files_block(index: usize, paths: Vec<String>, read: ReadKind, bytes: u64) -> Block {
    let fingerprint = xxh3_64(paths.join("\n").as_bytes());
    Block {
        index,
        input: BlockInput::Files { paths, read },
        bytes,
        fingerprint,
    }
}

/// The blocks of `items`, each encoded on its own.
pub(crate) fn item_blocks<T: Serialize>(items: &[T], sizing: BlockSizing) -> Result<Vec<Block>, DataError> {
    let mut blocks = Vec::new();
    for (index, chunk) in items.chunks(sizing.items_per_block.max(1)).enumerate() {
        let rows = raylet::proto::codec::encode(&chunk)
            .map_err(|e| DataError::InvalidInput(format!("encoding items: {e}")))?;
        let first = (index * sizing.items_per_block.max(1)) as u64;
        blocks.push(Block {
            index,
            bytes: rows.len() as u64,
            fingerprint: xxh3_64(&rows),
            input: BlockInput::Items {
                rows: ByteBuf::from(rows),
                count: chunk.len() as u64,
                first,
            },
        });
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64]) -> Vec<(PathBuf, u64)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, size)| (PathBuf::from(format!("f{i:02}")), *size))
            .collect()
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
        let blocks = file_blocks(&files(&[10; 7]), ReadKind::Binary, sizing);
        assert_eq!(counts(&blocks), vec![3, 3, 1]);
        let blocks = file_blocks(&files(&[60, 30, 20, 200, 5]), ReadKind::Binary, sizing);
        assert_eq!(
            counts(&blocks),
            vec![2, 1, 1, 1],
            "a file larger than the limit gets a block of its own"
        );
        assert_eq!(blocks.iter().map(|b| b.bytes).collect::<Vec<_>>(), vec![90, 20, 200, 5]);
        let again = file_blocks(&files(&[60, 30, 20, 200, 5]), ReadKind::Binary, sizing);
        let fingerprints = |bs: &[Block]| bs.iter().map(|b| b.fingerprint).collect::<Vec<_>>();
        assert_eq!(
            fingerprints(&blocks),
            fingerprints(&again),
            "the same files make the same blocks"
        );
        let items = item_blocks(&[1, 2, 3, 4, 5], sizing).unwrap();
        assert_eq!(counts(&items), vec![2, 2, 1]);
        assert_eq!(items[2].describe(), "items 4..5");
    }
}
