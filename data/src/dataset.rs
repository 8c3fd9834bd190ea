//! `Dataset`: a lazy plan (a source, then transforms) that runs when it is
//! consumed: written to files, iterated in batches, or collected.

use std::marker::PhantomData;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use arrow::array::RecordBatch;

use crate::actor_pool::{ActorPoolStrategy, ModelSpec};
use crate::batching::{ArrowBatchIter, BatchIter};
use crate::block::{FileBytes, ReadKind, TextLine};
use crate::columnar::Arrow;
use crate::csv_source::CsvOptions;
use crate::exchange::{Aggregation, Exchange, GroupAggregate};
use crate::execution::{Execution, LocalShuffle};
use crate::image_source::{Image, ImageOptions};
use crate::manifest::Manifest;
use crate::model::BatchModel;
#[cfg(feature = "parquet")]
use crate::parquet_source::ParquetOptions;
use crate::plan::{Plan, Shard, Source, Step, Unencodable};
use crate::row::Row;
use crate::sink::{self, BlockWriter, Format, Table, WriteSummary};
use crate::stage::{OnError, StageKind, StageSpec};
use crate::streaming_split::StreamingSplit;
use crate::task_sink::{ArrowFormat, TaskSink};
use crate::{DataError, FileSet};
use raylet_storage::{Storage, StorageOptions};

/// A dataset of rows of type `T`, built lazily: nothing runs until it is
/// written, iterated or collected. Each block of inputs (a few files, or
/// items) is read and passed through every transform in one task, and at
/// most `max_blocks_in_flight` blocks are processed at once. A dataset is
/// serde data itself, so a shard of it can be sent to a worker (a Train
/// loop's configuration) and read there.
#[derive(Serialize, Deserialize)]
#[serde(bound = "", transparent)]
pub struct Dataset<T> {
    pub(crate) plan: Plan,
    #[serde(skip)]
    _rows: PhantomData<fn() -> T>,
}

impl<T> Clone for Dataset<T> {
    fn clone(&self) -> Self {
        Dataset::of(self.plan.clone())
    }
}

impl<T> Dataset<T> {
    fn of(plan: Plan) -> Self {
        Dataset {
            plan,
            _rows: PhantomData,
        }
    }

    /// At most this many files to a block (default 16).
    pub fn files_per_block(mut self, files: usize) -> Self {
        self.plan.sizing.files_per_block = files.max(1);
        self
    }

    /// At most this many items to a block (default 1024).
    pub fn items_per_block(mut self, items: usize) -> Self {
        self.plan.sizing.items_per_block = items.max(1);
        self
    }

    /// A block ends before its files (or a Parquet file's row groups,
    /// uncompressed) pass this many bytes (default 64 MiB).
    pub fn block_bytes(mut self, bytes: u64) -> Self {
        self.plan.sizing.block_bytes = bytes;
        self
    }

    /// How many blocks are processed or held at once (default 8): what
    /// bounds the memory a run uses, whatever the number of inputs.
    pub fn max_blocks_in_flight(mut self, blocks: usize) -> Self {
        self.plan.options.max_blocks_in_flight = blocks.max(1);
        self
    }

    /// CPUs each block's task holds (default 1).
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.plan.options.num_cpus = cpus;
        self
    }

    /// Fail on the first bad input (default), or skip and record it.
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.plan.options.on_error = on_error;
        self
    }

    /// Whether to draw the progress bar on a terminal (default true).
    pub fn show_progress(mut self, show: bool) -> Self {
        self.plan.options.show_progress = show;
        self
    }

    /// Batches drawn at random from a buffer of at least `buffer_rows` rows
    /// as the consumer gets them (Ray's `local_shuffle_buffer_size`), so
    /// that rows of one block spread over many batches: for
    /// `iter_batches`, `take_all` and a streaming split's shards, each epoch
    /// of which draws in an order of its own (from `seed` and the epoch).
    pub fn local_shuffle_buffer(mut self, buffer_rows: usize, seed: u64) -> Self {
        self.plan.options.local_shuffle = Some(LocalShuffle {
            buffer_rows: buffer_rows.max(1),
            seed,
        });
        self
    }

    /// How object storage (`s3://…`) is opened, over the `AWS_*`
    /// variables of each process that opens it.
    pub fn storage_options(mut self, options: StorageOptions) -> Self {
        self.plan.storage = options;
        self
    }

    fn from_source(source: Source) -> Self {
        Dataset::of(Plan::new(source))
    }

    /// Every row moved to a random block and each block's rows put in a
    /// random order, by `seed` (and, in a streaming split, the epoch, so
    /// that each pass has an order of its own). The rows cross between
    /// tasks as objects in the object store, which spills them to disk when
    /// memory runs short: no process holds the whole dataset.
    pub fn random_shuffle(self, seed: u64) -> Self {
        self.exchange(Exchange::RandomShuffle { seed })
    }

    /// The rows spread evenly over `blocks` blocks (each input block's rows
    /// cut into `blocks` runs, run `j` of each going to block `j`).
    pub fn repartition(self, blocks: usize) -> Self {
        self.exchange(Exchange::Repartition { blocks: blocks.max(1) })
    }

    /// The first `rows` rows, in the blocks' order: blocks run in order
    /// until those before hold that many, and no more are read.
    pub fn limit(self, rows: u64) -> Self {
        self.exchange(Exchange::Limit { rows })
    }

    /// The rows of this dataset, then those of `other` (each with its own
    /// source and transforms; the options are this one's).
    pub fn union(self, other: Dataset<T>) -> Self {
        let source = Source::Union(vec![self.plan.clone(), other.plan]);
        Dataset::of(self.plan.combined(source))
    }

    fn zip_with<O>(self, other: Plan) -> Dataset<O> {
        let source = Source::Zip(Box::new(self.plan.clone()), Box::new(other));
        Dataset::of(self.plan.combined(source))
    }

    fn exchange(mut self, exchange: Exchange) -> Self {
        self.plan.steps.push(Step::Exchange(exchange));
        self
    }

    fn then<O, F>(mut self, kind: StageKind, batch_size: usize) -> Dataset<O> {
        self.plan.steps.push(Step::Stage(StageSpec {
            function: std::any::type_name::<F>().to_string(),
            kind,
            batch_size,
        }));
        Dataset::of(self.plan)
    }

    /// `n` datasets that together hold this one's blocks, each a disjoint
    /// part (every `n`th block): the shards of `n` Train workers, which can
    /// be sent to them and read there.
    pub fn split(&self, n: usize) -> Vec<Dataset<T>> {
        let count = n.max(1);
        (0..count)
            .map(|index| {
                let mut shard = Dataset::of(self.plan.clone());
                shard.plan.shard = Some(Shard::part(self.plan.shard, index, count));
                shard.show_progress(false)
            })
            .collect()
    }

    fn execute(&self, sink: Option<TaskSink>) -> Result<Execution, DataError> {
        self.plan.execute(self.plan.blocks()?, &[], sink)
    }

    /// Runs the plan into `location`, skipping the blocks a previous run
    /// wrote there; `write` writes a block in the driver, else `sink` in its task.
    fn write<R: DeserializeOwned>(
        &self,
        location: &str,
        format: Format,
        sink: Option<TaskSink>,
        write: Option<&mut BlockWriter<'_, R>>,
    ) -> Result<WriteSummary, DataError> {
        let storage = Storage::open(location, &self.plan.storage)?;
        let blocks = self.plan.blocks()?;
        let mut manifest = Manifest::open(&storage, self.plan.fingerprint(&blocks, format), blocks.len())?;
        let (mut done, mut todo) = (Vec::new(), Vec::new());
        for block in blocks {
            match manifest.is_done(&block)? {
                true => done.push(block),
                false => todo.push(block),
            }
        }
        let execution = self.plan.execute(todo, &done, sink)?;
        sink::write_blocks::<R>(execution, &mut manifest, &storage, done.len(), write)
    }
}

/// A sink's location as the string storage opens.
fn location(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl Dataset<Arrow> {
    /// The row groups of Parquet files: a path, a directory, a glob, or an
    /// object storage prefix (`s3://bucket/prefix`). Consecutive row groups
    /// of a file make a block, up to `block_bytes`.
    #[cfg(feature = "parquet")]
    pub fn read_parquet(files: impl Into<FileSet>) -> Self {
        Self::read_parquet_with(files, ParquetOptions::default())
    }

    /// `read_parquet` of some columns only, or of the rows that match a
    /// filter (row groups that cannot match are skipped by their statistics).
    #[cfg(feature = "parquet")]
    pub fn read_parquet_with(files: impl Into<FileSet>, options: ParquetOptions) -> Self {
        Self::from_source(Source::Parquet {
            files: files.into(),
            options,
        })
    }

    /// The current version of a Delta Lake table (a path, a `file://` or an
    /// `s3://` URL): its data files, found by replaying its transaction
    /// log, read as Parquet with `options`. Tables with deletion vectors,
    /// column mapping or partition columns are refused, naming what.
    #[cfg(feature = "parquet")]
    pub fn read_delta(location: &str, options: ParquetOptions) -> Self {
        Self::from_source(Source::Delta {
            location: location.to_string(),
            options,
        })
    }

    /// Files of delimited text, with a header line by default: a path, a
    /// directory, a glob, or an object storage prefix. The schema is
    /// inferred from the first file.
    pub fn read_csv(files: impl Into<FileSet>) -> Self {
        Self::read_csv_with(files, CsvOptions::default())
    }

    /// `read_csv` with a given schema, delimiter or header setting.
    pub fn read_csv_with(files: impl Into<FileSet>, options: CsvOptions) -> Self {
        Self::from_source(Source::Files {
            files: files.into(),
            read: ReadKind::Csv(options),
        })
    }

    /// Record batches of up to `batch_size` rows of a block through
    /// `function` (registered with `register_arrow_fn!`), in the block's task.
    pub fn map_batches<E, F: Fn(RecordBatch) -> Result<RecordBatch, E>>(
        self,
        _function: F,
        batch_size: usize,
    ) -> Dataset<Arrow> {
        self.then::<Arrow, F>(StageKind::MapArrowBatches, batch_size.max(1))
    }

    /// The rows in order of `column` (ascending, or descending): block `j`
    /// holds a range of its values that comes before block `j + 1`'s, as
    /// chosen from a sample of every block's keys.
    pub fn sort(self, column: &str, descending: bool) -> Self {
        self.exchange(Exchange::Sort {
            column: column.to_string(),
            descending,
        })
    }

    /// The rows grouped by the values of `key`, to be aggregated.
    pub fn groupby(self, key: &str) -> GroupedDataset {
        GroupedDataset {
            dataset: self,
            key: key.to_string(),
        }
    }

    /// The same rows, each read as a `T` from the columns named as its
    /// fields (in the tasks of the stages that follow, or on collection).
    pub fn rows<R: Row>(self) -> Dataset<R> {
        Dataset::of(self.plan)
    }

    /// This dataset's columns and `other`'s side by side, row by row (the
    /// two must have as many rows; a column name both have gets `_1` on
    /// the right).
    pub fn zip(self, other: Dataset<Arrow>) -> Dataset<Arrow> {
        self.zip_with(other.plan)
    }

    /// Record batches of `batch_size` rows (the last may be shorter), as
    /// blocks finish (in no set order).
    pub fn iter_batches(&self, batch_size: usize) -> Result<ArrowBatchIter, DataError> {
        Ok(ArrowBatchIter::new(self.execute(None)?, batch_size))
    }

    /// Every row, as record batches, in no set order.
    pub fn take_all(&self) -> Result<Vec<RecordBatch>, DataError> {
        self.iter_batches(64 * 1024)?.collect()
    }

    /// Writes each block's rows as a Parquet file of its own
    /// (`block_NNNNNN.parquet`, Snappy) to `location`: a directory or an
    /// object storage prefix. Each block's task writes its file, so the
    /// rows never pass through the driver; a rerun skips the blocks written.
    #[cfg(feature = "parquet")]
    pub fn write_parquet(&self, location: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write_arrow(location.as_ref(), ArrowFormat::Parquet)
    }

    /// Writes each block's rows as CSV with a header line
    /// (`block_NNNNNN.csv`), from the blocks' tasks.
    pub fn write_csv(&self, location: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write_arrow(location.as_ref(), ArrowFormat::Csv)
    }

    /// Writes each block's rows as JSON objects, one per line
    /// (`block_NNNNNN.jsonl`), from the blocks' tasks.
    pub fn write_jsonl(&self, location: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write_arrow(location.as_ref(), ArrowFormat::Jsonl)
    }

    fn write_arrow(&self, location: &Path, format: ArrowFormat) -> Result<WriteSummary, DataError> {
        let location = self::location(location);
        let sink = TaskSink {
            location: location.clone(),
            storage: self.plan.storage.clone(),
            format,
        };
        self.write::<()>(&location, Format::Arrow(format), Some(sink), None)
    }
}

/// A dataset's rows grouped by a key column, from [`Dataset::groupby`]:
/// each aggregate gives a row per key value (each block's keys in order).
pub struct GroupedDataset {
    dataset: Dataset<Arrow>,
    key: String,
}

impl GroupedDataset {
    /// The key and `count()`, its rows.
    pub fn count(self) -> Dataset<Arrow> {
        self.aggregate_columns(vec![Aggregation::Count])
    }

    /// The key and `sum(column)` (nulls left out; Float64).
    pub fn sum(self, column: &str) -> Dataset<Arrow> {
        self.aggregate_columns(vec![Aggregation::Sum(column.to_string())])
    }

    /// The key and `mean(column)`.
    pub fn mean(self, column: &str) -> Dataset<Arrow> {
        self.aggregate_columns(vec![Aggregation::Mean(column.to_string())])
    }

    /// The key and `min(column)`.
    pub fn min(self, column: &str) -> Dataset<Arrow> {
        self.aggregate_columns(vec![Aggregation::Min(column.to_string())])
    }

    /// The key and `max(column)`.
    pub fn max(self, column: &str) -> Dataset<Arrow> {
        self.aggregate_columns(vec![Aggregation::Max(column.to_string())])
    }

    /// The key and every aggregate of `aggregations`, a column each.
    pub fn aggregate_columns(self, aggregations: Vec<Aggregation>) -> Dataset<Arrow> {
        self.dataset.exchange(Exchange::GroupBy {
            key: self.key,
            aggregate: GroupAggregate::Columns(aggregations),
        })
    }

    /// Each group's rows (one record batch per group) through `function`
    /// (registered with `register_arrow_fn!`); its outputs are the rows.
    pub fn aggregate<E, F: Fn(RecordBatch) -> Result<RecordBatch, E>>(self, _function: F) -> Dataset<Arrow> {
        self.dataset.exchange(Exchange::GroupBy {
            key: self.key,
            aggregate: GroupAggregate::Function(std::any::type_name::<F>().to_string()),
        })
    }
}

impl Dataset<Image> {
    /// PNG and JPEG files (others are left out), each decoded to a row of
    /// its pixels: a path, a directory, a glob, or an object storage prefix.
    pub fn read_images(files: impl Into<FileSet>, options: ImageOptions) -> Self {
        Self::from_source(Source::Files {
            files: files.into(),
            read: ReadKind::Images(options),
        })
    }
}

impl Dataset<FileBytes> {
    /// Each file whole: its path and bytes.
    pub fn read_binary(files: FileSet) -> Self {
        Self::from_source(Source::Files {
            files,
            read: ReadKind::Binary,
        })
    }

    /// Writes each row's bytes to a file of its own, `dir/<row.path>`: the
    /// rows' paths must be relative names (a `map` can make them), each
    /// used once. A block's files are all in place before it counts as
    /// written, so a rerun rewrites only the blocks not yet finished.
    pub fn write_files(&self, dir: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write(
            &location(dir.as_ref()),
            Format::Files,
            None,
            Some(&mut sink::write_each_file),
        )
    }
}

impl Dataset<TextLine> {
    /// Each line of each file (UTF-8).
    pub fn read_text(files: FileSet) -> Self {
        Self::from_source(Source::Files {
            files,
            read: ReadKind::Text,
        })
    }
}

impl<T: Row> Dataset<T> {
    /// The items, `items_per_block` to a block.
    pub fn from_items(items: Vec<T>) -> Self {
        let encoded = items
            .iter()
            .map(|item| raylet::codec::encode(item).map(ByteBuf::from))
            .collect::<Result<_, _>>()
            .map_err(|e| Unencodable {
                what: "the items".into(),
                message: e.to_string(),
            });
        Self::from_source(Source::Items(encoded))
    }

    /// Each row through `function` (registered with `register_map!`).
    pub fn map<O: Row, E, F: Fn(T) -> Result<O, E>>(self, _function: F) -> Dataset<O> {
        self.then::<O, F>(StageKind::Map, 0)
    }

    /// Each row to any number of rows (registered with `register_flat_map!`).
    pub fn flat_map<O: Row, E, F: Fn(T) -> Result<Vec<O>, E>>(self, _function: F) -> Dataset<O> {
        self.then::<O, F>(StageKind::FlatMap, 0)
    }

    /// The rows `function` keeps (registered with `register_filter!`).
    pub fn filter<F: Fn(&T) -> bool>(self, _function: F) -> Dataset<T> {
        self.then::<T, F>(StageKind::Filter, 0)
    }

    /// Batches of up to `batch_size` rows of a block through `function`
    /// (registered with `register_batch_fn!`), in the block's task.
    pub fn map_batches<O: Row, E, F: Fn(Vec<T>) -> Result<Vec<O>, E>>(
        self,
        _function: F,
        batch_size: usize,
    ) -> Dataset<O> {
        self.then::<O, F>(StageKind::MapBatches, batch_size.max(1))
    }

    /// Batches of up to `batch_size` rows through `model` (registered with
    /// `register_batch_model!`) in a pool of actors that each load it once.
    /// The whole block (reading and the other stages too) then runs in the
    /// pool's actors.
    pub fn map_batches_with<M: BatchModel<In = T>>(
        mut self,
        model: M,
        batch_size: usize,
        pool: ActorPoolStrategy,
    ) -> Dataset<M::Out> {
        let spec = raylet::codec::encode(&model)
            .map(|config| ModelSpec {
                name: std::any::type_name::<M>().to_string(),
                config,
                strategy: pool,
            })
            .map_err(|e| Unencodable {
                what: std::any::type_name::<M>().into(),
                message: e.to_string(),
            });
        self.plan.models.push(spec);
        self.then::<M::Out, M>(StageKind::Model, batch_size.max(1))
    }

    /// Each row of this dataset paired with the row of `other` at the same
    /// position (the two must have as many rows).
    pub fn zip<U: Row>(self, other: Dataset<U>) -> Dataset<(T, U)> {
        self.zip_with(other.plan)
    }

    /// One run of the dataset shared by `n` consumers (the workers of a
    /// Train run): each reads its [`DataShard`](crate::DataShard) and gets the next finished
    /// block when it asks, so faster consumers read more. Every pass over
    /// the shards (an epoch) runs the dataset again.
    pub fn streaming_split(&self, n: usize) -> Result<StreamingSplit<T>, DataError> {
        self.start_split(n, false)
    }

    /// A [`streaming_split`](Dataset::streaming_split) whose consumers each
    /// read the same number of rows in every epoch (Ray's `equal=True`), so
    /// that a training loop that allreduces at every batch cannot wait on a
    /// shard that ran dry: every block is dealt to all consumers in parts
    /// of equal length, and the rows of an epoch that do not divide evenly
    /// by `n` (at most `n - 1`) are dropped. Dealing keeps at most two parts
    /// ahead of the slowest consumer.
    pub fn streaming_split_equal(&self, n: usize) -> Result<StreamingSplit<T>, DataError> {
        self.start_split(n, true)
    }

    fn start_split(&self, n: usize, equal: bool) -> Result<StreamingSplit<T>, DataError> {
        let mut plan = self.plan.clone();
        plan.options.show_progress = false;
        StreamingSplit::start(plan, n.max(1), equal)
    }

    /// Rows in batches of `batch_size`, as blocks finish (in no set order).
    pub fn iter_batches(&self, batch_size: usize) -> Result<BatchIter<T>, DataError> {
        Ok(BatchIter::new(
            self.execute(None)?,
            batch_size,
            self.plan.options.local_shuffle,
        ))
    }

    /// Every row, in no set order.
    pub fn take_all(&self) -> Result<Vec<T>, DataError> {
        let mut rows = Vec::new();
        for batch in self.iter_batches(4096)? {
            rows.extend(batch?);
        }
        Ok(rows)
    }

    /// Writes each block's rows as JSON lines to a file of its own in `dir`.
    pub fn write_jsonl(&self, dir: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write_table(dir.as_ref(), Table::Jsonl)
    }

    /// Writes each block's rows as CSV (a header, then a line per row) to a
    /// file of its own in `dir`.
    pub fn write_csv(&self, dir: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write_table(dir.as_ref(), Table::Csv)
    }

    /// Writes each block's rows as a Parquet file of its own in `dir`, a
    /// column per field (through Arrow, with the types the rows hold).
    #[cfg(feature = "parquet")]
    pub fn write_parquet(&self, dir: impl AsRef<Path>) -> Result<WriteSummary, DataError> {
        self.write_table(dir.as_ref(), Table::Parquet)
    }

    fn write_table(&self, dir: &Path, table: Table) -> Result<WriteSummary, DataError> {
        self.write(
            &location(dir),
            Format::Table(table),
            None,
            Some(&mut |storage, block, rows: Vec<T>, _| sink::write_table(table, storage, block, &rows)),
        )
    }
}
