//! The type-free part of a dataset: its source, shard, stages, model and
//! options, which cut the input into blocks and start a run over them. A
//! `Dataset` is a plan with a row type; a plan alone is what a streaming
//! split's coordinator actor runs.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use xxhash_rust::xxh3::xxh3_64;

use crate::DataError;
use crate::FileSet;
use crate::actor_pool::ModelSpec;
use crate::block::{self, Block, BlockSizing, ReadKind};
use crate::execution::{Execution, ExecutionOptions};
use crate::image_source;
use crate::parquet_source::{self, ParquetOptions};
use crate::sink::Format;
use crate::stage::{StageKind, StageSpec};
use crate::storage::StorageOptions;
use crate::task_sink::TaskSink;

/// Where a dataset's rows come from.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) enum Source {
    Files {
        files: FileSet,
        read: ReadKind,
    },
    /// Row groups of Parquet files.
    Parquet {
        files: FileSet,
        options: ParquetOptions,
    },
    /// The items, each encoded alone (or why they could not be).
    Items(Result<Vec<ByteBuf>, String>),
}

/// Which of `count` disjoint parts of the blocks a dataset keeps.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// Part `index` of `count` of this shard (or of the whole).
    pub fn part(outer: Option<Shard>, index: usize, count: usize) -> Shard {
        match outer {
            Some(outer) => Shard {
                index: outer.index + outer.count * index,
                count: outer.count * count,
            },
            None => Shard { index, count },
        }
    }
}

/// A dataset's plan, whatever its row type.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub source: Source,
    pub shard: Option<Shard>,
    pub stages: Vec<StageSpec>,
    /// The model stages' models (one at most runs).
    pub models: Vec<Result<ModelSpec, String>>,
    pub sizing: BlockSizing,
    pub options: ExecutionOptions,
    /// How sources and sinks in object storage are opened.
    pub storage: StorageOptions,
}

impl Plan {
    pub fn new(source: Source) -> Self {
        Plan {
            source,
            shard: None,
            stages: Vec::new(),
            models: Vec::new(),
            sizing: BlockSizing::default(),
            options: ExecutionOptions {
                max_blocks_in_flight: 8,
                num_cpus: 1.0,
                on_error: crate::OnError::Fail,
                show_progress: true,
            },
            storage: StorageOptions::default(),
        }
    }

    /// The blocks of the source, as this plan cuts them.
    pub fn blocks(&self) -> Result<Vec<Block>, DataError> {
        match &self.source {
            Source::Files { files, read } => self.file_blocks(files, read),
            Source::Parquet { files, options } => self.parquet_blocks(files, options),
            Source::Items(Ok(items)) => block::item_blocks(items, self.sizing),
            Source::Items(Err(e)) => Err(DataError::InvalidInput(e.clone())),
        }
        .map(|blocks| match self.shard {
            Some(Shard { index, count }) => blocks.into_iter().filter(|b| b.index % count == index).collect(),
            None => blocks,
        })
    }

    fn file_blocks(&self, files: &FileSet, read: &ReadKind) -> Result<Vec<Block>, DataError> {
        let mut list = files.resolve(&self.storage)?;
        let read = match read {
            ReadKind::Images(_) => {
                list.retain(image_source::is_image);
                if list.len() == 0 {
                    return Err(DataError::InvalidInput(format!("no PNG or JPEG files in {files:?}")));
                }
                read.clone()
            }
            ReadKind::Csv(options) => ReadKind::Csv(options.with_schema_of(&list.path(0), &self.storage)?),
            ReadKind::Binary | ReadKind::Text => read.clone(),
        };
        Ok(block::file_blocks(list, &read, &self.storage, self.sizing))
    }

    fn parquet_blocks(&self, files: &FileSet, options: &ParquetOptions) -> Result<Vec<Block>, DataError> {
        let list = files.resolve(&self.storage)?;
        let mut planned = Vec::new();
        for index in 0..list.len() {
            let location = list.path(index);
            let file_blocks = parquet_source::plan_file(
                &location,
                list.size(index),
                options,
                &self.storage,
                self.sizing.block_bytes,
            )?;
            planned.extend(file_blocks);
        }
        Ok(block::parquet_blocks(planned, options, &self.storage))
    }

    /// Starts a run over `blocks`; `done` are blocks finished before; a
    /// `sink` writes each block's rows in its task.
    pub fn execute(&self, blocks: Vec<Block>, done: &[Block], sink: Option<TaskSink>) -> Result<Execution, DataError> {
        let model = match self.models.as_slice() {
            [] => None,
            [Ok(model)] => Some(model.clone()),
            [Err(e)] => return Err(DataError::InvalidInput(e.clone())),
            _ => {
                return Err(DataError::InvalidInput(
                    "a dataset runs one model stage (map_batches_with) at most".into(),
                ));
            }
        };
        let cluster = raylet::current()?;
        Execution::new(cluster, blocks, done, self.stages.clone(), model, sink, self.options)
    }

    /// What identifies the plan's output: its blocks, stages and format.
    pub fn fingerprint(&self, blocks: &[Block], format: Format) -> u64 {
        let blocks: Vec<u64> = blocks.iter().map(|block| block.fingerprint).collect();
        let stages: Vec<(&str, StageKind, usize)> = self
            .stages
            .iter()
            .map(|stage| (stage.function.as_str(), stage.kind, stage.batch_size))
            .collect();
        xxh3_64(format!("{blocks:?} {stages:?} {format:?} {:?}", self.options.on_error).as_bytes())
    }
}
