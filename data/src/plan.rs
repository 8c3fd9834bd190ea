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
use crate::exchange::{Exchange, GroupAggregate};
use crate::exchange_phase;
use crate::execution::{Execution, ExecutionOptions, check_registered};
#[cfg(feature = "parquet")]
use crate::files::FileList;
use crate::image_source;
#[cfg(feature = "parquet")]
use crate::parquet_source::{self, ParquetOptions};
use crate::sink::Format;
use crate::stage::{StageKind, StageSpec};
use crate::task_sink::TaskSink;
use raylet_storage::StorageOptions;

/// Where a dataset's rows come from.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) enum Source {
    Files {
        files: FileSet,
        read: ReadKind,
    },
    /// Row groups of Parquet files.
    #[cfg(feature = "parquet")]
    Parquet {
        files: FileSet,
        options: ParquetOptions,
    },
    /// Row groups of the Parquet files of a Delta Lake table's current version.
    #[cfg(feature = "parquet")]
    Delta {
        location: String,
        options: ParquetOptions,
    },
    /// The items, each encoded alone (or why they could not be).
    Items(Result<Vec<ByteBuf>, Unencodable>),
    /// The blocks of each plan, one plan after another.
    Union(Vec<Plan>),
    /// The rows of the first plan beside those of the second, by position.
    Zip(Box<Plan>, Box<Plan>),
}

/// What a dataset could not encode when it was built (its items, or a
/// model's configuration), kept in the plan until a run reports it.
#[derive(Clone, Debug, Serialize, Deserialize, thiserror::Error)]
#[error("encoding {what}: {message}")]
pub(crate) struct Unencodable {
    pub what: String,
    pub message: String,
}

/// One step of a plan: a transform run in each block's task, or an
/// all-to-all step between blocks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Step {
    Stage(StageSpec),
    Exchange(Exchange),
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
    /// The transforms and all-to-all steps, in order.
    pub steps: Vec<Step>,
    /// Which pass over the data a run is (a streaming split's epoch), so
    /// that shuffles differ from one to the next.
    pub epoch: u64,
    /// The model stages' models (one at most runs).
    pub models: Vec<Result<ModelSpec, Unencodable>>,
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
            steps: Vec::new(),
            epoch: 0,
            models: Vec::new(),
            sizing: BlockSizing::default(),
            options: ExecutionOptions {
                max_blocks_in_flight: 8,
                num_cpus: 1.0,
                on_error: crate::OnError::Fail,
                show_progress: true,
                local_shuffle: None,
                in_order: false,
            },
            storage: StorageOptions::default(),
        }
    }

    /// A plan over `source` (a union or zip with this one) with this one's
    /// options, storage settings and block sizes.
    pub fn combined(self, source: Source) -> Plan {
        Plan {
            options: self.options,
            storage: self.storage,
            sizing: self.sizing,
            ..Plan::new(source)
        }
    }

    /// The blocks the plan's last transforms run over: the source's, as
    /// the plan cuts them, or (after an all-to-all step) that step's output
    /// blocks, whose inputs this runs first.
    pub fn blocks(&self) -> Result<Vec<Block>, DataError> {
        let (segments, _) = self.segments();
        for (stages, exchange) in &segments {
            if stages.iter().any(|stage| stage.kind == StageKind::Model) {
                return Err(DataError::InvalidInput(
                    "map_batches_with must come after the last random_shuffle, repartition, sort or groupby".into(),
                ));
            }
            check_registered(stages)?;
            if let Exchange::GroupBy {
                aggregate: GroupAggregate::Function(function),
                ..
            } = exchange
            {
                check_registered(&[StageSpec {
                    function: function.clone(),
                    kind: StageKind::MapArrowBatches,
                    batch_size: 0,
                }])?;
            }
        }
        let mut blocks = self.source_blocks()?;
        for (stages, exchange) in segments {
            let upstream = self.upstream(&blocks, &stages, exchange);
            blocks = exchange_phase::run(blocks, &stages, exchange, (&self.options, self.epoch, upstream))?;
        }
        Ok(match self.shard {
            Some(Shard { index, count }) => blocks.into_iter().filter(|b| b.index % count == index).collect(),
            None => blocks,
        })
    }

    /// The transforms before each all-to-all step with the step, and the
    /// transforms after the last.
    pub fn segments(&self) -> (Vec<(Vec<StageSpec>, &Exchange)>, Vec<StageSpec>) {
        let (mut segments, mut stages) = (Vec::new(), Vec::new());
        for step in &self.steps {
            match step {
                Step::Stage(stage) => stages.push(stage.clone()),
                Step::Exchange(exchange) => segments.push((std::mem::take(&mut stages), exchange)),
            }
        }
        (segments, stages)
    }

    fn source_blocks(&self) -> Result<Vec<Block>, DataError> {
        match &self.source {
            Source::Files { files, read } => self.file_blocks(files, read),
            #[cfg(feature = "parquet")]
            Source::Parquet { files, options } => self.parquet_blocks(files, options),
            #[cfg(feature = "parquet")]
            Source::Delta { location, options } => self.delta_blocks(location, options),
            Source::Items(Ok(items)) => Ok(block::item_blocks(items, self.sizing)),
            Source::Items(Err(e)) => Err(DataError::InvalidInput(e.to_string())),
            Source::Union(plans) => {
                let mut blocks = Vec::new();
                for plan in plans {
                    blocks.extend(plan.final_blocks()?);
                }
                Ok(blocks
                    .into_iter()
                    .enumerate()
                    .map(|(index, mut block)| {
                        block.index = index;
                        block
                    })
                    .collect())
            }
            Source::Zip(left, right) => {
                let (left, right) = (left.final_blocks()?, right.final_blocks()?);
                let fingerprints = |blocks: &[Block]| blocks.iter().map(|b| b.fingerprint).collect::<Vec<_>>();
                let upstream = xxh3_64(format!("zip {:?} {:?}", fingerprints(&left), fingerprints(&right)).as_bytes());
                let jobs = |blocks| exchange_phase::jobs_of(blocks, &[], &self.options);
                exchange_phase::zipped(jobs(left), jobs(right), &self.options, upstream)
            }
        }
    }

    /// The plan's blocks, each with the plan's last transforms to run
    /// first: what a union or zip of it starts from.
    fn final_blocks(&self) -> Result<Vec<Block>, DataError> {
        if !self.models.is_empty() {
            return Err(DataError::InvalidInput(
                "a dataset with map_batches_with cannot be part of a union or zip".into(),
            ));
        }
        let (_, stages) = self.segments();
        check_registered(&stages)?;
        Ok(self.blocks()?.into_iter().map(|block| block.after(&stages)).collect())
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

    #[cfg(feature = "parquet")]
    fn delta_blocks(&self, location: &str, options: &ParquetOptions) -> Result<Vec<Block>, DataError> {
        let files = crate::delta_source::table_files(location, &self.storage)?;
        if files.len() == 0 {
            return Err(DataError::InvalidInput(format!(
                "the Delta table {location} has no files"
            )));
        }
        self.parquet_list_blocks(&files, options)
    }

    #[cfg(feature = "parquet")]
    fn parquet_blocks(&self, files: &FileSet, options: &ParquetOptions) -> Result<Vec<Block>, DataError> {
        self.parquet_list_blocks(&files.resolve(&self.storage)?, options)
    }

    #[cfg(feature = "parquet")]
    fn parquet_list_blocks(&self, list: &FileList, options: &ParquetOptions) -> Result<Vec<Block>, DataError> {
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
            [Err(e)] => return Err(DataError::InvalidInput(e.to_string())),
            _ => {
                return Err(DataError::InvalidInput(
                    "a dataset runs one model stage (map_batches_with) at most".into(),
                ));
            }
        };
        let cluster = raylet::current()?;
        let (segments, stages) = self.segments();
        let mut options = self.options;
        options.in_order = matches!(
            segments.last(),
            Some((_, Exchange::Sort { .. } | Exchange::Limit { .. }))
        );
        Execution::new(cluster, blocks, done, stages, model, sink, options)
    }

    /// What identifies the plan's output: its blocks, last transforms and
    /// format (the blocks of an all-to-all step stand for what precedes it).
    pub fn fingerprint(&self, blocks: &[Block], format: Format) -> u64 {
        let blocks: Vec<u64> = blocks.iter().map(|block| block.fingerprint).collect();
        let (_, stages) = self.segments();
        let stages: Vec<(&str, StageKind, usize)> = stages
            .iter()
            .map(|stage| (stage.function.as_str(), stage.kind, stage.batch_size))
            .collect();
        let models: Vec<(&str, &[u8])> = self
            .models
            .iter()
            .flatten()
            .map(|model| (model.name.as_str(), model.config.as_slice()))
            .collect();
        let described = format!(
            "{blocks:?} {stages:?} {models:?} {format:?} {:?}",
            self.options.on_error
        );
        xxh3_64(described.as_bytes())
    }

    /// The fingerprints of what a step's input blocks are made of.
    pub fn upstream(&self, blocks: &[Block], stages: &[StageSpec], exchange: &Exchange) -> u64 {
        let blocks: Vec<u64> = blocks.iter().map(|block| block.fingerprint).collect();
        let stages: Vec<(&str, StageKind, usize)> = stages
            .iter()
            .map(|stage| (stage.function.as_str(), stage.kind, stage.batch_size))
            .collect();
        xxh3_64(format!("{blocks:?} {stages:?} {exchange:?} {}", self.epoch).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor_pool::ActorPoolStrategy;
    use crate::sink::Table;

    /// A plan's fingerprint with one model stage whose config is `config`.
    fn fingerprint_with_model(config: &[u8]) -> u64 {
        let mut plan = crate::Dataset::from_items(vec![1u32]).plan;
        plan.models.push(Ok(ModelSpec {
            name: "tokenize".into(),
            config: config.to_vec(),
            strategy: ActorPoolStrategy::fixed(1),
        }));
        plan.fingerprint(&[], Format::Table(Table::Csv))
    }

    /// A write rerun with another model config (another tokenizer, another
    /// sequence length) must not take the blocks written before as its own.
    #[test]
    fn a_model_stages_config_is_part_of_the_fingerprint() {
        assert_eq!(
            fingerprint_with_model(b"length 64"),
            fingerprint_with_model(b"length 64")
        );
        assert_ne!(
            fingerprint_with_model(b"length 64"),
            fingerprint_with_model(b"length 128")
        );
    }
}
